#!/usr/bin/env bash
# Train several recipes at once, one per GPU, and keep the one with the best held-out
# GSM8K tokens per step of the block drafter at k = 7 (quality.json's headline).
#
#   scripts/train_candidates.sh CORPUS OUTDIR CANDIDATE [CANDIDATE ...]
#
# A candidate is a recipe name, optionally with recipe overrides: RECIPE[:FIELD=JSON...]
# (e.g. v2-deep:drafter_batch=128). Candidate i trains on GPU i (CUDA_VISIBLE_DEVICES=i)
# into OUTDIR/c<i>, its log in OUTDIR/train-c<i>.log; the winner's directory name is written
# to OUTDIR/winner and the comparison is printed. The winner is chosen on the same held-out
# prompts the model card reports (say so when quoting it). Needs as many GPUs as candidates:
# the recipes' time budgets are set for one run per GPU, and two on one GPU would cut both short.
# TRAIN_ARGS (e.g. "--set time_budget_s=520") is passed to every run.
# Imports only what `specrepro.tools.training` imports (the H200 image has no polars).
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 CORPUS OUTDIR CANDIDATE [CANDIDATE ...]" >&2; exit 2; }
corpus=$1 outdir=$2
shift 2
[ -f "$corpus" ] || { echo "$0: corpus file $corpus not found" >&2; exit 2; }
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -lt $# ]; then
    echo "$0: $# candidates need $# GPUs, this machine has $gpus" >&2
    exit 2
fi
mkdir -p "$outdir"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}lib PYTHONUNBUFFERED=1
pids=() i=0
for cand in "$@"; do
    IFS=: read -r -a parts <<<"$cand"
    sets=()
    for kv in "${parts[@]:1}"; do sets+=(--set "$kv"); done
    echo "c$i: recipe ${parts[0]} ${sets[*]:-} ${TRAIN_ARGS:-}"
    CUDA_VISIBLE_DEVICES=$i python3 -m specrepro.tools.training --recipe "${parts[0]}" \
        --corpus "$corpus" --out "$outdir/c$i" ${TRAIN_ARGS:-} "${sets[@]}" \
        >"$outdir/train-c$i.log" 2>&1 &
    pids+=($!)
    i=$((i + 1))
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
[ $status -eq 0 ] || echo "$0: a training run failed; see $outdir/train-*.log" >&2

python3 - "$outdir" "$#" <<'EOF'
import json, sys
from pathlib import Path
out, n = Path(sys.argv[1]), int(sys.argv[2])
best = None
for r in (f"c{i}" for i in range(n)):
    q = out / r / "quality.json"
    if not q.exists():
        print(f"{r}: no quality.json (run failed or was cut short)")
        continue
    head = json.loads(q.read_text())["headline"]
    print(f"{r}: " + ", ".join(f"{k} {v:.3f}" for k, v in head.items()))
    score = head.get("block_k7_tokens_per_step", 0.0)
    if best is None or score > best[1]:
        best = (r, score)
if best is None:
    sys.exit("no recipe finished")
(out / "winner").write_text(best[0] + "\n")
print(f"winner: {best[0]} (block k=7 {best[1]:.3f} tokens per step on held-out math)")
EOF
exit $status
