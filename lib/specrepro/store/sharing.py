"""Sessions sharing one results store: what lets several `specrepro run --arm` processes
(acceptance-only arms side by side on one GPU) write one `<study>/<run_id>` at once, and
an archive or a reader look at it meanwhile (result_store.py owns the store itself).

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
- The manifest as a file (`read_manifest`, `write_json`: temp file + rename) lives here, so
  both the store (result_store.py) and what sets a damaged file aside (integrity.py) edit
  it under `locked(root)` the same way; a file that is no manifest (empty, truncated, not
  an object of sessions) raises `ManifestDamaged`, which manifest_rebuild.py answers.
- A live session (`hold_live`): a shared flock on the store's `logs/` folder from
  begin_session to end_session; `quiet(root)` takes it exclusively without waiting, so
  `specrepro compact` never rewrites a store, nor gzips a log, that a run is writing.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
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
def locked(folder: Path, wait_s: float | None = None):
    """An exclusive flock on a folder: a table folder for the length of a merge, the
    store's root for a read-modify-write of its manifest (sessions of one store may run
    at once: `specrepro run --arm`). With `wait_s`, TimeoutError after that long: for a
    caller that may hold a table folder's lock already, where an archive's `settled`
    (root, then table folders) waiting on it would otherwise wait forever."""
    import fcntl  # POSIX, as the harness is; imported here so reading needs none of it

    fd = os.open(folder, os.O_RDONLY)
    try:
        if wait_s is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            until = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > until:
                        raise TimeoutError(f"{folder}: still locked after {wait_s:g} s"
                                           ) from None
                    time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing releases the lock


class ManifestDamaged(ValueError):
    """A manifest.json that is not a manifest: empty, not JSON (a truncated write), or
    JSON of another shape. `path` names it and `problem` says what is wrong, in words;
    manifest_rebuild.py sets it aside and rebuilds it from the store's files."""

    def __init__(self, path: Path, problem: str):
        self.path, self.problem = Path(path), problem
        super().__init__(f"{path}: {problem}")


def manifest_problem(text: bytes) -> str | None:
    """What makes these bytes no manifest (None: a manifest): empty, not UTF-8, not JSON
    (where the parse stopped, of how many bytes: a truncated write stops at the end), or
    not an object with a list of session objects."""
    if not text.strip():
        return f"empty ({len(text)} bytes)"
    try:
        data = json.loads(text.decode("utf-8"))
    except UnicodeDecodeError as err:
        return f"not UTF-8 text (byte {err.start} of {len(text):,})"
    except json.JSONDecodeError as err:
        end = " (the end of the file: truncated)" if err.pos >= len(text.rstrip()) else ""
        return (f"not JSON: {err.msg} at line {err.lineno} column {err.colno}, byte "
                f"{err.pos:,} of {len(text):,}{end}")
    if not isinstance(data, dict):
        return f"not a JSON object (a {type(data).__name__})"
    sessions = data.get("sessions")
    if not isinstance(sessions, list) or not all(isinstance(s, dict) for s in sessions):
        return "no list of session objects under 'sessions'"
    return None


LIVE_FOLDER = "logs"  # the folder whose flock says a session is writing the store


def hold_live(root: Path) -> int:
    """Mark the store as written by a live session: a shared flock on its `logs/` folder,
    held until the returned descriptor is closed (end_session); the kernel drops it when
    the process dies, SIGKILL included, so a killed run leaves no stale mark. Sessions of
    one store (`--arm`) hold it side by side; one that starts while `specrepro compact`
    holds it exclusively waits for the compaction to end."""
    import fcntl

    folder = Path(root) / LIVE_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)  # not inherited by an engine's process (PEP 446)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


@contextlib.contextmanager
def quiet(root: Path):
    """The store with no live session, held so while the block runs (an exclusive flock
    on `logs/`, not waited for): BlockingIOError where a session is writing it."""
    import fcntl

    folder = Path(root) / LIVE_FOLDER
    if not folder.is_dir():  # no session ever began here: none is live
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


def read_manifest(root: Path) -> dict[str, Any]:
    """`<root>/manifest.json` as stored (params references unresolved), or the empty
    manifest of the run `<study>/<run_id>` that root names where there is none;
    ManifestDamaged where the file is no manifest (`manifest_problem`)."""
    path = Path(root) / "manifest.json"
    if path.is_file():
        text = path.read_bytes()
        if problem := manifest_problem(text):
            raise ManifestDamaged(path, problem)
        return json.loads(text)
    return {"study": Path(root).parent.name, "run_id": Path(root).name, "sessions": []}


def write_json(data: Any, path: Path) -> None:
    """Whole-file replace of a small JSON document via temp file + rename, keeping the
    file's mode, 0644 for a new one (mkstemp's 0600 would make a manifest private to
    whoever last edited it: a reader that records a quarantine, too)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True, default=str)
        fh.write("\n")
    os.replace(tmp, path)


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
