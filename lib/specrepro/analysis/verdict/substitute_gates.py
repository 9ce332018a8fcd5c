"""A suite's own gate (a substitute for one of the article's), in words beside the article.

Design:
- A substitute gate is this suite's rule, not the article's: its row says its own rule
  (metric, arms, threshold, workload and level) and its own value, and names the article's
  gate it stands in for as that, never as the article's value of this check.
- The article's cell beside it is the article's figure of the same metric at the same
  workload and level (published/*.csv through claims.yaml's `arms`): the change between the
  two arms for a relative gate, the arm's value for an absolute one (an arm-level figure,
  such as peak memory, where the article gives only that). Where the article prints none
  there, the cell says so at that level; it never shows a figure at another level or unit.
- Units are the cells table's (analysis/tables.NAMES): a share stored as a fraction reads as
  a percentage, in the value and the threshold alike.
"""

from __future__ import annotations

import polars as pl

from specrepro.analysis.finding import tables
from specrepro.analysis.verdict.claims import Claims
from specrepro.analysis.verdict.overlay import choose
from specrepro.params import Gate
from specrepro.published import load_published

OPS = {">=": "at least", "<=": "at most", ">": "above", "<": "below"}
STATS = ("value", "mean", "approx")


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _with_unit(x: float, unit: str) -> str:
    if unit == "%":
        return f"{_num(x)}%"
    return f"{_num(x)} {unit}".strip()


def scale(gate: Gate) -> tuple[str, str, float]:
    """(words, unit, factor) the gate's metric reads in: the cells table's where it scales a
    fraction (a share shown as %), else the gate's own unit (`of 200`, `MiB`)."""
    words, unit, factor = tables.NAMES.get(gate.metric, (gate.metric, gate.unit or "", 1.0))
    if gate.kind == "relative_pct":
        return words, unit, 1.0  # the change is in % whatever the metric's unit
    if factor != 1.0:
        return words, unit, factor
    return words, gate.unit or unit, 1.0


def where(gate: Gate) -> str:
    return f"{gate.workload}, {gate.concurrency} stream{'s' if gate.concurrency != 1 else ''}"


def rule_words(gate: Gate) -> str:
    """'tokens per step of drafter-fp8 at least -5% against drafter-bf16 (essays, 1 stream)'."""
    words, unit, factor = scale(gate)
    if gate.kind == "relative_pct":
        bound = f"{gate.threshold:+g}% against {gate.reference_arm}"
    else:
        bound = _with_unit(gate.threshold * factor, unit)
    return f"{words} of {gate.arm} {OPS[gate.op]} {bound} ({where(gate)})"


def measured_words(gate: Gate, row: dict) -> str:
    """The gate's value in its unit, with what it was computed from and where."""
    if row["value"] is None:
        return f"not measured ({where(gate)})"
    _, unit, factor = scale(gate)
    if gate.kind == "relative_pct":
        _, munit, mfactor = tables.NAMES.get(gate.metric, (gate.metric, "", 1.0))
        return (f"{row['value']:+.1f}% ({_with_unit(row['measured'] * mfactor, munit)} against "
                f"{_with_unit(row['reference'] * mfactor, munit)}; {where(gate)})")
    return f"{_with_unit(row['value'] * factor, unit)} ({where(gate)})"


def _published(claims: Claims, study_arm: str | None, gate: Gate,
               temperature: float | None) -> dict | None:
    """The article's row for one arm at the gate's metric, workload and level (an arm-level
    row where the article gives the metric only so)."""
    arm = claims.arms.get(study_arm or "")
    if arm is None:
        return None
    rows = load_published().filter((pl.col("arm") == arm) & (pl.col("metric") == gate.metric)
                                   & pl.col("stat").is_in(list(STATS))
                                   & pl.col("repeat").is_null())
    temp = claims.compared_temperature(temperature)
    at = rows.filter((pl.col("workload") == claims.published_workload(gate.workload))
                     & (pl.col("concurrency") == gate.concurrency)
                     & ((pl.col("temperature") == temp) if temp is not None else pl.lit(True)))
    if at.height:
        return choose(at.to_dicts(), claims)[0]
    level_free = rows.filter(pl.col("concurrency").is_null() & pl.col("workload").is_null())
    if level_free.height and gate.kind == "absolute":
        return choose(level_free.to_dicts(), claims)[0]
    return None


def article_words(claims: Claims, gate: Gate, temperature: float | None) -> str:
    """The article's figure of this gate's metric at its workload and level, or that it
    prints none there."""
    words, unit, factor = scale(gate)
    a = _published(claims, gate.arm, gate, temperature)
    if gate.kind == "relative_pct":
        b = _published(claims, gate.reference_arm, gate, temperature)
        if a and b and b["value"]:
            change = 100.0 * (a["value"] - b["value"]) / b["value"]
            _, munit, _ = tables.NAMES.get(gate.metric, (gate.metric, "", 1.0))
            return (f"{change:+.1f}% ({_with_unit(a['value'], munit)} against "
                    f"{_with_unit(b['value'], munit)}; {where(gate)})")
        return f"not printed: the article gives no {words} of these two arms at {where(gate)}"
    if a:
        level = (where(gate) if a["concurrency"] is not None
                 else "over the article's runs, no level")
        # the published row's unit is the article's (MiB, correct/200); a share is scaled
        return f"{_with_unit(a['value'], unit if factor != 1.0 else a['unit'])} ({level})"
    return f"not printed: the article gives no {words} of this arm at {where(gate)}"


def describe(claims: Claims, gate: Gate, row: dict, temperature: float | None) -> dict:
    """The substitute row's claim, article, measured and rule."""
    stands_for = (f"; in place of the article's gate “{gate.published}”" if gate.published
                  else "")
    return {
        "claim": f"substitute (this suite's gate “{gate.name}”): {rule_words(gate)}{stands_for}",
        "article": article_words(claims, gate, temperature),
        "measured": measured_words(gate, row),
        "rule": (f"this suite's rule, declared before the run: {rule_words(gate)}; it stands "
                 "beside the article's gates and does not decide the verdict"),
    }
