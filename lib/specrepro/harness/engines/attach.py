"""Attaching to a server someone else started (article A measured through its production
proxy): nothing is launched or stopped.

Design: `AttachAdapter` is given the adapters of the engines it can find behind a URL
(the registry's `ATTACHABLE`, package `__init__`) and asks each, by `detect_rank`, whether
the URL's routes are its engine's (`answers_as`): which one answers (`profile.attached_engine` where the profile says,
else `detect`) decides whose routes, metric names and request fields apply
(`served_by`). An OpenAI-compatible server that is none of them is `generic`
(generic.py), with warnings naming what cannot be measured on it.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from specrepro.harness.cpu_placement import Placement
from specrepro.harness.engine_handle import EngineHandle
from specrepro.harness.engine_http import poll_ready, read_version
from specrepro.harness.engines.base import EngineAdapter, EngineError, Probe, facts_warnings
from specrepro.harness.engines.sglang import SGLangAdapter
from specrepro.params import Profile


class AttachAdapter(EngineAdapter):
    """A server someone else started (article A measured through its production proxy).

    Nothing is launched or stopped. Which engine answers decides how counters are read:
    `profile.attached_engine` where the profile schema has it, else detected from the
    routes (`/version` answers on vLLM and the embedded engine, `/server_info` on SGLang;
    a server with neither that answers `/health` or `/v1/models` is `generic`).
    """

    kind = "attach"
    launches = False
    why_unpinned = ("attached engine: not launched by the harness, so its CPUs are not the "
                    "harness's to choose")
    PROBES = ("/version", "/server_info", "/health", "/v1/models")  # what detect() tries

    def __init__(self, attachable: Mapping[str, EngineAdapter]):
        self.attachable = attachable  # name -> adapter of an engine found behind a URL

    def render_argv(self, profile: Profile, source: str | Path | None = None) -> list[str]:
        return []

    def url(self, profile: Profile) -> str:
        return (profile.url or "").rstrip("/").removesuffix("/v1")

    def launch(self, profile: Profile, log_dir: str | Path | None = None,
               source: str | Path | None = None,
               placement: Placement | None = None, log_name: str | None = None,
               pid_dir: str | Path | None = None) -> EngineHandle:
        """Reach the running engine; placement is not this harness's to choose (the
        runner records why), nor its lifetime."""
        handle = EngineHandle(profile, self, self.url(profile), placement=placement)
        probe = self.detect(handle.url, getattr(profile, "attached_engine", None))
        if probe is None:
            raise EngineError(f"profile {profile.name!r}: no engine answers at {handle.url} "
                              f"(tried {', '.join(self.PROBES)})")
        if probe not in self.attachable:
            raise EngineError(f"profile {profile.name!r}: attached_engine {probe!r}: expected "
                              f"one of {sorted(self.attachable)}")
        handle.attached = probe
        found = self.attachable[probe]
        routes = found.routes
        status, route = poll_ready(handle.url, routes)
        if status != 200:
            raise EngineError(f"profile {profile.name!r}: {handle.url}{routes.ready[route]} "
                              f"answers {status or 'nothing'}, not 200; the engine is not ready")
        handle.warnings += found.attached_warnings(profile, handle.url)
        handle.version = read_version(handle.url, routes)
        handle.warnings += facts_warnings(handle, probe, routes, found.metrics)
        return handle

    def detect(self, url: str, declared: str | None = None) -> str | None:
        """The engine behind a URL: the declared one, else the first attachable adapter,
        by `detect_rank`, whose `answers_as` recognises its routes (`/version` answers on
        vLLM and the embedded engine, whose version names it; `/server_info` on SGLang;
        `/health` or `/v1/models` on any OpenAI-compatible server)."""
        if declared is not None:
            return declared
        probe = Probe(url)
        ranked = sorted((a for a in self.attachable.values() if a.detect_rank is not None),
                        key=lambda a: a.detect_rank)
        return next((a.kind for a in ranked if a.answers_as(probe)), None)

    def served_by(self, handle: EngineHandle) -> EngineAdapter:
        """The engine found behind the URL."""
        return self.attachable[handle.attached] if handle.attached else self

    # Whatever answers is asked for SGLang's per-response acceptance fields, as a launched
    # SGLang is, when the profile's return_spec_details says so.
    request_extras = SGLangAdapter.request_extras
