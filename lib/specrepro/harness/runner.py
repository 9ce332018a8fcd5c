"""A study → cells and requests in the results store (the command line is run_command.py).

Design:
- `run_studies([(study, store), ...])` walks the studies' cells engine by engine: the arms
  of all the studies are grouped by the engine they need (`launch_groups`: one group per
  resolved profile and placement policy, each study's baseline arm first, so the others can
  be compared with it), and each group's engine is launched once through its adapter (or
  attached to, or the in-process transformers peer loaded) and serves its arms' cells in
  turn: on a fresh GPU machine a start is 1-2 minutes and a cell seconds. Per cell
  (workload × concurrency × sampling × repeat): skip it if the store has an `ok` attempt
  (resume), scrape `/metrics` before and after the measured load (inside the load
  generator, after warm-up), sample power and memory, and append one attempt with its
  requests. Each study keeps its own session; one that ran on another study's engine
  start says so in its engine entry (`shared_launch`) and keeps its own copy of that
  launch's log. The row's figures come from `cells.py` (which takes each formula from
  `metrics.py`); nothing is computed here. `run_study` is the one-study case.
- Cell identity (`specrepro.identity.cell_id`) includes the engine version, known only once
  the engine answers. To skip an arm whose cells are all done without launching it, the
  version an earlier session recorded in the manifest for the same arm and profile hash is
  tried first.
- Faults: a cell whose engine dies is appended as `failed` with the first request error
  and the engine log's tail, the arm's remaining cells are left for a re-run, and the run
  goes on with the next arm. `/metrics` missing or counters that do not match what the
  client saw are warnings of the cell (`cells.py`). Ctrl-C records the current
  cell as `interrupted` with the requests that ended, stops the engine and ends the
  session as interrupted; a second run resumes. SIGTERM and SIGHUP take the same path
  (`lifecycle.stop_signals`; the summary names the signal); SIGKILL leaves the engine to
  its watchdog, and a stale engine to the next run (lifecycle.py, pid files in
  `<results_dir>/.engines/`).
- CPU placement (the study's `placement`, `process.plan_placement`): per arm, a launched
  engine and this process (the load generator) are pinned to disjoint CPU sets where the
  machine allows, for the arm's cells, and undone after; an attached engine or the
  in-process peer is not, with the reason. The session's `placement` in the manifest is
  `{"engine_cpus", "client_cpus", "pinned", "note"}` (`session_placement`: the arms' common
  placement, or the first pinned one with the arms that differ named in the note); each
  engine's entry carries its own.
- Relative paths in profiles (model, drafter) are relative to the working directory,
  which should be the repository root (engines are started there too).
- `--arm NAME` runs only those arms' cells. Several such processes may share one store at
  once (the manifest is edited under a lock, each session writes its own parts): the way
  acceptance-only arms share one GPU, each engine on a port of its own (say so in the
  study: speed measured beside other engines is not a speed figure).
- At the session's end the store merges the session's part files into one file per table
  (`results.ResultStore.end_session`).
- A deadline (`Deadline`: `--deadline-s S`, `--until TIME`) ends the run cleanly before it,
  for machines that are taken back. A cell starts only if the time left exceeds the longest
  cell of this session (stored and archived) or the declared `--cell-bound-s`, whichever is
  larger; an engine only if the time left also covers the longest start so far, and the
  cells that fit after it either finish its launch group or take at least as long as that
  start (`deadline.start_repays`: else the next command would start it again). While a
  cell measures or an engine starts, a watchdog sends SIGINT to the main thread when the
  deadline passes: Ctrl-C's own path, so the cell in flight is stored as `interrupted` and
  the engine stopped. The session ends as `deadline`, `RunSummary.left` counts the cells a
  resumed run will measure, the exit status is 75 (EX_TEMPFAIL). The teardown (engine stop,
  up to 2 x `process.STOP_GRACE_S`; merge; archive) follows the deadline: leave room for it.
  Off the main thread (a notebook's worker) only the check between cells applies.
- An archive (`Archive`: `--archive PATH`) is one .tar.gz of the stores a command writes
  (`<study>/<run_id>/...`), rewritten whole when the session begins, after each engine
  start, after each cell and at the end (temporary file, fsync, rename): a command killed at
  any point leaves the last complete one, which lacks at most the cell in flight. Unpacked
  into another machine's results dir it is the store there, and a run resumes from it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from specrepro import identity
from specrepro.compaction import append_log, pack_log
from specrepro.harness import engines, lifecycle, power, process, promtext
from specrepro.harness.arm_engine import (
    ArmEngine,
    known_version,
    log_name,
    placement_for,
    session_placement,
    start_engine,
)
from specrepro.harness.cells import (
    baseline_requests,
    cell_row,
    grade,
    gsm8k_fields,
    identical_share,
    request_rows,
)
from specrepro.harness.deadline import (
    Archive,
    Deadline,
    ctrl_c_raises,
    start_repays,
)
from specrepro.harness.loadgen import LoadConfig, LoadGenerator, LoadResult, RequestRecord
from specrepro.params import (
    Cell,
    ParamsError,
    Problem,
    ResolvedArm,
    ResolvedStudy,
)
from specrepro.results import ResultStore, now
from specrepro.workloads import Prompt, build_workload

IGNORE_EOS_WARNING = (
    "ignore_eos is on: every output runs to max_tokens past its end of text, where a model "
    "tends to repeat itself, and repetition is easy to draft, so acceptance is inflated "
    "(article B); compare repeated_4gram_share")
PEER_SEQUENTIAL = "the transformers peer serves one request at a time: concurrency {c} ran sequentially"


EX_TEMPFAIL = 75  # sysexits.h: a temporary failure; the user is invited to retry (resume)


@dataclass
class RunSummary:
    """What one run_study call did. `stopped`: "ctrl-c" or "deadline" where the run ended
    early; `signal`: "SIGTERM" or "SIGHUP" where one stopped it as Ctrl-C does; `left`: the
    cells a deadline left unmeasured (what a resumed run measures)."""

    ok: int = 0
    failed: int = 0
    interrupted: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)
    stopped: str | None = None
    signal: str | None = None
    left: int = 0

    @property
    def exit_code(self) -> int:
        """130 after Ctrl-C (143 SIGTERM, 129 SIGHUP), 1 on failures, 75 where a deadline
        left cells, else 0."""
        if self.stopped == "ctrl-c" or (self.interrupted and self.stopped is None):
            return lifecycle.exit_status(self.signal)
        if self.failed or self.errors:
            return 1
        return EX_TEMPFAIL if self.stopped == "deadline" and self.left else 0


# ---------------------------------------------------------------------- one cell


def load_config(study: ResolvedStudy, cell: Cell, eng: ArmEngine, timeout_s: float) -> LoadConfig:
    p = eng.profile
    extras = eng.handle.request_extras() if eng.handle is not None else {}
    return LoadConfig(
        url=eng.handle.url if eng.handle is not None else "inprocess",
        model=p.model.served_name or p.model.id, concurrency=cell.concurrency, mode=study.mode,
        window_s=study.window_s, warmup=study.warmup, temperature=cell.sampling.temperature,
        top_p=cell.sampling.top_p, top_k=cell.sampling.top_k, seed=cell.seed,
        ignore_eos=study.ignore_eos, thinking=study.thinking,
        reasoning_effort=study.reasoning_effort,
        engine=eng.family if eng.family in promtext.ENGINE_FAMILY else "vllm",
        extra_body=extras, request_timeout_s=timeout_s, api=p.api)


def died_message(eng: ArmEngine, records: Sequence[RequestRecord]) -> str:
    errors = [r.error for r in records if r.error]
    first = f"; first request error: {errors[0]}" if errors else ""
    where = ""
    if eng.handle is not None and eng.handle.log_path is not None:
        where = (f"; log {eng.handle.log_path} (gzipped when the engine stops), last "
                 f"lines:\n{eng.handle.log_tail()}")
    return (f"engine of arm {eng.arm.name!r} ({eng.profile.name}) died during the cell: "
            f"{len(errors)} of {len(records)} requests failed{first}{where}")


@dataclass
class _Run:
    """One study of a run: what its arms and cells share. The deadline's figures (cell_s,
    start_s) are the command's, shared by its studies (the same list objects)."""

    study: ResolvedStudy
    store: ResultStore
    bar: Any
    power_interval_s: float
    request_timeout_s: float
    warnings: list[str]
    done: set[str]  # cells with an ok attempt: stored before, or measured in this session
    deadline: Deadline | None
    archive: Archive | None
    chosen: set[str]  # the arms run (--arm), or all
    cell_s: list[float]  # each cell's seconds, stored and archived (every study's)
    start_s: list[float]  # each engine's seconds to ready (every study's)
    summary: RunSummary = field(default_factory=RunSummary)
    prompts_of: dict[str, list[Prompt]] = field(default_factory=dict)
    versions: dict[str, str | None] = field(default_factory=dict)  # arm -> its engine's version
    placements: dict[str, process.Placement] = field(default_factory=dict)

    def fits(self) -> bool:
        """Whether one more cell ends before the deadline."""
        if self.deadline is None:
            return True
        return self.deadline.remaining() > max([*self.cell_s, self.deadline.cell_bound_s or 0.0])

    def start_fits(self, cells_left: int) -> bool:
        """Whether an engine start for `cells_left` cells is worth it before the deadline
        (`deadline.start_repays`)."""
        if self.deadline is None:
            return True
        return start_repays(self.deadline.remaining(), self.start_s, self.cell_s,
                            self.deadline.cell_bound_s, cells_left)

    def armed(self):
        return self.deadline.armed() if self.deadline is not None else contextlib.nullcontext()

    def interrupted_why(self) -> str:
        if self.deadline is not None and self.deadline.fired:
            return f"stopped at the deadline ({self.deadline.given}) during the cell"
        by = lifecycle.received()
        return f"interrupted by {by} during the cell" if by else \
            "interrupted by the user (Ctrl-C) during the cell"

    def save(self) -> None:
        """Rewrite the archive; a failure is an error of the run (the store keeps it all)."""
        if self.archive is None:
            return
        try:
            self.archive.write()
        except OSError as err:
            message = f"archive {self.archive.path} not written: {err}"
            if message not in self.summary.errors:
                self.summary.errors.append(message)

    def arms(self) -> list[ResolvedArm]:
        """The arms to run, the baseline first (so the others can be compared with it)."""
        return [a for a in sorted(self.study.arms, key=lambda a: a.name != self.study.baseline)
                if a.name in self.chosen]

    def cells_of(self, arm: ResolvedArm) -> list[Cell]:
        return [c for c in self.study.cells() if c.arm.name == arm.name]


