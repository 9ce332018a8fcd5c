"""Near-ties where engines' greedy outputs part: is a difference explained by the target's
own arithmetic?

Design:
- Greedy decoding picks the target's top token at every position, so two engines serving the
  same weights part only where their logits order two tokens differently. bf16 kernels
  differ between engines (and between a one-token decode and a k+1-token verify pass in one
  engine), so a position where the target's top two tokens are nearly tied is where outputs
  may part without any engine being wrong. A difference is **explained** when, at its first
  differing position, the target's top-1 minus top-2 log-probability is below `NEAR_TIE`
  (0.05, the issue's bound) and the two engines' tokens are those two; anything else is a
  finding to explain, never to tune away.
- Pairs: every (engine, arm) output against one reference output, the reference store's
  reference arm (default: `none`, the autoregressive text), same prompt, same workload,
  temperature and concurrency, repeat 0; the reference store's other arms count too (a
  speculative arm of the reference engine against its own autoregressive text).
- Log-probabilities come from a `Scorer`: (prompt_id, the common prefix's token ids) ->
  the top (token, log-probability, logit) at the next position, best first. It is the caller's (a
  script loads the embedded target, as scripts/parity.py --near-ties does): analysis
  imports no engine. The scorer says what it computed (`Scorer.what`, for the caption).
- Tables (tables.Table): `summary` per engine x arm x level (prompts compared, identical,
  differing, explained, unexplained, the margin's median and largest over the differing
  ones); `details` one row per differing prompt (position, the two tokens, their ranks,
  the margin, explained or not). A prompt without token ids on either side is counted
  apart in the note, never as identical.
- bf16's resolution: a bf16 logit of magnitude in [2^e, 2^(e+1)) is a multiple of
  2^(e-7) (0.0625 for logits of 8 to 16, this target's range), so engines that round their
  logits to bf16 cannot order two tokens whose margin is below that step, whatever their
  kernels. The tables give each margin in those steps of the top logit and count the
  differences within one step beside the issue's 0.05 rule; they never replace it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import polars as pl

from specrepro import metrics
from specrepro.analysis.finding import parity
from specrepro.analysis.finding.tables import Table

NEAR_TIE = 0.05  # top-1 minus top-2 log-probability below this is a near-tie
REFERENCE_ARM = "none"


@dataclass(frozen=True)
class Scorer:
    """The target's top log-probabilities after a prompt and a prefix of its completion."""

    # (token, log-probability, logit), best first, >= 2 entries
    top: Callable[[str, Sequence[int]], list[tuple[int, float, float]]]
    what: str  # e.g. "the embedded target in fp32 on the CPU"


@dataclass(frozen=True)
class Parting:
    """Where one output parts from the reference output, and the target's view there."""

    position: int  # completion token from 0
    ref_token: int | None  # None: the reference ended there
    token: int | None  # None: this output ended there
    margin: float | None  # top-1 minus top-2 log-probability at the position
    ref_rank: int | None  # 1 = the target's top token; None: beyond the scorer's list
    rank: int | None
    bf16_step: float | None = None  # the spacing of bf16 numbers at the top logit

    @property
    def within_bf16_step(self) -> bool:
        """The two chosen tokens are the top two and their margin is below one bf16 step
        of the top logit: an engine that rounds logits to bf16 cannot order them."""
        return (self.margin is not None and self.bf16_step is not None
                and self.margin < self.bf16_step and {self.ref_rank, self.rank} == {1, 2})

    @property
    def explained(self) -> bool:
        return (self.margin is not None and self.margin < NEAR_TIE
                and {self.ref_rank, self.rank} == {1, 2})


def parting(prompt_id: str, ref: Sequence[int], ids: Sequence[int],
            scorer: Scorer) -> Parting | None:
    """None where the two outputs are token-identical."""
    p = parity.first_difference(list(ids), list(ref))
    if p is None:
        return None
    top = scorer.top(prompt_id, list(ref[:p]))
    ranks = {tok: i + 1 for i, (tok, _, _) in enumerate(top)}
    margin = top[0][1] - top[1][1] if len(top) >= 2 else None
    a = ref[p] if p < len(ref) else None
    b = ids[p] if p < len(ids) else None
    return Parting(p, a, b, margin, ranks.get(a), ranks.get(b), bf16_step(top[0][2]))


def bf16_step(x: float) -> float | None:
    """The spacing of bf16 numbers (8 significant bits) around x: 2^(e-7) for |x| in
    [2^e, 2^(e+1))."""
    if not math.isfinite(x) or x == 0:
        return None
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7)


