"""The step-cost model: a decode step's time from the bytes it reads and the math it does.

Not the GPU-lease planner (harness/cost_model.py and costs.py price machine time for
`specrepro plan`); this prices one decode step on a card, so a finding measured on one card
can be carried to another.

Design:
- A step is a sequence of passes (`passes`): the target's verify pass over every running
  request's 1 + k positions, then the drafter's: a `block` drafter (DFlash) one pass over the
  same 1 + k positions, a `chain` drafter (an MTP or EAGLE head, a draft model) k passes of
  one position each. A pass reads its weights once and each request's KV cache (context
  tokens x KV bytes a token) and does 2 FLOPs a parameter a token in its precision.
- A pass costs bytes / bandwidth plus FLOPs / peak (`Step`): memory and math are added, not
  overlapped. The data decide that: on the stand-in's stored cells the sum misses by a median
  of 4.3 % over 1-32 streams and 38 % beyond, the max by 6.3 % and 86 %
  (docs/bench/step-cost-2026-12-07.md); the GEMMs alone are max-like, the served step is
  not. `combine="max"` keeps the other bound for that comparison.
- Bandwidth and peak are the card's measured GEMM figures where measured, else the rated
  ones (`step_cost_data.Card`); the floor (`floor_ms`) is stated against both.
- Two overheads a step, fitted per engine from stored cells with the cells cited
  (`Overheads`; check.py fits them): a fixed one (host and launch work a plain step
  pays beyond its bytes) and a speculative one (what a step with drafts pays beyond the
  drafter's bytes: sampling, rejection, the drafter's launches). A step with k = 0 drafts (a
  schedule's zero tier) is priced as plain decoding.
- Tokens a step come from acceptance, never from the model: the measured acceptance length,
  or 1 + the sum of per-position acceptance rates (`tokens_per_step`); tok/s is running
  requests x tokens a step / step time, with requests past the engine's slots queued
  (`running`).
- The ridge (`ridge_tokens`) is the tokens a step at which a target's math time equals its
  weight read on a card: a level's tokens a step over it say how far into the compute-bound
  regime a level is, so levels compare across cards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from specrepro.analysis.step_cost.data import GB, Card, Model

Combine = Literal["sum", "max"]


@dataclass(frozen=True)
class Pass:
    """One pass of a step: bytes read and FLOPs by precision."""

    name: str
    bytes: float
    flops: dict[str, float] = field(default_factory=dict)
    weight_bytes: float = 0.0  # the part of `bytes` that is weights (the rest is KV)


@dataclass(frozen=True)
class Overheads:
    """A step's fixed and speculative overheads (ms) and the cells each was fitted on."""

    fixed_ms: float = 0.0
    speculative_ms: float = 0.0
    fixed_source: str = "not fitted"
    speculative_source: str = "not fitted"


@dataclass(frozen=True)
class Step:
    passes: tuple[Pass, ...]
    memory_ms: float
    math_ms: float
    overhead_ms: float
    combine: Combine = "sum"
    per_pass: tuple[tuple[float, float], ...] = ()  # (memory ms, math ms) a pass

    @property
    def total_ms(self) -> float:
        if self.combine == "max":
            return sum(max(m, c) for m, c in self.per_pass) + self.overhead_ms
        return self.memory_ms + self.math_ms + self.overhead_ms

    @property
    def bound(self) -> str:
        """'compute' where the step's math takes longer than its reads, else 'memory'."""
        return "compute" if self.math_ms > self.memory_ms else "memory"

    @property
    def bytes(self) -> float:
        return sum(p.bytes for p in self.passes)

    @property
    def flops(self) -> float:
        return sum(sum(p.flops.values()) for p in self.passes)


def passes(target: Model, drafter: Model | None, k: int, running: int,
           context_tokens: float) -> tuple[Pass, ...]:
    """A step's passes at `running` requests with k drafts each (k = 0 or no drafter: plain
    decoding), each request holding `context_tokens` in its caches."""
    if running < 1 or k < 0 or context_tokens < 0:
        raise ValueError(f"expected running >= 1, k >= 0, context >= 0; found {running}, {k}, "
                         f"{context_tokens}")
    k = k if drafter is not None else 0
    positions = running * (1 + k)
    verify = Pass("target" if k == 0 else "target verify",
                  target.weights.n_bytes + running * context_tokens * target.kv_bytes,
                  {p: v.value * 1e9 * positions for p, v in target.gflop_per_token.items()},
                  target.weights.n_bytes)
    if k == 0:
        return (verify,)
    kv = running * context_tokens * drafter.kv_bytes
    if drafter.drafts == "block":
        return verify, Pass("drafter (one block pass)", drafter.weights.n_bytes + kv,
                            {p: v.value * 1e9 * positions for p, v in drafter.gflop_per_token.items()},
                            drafter.weights.n_bytes)
    return (verify, *(Pass(f"drafter pass {i + 1} of {k}", drafter.weights.n_bytes + kv,
                           {p: v.value * 1e9 * running for p, v in drafter.gflop_per_token.items()},
                           drafter.weights.n_bytes) for i in range(k)))


NO_OVERHEAD = Overheads()


