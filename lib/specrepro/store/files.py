"""A results table on disk: its files' names, how one is written, read and merged.

Design (the store's layout: result_store.py; docs/architecture.md "Contract: results"):
- Names: a table folder (`cells/`, `requests/`) holds one part per attempt,
  `<cell_id>-a<NNN>--<session_id>.parquet` (`<cell_id>-a<NNN>.parquet` in stores written
  before sessions merged), one merged file per session, `session-<session_id>.parquet`
  (`session-unknown` for old parts no session of the manifest covers), and after
  compaction `session-all.parquet`. Only names matching `PART` or `MERGED` are table files.
- Writing: a file is written to a temporary name in its folder and fsynced; a part is
  hard-linked into place (never replacing one: an attempt is written once), a merged file
  renamed over its name.
- Reading (`read_rows`): every file through integrity.read_table_file (a damaged one is
  set aside), columns added since a file was written read as null, a legacy requests file's
  per-token gaps read as chunks, a row's session taken from its file's name where the row
  lacks it, and each key (`KEYS`) kept once: a merged file and leftover parts of the same
  session hold the same rows.
- Merging (`merge_parts`): parts and what the target holds, written to a temporary file and
  renamed over the target; a part is deleted only once every key it holds is read back
  from the target, so a merge killed anywhere loses nothing and merging again changes
  nothing. The caller holds the table folder's lock (sharing.locked).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import polars as pl

from specrepro.metrics import chunks_from_gaps
from specrepro.store.integrity import read_table_file
from specrepro.store.rows import ResultsError, empty
from specrepro.store.schema import ADDED_COLUMNS, CELL_SCHEMA, LEGACY_ITL, REQUEST_SCHEMA

# Session ids are `<UTC time>-<6 hex>` (begin_session); `unknown` names the merged file of
# old parts that no session of the manifest covers.
SESSION_ID = r"\d{8}T\d{6}Z-[0-9a-f]{6}"
PART = re.compile(
    rf"^(?P<cell>[0-9a-f]{{16}})-a(?P<attempt>\d+)(?:--(?P<session>{SESSION_ID}))?\.parquet$")
UNKNOWN_SESSION = "unknown"
ALL = "all"  # compact folds every merged session file into session-all.parquet
MERGED = re.compile(rf"^session-(?P<session>{SESSION_ID}|{UNKNOWN_SESSION}|{ALL})\.parquet$")
ALL_SESSIONS = f"session-{ALL}.parquet"
# What keys a row: an attempt is written once, so a key read twice is the same row.
KEYS = {"cells": ["cell_id", "attempt"], "requests": ["cell_id", "attempt", "request_idx"]}

# ----------------------------------------------------------------------- writing


def fsync(path: Path) -> None:
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


def temp_parquet(df: pl.DataFrame, folder: Path, name: str) -> str:
    """df written and fsynced under a temporary name in folder (the caller renames it)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        df.write_parquet(tmp, compression_level=PARQUET_ZSTD_LEVEL, statistics=False)
        fsync(Path(tmp))
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def write_part(df: pl.DataFrame, path: Path) -> None:
    """Write a Parquet part atomically, refusing to replace an existing file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_parquet(df, path.parent, path.name)
    try:
        os.link(tmp, path)  # atomic, and fails with FileExistsError where rename would replace
    except FileExistsError:
        raise ResultsError(f"{path}: part file exists; attempts are never overwritten") from None
    finally:
        os.unlink(tmp)
    fsync(path.parent)


# ----------------------------------------------------------------------- reading


def table_files(root: Path, table: str) -> list[Path]:
    """Merged session files and parts of a table, in every run folder at or under root."""
    return sorted(p for p in Path(root).glob(f"**/{table}/*.parquet")
                  if PART.match(p.name) or MERGED.match(p.name))


def read_rows(files: Iterable[Path], table: str) -> pl.DataFrame:
    """The rows of these files, each key once (a merged file and leftover parts of the same
    session hold the same rows), in the schema's column order; a damaged file is set aside
    (integrity.py) and the others read."""
    schema = CELL_SCHEMA if table == "cells" else REQUEST_SCHEMA
    frames = [_session_named(_with_added(df, schema), f).select(list(schema))
              for f in files if (df := read_table_file(f, table)) is not None]
    if not frames:
        return empty(schema)
    keys = KEYS[table] if table == "requests" else ["study", "run_id", *KEYS[table]]
    return pl.concat(frames, how="vertical").unique(keys, keep="first", maintain_order=True)


def read_keys(files: Iterable[Path], table: str) -> pl.DataFrame:
    """The keys (`KEYS[table]`) these files hold, each once, read alone (a requests file's
    timing and texts are most of its bytes); a damaged file is set aside as `read_rows`
    sets it aside."""
    keys = KEYS[table]
    frames = [df for f in files if (df := read_table_file(f, table, keys)) is not None]
    if not frames:
        return empty({k: (CELL_SCHEMA if table == "cells" else REQUEST_SCHEMA)[k] for k in keys})
    return pl.concat(frames, how="vertical").unique(keys)


def _session_named(df: pl.DataFrame, f: Path) -> pl.DataFrame:
    """Cells rows written before rows named their session take it from their file's name
    (`session-<id>.parquet`, `<cell>-a<n>--<id>.parquet`), so folding files keeps it."""
    if "session_id" not in df.columns or not df["session_id"].is_null().any():
        return df
    m = MERGED.match(f.name) or PART.match(f.name)
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


# ----------------------------------------------------------------------- merging


def merge_parts(target: Path, parts: list[Path], table: str) -> None:
    """parts (and what target already holds) into target, then the parts deleted: temp
    file, fsync, rename over target, fsync the folder; a part goes only once every key it
    holds is read back from target. Merging parts already merged changes nothing."""
    merged = read_rows(([target] if target.exists() else []) + parts, table).sort(KEYS[table])
    parts = [p for p in parts if p.exists()]  # reading set the damaged ones aside
    if not parts:
        return
    before = read_table_file(target, table, KEYS[table]) if target.exists() else None
    if before is None or merged.height > before.height:
        tmp = temp_parquet(merged, target.parent, target.name)
        os.replace(tmp, target)
        fsync(target.parent)
    kept = read_table_file(target, table, KEYS[table])
    for part in parts:
        keys = read_table_file(part, table, KEYS[table])  # None: set aside in quarantine/
        if kept is None or (keys is not None
                            and keys.join(kept, on=KEYS[table], how="anti").height):
            raise ResultsError(f"{target}: rows of {part.name} missing after the merge; "
                               "the part is kept")
        if keys is not None:
            part.unlink()
    fsync(target.parent)