def _pairs(stores: list[parity.Store], ref: parity.Store, ref_arm: str):
    """(store, level, its outputs, the reference outputs) for every arm x level measured."""
    for level in parity.arm_levels(stores, ref):
        base = parity.outputs_at(ref, ref_arm, level)
        for s in stores:
            if s is ref and level["arm"] == ref_arm:
                continue
            mine = parity.outputs_at(s, level["arm"], level)
            if mine is not None:
                yield s, level, mine, base


def tables(stores: list[parity.Store], scorer: Scorer, reference: str | None = None,
           reference_arm: str = REFERENCE_ARM) -> dict[str, Table]:
    """The `summary` and `details` tables (module docstring)."""
    ref = parity.reference_of(stores, reference)
    if reference_arm not in ref.arms:
        raise parity.ParityError(f"reference arm {reference_arm!r} is not an arm of "
                                 f"{ref.name} ({', '.join(ref.arms)})")
    summary, details = [], []
    for s, level, mine, base in _pairs(stores, ref, reference_arm):
        row = {"engine": s.name, "arm": level["arm"], **parity.level_of(level)}
        if base is None:
            summary.append({**row, "note": f"{ref.name}: no {reference_arm} output here"})
            continue
        common = [p for p in mine if p in base]
        no_ids = [p for p in common if mine[p] is None or base[p] is None]
        parts = {p: parting(p, base[p], mine[p], scorer) for p in common if p not in no_ids}
        differ = {p: x for p, x in parts.items() if x is not None}
        margins = [x.margin for x in differ.values() if x.margin is not None]
        summary.append({**row, "prompts compared": len(parts) or None,
                        "token-identical": len(parts) - len(differ) if parts else None,
                        "differing": len(differ) if parts else None,
                        "near-tie (explained)": sum(x.explained for x in differ.values()),
                        "not a near-tie": sum(not x.explained for x in differ.values()),
                        "of those, within one bf16 step": sum(
                            x.within_bf16_step and not x.explained for x in differ.values()),
                        "margin at the parting, median": metrics.percentile(margins, 50),
                        "margin at the parting, largest": max(margins) if margins else None,
                        "note": f"{len(no_ids)} prompt(s) without token ids" if no_ids else ""})
        for p, x in sorted(differ.items()):
            details.append({**row, "prompt": p, "position": x.position,
                            "reference token": x.ref_token, "engine token": x.token,
                            "reference token rank": x.ref_rank, "engine token rank": x.rank,
                            "margin": x.margin,
                            "margin in bf16 steps": (x.margin / x.bf16_step
                                                     if x.margin is not None and x.bf16_step
                                                     else None),
                            "explained": x.explained,
                            "within one bf16 step": x.within_bf16_step})
    what = (f"against {ref.name}'s {reference_arm} output (same prompt, repeat 0); the "
            f"target's top-1 minus top-2 log-probability at the first differing token, from "
            f"{scorer.what}; a near-tie is a margin below {NEAR_TIE:g} between exactly the two "
            "tokens the outputs chose; a bf16 step is the spacing of bf16 numbers at the "
            "top logit")
    return {
        "summary": parity.reader_table(
            summary, "Where outputs part, per engine, arm and level, " + what),
        "details": Table(pl.DataFrame(details, infer_schema_length=None) if details
                         else pl.DataFrame({"prompt": []}),
                         "Each differing prompt: " + what),
    }


BOUNDS = (NEAR_TIE, 0.1, 0.2, 0.35)  # margins to count along an output


def crossings(margins: dict[str, Sequence[float]], bounds: Sequence[float] = BOUNDS,
              what: str = "") -> Table:
    """How many near-ties a greedy text crosses: per bound, the share of positions whose
    top-1 minus top-2 margin is below it, the mean count per output and the share of
    outputs that cross none. `margins` is the target's margin at every completion position
    of each reference output (prompt_id -> margins). Where bf16 arithmetic can reorder two
    tokens up to some margin, an output that crosses no position below it is the only one
    two bf16 engines are bound to agree on."""
    n_pos = sum(len(m) for m in margins.values())
    rows = []
    for b in bounds:
        per = [sum(x < b for x in m) for m in margins.values()]
        rows.append({"margin below": b, "positions": n_pos,
                     "share of positions (%)": 100.0 * sum(per) / n_pos if n_pos else None,
                     "per output, mean": sum(per) / len(per) if per else None,
                     "outputs crossing none": sum(c == 0 for c in per),
                     "outputs": len(per)})
    return Table(pl.DataFrame(rows), "Near-ties along the reference outputs: the target's "
                 "top-1 minus top-2 log-probability at every completion position" + what)

