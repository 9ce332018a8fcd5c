"""`specrepro run`: the command line over the runner (harness/runner.py).

Design: `resolve` turns a suite (its notebooks, or the notebooks and `studies:` named) or a
study file into (study, results dir, run id) plans; `main` opens one store per study and
hands them all to `runner.run_studies` at once, so that studies whose arms resolve to the
same profile share that engine's start (`runner.launch_groups`). Before any engine starts
or any file is written, it refuses, in one sentence naming file and key or option: a run id
that is not one folder name, arms that need a GPU this machine lacks, data no source has
or a malformed data file, what preflight.py finds (workload sizes, levels, engines'
bounds, model folders, context lengths), and a results folder this user cannot write
(exit status 2). It prints one line per study, each error, and what a deadline left; the
exit status is the worst of the studies' (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP: each stops
the run as Ctrl-C does; 1 failures, 75 cells left at a deadline, 0).
"""
from __future__ import annotations

import argparse
import contextlib
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from specrepro import provenance
from specrepro.data import DataError
from specrepro.harness.archive import Archive
from specrepro.harness.deadline import deadline_of, seconds_arg, zoned_time_arg
from specrepro.harness.preflight import problems, results_problem
from specrepro.harness.runner import EX_TEMPFAIL, chosen_arms, run_studies
from specrepro.params import ParamsError, Problem, ResolvedStudy, resolve_file
from specrepro.store import NAME_PATTERN, ResultsError, ResultStore
from specrepro.workloads import check_data

EXIT_RANK = {0: 0, EX_TEMPFAIL: 1, 1: 2, 130: 3, 129: 3, 143: 3}  # which of two statuses wins


def run_id_arg(value: str) -> str:
    """--run-id: one folder name under each study's folder (store.NAME_PATTERN), never a
    path that would put the store outside the results folder."""
    if not re.fullmatch(NAME_PATTERN, value):
        raise argparse.ArgumentTypeError(
            f"expected one folder name (letters, digits, '_', '.', '+', '-', not starting "
            f"with '.' or '-'): the store is <results>/<study>/<run id>/, found {value!r}")
    return value


def no_gpu_here(params: str, studies: Sequence[ResolvedStudy], arms: Sequence[str],
                engines_: Sequence[str]) -> None:
    """ParamsError when arms chosen to run start their engine on a GPU and NVML sees none
    here: a start that can only fail would go into the store as a failed attempt (and a
    probe's profile would read it as the engine's answer), so nothing is run."""
    chosen = chosen_arms(studies, arms, engines_)
    refuse_without_gpu(params, "arms", [
        f"{a.name} of {st.name}" for st, names in zip(studies, chosen, strict=True)
        for a in st.arms if a.name in names and a.resolved.needs_gpu], "--arm or --engine")


def refuse_without_gpu(params: str, key: str, names: Sequence[str], others: str) -> None:
    """ParamsError naming the `key` (arms, probes) that would start their engine on a GPU
    when NVML sees none on this machine; `others` says which options choose the rest."""
    if not names:
        return
    info = provenance.gpu_info()
    if info.get("gpus"):
        return
    note = f" ({info['note']})" if info.get("note") else ""
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    raise ParamsError([Problem(str(params), key, f"{key} {shown} start their engine "
                               "on a GPU (--device cuda, or vLLM or SGLang) and this machine "
                               f"has no NVIDIA GPU that NVML sees{note}; nothing was run: "
                               f"run them on a GPU machine, or choose others with {others}")])


