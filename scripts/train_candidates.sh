#!/usr/bin/env bash
# Train several recipes at once, one per GPU, and keep the one with the best held-out
# GSM8K tokens per step of the block drafter at k = 7 (quality.json's headline).
#
#   scripts/train_candidates.sh CORPUS OUTDIR RECIPE [RECIPE ...]
#
# Each recipe trains on its own GPU (CUDA_VISIBLE_DEVICES=i) into OUTDIR/<recipe>, with its
# log in OUTDIR/train-<recipe>.log; the winner's name is written to OUTDIR/winner and the
# comparison is printed. Needs as many GPUs as recipes: the recipes' time budgets are set
# for one run per GPU, and running two on one GPU would cut both short.
# TRAIN_ARGS (e.g. "--set time_budget_s=520") is passed to every run.
# Imports only what `specrepro.embedded.train` imports (the H200 image has no polars).
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 CORPUS OUTDIR RECIPE [RECIPE ...]" >&2; exit 2; }
corpus=$1 outdir=$2
shift 2
[ -f "$corpus" ] || { echo "$0: corpus file $corpus not found" >&2; exit 2; }
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -lt $# ]; then
    echo "$0: $# recipes need $# GPUs, this machine has $gpus" >&2
    exit 2
fi
mkdir -p "$outdir"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}lib PYTHONUNBUFFERED=1
pids=() i=0
for recipe in "$@"; do
    CUDA_VISIBLE_DEVICES=$i python3 -m specrepro.embedded.train --recipe "$recipe" \
        --corpus "$corpus" --out "$outdir/$recipe" ${TRAIN_ARGS:-} >"$outdir/train-$recipe.log" 2>&1 &
    pids+=($!)
    i=$((i + 1))
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
[ $status -eq 0 ] || echo "$0: a training run failed; see $outdir/train-*.log" >&2

python3 - "$outdir" "$@" <<'EOF'
import json, sys
from pathlib import Path
out, recipes = Path(sys.argv[1]), sys.argv[2:]
best = None
for r in recipes:
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