class _AtDeadline(Exception):
    """The next cell (or engine start) would not end before the deadline."""


# ----------------------------------------------------------------------- the run


def run_study(study: ResolvedStudy, store: ResultStore, **kwargs: Any) -> RunSummary:
    """Measure every cell of a resolved study that the store lacks; `run_studies` with one
    study (same keywords)."""
    return run_studies([(study, store)], **kwargs)[0]


def run_studies(plans: Sequence[tuple[ResolvedStudy, ResultStore]], *,
                root: Path | str = ".", fresh: bool = False, progress: bool = True,
                power_interval_s: float = 2.0, request_timeout_s: float = 600.0,
                command: list[str] | None = None, deadline: Deadline | None = None,
                archive: Archive | None = None, arms: Sequence[str] = (),
                engines_: Sequence[str] = ()) -> list[RunSummary]:
    """Measure every cell the stores lack of the studies given (of the named arms only,
    where `arms` names some; of the arms whose profile runs on one of `engines_` only,
    where it names some: the engines staged on this machine), one engine per launch group
    (`launch_groups`), before the deadline if one is given, rewriting the archive as it
    goes; one summary per study, in order. See the module docstring."""
    chosen = chosen_arms([study for study, _ in plans], arms, engines_)
    bar = tqdm(total=sum(1 for (study, _), names in zip(plans, chosen)
                         for c in study.cells() if c.arm.name in names),
               desc=" + ".join(study.name for study, _ in plans), unit="cell",
               disable=not progress)
    cell_s: list[float] = []
    start_s: list[float] = []
    ctxs = [_Run(study, store, bar, power_interval_s, request_timeout_s,
                 [IGNORE_EOS_WARNING] if study.ignore_eos else [],
                 set() if fresh else store.completed_cell_ids(), deadline, archive, names,
                 cell_s, start_s)
            for (study, store), names in zip(plans, chosen)]
    with ctrl_c_raises(), lifecycle.stop_signals():
        _run_all(ctxs, Path(root), command)
    return [ctx.summary for ctx in ctxs]