def main(argv: list[str] | None = None) -> int:
    """`specrepro run params/<suite or study>.yaml [--notebook ID ...] [--arm NAME ...]
    [--engine NAME ...]
    [--results-dir DIR] [--fresh] [--deadline-s S | --until TIME] [--cell-bound-s S]
    [--archive PATH]`."""
    ap = argparse.ArgumentParser(prog="specrepro run",
                                 description="run a suite's or a study's cells against its "
                                             "engines; resumes what the store lacks")
    ap.add_argument("params", help="a suite (params/default.yaml) or a study file")
    ap.add_argument("--notebook", "--study", action="append", default=[], dest="notebook",
                    help="only this notebook's study, or a study of the suite's `studies:` "
                         "(run only when named); repeatable: the studies run together, one "
                         "engine start for the arms that resolve to the same profile")
    ap.add_argument("--engine", action="append", default=[],
                    help="only the arms whose profile runs on this engine (repeatable: vllm, "
                         "sglang, embedded, ...): the engines a machine has staged; the "
                         "others' cells wait for a machine that has theirs")
    ap.add_argument("--arm", action="append", default=[],
                    help="only this arm's cells (repeatable): several `specrepro run --arm` "
                         "processes may share one store, e.g. acceptance-only arms sharing "
                         "a GPU, each engine on its own port")
    ap.add_argument("--results-dir", default=None, help="overrides the suite's results_dir")
    ap.add_argument("--run-id", default=None, type=run_id_arg,
                    help="overrides the suite's run_id (one folder name)")
    ap.add_argument("--fresh", action="store_true",
                    help="measure every cell again (new attempts) instead of resuming")
    ap.add_argument("--power-interval", type=float, default=2.0, help="NVML sampling, seconds")
    ap.add_argument("--no-progress", action="store_true")
    when = ap.add_mutually_exclusive_group()
    when.add_argument("--deadline-s", type=seconds_arg, metavar="S",
                      help="end cleanly S seconds from now: no cell starts that cannot end by "
                           "then, the cell in flight is stored as interrupted; exit status 75 "
                           "if cells are left. Leave room after it to stop the engine (<= 60 s)")
    when.add_argument("--until", type=zoned_time_arg, metavar="TIME",
                      help="the same at an ISO 8601 time with its zone (2026-12-01T18:30:00Z)")
    ap.add_argument("--cell-bound-s", type=seconds_arg, metavar="S",
                    help="a bound on one cell's seconds, for the deadline before a cell has run")
    ap.add_argument("--archive", type=Path, default=None, metavar="PATH",
                    help="a .tar.gz of the stores written (<study>/<run_id>/...), rewritten "
                         "after each cell; unpacked into a results dir, a run resumes from it")
    args = ap.parse_args(argv)
    deadline = deadline_of(ap, args)
    if args.archive is not None and not args.archive.parent.is_dir():
        ap.error(f"argument --archive: expected a file in an existing folder, found no folder "
                 f"{args.archive.parent}")
    try:
        plans = resolve_file(args.params, args.notebook)
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        no_gpu_here(args.params, [study for study, _, _ in plans], args.arm, args.engine)
        # the data the chosen cells read, from its directory or the hub (asked once), before
        # any engine starts: not a traceback at the first GSM8K cell
        studies = [study for study, _, _ in plans]
        chosen = chosen_arms(studies, args.arm, args.engine)
        check_data(c.workload for st, names in zip(studies, chosen, strict=True)
                   for c in st.cells() if c.arm.name in names)
        # what the engines would refuse, or the cells would meet, said before any starts
        # (harness/preflight.py): file and key named
        found = problems(studies, chosen)
        if found:
            raise ParamsError(found)
        stores = [(study, ResultStore(Path(args.results_dir) if args.results_dir
                                      else results_dir, study.name, args.run_id or run_id))
                  for study, results_dir, run_id in plans]
        where = {Path(args.results_dir) if args.results_dir else results_dir
                 for _, results_dir, _ in plans}
        for folder in sorted(where):
            if why := results_problem(folder, [store.root for _, store in stores]):
                raise ResultsError(f"results folder {folder}: {why}; nothing was run: "
                                   "give a folder this user can write (--results-dir)")
    except (ParamsError, DataError, ResultsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        summaries = run_studies(stores, progress=not args.no_progress,
                                fresh=args.fresh, power_interval_s=args.power_interval,
                                command=["specrepro", "run", *(argv or sys.argv[1:])],
                                deadline=deadline,
                                archive=Archive(args.archive) if args.archive else None,
                                arms=args.arm, engines_=args.engine)
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    code = 0
    for (study, store), summary in zip(stores, summaries):
        shared = f", {summary.shared} shared with another study" if summary.shared else ""
        print(f"{study.name}: {summary.ok} ok, {summary.failed} failed, {summary.skipped} "
              f"already done{shared}, {summary.interrupted} interrupted -> {store.root}")
        for err in summary.errors:
            print(f"  error: {err}", file=sys.stderr)
        code = max(code, summary.exit_code, key=EXIT_RANK.__getitem__)
    stopped = summaries[0].stopped if summaries else None
    if stopped == "ctrl-c":
        by = summaries[0].signal
        with contextlib.suppress(OSError):  # after a closed terminal's SIGHUP: nobody reads
            print(f"interrupted{f' by {by}' if by else ''}: the engine is stopped, everything "
                  "measured so far is kept; run again to resume", file=sys.stderr, flush=True)
        return summaries[0].exit_code
    if stopped == "deadline":
        left = [f"{s.left} of {study.name}" for (study, _), s in zip(stores, summaries) if s.left]
        print(f"stopped before the deadline ({deadline.given}): cells left: "
              f"{', '.join(left) or 'none'}; everything measured is kept; run again to resume",
              file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
