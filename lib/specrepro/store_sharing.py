"""Sessions sharing one results store: what lets several `specrepro run --arm` processes
(acceptance-only arms side by side on one GPU) write one `<study>/<run_id>` at once, and
an archive or a reader look at it meanwhile (results.py owns the store itself).

Design:
- Writers: each session writes its own part files (write-once, hard-linked), so parts never
  collide; the manifest is a read-modify-write under an exclusive flock on the run folder
  (`locked(root)`), and a merge folds a session's parts under an exclusive flock on the
  table folder (`locked(table folder)`), writing the merged file before deleting parts.
- Copies: `settled(root)` takes shared locks on the run folder and both table folders, so
  an archive taken under it sees no merge and no manifest edit half done.
- Readers take no lock: a part listed and then merged away by its session is read again
  (`vanishing_parts_retried`), and the merged file written before it went has its rows.
- Manifest size: arms run side by side start one session each with the same resolved
  study; a session whose params equal an earlier one's stores `{"same_as_session": id}`
  (`SAME_AS`), and `resolve_params_refs` gives every session its params back on reading.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def settled(root: Path):
    """Shared locks on a store's root and table folders: no merge and no manifest edit
    runs while it is held, so a copy taken under it (an archive) never misses a part that
    another session's merge is folding into its session file, nor meets a manifest's
    temporary file that vanishes as it is read."""
    import fcntl

    fds = []
    try:
        for folder in (Path(root), Path(root) / "cells", Path(root) / "requests"):
            if folder.is_dir():
                fds.append(os.open(folder, os.O_RDONLY))
                fcntl.flock(fds[-1], fcntl.LOCK_SH)
        yield
    finally:
        for fd in fds:
            os.close(fd)


@contextlib.contextmanager
def locked(folder: Path):
    """An exclusive flock on a folder: a table folder for the length of a merge, the
    store's root for a read-modify-write of its manifest (sessions of one store may run
    at once: `specrepro run --arm`)."""
    import fcntl  # POSIX, as the harness is; imported here so reading needs none of it

    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


VANISHED_RETRIES = 5


def vanishing_parts_retried(read):
    """Another session of the store may merge its parts while this one reads (`specrepro
    run --arm`): its merged file is written before its parts go, so a part that vanished
    between the listing and the read means reading the folder again finds its rows."""
    @functools.wraps(read)
    def again(*args, **kwargs):
        for _ in range(VANISHED_RETRIES - 1):
            try:
                return read(*args, **kwargs)
            except FileNotFoundError:
                time.sleep(0.05)
        return read(*args, **kwargs)

    return again


SAME_AS = "same_as_session"  # a session's params stored as a reference to an earlier one's


def resolve_params_refs(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest with each `{"same_as_session": id}` params replaced by that session's
    params (the referenced session always precedes it)."""
    seen: dict[str, Any] = {}
    sessions = []
    for s in manifest.get("sessions", []):
        p = s.get("params")
        if isinstance(p, dict) and set(p) == {SAME_AS}:
            s = {**s, "params": seen.get(p[SAME_AS])}
        seen[s.get("session_id")] = s.get("params")
        sessions.append(s)
    return {**manifest, "sessions": sessions}