def chosen_arms(studies: Sequence[ResolvedStudy], arms: Sequence[str] = (),
                engines_: Sequence[str] = ()) -> list[set[str]]:
    """Per study, the arms a run measures: those named (--arm; all where none is) whose
    profile runs on an engine named (--engine; any where none is); names checked first."""
    for study in studies:
        check_arms(study, arms)
    check_engines(studies, engines_)
    return [{a.name for a in study.arms if (not arms or a.name in arms)
             and (not engines_ or a.resolved.engine in engines_)} for study in studies]


def check_arms(study: ResolvedStudy, arms: Sequence[str]) -> None:
    """ParamsError naming the first of `arms` (--arm) the study does not have."""
    names = [a.name for a in study.arms]
    unknown = [a for a in arms if a not in names]
    if unknown:
        raise ParamsError([Problem(study.source, "arms", f"--arm: expected an arm of study "
                                   f"{study.name} ({', '.join(names)}), found {unknown[0]!r}")])


def check_engines(studies: Sequence[ResolvedStudy], engines_: Sequence[str]) -> None:
    """ParamsError naming the first of `engines_` (--engine) that no arm of the studies
    runs on, with the engines they do run on."""
    have = sorted({a.resolved.engine for st in studies for a in st.arms})
    unknown = [e for e in engines_ if e not in have]
    if unknown:
        names = ", ".join(st.name for st in studies)
        raise ParamsError([Problem(studies[0].source if len(studies) == 1 else "--engine",
                                   "arms", f"--engine: expected an engine the arms of {names} "
                                   f"run on ({', '.join(have)}), found {unknown[0]!r}")])


