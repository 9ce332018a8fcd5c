"""The results store: append-only Parquet tables of cells and requests, and a manifest.

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
  hard-linked into place (which fails rather than replace an existing file). The requests
  part is written before the cells part, so a cell row implies its requests. A killed
  session keeps every part it wrote.
- Merging (`end_session`, and `compact()` / `specrepro compact DIR` for killed sessions and
  old stores): a session's parts, and whatever its merged file already holds, are written
  to a temporary file, fsynced and renamed over `session-<id>.parquet`; only once its keys
  are read back from there are the parts deleted. Parts without a session id go to the
  session of the manifest that was running when the attempt started (`session-unknown`
  where none was). It runs under an exclusive flock on the table folder, so two merges
  never race; merging again changes nothing.
- Resume: `completed_cell_ids()` are the cells with an `ok` attempt; a re-run skips them.
  The loader returns, per cell, the latest `ok` attempt; failed attempts stay on disk.
  Attempt numbers continue from the highest on disk, parts and merged files alike.
- Manifest: begin_session(info) takes what only the caller knows (`params`: the resolved
  study; `engines`: name, version, flags, argv; `models`: ids and revisions) and adds git
  commit and dirty flag, package versions, host, GPU/driver/CUDA (NVML) and the start time;
  update_session() adds engines as they launch, end_session() the end time.
- Columns: results_schema.py (every file has the same columns and types).
- Damage: every file is read through store_integrity.read_table_file, which sets a
  damaged one (empty, truncated, wrong schema) aside in `<store>/quarantine/`, records it
  in the manifest and names it in one line; the loaders read the rest.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import tempfile
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

# the manifest stores params objects as the cell ids hash them (pydantic in JSON mode)
from specrepro.identity import jsonable
from specrepro.metrics import chunks_from_gaps
from specrepro.provenance import git_state, gpu_info, host_info, package_versions

# the tables' columns (one home: results_schema.py), re-exported for the store's readers
from specrepro.results_schema import (
    ADDED_COLUMNS,
    CELL_REQUIRED,
    CELL_SCHEMA,
    DEFAULTS,
    LEGACY_ITL,
    REQUEST_REQUIRED,
    REQUEST_SCHEMA,
    STATUSES,
)
from specrepro.store_integrity import read_table_file

# settled is re-exported: an archive takes it from here (harness/deadline.py)
from specrepro.store_sharing import (  # noqa: F401
    SAME_AS,
    locked,
    read_manifest,
    resolve_params_refs,
    settled,
    vanishing_parts_retried,
)
from specrepro.store_sharing import write_json as _write_json

# Session ids are `<UTC time>-<6 hex>` (begin_session); `unknown` names the merged file of
# old parts that no session of the manifest covers.
_SESSION = r"\d{8}T\d{6}Z-[0-9a-f]{6}"
_PART = re.compile(
    rf"^(?P<cell>[0-9a-f]{{16}})-a(?P<attempt>\d+)(?:--(?P<session>{_SESSION}))?\.parquet$")
UNKNOWN_SESSION = "unknown"
ALL = "all"  # compact folds every merged session file into session-all.parquet
_MERGED = re.compile(rf"^session-(?P<session>{_SESSION}|{UNKNOWN_SESSION}|{ALL})\.parquet$")
ALL_SESSIONS = f"session-{ALL}.parquet"
# What keys a row: an attempt is written once, so a key read twice is the same row.
KEYS = {"cells": ["cell_id", "attempt"], "requests": ["cell_id", "attempt", "request_idx"]}


class ResultsError(ValueError):
    """A row or a store is wrong; the message names the column, cell or file."""


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# --------------------------------------------------------------------- normalising


def _coerce(column: str, dtype: pl.DataType, value: Any, where: str) -> Any:
    """Make a value fit its column's type, or fail naming the column."""
    if value is None:
        return None
    if isinstance(value, float) and math.isnan(value) and dtype != pl.Float64:
        return None
    try:
        if dtype == pl.Int64:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise TypeError
            return int(value)
        if dtype == pl.Float64:
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        if dtype == pl.Boolean:
            if not isinstance(value, bool):
                raise TypeError
            return value
        if dtype == pl.String:
            if isinstance(value, (list, dict)):
                return json.dumps(value, sort_keys=True)
            return str(value)
        if isinstance(dtype, pl.Datetime):
            if isinstance(value, str):
                value = dt.datetime.fromisoformat(value)
            if not isinstance(value, dt.datetime):
                raise TypeError
            return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        if isinstance(dtype, pl.List):
            if not isinstance(value, (list, tuple)):
                raise TypeError
            return [_coerce(column, dtype.inner, v, where) for v in value]
    except (TypeError, ValueError):
        raise ResultsError(f"{where}: column {column!r}: expected {dtype}, found {value!r}"
                           ) from None
    return value


