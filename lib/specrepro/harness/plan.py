"""The planner: a suite's cells split into commands that fit one call and leases that fit a
budget, in the order of value, with their estimated device seconds (`specrepro plan`).

Design:
- Steps: the suite's `plan.order` (params/plan.py), each one command line of `specrepro
  run` (notebooks or studies together, `--engine`, `--arm`), then every selected notebook
  it does not name, alone. A step whose arms run on several engines is split into one step
  per engine (`--engine`): a lease stages one engine's bundle.
- A command is simulated as the runner runs it, with the runner's own code where it
  decides: the arms (`launch_plan.chosen_arms`), the launch groups
  (`launch_plan.launch_groups`: one start per resolved profile per round, each study's
  baseline first, A/A twins in groups of their own after every other), restart or side
  by side (`engine_pool.choose_keep`), rounds (repeat r of every group in round r), the
  cells another study of the command measured filed as copies for nothing (the same
  `identity.shared_key`, harness/shared_cells.py), and the deadline: a start only where
  `deadline.start_repays` says it repays, a cell only while the time left exceeds the
  longest cell so far or the declared bound (`--cell-bound-s`), a cell or start longer
  than what is left interrupted (lost). A command that stops at its deadline is run
  again and resumes (exit 75), as `gpu_measure.sh` is.
- A lease is one machine: its fixed costs (`machine_start`, its first engine's
  `staging`, the exports its arms' folders need: an export in a command of its own, or
  before the first measuring command's run, shortening its deadline) and its commands,
  each under `command_s` with `command_reserve_s` after the run's deadline, until
  `lease_s` is spent. A lease's first start of a profile (or of the machine) pays the
  engine's first-start penalty. Steps keep the declared order: a step on another engine
  stages that engine's bundle on the same machine (a staging "command" of its own, the
  exports already written kept) where the lease has room for the staging and at least
  one command that measures a cell, else it opens a new lease.
- Cells already stored (an ok attempt of the same arm, profile, workload, level,
  sampling, repeat and seed: matched by what they declare, not by id, since a local
  folder's content fingerprint is the GPU machine's) are not planned again.
- Seconds come from harness/cost_model.py (measured first, priors second); nothing here
  names an engine.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specrepro import identity
from specrepro.harness.cost_model import CostModel, Estimate
from specrepro.harness.costs import Stored
from specrepro.harness.deadline import start_repays
from specrepro.harness.engine_pool import choose_keep
from specrepro.harness.launch_plan import chosen_arms, launch_groups
from specrepro.params import (
    Cell,
    Export,
    Plan,
    ResolvedArm,
    ResolvedStudy,
    Step,
)


@dataclass
class PlannedCell:
    """A declared cell of a step's study: its id for the plan (`<study>/<cell id>`: two
    studies' cells may share a cell id, as each study's store keys its own), its shared
    key, its cost."""

    study: ResolvedStudy
    cell: Cell
    cid: str
    shared: str
    windowed: bool
    est: Estimate | None  # None: an arm the step does not run (a copy's source only)


class StepStudy:
    """A study of a step as `launch_plan.launch_groups` reads a runner's (`study`,
    `arms()`: the chosen arms, the baseline first, as runner._Run.arms orders them)."""

    def __init__(self, study: ResolvedStudy, chosen: set[str]):
        self.study, self.chosen = study, chosen

    def arms(self) -> list[ResolvedArm]:
        return [a for a in sorted(self.study.arms, key=lambda a: a.name != self.study.baseline)
                if a.name in self.chosen]


@dataclass
class Work:
    """One step made concrete: its studies, arms, launch groups, rounds and cells."""

    step: Step
    engine: str
    ctxs: list[StepStudy]
    groups: list[list[tuple[StepStudy, ResolvedArm]]]
    keep: bool
    rounds: int
    cells: dict[tuple[int, str], list[PlannedCell]]  # (id(ctx), arm) -> its cells
    # every cell of the step's studies, chosen arms or not, in the order SharedCells reads
    # them (study by study, arms as declared): what a command's copies may come from
    sources: list[tuple[StepStudy, PlannedCell]] = field(default_factory=list)
    too_long: list[PlannedCell] = field(default_factory=list)  # longer than any command

    def pending(self, done: set[str]) -> list[PlannedCell]:
        return [pc for cells in self.cells.values() for pc in cells if pc.cid not in done]


@dataclass
class Event:
    """What a command spends its time on: a start, a cell, a copy, a stop, an export."""

    kind: str  # "start", "cell", "overhead" (a cell's), "copy", "stop", "export", "lost"
    notebook: str
    s: float
    what: str = ""
    pc: PlannedCell | None = None
    est: Estimate | None = None


@dataclass
class Command:
    """One call: its line, its deadline, what it runs and its device seconds."""

    work: Work | None
    deadline_s: int
    bound_s: int
    exports: list[Export]
    events: list[Event]
    run_s: float  # the runner's time up to its end or its deadline
    stopped: str  # why the deadline stopped it ("" where it ran to its end): the next resumes
    overhead_s: float
    teardown_s: float
    line: str = ""  # the command line (a measuring command's; an export's are its exports')
    staged: str = ""  # a second engine's bundle staged on the lease's machine (no engine up)
    staged_s: float = 0.0

    @property
    def device_s(self) -> float:
        return (self.overhead_s + sum(e.value for e in self.exports) + self.run_s
                + self.teardown_s + self.staged_s)

    @property
    def progress(self) -> bool:
        return any(e.kind in ("cell", "copy") for e in self.events)


@dataclass
class Lease:
    """One machine: fixed costs and commands, the engines whose bundles it staged in the
    order staged (module docstring)."""

    index: int
    engines: list[str]
    fixed: list[tuple[str, Estimate]]
    commands: list[Command] = field(default_factory=list)
    started: set[str] = field(default_factory=set)  # profile hashes started here
    exported: set[str] = field(default_factory=set)

    @property
    def total_s(self) -> float:
        return sum(e.s for _, e in self.fixed) + sum(c.device_s for c in self.commands)

    @property
    def engine(self) -> str:
        """The engine whose bundle the lease's commands now run on (the last staged)."""
        return self.engines[-1]