def launch_groups(ctxs: Sequence[_Run]) -> list[list[tuple[_Run, ResolvedArm]]]:
    """The arms of every study grouped by the engine they need: one group per resolved
    profile (profile_hash: flags, env, port, models and their content) and placement
    policy. One engine start serves a group's arms one after another (a start is 1-2
    minutes on a fresh GPU machine; a cell is seconds), so a command's studies that share a
    profile share its start; the cells run exactly as they would on a start of their own.
    Order: each study's baseline group before the study's other groups (its arms are
    compared with the baseline's stored outputs), otherwise in order of first appearance;
    where studies' baselines contradict each other (A's baseline is B's other arm and back)
    the first appearance decides."""
    keyed: dict[tuple[str, str], list[tuple[_Run, ResolvedArm]]] = {}
    for ctx in ctxs:
        for arm in ctx.arms():  # baseline first
            key = (identity.profile_hash(arm.resolved), ctx.study.placement)
            keyed.setdefault(key, []).append((ctx, arm))
    groups = list(keyed.values())
    where = {(id(ctx), arm.name): i for i, g in enumerate(groups) for ctx, arm in g}
    after: dict[int, set[int]] = {i: set() for i in range(len(groups))}  # i runs after these
    for ctx in ctxs:
        arms = ctx.arms()
        if arms and arms[0].name == ctx.study.baseline:
            first = where[(id(ctx), arms[0].name)]
            for arm in arms[1:]:
                if where[(id(ctx), arm.name)] != first:
                    after[where[(id(ctx), arm.name)]].add(first)
    order: list[int] = []
    while len(order) < len(groups):
        left = [i for i in range(len(groups)) if i not in order]
        ready = [i for i in left if after[i] <= set(order)]
        order.append(min(ready or left))
    return [groups[i] for i in order]


