"""Prometheus text of vLLM and SGLang (the engines' own metric names) → counters: texts in
vLLM 0.33.0's and SGLang 0.5.23's names, and the /metrics vLLM 0.26.0 and SGLang 0.5.14
served on an H200 (tests/fixtures/engines)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specrepro.harness import engines, promtext
from specrepro.harness.engines.base import EngineError
from specrepro.harness.promtext import CounterReset, delta
from specrepro.metrics import acceptance_length, per_position_acceptance

# Two engine cores (DP=2) of vLLM, as prometheus_client writes them: HELP/TYPE per
# family, counters with _total and a _created twin, every sample labelled.
VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 3.0
vllm:num_requests_running{engine="1",model_name="qwen"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 1.0
vllm:num_requests_waiting{engine="1",model_name="qwen"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="qwen"} 0.15
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="1664",cache_dtype="auto",engine="0",kv_cache_size_tokens="1146396",model_name="qwen",num_gpu_blocks="689"} 1.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="qwen"} 1000.0
vllm:prompt_tokens_total{engine="1",model_name="qwen"} 500.0
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0",model_name="qwen"} 1.7e+09
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="qwen"} 2000.0
vllm:generation_tokens_total{engine="1",model_name="qwen"} 1000.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="qwen"} 7.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="qwen"} 2.0
vllm:request_success_total{engine="1",finished_reason="stop",model_name="qwen"} 1.0
vllm:request_success_total{engine="1",finished_reason="abort",model_name="qwen"} 0.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="qwen"} 0.0
# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="qwen"} 5.0
vllm:iteration_tokens_total_bucket{engine="0",le="8.0",model_name="qwen"} 90.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="qwen"} 100.0
vllm:iteration_tokens_total_count{engine="0",model_name="qwen"} 100.0
vllm:iteration_tokens_total_sum{engine="0",model_name="qwen"} 640.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="qwen"} 400.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="qwen"} 100.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="qwen"} 1200.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="qwen"} 300.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="qwen"} 700.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="qwen"} 180.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="qwen",position="0"} 300.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="qwen",position="1"} 230.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="qwen",position="2"} 170.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="qwen",position="0"} 75.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="qwen",position="1"} 60.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="qwen",position="2"} 45.0
"""


def vllm_later(scale: float) -> str:
    """The same text after more traffic: every counter of engine 0 grown by `scale`."""
    out = []
    for line in VLLM_TEXT.splitlines():
        if line.startswith("vllm:") and "_total" in line and 'engine="0"' in line \
                and "iteration_tokens" not in line:
            name, value = line.rsplit(" ", 1)
            line = f"{name} {float(value) * scale}"
        out.append(line)
    return "\n".join(out) + "\n"


