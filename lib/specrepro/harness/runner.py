"""A study → cells and requests in the results store (the command line is run_command.py).

Design:
- `run_studies([(study, store), ...])` walks the studies' cells in rounds, engine by
  engine: the arms of all the studies are grouped by the engine they need (`launch_groups`,
  launch_plan.py: one group per resolved profile and placement policy, each study's
  baseline arm first, so the others can be compared with it). Round r measures repeat r of
  every group's arms in that order, so a study's repeats run A B C, A B C, never back to
  back (`run_group`); a group's engine is launched through its adapter (or attached to, or
  the in-process transformers peer loaded) when the group first has cells in a round, and
  either stopped after them (restart: every repeat a fresh start) or kept up side by side
  until the run ends (engine_pool.py; the studies' `interleave`). Per cell (workload ×
  concurrency × sampling × repeat): skip it if the store has an `ok` attempt (resume, so
  a re-run after an interruption measures each missing cell once, in the same order),
  scrape `/metrics` at the measured span's edges (inside the load generator, after
  warm-up; a study's `window:` cells over a steady window, harness/steady.py), sample
  power and memory, and append one attempt with its requests and its place in the order
  (`round`, `sequence`: its position among the command's measured cells, `launch`: the
  engine start that served it). Each study keeps its own session; one that ran on another study's engine
  start says so in its engine entry (`shared_launch`) and keeps its own copy of that
  launch's log. A cell another study of the command has measured (same resolved profile,
  workload, level, sampling, repeat and seed) is not measured again: its attempt is filed
  under this study too, `shared_from` naming the one measured (shared_cells.py). The
  row's figures come from `cells.py` (which takes each formula from
  `metrics.py`); nothing is computed here. `run_study` is the one-study case.
- Cell identity (`specrepro.identity.cell_id`) includes the engine version, known only once
  the engine answers. To skip an arm whose cells are all done without launching it, the
  version an earlier session recorded in the manifest for the same arm and profile hash is
  tried first.
- Faults: a cell whose engine dies is appended as `failed` with the first request error
  and the engine log's tail, the arm's remaining cells (this round's and later ones') are
  left for a re-run, and the run goes on with the next arm. `/metrics` missing or counters that do not match what the
  client saw are warnings of the cell (`cells.py`). Ctrl-C records the current
  cell as `interrupted` with the requests that ended, stops the engine and ends the
  session as interrupted; a second run resumes. SIGTERM and SIGHUP take the same path
  (`lifecycle.stop_signals`; the summary names the signal); SIGKILL leaves the engine to
  its watchdog, and a stale engine to the next run (lifecycle.py, pid files in
  `<results_dir>/.engines/`).
- CPU placement (the study's `placement`, `cpu_placement.plan_placement`): per arm, a launched
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
  (`store.ResultStore.end_session`).
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
  up to 2 x `engine_handle.STOP_GRACE_S`; merge; archive) follows the deadline: leave room for it.
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
from specrepro.harness import cpu_placement, lifecycle, power
from specrepro.harness.archive import Archive
from specrepro.harness.arm_engine import (
    ArmEngine,
    known_version,
    log_name,
    placement_for,
    session_placement,
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
    Deadline,
    ctrl_c_raises,
    start_repays,
)
from specrepro.harness.engine_pool import EnginePool, Launch, choose_keep
from specrepro.harness.engines.base import EngineError
from specrepro.harness.launch_plan import (  # noqa: F401 (check_arms: the commands' API)
    check_arms,
    chosen_arms,
    launch_groups,
)
from specrepro.harness.loadgen import LoadConfig, LoadGenerator
from specrepro.harness.records import LoadResult, RequestRecord
from specrepro.harness.shared_cells import SharedCells
from specrepro.params import (
    Cell,
    ParamsError,
    ResolvedArm,
    ResolvedStudy,
)
from specrepro.store import ResultStore, now, pack_log
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
    shared: int = 0  # filed from another study's measurement of the same cell (shared_cells.py)
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
        model=p.model.served_name or p.model.id, concurrency=cell.concurrency,
        steady=study.window if study.windowed(cell) else None,
        warmup=study.warmup, temperature=cell.sampling.temperature,
        top_p=cell.sampling.top_p, top_k=cell.sampling.top_k, seed=cell.seed,
        ignore_eos=study.ignore_eos, thinking=study.thinking,
        reasoning_effort=study.reasoning_effort,
        features=eng.adapter.request_features,
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
    placements: dict[str, cpu_placement.Placement] = field(default_factory=dict)
    # where the cell being measured stands: its round (A B C, A B C), its position among
    # the command's measured cells (the one counter every study shares), its engine start
    round: int = 0
    sequence: list[int] = field(default_factory=lambda: [0])
    launch: int | None = None
    shared: SharedCells | None = None  # the command's cells measured once for several studies
    # {local folder: fingerprint} the store's sessions recorded, standing in for a folder
    # absent here: a fresh machine without the NVFP4 export still knows its cells are done
    recorded: dict[str, str] = field(default_factory=dict)

    def cid(self, cell: Cell, version: str | None) -> str:
        return identity.cell_id(self.study, cell, version, self.recorded)

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
    sequence = [0]  # one counter for every study of the command
    ctxs = [_Run(study, store, bar, power_interval_s, request_timeout_s,
                 [IGNORE_EOS_WARNING] if study.ignore_eos else [],
                 set() if fresh else store.completed_cell_ids(), deadline, archive, names,
                 cell_s, start_s, sequence=sequence,
                 recorded=identity.recorded_fingerprints(store.manifest()))
            for (study, store), names in zip(plans, chosen)]
    with ctrl_c_raises(), lifecycle.stop_signals():
        _run_all(ctxs, Path(root), command)
    return [ctx.summary for ctx in ctxs]


def _run_all(ctxs: Sequence[_Run], root: Path, command: list[str] | None) -> None:
    cpus = cpu_placement.allowed_cpus()  # before any pinning: what the machine gives this process
    keep, note = choose_keep([ctx.study for ctx in ctxs], [a for ctx in ctxs for a in ctx.arms()])
    for ctx in ctxs:
        ctx.store.begin_session({
            "params": ctx.study.model_dump(mode="json"), "command": command,
            "power_note": power.nvml_note(), "warnings": ctx.warnings,
            "placement": session_placement(ctx.placements),
            "interleave": {"side_by_side": keep, "note": note},
            "deadline": ctx.deadline.record() if ctx.deadline else None,
            "arms_run": sorted(ctx.chosen) if len(ctx.chosen) < len(ctx.study.arms) else None})
        if ctx.archive is not None:
            ctx.archive.add(ctx.store)
    shared = SharedCells(ctxs)
    for ctx in ctxs:
        ctx.shared = shared
    ctxs[0].save()
    stopped = None
    pool = EnginePool(keep)
    try:  # round r: repeat r of every arm, group by group (A B C, A B C)
        groups = launch_groups(ctxs)
        for rnd in range(max(ctx.study.rounds for ctx in ctxs)):
            for key, group in enumerate(groups):
                run_group(group, root, cpus, pool, key, rnd)
    except _AtDeadline:
        stopped = "deadline"
    except KeyboardInterrupt:
        deadline = ctxs[0].deadline
        stopped = "deadline" if deadline and deadline.fired else "ctrl-c"
    finally:
        with lifecycle.shielded():  # the engines are stopped: a stop signal now ends nothing
            pool.stop_all()  # those kept side by side
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
                           and ctx.cid(c, versions[c.arm.name]) not in ctx.done)
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
              cpus: tuple[int, ...] | None, pool: EnginePool, key: int, rnd: int) -> None:
    """A launch group's cells of round `rnd`: its engine started if it is not up and any
    of its arms has such a cell left, each arm's cells in turn, then the engine released
    (stopped unless the pool keeps engines side by side: engine_pool.py). A study other
    than the launching one gets its own copy of the launch's log and an engine entry that
    says whose launch it shared."""
    todo, left, later = [], 0, 0  # left: the round's cells not yet measured; later: after it
    live = pool.get(key)
    for ctx, arm in group:
        version = live.eng.version if live is not None else known_version(ctx.store, arm)
        ctx.versions[arm.name] = version
        cells = [c for c in ctx.cells_of(arm) if ctx.study.round_of(c) == rnd]
        copied = 0
        if ctx.shared is not None:  # another study measured them: filed, no engine needed
            copied = ctx.shared.fill(ctx, arm, cells, version)
            ctx.summary.shared += copied
        pending = sum(ctx.cid(c, version) not in ctx.done for c in cells)
        later += sum(ctx.cid(c, version) not in ctx.done
                     for c in ctx.cells_of(arm) if ctx.study.round_of(c) > rnd)
        if not pending or key in pool.dead:  # dead: left for a re-run, said once already
            ctx.summary.skipped += len(cells) - copied if not pending else 0
            ctx.bar.update(len(cells))
        else:
            todo.append((ctx, arm, cells))
            left += pending
    if not todo:
        return
    if live is None:
        live = start_group(todo, root, cpus, pool, key, left + (later if pool.keep else 0))
        if live is None:
            return
    eng = live.eng
    pinned = eng.placement is not None and eng.placement.pinned
    saved: dict[int, set[int]] = {}
    try:
        if pinned:  # the load generator off the engine's CPUs for the arm's cells
            saved = cpu_placement.pin_process(eng.placement.client_cpus)
        for i, (ctx, arm, cells) in enumerate(todo):
            view = eng if arm is eng.arm else dataclasses.replace(eng, arm=arm)
            announce(ctx, arm, view, live)
            ctx.round, ctx.launch = rnd, live.index
            run_arm(ctx, view, cells)
            if not eng.alive():
                pool.dead.add(key)
                for ctx_left, arm_left, cells_left in todo[i + 1:]:  # left for a re-run
                    ctx_left.summary.errors.append(
                        f"arm {arm_left.name!r}: the engine it shared with arm {arm.name!r} "
                        f"of {ctx.study.name} died; its cells are left for a re-run")
                    ctx_left.bar.update(len(cells_left))
                break
    finally:
        if pinned:
            cpu_placement.restore(saved, cpus)
        pool.release(key)


def start_group(todo, root: Path, cpus, pool: EnginePool, key: int, serves: int
                ) -> Launch | None:
    """The group's engine started for its first arm with cells (`serves`: the cells the
    start serves, for the deadline); None, with each arm's error recorded and the group
    dead for the run, where it fails to start."""
    first, arm0, _ = todo[0]
    if not first.start_fits(serves):
        raise _AtDeadline
    started = time.monotonic()
    try:
        with first.armed():
            live = pool.start(key, arm0, first.store.logs_dir, root,
                              placement_for(arm0, first.study.placement, cpus),
                              lifecycle.engines_dir(first.store.root.parent.parent))
    except (EngineError, ParamsError, RuntimeError, OSError) as err:
        pool.dead.add(key)
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
        return None
    first.start_s.append(time.monotonic() - started)
    # start to ready as this process saw it, for an engine it launched (the engine's own
    # log times the parts)
    live.ready_s = round(first.start_s[-1], 1) if live.log is not None else None
    live.study = first.study.name
    return live


def announce(ctx: _Run, arm: ResolvedArm, view: ArmEngine, live: Launch) -> None:
    """The arm's engine entry in its session's manifest, once per launch: a study other
    than the launching arm's gets a copy of the launch's log (gzipped when it stops)."""
    if (id(ctx), arm.name) in live.announced:
        return
    log = live.log
    entry = {**view.describe(), "ready_s": live.ready_s, "launch": live.index}
    if log is not None:  # gzipped once the engine stops (compaction.pack_log)
        entry["log"] = f"{log}.gz"
    launcher = live.eng.arm
    if arm is not launcher and log is not None:
        live.copies.append(ctx.store.logs_dir / log_name(arm))
        entry.update(log=f"{live.copies[-1]}.gz", shared_launch={
            "study": live.study, "arm": launcher.name,
            "note": "one engine start served both arms (same resolved profile)"})
    live.announced.add((id(ctx), arm.name))
    ctx.versions[arm.name] = view.version
    ctx.placements[arm.name] = view.placement
    # the model and drafter as the cells' identity holds them: a local folder with its
    # content fingerprint, so a later mismatch can name the folder that changed
    ident = identity.profile_identity(arm.resolved)
    ctx.store.update_session(
        engines=[entry], placement=session_placement(ctx.placements),
        models=[ident["model"]] + ([ident["drafter"]] if arm.resolved.drafter else []))
    ctx.save()


def run_arm(ctx: _Run, eng: ArmEngine, cells: Sequence[Cell]) -> None:
    """The cells of one arm on its running engine; stops at the first dead engine, and
    before a cell that would not end by the deadline (`_AtDeadline`)."""
    summary = ctx.summary
    for cell in cells:
        cid = ctx.cid(cell, eng.version)
        if cid in ctx.done:
            if ctx.shared is None or cid not in ctx.shared.filed:  # filed: counted as shared
                summary.skipped += 1
            ctx.bar.update(1)
            continue
        if ctx.shared is not None and ctx.shared.fill(ctx, eng.arm, [cell], eng.version):
            summary.shared += 1  # measured a moment ago for another study of the command
            ctx.bar.update(1)
            ctx.save()
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
            if ctx.shared is not None:
                ctx.shared.add(ctx, cell, cid, eng.version)
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
    order = {"round": ctx.round, "sequence": ctx.sequence[0], "launch": ctx.launch}
    ctx.sequence[0] += 1
    warnings = list(ctx.warnings) + list(eng.handle.warnings if eng.handle else [])
    if eng.peer is not None:
        from specrepro.harness.transformers_peer import DERIVED_NOTE

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
               "interrupted", ctx.interrupted_why(), started, order)
        ctx.summary.interrupted += 1
        ctx.save()
        raise
    except Exception as err:  # noqa: BLE001 - a fault in this cell is recorded, the run goes on
        status, error = "failed", f"{type(err).__name__}: {err}"
        result = LoadResult(records, None)
    # energy and mean power over the span the tokens are counted over (power.py)
    report = sampler.stop(span=result.span if result is not None else None)
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
           started, order)
    return status


def append(store, study, cell, cid, eng, result, report, prompts, warnings, status, error,
           started, order) -> None:
    grades = grade(result.records, {p.id: p for p in prompts})
    row = cell_row(study, cell, eng, result, report, warnings)
    row.update(gsm8k_fields(grades))
    row["identical_to_baseline"] = identical_share(result.records,
                                                   baseline_requests(store, study, cell))
    n_err = row["n_errors"]
    if n_err and status == "ok":
        warnings.append(f"{n_err} of {row['n_requests']} requests failed")
    row.update(cell_id=cid, status=status, error=error, started_at=started, ended_at=now(),
               warnings=warnings, **order)
    store.append_cell(row, request_rows(result.records, grades))