@dataclass
class PlanResult:
    """A whole plan: its leases in order, what could not be planned, the cost model."""

    suite: str
    works: list[Work]
    leases: list[Lease]
    costs: CostModel
    stored: dict[str, set[str]]  # notebook -> the cell ids already stored
    unplanned: list[tuple[PlannedCell, str]]  # cells with the reason they are not planned

    @property
    def total_s(self) -> float:
        return sum(lease.total_s for lease in self.leases)


class _Stop(Exception):
    """The simulated runner stops before its deadline; the argument says why."""


# --------------------------------------------------------------------------- steps


def version_of(arm: ResolvedArm) -> str | None:
    """The engine version a plan keys cells by: the profile's declared one."""
    return arm.resolved.engine_version


def steps_for(plan: Plan | None, selected: Sequence[str]) -> list[Step]:
    """The order's steps restricted to the selected notebooks, then the rest alone."""
    out, named = [], set()
    for step in (plan.steps() if plan is not None else []):
        ids = [nb for nb in step.notebooks if nb in selected]
        named.update(ids)
        if ids:
            out.append(step.model_copy(update={"notebooks": ids}))
    return out + [Step(notebooks=[nb]) for nb in selected if nb not in named]


def stored_match(study: ResolvedStudy, stored: Stored) -> set[tuple]:
    """What the study's store holds as ok attempts (a copy filed from another study's cell
    too), by what a cell declares."""
    return {(c.arm, c.profile, c.workload, c.concurrency, c.temperature, c.top_p, c.top_k,
             c.repeat, c.seed) for c in stored.ok_held() if c.study == study.name}


def declared(pc_cell: Cell) -> tuple:
    s = pc_cell.sampling
    return (pc_cell.arm.name, pc_cell.arm.resolved.name, pc_cell.workload.name,
            pc_cell.concurrency, s.temperature, s.top_p, s.top_k, pc_cell.repeat, pc_cell.seed)