def _run_all(ctxs: Sequence[_Run], root: Path, command: list[str] | None) -> None:
    cpus = process.allowed_cpus()  # before any pinning: what the machine gives this process
    for ctx in ctxs:
        ctx.store.begin_session({
            "params": ctx.study.model_dump(mode="json"), "command": command,
            "power_note": power.nvml_note(), "warnings": ctx.warnings,
            "placement": session_placement(ctx.placements),
            "deadline": ctx.deadline.record() if ctx.deadline else None,
            "arms_run": sorted(ctx.chosen) if len(ctx.chosen) < len(ctx.study.arms) else None})
        if ctx.archive is not None:
            ctx.archive.add(ctx.store)
    ctxs[0].save()
    stopped = None
    try:
        for group in launch_groups(ctxs):
            run_group(group, root, cpus)
    except _AtDeadline:
        stopped = "deadline"
    except KeyboardInterrupt:
        deadline = ctxs[0].deadline
        stopped = "deadline" if deadline and deadline.fired else "ctrl-c"
    finally:
        with lifecycle.shielded():  # the engines are stopped: a stop signal now ends nothing
            with contextlib.suppress(OSError):  # a closed terminal (SIGHUP) fails its writes
                ctxs[0].bar.close()
            for ctx in ctxs:
                ctx.summary.stopped = stopped
                ctx.summary.signal = lifecycle.received() if stopped == "ctrl-c" else None
                end_run(ctx)
            ctxs[0].save()


def end_run(ctx: _Run) -> None:
    """The session's summary and status; where a deadline stopped it, the cells left."""
    study, summary = ctx.study, ctx.summary
    if summary.stopped == "deadline":  # what a resumed run will measure
        versions = {a.name: ctx.versions[a.name] if a.name in ctx.versions
                    else known_version(ctx.store, a) for a in study.arms}
        summary.left = sum(1 for c in study.cells() if c.arm.name in ctx.chosen
                           and identity.cell_id(study, c, versions[c.arm.name]) not in ctx.done)
    status = {"ctrl-c": "interrupted", "deadline": "deadline"}.get(summary.stopped, "ok")
    if status == "ok" and (summary.failed or summary.errors):
        status = "failed"
    ctx.store.update_session(summary={"ok": summary.ok, "failed": summary.failed,
                                      "skipped": summary.skipped,
                                      "interrupted": summary.interrupted,
                                      "stopped": summary.stopped, "signal": summary.signal,
                                      "left": summary.left,
                                      "errors": summary.errors})
    ctx.store.end_session(status)


