"""The step-cost model checked against the stand-in's stored cells.

Design:
- Overheads are fitted, never typed (`fit`): an engine's fixed overhead on a card is the mean,
  over its warm one-stream plain-decoding cells there, of the measured step less the model's
  bytes-and-math step; its speculative overhead is the mean, over its warm one-stream
  block-drafter cells on the reference card (step_cost/check.yaml), of what is left once the
  fixed one is added too. Warm: the device at least the weight-read mechanism's busy share
  (analysis/verdict/mechanisms.yaml, 0.70): a window that compiled or waited on the host is no step
  of the model's. The speculative overhead is carried to the engine's other cards; the fixed
  one is fitted on each card where the engine's plain step was measured, since it also holds
  the part of the card's bandwidth its GEMMs do not reach where no GEMM was measured (the
  H100). Each fit names the cells it read.
- `check` predicts every cell from its card, its model records, its drafts and streams, its
  own measured acceptance and the fitted overheads: the model is tested on the step, not on
  acceptance. A cell that set a fit is marked so and left out of the medians of predicted
  cells (`summary`), which are given with and without them.
- Where a cell misses by more than `MISS_PCT`, `reason` gives what was measured about it:
  the device's busy share, a window that mixed plain and drafted steps, a level drafting
  nothing that still pays the speculative path, or the math the sum adds where the max would
  have hidden it. Nothing is excused: the error stands beside its reason.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import polars as pl

from specrepro.analysis.step_cost import model as sc
from specrepro.analysis.step_cost.cells import check_config, standin_cells
from specrepro.analysis.step_cost.data import card, model
from specrepro.analysis.verdict.mechanism import mechanisms

MIN_BUSY = float(mechanisms()["weight_read_step"]["min_busy"])
MISS_PCT = 10.0  # the median's bound, and the size past which a cell's reason is given


def engine_of(row: dict) -> str:
    """'vllm', 'sglang', 'embedded (compiled)': the engine as the model fits it."""
    return row["engine"] + (f" ({row['runtime']})" if row.get("runtime") else "")


def drafts_of(row: dict) -> int:
    """Drafts a request this cell's steps ran: none without a drafter, whatever k says."""
    return row["drafts"] if row.get("drafter") else 0


def tokens_of(row: dict) -> float:
    return sc.tokens_per_step(row.get("acceptance_length"), row.get("per_position"),
                              drafts_of(row))


def step_tokens(row: dict) -> int:
    """Positions the target verifies a step: running requests x (1 + drafts)."""
    return sc.running(row["streams"], row.get("slots")) * (1 + drafts_of(row))


def measured_step_ms(row: dict) -> float:
    return sc.running(row["streams"], row.get("slots")) * tokens_of(row) / row["tok_s"] * 1e3


def model_step(row: dict, overheads: sc.Overheads = sc.NO_OVERHEAD,
               combine: sc.Combine = "sum") -> sc.Step:
    target = model(row["target"])
    drafter = model(row["drafter"]) if row.get("drafter") else None
    k = drafts_of(row)
    parts = sc.passes(target, drafter, k, sc.running(row["streams"], row.get("slots")),
                      row["context_tokens"] or 0.0)
    return sc.step(card(row["card"]), parts, overheads, combine)


@dataclass(frozen=True)
class Fits:
    """Per (card, engine) the overheads, and the cells each was read from."""

    overheads: dict[tuple[str, str], sc.Overheads]
    fitted_cells: frozenset[str]
    reference_card: str = ""

    def of(self, card_id: str, engine: str) -> sc.Overheads:
        """The engine's overheads on a card: its own fit there, else the reference card's,
        carried (an article's box, where this suite measured nothing), else none."""
        own = self.overheads.get((card_id, engine))
        if own is not None:
            return own
        ref = self.overheads.get((self.reference_card, engine))
        if ref is None:
            return sc.Overheads(0.0, 0.0, f"not fitted: no warm cell of {engine}",
                                f"not fitted: no warm cell of {engine}")
        return sc.Overheads(ref.fixed_ms, ref.speculative_ms,
                            f"carried from {self.reference_card}: {ref.fixed_source}",
                            f"carried from {self.reference_card}: {ref.speculative_source}")


