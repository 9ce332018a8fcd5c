#!/usr/bin/env bash
# One command of the stand-in's measurements on the borrowed offline H200 (docs/bench/standin-*),
# after an engine bundle is staged:
#
#   bash scripts/gpu_bench_standin.sh DEADLINE_S ARCHIVE PHASE [PHASE ...]
#   SPECREPRO_GPU_ENV=/var/tmp/specrepro-gpu/sglang/site/env.sh \
#       bash scripts/gpu_bench_standin.sh 540 $OUT/r6.tar.gz sglang-none sglang-dflash
#
# It runs in gpu_env.sh's environment (the staged bundle's; GSM8K from .device/data; the small
# drafters exported once per machine), writes the stand-in once per machine
# (build/standin: git-ignored, so it stays between commands; ~40 s, 30 GB), runs the phases of
# params/standin/bench-h200.yaml in order (scripts/bench_standin.py) into a folder outside the
# working tree that every command of the machine appends to, and archives that folder to
# ARCHIVE when done or when DEADLINE_S is reached (the phase in flight is stopped: its cells
# written so far are kept). Exit status: the bench's (124: the deadline stopped it).
set -uo pipefail
if [ $# -lt 3 ]; then
    echo "usage: $0 DEADLINE_S ARCHIVE PHASE [PHASE ...]" >&2
    exit 2
fi
deadline=$1 archive=$2
shift 2
case $deadline in ''|*[!0-9]*) echo "$0: DEADLINE_S must be whole seconds, got '$deadline'" >&2; exit 2;; esac
start=$(date +%s)
# shellcheck source=scripts/gpu_env.sh
. "$(dirname "$0")/gpu_env.sh"
results=${SPECREPRO_STANDIN_RESULTS:-/var/tmp/specrepro-standin}
mkdir -p "$results"
if [ ! -f build/standin/standin.json ]; then
    python3 -m specrepro.cli export-standin --out build/standin --device cuda \
        > "$results/export-$(date +%H%M%S).txt" 2>&1 || { tail -20 "$results"/export-*.txt; exit 1; }
fi
left=$(( deadline - ($(date +%s) - start) ))
phases=()
for p in "$@"; do phases+=(--phase "$p"); done
timeout --kill-after=20 "$left" python3 scripts/bench_standin.py params/standin/bench-h200.yaml \
    "${phases[@]}" --out "$results" 2>&1 | tee -a "$results/bench.txt"
rc=${PIPESTATUS[0]}
tar -czf "$archive" -C "$results" --exclude='*.lock' . || rc=1
exit "$rc"