def make_works(step: Step, studies: dict[str, ResolvedStudy], costs: CostModel
               ) -> list[Work]:
    """A step's studies and chosen arms, split by engine where they run on several."""
    sts = [studies[nb] for nb in step.notebooks]
    engines = [step.engine] if step.engine else []
    chosen = chosen_arms(sts, step.arms, engines)
    if not step.engine:
        ctxs = [StepStudy(st, names) for st, names in zip(sts, chosen)]
        found: list[str] = []
        for group in launch_groups(ctxs):
            eng = group[0][1].resolved.engine
            if eng not in found:
                found.append(eng)
        if len(found) > 1:
            return [w for eng in found
                    for w in make_works(step.model_copy(update={"engine": eng}), studies, costs)]
        engines = found
    ctxs = [StepStudy(st, names) for st, names in zip(sts, chosen)]
    groups = launch_groups(ctxs)
    keep, _ = choose_keep(sts, [a for ctx in ctxs for a in ctx.arms()])
    cells: dict[tuple[int, str], list[PlannedCell]] = {}
    sources: list[tuple[StepStudy, PlannedCell]] = []
    for ctx in ctxs:
        for arm in ctx.study.arms:
            run = arm.name in ctx.chosen
            v = version_of(arm)
            out = [PlannedCell(ctx.study, cell,
                               f"{ctx.study.name}/{identity.cell_id(ctx.study, cell, v)}",
                               identity.shared_key(ctx.study, cell, v), ctx.study.windowed(cell),
                               costs.cell(ctx.study, cell) if run else None)
                   for cell in ctx.study.cells() if cell.arm.name == arm.name]
            sources += [(ctx, pc) for pc in out]
            if run:
                cells[(id(ctx), arm.name)] = out
    rounds = max((ctx.study.rounds for ctx in ctxs if ctx.chosen), default=0)
    return [Work(step, engines[0] if engines else "", ctxs, groups, keep, rounds, cells,
                 sources)]


def command_line(plan: Plan | None, suite_file: str, suite_name: str, work: Work,
                 deadline_s: int, bound_s: int, env: dict[str, str],
                 exports: Sequence[Export]) -> str:
    """The command a lease runs, copy-pasteable (scripts/gpu_measure.sh)."""
    archive = (plan.archive if plan is not None else "$OUT/{suite}.tar.gz").format(
        suite=suite_name)
    parts = [f"export {k}={v} &&" for k, v in sorted(env.items())]
    parts += [f"{e.command} &&" for e in exports]
    parts += ["bash scripts/gpu_measure.sh", suite_file, str(deadline_s), archive]
    for nb in work.step.notebooks:
        parts += ["--notebook", nb]
    if work.step.engine:
        parts += ["--engine", work.step.engine]
    for arm in work.step.arms:
        parts += ["--arm", arm]
    parts += ["--cell-bound-s", str(bound_s)]
    return " ".join(parts)


# ---------------------------------------------------------------------- simulation


@dataclass
class Progress:
    """The plan's running state: the cells measured, stored before or copied, by id."""

    done: set[str] = field(default_factory=set)

    def mark(self, pc: PlannedCell) -> None:
        self.done.add(pc.cid)


