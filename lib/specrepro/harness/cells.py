"""A cell's figures: the cells row and the requests rows, from what one measured cell left.

Design:
- Input: the load generator's records (one per request: timings, tokens, text, the
  engine's per-response fields), the `/metrics` scrapes it took before and after the
  measured load (and as a steady window opened and closed), the power sampler's report
  and the engine's startup facts. Output: one row of the `cells` table (`cell_row`) and the
  rows of `requests` (`request_rows`). Every figure comes from `metrics.py`; nothing is
  re-derived here.
- Acceptance (`acceptance`): the counts come from the engine's adapter
  (harness/engines/: the counter deltas in vLLM's names by default, SGLang's per-response
  fields or counters, the transformers peer's own counts); the figures from metrics.py.
  What an engine does not count is None with a warning, never a zero.
- Latency (`latency_fields`): TTFT and end-to-end percentiles, and inter-token latency two
  ways, each named: `itl_p50_ms`, the token-weighted median of per-token gaps (a chunk of m
  tokens gives m gaps of gap/m), and `itl_request_mean_ms`, the per-request mean that
  guidellm and `vllm bench serve` report (metrics.request_mean_itl_s). Beside them, the
  engine's own histograms over the same scrapes (`engine_*_ms`, harness/engine_latency.py):
  queue, prefill, decode, TTFT, ITL and end to end as the engine stamped them.
- Timing (`timing_fields`): a cell the study's `window:` covers is read over its steady
  window (counters from the window's opening scrape to its closing one, harness/steady.py,
  which also says whether every stream was busy), and its client latencies over the
  requests sent and answered inside the window (`steady.inside`); every other cell sends
  every prompt once and is read over the whole load (`requests`).
- Counter deltas that do not match the tokens the client saw (another client's traffic, a
  restart) set `counters_consistent=False` with a warning (`consistency`); `/metrics`
  missing leaves what it feeds empty, with a warning naming the URL and those
  measurements (`counters_delta`, the adapter's `MetricNames.lost_without`).
- Quality: GSM8K strict/flexible per request on the very outputs that were timed
  (`grade`), the repeated-4-gram share, the share of requests that ended at max_tokens
  (`length_share`: text the model never finished), and the share of outputs identical to
  the baseline arm's on the same prompt and seed (`identical_share`, the lossless check).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from specrepro import metrics
from specrepro.grading import grade_gsm8k
from specrepro.harness import engine_latency, power, promtext, steady
from specrepro.harness.engines.base import EngineAdapter
from specrepro.harness.records import LoadResult, RequestRecord
from specrepro.harness.startup_log import StartupInfo
from specrepro.params import Cell, ResolvedStudy
from specrepro.workloads import Prompt

if TYPE_CHECKING:  # the store (polars) only where a cell is stored: the acceptance readers
    # run on a GPU machine whose image lacks polars (scripts/bench_standin.py)
    from specrepro.harness.arm_engine import ArmEngine
    from specrepro.store import ResultStore


# ---------------------------------------------------------------------- acceptance


SGLANG_NATIVE_SPEED = ("requests sent to SGLang's native /generate (profile api: native): "
                       "its latency and throughput lack the OpenAI layer and are not those "
                       "of the OpenAI routes")


def acceptance(delta: promtext.SpecCounters | None, records: Sequence[RequestRecord],
               adapter: EngineAdapter, warnings: list[str] | None = None,
               k: int | None = None) -> dict:
    """Acceptance counters and figures of a cell, the counts from the engine's adapter
    (`EngineAdapter.acceptance`). k: the drafts per step, so positions no step ever
    accepted count as measured zeros."""
    warnings = [] if warnings is None else warnings
    c = adapter.acceptance(delta, records, warnings, k)
    drafts, draft_tokens, accepted, per_pos = c if c is not None else (None,) * 4
    return {"num_drafts": drafts, "num_draft_tokens": draft_tokens,
            "num_accepted_tokens": accepted,
            "acceptance_length": metrics.acceptance_length(accepted, drafts),
            "draft_acceptance_rate": metrics.draft_acceptance_rate(accepted, draft_tokens),
            "per_position_acceptance": metrics.per_position_acceptance(per_pos, drafts)}


def counters_delta(result: LoadResult, adapter: EngineAdapter, end: str, warnings: list[str],
                   url: str | None = None, begin: str = "before"
                   ) -> promtext.SpecCounters | None:
    """`begin` ('before', or 'start': a steady window's opening) → `end` ('after' or
    'window') as a SpecCounters delta; None with a warning naming the URL and what is lost."""
    names = adapter.metrics
    if names is None:  # an engine without /metrics (the in-process peer)
        return None
    before, after = getattr(result, begin), getattr(result, end)
    if before is None or after is None:
        where = f"{url}/metrics" if url else "/metrics"
        msg = (f"{where} did not answer: not measured: "
               f"{names.lost_without}")
        if msg not in warnings:
            warnings.append(msg)
        return None
    try:
        return promtext.delta(promtext.parse(before, names), promtext.parse(after, names))
    except promtext.CounterReset as err:
        warnings.append(str(err))
        return None


def consistency(delta: promtext.SpecCounters | None, records: Sequence[RequestRecord],
                warnings: list[str]) -> bool | None:
    """Do the engine's token counters moved by exactly what this client sent and received?"""
    if delta is None or delta.generation_tokens is None:
        return None
    sent_out = sum(r.completion_tokens or 0 for r in records)
    sent_in = sum(r.prompt_tokens or 0 for r in records)
    ok = delta.generation_tokens == sent_out
    if delta.prompt_tokens is not None:
        ok = ok and delta.prompt_tokens == sent_in
    if not ok:
        warnings.append(
            f"engine counters moved by {delta.generation_tokens:g} generated / "
            f"{delta.prompt_tokens} prompt tokens, the client saw {sent_out} / {sent_in}: "
            "another client's traffic, a restart, or failed requests")
    return ok