def _warm_one_stream(cells: pl.DataFrame) -> pl.DataFrame:
    return cells.filter((pl.col("streams") == 1) & (pl.col("busy") >= MIN_BUSY))


def fit(cells: pl.DataFrame, reference_card: str | None = None,
        combine: sc.Combine = "sum") -> Fits:
    """The overheads of every (card, engine) in `cells` (see the module's design)."""
    reference_card = reference_card or check_config()["reference_card"]
    rows = [{**r, "engine_key": engine_of(r)} for r in _warm_one_stream(cells).iter_rows(named=True)]
    fixed: dict[tuple[str, str], tuple[float, list[str]]] = {}
    for key in sorted({(r["card"], r["engine_key"]) for r in rows}):
        plain = [r for r in rows if (r["card"], r["engine_key"]) == key and not drafts_of(r)
                 and not r["drafter"]]
        if plain:
            res = [measured_step_ms(r) - model_step(r, combine=combine).total_ms for r in plain]
            fixed[key] = (statistics.fmean(res), [r["source"] for r in plain])
    spec: dict[str, tuple[float, list[str]]] = {}
    for engine in sorted({r["engine_key"] for r in rows}):
        block = [r for r in rows if r["engine_key"] == engine and r["card"] == reference_card
                 and drafts_of(r) and model(r["drafter"]).drafts == "block"
                 and (r["card"], engine) in fixed]
        if block:
            res = [measured_step_ms(r) - model_step(
                r, sc.Overheads(fixed[(r["card"], engine)][0]), combine).total_ms for r in block]
            spec[engine] = (statistics.fmean(res), [r["source"] for r in block])
    out: dict[tuple[str, str], sc.Overheads] = {}
    for (card_id, engine), (f_ms, f_src) in fixed.items():
        s_ms, s_src = spec.get(engine, (0.0, []))
        out[(card_id, engine)] = sc.Overheads(
            f_ms, s_ms, _fit_text(f_ms, f_src, f"{engine}'s plain one-stream step on {card_id}"),
            _fit_text(s_ms, s_src, f"{engine}'s block-drafter one-stream step on {reference_card}")
            if s_src else f"not fitted: no warm one-stream block-drafter cell of {engine} on "
                          f"{reference_card}")
    used = {s for _, src in fixed.values() for s in src} | {s for _, src in spec.values() for s in src}
    return Fits(out, frozenset(used), reference_card)


def _fit_text(ms: float, sources: list[str], what: str) -> str:
    return f"{ms:.2f} ms: {what}, the mean over {len(sources)} cell(s): {'; '.join(sources)}"


def reason(row: dict, err_pct: float, step: sc.Step, alt_err_pct: float) -> str:
    """What was measured about a cell that misses by more than MISS_PCT ('' otherwise)."""
    if abs(err_pct) <= MISS_PCT:
        return ""
    parts = []
    if row.get("busy") is not None and row["busy"] < MIN_BUSY:
        parts.append(f"host-bound or cold: the GPU was {row['busy']:.0%} busy (NVML), below the "
                     f"{MIN_BUSY:.0%} a weight-read step needs, so the window timed the host")
    elif row.get("busy") is not None and row["busy"] < 0.9:
        parts.append(f"the GPU was {row['busy']:.0%} busy (NVML): {1 - row['busy']:.0%} of the "
                     "window it waited on the host, which the model does not price")
    if row.get("note"):
        parts.append(row["note"])
    if row.get("drafter") and not row["drafts"] and not row.get("note"):
        parts.append("drafts nothing at this level yet runs the engine's speculative path (the "
                     "zero-draft tier article B found slower than plain decoding); the model "
                     "prices it as plain decoding")
    if (alt_err_pct > 0) != (err_pct > 0):
        parts.append(f"the measured step lies between the model's two bounds (bytes plus math "
                     f"misses by {err_pct:+.1f} %, the larger of the two by {alt_err_pct:+.1f} %): "
                     f"the math of {step_tokens(row)} tokens a step partly overlaps the read")
    measured = measured_step_ms(row)
    priced = step.memory_ms + step.math_ms
    if priced < 0.5 * measured:
        parts.append(f"reads and math are {100 * priced / measured:.0f} % of the measured "
                     f"{measured:.1f}-ms step: the rest is the engine's host work or what its "
                     "kernels do beyond them, not the bytes")
    if step.bound == "compute":
        parts.append(f"compute-bound ({step.math_ms:.1f} ms of math against {step.memory_ms:.1f} "
                     "ms of reads)")
    return "; ".join(parts) or "not located: no measured cause in the cell"


