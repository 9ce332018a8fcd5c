"""The engines the harness drives, one module each, registered by `profile.engine`.

Design:
- base.py is the adapter contract and the process handling every launched engine shares;
  each engine's module (vllm.py, sglang.py, embedded.py, attach.py, generic.py,
  transformers.py) holds all of that engine's facts on its adapter. The rest of the
  harness asks an adapter (`engine(name)`, `adapter_for(profile)`,
  `EngineHandle.served_by`) and never branches on an engine's name
  (tests/test_engine_branches.py).
- `ENGINES` maps `profile.engine` to its adapter; `ATTACHABLE` the engines attach.py can
  find behind a URL (an OpenAI-compatible server of unknown make is `generic`, never a
  profile's engine). Adding an engine is its module, one `register` here, its profiles and
  its fixtures, plus its name in params/engine_kinds.py, the facts the params layer
  validates a profile by (params may not import the harness).
- `adapter_for`, `render_argv` and `launch` serve the engines that are HTTP servers (the
  in-process transformers peer is not one: they raise `EngineError` for it).
"""
from __future__ import annotations

from pathlib import Path

from specrepro.harness.cpu_placement import Placement
from specrepro.harness.engine_handle import EngineHandle
from specrepro.harness.engines.attach import AttachAdapter
from specrepro.harness.engines.base import EngineAdapter, EngineError
from specrepro.harness.engines.embedded import EmbeddedAdapter
from specrepro.harness.engines.generic import GenericAdapter
from specrepro.harness.engines.sglang import SGLangAdapter
from specrepro.harness.engines.transformers import TransformersAdapter
from specrepro.harness.engines.vllm import VLLMAdapter
from specrepro.params import Profile

ENGINES: dict[str, EngineAdapter] = {}  # profile.engine -> its adapter
ATTACHABLE: dict[str, EngineAdapter] = {}  # what attach.py may find behind a URL


def register(adapter: EngineAdapter, profile_engine: bool = True,
             attachable: bool = False) -> EngineAdapter:
    """Make an adapter the one for its `kind`: as a profile's engine, and where
    attachable, as an engine attach.py may find behind a URL; returns it."""
    if profile_engine:
        ENGINES[adapter.kind] = adapter
    if attachable:
        ATTACHABLE[adapter.kind] = adapter
    return adapter


register(VLLMAdapter(), attachable=True)
register(SGLangAdapter(), attachable=True)
register(EmbeddedAdapter(), attachable=True)
register(GenericAdapter(), profile_engine=False, attachable=True)
register(AttachAdapter(ATTACHABLE))
register(TransformersAdapter())


def engine(name: str) -> EngineAdapter:
    """The adapter of an engine by name (a profile's engine, or one attach.py finds)."""
    found = ENGINES.get(name) or ATTACHABLE.get(name)
    if found is None:
        raise EngineError(f"engine {name!r}: expected one of {sorted({*ENGINES, *ATTACHABLE})}")
    return found


def adapter_for(profile: Profile) -> EngineAdapter:
    """The profile's engine's adapter, where it is an HTTP server."""
    http = {name: a for name, a in ENGINES.items() if not a.in_process}
    if profile.engine not in http:  # e.g. the in-process transformers peer (peer.py)
        raise EngineError(f"profile {profile.name!r}: engine {profile.engine!r} is not an HTTP "
                          f"server; expected one of {sorted(http)}")
    return http[profile.engine]


def render_argv(profile: Profile, source: str | Path | None = None) -> list[str]:
    return adapter_for(profile).render_argv(profile, source)


def launch(profile: Profile, log_dir: str | Path, source: str | Path | None = None,
           placement: Placement | None = None, log_name: str | None = None,
           pid_dir: str | Path | None = None) -> EngineHandle:
    """Start (or attach to) the profile's engine; use as `with launch(p, dir) as engine:`."""
    return adapter_for(profile).launch(profile, log_dir, source, placement, log_name, pid_dir)