class Simulation:
    """One command of a work item, as runner._run_all and run_group run it (docstring)."""

    def __init__(self, work: Work, progress: Progress, costs: CostModel, lease: Lease,
                 deadline_s: float, bound_s: float, cell_overhead_s: float):
        self.work, self.progress, self.costs, self.lease = work, progress, costs, lease
        self.remaining, self.bound, self.overhead = deadline_s, bound_s, cell_overhead_s
        self.cell_s: list[float] = []
        self.start_s: list[float] = []
        self.live: set[int] = set()
        self.events: list[Event] = []
        # shared key -> the study whose done cell is the source, the first one met, as
        # SharedCells reads the command's stores when it begins and adds what it measures
        self.by_key: dict[str, StepStudy] = {}
        for ctx, pc in work.sources:
            if pc.cid in progress.done:
                self.by_key.setdefault(pc.shared, ctx)

    def fill(self, ctx: StepStudy, cells: Sequence[PlannedCell]) -> int:
        """Copies of the cells another study of the command has measured
        (shared_cells.SharedCells.fill: a source that is the study itself is none)."""
        n = 0
        for pc in cells:
            if pc.cid in self.progress.done:
                continue
            source = self.by_key.get(pc.shared)
            if source is None or source is ctx:
                continue
            self.progress.mark(pc)
            self.events.append(Event("copy", ctx.study.notebook_id, 0.0,
                                     f"from {source.study.notebook_id}", pc=pc))
            n += 1
        return n

    def start(self, ctx: StepStudy, arm: ResolvedArm) -> None:
        profile = arm.resolved
        base = self.costs.start(profile)
        pen, per = self.costs.first_start(profile.engine)
        first = (not self.lease.started if per == "machine"
                 else identity.profile_hash(profile) not in self.lease.started)
        est = Estimate(base.s + pen.s, base.source + (f" + first start {pen.s:g} s"),
                       base.measured) if first else base
        if est.s >= self.remaining:  # the watchdog stops the start: its time is lost
            self.events.append(Event("lost", ctx.study.notebook_id, self.remaining,
                                     f"start of {profile.name} cut by the deadline"))
            self.remaining = 0.0
            raise _Stop("an engine start cut by the deadline")
        self.remaining -= est.s
        self.start_s.append(est.s)
        self.lease.started.add(identity.profile_hash(profile))
        self.events.append(Event("start", ctx.study.notebook_id, est.s,
                                 f"{profile.name} (arm {arm.name})", est=est))

    def run_cell(self, ctx: StepStudy, pc: PlannedCell) -> None:
        if not self.remaining > max([*self.cell_s, self.bound]):
            raise _Stop("the next cell would not end by the deadline")
        t = pc.est.s + self.overhead
        if t > self.remaining:  # interrupted at the deadline: stored as such, lost
            self.events.append(Event("lost", ctx.study.notebook_id, self.remaining,
                                     "cell cut by the deadline", pc=pc))
            self.remaining = 0.0
            raise _Stop("a cell cut by the deadline")
        self.remaining -= t
        self.cell_s.append(t)
        self.progress.mark(pc)
        self.by_key.setdefault(pc.shared, ctx)
        self.events.append(Event("cell", ctx.study.notebook_id, pc.est.s, pc=pc, est=pc.est))
        if self.overhead:
            self.events.append(Event("overhead", ctx.study.notebook_id, self.overhead))

    def group(self, key: int, group: list[tuple[StepStudy, ResolvedArm]], rnd: int) -> None:
        done = self.progress.done
        todo, left, later = [], 0, 0
        for ctx, arm in group:
            mine = self.work.cells[(id(ctx), arm.name)]
            cells = [pc for pc in mine if ctx.study.round_of(pc.cell) == rnd]
            self.fill(ctx, cells)
            pending = sum(pc.cid not in done for pc in cells)
            later += sum(pc.cid not in done for pc in mine if ctx.study.round_of(pc.cell) > rnd)
            if pending:
                todo.append((ctx, arm, cells))
                left += pending
        if not todo:
            return
        if key not in self.live:
            if not start_repays(self.remaining, self.start_s, self.cell_s, self.bound,
                                left + (later if self.work.keep else 0)):
                raise _Stop("the next engine start would not repay (deadline.start_repays)")
            self.start(todo[0][0], todo[0][1])
            self.live.add(key)
        for ctx, _arm, cells in todo:
            for pc in cells:
                if pc.cid in done or self.fill(ctx, [pc]):
                    continue
                self.run_cell(ctx, pc)
        if not self.work.keep:
            self.stop(key, todo[0][0], todo[0][1])

    def stop(self, key: int, ctx: StepStudy, arm: ResolvedArm) -> None:
        s = self.costs.stop(arm.resolved.engine).s
        self.remaining -= s
        self.live.discard(key)
        self.events.append(Event("stop", ctx.study.notebook_id, s, arm.resolved.name))

    def run(self) -> tuple[str, float]:
        """(why the deadline stopped it, "" where it did not; the engines' stop after it, s)."""
        stopped = ""
        try:
            for rnd in range(self.work.rounds):
                for key, group in enumerate(self.work.groups):
                    self.group(key, group, rnd)
        except _Stop as why:
            stopped = str(why)
        teardown = len(self.live) * self.costs.stop(self.work.engine).s if self.live else 0.0
        return stopped, teardown


