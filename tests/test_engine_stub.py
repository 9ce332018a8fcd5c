"""Adding an engine is one adapter: a stub engine, defined and registered here only, runs
through the registry (argv, metric names, acceptance, latency, request fields) with no
other module edited; and the registry agrees with what the params layer validates.

The one place outside the engines' package a real new engine adds a line is its row in
params/engine_kinds.py (params may not import the harness); the stub's profile is a
validated profile given the stub's name, so no row is needed here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specrepro.harness import engine_latency, engines, promtext
from specrepro.harness.cells import acceptance, counters_delta
from specrepro.harness.engines.base import EngineAdapter
from specrepro.harness.flags import model_flags
from specrepro.harness.loadgen import LoadConfig, RequestFeatures, request_body
from specrepro.harness.records import LoadResult
from specrepro.params import Profile
from specrepro.params.engine_kinds import ATTACHABLE_NAMES, KINDS
from specrepro.workloads import Prompt


class StubAdapter(EngineAdapter):
    """`stub-serve MODEL --port N`: counts drafts and accepted tokens under its own names."""

    kind = "stub"
    what = "the stub engine"
    metrics = promtext.MetricNames(
        family="stub",
        counters={"num_drafts": "stub:drafts_total", "num_draft_tokens": "stub:proposed_total",
                  "num_accepted_tokens": "stub:accepted_total",
                  "generation_tokens": "stub:generated_total"},
        histograms={"ttft": "stub:ttft_seconds"},
        lost_without="acceptance (the stub counts it on /metrics only)")
    request_features = RequestFeatures(continuous_usage_stats=False, return_token_ids=False)

    def render_argv(self, profile: Profile, source: str | Path | None = None) -> list[str]:
        return ["stub-serve", profile.model.id, *model_flags(profile, "--tp", "--dp")]


SCRAPE = """# TYPE stub:drafts counter
stub:drafts_total {drafts}
# TYPE stub:proposed counter
stub:proposed_total {proposed}
# TYPE stub:accepted counter
stub:accepted_total {accepted}
# TYPE stub:generated counter
stub:generated_total {generated}
# TYPE stub:ttft_seconds histogram
stub:ttft_seconds_bucket{{le="+Inf"}} {n}
stub:ttft_seconds_count {n}
stub:ttft_seconds_sum {ttft}
"""


@pytest.fixture
def stub(monkeypatch) -> tuple[EngineAdapter, Profile]:
    adapter = StubAdapter()
    monkeypatch.setitem(engines.ENGINES, adapter.kind, adapter)
    profile = Profile.model_validate({"name": "stub-k3", "engine": "embedded",
                                      "command": ["stub-serve"], "model": {"id": "m"},
                                      "port": 9100}).model_copy(update={"engine": "stub"})
    return adapter, profile


def test_a_stub_engine_runs_through_the_registry(stub):
    adapter, profile = stub
    assert engines.adapter_for(profile) is adapter and engines.engine("stub") is adapter
    assert engines.render_argv(profile) == ["stub-serve", "m", "--host", "127.0.0.1",
                                            "--port", "9100"]
    before = SCRAPE.format(drafts=10, proposed=30, accepted=20, generated=40, n=2, ttft=0.2)
    after = SCRAPE.format(drafts=60, proposed=180, accepted=120, generated=220, n=6, ttft=0.6)
    warnings: list[str] = []
    delta = counters_delta(LoadResult([], 1.0, before, after=after), adapter, "after", warnings)
    assert delta.num_drafts == 50 and delta.generation_tokens == 180 and not warnings
    acc = acceptance(delta, [], adapter, warnings, k=3)
    assert acc["acceptance_length"] == pytest.approx(1 + 100 / 50)
    assert acc["draft_acceptance_rate"] == pytest.approx(100 / 150)
    latency = engine_latency.fields(before, after, adapter.metrics, 1.0)
    assert latency["engine_ttft_ms"] == pytest.approx(100.0)
    assert latency["engine_itl_ms"] is None  # a histogram it does not have: not measured
    # its request fields, and what a missing /metrics costs, are its own
    cfg = LoadConfig(url="http://x", model="m", features=adapter.request_features)
    body = request_body(Prompt(id="p", workload="w", text="hi", max_tokens=4), cfg, 1)[1]
    assert "return_token_ids" not in body and body["stream_options"] == {"include_usage": True}
    assert counters_delta(LoadResult([], 1.0), adapter, "after", warnings, "http://x") is None
    assert warnings == [("http://x/metrics did not answer: not measured: acceptance (the stub "
                         "counts it on /metrics only)")]


def test_the_registry_and_the_params_engine_kinds_agree():
    """Every engine a profile may name has an adapter, and the two say the same of it."""
    assert set(engines.ENGINES) == set(KINDS)
    assert set(ATTACHABLE_NAMES) <= set(engines.ATTACHABLE)
    for name, kind in KINDS.items():
        adapter = engines.ENGINES[name]
        assert adapter.kind == name
        assert adapter.in_process == kind.in_process, name
        assert adapter.launches == kind.starts, name
        assert adapter.request_features.native_api == kind.native_api, name
        assert (adapter.why_unpinned is not None) == (not kind.starts), name
