"""`specrepro profile`: one arm's engine traced by torch.profiler under a short load, and
where its time went, as text (harness/profiling.py reads the trace).

Design: the arm's profile is started with its engine's profiler turned on
(`EngineAdapter.profiled`: a flag or an environment variable naming the output folder; that
changes the engine's command, so it is a launch of its own, never a measured cell's). The
load is the study's own (its first workload's prompts at the cell's concurrency, the cell's
sampling and request settings, as `specrepro run` sends them): once untraced, so compile
caches, CUDA graphs and allocator pools are warm, then again between `POST /start_profile`
and `POST /stop_profile`. The engine writes its traces when profiling stops (vLLM and SGLang
asynchronously: the command waits until the files stop growing), then stops; each trace's
summary is printed and written beside it as `<trace>.summary.txt`. Nothing goes into the
results store: a profiled engine's speed is the profiler's.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from specrepro.harness import engine_http, engines, profiling
from specrepro.harness.arm_engine import ArmEngine
from specrepro.harness.engines.base import EngineError
from specrepro.harness.loadgen import LoadGenerator
from specrepro.harness.runner import check_arms, load_config
from specrepro.params import ParamsError, Problem
from specrepro.params import resolve_file as resolve
from specrepro.workloads import build_workload

SETTLE_S = 3.0  # a trace counts as written once its size holds this long
DEFAULT_PROMPTS = 8  # a trace of a busy GPU grows by megabytes a second


def wait_for_traces(folder: Path, since: float, timeout_s: float) -> list[Path]:
    """The traces written under folder since `since`, once none has grown for SETTLE_S."""
    deadline = time.monotonic() + timeout_s
    last: dict[Path, int] = {}
    steady_since = None
    while time.monotonic() < deadline:
        now = {p: p.stat().st_size for p in profiling.traces_in(folder, since)}
        if now and now == last:
            steady_since = steady_since or time.monotonic()
            if time.monotonic() - steady_since >= SETTLE_S:
                return sorted(now, key=lambda p: p.stat().st_mtime)
        else:
            steady_since = None
        last = now
        time.sleep(0.5)
    return sorted(last)


def profile_arm(params: str, study_id: str, arm_name: str, out: Path, concurrency: int | None,
                prompts: int | None, trace_timeout_s: float = 600.0
                ) -> list[profiling.TraceSummary]:
    """Trace arm_name's engine under `prompts` of the cell's prompts (None: the cell's
    concurrency, at least DEFAULT_PROMPTS), so every one of its streams is busy."""
    (study, _, _), = resolve(params, [study_id])
    check_arms(study, [arm_name])
    arm = next(a for a in study.arms if a.name == arm_name)
    cells = [c for c in study.cells() if c.arm.name == arm.name
             and (concurrency is None or c.concurrency == concurrency)]
    if not cells:
        raise ParamsError([Problem(study.source, "concurrency", f"--concurrency: study "
                                   f"{study.name} measures arm {arm.name} at "
                                   f"{sorted(study.concurrency)} streams, not {concurrency}")])
    cell = cells[0]
    workload = build_workload(cell.workload)
    prompts = max(DEFAULT_PROMPTS, cell.concurrency) if prompts is None else prompts
    load = workload[:prompts]
    if len(load) < cell.concurrency:  # fewer requests than streams: the level is not traced
        fix = (f"give --prompts {cell.concurrency} or more" if len(workload) >= cell.concurrency
               else f"the workload has too few prompts for {cell.concurrency} streams")
        raise ParamsError([Problem(study.source, "concurrency", f"--concurrency "
                                   f"{cell.concurrency}: --prompts {prompts} sends {len(load)} "
                                   f"of the {len(workload)} prompts of workload "
                                   f"{cell.workload.name}, so at most {len(load)} of the "
                                   f"{cell.concurrency} streams would be busy; {fix}")])
    out.mkdir(parents=True, exist_ok=True)
    adapter = engines.adapter_for(arm.resolved)
    profiled = adapter.profiled(arm.resolved, out)
    handle = engines.launch(profiled, out, profiled.source,
                            log_name=f"{arm.name}--{profiled.name}--profiled")
    try:
        eng = ArmEngine(arm, handle=handle)  # the load is the arm's, as `specrepro run` sends it
        cfg = load_config(study, cell, eng, 600.0)
        LoadGenerator(cfg).run(load)  # untraced: everything the first requests warm
        since = time.time()
        for action in ("start_profile", "stop_profile"):
            status, body = engine_http.http_post(f"{handle.url}/{action}", timeout=600.0)
            if status != 200:
                raise EngineError(f"{handle.url}/{action} answered {status}: "
                                          f"{body[:300].decode(errors='replace')}; log "
                                          f"{handle.log_path}")
            if action == "start_profile":  # the traced load: no warm-up requests of its own
                LoadGenerator(dataclasses.replace(cfg, warmup=0)).run(load)
        traces = wait_for_traces(out, since, trace_timeout_s)
    finally:
        handle.stop()
    if not traces:
        raise EngineError(f"no trace appeared under {out} within {trace_timeout_s:g} "
                                  f"s of /stop_profile; log {handle.log_path}")
    summaries = [profiling.summarize(t) for t in traces]
    for t, s in zip(traces, summaries, strict=True):
        Path(f"{t}.summary.txt").write_text(profiling.render(s) + "\n")
    return summaries


def main(argv: list[str] | None = None) -> int:
    """`specrepro profile SUITE --study ID --arm NAME [--concurrency C] [--prompts N]
    --out DIR`."""
    ap = argparse.ArgumentParser(prog="specrepro profile",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("params", help="a suite (params/h200-engines.yaml) or a study file")
    ap.add_argument("--study", "--notebook", required=True, dest="study",
                    help="a notebook of the suite or a study of its `studies:`")
    ap.add_argument("--arm", required=True, help="the arm whose engine is traced")
    ap.add_argument("--concurrency", type=int, default=None,
                    help="the streams of the traced load (default: the arm's first level)")
    ap.add_argument("--prompts", type=int, default=None,
                    help=f"prompts sent while tracing, at least the streams (default: the "
                         f"streams, at least {DEFAULT_PROMPTS}; a trace of a busy GPU grows by "
                         f"megabytes a second)")
    ap.add_argument("--out", type=Path, required=True,
                    help="folder for the engine's log, its traces and their summaries")
    args = ap.parse_args(argv)
    if args.prompts is not None and args.prompts < 1:
        ap.error(f"argument --prompts: expected at least 1, found {args.prompts}")
    try:
        summaries = profile_arm(args.params, args.study, args.arm, args.out, args.concurrency,
                                args.prompts)
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (EngineError, profiling.TraceError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for s in summaries:
        print(profiling.render(s))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