# --------------------------------------------------------------------------- leases


class Planner:
    """Works → commands → leases (module docstring)."""

    def __init__(self, plan: Plan | None, costs: CostModel, suite_file: str, suite_name: str):
        self.plan, self.costs = plan, costs
        self.suite_file, self.suite_name = suite_file, suite_name
        self.lease_s = plan.lease_s if plan is not None else math.inf
        self.command_s = plan.command_s if plan is not None else 600.0
        self.reserve_s = plan.command_reserve_s if plan is not None else 60.0
        self.leases: list[Lease] = []
        self.progress = Progress()
        self.unplanned: list[tuple[PlannedCell, str]] = []

    def fixed(self, key: str, label: str) -> Estimate:
        if self.plan is None:
            raise self.costs.no_plan(f"cost a lease's {label}")
        return self.costs.figure(label, key, getattr(self.plan, key))

    def new_lease(self, engine: str) -> Lease:
        pri = self.costs.priors(engine)
        fixed = [("machine start", self.fixed("machine_start", "machine start")),
                 (f"{engine} bundle staged", self.costs.figure(
                     f"staging {engine}", f"engines.{engine}.staging", pri.staging))]
        lease = Lease(len(self.leases) + 1, [engine], fixed)
        self.leases.append(lease)
        return lease

    def exports_for(self, work: Work, lease: Lease) -> list[Export]:
        """The exports that the work's arms with cells left read and the lease has not
        written, in order (an arm whose cells are all measured or filed needs none)."""
        if self.plan is None:
            return []
        left = {(pc.study.name, pc.cell.arm.name) for pc in work.pending(self.progress.done)}
        folders = [ref.id for ctx in work.ctxs for a in ctx.arms()
                   if (ctx.study.name, a.name) in left
                   for ref in (a.resolved.model, a.resolved.drafter) if ref is not None]
        return [e for e in self.plan.exports if e.name not in lease.exported
                and any(f == p or f.startswith(p.rstrip("/") + "/")
                        for f in folders for p in e.paths)]

    def overhead(self) -> float:
        return self.fixed("command_overhead", "per command").s if self.plan else 0.0

    def cell_overhead(self) -> float:
        return self.fixed("cell_overhead", "per cell").s if self.plan else 0.0

    def export_command(self, lease: Lease, exports: list[Export]) -> Command:
        for e in exports:
            lease.exported.add(e.name)
            self.costs.figure(f"export {e.name}", f"exports[{e.name}]", e)
        env = self.costs.priors(lease.engine).command_env
        line = " && ".join([*(f"export {k}={v}" for k, v in sorted(env.items())),
                            *(e.command for e in exports)])
        return Command(None, 0, 0, exports, [Event("export", "", e.value, e.name)
                                             for e in exports],
                       0.0, "", self.overhead(), 0.0, line)

    def place(self, work: Work) -> None:
        """The work's commands, on the current lease while it has room, else new ones."""
        limit = self.command_s - self.reserve_s
        co = self.cell_overhead()
        for pc in work.pending(self.progress.done):
            if pc.est.s + co >= limit:
                work.too_long.append(pc)
                self.unplanned.append((pc, (f"estimated {pc.est.s:.0f} s: longer than a "
                                           f"command's {limit:.0f}-s deadline")))
                self.progress.done.add(pc.cid)  # never planned
        todo = work.pending(self.progress.done)
        if not todo:
            return
        bound = math.ceil(max(pc.est.s for pc in todo) + co)
        lease = self.leases[-1] if self.leases else self.new_lease(work.engine)
        if lease.engine != work.engine:
            lease = self.stage_on(lease, work.engine) or self.new_lease(work.engine)
        while work.pending(self.progress.done):
            fresh = not any(c.work is not None for c in lease.commands)
            exports = self.exports_for(work, lease)
            own = [e for e in exports if e.own_command]
            if own:  # in a command of its own, with the inline exports it needs first
                head = exports[:exports.index(own[-1]) + 1]
                cmd = self.export_command(lease, head)
                if lease.total_s + cmd.device_s > self.lease_s and not fresh:
                    lease.exported -= {e.name for e in head}
                    lease = self.new_lease(work.engine)
                    continue
                lease.commands.append(cmd)
                continue
            room = min(self.command_s, self.lease_s - lease.total_s - self.overhead())
            deadline = math.floor(room - self.reserve_s - sum(e.value for e in exports))
            saved = (set(self.progress.done), set(lease.started))
            cmd = self.simulate(work, lease, deadline, bound, exports) if deadline > 0 else None
            if cmd is None or not cmd.progress:
                self.progress.done, lease.started = saved
                if lease.commands and lease.commands[-1].staged == work.engine:
                    lease.commands.pop()  # staged for nothing: the work opens a lease
                    lease.engines.pop()
                    lease = self.new_lease(work.engine)
                    continue
                if fresh:  # not even a whole command on a fresh machine measures a cell
                    for pc in work.pending(self.progress.done):
                        self.unplanned.append((pc, ("its engine start and first cell do not "
                                                   "fit one command's deadline")))
                        self.progress.done.add(pc.cid)
                    return
                lease = self.new_lease(work.engine)
                continue
            lease.exported.update(e.name for e in exports)
            for e in exports:
                self.costs.figure(f"export {e.name}", f"exports[{e.name}]", e)
            lease.commands.append(cmd)

    def stage_on(self, lease: Lease, engine: str) -> Lease | None:
        """The lease with the engine's bundle staged on its machine, where the staging and a
        command's overhead and reserve fit what it has left; None where they do not."""
        pri = self.costs.priors(engine)
        est = self.costs.figure(f"staging {engine}", f"engines.{engine}.staging", pri.staging)
        if lease.total_s + est.s + self.overhead() + self.reserve_s >= self.lease_s:
            return None
        lease.engines.append(engine)
        lease.commands.append(Command(None, 0, 0, [], [], 0.0, "", 0.0, 0.0,
                                      f"the {engine} bundle's parts, staged as in "
                                      f"docs/gpu-box.md", staged=engine, staged_s=est.s))
        return lease

    def simulate(self, work: Work, lease: Lease, deadline: int, bound: int,
                 exports: list[Export]) -> Command:
        """One command on the lease, as the runner would run it (Simulation); it marks
        the progress and the lease's starts, which the caller undoes if it drops it."""
        sim = Simulation(work, self.progress, self.costs, lease, deadline, bound,
                         self.cell_overhead())
        stopped, teardown = sim.run()
        env = self.costs.priors(work.engine).command_env
        line = command_line(self.plan, self.suite_file, self.suite_name, work, deadline,
                            bound, env, exports)
        return Command(work, deadline, bound, exports, sim.events,
                       max(0.0, deadline - sim.remaining), stopped, self.overhead(), teardown,
                       line)


def make_plan(plan: Plan | None, studies: dict[str, ResolvedStudy], selected: Sequence[str],
              stored: Stored, costs: CostModel, suite_file: str, suite_name: str) -> PlanResult:
    """The plan of the selected notebooks (module docstring)."""
    planner = Planner(plan, costs, suite_file, suite_name)
    stored_ids: dict[str, set[str]] = defaultdict(set)
    works = [w for step in steps_for(plan, selected) for w in make_works(step, studies, costs)]
    have = {name: stored_match(st, stored) for name, st in
            {st.name: st for st in studies.values()}.items()}
    for w in works:  # cells already stored are done (and sources of copies) from the start
        for _, pc in w.sources:
            if declared(pc.cell) in have.get(pc.study.name, set()):
                planner.progress.mark(pc)
                stored_ids[pc.study.notebook_id].add(pc.cid)
    for w in works:
        planner.place(w)
    return PlanResult(suite_name, works, planner.leases, costs, dict(stored_ids),
                      planner.unplanned)


def display(path: Path | str) -> str:
    """A path as the plan prints it: relative to the working directory where it is under it."""
    p = Path(path).resolve()
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(p)