SGLANG_TEXT = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="qwen",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 4.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="qwen",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 2.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="qwen",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.31
# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{engine_type="unified",model_name="qwen",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 412345.0
# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{engine_type="unified",model_name="qwen",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 5.9
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{engine_type="unified",is_streaming="true",model_name="qwen",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 900.0
sglang:prompt_tokens_total{engine_type="unified",is_streaming="false",model_name="qwen",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 8.0
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{engine_type="unified",is_streaming="true",model_name="qwen",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 6000.0
sglang:generation_tokens_total{engine_type="unified",is_streaming="false",model_name="qwen",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 8.0
# HELP sglang:cached_tokens_total The number of tokens served from the prefix cache.
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",engine_type="unified",model_name="qwen",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 120.0
# HELP sglang:spec_verify_calls_total The number of verification forward calls.
# TYPE sglang:spec_verify_calls_total counter
sglang:spec_verify_calls_total{engine_type="unified",model_name="qwen",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 1000.0
"""


def parse(text: str, name: str) -> promtext.SpecCounters:
    """A scrape read with the named engine's metric names (its adapter's)."""
    return promtext.parse(text, engines.engine(name).metrics)


def test_vllm_text_sums_label_sets():
    snap = parse(VLLM_TEXT, "vllm")
    assert snap.num_drafts == 500
    assert snap.num_draft_tokens == 1500
    assert snap.num_accepted_tokens == 880
    assert snap.accepted_per_pos == (375, 290, 215)
    assert snap.generation_tokens == 3000 and snap.prompt_tokens == 1500
    assert snap.request_success == {"stop": 8, "length": 2, "abort": 0}
    assert snap.requests_finished == 10
    assert snap.requests_running == 5 and snap.requests_waiting == 1
    assert snap.kv_usage == pytest.approx(0.40)
    assert snap.kv_pool_tokens == 1146396
    assert snap.num_preemptions == 0
    assert snap.missing() == ["prompt_tokens_cached"]


def test_embedded_engine_reads_vllm_names():
    assert parse(VLLM_TEXT, "embedded").num_drafts == 500


def test_vllm_delta_gives_the_window_acceptance():
    before, after = parse(VLLM_TEXT, "vllm"), parse(vllm_later(3.0), "vllm")
    d = delta(before, after)
    # engine 0 tripled: the deltas are twice its counts
    assert d.num_drafts == 800 and d.num_draft_tokens == 2400 and d.num_accepted_tokens == 1400
    assert d.accepted_per_pos == (600, 460, 340)
    assert d.generation_tokens == 4000
    assert d.request_success == {"stop": 14, "length": 4, "abort": 0}
    assert d.requests_running == 5  # gauges keep the later value
    assert acceptance_length(d.num_accepted_tokens, d.num_drafts) == pytest.approx(2.75)
    per_pos = per_position_acceptance(d.accepted_per_pos, d.num_drafts)
    assert sum(per_pos) == pytest.approx(2.75 - 1)


def test_sglang_text():
    snap = parse(SGLANG_TEXT, "sglang")
    assert snap.spec_verify_calls == 1000
    assert snap.generation_tokens == 6008 and snap.prompt_tokens == 908
    assert snap.prompt_tokens_cached == 120
    assert snap.requests_running == 4 and snap.requests_waiting == 2
    assert snap.kv_usage == pytest.approx(0.31) and snap.kv_pool_tokens == 412345
    # no cumulative accepted-token counter in SGLang; the windowed gauge is not read
    assert snap.num_accepted_tokens is None and snap.num_drafts is None
    later = SGLANG_TEXT.replace("} 1000.0", "} 1100.0").replace("} 6000.0", "} 6650.0")
    d = delta(snap, parse(later, "sglang"))
    assert d.spec_verify_calls == 100 and d.generation_tokens == 650
    assert d.num_drafts is None


def test_missing_metrics_are_none_not_zero():
    snap = parse("", "vllm")
    assert snap.num_drafts is None and snap.accepted_per_pos is None
    assert "num_drafts" in snap.missing()
    no_spec = "\n".join(line for line in VLLM_TEXT.splitlines() if "spec_decode" not in line)
    d = delta(parse(no_spec, "vllm"), parse(no_spec, "vllm"))
    assert d.num_accepted_tokens is None and d.generation_tokens == 0


def test_counter_going_down_is_a_restart():
    with pytest.raises(CounterReset, match="spec_decode|num_drafts"):
        delta(parse(vllm_later(3.0), "vllm"), parse(VLLM_TEXT, "vllm"))


def test_new_position_counts_from_zero():
    before = "\n".join(line for line in VLLM_TEXT.splitlines() if 'position="2"' not in line)
    d = delta(parse(before, "vllm"), parse(VLLM_TEXT, "vllm"))
    assert d.accepted_per_pos == (0, 0, 215)


def test_unknown_engine_fails():
    with pytest.raises(EngineError, match="engine 'tgi': expected one of"):
        parse(VLLM_TEXT, "tgi")


# ------------------------------------------- the engines' own /metrics, captured on an H200

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "engines"


def fixture(engine: str, name: str) -> str:
    return (FIXTURES / engine / name).read_text()


def test_vllm_0_26_reads_the_total_samples_not_created():
    """vLLM 0.26.0 writes each counter as `<name>_total` with a `<name>_created` gauge
    beside it (its creation time, ~1.8e9): only the first may be read."""
    before = fixture("vllm-0.26.0", "dflash.metrics-before.txt")
    after = fixture("vllm-0.26.0", "dflash.metrics-after.txt")
    created = [line for line in after.splitlines()
               if line.startswith("vllm:spec_decode_num_drafts_created{")]
    assert created and float(created[0].rsplit(" ", 1)[1]) > 1e9  # the trap is in the text
    d = delta(parse(before, "vllm"), parse(after, "vllm"))
    assert (d.num_drafts, d.num_draft_tokens, d.num_accepted_tokens) == (63, 441, 131)
    assert d.accepted_per_pos == (42, 27, 23, 14, 12, 8, 5)  # k = 7
    assert (d.generation_tokens, d.prompt_tokens, d.prompt_tokens_cached) == (192, 63, 0)
    assert d.request_success == {"stop": 0, "length": 3, "abort": 0, "error": 0,
                                 "repetition": 0}
    assert d.kv_pool_tokens == 103312  # cache_config_info's label, as the startup log says
    assert sum(d.accepted_per_pos) == d.num_accepted_tokens
    assert acceptance_length(d.num_accepted_tokens, d.num_drafts) == pytest.approx(1 + 131 / 63)


def test_vllm_0_26_without_speculation_has_no_spec_counters():
    snap = parse(fixture("vllm-0.26.0", "none.metrics-after.txt"), "vllm")
    assert snap.num_drafts is None and snap.accepted_per_pos is None  # absent, not 0
    assert snap.generation_tokens == 192 and snap.kv_pool_tokens == 7208224
    assert snap.missing() == ["num_drafts", "num_draft_tokens", "num_accepted_tokens",
                              "accepted_per_pos"]


def test_sglang_0_5_14_counters():
    """0.5.14: no is_streaming label, no `_created` samples, `sglang:num_requests_total`
    counts finished requests; `sglang:cached_tokens_total` (the real name, label
    cache_source) has no sample with the radix cache off."""
    before = fixture("sglang-0.5.14", "dflash_light.metrics-before.txt")
    after = fixture("sglang-0.5.14", "dflash_light.metrics-after.txt")
    assert "_created" not in after and "sglang:cached_tokens_total" not in after
    d = delta(parse(before, "sglang"), parse(after, "sglang"))
    assert (d.spec_verify_calls, d.generation_tokens, d.prompt_tokens) == (158, 384, 126)
    assert d.num_requests == 6 and d.requests_finished == 6
    assert d.prompt_tokens_cached is None  # never observed: not a made-up 0
    assert d.num_accepted_tokens is None and d.accepted_per_pos is None  # SGLang has neither
    assert d.kv_pool_tokens == 3057492


def test_sglang_counter_first_seen_between_scrapes_counts_from_zero():
    """SGLang's multiprocess counters appear on first increment: a counter absent before
    the load and present after it moved by its whole value; vLLM's never appear late."""
    after = fixture("sglang-0.5.14", "dflash_light.metrics-after.txt")
    before = "\n".join(line for line in fixture("sglang-0.5.14", "dflash_light.metrics-before.txt")
                       .splitlines() if "spec_verify_calls" not in line) + "\n"
    assert delta(parse(before, "sglang"), parse(after, "sglang")).spec_verify_calls == 164
    no_drafts = "\n".join(line for line in VLLM_TEXT.splitlines()
                          if "spec_decode_num_drafts" not in line) + "\n"
    assert delta(parse(no_drafts, "vllm"), parse(VLLM_TEXT, "vllm")).num_drafts is None


def test_generic_server_has_no_counter_names():
    snap = parse(fixture("vllm-0.26.0", "dflash.metrics-after.txt"), "generic")
    assert snap.num_drafts is None and snap.generation_tokens is None and snap.missing() == []
