"""The peer table: engines serving the same weights and prompts, autoregressive and at their
best speculative arm, level by level.

Design:
- Input: parity.Store's of one study (`params/studies/peer.yaml`, bound per engine: no
  speculation plus a few speculative arms, GSM8K completions, 1, 8 and 32 streams, repeats),
  measured one engine at a time (timed cells never share the GPU).
- Per engine and level (workload, temperature, streams): the autoregressive arm's
  throughput and TTFT p50/p95 (mean over repeats, with min-max), and the speculative arm
  with the highest mean throughput at that level, its throughput, tokens per step and
  TTFT; the arm is chosen per level, since the best draft count moves with load.
- Ratios: a named engine's (the embedded engine) autoregressive throughput over each other
  engine's at the same level, and its best speculative over theirs, so the issue's targets
  read off one table (at least 1.5x at one stream, at least 1x at 8 and 32); `targets`
  evaluates them and says which engine or level is missing rather than passing it.
- Numbers through tables.spread_of / metrics; a level an engine did not measure is a row
  whose note says so, never a zero.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from specrepro.analysis.finding import cell_key, parity, tables
from specrepro.analysis.finding.tables import Table

NONE_ARM = "none"
TARGETS = {1: 1.5, 8: 1.0, 32: 1.0}  # streams -> the embedded engine's least ratio (AR)


def _levels(stores: list[parity.Store]) -> list[dict]:
    levels = pl.concat([s.cells.select(*cell_key.READING) for s in stores]).unique()
    return sorted(levels.to_dicts(), key=lambda r: tuple((r[k] is None, r[k] or 0)
                                                         for k in cell_key.READING))


def best(store: parity.Store, level: dict) -> tuple[str | None, pl.DataFrame]:
    """The speculative arm with the highest mean throughput at a level, and its cells."""
    top, cells, rate = None, store.cells.clear(), None
    for arm in store.arms:
        if arm == NONE_ARM:
            continue
        at = parity.cells_at(store, {**level, "arm": arm})
        m = parity.mean_of(at, "agg_tok_s")
        if m is not None and (rate is None or m > rate):
            top, cells, rate = arm, at, m
    return top, cells


def rows(stores: list[parity.Store], subject: str) -> list[dict]:
    """One row per engine and level (module docstring); `subject` names the engine whose
    ratios over the others are given."""
    me = parity.reference_of(stores, subject)
    out = []
    for level in _levels(stores):
        mine_ar = parity.cells_at(me, {**level, "arm": NONE_ARM})
        _, mine_best = best(me, level)
        for s in stores:
            ar = parity.cells_at(s, {**level, "arm": NONE_ARM})
            arm, sp = best(s, level)
            row = {**parity.level_of(level), "engine": s.name,
                   "autoregressive tok/s": tables.spread_of(ar["agg_tok_s"].to_list(),
                                                            with_n=False) if ar.height else None,
                   "autoregressive TTFT p50 (ms)": parity.mean_of(ar, "ttft_p50_ms"),
                   "autoregressive TTFT p95 (ms)": parity.mean_of(ar, "ttft_p95_ms"),
                   "best speculative arm": arm,
                   "best speculative tok/s": tables.spread_of(sp["agg_tok_s"].to_list(),
                                                              with_n=False) if sp.height else None,
                   "its tokens per step": parity.mean_of(sp, "acceptance_length"),
                   "its TTFT p50 (ms)": parity.mean_of(sp, "ttft_p50_ms"),
                   f"{me.name}'s autoregressive over this (ratio)": None,
                   f"{me.name}'s best over this (ratio)": None,
                   "note": ""}
            if s is not me:
                row[f"{me.name}'s autoregressive over this (ratio)"] = parity.ratio(
                    parity.mean_of(mine_ar, "agg_tok_s"), parity.mean_of(ar, "agg_tok_s"))
                row[f"{me.name}'s best over this (ratio)"] = parity.ratio(
                    parity.mean_of(mine_best, "agg_tok_s"), parity.mean_of(sp, "agg_tok_s"))
            if not ar.height:
                row["note"] = "no autoregressive cell at this level"
            out.append(row)
    return out


def table(stores: list[parity.Store], subject: str) -> Table:
    me = parity.reference_of(stores, subject)
    return parity.reader_table(rows(stores, subject), (
        "Peer engines on the same weights and prompts, per level: the autoregressive arm and "
        "the speculative arm with the highest mean throughput there (mean (min-max) over "
        f"repeats), and {me.name}'s throughput over each engine's (a ratio)"))


# where the autoregressive arm's time goes: the client's figures, then the engine's own
# histograms over the same cells (harness/engine_latency.py), means over repeats
TIME_COLUMNS = {
    "client TTFT p50 (ms)": "ttft_p50_ms",
    "engine TTFT (ms)": "engine_ttft_ms",
    "engine queue (ms)": "engine_queue_ms",
    "engine prefill (ms)": "engine_prefill_ms",
    "engine decode (ms)": "engine_decode_ms",
    "client ITL p50 (ms, per token)": "itl_p50_ms",
    "engine ITL (ms; per step: vLLM, embedded; per token: SGLang)": "engine_itl_ms",
    "client end to end p50 (ms)": "e2e_p50_s",
    "engine end to end (ms)": "engine_e2e_ms",
    "GPU busy in forward passes (share of the cell)": "engine_busy_share",
}


def time_rows(stores: list[parity.Store]) -> list[dict]:
    """Per engine and level, where the autoregressive arm's time goes: the client's TTFT,
    ITL and end-to-end figures beside the engine's own histogram means (None where the
    engine keeps no such histogram, or the store predates them)."""
    out = []
    for level in _levels(stores):
        for s in stores:
            ar = parity.cells_at(s, {**level, "arm": NONE_ARM})
            row = {**parity.level_of(level), "engine": s.name}
            for title, col in TIME_COLUMNS.items():
                v = parity.mean_of(ar, col) if ar.height and col in ar.columns else None
                row[title] = 1000.0 * v if v is not None and col == "e2e_p50_s" else v
            row["note"] = "" if ar.height else "no autoregressive cell at this level"
            out.append(row)
    return out


def time_table(stores: list[parity.Store]) -> Table:
    return parity.reader_table(time_rows(stores), (
        "Where the autoregressive arm's time goes, per engine and level: the client's TTFT, "
        "inter-token and end-to-end latency beside the engine's own histograms over the same "
        "cells (queue, prefill and decode are vLLM's per-request phases; SGLang counts its "
        "GPU's forward-pass seconds), means over repeats; empty where an engine keeps no "
        "such histogram"))


def targets(stores: list[parity.Store], subject: str,
            wanted: dict[int, float] = TARGETS, against: Sequence[str] = ()) -> list[str]:
    """The issue's autoregressive targets, one line each: met, missed (with the ratio) or
    not measured (with what is missing). `against` names the engines the subject is held
    to (default: every other store; a store of the subject itself in another configuration,
    shown beside it in the tables, is no peer to beat)."""
    me = parity.reference_of(stores, subject)
    peers = [s for s in stores if s is not me]
    if against:
        peers = [parity.reference_of(stores, name) for name in against]
        if me in peers:
            raise parity.ParityError(f"the subject {subject!r} cannot be held against itself")
    lines = []
    for streams, least in wanted.items():
        for s in peers:
            for level in (lv for lv in _levels(stores) if lv["concurrency"] == streams):
                a = parity.mean_of(parity.cells_at(me, {**level, "arm": NONE_ARM}), "agg_tok_s")
                b = parity.mean_of(parity.cells_at(s, {**level, "arm": NONE_ARM}), "agg_tok_s")
                where = f"{level['workload']}, {tables.streams(streams)}"
                if a is None or b is None:
                    lines.append(f"{where}: {me.name} against {s.name}: not measured "
                                 f"({me.name if a is None else s.name} has no autoregressive "
                                 "cell)")
                    continue
                r = a / b
                verdict = "met" if r >= least else "missed"
                lines.append(f"{where}: {me.name} {a:,.1f} tok/s against {s.name} {b:,.1f}: "
                             f"{r:.2f}x (target >= {least:g}x) {verdict}")
    return lines
