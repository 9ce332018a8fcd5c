"""A server of no known make behind an attached URL: OpenAI-compatible, nothing more.

Design: what attach.py finds where a URL answers `/health` or `/v1/models` but neither
vLLM's `/version` nor SGLang's `/server_info` (guidellm 0.8.1's mock server has those two
routes, no `/version`, `/server_info` or `/metrics`). Its requests carry only the standard
fields, its metric names are none (a scrape reads every counter as None), and the warning
of a missing `/metrics` names what cannot be measured on it. Never a `profile.engine`.
"""
from __future__ import annotations

from pathlib import Path

from specrepro.harness.engines.base import OPENAI_ROUTES, EngineAdapter, Probe
from specrepro.harness.loadgen import RequestFeatures
from specrepro.harness.promtext import MetricNames
from specrepro.params import Profile


class GenericAdapter(EngineAdapter):
    """An OpenAI-compatible server found behind an attached URL; never launched."""

    kind = "generic"
    what = "an OpenAI-compatible server"
    routes = OPENAI_ROUTES
    metrics = MetricNames(
        family="generic", counters={},
        lost_without=("the counter check (counters_consistent); this server's acceptance is "
                      "not known in any case"))
    request_features = RequestFeatures(continuous_usage_stats=False, return_token_ids=False)
    launches = False
    detect_rank = 9  # last: any OpenAI-compatible server answers these

    def answers_as(self, probe: Probe) -> bool:
        """`/health` or `/v1/models` answers 200."""
        return any(probe.status(r) == 200 for r in self.routes.ready)

    def attached_warnings(self, profile: Profile, url: str) -> list[str]:
        return [(f"profile {profile.name!r}: {url} is an OpenAI-compatible server that is "
                 "neither vLLM, SGLang nor the embedded engine (no /version or /server_info): "
                 "attached as a generic engine; its requests are timed, its engine facts "
                 "(version, KV pool, acceptance) are unknown")]

    def render_argv(self, profile: Profile, source: str | Path | None = None) -> list[str]:
        return []