def check(cells: pl.DataFrame | None = None, fits: Fits | None = None,
          combine: sc.Combine = "sum") -> pl.DataFrame:
    """Every stored cell: measured and predicted tok/s and step, the error, the bound, whether
    the cell set a fit, and the reason where it misses by more than MISS_PCT."""
    cells = standin_cells() if cells is None else cells
    fits = fits or fit(cells, combine=combine)
    other: sc.Combine = "max" if combine == "sum" else "sum"
    out = []
    for r in cells.iter_rows(named=True):
        engine = engine_of(r)
        over = fits.of(r["card"], engine)
        st = model_step(r, over, combine)
        alt = model_step(r, over, other)
        tokens = tokens_of(r)
        run = sc.running(r["streams"], r.get("slots"))
        pred = sc.tok_s(run, tokens, st.total_ms)
        err = 100 * (pred / r["tok_s"] - 1)
        alt_err = 100 * (sc.tok_s(run, tokens, alt.total_ms) / r["tok_s"] - 1)
        fitted = r["source"] in fits.fitted_cells
        out.append({"card": r["card"], "engine": engine, "arm": r["arm"],
                    "target": r["target"], "drafter": r["drafter"], "drafts": r["drafts"],
                    "streams": r["streams"], "tokens_per_step": tokens,
                    "tok_s": r["tok_s"], "predicted_tok_s": pred, "error_pct": err,
                    "step_ms": measured_step_ms(r), "predicted_step_ms": st.total_ms,
                    "memory_ms": st.memory_ms, "math_ms": st.math_ms,
                    "overhead_ms": st.overhead_ms, "bound": st.bound,
                    "step_bytes": st.bytes, "step_flops": st.flops,
                    "verified_tokens": step_tokens(r),
                    "busy": r["busy"], "context_tokens": r["context_tokens"], "fitted": fitted,
                    "reason": "sets a fitted overhead" if fitted and abs(err) <= MISS_PCT
                    else reason(r, err, st, alt_err),
                    "source": r["source"]})
    return pl.DataFrame(out)


def summary(checked: pl.DataFrame, lo: int = 1, hi: int = 32) -> dict:
    """Median |error| over lo-hi streams: every cell, the predicted ones (no fit), and by card
    and engine; the count over MISS_PCT."""
    sel = checked.filter(pl.col("streams").is_between(lo, hi))
    pred = sel.filter(~pl.col("fitted"))

    def med(df: pl.DataFrame) -> float | None:
        return float(df["error_pct"].abs().median()) if df.height else None

    by = (sel.group_by("card", "engine", maintain_order=True)
          .agg(pl.col("error_pct").abs().median().alias("median_abs_error_pct"),
               pl.len().alias("cells"), (~pl.col("fitted")).sum().alias("predicted")))
    return {"levels": (lo, hi), "cells": sel.height, "median_abs_error_pct": med(sel),
            "predicted_cells": pred.height, "predicted_median_abs_error_pct": med(pred),
            "over_bound": int((sel["error_pct"].abs() > MISS_PCT).sum()), "by": by}
