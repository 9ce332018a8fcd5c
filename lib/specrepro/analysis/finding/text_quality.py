"""Whether a cell's outputs are text: repetition, requests cut at the cap, and the loop flag.

Design:
- Acceptance on text that loops measures how easy repetition is to draft, not the drafter:
  755 of 768 essay requests of the real engines' store ended at the 512-token cap, their
  repeated-4-gram share 0.65. So every view that shows acceptance shows beside it the
  cell's `repeated_4gram_share` and `length_share` (the share of requests that ended at
  max_tokens), and a cell whose share reaches `metrics.LOOP_SHARE` is flagged, never
  silently averaged: `loop_flag` marks a figure averaged over runs with how many of them
  loop, and `loop_reason` makes an acceptance check whose cells loop not testable here
  (its measured side still shown), and names the loops in the reason of a speed, step or
  energy check (they move with acceptance); a check already not testable is left as it is.
- `length_share` is computed where the cells row is built (harness/cells.py). Stores
  written before it existed read it as null; `with_length_share` derives it from the
  stored requests' `finish_reason` (the same `metrics.length_share`), so no stored cell is
  re-measured for it. A cell whose requests carry no finish reason keeps null.
- The words that explain each column live here (`EXPLAIN`, `LOOP_NOTE`); tables.py puts
  them under every table that shows the columns.
"""

from __future__ import annotations

from typing import Any, Protocol

import polars as pl

from specrepro import metrics


class Rule(Protocol):
    """A verdict rule (analysis/verdict/rules.py `Rule`) as the verdict hook below reads it: its
    metric and its two sides (None, or an arm with its workload, temperature and level). A
    protocol, not an import: the data a finding reads sits below the verdict that judges it."""

    @property
    def metric(self) -> str: ...

    @property
    def a(self) -> Any: ...

    @property
    def b(self) -> Any: ...

# Metrics that count drafts the target kept: on loops they measure repetition.
ACCEPTANCE_METRICS = ("acceptance_length", "draft_acceptance_rate", "acceptance_rate_pos")
# Figures that move with acceptance (speed, step, energy per token): on loops a check of them
# names the loops in its reason. A KV pool or peak memory is set at start-up: loops or not.
WITH_ACCEPTANCE = ("agg_tok_s", "step_ms", "tokens_per_joule")

EXPLAIN = {
    "repeated_4gram_share": (
        "repeated 4-grams: the share of an output's 4-grams (token ids, else words) that "
        "occurred earlier in the same output, pooled over the cell's requests; repetition "
        "is easy to draft and inflates acceptance (WikiText-2 prose: 5.7 % over 512-token "
        "windows)"),
    "length_share": (
        "ended at max_tokens: the share of requests the output cap cut (finish_reason "
        "length) rather than the model ending its text; near 100 % the acceptance is "
        "that of text the model never finished"),
}
LOOP_NOTE = (f"[loops]: the cell's repeated 4-grams reach {metrics.LOOP_SHARE:.0%} (natural "
             "text repeats 6-20 %, prose to code; metrics.LOOP_SHARE says why): its outputs "
             "are mostly loops and its acceptance measures repetition; a figure averaged "
             "over runs says how many of them loop")


def with_length_share(cells: pl.DataFrame, requests: pl.DataFrame) -> pl.DataFrame:
    """Cells with `length_share` filled, where the row lacks it, from its stored requests:
    the share of the attempt's answered requests (no error) whose finish_reason is length."""
    if "length_share" not in cells.columns:
        cells = cells.with_columns(pl.lit(None, pl.Float64).alias("length_share"))
    need = {"cell_id", "attempt", "finish_reason", "error"}
    if (not cells.height or cells["length_share"].null_count() == 0
            or not need <= set(requests.columns)):
        return cells
    derived = {}
    for (cell_id, attempt), part in requests.filter(pl.col("error").is_null()).group_by(
            ["cell_id", "attempt"]):
        derived[(cell_id, attempt)] = metrics.length_share(part["finish_reason"].to_list())
    filled = [share if share is not None else derived.get((c, a))
              for c, a, share in cells.select("cell_id", "attempt", "length_share").iter_rows()]
    return cells.with_columns(pl.Series("length_share", filled, dtype=pl.Float64))


def loop_flag(shares) -> str | None:
    """The mark of a figure averaged over runs whose repeated-4-gram shares are `shares`:
    'loops' when every measured run loops, 'loops in k of n runs' when some do, else None."""
    flags = [f for f in (metrics.mostly_loops(s) for s in shares) if f is not None]
    k = sum(flags)
    if not k:
        return None
    return "loops" if k == len(flags) else f"loops in {k} of {len(flags)} runs"


def _pct(values) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "n/a"
    lo, hi = 100 * min(vals), 100 * max(vals)
    return f"{lo:.0f} %" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f} %"


def _side_cells(cells: pl.DataFrame, side) -> pl.DataFrame:
    """The cells a rule's side reads from: its arm at its workload and temperature where it
    names them, at its level where that is a number (lowest / highest: every level, since
    greedy outputs barely change with load)."""
    cells = cells.filter(pl.col("arm") == side.arm)
    if side.workload is not None:
        cells = cells.filter(pl.col("workload") == side.workload)
    if side.temperature is not None:
        cells = cells.filter(pl.col("temperature") == side.temperature)
    if isinstance(side.concurrency, int):
        cells = cells.filter(pl.col("concurrency") == side.concurrency)
    return cells


def loop_reason(finding_cells: pl.DataFrame, rule: Rule) -> str:
    """Why a check's inputs (a finding's cells) are loops ('' when none is): per side whose
    cells are flagged, the arm, how many cells loop, their repeated 4-grams and requests cut
    at max_tokens. It takes the cells, not the Finding, so that finding.py may import this
    module (`with_length_share`) without a cycle."""
    parts = []
    for side in (rule.a, rule.b):
        if side is None:
            continue
        cells = _side_cells(finding_cells, side)
        if not cells.height:
            continue
        shares = cells["repeated_4gram_share"].to_list()
        flagged = [s for s in shares if metrics.mostly_loops(s)]
        if not flagged:
            continue
        cut = cells["length_share"].to_list() if "length_share" in cells.columns else []
        parts.append(f"{side.arm} {len(flagged)} of {len(shares)} cells (repeated 4-grams "
                     f"{_pct(shares)}, ended at max_tokens {_pct(cut)})")
    if not parts:
        return ""
    return ("the outputs are mostly loops: " + "; ".join(parts)
            + f" (loop: repeated 4-grams at least {metrics.LOOP_SHARE:.0%})")


def loops_decide(rule: Rule) -> str | None:
    """What loops in a check's inputs do to it: "decide" (an acceptance metric: on loops it
    measures repetition, so the check is not testable), "note" (speed, step, energy: they
    move with acceptance, so the reason names the loops), None (set at start-up)."""
    if rule.metric in ACCEPTANCE_METRICS:
        return "decide"
    return "note" if rule.metric in WITH_ACCEPTANCE else None
