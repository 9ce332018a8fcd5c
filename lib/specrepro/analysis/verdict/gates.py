"""Gates declared before the run, evaluated on the measured cells: pass or fail, with why.

Design:
- The gates are the study's (`findings/05_*/study.yaml`, or a suite's override of them),
  validated when the params load; nothing here invents a threshold.
- A gate reads one column of the cells table at one arm x workload x concurrency (repeats
  averaged); a `relative_pct` gate compares it with the reference arm's value at the same
  level, as metrics.relative_change_pct. `Gate.passes` (params/schema.py) decides.
- A gate whose cell was not measured, or whose column is empty (no NVML on a CPU, say),
  is `not measured`, never a pass.
"""

from __future__ import annotations

import polars as pl

from specrepro import metrics
from specrepro.params import Gate

GATE_SCHEMA = {
    "gate": pl.String, "metric": pl.String, "workload": pl.String, "concurrency": pl.Int64,
    "arm": pl.String, "reference_arm": pl.String, "measured": pl.Float64,
    "reference": pl.Float64, "value": pl.Float64, "op": pl.String, "threshold": pl.Float64,
    "unit": pl.String, "result": pl.String, "published": pl.String,
}


def _value(cells: pl.DataFrame, arm: str, gate: Gate) -> float | None:
    hit = cells.filter((pl.col("arm") == arm) & (pl.col("workload") == gate.workload)
                       & (pl.col("concurrency") == gate.concurrency))[gate.metric].drop_nulls()
    return float(hit.mean()) if hit.len() else None


def evaluate_gate(cells: pl.DataFrame, gate: Gate) -> dict:
    """One gate's row: the measured value, its reference, the gated value and the result."""
    measured = _value(cells, gate.arm, gate)
    reference = _value(cells, gate.reference_arm, gate) if gate.reference_arm else None
    if gate.kind == "relative_pct":
        value = metrics.relative_change_pct(measured, reference)
        ok = None if value is None else gate.passes(measured, reference)
    else:
        value = measured
        ok = None if value is None else gate.passes(measured)
    return {
        "gate": gate.name, "metric": gate.metric, "workload": gate.workload,
        "concurrency": gate.concurrency, "arm": gate.arm, "reference_arm": gate.reference_arm,
        "measured": measured, "reference": reference, "value": value, "op": gate.op,
        "threshold": gate.threshold, "unit": gate.unit,
        "result": "not measured" if ok is None else ("pass" if ok else "fail"),
        "published": gate.published,
    }


def evaluate_gates(cells: pl.DataFrame, gates: list[Gate]) -> pl.DataFrame:
    """Every declared gate, in declaration order."""
    rows = [evaluate_gate(cells, g) for g in gates]
    return pl.DataFrame(rows, schema=GATE_SCHEMA, orient="row")
