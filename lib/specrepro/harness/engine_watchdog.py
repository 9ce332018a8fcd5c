"""The engine's watchdog: a small process that stops an engine's process group when the run
that launched it dies, whatever killed the run (SIGKILL included).

Design:
- `lifecycle.guard` starts it right after the engine, as a child of the run in a session of
  its own: neither the terminal nor a signal to the run's job (`kill -9 %1`) reaches it.
  It stops the engine's process group, which the engine's own children (vLLM's engine
  cores) carry, so stopping the group stops them all.
- It waits on the run's death two ways: the Linux parent-death signal (prctl
  PR_SET_PDEATHSIG, SIGUSR1), which comes at once, and a poll of its parent pid every
  `POLL_S`, for platforms without prctl. The parent-death signal also comes when the run's
  *thread* that started it ends while the run lives on (the kernel ties it to the thread),
  so either way it only acts once `os.getppid()` is no longer the run.
- The run gone: SIGTERM to the group, `--grace` seconds for its members to exit, the pid
  file removed, then SIGKILL to whatever is left of the group.
- A SIGTERM while the run lives is the run's `EngineHandle.stop()` done with the engine
  (`Guard.release`): it exits at once. Once the run is gone, SIGTERM is ignored.
- stdlib only: it starts in a few tens of milliseconds and holds ~10 MB, idle in a wait.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path

POLL_S = 1.0  # where the parent-death signal is missing, the run's death is seen this late
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def parent_death_signal(sig: int) -> bool:
    """Ask Linux for `sig` when the parent (thread) dies; False where it cannot be asked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of the group, from /proc."""
    found = []
    try:
        entries = list(os.scandir("/proc"))
    except OSError:  # no /proc: whether any process of the group is left, zombies too
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except OSError:
            return []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                state, _ppid, pgrp = fh.read().rsplit(b")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) == pgid and state != b"Z":
            found.append(int(entry.name))
    return found


def stop_group(pgid: int, grace_s: float, pidfile: Path | None) -> None:
    """SIGTERM the group, wait up to grace_s for its members, remove the pid file (if it
    still names this group), SIGKILL what is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and group_members(pgid):
        time.sleep(0.1)
    if pidfile is not None:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(pidfile.read_text()).get("pgid") == pgid:
                pidfile.unlink()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specrepro.harness.engine_watchdog")
    ap.add_argument("--owner", type=int, required=True, help="the run's pid (this one's parent)")
    ap.add_argument("--group", type=int, required=True, help="the engine's process group")
    ap.add_argument("--grace", type=float, default=30.0, help="SIGTERM -> SIGKILL, seconds")
    ap.add_argument("--pidfile", type=Path, default=None)
    args = ap.parse_args(argv)

    def owner_alive() -> bool:
        return os.getppid() == args.owner

    def on_term(signum, frame):  # the run is done with its engine
        if owner_alive():
            os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    for sig in (signal.SIGINT, signal.SIGHUP):  # no terminal's business: only the run's death
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # taken by sigtimedwait
    parent_death_signal(signal.SIGUSR1)
    while owner_alive():  # checked after prctl: a run that died before it is seen here
        signal.sigtimedwait({signal.SIGUSR1}, POLL_S)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stop_group(args.group, args.grace, args.pidfile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
