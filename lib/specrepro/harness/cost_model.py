"""Seconds of an engine start and of a cell: measured first, declared priors second.

Design:
- An engine start (`start`) is the median stored `ready_s` of the same profile (by name),
  else of every stored start of the same engine, else the engine's declared prior
  (`plan.engines.<engine>.start`). A lease's first start of a profile (or of the machine,
  as the engine's `first_start.per` says) adds the first-start penalty (`first_start`).
  Stored starts are split by the machine that made them (the session's boot id, else its
  hostname, in the order they ran): a profile's (or the machine's) first start there is a first start, the
  others later ones. `start` reads the later ones; the penalty is the median, over the
  stored first starts, of each less the median of its profile's later starts on that
  machine, else anywhere (a machine that started the profile once), else the engine's
  later starts; else the declared prior. Starts of an unnamed machine count as later.
- A cell (`cell`) is, in this order:
  1. the median wall span of stored ok attempts of the same profile (and draft schedule:
     an arm's overrides change it under the profile's name), workload, level, timing
     (window or requests) and temperature; a requests-mode one scaled by the
     waves (⌈prompts / streams⌉) the planned cell sends against the stored one's;
  2. the median of the same engine's stored attempts at the level and timing: a windowed
     cell's span as stored (the window bounds it, whatever the workload), a
     requests-mode cell's seconds per token of a stream (span over waves × tokens a
     request decoded) times the planned waves × tokens;
  3. the model from the priors (`modeled`): a stream decodes at the engine's aggregate
     tok/s at that level over the streams (one stream: 1000 / `step_ms`; above: `tok_s`,
     interpolated in log2 of the streams, flat past the declared ends), times the
     speculative `speedup` (greedy) or `sampled_speedup` (temperature > 0) where the arm
     drafts at that level (`draft_tokens_at`: a schedule's zero tail does not); a request
     decodes its cap times the workload's `tokens_share`.
     - requests mode: ⌈n / c⌉ waves (warm-up requests too), each a request's tokens at
       a stream's rate;
     - a steady window (params/window.py, harness/steady.py): `skip_s`, then the window:
       at least `window_s`, until every stream has turned over `turnovers` times (the
       slowest stream: its request in flight when the window opens, at worst a whole
       capped one, then `turnovers - 1` average ones of caps spread over `[cap * (1 -
       cap_spread), cap]`), at most `max_window_s`; then the drain: the requests in
       flight finish, at worst a capped one.
  Precisions (FP8, NVFP4 targets) are costed as their profile's engine at BF16 speed: an
  upper bound where a smaller read is faster.
- Every figure says where it came from (`Estimate.source`); `used` collects the priors and
  the measured constants a plan used, for its report. An engine with no prior where
  nothing stored times it is a ParamsError naming the suite file and `plan.engines.<name>`.
- Engine-neutral: priors are looked up by the profile's engine name as data, never
  branched on.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

from specrepro.harness.costs import Stored, StoredCell
from specrepro.params import (
    ByStreams,
    Cell,
    EnginePriors,
    Figure,
    ParamsError,
    Plan,
    Problem,
    Profile,
    ResolvedStudy,
)
from specrepro.workloads import WorkloadSpec


@dataclass(frozen=True)
class Estimate:
    """Seconds, and where the figure comes from (`measured`: read from stores)."""

    s: float
    source: str
    measured: bool = False


def prior_text(key: str, fig: Figure, unit: str = "s") -> str:
    """'prior plan.<key> = 72 s (source) [placeholder]'."""
    mark = " [PLACEHOLDER]" if fig.placeholder else ""
    return f"prior plan.{key} = {fig.value:g} {unit}{mark} ({fig.source})"


def table_text(key: str, table: ByStreams, unit: str) -> str:
    mark = " [PLACEHOLDER]" if table.placeholder else ""
    points = ", ".join(f"{c}: {v:,.4g}" for c, v in sorted(table.by_streams.items()))
    return f"prior plan.{key} = {{{points}}} {unit}{mark} ({table.source})"


def timing_of(study: ResolvedStudy, cell: Cell) -> str:
    """How the runner times the cell: its study's steady window, else every prompt once."""
    return "window" if study.windowed(cell) else "requests"


def schedule_of(profile: Profile) -> str | None:
    """A profile's draft schedule as the cells table stores it (an arm's overrides change
    it under the same profile name: 06's zero tail)."""
    spec = profile.speculative
    sched = spec.num_speculative_tokens_per_batch_size if spec else None
    return json.dumps(sched) if sched else None


def prompts_of(cell: Cell) -> int:
    """The prompts a cell's workload sends (prefill: n per target length)."""
    w = cell.workload
    return w.n * (len(w.prefill_tokens) if w.prefill_tokens else 1)


def waves(n: int, streams: int) -> int:
    return max(1, math.ceil(n / max(streams, 1)))


