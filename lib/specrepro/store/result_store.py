"""One run of one study's results store (`ResultStore`): sessions, attempts, merges.

Design (docs/architecture.md "Contract: results"):
- Layout: `<results_dir>/<study>/<run_id>/` with `cells/` and `requests/`, `manifest.json`
  (one entry per session that wrote to this run) and `logs/`. A table folder holds, per
  session (one `specrepro run` or measuring notebook), one merged file
  `session-<session_id>.parquet`, plus, while a session runs (or after one was killed), one
  part file per attempt, `<cell_id>-a<attempt>--<session_id>.parquet` (stores written before
  sessions merged: `<cell_id>-a<attempt>.parquet`, still read). `specrepro compact` folds the
  merged files into one `session-all.parquet` per table before a store is committed. An
  engine's log, `logs/<arm>--<profile>.log` while it runs, is gzipped when it stops
  (`<arm>--<profile>.log.gz`, one gzip member per launch: `zcat` reads them all).
- A **cell** is one arm x workload x concurrency x sampling x repeat; its `cell_id`
  (`specrepro.identity.cell_id`) hashes everything that defines it, so a changed parameter
  is a new cell, measured anew. An **attempt** (cell_id, attempt number) is written once and
  never changed: that pair keys a cells row (and with request_idx a requests row), and the
  loaders drop a row whose key they have already read, so a merged file and leftover parts
  of the same session never count twice.
- Writing: every attempt is a part file, written to a temporary name, fsynced and
  hard-linked into place (files.write_part: it fails rather than replace a file). The
  requests part is written before the cells part, so a cell row implies its requests. A
  killed session keeps every part it wrote.
- Merging (`end_session`, and `compact()` / `specrepro compact DIR` for killed sessions and
  old stores): a session's parts, and whatever its merged file already holds, are written
  to a temporary file, fsynced and renamed over `session-<id>.parquet`; only once its keys
  are read back from there are the parts deleted. Parts without a session id go to the
  session of the manifest that was running when the attempt started (`session-unknown`
  where none was). It runs under an exclusive flock on the table folder, so two merges
  never race; merging again changes nothing (files.merge_parts).
- Resume: `completed_cell_ids()` are the cells with an `ok` attempt whose requests are all
  stored (loaders.requests_missing: a requests file set aside or removed makes its cells
  pending again, said in one line); a re-run skips them.
  The loaders (loaders.py) return, per cell, the latest `ok` attempt; failed attempts stay
  on disk.
  Attempt numbers continue from the highest on disk, parts and merged files alike.
- Manifest: begin_session(info) takes what only the caller knows (`params`: the resolved
  study; `engines`: name, version, flags, argv; `models`: ids and revisions) and adds git
  commit and dirty flag, package versions, host, GPU/driver/CUDA (NVML) and the start time;
  update_session() adds engines as they launch, end_session() the end time. A session
  holds the store's live mark from begin to end (sharing.hold_live: `specrepro compact`
  refuses the store meanwhile) and records its pid. A damaged manifest, or one missing
  from a store with files, is rebuilt before it is read (manifest_rebuild.py); `study`
  and `run_id` are one folder name each (`NAME`), so a store never leaves its results
  folder.
- Columns: schema.py (every file has the same columns and types; rows.normalize).
- Damage: every file is read through integrity.read_table_file, which sets a
  damaged one (empty, truncated, wrong schema) aside in `<store>/quarantine/`, records it
  in the manifest and names it in one line; the loaders read the rest.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import sys
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

from specrepro.folder_names import NAME_PATTERN

# the manifest stores params objects as the cell ids hash them (pydantic in JSON mode)
from specrepro.identity import jsonable
from specrepro.provenance import git_state, gpu_info, host_info, package_versions
from specrepro.store.files import KEYS, MERGED, PART, UNKNOWN_SESSION, merge_parts, write_part
from specrepro.store.integrity import read_table_file
from specrepro.store.loaders import load_attempts, load_cells, load_requests, requests_missing
from specrepro.store.manifest_rebuild import checked_manifest
from specrepro.store.rows import ResultsError, frame, normalize
from specrepro.store.schema import (
    CELL_REQUIRED,
    CELL_SCHEMA,
    REQUEST_REQUIRED,
    REQUEST_SCHEMA,
    STATUSES,
)
from specrepro.store.sharing import (
    SAME_AS,
    hold_live,
    locked,
    read_manifest,
    resolve_params_refs,
    write_json,
)

# A study's and a run's name are one folder each under the results folder (folder_names.py)
NAME = re.compile(NAME_PATTERN)


def now() -> dt.datetime:
    """The store's clock, timezone-aware UTC: sessions' and attempts' times."""
    return dt.datetime.now(dt.UTC)