# ------------------------------------------------------------------ outputs


def latency_fields(records: Sequence[RequestRecord]) -> dict:
    """TTFT and e2e percentiles and inter-token latency both ways (module docstring)."""
    ok = [r for r in records if r.ok]
    ttft = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
    itl = [x * 1000 for r in ok for x in r.itl_s]
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    mean_s = metrics.request_mean_itl_s([(r.itl_s, r.completion_tokens) for r in ok])
    return {"ttft_p50_ms": metrics.percentile(ttft, 50), "ttft_p95_ms": metrics.percentile(ttft, 95),
            "itl_p50_ms": metrics.percentile(itl, 50),
            "itl_request_mean_ms": None if mean_s is None else 1000 * mean_s,
            "e2e_p50_s": metrics.percentile(e2e, 50)}


def grade(records: Sequence[RequestRecord], prompts: dict[str, Prompt]) -> dict[int, dict]:
    """GSM8K strict/flexible per request (the very outputs that were timed)."""
    out = {}
    for r in records:
        p = prompts.get(r.prompt_id)
        if r.ok and p is not None and p.workload == "gsm8k" and p.reference:
            g = grade_gsm8k(r.text, p.reference)
            out[r.request_idx] = {"gsm8k_strict": g["strict"], "gsm8k_flexible": g["flexible"]}
    return out


def repetition(records: Sequence[RequestRecord]) -> float | None:
    """Repeated-4-gram share of the outputs: token ids where every output has them, else words."""
    ok = [r for r in records if r.ok]
    if ok and all(r.token_ids is not None for r in ok):
        return metrics.pooled_repeated_ngram_share([r.token_ids for r in ok], 4)
    return metrics.pooled_repeated_ngram_share([metrics.words(r.text) for r in ok], 4)


def identical_share(records: Sequence[RequestRecord], baseline) -> float | None:
    """Share of requests whose output equals the baseline arm's on the same prompt and seed:
    token ids where both have them (the lossless check), else text."""
    if baseline is None or baseline.height == 0:
        return None
    base = {(row["prompt_id"], row["seed"]): row for row in baseline.iter_rows(named=True)
            if row["error"] is None}
    same = total = 0
    for r in records:
        b = base.get((r.prompt_id, r.seed))
        if not r.ok or b is None:
            continue
        total += 1
        if r.token_ids is not None and b["token_ids"] is not None:
            same += list(r.token_ids) == list(b["token_ids"])
        else:
            same += r.text == b["text"]
    return same / total if total else None


def baseline_requests(store: ResultStore, study: ResolvedStudy, cell: Cell):
    """The baseline arm's requests for the same workload, concurrency, sampling, repeat, seed."""
    if study.baseline is None or study.baseline == cell.arm.name:
        return None
    import polars as pl

    cells = store.load_cells()
    s = cell.sampling
    hit = cells.filter((pl.col("arm") == study.baseline)
                       & (pl.col("workload") == cell.workload.name)
                       & (pl.col("concurrency") == cell.concurrency)
                       & (pl.col("temperature") == s.temperature) & (pl.col("top_p") == s.top_p)
                       & (pl.col("top_k") == s.top_k) & (pl.col("repeat") == cell.repeat)
                       & (pl.col("seed") == cell.seed))
    if hit.height == 0:
        return None
    last = hit.sort("ended_at").tail(1).row(0, named=True)
    reqs = store.load_requests()
    return reqs.filter((pl.col("cell_id") == last["cell_id"])
                       & (pl.col("attempt") == last["attempt"]))


def gsm8k_fields(grades: dict[int, dict]) -> dict:
    if not grades:
        return {"gsm8k_strict_correct": None, "gsm8k_flexible_correct": None, "gsm8k_n": None}
    return {"gsm8k_strict_correct": sum(g["gsm8k_strict"] for g in grades.values()),
            "gsm8k_flexible_correct": sum(g["gsm8k_flexible"] for g in grades.values()),
            "gsm8k_n": len(grades)}


# ---------------------------------------------------------------------- rows


