"""The engines' own latency histograms over a cell: where a request's time went, as the
engine saw it (beside the client's TTFT and inter-token latency, harness/cells.py).

Design:
- A Prometheus histogram keeps a running `<name>_sum` and `<name>_count`; between the cell's
  two `/metrics` scrapes (the same ones the acceptance counters come from, loadgen.py) their
  differences give the mean of what the engine observed in that span: Δsum / Δcount,
  summed over label sets (engines, ranks), as promtext sums its counters.
- Which histograms: the engine's `MetricNames.histograms` (on its adapter,
  harness/engines/; names read from each release's own metrics code: vLLM 0.26.0
  `v1/metrics/loggers.py`, SGLang 0.5.14 `observability/metrics_collector.py`; the
  embedded engine exports vLLM's TTFT, ITL and end-to-end names,
  embedded/server_metrics.py):
  - queue: waiting before the first schedule; prefill and decode: the request's time in
    each phase (vLLM only); ttft and e2e: first token and whole request, as the engine
    stamps them (the client's own figures add HTTP, detokenizing and streaming);
  - itl: vLLM observes one gap per output chunk (an engine step, which carries several
    tokens under speculation), SGLang one per token: the two are named apart in the
    tables, never compared as one figure.
- SGLang also counts the seconds its GPU spent in forward passes
  (`MetricNames.busy_seconds`, `sglang:forward_execution_seconds_total`): over the cell's
  wall time that is the share of the span the GPU was busy (`engine_busy_share`); the
  others have no such counter.
- A histogram the scrape lacks gives None, never 0. SGLang's multiprocess metrics show a
  series only once observed: missing before and present after counts from zero
  (`MetricNames.appear_on_first_use`). A count that went down (a restart) gives None;
  promtext's counter check already warns of it.
"""
from __future__ import annotations

from specrepro.harness import promtext

PHASES = ("queue", "prefill", "decode", "ttft", "itl", "e2e")
COLUMNS = (*(f"engine_{p}_ms" for p in PHASES), "engine_busy_share")


def _grown(old: dict, new: dict, name: str, lazy: bool) -> float | None:
    """How much a sample (summed over its label sets) grew between two scrapes; None where
    a scrape lacks it or it went down (a restart). A lazy family's sample missing from the
    first scrape only counts from zero (module docstring)."""
    b, a = promtext.total(old, name), promtext.total(new, name)
    if b is None and a is not None and lazy:
        b = 0.0
    return None if a is None or b is None or a < b else a - b


def fields(before: str | None, after: str | None, names: promtext.MetricNames | None,
           wall_s: float | None) -> dict[str, float | None]:
    """The cells row's engine-side columns (COLUMNS) from two scrapes' texts; all None
    where a scrape is missing or the engine has no metrics (the transformers peer)."""
    out: dict[str, float | None] = dict.fromkeys(COLUMNS)
    if names is None or before is None or after is None:
        return out
    lazy = names.appear_on_first_use
    old, new = promtext.samples(before), promtext.samples(after)
    for phase, name in names.histograms.items():
        d_sum = _grown(old, new, f"{name}_sum", lazy)
        d_count = _grown(old, new, f"{name}_count", lazy)
        if d_sum is not None and d_count:
            out[f"engine_{phase}_ms"] = 1000.0 * d_sum / d_count
    busy = names.busy_seconds
    if busy is not None and wall_s:
        spent = _grown(old, new, busy, lazy)
        if spent is not None:
            out["engine_busy_share"] = spent / wall_s
    return out
