"""A cell's figures (harness/cells.py): latency as the peers define it, and SGLang's
acceptance as SGLang 0.5.14 gives it, on what the engines returned on an H200
(tests/fixtures/engines).

The peers' inter-token latency is re-derived here from their sources, on the same
recorded requests the harness measures:
- `vllm bench serve` (vLLM 0.26.0 wheel): ttft is the first chunk with choices, latency the
  last one (vllm/benchmarks/lib/endpoint_request_func.py:231-257); per request TPOT =
  (latency − ttft) / (output_len − 1) (vllm/benchmarks/serve.py:607-611); reported as the
  mean over requests (serve.py:742).
- guidellm 0.8.1: per request ITL = (last token − first token) / (output_tokens − 1)
  (guidellm/schemas/base/request_stats.py:337-354), first and last token being the first
  and last content chunk (guidellm/backends/openai/http.py:378-393); its distribution
  weights each request by output_tokens − 1 (guidellm/benchmark/schemas/metrics.py:
  1466-1470), so its mean is Σ(last − first) / Σ(output_tokens − 1).
"""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import polars as pl
import pytest

from specrepro.harness import engines
from specrepro.harness.cells import acceptance, counters_delta, latency_fields
from specrepro.harness.engines.sglang import NOT_COUNTED, sglang_counts
from specrepro.harness.loadgen import StreamTimer
from specrepro.harness.records import LoadResult, RequestRecord
from specrepro.store import CELL_REQUIRED, CELL_SCHEMA, frame, load_attempts, normalize

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "engines"
SGLANG = FIXTURES / "sglang-0.5.14"
START = 1000.0
TAIL_S = 0.030  # the usage chunk and [DONE] after the last token: in e2e, in no ITL


