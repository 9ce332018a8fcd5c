"""How busy a device was while an arm ran, and the substrate line every report opens with.

Design:
- The articles' findings about speed are about a decode step that reads a 27B model's
  weights: the GPU is busy for nearly all of it. A target of 22 MB leaves an H200 95-98 %
  idle (docs/bench/profile-h200-*), so its step, throughput and joules measure the engine's
  host code. Such a check is "not testable here: ... host-bound (GPU n % busy)", never "does
  not hold": analysis/verdict/mechanism.py applies the rule, on every side of a check, at its level,
  as part of the weight-read precondition; a GPU arm with no busy figure is not testable.
- On a CPU the figure is the engine's CPU seconds over wall time, which counts Python host
  work as busy: it is shown, never read as the mechanism (the step cost decides there).
- How busy an arm's device was, by precedence:
  1. the mean `busy_share` of the arm's cells at the check's level (every level when the
     check names none): recorded per cell since 2026-12-04 (harness/power.py: NVML
     utilization on a GPU, the engine's CPU share on the CPU);
  2. the suite's `substrate.busy` for the arm's engine: a profile of one decode window,
     with the file that measured it (params/substrate.py); the figure says it is that one
     profile standing in for this arm and level, never the arm's own;
  3. unknown: the rule does not apply, and the substrate line says it was not measured.
- `THRESHOLD`: mechanisms.yaml's `weight_read_step.min_busy` (0.70). The stand-in's engines
  run at 93-100 % at one stream and the small target's at 2-40 %, so no measured arm sits
  near it.
- Only throughput, step time, power and energy are host-bound (`SPEED_METRICS`): tokens per
  step, accuracy and memory capacity do not depend on how busy the device was.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from specrepro.analysis.finding.finding import Finding, devices
from specrepro.analysis.verdict.mechanism import mechanisms, precondition_line
from specrepro.params.engine_kinds import KINDS, WORDS

THRESHOLD = float(mechanisms()["weight_read_step"]["min_busy"])
SPEED_METRICS = frozenset({"agg_tok_s", "per_stream_tok_s", "agg_tok_s_change_pct", "step_ms",
                           "tokens_per_joule", "power_w_mean", "energy_j"})


@dataclass(frozen=True)
class Busy:
    share: float  # 0-1
    device: str   # "GPU" | "CPU"
    where: str    # how it was measured

    def text(self) -> str:
        return f"{self.device} {self.share:.0%} busy ({self.where})"


def _engine(f: Finding, arm: str) -> str | None:
    for a in f.study.arms:
        if a.name == arm:
            p = a.resolved
            return p.attached_engine if KINDS[p.engine].attaches else p.engine
    return None


def busy(f: Finding, arm: str, level: int | None = None) -> Busy | None:
    """How busy the device was while `arm` ran (at `level` streams, else over its cells)."""
    cells = f.cells.filter(pl.col("arm") == arm) if "arm" in f.cells.columns else f.cells
    if level is not None and "concurrency" in cells.columns:
        cells = cells.filter(pl.col("concurrency") == level)
    if "busy_share" in cells.columns:
        got = cells.filter(pl.col("busy_share").is_not_null())
        if got.height:
            cpu = "engine_cpu_time" in set(got["busy_source"].drop_nulls().to_list())
            where = (f"{'the engine CPU share' if cpu else 'NVML utilization'} over "
                     f"{got.height} cell{'s' if got.height != 1 else ''}")
            return Busy(float(got["busy_share"].mean()), "CPU" if cpu else "GPU", where)
    sub = f.suite.substrate
    engine = _engine(f, arm)
    if sub is not None and engine in sub.busy:
        b = sub.busy[engine]
        device = "GPU" if "cuda" in devices(f.study, [arm]) else "CPU"
        at = f" at {level} stream{'s' if level != 1 else ''}" if level is not None else ""
        return Busy(b.share, device, (
            f"profiled: no figure of its own for {arm!r}{at}; the suite's one profile of "
            f"{b.at or 'one window'} ({b.source}) stands in"))
    return None


def host_bound_arms(f: Finding) -> list[tuple[str, Busy]]:
    """The study's GPU arms whose device was below the threshold, with how busy (a CPU's
    share counts host work as busy and is not read so)."""
    out = []
    for a in f.study.arms:
        b = busy(f, a.name)
        if b is not None and b.device == "GPU" and b.share < THRESHOLD:
            out.append((a.name, b))
    return out


def substrate_line(f: Finding, floor: str = "") -> str:
    """One line: what the numbers are measured on and how busy its device was. `floor` is the
    step-cost floor sentence (analysis/step_cost/suite.py `floor_line`: the bytes a step reads
    over the card's bandwidth), which the summary passes in: the verdict sits below the
    step-cost model, so it does not compute it."""
    sub = f.suite.substrate
    head = sub.summary.strip() if sub is not None else (
        f"suite {f.suite.name!r} states no substrate (params file `substrate:`)")
    seen: dict[str, Busy] = {}
    for a in f.study.arms:
        b = busy(f, a.name)
        engine = WORDS.get(_engine(f, a.name) or "", a.name)
        if b is not None and engine not in seen:
            seen[engine] = b
    gpu = {e: b for e, b in seen.items() if b.device == "GPU"}
    cpu = {e: b for e, b in seen.items() if b.device != "GPU"}
    tail = ""
    if gpu:
        parts = "; ".join(f"{e}: {b.text()}" for e, b in gpu.items())
        verdict = ("speed, step and energy checks are not testable here (host-bound)"
                   if any(b.share < THRESHOLD for b in gpu.values()) else
                   f"at least {THRESHOLD:.0%} busy, as the weight-read step needs")
        tail += f" Busy share: {parts}; {verdict}."
    if cpu:
        parts = "; ".join(f"{e}: {b.text()}" for e, b in cpu.items())
        tail += (f" CPU share: {parts}; it counts the engine's Python host work as busy, so it "
                 "is not read as the mechanism here: the step cost below decides.")
    if not seen:
        tail = " Busy share: not measured for these cells."
    pre = precondition_line(f)
    return (head.rstrip(".") + "." + (f" {floor}" if floor else "") + tail
            + (f" {pre}" if pre else ""))