def run_group(group: Sequence[tuple[_Run, ResolvedArm]], root: Path,
              cpus: tuple[int, ...] | None) -> None:
    """One engine for a launch group: started if any of its arms has cells to measure,
    then each arm's cells in turn, then stopped. A study other than the first that used
    the engine gets its own copy of this launch's log and an engine entry that says whose
    launch it shared."""
    todo, left = [], 0  # left: the group's cells not yet measured
    for ctx, arm in group:
        cells = ctx.cells_of(arm)
        version = ctx.versions[arm.name] = known_version(ctx.store, arm)
        pending = sum(identity.cell_id(ctx.study, c, version) not in ctx.done for c in cells)
        if not pending:
            ctx.summary.skipped += len(cells)
            ctx.bar.update(len(cells))
        else:
            todo.append((ctx, arm, cells))
            left += pending
    if not todo:
        return
    first, arm0, _ = todo[0]
    if not first.start_fits(left):
        raise _AtDeadline
    started = time.monotonic()
    try:
        with first.armed():
            eng = start_engine(arm0, first.store.logs_dir, root,
                               placement_for(arm0, first.study.placement, cpus),
                               lifecycle.engines_dir(first.store.root.parent.parent))
    except (engines.EngineError, ParamsError, RuntimeError, OSError) as err:
        failed_log = first.store.logs_dir / log_name(arm0)
        if failed_log.is_file():  # its tail is in the error; the whole log stays, gzipped
            pack_log(failed_log)
        for ctx, arm, cells in todo:
            ctx.summary.errors.append(f"arm {arm.name!r}: {err}")
            ctx.store.update_session(engines=[{
                "arm": arm.name, "profile": arm.resolved.name,
                "profile_hash": identity.profile_hash(arm.resolved), "error": str(err)}])
            ctx.bar.update(len(cells))
        first.save()
        return
    first.start_s.append(time.monotonic() - started)
    # start to ready as this process saw it, for an engine it launched (the engine's own
    # log times the parts)
    launched = eng.handle is not None and not eng.handle.attached
    ready_s = round(first.start_s[-1], 1) if launched else None
    pinned = eng.placement is not None and eng.placement.pinned
    saved: dict[int, set[int]] = {}
    copies: list[Path] = []
    log = eng.handle.log_path if launched and eng.handle.log_path is not None else None
    try:
        if pinned:  # the load generator off the engine's CPUs for the arm's cells
            saved = process.pin_process(eng.placement.client_cpus)
        for i, (ctx, arm, cells) in enumerate(todo):
            view = eng if i == 0 else dataclasses.replace(eng, arm=arm)
            entry = {**view.describe(), "ready_s": ready_s}
            if log is not None:  # gzipped once the engine stops (compaction.pack_log)
                entry["log"] = f"{log}.gz"
            if i and log is not None:
                copies.append(ctx.store.logs_dir / log_name(arm))
                entry.update(log=f"{copies[-1]}.gz", shared_launch={
                    "study": first.study.name, "arm": arm0.name,
                    "note": "one engine start served both arms (same resolved profile)"})
            ctx.versions[arm.name] = view.version
            ctx.placements[arm.name] = view.placement
            # the model and drafter as the cells' identity holds them: a local folder with
            # its content fingerprint, so a later mismatch can name the folder that changed
            ident = identity.profile_identity(arm.resolved)
            ctx.store.update_session(
                engines=[entry], placement=session_placement(ctx.placements),
                models=[ident["model"]] + ([ident["drafter"]] if arm.resolved.drafter
                                           else []))
            ctx.save()
            run_arm(ctx, view, cells)
            if i + 1 < len(todo) and not eng.alive():
                for ctx_left, arm_left, cells_left in todo[i + 1:]:  # left for a re-run
                    ctx_left.summary.errors.append(
                        f"arm {arm_left.name!r}: the engine it shared with arm {arm.name!r} "
                        f"of {ctx.study.name} died; its cells are left for a re-run")
                    ctx_left.bar.update(len(cells_left))
                break
    finally:
        # the launch's last /metrics, every family whole (the cells keep only what they
        # read): beside its log in the launching study's store (not copied to the studies
        # that rode on it: some 10 KB gzipped a launch), <arm>--<profile>.metrics.txt.gz
        final = eng.scrape() if log is not None and eng.alive() else None
        eng.stop()
        if pinned:
            process.restore(saved, cpus)
        if log is not None and log.is_file():
            text = eng.handle.log_text()
            for path in copies:  # each store keeps the log of every engine its cells ran on
                append_log(path, text)
            pack_log(log)
        if final:
            append_log(metrics_name(log), final)


def metrics_name(log: Path) -> Path:
    """Where a launch's last /metrics text goes beside its log (`.metrics.txt`, gzipped)."""
    return log.with_name(log.name.removesuffix(".log") + ".metrics.txt")