def normalize(row: Mapping[str, Any], schema: Mapping[str, pl.DataType],
              required: Iterable[str], where: str) -> dict[str, Any]:
    """A row with every schema column, defaults filled in and values coerced."""
    unknown = [k for k in row if k not in schema]
    if unknown:
        raise ResultsError(
            f"{where}: unknown column(s) {unknown}; expected columns of {', '.join(schema)}")
    missing = [k for k in required if row.get(k) is None]
    if missing:
        raise ResultsError(f"{where}: missing required column(s) {missing}")
    out = {}
    for column, dtype in schema.items():
        value = row.get(column, DEFAULTS.get(column) if schema is CELL_SCHEMA else None)
        out[column] = _coerce(column, dtype, value, where)
    return out


def frame(rows: list[dict], schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=dict(schema), orient="row") if rows else empty(schema)


def empty(schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(schema=dict(schema))


# ----------------------------------------------------------------------- writing


def _fsync(path: Path) -> None:
    """Flush a file, or a folder's entries (a new name, a removed one), to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# zstd at 19, not polars' 3: the requests' timing and token ids are most of a committed
# store, and 19 writes a whole session's requests (144,000 chunk gaps) in 0.16 s at 75 % of
# level 3's bytes. No column statistics: nothing here filters on them, and for a file of a
# few cells they are a quarter of its bytes
PARQUET_ZSTD_LEVEL = 19


def _temp_parquet(df: pl.DataFrame, folder: Path, name: str) -> str:
    """df written and fsynced under a temporary name in folder (the caller renames it)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        df.write_parquet(tmp, compression_level=PARQUET_ZSTD_LEVEL, statistics=False)
        _fsync(Path(tmp))
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def write_part(df: pl.DataFrame, path: Path) -> None:
    """Write a Parquet part atomically, refusing to replace an existing file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_parquet(df, path.parent, path.name)
    try:
        os.link(tmp, path)  # atomic, and fails with FileExistsError where rename would replace
    except FileExistsError:
        raise ResultsError(f"{path}: part file exists; attempts are never overwritten") from None
    finally:
        os.unlink(tmp)
    _fsync(path.parent)


# ----------------------------------------------------------------------- reading


def _files(root: Path, table: str) -> list[Path]:
    """Merged session files and parts of a table, in every run folder at or under root."""
    return sorted(p for p in Path(root).glob(f"**/{table}/*.parquet")
                  if _PART.match(p.name) or _MERGED.match(p.name))


def _read(files: Iterable[Path], table: str) -> pl.DataFrame:
    """The rows of these files, each key once (a merged file and leftover parts of the same
    session hold the same rows), in the schema's column order; a damaged file is set aside
    (store_integrity) and the others read."""
    schema = CELL_SCHEMA if table == "cells" else REQUEST_SCHEMA
    frames = [_session_named(_with_added(df, schema), f).select(list(schema))
              for f in files if (df := read_table_file(f, table)) is not None]
    if not frames:
        return empty(schema)
    keys = KEYS[table] if table == "requests" else ["study", "run_id", *KEYS[table]]
    return pl.concat(frames, how="vertical").unique(keys, keep="first", maintain_order=True)


def _session_named(df: pl.DataFrame, f: Path) -> pl.DataFrame:
    """Cells rows written before rows named their session take it from their file's name
    (`session-<id>.parquet`, `<cell>-a<n>--<id>.parquet`), so folding files keeps it."""
    if "session_id" not in df.columns or not df["session_id"].is_null().any():
        return df
    m = _MERGED.match(f.name) or _PART.match(f.name)
    session = m["session"] if m else None
    if session in (None, UNKNOWN_SESSION, ALL):
        return df
    return df.with_columns(pl.col("session_id").fill_null(pl.lit(session)))


def _with_added(df: pl.DataFrame, schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    """A file written before one of ADDED_COLUMNS existed, with that column null; a
    requests file written before the chunks were kept, with them (`_chunks_of_legacy`)."""
    if "chunk_gap_us" in schema and "chunk_gap_us" not in df.columns and LEGACY_ITL in df.columns:
        df = _chunks_of_legacy(df)
    return df.with_columns(pl.lit(None, schema[c]).alias(c)
                           for c in ADDED_COLUMNS if c in schema and c not in df.columns)


def _chunks_of_legacy(df: pl.DataFrame) -> pl.DataFrame:
    """A legacy requests file's per-token gaps as the chunks they were split from
    (metrics.chunks_from_gaps), the gaps dropped: the same timing to the microsecond, at
    about a third of the bytes (float seconds do not compress)."""
    pairs = [chunks_from_gaps(t, g or []) for t, g in
             zip(df["ttft_s"].to_list(), df[LEGACY_ITL].to_list(), strict=True)]
    return df.drop(LEGACY_ITL).with_columns(
        pl.Series("chunk_gap_us", [p[0] for p in pairs], pl.List(pl.Int32)),
        pl.Series("chunk_tokens", [p[1] for p in pairs], pl.List(pl.Int32)))


@vanishing_parts_retried
def load_attempts(path: Path | str) -> pl.DataFrame:
    """Every attempt (ok, failed, interrupted) under a run directory or any directory above."""
    return _read(_files(Path(path), "cells"), "cells")


def load_cells(path: Path | str) -> pl.DataFrame:
    """Per cell (within its study and run), the latest attempt whose status is ok."""
    cells = load_attempts(path).filter(pl.col("status") == "ok")
    keys = ["study", "run_id", "cell_id"]
    return (cells.sort("attempt").group_by(keys, maintain_order=True).last()
            .select(list(CELL_SCHEMA))
            .sort(["study", "run_id", "arm", "workload", "concurrency", "temperature", "repeat",
                   "cell_id"],
                  nulls_last=True))


@vanishing_parts_retried
def load_requests(path: Path | str, cells: pl.DataFrame | None = None) -> pl.DataFrame:
    """The requests of the attempts load_cells() chooses (or of the cells given)."""
    root = Path(path)
    chosen = (load_cells(root) if cells is None else cells).select(
        ["study", "run_id", "cell_id", "attempt"])
    by_run: dict[Path, list[Path]] = {}
    for f in _files(root, "requests"):
        by_run.setdefault(f.parent.parent, []).append(f)
    frames = []
    for run_dir, files in by_run.items():
        study, run_id = run_dir.parent.name, run_dir.name
        want = chosen.filter((pl.col("study") == study) & (pl.col("run_id") == run_id))
        if not want.height:
            continue
        hit = _read(files, "requests").join(want.select(KEYS["cells"]), on=KEYS["cells"],
                                            how="semi")
        if hit.height:
            frames.append(hit.with_columns(pl.lit(study).alias("study"),
                                           pl.lit(run_id).alias("run_id")))
    if not frames:
        return empty(REQUEST_SCHEMA).with_columns(
            pl.lit(None, pl.String).alias("study"), pl.lit(None, pl.String).alias("run_id"))
    return pl.concat(frames, how="vertical").sort(["cell_id", "request_idx"])


def _same_params(sessions: list[dict], params: Any) -> str | None:
    """The first of these (resolved) sessions whose params equal `params`, by id: what a
    session's params become a reference to (`same_as_session`)."""
    return next((e["session_id"] for e in sessions if e.get("params") == params), None)


# ------------------------------------------------------------------------- store

class ResultStore:
    """One run of one study: `<results_dir>/<study>/<run_id>/`."""

    def __init__(self, results_dir: Path | str, study: str, run_id: str):
        self.study, self.run_id = study, run_id
        self.root = Path(results_dir) / study / run_id
        self.cells_dir = self.root / "cells"
        self.requests_dir = self.root / "requests"
        self.logs_dir = self.root / "logs"
        self.manifest_path = self.root / "manifest.json"
        self.session_id: str | None = None
        self._attempts: dict[str, int] | None = None  # cell_id -> highest attempt on disk

    # -- manifest -----------------------------------------------------------------

    def _raw_manifest(self) -> dict[str, Any]:
        """manifest.json as stored: a session whose params equal an earlier session's holds
        `{"same_as_session": <id>}` instead of a copy (many sessions of one study, as arms
        run side by side, would otherwise store the whole resolved study each)."""
        return read_manifest(self.root)

    def manifest(self) -> dict[str, Any]:
        """The manifest with every session's params whole (references resolved)."""
        return resolve_params_refs(self._raw_manifest())

    def begin_session(self, manifest_info: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Append a session to manifest.json: the caller's info (resolved params, engines
        with name/version/flags/argv, model ids and revisions) plus what the store finds
        itself (git, package versions, host, GPU, start time). Returns the session."""
        for d in (self.cells_dir, self.requests_dir, self.logs_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.session_id = f"{now():%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"
        session = {
            "session_id": self.session_id,
            "started_at": now().isoformat(),
            "ended_at": None,
            "status": "running",
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
            manifest = self._raw_manifest()
            stored = dict(session)
            if session["params"] is not None:
                same = _same_params(resolve_params_refs(manifest)["sessions"],
                                    session["params"])
                if same is not None:
                    stored["params"] = {SAME_AS: same}
            manifest["sessions"].append(stored)
            _write_json(manifest, self.manifest_path)
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

        return self._edit_session(change)

    def _edit_session(self, change: Any) -> dict[str, Any]:
        if self.session_id is None:
            raise ResultsError(f"{self.root}: no session begun (call begin_session first)")
        with locked(self.root):
            manifest = self._raw_manifest()
            session = next(s for s in manifest["sessions"]
                           if s["session_id"] == self.session_id)
            change(session)
            _write_json(manifest, self.manifest_path)
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
                    if m := _PART.match(f.name):
                        pairs = [(m["cell"], int(m["attempt"]))]
                    elif _MERGED.match(f.name):
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
        """Cells with an ok attempt in this run: a re-run skips them."""
        ok = load_attempts(self.root).filter(pl.col("status") == "ok")
        return set(ok["cell_id"].to_list())

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
        return self._merge({self.session_id})

    def dedupe_manifest(self) -> int:
        """Rewrite manifest.json with every session's params that equal an earlier
        session's as a reference to it (what begin_session writes today; manifests written
        before kept a copy each). Lossless: manifest() reads the same. Returns how many
        sessions became references."""
        if not self.manifest_path.is_file():
            return 0
        with locked(self.root):
            raw = self._raw_manifest()
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
                _write_json(raw, self.manifest_path)
        return n

    def _merge(self, sessions: set[str] | None) -> dict[str, int]:
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
            if not (m := _PART.match(f.name)):
                continue
            if m["session"] is None:
                legacy.append(f)
            elif sessions is None or m["session"] in sessions:
                groups.setdefault(m["session"], []).append(f)
        if legacy and sessions is None:
            for f, session in zip(legacy, self._sessions_of(legacy), strict=True):
                groups.setdefault(session, []).append(f)
        for session, parts in groups.items():
            _merge_parts(folder / f"session-{session}.parquet", parts, table)
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
            m = _PART.match(part.name)
            at = started.get((m["cell"], int(m["attempt"])))
            out.append(next((sid for t, sid in reversed(starts) if at is not None and t <= at),
                            UNKNOWN_SESSION))
        return out


def _merge_parts(target: Path, parts: list[Path], table: str) -> None:
    """parts (and what target already holds) into target, then the parts deleted: temp
    file, fsync, rename over target, fsync the folder; a part goes only once every key it
    holds is read back from target. Merging parts already merged changes nothing."""
    merged = _read(([target] if target.exists() else []) + parts, table).sort(KEYS[table])
    parts = [p for p in parts if p.exists()]  # reading set the damaged ones aside
    if not parts:
        return
    before = read_table_file(target, table, KEYS[table]) if target.exists() else None
    if before is None or merged.height > before.height:
        tmp = _temp_parquet(merged, target.parent, target.name)
        os.replace(tmp, target)
        _fsync(target.parent)
    kept = read_table_file(target, table, KEYS[table])
    for part in parts:
        keys = read_table_file(part, table, KEYS[table])  # None: set aside in quarantine/
        if kept is None or (keys is not None
                            and keys.join(kept, on=KEYS[table], how="anti").height):
            raise ResultsError(f"{target}: rows of {part.name} missing after the merge; "
                               "the part is kept")
        if keys is not None:
            part.unlink()
    _fsync(target.parent)
