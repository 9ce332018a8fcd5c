"""A running engine as the harness holds it (`EngineHandle`): its process, log, version,
startup facts and `/metrics`, and how it is stopped.

Design:
- A handle is made by its adapter (engines/base.py's `EngineAdapter.launch`, or attach.py's): it
  keeps the adapter and asks it, never an engine's name, what applies: `served_by` is the
  adapter of the engine that answers (an attached URL's is found behind it), whose metric
  names parse the counters and whose request fields the load generator adds.
- An engine runs in its own process group (started with `start_new_session=True`, so the
  leader's pid is the group id and the children it forks, vLLM's engine cores, carry it).
  `EngineHandle.stop()` sends SIGTERM to the group, waits, then SIGKILL; handles are
  context managers and every live one is stopped at interpreter exit (atexit). What stops
  the group when this process cannot (SIGKILL) is its `guard` (lifecycle.py: a watchdog
  and a pid file), released once the group is gone; `live_handles()` is what lifecycle asks
  whether a pid file's engine is one of this process's.
- This module imports no adapter (the adapter is typed `Any`): adapters import it, so the
  two never form an import cycle.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from specrepro.harness import promtext
from specrepro.harness.cpu_placement import Placement
from specrepro.harness.engine_http import http_get
from specrepro.harness.startup_log import StartupInfo
from specrepro.params import Profile

STOP_GRACE_S = 30.0  # SIGTERM → SIGKILL: vLLM's engine cores need a few seconds to exit
LOG_TAIL_LINES = 40

_LIVE: set[EngineHandle] = set()  # handles of processes started here and not yet stopped


def live_handles() -> tuple[EngineHandle, ...]:
    """The handles of engine processes started here and not yet stopped."""
    return tuple(_LIVE)


@atexit.register
def _stop_all() -> None:
    """No orphan engines: whatever exit path the interpreter takes that runs atexit."""
    for handle in list(_LIVE):
        handle.stop()


@dataclass(eq=False)
class EngineHandle:
    """A running engine (launched here, or attached to), and how to read it."""

    profile: Profile
    adapter: Any  # the EngineAdapter (base.py) that launched or attached it
    url: str
    process: subprocess.Popen | None = None
    log_path: Path | None = None
    argv: list[str] | None = None
    version: str | None = None
    startup: StartupInfo = field(default_factory=StartupInfo)
    warnings: list[str] = field(default_factory=list)
    attached: str | None = None  # attach: the engine found behind the URL
    placement: Placement | None = None  # where the launched engine runs (plan_placement)
    log_offset: int = 0  # where this launch's lines begin: the log is appended to per run
    guard: Any = None  # lifecycle.Guard: the watchdog and pid file of a launched engine

    def log_text(self) -> str:
        """This launch's part of the log (earlier launches' lines are never parsed as its
        startup facts), or "" without one."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as fh:
            fh.seek(self.log_offset)
            return fh.read().decode(errors="replace")

    def __post_init__(self) -> None:
        if self.process is not None:  # a process started here is stopped at exit at the latest
            _LIVE.add(self)

    @property
    def served_by(self) -> Any:
        """The adapter of the engine that answers: whose metric names, routes and request
        fields apply (an attached URL's engine, found behind it; else the launcher)."""
        return self.adapter.served_by(self)

    def alive(self) -> bool:
        return self.process is None or self.process.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def metrics_text(self) -> str | None:
        status, body = http_get(f"{self.url}/metrics", timeout=10.0)
        return body.decode(errors="replace") if status == 200 else None

    def counters(self) -> promtext.SpecCounters:
        """A scrape of /metrics; every field None when the endpoint is missing."""
        text = self.metrics_text()
        return promtext.parse(text or "", self.served_by.metrics)

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
            if self.guard is not None:
                self.guard.release()

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