def cell_row(study: ResolvedStudy, cell: Cell, eng: ArmEngine, result: LoadResult,
             report: power.PowerReport, warnings: list[str]) -> dict:
    """Every figure of the cells row, from the measured records, counters and power."""
    p, records = eng.profile, result.records
    ok = [r for r in records if r.ok]
    window = study.windowed(cell)  # a steady window, else every prompt once
    url = eng.handle.url if eng.handle is not None else None
    begin = "start" if window else "before"
    delta = counters_delta(result, eng.adapter, "window" if window else "after", warnings, url,
                           begin)
    full = counters_delta(result, eng.adapter, "after", warnings, url) if window else delta
    output_tokens = sum(r.completion_tokens or 0 for r in ok)
    if window:  # the decode rate over the window: the engine's counter, else what arrived
        output_tokens = (int(delta.generation_tokens) if delta is not None
                         and delta.generation_tokens is not None else result.tokens_in_span())
    agg = metrics.agg_tok_s(output_tokens, result.wall_s)
    per_stream = metrics.per_stream_tok_s(agg, cell.concurrency)
    if getattr(p, "api", "openai") == "native" and SGLANG_NATIVE_SPEED not in warnings:
        warnings.append(SGLANG_NATIVE_SPEED)
    spec = p.speculative
    acc = acceptance(delta, records, eng.adapter, warnings,
                     spec.num_speculative_tokens if spec else None)
    # a step of autoregressive decoding yields one token: its step time needs no counters
    step_len = 1.0 if p.method == "none" else acc["acceptance_length"]
    handle = eng.handle
    startup = handle.startup if handle is not None else StartupInfo()
    kv_pool = startup.kv_pool_tokens
    if kv_pool is None and delta is not None and delta.kv_pool_tokens is not None:
        kv_pool = int(delta.kv_pool_tokens)
    return {
        "arm": cell.arm.name, "profile": p.name,
        "engine": (handle.attached or p.engine) if handle is not None else p.engine,
        "engine_version": eng.version, "method": p.method,
        "num_speculative_tokens": spec.num_speculative_tokens if spec else None,
        "schedule": (json.dumps(spec.num_speculative_tokens_per_batch_size)
                     if spec and spec.num_speculative_tokens_per_batch_size else None),
        "workload": cell.workload.name, "n_prompts": cell.workload.n,
        "concurrency": cell.concurrency, "temperature": cell.sampling.temperature,
        "top_p": cell.sampling.top_p, "top_k": cell.sampling.top_k, "repeat": cell.repeat,
        "seed": cell.seed, "ignore_eos": study.ignore_eos,
        "n_requests": len(records), "n_errors": len(records) - len(ok),
        "prompt_tokens": sum(r.prompt_tokens or 0 for r in ok), "output_tokens": output_tokens,
        "wall_s": result.wall_s, "agg_tok_s": agg, "per_stream_tok_s": per_stream,
        **latency_fields(steady.inside(records, result.span) if window and result.span
                         else records), **acc,
        **engine_latency.fields(getattr(result, begin),
                                getattr(result, "window" if window else "after"),
                                eng.adapter.metrics, result.wall_s),
        "step_ms": metrics.step_ms(step_len, per_stream),
        "repeated_4gram_share": repetition(records),
        "length_share": metrics.length_share([r.finish_reason for r in ok]),
        "power_w_mean": report.power_w_mean, "energy_j": report.energy_j,
        "busy_share": report.busy_share, "busy_source": report.busy_source,
        "tokens_per_joule": metrics.tokens_per_joule(output_tokens, report.energy_j),
        "peak_mem_mib": report.peak_mem_mib if report.peak_mem_mib is not None
        else report.peak_rss_mib,
        "kv_pool_tokens": kv_pool, "max_concurrency": startup.max_concurrency,
        "counters_consistent": consistency(full, records, warnings),
        **timing_fields(study, cell, eng.adapter, result, warnings),
    }


def timing_fields(study: ResolvedStudy, cell: Cell, adapter: EngineAdapter, result: LoadResult,
                  warnings: list[str]) -> dict:
    """How the cell was timed (`timing`: window or requests) and, for a steady window, what
    it saw (harness/steady.py); a cell that ended before its window closed has none."""
    if not study.windowed(cell):
        return {"timing": "requests", **steady.NOT_WINDOWED}
    if result.start_at is None or result.end_at is None:
        return {"timing": "window", **steady.NOT_WINDOWED}
    names = adapter.metrics
    return steady.window_fields(result, cell.concurrency, study.window,
                                steady.gauges(_parsed(result.start, names)),
                                steady.gauges(_parsed(result.window, names)), warnings)


def _parsed(text: str | None, names: promtext.MetricNames | None
           ) -> promtext.SpecCounters | None:
    """One scrape's snapshot, or None (no text, an engine without metrics, unparsable)."""
    if text is None or names is None:
        return None
    try:
        return promtext.parse(text, names)
    except ValueError:
        return None


def request_rows(records: Sequence[RequestRecord], grades: dict[int, dict]) -> list[dict]:
    return [{**r.row(), **grades.get(r.request_idx, {})}
            for r in sorted(records, key=lambda r: r.request_idx)]
