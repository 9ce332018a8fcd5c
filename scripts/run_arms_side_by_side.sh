#!/usr/bin/env bash
# Runs one study's arms side by side (SUITE: a suite and STUDY one of its notebooks or
# studies, or SUITE a study file and STUDY its name), one `specrepro run --arm` process per arm sharing one
# store: the way acceptance-only studies (params/studies/parity.yaml) use one GPU, each engine
# on the port and memory budget its arm states. Speed measured so is not a speed figure.
#
#   scripts/run_arms_side_by_side.sh SUITE STUDY DEADLINE_S ARCHIVE [STAGGER_S]
#
# Every process gets the same deadline (`specrepro run --deadline-s`) and rewrites the same
# archive after each cell (the last complete rewrite wins; each holds the whole store as it
# was); once all have ended, arms left without an ok cell (an engine that failed to start
# beside the others) get one more side-by-side pass if a third of the time is left, and the
# archive is written once more from the finished store. Starts are STAGGER_S apart (default
# 2): engines that size memory from what is free see fewer neighbours mid-start. Each arm's
# output goes to <store>/logs/run--<arm>.txt. Exit status: the worst of the processes'.
set -u
if [ $# -lt 4 ]; then
  echo "usage: $0 SUITE STUDY DEADLINE_S ARCHIVE [STAGGER_S]" >&2; exit 2
fi
suite=$1 study=$2 deadline=$3 archive=$4 stagger=${5:-2}
case $deadline in ''|*[!0-9]*) echo "run_arms_side_by_side: DEADLINE_S: expected whole seconds, found '$deadline'" >&2; exit 2 ;; esac
py=${PYTHON:-python3}
start=$(date +%s)
read -r store arms < <("$py" - "$suite" "$study" <<'PY'
import sys
from specrepro.params import resolve_file as resolve
from specrepro.params import ParamsError
try:
    (st, results_dir, run_id), = resolve(sys.argv[1], [sys.argv[2]])
except (ParamsError, OSError, ValueError) as err:
    sys.exit(f"run_arms_side_by_side: {err}")
print(results_dir / st.name / run_id, " ".join(a.name for a in st.arms))
PY
) || { echo "run_arms_side_by_side: cannot resolve study $study of $suite" >&2; exit 2; }
mkdir -p "$store/logs"
worst=0
for pass in 1 2; do
  left=$(( deadline - ($(date +%s) - start) ))
  if [ "$pass" -eq 2 ] && [ "$left" -lt $(( deadline / 3 )) ]; then break; fi
  pids=()
  i=0
  for a in $arms; do
    (
      sleep $(( i * stagger ))
      "$py" -m specrepro.cli run "$suite" --study "$study" --arm "$a" --no-progress \
        --deadline-s $(( left - i * stagger )) --archive "$archive" \
        >> "$store/logs/run--$a.txt" 2>&1
    ) &
    pids+=($!)
    i=$((i + 1))
  done
  codes=()
  for p in "${pids[@]}"; do wait "$p"; codes+=($?); done
  echo "pass $pass: exit statuses ${codes[*]} ($(( $(date +%s) - start )) s)"
  worst=0; again=0
  for c in "${codes[@]}"; do
    [ "$c" -gt "$worst" ] && worst=$c
    [ "$c" -ne 0 ] && again=1
  done
  [ "$again" -eq 0 ] && break
done
# the finished store, whole (the processes' last rewrites may each predate another's merge)
tmp="$(dirname "$archive")/.$(basename "$archive").final"
tar czf "$tmp" -C "$(dirname "$(dirname "$store")")" "$(basename "$(dirname "$store")")/$(basename "$store")" \
  && mv "$tmp" "$archive"
exit "$worst"
