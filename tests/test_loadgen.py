"""The load generator: per-token ITL from multi-token chunks, request bodies, failures
recorded, and live requests against the embedded server."""

from __future__ import annotations

import socket

import pytest

from specrepro.harness import engine_http, engines, promtext
from specrepro.harness.loadgen import (
    LoadConfig,
    StreamTimer,
    request_body,
    request_seed,
    run_load,
)
from specrepro.harness.records import RequestRecord
from specrepro.metrics import token_gaps_s
from specrepro.workloads import Prompt

CHAT = Prompt(id="p0", workload="essays", max_tokens=24,
              messages=[{"role": "user", "content": "Write about rivers."}])
TEXT = Prompt(id="p1", workload="gsm8k", max_tokens=24, text="Question: 1+1?\nAnswer:",
              stop=("Question:",))


def chunk(ids, usage_total, text="x", finish=None):
    return {"choices": [{"index": 0, "delta": {"content": text}, "token_ids": ids,
                         "finish_reason": finish}],
            "usage": {"prompt_tokens": 5, "completion_tokens": usage_total}}


def test_multi_token_chunk_splits_its_gap_over_its_tokens():
    r = RequestRecord(0, "p", 1, started=10.0)
    timer = StreamTimer(r)
    timer.chunk({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
                 "usage": {"prompt_tokens": 5, "completion_tokens": 0}}, 10.1)
    timer.chunk(chunk([7], 1), 10.5)  # first token: TTFT 0.5 s
    timer.chunk(chunk([8, 9, 10], 4), 10.8)  # a speculative step: 3 tokens after 0.3 s
    timer.chunk(chunk([11], 5, finish="length"), 11.0)
    timer.chunk({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 5}}, 11.0)
    timer.finish(11.1)
    assert r.ttft_s == pytest.approx(0.5)
    assert r.itl_s == pytest.approx([0.1, 0.1, 0.1, 0.2])
    assert len(r.itl_s) == r.completion_tokens - 1 == 4
    assert r.token_ids == [7, 8, 9, 10, 11] and r.finish_reason == "length"
    assert r.e2e_s == pytest.approx(1.1) and r.prompt_tokens == 5
    # stored as measured: the chunks' arrivals after one another, in µs, and their tokens,
    # from which the per-token gaps come back
    row = r.row()
    assert row["chunk_gap_us"] == [500_000, 300_000, 200_000] and row["chunk_tokens"] == [1, 3, 1]
    assert "itl_s" not in row
    assert token_gaps_s(row["chunk_gap_us"], row["chunk_tokens"]) == pytest.approx(r.itl_s)


def test_chunk_size_from_token_ids_without_continuous_usage():
    r = RequestRecord(0, "p", 1, started=0.0)
    timer = StreamTimer(r)
    for t, ids in ((1.0, [1, 2]), (1.4, [3, 4])):
        timer.chunk({"choices": [{"index": 0, "text": "ab", "token_ids": ids,
                                  "finish_reason": None}]}, t)
    timer.finish(1.5)
    assert r.ttft_s == 1.0 and r.itl_s == pytest.approx([0.0, 0.2, 0.2])
    assert r.completion_tokens == 4


def test_error_event_in_stream_is_recorded():
    r = RequestRecord(0, "p", 1, started=0.0)
    StreamTimer(r).chunk({"error": {"message": "engine failed", "code": 500}}, 1.0)
    assert r.error == "engine failed"


def test_request_bodies_follow_each_engine():
    cfg = LoadConfig(url="http://x", model="m", temperature=0.7, top_k=20, seed=3,
                     reasoning_effort="low", features=engines.engine("vllm").request_features)
    path, body = request_body(CHAT, cfg, 11)
    assert path == "/v1/chat/completions" and body["max_completion_tokens"] == 24
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["return_token_ids"] and "ignore_eos" not in body
    assert body["seed"] == 11 and body["reasoning_effort"] == "low" and body["top_k"] == 20
    path, body = request_body(TEXT, LoadConfig(url="http://x", model="m",
                                               features=engines.engine("sglang").request_features,
                                               ignore_eos=True, thinking=False,
                                               extra_body={"return_spec_tokens_details": True}),
                              1)
    assert path == "/v1/completions" and body["max_tokens"] == 24  # never the default 16
    assert body["stop"] == ["Question:"] and body["ignore_eos"] is True
    assert "return_token_ids" not in body and body["return_spec_tokens_details"] is True
    # a server that is neither engine gets the standard OpenAI fields only
    generic = engines.engine("generic").request_features
    path, body = request_body(TEXT, LoadConfig(url="http://x", model="m", features=generic), 1)
    assert body["stream_options"] == {"include_usage": True} and "return_token_ids" not in body


def test_request_seeds_are_deterministic_and_distinct():
    assert request_seed(1000, 3) == request_seed(1000, 3)
    seeds = {request_seed(s, i) for s in (1000, 1001) for i in range(50)}
    assert len(seeds) == 100


def test_unreachable_engine_is_recorded_not_raised():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens
    res = run_load([CHAT, CHAT], LoadConfig(url=f"http://127.0.0.1:{port}", model="m",
                                            concurrency=2, request_timeout_s=5))
    assert len(res.records) == 2 and all(r.error for r in res.records)


def test_live_stream_counts_match_usage_and_counters(embedded_server):
    model = engine_http.http_json(f"{embedded_server}/v1/models")["data"][0]["id"]
    prompts = [Prompt(id=f"p{i}", workload="essays", max_tokens=20,
                      messages=[{"role": "user", "content": f"Essay {i}"}]) for i in range(3)]
    cfg = LoadConfig(url=embedded_server, model=model, concurrency=2, warmup=1, seed=7,
                     features=engines.engine("embedded").request_features)
    res = run_load(prompts, cfg, lambda: engine_http.http_get(f"{embedded_server}/metrics")[1].decode())
    assert sorted(r.request_idx for r in res.records) == [0, 1, 2]
    for r in res.records:
        assert r.error is None, r.error
        assert r.completion_tokens == len(r.token_ids) == len(r.itl_s) + 1
        assert r.ttft_s > 0 and r.e2e_s >= r.ttft_s
        assert r.seed == request_seed(7, r.request_idx)
    d = promtext.delta(promtext.parse(res.before, engines.engine("embedded").metrics),
                       promtext.parse(res.after, engines.engine("embedded").metrics))
    # the warm-up request ran before the first scrape, so the counters see only these three
    assert d.generation_tokens == sum(r.completion_tokens for r in res.records)
    assert d.prompt_tokens == sum(r.prompt_tokens for r in res.records)


def test_bad_request_is_recorded(embedded_server):
    res = run_load([CHAT], LoadConfig(url=embedded_server, model="no-such-model",
                                      features=engines.engine("embedded").request_features))
    (r,) = res.records
    assert r.error.startswith("HTTP 400") and "no-such-model" in r.error
