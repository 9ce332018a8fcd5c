"""A running engine as the harness holds it: its process, its HTTP routes, how it is stopped.

Design:
- `EngineHandle` is a running engine, launched here (an adapter in `engines.py` starts it)
  or attached to: its URL, process, log, version, the startup facts its log gave
  (`StartupInfo`, parsed by the adapter) and a scrape of its `/metrics`. It asks its adapter
  which metric family the counters use and which fields to add to requests.
- An engine runs in its own process group (started with `start_new_session=True`, so the
  leader's pid is the group id and the children it forks, vLLM's engine cores, carry it).
  `EngineHandle.stop()` sends SIGTERM to the group, waits, then SIGKILL; handles are
  context managers and every live one is stopped at interpreter exit (atexit).
- The harness reaches engines over HTTP only (stdlib `urllib`: a few small blocking
  calls; the load generator has its own async client).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from specrepro.harness import promtext
from specrepro.params import Profile

if TYPE_CHECKING:
    from specrepro.harness.engines import EngineAdapter

STOP_GRACE_S = 30.0  # SIGTERM → SIGKILL: vLLM's engine cores need a few seconds to exit
LOG_TAIL_LINES = 40


# ------------------------------------------------------------------------ startup facts


@dataclass(frozen=True)
class StartupInfo:
    """What the engine's startup log says about its capacity."""

    kv_pool_tokens: int | None = None
    max_concurrency: float | None = None  # vLLM: full-length requests the pool holds; SGLang: slots
    tokens_per_request: int | None = None  # the length vLLM's concurrency figure refers to
    max_running_requests: int | None = None


# ------------------------------------------------------------------------------ HTTP


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of a GET; status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return 0, b""


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


# ---------------------------------------------------------------------------- handles


_LIVE: set[EngineHandle] = set()  # handles of processes started here and not yet stopped


@atexit.register
def _stop_all() -> None:
    """No orphan engines: whatever exit path the interpreter takes that runs atexit."""
    for handle in list(_LIVE):
        handle.stop()


@dataclass(eq=False)
class EngineHandle:
    """A running engine (launched here, or attached to), and how to read it."""

    profile: Profile
    adapter: EngineAdapter
    url: str
    process: subprocess.Popen | None = None
    log_path: Path | None = None
    argv: list[str] | None = None
    version: str | None = None
    startup: StartupInfo = field(default_factory=StartupInfo)
    warnings: list[str] = field(default_factory=list)
    attached: str | None = None  # attach: the engine found behind the URL

    def __post_init__(self) -> None:
        if self.process is not None:  # a process started here is stopped at exit at the latest
            _LIVE.add(self)

    @property
    def engine(self) -> str:
        """Which metric family the counters use: 'vllm', 'embedded' or 'sglang'."""
        return self.adapter.metrics_engine(self)

    def alive(self) -> bool:
        return self.process is None or self.process.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def metrics_text(self) -> str | None:
        status, body = http_get(f"{self.url}/metrics", timeout=10.0)
        return body.decode(errors="replace") if status == 200 else None

    def counters(self) -> promtext.SpecCounters:
        """A scrape of /metrics; every field None when the endpoint is missing."""
        text = self.metrics_text()
        return promtext.parse(text or "", self.engine)

    def request_extras(self) -> dict:
        return self.adapter.request_extras(self.profile)

    def stop(self) -> None:
        """SIGTERM the process group, wait, SIGKILL what is left. Idempotent; a second
        Ctrl-C while it waits kills the group at once."""
        _LIVE.discard(self)
        proc = self.process
        if proc is None:
            return
        pgid = proc.pid  # start_new_session=True: the leader's pid is the group id
        try:
            _signal_group(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            # Children the leader left behind still carry the group id.
            deadline = time.monotonic() + STOP_GRACE_S
            while _group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            _signal_group(pgid, signal.SIGKILL)
            proc.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs; zombies (exited, not yet reaped by
    init) do not count. Reads /proc where there is one, else probes with signal 0."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, _ppid, pgrp = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) == pgid and state != "Z":
            return True
    return False
