"""What the params layer knows of each engine: its name and the profile keys it admits.

Design: params may not import the harness (tests/test_boundaries.py: a profile is checked
before anything runs, on machines without the harness's libraries), so the facts a
profile is validated by live here, as data, one `EngineKind` a row: the engine names
`Profile.engine` and `Profile.attached_engine` accept, which keys each admits or needs,
and its name in a report's words. Every other list of engines is derived from `KINDS`
(`ENGINE_NAMES`, `MEASURING_NAMES` for a suite's substrate, `WORDS` for the host-bound
lines), never retyped. Everything else about an engine (flags, routes, metrics, acceptance) is on its
adapter in harness/engines/, which registers under the same name; a new engine is a row
here beside its adapter module. Checks ask a kind's fields, never compare engine names.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class EngineKind:
    """One engine as a profile names it. `starts`: the profile gives the command that
    starts it (else `command` must be null: attached, or in-process); `needs_url`: it is
    reached at the profile's `url`; `gpu_only`: the harness launches it only on a GPU
    machine; `spec_details`: whether `return_spec_details` is required (true), allowed,
    or forbidden; `native_api`: `api: native` (its own /generate) is possible;
    `attaches`: it may name an `attached_engine`; `attachable`: it may be one;
    `in_process`: served inside the harness process (no server, no pinning of its own);
    `compile_flag`: the profile flag that compiles its step, where one does (its compiled and
    eager runs are two runtimes to the step-cost model, analysis/step_cost/cells.py);
    `words`: its name in a report's sentences (analysis/verdict/host_bound.py), else its name."""

    name: str
    starts: bool = True
    needs_url: bool = False
    gpu_only: bool = False
    spec_details: Literal["required", "allowed", "forbidden"] = "forbidden"
    native_api: bool = False
    attaches: bool = False
    attachable: bool = False
    in_process: bool = False
    compile_flag: str | None = None
    words: str = ""

    def __post_init__(self):
        if not self.words:
            object.__setattr__(self, "words", self.name)


KINDS: dict[str, EngineKind] = {k.name: k for k in (
    EngineKind("vllm", gpu_only=True, attachable=True, words="vLLM"),
    # SGLang: acceptance only from per-response fields it returns when asked (cells)
    EngineKind("sglang", gpu_only=True, spec_details="required", native_api=True,
               attachable=True, words="SGLang"),
    EngineKind("embedded", attachable=True, compile_flag="compile", words="the embedded engine"),
    EngineKind("attach", starts=False, needs_url=True, spec_details="allowed", attaches=True),
    # the in-process peer (harness/transformers_peer.py) on the embedded checkpoint
    EngineKind("transformers", starts=False, in_process=True),
)}
ENGINE_NAMES = tuple(KINDS)  # what Profile.engine accepts
ATTACHABLE_NAMES = tuple(k.name for k in KINDS.values() if k.attachable)  # attached_engine
GPU_ENGINES = tuple(k.name for k in KINDS.values() if k.gpu_only)
# engines that compute a cell's tokens themselves (not `attach`, which only names a URL):
# what a suite's substrate (params/substrate.py) measures busy shares and step probes of
MEASURING_NAMES = tuple(k.name for k in KINDS.values() if not k.attaches)
WORDS = {k.name: k.words for k in KINDS.values()}  # an engine in a report's words


def names_where(**fact) -> str:
    """The engines with a fact, for messages: names_where(attaches=True) -> 'attach'."""
    (key, value), = fact.items()
    return " or ".join(k.name for k in KINDS.values() if getattr(k, key) == value)