def _same_params(sessions: list[dict], params: Any) -> str | None:
    """The first of these (resolved) sessions whose params equal `params`, by id: what a
    session's params become a reference to (`same_as_session`)."""
    return next((e["session_id"] for e in sessions if e.get("params") == params), None)


# ------------------------------------------------------------------------- store

class ResultStore:
    """One run of one study: `<results_dir>/<study>/<run_id>/`."""

    def __init__(self, results_dir: Path | str, study: str, run_id: str):
        for what, name in (("study", study), ("run_id", run_id)):
            if not isinstance(name, str) or not NAME.fullmatch(name):
                raise ResultsError(f"{what} {name!r}: expected one folder name (letters, "
                                   "digits, '_', '.', '-', not starting with '.' or '-'), so "
                                   f"the store stays inside the results folder {results_dir}")
        self.study, self.run_id = study, run_id
        self.root = Path(results_dir) / study / run_id
        self.cells_dir = self.root / "cells"
        self.requests_dir = self.root / "requests"
        self.logs_dir = self.root / "logs"
        self.manifest_path = self.root / "manifest.json"
        self.session_id: str | None = None
        self._live: int | None = None  # the live mark's descriptor (sharing.hold_live)
        self._attempts: dict[str, int] | None = None  # cell_id -> highest attempt on disk

    # -- manifest -----------------------------------------------------------------

    def _raw_manifest(self) -> dict[str, Any]:
        """manifest.json as stored: a session whose params equal an earlier session's holds
        `{"same_as_session": <id>}` instead of a copy (many sessions of one study, as arms
        run side by side, would otherwise store the whole resolved study each). A damaged
        one, or one missing from a store with files, is rebuilt first (manifest_rebuild.py);
        under the root's lock read it with `read_manifest`, having called this before."""
        return checked_manifest(self.root)

    def manifest(self) -> dict[str, Any]:
        """The manifest with every session's params whole (references resolved)."""
        return resolve_params_refs(self._raw_manifest())

    def begin_session(self, manifest_info: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Append a session to manifest.json: the caller's info (resolved params, engines
        with name/version/flags/argv, model ids and revisions) plus what the store finds
        itself (git, package versions, host, GPU, start time). Returns the session."""
        self._raw_manifest()  # a damaged or missing one rebuilt, before the lock is taken
        for d in (self.cells_dir, self.requests_dir, self.logs_dir):
            d.mkdir(parents=True, exist_ok=True)
        if self._live is None:
            self._live = hold_live(self.root)  # compact leaves the store alone meanwhile
        self.session_id = f"{now():%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"
        session = {
            "session_id": self.session_id,
            "started_at": now().isoformat(),
            "ended_at": None,
            "status": "running",
            "pid": os.getpid(),
            "git": git_state(),
            "packages": package_versions(),
            "host": host_info(),
            "gpu": gpu_info(),
            "params": None,
            "engines": [],
            "models": [],
            "probes": [],
            **jsonable(dict(manifest_info or {})),
        }
        with locked(self.root):  # another session may be editing it (runner: --arm)
            manifest = read_manifest(self.root)
            stored = dict(session)
            if session["params"] is not None:
                same = _same_params(resolve_params_refs(manifest)["sessions"],
                                    session["params"])
                if same is not None:
                    stored["params"] = {SAME_AS: same}
            manifest["sessions"].append(stored)
            write_json(manifest, self.manifest_path)
        return session

    def update_session(self, **info: Any) -> dict[str, Any]:
        """Add or replace keys of the current session (e.g. engine version once launched);
        list values for `engines`, `models` and `probes` are appended to."""

        def change(session: dict) -> None:
            for key, value in jsonable(info).items():
                if key in ("engines", "models", "probes") and isinstance(session.get(key),
                                                                         list):
                    session[key] += value if isinstance(value, list) else [value]
                else:
                    session[key] = value

        return self._edit_session(change)

    def end_session(self, status: str = "ok") -> dict[str, Any]:
        """End time and status, after merging this session's parts into its session file;
        a merge that fails keeps the parts (nothing is lost) and says so in the session."""
        error = None
        try:
            self.merge_session()
        except (OSError, ResultsError, pl.exceptions.PolarsError) as err:
            error = f"{type(err).__name__}: {err}; the parts stay; `specrepro compact` merges them"

        def change(session: dict) -> None:
            session["ended_at"] = now().isoformat()
            session["status"] = status
            if error:
                session["merge_error"] = error

        try:
            return self._edit_session(change)
        finally:
            if self._live is not None:  # the store is no longer being written
                os.close(self._live)
                self._live = None

    def _edit_session(self, change: Any) -> dict[str, Any]:
        if self.session_id is None:
            raise ResultsError(f"{self.root}: no session begun (call begin_session first)")
        self._raw_manifest()  # rebuilt before the lock where it was damaged meanwhile
        with locked(self.root):
            manifest = read_manifest(self.root)
            session = next(s for s in manifest["sessions"]
                           if s["session_id"] == self.session_id)
            change(session)
            write_json(manifest, self.manifest_path)
        return session

    # -- attempts -----------------------------------------------------------------

    def part_name(self, cell_id: str, attempt: int) -> str:
        """`<cell_id>-a<attempt>--<session_id>.parquet` (without a session: no suffix)."""
        suffix = f"--{self.session_id}" if self.session_id else ""
        return f"{cell_id}-a{attempt:03d}{suffix}.parquet"

    def _scan(self) -> dict[str, int]:
        """cell_id -> highest attempt on disk, from part names and merged files' keys."""
        if self._attempts is None:
            self._attempts = {}
            for table, folder in (("cells", self.cells_dir), ("requests", self.requests_dir)):
                for f in folder.glob("*.parquet"):
                    if m := PART.match(f.name):
                        pairs = [(m["cell"], int(m["attempt"]))]
                    elif MERGED.match(f.name):
                        keys = read_table_file(f, table, KEYS["cells"])
                        pairs = [] if keys is None else keys.unique().rows()
                    else:
                        continue
                    for cid, n in pairs:
                        self._attempts[cid] = max(n, self._attempts.get(cid, 0))
        return self._attempts

    def next_attempt(self, cell_id: str) -> int:
        """1 for a cell never tried here, else one past the highest attempt on disk."""
        return self._scan().get(cell_id, 0) + 1

    def append_cell(self, row: Mapping[str, Any],
                    requests_rows: Iterable[Mapping[str, Any]] = ()) -> pl.DataFrame:
        """Write one attempt: its requests part, then its cells part. `attempt` defaults
        to next_attempt(cell_id); study and run_id come from the store."""
        row = dict(row)
        cid = row.get("cell_id")
        if not isinstance(cid, str) or not re.fullmatch(r"[0-9a-f]{16}", cid):
            raise ResultsError(
                f"{self.root}: cell row: expected cell_id from cell_id(), found {cid!r}")
        row.setdefault("attempt", self.next_attempt(cid))
        row.setdefault("study", self.study)
        row.setdefault("run_id", self.run_id)
        row.setdefault("session_id", self.session_id)
        if (row["study"], row["run_id"]) != (self.study, self.run_id):
            raise ResultsError(f"{self.root}: cell {cid}: row names study/run "
                               f"{row['study']}/{row['run_id']}, store is {self.study}/"
                               f"{self.run_id}")
        if row.get("status") not in STATUSES:
            raise ResultsError(f"{self.root}: cell {cid}: column 'status': expected one of "
                               f"{STATUSES}, found {row.get('status')!r}")
        where = f"{self.root}: cell {cid} attempt {row['attempt']}"
        cell = normalize(row, CELL_SCHEMA, CELL_REQUIRED, where)
        reqs = [normalize({"cell_id": cid, "attempt": cell["attempt"], **r}, REQUEST_SCHEMA,
                          REQUEST_REQUIRED, f"{where}, request {i}")
                for i, r in enumerate(requests_rows)]
        for r in reqs:
            if (r["cell_id"], r["attempt"]) != (cid, cell["attempt"]):
                raise ResultsError(f"{where}: request {r['request_idx']} names cell "
                                   f"{r['cell_id']} attempt {r['attempt']}")
        if cell["attempt"] <= self._scan().get(cid, 0):  # on disk, as a part or merged
            raise ResultsError(f"{where}: attempt exists; attempts are never overwritten")
        name = self.part_name(cid, cell["attempt"])
        write_part(frame(reqs, REQUEST_SCHEMA), self.requests_dir / name)
        df = frame([cell], CELL_SCHEMA)
        write_part(df, self.cells_dir / name)
        attempts = self._scan()
        attempts[cid] = max(cell["attempt"], attempts.get(cid, 0))
        return df

    def completed_cell_ids(self) -> set[str]:
        """Cells with an ok attempt in this run whose requests are all stored: a re-run
        skips them. One whose requests are not (a requests file set aside in quarantine/,
        or removed: loaders.requests_missing) is measured again, said in one line."""
        cells = load_cells(self.root)
        lost = requests_missing(self.root, cells)
        if lost.height:
            print(f"specrepro: {self.root}: the requests of {lost.height} cells with an ok "
                  f"attempt are not stored ({lost['stored'].sum()} of "
                  f"{lost['n_requests'].sum()} rows found: a requests file was set aside in "
                  f"{self.root / 'quarantine'}/ or removed); they are measured again",
                  file=sys.stderr, flush=True)
        return set(cells["cell_id"].to_list()) - set(lost["cell_id"].to_list())

    def load_attempts(self) -> pl.DataFrame:
        return load_attempts(self.root)

    def load_cells(self) -> pl.DataFrame:
        return load_cells(self.root)

    def load_requests(self) -> pl.DataFrame:
        return load_requests(self.root)

    # -- merging ------------------------------------------------------------------

    def merge_session(self) -> dict[str, int]:
        """This session's parts into `session-<id>.parquet` per table; parts merged."""
        if self.session_id is None:
            raise ResultsError(f"{self.root}: no session begun (call begin_session first)")
        return self.merge({self.session_id})

    def dedupe_manifest(self) -> int:
        """Rewrite manifest.json with every session's params that equal an earlier
        session's as a reference to it (what begin_session writes today; manifests written
        before kept a copy each). Lossless: manifest() reads the same. Returns how many
        sessions became references."""
        if not self.manifest_path.is_file():
            return 0
        self._raw_manifest()  # a damaged one rebuilt before the lock is taken
        with locked(self.root):
            raw = read_manifest(self.root)
            whole = resolve_params_refs(raw)["sessions"]
            n = 0
            for i, (s, full) in enumerate(zip(raw["sessions"], whole, strict=True)):
                p = full.get("params")
                if p is None or (isinstance(s.get("params"), dict)
                                 and set(s["params"]) == {SAME_AS}):
                    continue
                same = _same_params(whole[:i], p)
                if same is not None:
                    s["params"] = {SAME_AS: same}
                    n += 1
            if n:
                write_json(raw, self.manifest_path)
        return n

    def merge(self, sessions: set[str] | None = None) -> dict[str, int]:
        """These sessions' parts into their `session-<id>.parquet` per table (None: every
        part of the run, sessionless ones under the manifest session that was running when
        their attempt started: compaction). Returns the parts merged per table."""
        done = {}
        for table, folder in (("requests", self.requests_dir), ("cells", self.cells_dir)):
            if folder.is_dir():
                with locked(folder):
                    done[table] = self._merge_table(table, folder, sessions)
        return done

    def _merge_table(self, table: str, folder: Path, sessions: set[str] | None) -> int:
        for stale in folder.glob(".session-*.tmp"):  # a merge killed before its rename; only
            stale.unlink()                           # merges, under this lock, write these
        groups: dict[str, list[Path]] = {}
        legacy = []
        for f in sorted(folder.glob("*.parquet")):
            if not (m := PART.match(f.name)):
                continue
            if m["session"] is None:
                legacy.append(f)
            elif sessions is None or m["session"] in sessions:
                groups.setdefault(m["session"], []).append(f)
        if legacy and sessions is None:
            for f, session in zip(legacy, self._sessions_of(legacy), strict=True):
                groups.setdefault(session, []).append(f)
        for session, parts in groups.items():
            merge_parts(folder / f"session-{session}.parquet", parts, table)
        return sum(len(p) for p in groups.values())

    def _sessions_of(self, parts: list[Path]) -> list[str]:
        """The manifest session each sessionless part was written in: the last session that
        had begun when its attempt started (its cells row's started_at)."""
        starts = sorted((dt.datetime.fromisoformat(s["started_at"]), s["session_id"])
                        for s in self.manifest()["sessions"] if s.get("started_at"))
        started = {(c, a): t for c, a, t in
                   load_attempts(self.root).select("cell_id", "attempt", "started_at").rows()}
        out = []
        for part in parts:
            m = PART.match(part.name)
            at = started.get((m["cell"], int(m["attempt"])))
            out.append(next((sid for t, sid in reversed(starts) if at is not None and t <= at),
                            UNKNOWN_SESSION))
        return out