class CostModel:
    """Seconds of starts and cells for one suite's plan (module docstring)."""

    def __init__(self, plan: Plan | None, stored: Stored, suite_file: str):
        self.plan, self.suite_file = plan, suite_file
        self.used: dict[str, str] = {}  # a constant's label -> where it came from
        self.cells_by: dict[str, int] = defaultdict(int)  # chain level -> cells costed there
        self.starts_by_profile: dict[str, list[float]] = defaultdict(list)
        self.starts_by_engine: dict[str, list[float]] = defaultdict(list)
        self.first_penalties: dict[str, list[float]] = defaultdict(list)
        firsts = self.split_first_starts(stored)
        for s in stored.starts:
            if id(s) not in firsts:
                self.starts_by_profile[s.profile].append(s.ready_s)
                self.starts_by_engine[s.engine].append(s.ready_s)
        for s in stored.starts:  # a first start beside the same profile's later ones there,
            if id(s) not in firsts:  # else beside its later starts elsewhere, else the engine's
                continue             # (a machine that started the profile once: 2026-12-07)
            later = ([o.ready_s for o in stored.starts if id(o) not in firsts
                      and (o.host, o.profile) == (s.host, s.profile)]
                     or self.starts_by_profile.get(s.profile)
                     or self.starts_by_engine.get(s.engine))
            if later:
                self.first_penalties[s.engine].append(s.ready_s - statistics.median(later))
        self.by_level: dict[tuple, list[StoredCell]] = defaultdict(list)
        self.by_engine: dict[tuple, list[StoredCell]] = defaultdict(list)
        for c in stored.ok_measured():
            if c.timing is None:  # stored before cells said how they were timed
                continue
            self.by_level[(c.profile, c.schedule, c.workload, c.concurrency, c.timing,
                           c.temperature)].append(c)
            self.by_engine[(c.engine, c.timing, c.concurrency)].append(c)

    def split_first_starts(self, stored: Stored) -> set[int]:
        """The ids of the stored starts that were a machine's first of their profile (or
        the machine's first, as the engine's `first_start.per` says)."""
        firsts: set[int] = set()
        seen: set[tuple] = set()
        for s in sorted(stored.starts, key=lambda s: (s.session_at, s.launch or 0)):
            if not s.host:
                continue
            pri = self.plan.engines.get(s.engine) if self.plan else None
            per = pri.first_start.per if pri else "profile"
            key = (s.host, s.engine) if per == "machine" else (s.host, s.profile)
            if key not in seen:
                seen.add(key)
                firsts.add(id(s))
        return firsts

    # ------------------------------------------------------------------ priors

    def no_plan(self, what: str) -> ParamsError:
        """The error of a suite without a `plan:` block where a prior is needed."""
        return ParamsError([Problem(self.suite_file, "plan", (
            f"expected a plan: block (params/plan.py: the cost priors and the order) to "
            f"{what}, found none"))])

    def priors(self, engine: str) -> EnginePriors:
        """The engine's declared priors, or a ParamsError naming where they belong."""
        if self.plan is None:
            raise self.no_plan(f"cost engine {engine!r}, which nothing stored times")
        if engine not in self.plan.engines:
            have = ", ".join(sorted(self.plan.engines)) or "none"
            raise ParamsError([Problem(self.suite_file, f"plan.engines.{engine}", (
                f"expected priors for engine {engine!r} (staging, start, first_start, stop, "
                f"step_ms, tok_s, speedup, sampled_speedup) since nothing stored times it, "
                f"found priors for {have} only"))])
        return self.plan.engines[engine]

    def figure(self, label: str, key: str, fig: Figure, unit: str = "s") -> Estimate:
        self.used[label] = prior_text(key, fig, unit)
        return Estimate(fig.value, self.used[label])

    # ------------------------------------------------------------------ starts

    def start(self, profile: Profile) -> Estimate:
        """A start of the profile's engine to ready, without a first start's penalty."""
        label = f"start {profile.name}"
        for pool, what in ((self.starts_by_profile.get(profile.name), f"of {profile.name}"),
                           (self.starts_by_engine.get(profile.engine),
                            f"of engine {profile.engine} (none of {profile.name})")):
            if pool:
                s = statistics.median(pool)
                self.used[label] = (f"measured: median of {len(pool)} stored start(s) "
                                    f"{what}: {s:.0f} s")
                return Estimate(s, self.used[label], True)
        pri = self.priors(profile.engine)
        return self.figure(label, f"engines.{profile.engine}.start", pri.start)

    def first_start(self, engine: str) -> tuple[Estimate, str]:
        """The penalty of a lease's first start, and whether it is per profile or machine."""
        pri = self.priors(engine)
        pool = self.first_penalties.get(engine)
        if pool:
            label = f"first start {engine}"
            s = statistics.median(pool)
            self.used[label] = (f"measured: median of {len(pool)} first start(s) of a "
                                f"profile on a machine less its later starts (there, else "
                                f"anywhere, else the engine's): +{s:.0f} s")
            return Estimate(s, self.used[label], True), pri.first_start.per
        est = self.figure(f"first start {engine}", f"engines.{engine}.first_start",
                          pri.first_start)
        return est, pri.first_start.per

    def stop(self, engine: str) -> Estimate:
        pri = self.priors(engine)
        return self.figure(f"stop {engine}", f"engines.{engine}.stop", pri.stop)

    # ------------------------------------------------------------------- cells

    def cell(self, study: ResolvedStudy, cell: Cell) -> Estimate:
        """A cell's wall span, from the first level of the chain that has it."""
        p = cell.arm.resolved
        timing = timing_of(study, cell)
        temp = cell.sampling.temperature
        same = self.by_level.get((p.name, schedule_of(p), cell.workload.name,
                                  cell.concurrency, timing, temp))
        if same:
            scale = [waves(prompts_of(cell), cell.concurrency)
                     / waves(c.n_prompts or prompts_of(cell), c.concurrency)
                     if timing == "requests" else 1.0 for c in same]
            s = statistics.median(c.seconds * f for c, f in zip(same, scale))
            self.cells_by["measured: same profile, workload, level, timing, temperature"] += 1
            return Estimate(s, f"measured: median of {len(same)} stored attempt(s) of "
                               f"{p.name} ({cell.workload.name}, {cell.concurrency} streams, "
                               f"{timing}, T={temp:g})", True)
        near = self.by_engine.get((p.engine, timing, cell.concurrency))
        if near:
            if timing == "requests":
                want = waves(prompts_of(cell), cell.concurrency) * self.tokens(cell)
                per = [c.seconds / (waves(c.n_prompts, c.concurrency)
                                    * (c.output_tokens / c.n_requests))
                       for c in near if c.n_prompts and c.output_tokens and c.n_requests]
                s = statistics.median(per) * want if per else None
            else:
                s = statistics.median(c.seconds for c in near)
            if s is not None:
                self.cells_by["measured: same engine, level and timing"] += 1
                return Estimate(s, f"measured: median of {len(near)} stored attempt(s) of "
                                   f"engine {p.engine} at {cell.concurrency} streams, "
                                   f"{timing}", True)
        self.cells_by["prior model"] += 1
        return self.modeled(study, cell)

    def tokens(self, cell: Cell) -> float:
        """A request's decoded tokens: its cap times the workload's declared share."""
        cap = WorkloadSpec.of(cell.workload).output_cap
        shares = self.plan.tokens_share if self.plan is not None else {}
        share = shares.get(cell.workload.name)
        if share is None:
            return float(cap)
        self.figure(f"tokens share {cell.workload.name}",
                    f"tokens_share.{cell.workload.name}", share, "of the cap")
        return cap * share.value

    def stream_tok_s(self, profile: Profile, streams: int, temperature: float) -> float:
        """One stream's tok/s at this level under the engine's priors (module docstring)."""
        pri = self.priors(profile.engine)
        e = profile.engine
        self.figure(f"step {e}", f"engines.{e}.step_ms", pri.step_ms, "ms")
        self.used[f"tok/s {e}"] = table_text(f"engines.{e}.tok_s", pri.tok_s, "tok/s")
        table = ByStreams(by_streams={1: pri.one_stream_tok_s(), **pri.tok_s.by_streams},
                          source=pri.tok_s.source)
        rate = table.at(streams) / streams
        spec = profile.speculative
        if spec is not None and spec.draft_tokens_at(streams) > 0:
            key, speed = (("speedup", pri.speedup) if temperature == 0
                          else ("sampled_speedup", pri.sampled_speedup))
            self.used[f"{key} {e}"] = table_text(f"engines.{e}.{key}", speed, "x")
            rate *= speed.at(streams)
        return rate

    def modeled(self, study: ResolvedStudy, cell: Cell) -> Estimate:
        """A cell's seconds from the priors (module docstring, level 3)."""
        p = cell.arm.resolved
        c = cell.concurrency
        rate = self.stream_tok_s(p, c, cell.sampling.temperature)
        tokens = self.tokens(cell)
        full = tokens / rate  # a capped request's seconds at a stream's rate
        warm = waves(study.warmup, c) * full if study.warmup else 0.0
        if not study.windowed(cell):  # every prompt once
            n = waves(prompts_of(cell), c)
            return Estimate(warm + n * full, f"prior model: {n} wave(s) of {tokens:.0f} "
                                             f"tokens at {rate:.1f} tok/s a stream")
        w = study.window
        mean = full * (1 - w.cap_spread / 2)
        needed = full + (w.turnovers - 1) * mean
        span = min(max(needed, w.window_s), w.max_window_s)
        s = warm + w.skip_s + span + full
        return Estimate(s, f"prior model: {w.skip_s:g} s skip + {span:.1f} s window + "
                           f"{full:.1f} s drain at {rate:.1f} tok/s a stream")
