"""The results tables' columns: the cells and requests schemas, the columns added since
stores were first written, and what a row must give.

Design: one home for what a results file holds (files.py reads, writes and merges them;
the analysis and the gates name columns from here). Every file has the same columns and
types: a row that leaves a column out gets its default (null; `DEFAULTS`), a row with a
column the schema lacks fails, and a file written before a column in `ADDED_COLUMNS`
existed reads it as null.
"""

from __future__ import annotations

from typing import Any

import polars as pl

STATUSES = ("ok", "failed", "interrupted")

_S, _I, _F, _B, _UTC = pl.String, pl.Int64, pl.Float64, pl.Boolean, pl.Datetime("us", "UTC")

CELL_SCHEMA: dict[str, pl.DataType] = {
    "study": _S, "run_id": _S, "cell_id": _S, "attempt": _I, "status": _S, "error": _S,
    "started_at": _UTC, "ended_at": _UTC,
    "session_id": _S,  # the manifest session that measured it (null: written before sessions)
    "arm": _S, "profile": _S, "engine": _S, "engine_version": _S, "method": _S,
    "num_speculative_tokens": _I,
    "schedule": _S,  # the draft schedule as JSON ([[lo, hi, k], ...]) or null
    "workload": _S, "n_prompts": _I, "concurrency": _I,
    "temperature": _F, "top_p": _F, "top_k": _I, "repeat": _I, "seed": _I, "ignore_eos": _B,
    "n_requests": _I, "n_errors": _I, "prompt_tokens": _I, "output_tokens": _I,
    "wall_s": _F, "agg_tok_s": _F, "per_stream_tok_s": _F,
    "ttft_p50_ms": _F, "ttft_p95_ms": _F,
    "itl_p50_ms": _F,  # token-weighted median of per-token gaps
    "itl_request_mean_ms": _F,  # mean over requests of (last - first token) / (tokens - 1)
    "e2e_p50_s": _F,
    "num_drafts": _I, "num_draft_tokens": _I, "num_accepted_tokens": _I,
    "acceptance_length": _F, "draft_acceptance_rate": _F,
    "per_position_acceptance": pl.List(_F), "step_ms": _F,
    "gsm8k_strict_correct": _I, "gsm8k_flexible_correct": _I, "gsm8k_n": _I,
    "repeated_4gram_share": _F,
    "length_share": _F,  # share of the ok requests whose finish_reason is "length"
    "identical_to_baseline": _F,  # share of requests token-identical to the baseline arm
    "power_w_mean": _F, "energy_j": _F, "tokens_per_joule": _F, "peak_mem_mib": _F,
    "kv_pool_tokens": _I,
    "max_concurrency": _F,  # the engine's "Maximum concurrency ... 3.01x"
    "counters_consistent": _B, "warnings": pl.List(_S),
    # the engine's own latency histograms over the cell, means in ms (harness/engine_latency)
    "engine_queue_ms": _F, "engine_prefill_ms": _F, "engine_decode_ms": _F,
    "engine_ttft_ms": _F, "engine_itl_ms": _F, "engine_e2e_ms": _F,
    "engine_busy_share": _F,  # SGLang: forward-pass seconds over the cell's wall time
    # the device's busy share over the cell (harness/power.py): NVML utilization on a GPU,
    # the engine's CPU share on the CPU; its source says which
    "busy_share": _F, "busy_source": _S,
}

REQUEST_SCHEMA: dict[str, pl.DataType] = {
    "cell_id": _S, "attempt": _I, "request_idx": _I, "prompt_id": _S, "seed": _I,
    "ttft_s": _F, "e2e_s": _F, "prompt_tokens": _I,
    "completion_tokens": _I, "text": _S, "token_ids": pl.List(_I), "finish_reason": _S,
    "error": _S, "gsm8k_strict": _B, "gsm8k_flexible": _B,
    # the stream's token-carrying chunks: each one's arrival in µs after the one before (the
    # first's after the request was sent) and its tokens (per-token gaps:
    # metrics.token_gaps_s)
    "chunk_gap_us": pl.List(pl.Int32), "chunk_tokens": pl.List(pl.Int32),
}

# Columns added after stores were written: a file without one reads it as null.
ADDED_COLUMNS = {"itl_request_mean_ms",  # the peers' inter-token latency
                 "session_id",  # 2026-12-02: files named it before rows did (files.read_rows)
                 # 2026-12-02: the engines' own latency histograms (harness/engine_latency)
                 "engine_queue_ms", "engine_prefill_ms", "engine_decode_ms", "engine_ttft_ms",
                 "engine_itl_ms", "engine_e2e_ms", "engine_busy_share",
                 "busy_share", "busy_source"}  # 2026-12-04: the host-bound rule

# requests cut at max_tokens; a file without it reads null and the analysis
# derives it from the stored requests (analysis/text_quality.with_length_share)
ADDED_COLUMNS |= {"length_share"}

# The column requests files stored before 2026-12-02 in place of chunk_gap_us and
# chunk_tokens: per-token gaps, float seconds (files.read_rows reads them as chunks).
LEGACY_ITL = "itl_s"

# Columns a row must give; every other column defaults to null ([] for warnings).
CELL_REQUIRED = ("cell_id", "attempt", "status")
REQUEST_REQUIRED = ("request_idx",)
DEFAULTS: dict[str, Any] = {"warnings": []}

# how each cell was timed and, for a steady window (harness/steady.py),
# what the window saw; the order cells were measured in (runner.py: repeats interleaved
# across a study's arms). Null in cells stored before: their timing was their study's mode
# and their order is their started_at.
CELL_SCHEMA |= {
    "timing": _S,  # "window" (a counter window) or "requests" (every prompt once)
    "window_start_s": _F,  # the load's start to the window's opening scrape (ramp-up)
    "window_turnovers_min": _I,  # fewest requests a stream completed inside the window
    "window_requests": _I,  # requests completed inside the window, every stream
    # the engine's running and waiting requests as each edge scrape read them
    "window_running_start": _I, "window_running_end": _I,
    "window_waiting_start": _I, "window_waiting_end": _I,
    "window_all_busy": _B,  # every stream busy over the window (steady.window_fields)
    "round": _I,  # the pass over the study's arms (A B C, A B C): its repeat's round
    "sequence": _I,  # the cell's position among the cells its command measured, from 0
    "launch": _I,  # which engine start of its command served it, from 0
}
REQUEST_SCHEMA |= {"stream": _I}  # the load generator's worker that sent it
ADDED_COLUMNS |= {"timing", "window_start_s", "window_turnovers_min", "window_requests",
                  "window_running_start", "window_running_end", "window_waiting_start",
                  "window_waiting_end", "window_all_busy", "round", "sequence", "launch",
                  "stream"}

# a cell measured once for several studies of one command (harness/shared_cells.py):
# `<study>/<cell_id>` of the attempt measured, on the copies filed under the other studies
CELL_SCHEMA |= {"shared_from": _S}
ADDED_COLUMNS |= {"shared_from"}
