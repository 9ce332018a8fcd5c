#!/usr/bin/env bash
# One measuring command on the offline H200 (docs/gpu-box.md, "On an offline GPU machine"),
# after the engine bundles are staged:
#
#   bash scripts/gpu_measure.sh SUITE DEADLINE_S ARCHIVE [--probe STUDY] [specrepro run options...]
#   bash scripts/gpu_measure.sh params/h200-engines.yaml 520 $OUT/h200.tar.gz \
#       --notebook 01_drafter_block_sweep --notebook 02_temperature_spread
#
# It runs in gpu_env.sh's environment (a staged bundle's: vLLM's, or the one
# SPECREPRO_GPU_ENV names; GSM8K from .device/data; the drafters exported once per machine),
# keeps the store outside the working tree on the machine (each command copies the checkout
# over the working tree again; the first one copies the committed store there), and writes
# the studies it runs to ARCHIVE after every cell. `--probe STUDY` (repeatable) first asks
# that study's unanswered probes (`specrepro probe`: one engine start each) into the same
# store; the run then gets what is left of DEADLINE_S, and its archive holds the probes'
# answers when it also runs that study. Exit status: specrepro run's (75: the deadline left
# cells).
set -uo pipefail
if [ $# -lt 3 ]; then
    echo "usage: $0 SUITE DEADLINE_S ARCHIVE [specrepro run options...]" >&2
    exit 2
fi
suite=$1 deadline=$2 archive=$3
shift 3
probes=() run_args=()
while [ $# -gt 0 ]; do
    if [ "$1" = "--probe" ]; then
        [ $# -ge 2 ] || { echo "$0: --probe needs a study id" >&2; exit 2; }
        probes+=("$2"); shift 2
    else
        run_args+=("$1"); shift
    fi
done
[ -f "$suite" ] || { echo "$0: no suite file $suite" >&2; exit 2; }
case $deadline in ''|*[!0-9]*) echo "$0: DEADLINE_S must be whole seconds, got '$deadline'" >&2; exit 2;; esac
# shellcheck source=scripts/gpu_env.sh
. "$(dirname "$0")/gpu_env.sh"
name=$(basename "$suite" .yaml)
store=${SPECREPRO_GPU_RESULTS:-/var/tmp/specrepro-results}/$name
if [ ! -d "$store" ]; then
    mkdir -p "$(dirname "$store")"
    if [ -d "results/$name" ]; then cp -r "results/$name" "$store"; else mkdir -p "$store"; fi
fi
started=$SECONDS
for study in "${probes[@]}"; do
    python3 -m specrepro.cli probe "$suite" --study "$study" --results-dir "$store" || exit $?
done
left=$((deadline - (SECONDS - started)))
[ "$left" -gt 0 ] || { echo "$0: the probes took the whole deadline; nothing run" >&2; exit 75; }
exec python3 -m specrepro.cli run "$suite" --results-dir "$store" --no-progress \
    --deadline-s "$left" --cell-bound-s 40 --archive "$archive" "${run_args[@]}"