def streamed(idx: int, chunks: list[tuple[float, int]], per_chunk_usage: bool = True
             ) -> tuple[RequestRecord, list[float]]:
    """A request streamed as vLLM streams it: (seconds after send, tokens) per chunk, the
    finish reason on the last, then a usage-only chunk (choices: []) and the end. Returns
    the record and the arrival times of its chunks with choices (what the peers time)."""
    r = RequestRecord(idx, f"p{idx}", 0)
    r.started = START
    timer, total, arrivals = StreamTimer(r), 0, []
    for i, (at, m) in enumerate(chunks):
        total += m
        body = {"choices": [{"text": "w" * m,
                             "finish_reason": "length" if i == len(chunks) - 1 else None}]}
        if per_chunk_usage:
            body["usage"] = {"prompt_tokens": 7, "completion_tokens": total}
        timer.chunk(body, START + at)
        arrivals.append(at)
    end = chunks[-1][0] + TAIL_S
    timer.chunk({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": total}},
                START + end)
    timer.finish(START + end)
    return r, arrivals


def vllm_bench_serve_mean_tpot_ms(timed: list[tuple[list[float], int]]) -> float:
    tpots = [(arr[-1] - arr[0]) / (n - 1) for arr, n in timed if n > 1]
    return 1000 * sum(tpots) / len(tpots)


def guidellm_itl_ms(timed: list[tuple[list[float], int]]) -> tuple[list[float], float]:
    """(per-request ITL, the weighted mean guidellm reports)."""
    per = [1000 * (arr[-1] - arr[0]) / (n - 1) for arr, n in timed]
    weights = [n - 1 for _, n in timed]
    return per, sum(p * w for p, w in zip(per, weights)) / sum(weights)


# A speculative engine's stream: a step of 4 ms yields 1 to 4 tokens in one chunk.
SAME_LENGTH = [
    [(0.050, 1), (0.054, 4), (0.058, 1), (0.062, 3), (0.066, 4), (0.070, 2), (0.074, 1)],
    [(0.041, 1), (0.045, 2), (0.049, 4), (0.053, 4), (0.057, 4), (0.061, 1)],
    [(0.060, 2), (0.064, 1), (0.068, 1), (0.072, 4), (0.076, 4), (0.080, 3), (0.084, 1)],
]


def test_itl_both_ways_held_to_the_peers_formulas():
    made = [streamed(i, c) for i, c in enumerate(SAME_LENGTH)]
    records = [r for r, _ in made]
    timed = [(arr, r.completion_tokens) for r, arr in made]
    assert {r.completion_tokens for r in records} == {16}
    fields = latency_fields(records)
    # the peers' figure: vLLM's mean TPOT, and guidellm's mean (equal at one length)
    per_request, guidellm_mean = guidellm_itl_ms(timed)
    assert fields["itl_request_mean_ms"] == pytest.approx(vllm_bench_serve_mean_tpot_ms(timed))
    assert fields["itl_request_mean_ms"] == pytest.approx(guidellm_mean)
    assert fields["itl_request_mean_ms"] == pytest.approx(statistics.mean(per_request))
    # the suite's other figure: the median of per-token gaps, a chunk of m tokens giving m
    # gaps of gap / m and the first chunk's extra tokens 0
    gaps = []
    for chunks in SAME_LENGTH:
        gaps += [0.0] * (chunks[0][1] - 1)
        for (prev, _), (at, m) in itertools.pairwise(chunks):
            gaps += [1000 * (at - prev) / m] * m
    assert fields["itl_p50_ms"] == pytest.approx(statistics.median(gaps))
    assert fields["itl_p50_ms"] < fields["itl_request_mean_ms"]  # why both are kept


def test_itl_mean_is_per_request_where_lengths_differ():
    """vLLM's mean counts each request once, guidellm's weights it by its tokens: the
    harness reports vLLM's, and says so (metrics.request_mean_itl_s)."""
    short = [(0.050, 1), (0.060, 1), (0.070, 1), (0.080, 1)]  # 10 ms a token
    long = [(0.050, 1)] + [(0.050 + 0.004 * i, 3) for i in range(1, 11)]  # 1.33 ms a token
    made = [streamed(0, short), streamed(1, long)]
    timed = [(arr, r.completion_tokens) for r, arr in made]
    mean = latency_fields([r for r, _ in made])["itl_request_mean_ms"]
    assert mean == pytest.approx(vllm_bench_serve_mean_tpot_ms(timed))
    assert mean == pytest.approx((10 + 40 / 30) / 2)
    assert mean != pytest.approx(guidellm_itl_ms(timed)[1])


def test_itl_mean_counts_the_servers_tokens_not_the_chunks():
    """Without per-chunk usage (SGLang unless asked) each chunk counts as one token for the
    gaps, but the peers divide by the output's token count, from the final usage."""
    made = [streamed(i, c, per_chunk_usage=False) for i, c in enumerate(SAME_LENGTH)]
    records = [r for r, _ in made]
    assert all(len(r.itl_s) == len(c) - 1 for r, c in zip(records, SAME_LENGTH))
    timed = [(arr, r.completion_tokens) for r, arr in made]
    assert latency_fields(records)["itl_request_mean_ms"] == pytest.approx(
        vllm_bench_serve_mean_tpot_ms(timed))


def test_failed_and_one_token_requests_give_no_itl():
    one, _ = streamed(0, [(0.05, 1)])
    failed, _ = streamed(1, SAME_LENGTH[0])
    failed.error = "HTTP 500 from /v1/completions: boom"
    assert latency_fields([one, failed])["itl_request_mean_ms"] is None


# ------------------------------------------------------------------ SGLang acceptance


def meta_info() -> list[dict]:
    return json.loads((SGLANG / "dflash_light.generate-meta_info.json").read_text())


def test_sglang_native_meta_info_counts():
    """The three /generate responses of SGLang 0.5.14 with the light block drafter (k = 7):
    hist[j] counts steps with j correct drafts, so position i was kept in Σ_{j>i} hist[j]
    steps, and the positions add up to the correct drafts SGLang itself counted."""
    details = meta_info()
    drafts, proposed, correct, per_pos = sglang_counts(details, k=7)
    assert (drafts, proposed, correct) == (79, 553, 114)
    assert len(per_pos) == 7 and sum(per_pos) == correct
    assert per_pos[0] == sum(sum(d["spec_correct_drafts_histogram"][1:]) for d in details)
    assert per_pos[-1] == 2  # two steps kept all seven
    # a histogram grows only to the most drafts a step kept: this one never passed 3, so
    # positions 4-7 are measured zeros, which only k can tell
    short = [d for d in details if len(d["spec_correct_drafts_histogram"]) == 4]
    assert sglang_counts(short)[3] == [19, 5, 2]
    assert sglang_counts(short, k=7)[3] == [19, 5, 2, 0, 0, 0, 0]


def test_sglang_0_5_14_acceptance_from_its_counters():
    """Its OpenAI responses carry no acceptance: tokens per step from the counters, and
    what it does not count is None with the reason, never 0."""
    result = LoadResult([], 1.0, (SGLANG / "dflash_light.metrics-before.txt").read_text(),
                        after=(SGLANG / "dflash_light.metrics-after.txt").read_text())
    warnings: list[str] = []
    delta = counters_delta(result, engines.engine("sglang"), "after", warnings)
    records = [RequestRecord(i, f"p{i}", 0) for i in range(6)]  # no per-response fields
    acc = acceptance(delta, records, engines.engine("sglang"), warnings, k=7)
    assert acc["num_drafts"] == 158 and acc["num_accepted_tokens"] == 384 - 158 - 6
    assert acc["acceptance_length"] == pytest.approx(1 + 220 / 158)
    assert acc["num_draft_tokens"] is None and acc["draft_acceptance_rate"] is None
    assert acc["per_position_acceptance"] is None
    assert any(NOT_COUNTED in w for w in warnings) and any("low bound" in w for w in warnings)
    # against what SGLang counted per request on the native API for the same prompts
    drafts, _, correct, _ = sglang_counts(meta_info())
    assert acc["acceptance_length"] == pytest.approx(1 + correct / drafts, rel=0.05)
    assert acc["acceptance_length"] <= 1 + correct / drafts  # a low bound


def test_sglang_per_response_fields_only_when_every_response_has_them():
    """0.5.23's sglext.spec_tokens_details carries meta_info's fields (docs/engines.md)."""
    full = []
    for i, d in enumerate(meta_info()):
        r = RequestRecord(i, f"p{i}", 0)
        r.spec = {"sglext": {"spec_tokens_details": d}}
        full.append(r)
    acc = acceptance(None, full, engines.engine("sglang"), k=7)
    assert acc["num_drafts"] == 79 and sum(acc["per_position_acceptance"]) == pytest.approx(
        114 / 79)
    warnings: list[str] = []
    partial = acceptance(None, [*full, RequestRecord(3, "p3", 0)], engines.engine("sglang"),
                         warnings)
    assert partial["num_drafts"] is None and partial["acceptance_length"] is None
    assert "3 of 4 SGLang responses carried per-request acceptance fields" in warnings[0]


def test_missing_metrics_names_the_url_and_the_lost_figures():
    warnings: list[str] = []
    assert counters_delta(LoadResult([], 1.0), engines.engine("vllm"), "after", warnings,
                          "http://127.0.0.1:8000") is None
    assert warnings == [(f"http://127.0.0.1:8000/metrics did not answer: not measured: "
                         f"{engines.engine('vllm').metrics.lost_without}")]
    assert "per_position_acceptance" in warnings[0]


# ------------------------------------------------------------------ the new column


def test_a_store_written_before_the_new_column_reads_it_as_null(tmp_path):
    row = normalize({"cell_id": "0123456789abcdef", "attempt": 1, "status": "ok",
                     "study": "s", "run_id": "r", "itl_p50_ms": 4.5},
                    CELL_SCHEMA, CELL_REQUIRED, "test row")
    old = frame([row], CELL_SCHEMA).drop("itl_request_mean_ms")
    cells = tmp_path / "s" / "r" / "cells"
    cells.mkdir(parents=True)
    old.write_parquet(cells / "0123456789abcdef-a001.parquet")
    got = load_attempts(tmp_path)
    assert got.schema == pl.Schema(CELL_SCHEMA)
    assert got["itl_request_mean_ms"].to_list() == [None] and got["itl_p50_ms"][0] == 4.5
