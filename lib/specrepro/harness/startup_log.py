"""What an engine's startup log says: its capacity, the kernels it chose, where a start's
time went, and the first exception of a start that failed.

Design:
- Engine-neutral: no engine is named here. Each adapter (harness/engines/) has a table of
  `LogFact` patterns (`log_facts`); `parse_log` reads a log by that table into a
  `StartupInfo` (None where the log did not say). `startup_error` finds the first line
  naming an exception, for the error of an engine that exited before it was ready (the
  tail may show only consequences: "Received sigquit from a child process").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StartupInfo:
    """What the engine's startup log says about its capacity and the kernels it chose
    (the adapters' `log_facts`); None where the log did not say."""

    kv_pool_tokens: int | None = None
    max_concurrency: float | None = None  # vLLM: full-length requests the pool holds; SGLang: slots
    tokens_per_request: int | None = None  # the request length the engine admits (vLLM's
    # concurrency figure refers to it; SGLang's context_len)
    max_running_requests: int | None = None
    attention_backend: str | None = None  # the target's: vLLM "FLASH_ATTN", SGLang "triton"
    kernels: dict[str, str] = field(default_factory=dict)  # other choices that change speed:
    # FlashAttention version, model runner, sampler, CUDA graphs, the drafter's backend
    # where a start's time went, as the engine logged it (`phases.<name>`: weights loaded,
    # torch.compile, CUDA-graph capture, the engine's whole init), for the cost of a start
    phases: dict[str, str] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The facts as plain data (the manifest's engine entry)."""
        return {"kv_pool_tokens": self.kv_pool_tokens, "max_concurrency": self.max_concurrency,
                "tokens_per_request": self.tokens_per_request,
                "max_running_requests": self.max_running_requests,
                "attention_backend": self.attention_backend, "kernels": dict(self.kernels),
                "phases": dict(self.phases)}


@dataclass(frozen=True)
class LogFact:
    """A startup fact an engine prints: the StartupInfo field it fills (`kernels.<name>`
    for a kernel choice, `phases.<name>` for a part of the start's time), the line's pattern (group 1 is the value), and whether the last
    occurrence wins. Several facts may fill one field: the first that matches does."""

    field: str
    pattern: str
    last: bool = False


_CASTS = {"kv_pool_tokens": int, "tokens_per_request": int, "max_running_requests": int,
          "max_concurrency": float}
# The first line that names an exception: the cause, where the log tail may show only
# its consequences ("Received sigquit from a child process").
ERROR_LINE = re.compile(r"^(?:\(\w+ pid=\d+\)\s+)?((?:\w+\.)*\w*(?:Error|Exception): .+)$",
                        re.MULTILINE)


def parse_log(text: str, facts: tuple[LogFact, ...]) -> StartupInfo:
    """The startup facts a log shows, by its engine's table; absent ones stay None."""
    values: dict[str, object] = {}
    kernels: dict[str, str] = {}
    phases: dict[str, str] = {}
    for fact in facts:
        found = re.findall(fact.pattern, text, re.MULTILINE)
        if not found:
            continue
        raw = found[-1] if fact.last else found[0]
        if fact.field.startswith("kernels."):
            kernels.setdefault(fact.field.split(".", 1)[1], raw)
        elif fact.field.startswith("phases."):
            phases.setdefault(fact.field.split(".", 1)[1], raw)
        elif fact.field not in values:
            cast = _CASTS.get(fact.field)  # numbers may carry thousands separators
            values[fact.field] = cast(raw.replace(",", "")) if cast else raw
    return StartupInfo(**values, kernels=kernels, phases=phases)


def startup_error(text: str) -> str | None:
    """The log's first line naming an exception, e.g. SGLang 0.5.14's "ValueError: Loaded
    weights leave no GPU memory for the KV cache under --mem-fraction-static=0.12 ..."."""
    m = ERROR_LINE.search(text)
    return m.group(1).strip() if m else None