def run_arm(ctx: _Run, eng: ArmEngine, cells: Sequence[Cell]) -> None:
    """The cells of one arm on its running engine; stops at the first dead engine, and
    before a cell that would not end by the deadline (`_AtDeadline`)."""
    summary = ctx.summary
    for cell in cells:
        cid = identity.cell_id(ctx.study, cell, eng.version)
        if cid in ctx.done:
            summary.skipped += 1
            ctx.bar.update(1)
            continue
        if not ctx.fits():
            raise _AtDeadline
        started = time.monotonic()
        key = json.dumps(cell.workload.model_dump(mode="json"), sort_keys=True)
        if key not in ctx.prompts_of:
            ctx.prompts_of[key] = build_workload(cell.workload)
        status = run_cell(ctx, eng, cell, cid, ctx.prompts_of[key])
        setattr(summary, status, getattr(summary, status) + 1)
        if status == "ok":
            ctx.done.add(cid)
        ctx.bar.update(1)
        ctx.save()
        ctx.cell_s.append(time.monotonic() - started)
        if status == "failed" and not eng.alive():
            summary.errors.append(f"arm {eng.arm.name!r}: engine died; its remaining cells "
                                  "are left for a re-run")
            return


def run_cell(ctx: _Run, eng: ArmEngine, cell: Cell, cid: str, prompts: list[Prompt]) -> str:
    """Measure one cell and append its attempt; returns its status. Ctrl-C, or the deadline
    passing, stores it as interrupted (archived too) and propagates."""
    study, store = ctx.study, ctx.store
    warnings = list(ctx.warnings) + list(eng.handle.warnings if eng.handle else [])
    if eng.peer is not None:
        from specrepro.harness.peer import DERIVED_NOTE

        if cell.concurrency > 1:
            warnings.append(PEER_SEQUENTIAL.format(c=cell.concurrency))
        if eng.profile.speculative is not None:
            warnings.append(DERIVED_NOTE)
    cfg = load_config(study, cell, eng, ctx.request_timeout_s)
    started = now()
    sampler = power.PowerSampler(ctx.power_interval_s, pid=eng.pid).start()
    records: list[RequestRecord] = []
    status, error, result = "ok", None, None
    try:
        with ctx.armed():
            if eng.peer is not None:
                result = eng.peer.run(prompts, cfg, records)
            else:
                gen = LoadGenerator(cfg)
                records = gen.records
                result = gen.run(prompts, eng.scrape)
    except KeyboardInterrupt:
        report = sampler.stop()
        result = LoadResult(records, None)
        append(store, study, cell, cid, eng, result, report, prompts, warnings,
               "interrupted", ctx.interrupted_why(), started)
        ctx.summary.interrupted += 1
        ctx.save()
        raise
    except Exception as err:  # noqa: BLE001 - a fault in this cell is recorded, the run goes on
        status, error = "failed", f"{type(err).__name__}: {err}"
        result = LoadResult(records, None)
    report = sampler.stop()
    if report.note and report.note not in warnings:
        warnings.append(report.note)
    if status == "ok" and not eng.alive():
        status, error = "failed", died_message(eng, records)
    elif status == "ok" and records and not any(r.ok for r in records):
        status, error = "failed", f"every request failed; first error: {records[0].error}"
        # on the command line too, not only in the Parquet (tqdm.write keeps the bar whole)
        tqdm.write(f"{study.name}: cell {cid} (arm {cell.arm.name!r}, {cell.workload.name}, "
                   f"{cell.concurrency} streams): {error}", file=sys.stderr)
    append(store, study, cell, cid, eng, result, report, prompts, warnings, status, error,
           started)
    return status


def append(store, study, cell, cid, eng, result, report, prompts, warnings, status, error,
           started) -> None:
    grades = grade(result.records, {p.id: p for p in prompts})
    row = cell_row(study, cell, eng, result, report, warnings)
    row.update(gsm8k_fields(grades))
    row["identical_to_baseline"] = identical_share(result.records,
                                                   baseline_requests(store, study, cell))
    n_err = row["n_errors"]
    if n_err and status == "ok":
        warnings.append(f"{n_err} of {row['n_requests']} requests failed")
    row.update(cell_id=cid, status=status, error=error, started_at=started, ended_at=now(),
               warnings=warnings)
    store.append_cell(row, request_rows(result.records, grades))
