#!/usr/bin/env bash
# Torch-profiler summaries of engines on the offline H200 (docs/gpu-box.md, "Where an
# engine's time goes"), after the engine bundles are staged:
#
#   bash scripts/gpu_profile.sh SUITE ARCHIVE STUDY:ARM[:STREAMS] ...
#   bash scripts/gpu_profile.sh params/h200-engines.yaml $OUT/profiles.tar.gz \
#       peer-vllm:none:1 peer-sglang:none:1
#
# Each STUDY:ARM is one `specrepro profile` (its own engine start with the profiler on, the
# study's load once untraced and once traced, as many prompts as streams and at least 8) into
# /var/tmp/specrepro-profiles/<suite>/<study>--<arm>--c<streams>; one that fails is reported
# and the next one still runs. ARCHIVE then holds every summary (`*.summary.txt`), the
# engines' logs and what each command printed, never the traces themselves (tens of MB each).
# Exit status: 0 when every profile gave a summary, 1 otherwise.
set -uo pipefail
if [ $# -lt 3 ]; then
    echo "usage: $0 SUITE ARCHIVE STUDY:ARM[:STREAMS] ..." >&2
    exit 2
fi
suite=$1 archive=$2
shift 2
[ -f "$suite" ] || { echo "$0: no suite file $suite" >&2; exit 2; }
# shellcheck source=scripts/gpu_env.sh
. "$(dirname "$0")/gpu_env.sh"
root=${SPECREPRO_GPU_PROFILES:-/var/tmp/specrepro-profiles}/$(basename "$suite" .yaml)
mkdir -p "$root"
failed=0
for spec in "$@"; do
    IFS=: read -r study arm streams <<<"$spec"
    if [ -z "$study" ] || [ -z "$arm" ]; then
        echo "$0: '$spec' is not STUDY:ARM[:STREAMS]" >&2; failed=1; continue
    fi
    out=$root/$study--$arm${streams:+--c$streams}
    mkdir -p "$out"
    echo "== $spec -> $out"
    started=$SECONDS
    python3 -m specrepro.cli profile "$suite" --study "$study" --arm "$arm" --out "$out" \
        ${streams:+--concurrency "$streams"} 2>&1 | tee "$out/profile.out"
    rc=${PIPESTATUS[0]}
    echo "== $spec: exit $rc after $((SECONDS - started)) s" | tee -a "$out/profile.out"
    [ "$rc" -eq 0 ] || failed=1
done
(cd "$root" && find . \( -name '*.summary.txt' -o -name '*.log' -o -name 'profile.out' \) \
    -print0 | tar czf "$archive" --null -T -)
exit $failed
