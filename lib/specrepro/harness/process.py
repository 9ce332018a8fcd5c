"""What the harness needs of an engine process, whatever the engine: HTTP routes, startup
facts read from its log, and where it runs (CPU placement).

Design:
- Engine-neutral: no engine is named here. Each engine's routes and log patterns are on
  its adapter (harness/engines/), the running engine is `engines.handle.EngineHandle`.
- The harness reaches engines over HTTP only (stdlib `urllib`: a few small blocking
  calls; the load generator has its own async client). Readiness and version go through
  an engine's `Routes` (its adapter's `routes`): readiness routes in order of
  preference, a 404 meaning the running version lacks one (`poll_ready`), and the routes
  whose JSON has a "version" (`read_version`).
- Startup facts (`StartupInfo`) are read from a log by an engine's table of `LogFact`
  patterns (`parse_log`; each adapter's `log_facts`); `startup_error` finds the first
  line naming an exception, for the error of an engine that exited before it was ready.
- CPU placement (`plan_placement`, the study's `placement: auto | none`): on a small machine
  the load generator and the engine share cores and slow each other (measured on the 2-core
  box: a busy loop on the client's core cut the engine's single-stream tok/s from 124.6 to
  84.7). With `auto` and two CPUs or more in this process's affinity mask, a launched engine
  gets the last N CPUs of the mask, N its CPU threads (the adapter's `cpu_threads`: the
  embedded server's `--threads`, else 1 on its CPU device; else all but one CPU), and the
  harness process (the load generator, the power sampler) the others. The engine inherits
  its set at fork: the launching thread takes the engine's set around `Popen` and then
  returns to its own (`thread_affinity`), so every thread the engine starts has it; no
  `preexec_fn`, which is unsafe in a process with threads (a notebook kernel has several).
  The harness then pins each of its own threads (`pin_process`) and undoes it after the
  arm (`restore`). An attached engine, the in-process peer, one CPU, or a platform without
  `os.sched_setaffinity` is not pinned, and the note says why. `Placement.record()` is what
  the manifest keeps under `placement`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

# ------------------------------------------------------------------------ startup facts


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


# ------------------------------------------------------------------------------ HTTP


def _answer(request: str | urllib.request.Request, timeout: float) -> tuple[int, bytes]:
    """(status, body) of one request; status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return 0, b""


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of a GET; status 0 when nothing answers."""
    return _answer(url, timeout)


def http_post(url: str, body: bytes = b"{}", timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of a POST of a JSON body; status 0 when nothing answers."""
    return _answer(urllib.request.Request(url, data=body, method="POST",
                                          headers={"Content-Type": "application/json"}),
                   timeout)


def http_json(url: str, timeout: float = 5.0) -> Any:
    status, body = http_get(url, timeout)
    if status != 200:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


@dataclass(frozen=True)
class Routes:
    """Where an engine answers. `ready`: readiness routes in order of preference; one that
    answers 404 does not exist in the running version, and the next is polled. `version`:
    routes whose JSON carries a "version" field, tried in order."""

    ready: tuple[str, ...]
    version: tuple[str, ...]


READY_POLL_TIMEOUT_S = 5.0  # SGLang's /health_generate sleeps 1 s before it answers 200


def read_version(url: str, routes: Routes) -> str | None:
    """The first "version" a version route of the engine gives; None where none does."""
    for route in routes.version:
        body = http_json(f"{url}{route}")
        if isinstance(body, dict) and isinstance(body.get("version"), str):
            return body["version"]
    return None


def poll_ready(url: str, routes: Routes, start: int = 0) -> tuple[int, int]:
    """One readiness poll from route `start` on: (status, index of the route that gave it);
    a 404 moves on to the next route (the running version lacks it)."""
    i = start
    while True:
        status = http_get(url + routes.ready[i], timeout=READY_POLL_TIMEOUT_S)[0]
        if status != 404 or i + 1 == len(routes.ready):
            return status, i
        i += 1


# ---------------------------------------------------------------------- CPU placement


@dataclass(frozen=True)
class Placement:
    """Where a launched engine and the harness's load generator run, or why not apart.
    `threads`: the engine's CPU threads, the size of its set, where it is pinned."""

    engine_cpus: tuple[int, ...]
    client_cpus: tuple[int, ...]
    pinned: bool
    note: str
    threads: int | None = None

    def record(self) -> dict[str, Any]:
        """The manifest's `placement` (the report summary reads exactly these keys)."""
        return {"engine_cpus": list(self.engine_cpus), "client_cpus": list(self.client_cpus),
                "pinned": self.pinned, "note": self.note}


def allowed_cpus() -> tuple[int, ...] | None:
    """The CPUs in this thread's affinity mask; None where the platform has no affinity call."""
    if not (hasattr(os, "sched_getaffinity") and hasattr(os, "sched_setaffinity")):
        return None
    return tuple(sorted(os.sched_getaffinity(0)))


def plan_placement(policy: str, cpus: tuple[int, ...] | None, engine_threads: int | None,
                   why_not: str | None = None) -> Placement:
    """Disjoint CPU sets for a launched engine and the harness (module docstring).
    policy: the study's `placement` ("auto" | "none"); cpus: allowed_cpus() before any
    pinning; engine_threads: the engine's CPU threads (None: as many as it gets); why_not:
    the reason this engine cannot be pinned (attached, in-process), if any."""
    shared = tuple(cpus or ())
    if policy == "none":
        return Placement(shared, shared, False, f"placement 'none' (the study's setting): the "
                         f"engine and the load generator share CPUs {list(shared)}")
    if why_not:
        return Placement(shared, shared, False, why_not)
    if cpus is None:
        return Placement((), (), False, "no CPU affinity on this platform (os.sched_setaffinity "
                         "is Linux's): the engine and the load generator share the CPUs")
    if len(cpus) < 2:
        return Placement(shared, shared, False, f"one CPU ({list(cpus)}) in this process's "
                         "affinity mask: the engine and the load generator share it")
    n = len(cpus) - 1 if engine_threads is None else engine_threads
    capped = ""
    if n > len(cpus) - 1:
        capped = (f"; its {n} threads exceed the {len(cpus) - 1} CPUs left beside the load "
                  "generator")
        n = len(cpus) - 1
    engine, client = cpus[-n:], cpus[:-n]
    return Placement(engine, client, True,
                     f"engine on CPUs {list(engine)} ({n} thread{'s' if n > 1 else ''}), load "
                     f"generator and harness on CPUs {list(client)}{capped}",
                     threads=None if capped else n)


@contextlib.contextmanager
def thread_affinity(cpus: tuple[int, ...] | None):
    """This thread on cpus for the block (None: unchanged); a process it starts inherits them."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _thread_ids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: the calling thread only
        return [0]


def pin_process(cpus: tuple[int, ...]) -> dict[int, set[int]]:
    """Every thread of this process onto cpus; returns each one's previous mask (restore)."""
    saved = {}
    for tid in _thread_ids():
        try:
            saved[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cpus)
        except OSError:  # the thread ended meanwhile
            saved.pop(tid, None)
    return saved


def restore(saved: dict[int, set[int]], default: tuple[int, ...] | None = None) -> None:
    """Undo pin_process: each thread back to its mask; threads started meanwhile (they
    inherited the pinned set) to `default`, the process's mask before pinning."""
    for tid in set(_thread_ids()) | set(saved):
        mask = saved.get(tid, default)
        if mask:
            try:
                os.sched_setaffinity(tid, mask)
            except OSError:
                pass
