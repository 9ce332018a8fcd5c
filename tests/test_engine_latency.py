"""The engines' own latency histograms over a cell (harness/engine_latency.py): held to the
/metrics texts vLLM 0.26.0 and SGLang 0.5.14 served on the H200 (tests/fixtures/engines,
which keep the inter-token histograms whole and trim the others), and to a text in the
exposition format with every family the module reads, under the names those releases'
metrics code registers."""

from __future__ import annotations

from pathlib import Path

import pytest

from specrepro.harness import engine_latency, engines

FIXTURES = Path(__file__).parent / "fixtures" / "engines"


def text(engine: str, name: str) -> str:
    return (FIXTURES / engine / name).read_text()


def test_vllm_counts_one_gap_per_step_and_sglang_per_token():
    """vLLM 0.26.0's ITL histogram: 3 requests x 64 tokens gave 189 gaps without
    speculation and 63 (one per step) with the block drafter; SGLang's adds a chunk's
    tokens to the count, so its mean is per token. Families the fixtures trim are None."""
    none = engine_latency.fields(text("vllm-0.26.0", "none.metrics-before.txt"),
                                 text("vllm-0.26.0", "none.metrics-after.txt"),
                                 engines.engine("vllm").metrics, 2.0)
    assert none["engine_itl_ms"] == pytest.approx(1000 * 1.0000191159999758 / 189)
    dflash = engine_latency.fields(text("vllm-0.26.0", "dflash.metrics-before.txt"),
                                   text("vllm-0.26.0", "dflash.metrics-after.txt"),
                                   engines.engine("vllm").metrics, 2.0)
    assert dflash["engine_itl_ms"] == pytest.approx(1000 * 0.7778869289998056 / 63)
    for got in (none, dflash):  # not in the trimmed captures: not measured, never zero
        assert got["engine_ttft_ms"] is None and got["engine_queue_ms"] is None
        assert got["engine_busy_share"] is None  # vLLM has no busy counter
    sg = engine_latency.fields(text("sglang-0.5.14", "none.metrics-before.txt"),
                               text("sglang-0.5.14", "none.metrics-after.txt"),
                               engines.engine("sglang").metrics, 2.0)
    assert sg["engine_itl_ms"] == pytest.approx(1000 * 0.6005611079995106 / 84)


HISTOGRAM = """# TYPE {name} histogram
{name}_bucket{{engine="0",le="+Inf"}} {c0}
{name}_count{{engine="0"}} {c0}
{name}_sum{{engine="0"}} {s0}
{name}_bucket{{engine="1",le="+Inf"}} {c1}
{name}_count{{engine="1"}} {c1}
{name}_sum{{engine="1"}} {s1}
"""


def exposition(values: dict[str, tuple[float, float, float, float]], extra: str = "") -> str:
    return "".join(HISTOGRAM.format(name=n, c0=c0, s0=s0, c1=c1, s1=s1)
                   for n, (c0, s0, c1, s1) in values.items()) + extra


def test_every_phase_is_a_mean_over_the_cell_summed_over_engine_cores():
    names = engines.engine("vllm").metrics.histograms
    before = exposition({n: (10, 1.0, 10, 1.0) for n in names.values()})
    after = exposition({n: (14, 1.4, 12, 1.6) for n in names.values()})  # +6 obs, +1.0 s
    vllm = engines.engine("vllm").metrics
    got = engine_latency.fields(before, after, vllm, 5.0)
    for phase in names:
        assert got[f"engine_{phase}_ms"] == pytest.approx(1000 * 1.0 / 6), phase
    # the embedded engine exports vLLM's names
    assert engine_latency.fields(before, after, engines.engine("embedded").metrics, 5.0) == got
    # no observation in the span, a reset, a missing scrape, the in-process peer: None
    same = engine_latency.fields(before, before, vllm, 5.0)
    assert all(v is None for v in same.values())
    assert engine_latency.fields(after, before, vllm, 5.0)["engine_ttft_ms"] is None
    assert all(v is None for v in engine_latency.fields(None, after, vllm, 5.0).values())
    peer = engines.engine("transformers").metrics  # None: the in-process peer has no /metrics
    assert all(v is None for v in engine_latency.fields(before, after, peer, 5.0).values())


def test_sglang_busy_seconds_and_series_that_appear_on_first_use():
    busy = ('# TYPE sglang:forward_execution_seconds counter\n'
            'sglang:forward_execution_seconds_total{{category="decode"}} {d}\n'
            'sglang:forward_execution_seconds_total{{category="extend"}} {e}\n')
    ttft = engines.engine("sglang").metrics.histograms["ttft"]
    before = busy.format(d=2.0, e=0.5)  # no TTFT series yet: SGLang shows it once observed
    after = exposition({ttft: (3, 0.03, 1, 0.05)}, busy.format(d=3.5, e=1.0))
    got = engine_latency.fields(before, after, engines.engine("sglang").metrics, 4.0)
    assert got["engine_ttft_ms"] == pytest.approx(1000 * 0.08 / 4)
    assert got["engine_busy_share"] == pytest.approx((1.5 + 0.5) / 4.0)
    assert got["engine_prefill_ms"] is None  # SGLang 0.5.14 has no per-phase histogram
    # on vLLM a series missing before is not counted from zero (its series exist from start)
    assert engine_latency.fields("", after.replace("sglang:", "vllm:"), engines.engine("vllm").metrics,
                                 4.0)["engine_ttft_ms"] is None