def step(card: Card, parts: tuple[Pass, ...], overheads: Overheads = NO_OVERHEAD,
         combine: Combine = "sum") -> Step:
    """The step's time on `card`: each pass's bytes / bandwidth and FLOPs / peak, plus the
    fixed overhead, plus the speculative one where the step drafts (more than one pass)."""
    bw = card.bandwidth_gb_s * GB  # bytes a second
    per = []
    for p in parts:
        mem = p.bytes / bw * 1e3
        math = sum(f / (card.peak(prec)[0] * 1e12) for prec, f in p.flops.items()) * 1e3
        per.append((mem, math))
    over = overheads.fixed_ms + (overheads.speculative_ms if len(parts) > 1 else 0.0)
    return Step(tuple(parts), sum(m for m, _ in per), sum(c for _, c in per), over, combine,
                tuple(per))


def running(streams: int, slots: int | None) -> int:
    """Requests decoding at once: the streams, or the engine's request slots where fewer (the
    rest wait in its queue and add nothing to a step)."""
    return min(streams, slots) if slots else streams


def tokens_per_step(acceptance_length: float | None = None,
                    per_position: list[float] | None = None, k: int | None = None) -> float:
    """Tokens a step yields: the acceptance length, else 1 + the per-position acceptance
    rates (fractions) of the first k positions; plain decoding (k = 0) yields 1."""
    if k == 0:
        return 1.0
    if acceptance_length is not None:
        if acceptance_length < 1:
            raise ValueError(f"an acceptance length is at least 1, found {acceptance_length}")
        return acceptance_length
    if per_position:
        rates = per_position[:k] if k else per_position
        if any(not 0 <= r <= 1 for r in rates):
            raise ValueError(f"per-position rates are fractions in [0, 1], found {rates}")
        return 1.0 + sum(rates)
    raise ValueError("no acceptance: give an acceptance length or per-position rates")


def tok_s(running_requests: int, tokens: float, step_ms: float) -> float:
    return running_requests * tokens / step_ms * 1e3


def floor_ms(card: Card, n_bytes: float) -> dict[str, float | None]:
    """The bandwidth floor of reading `n_bytes` (bytes, decimal): against the rated and the
    measured bandwidth (None where the card has no such figure)."""
    out: dict[str, float | None] = {}
    for kind, got in (("rated", card.rated_bandwidth_gb_s), ("measured", card.measured_bandwidth_gb_s)):
        out[kind] = n_bytes / (got.value * GB) * 1e3 if got.value is not None else None
    return out


def ridge_tokens(card: Card, target: Model) -> float:
    """Tokens a step at which the target's math time equals its weight read on `card`."""
    read_s = target.weights.n_bytes / (card.bandwidth_gb_s * GB)
    math_s_per_token = sum(v.value * 1e9 / (card.peak(p)[0] * 1e12)
                           for p, v in target.gflop_per_token.items())
    return read_s / math_s_per_token


@dataclass(frozen=True)
class Arm:
    """What one side of a comparison runs: a drafter (None: plain decoding), its drafts a
    request, the tokens a step it yields, and the engine's request slots."""

    drafter: Model | None = None
    k: int = 0
    tokens: float = 1.0
    slots: int | None = None


def arm_tok_s(card: Card, target: Model, arm: Arm, streams: int, overheads: Overheads,
              context_tokens: float) -> float:
    r = running(streams, arm.slots)
    st = step(card, passes(target, arm.drafter, arm.k, r, context_tokens), overheads)
    return tok_s(r, arm.tokens if arm.k else 1.0, st.total_ms)


def crossing(levels: list[float], ratios: list[float]) -> float | None:
    """The level above which a ratio stays at or below 1, interpolated between the last level
    above 1 and the next: None where it never drops to 1 (or never leads)."""
    pairs = sorted(zip(levels, ratios, strict=True))
    above = [i for i, (_, r) in enumerate(pairs) if r > 1]
    if not above or above[-1] == len(pairs) - 1:
        return None
    (c0, r0), (c1, r1) = pairs[above[-1]], pairs[above[-1] + 1]
    return c0 + (r0 - 1) / (r0 - r1) * (c1 - c0)


def crossover(card: Card, target: Model, a: Arm, b: Arm, overheads: Overheads,
              context_tokens: float, max_streams: int = 4096) -> float | None:
    """The streams at which arm `a` stops beating arm `b` in tok/s on the model, interpolated
    between the integer levels around it; None where it never does up to `max_streams`."""
    def ratio(c: int) -> float:
        return (arm_tok_s(card, target, a, c, overheads, context_tokens)
                / arm_tok_s(card, target, b, c, overheads, context_tokens))

    levels = [1]
    while levels[-1] < max_streams:
        levels.append(min(max_streams, levels[-1] + 1 if levels[-1] < 8 else levels[-1] * 2))
    ratios = [ratio(c) for c in levels]
    coarse = crossing(levels, ratios)
    if coarse is None:
        return None
    lo = max(c for c in levels if c <= coarse)
    hi = min(c for c in levels if c > coarse)
    fine = list(range(lo, hi + 1))
    return crossing(fine, [ratio(c) for c in fine])
