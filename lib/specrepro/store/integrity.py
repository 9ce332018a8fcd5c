"""Reading a results store's Parquet files, each one verified; a damaged one is set aside.

Design (result_store.py owns the store; this module owns what "a readable file" means):
- One reader, `read_table_file`, behind every read of a `cells/` or `requests/` file
  (files.read_rows, the store's attempt scan, merges, compaction): before the rows are
  read, the file is checked (`damage`): empty, truncated or not Parquet (its first and
  last four bytes are `PAR1`), or the wrong schema (a column of the table missing that is
  not one of `ADDED_COLUMNS`, or a column of another type; columns the table does not
  know are ignored, as the loaders ignore them, so an older checkout never sets aside a
  newer store's files). A file whose footer passes but whose pages do not read is
  damaged too (`unreadable`).
- A damaged file is moved, never deleted, to `<store>/quarantine/<table>--<name>` (an
  earlier quarantined file of the same name is kept: the next one gets `.2`, `.3`, ...),
  recorded in the store's manifest (`quarantined`: file, where it went, why, when, by
  which command), and named in one line on stderr; the reader goes on without it, so the
  rest of the store stays readable. The quarantine folder's files do not match the
  tables' `**/cells/*.parquet` pattern, so no loader reads them again.
- A file that vanished (another session merged it: sharing.vanishing_parts_retried)
  is not damage: FileNotFoundError goes to the caller.
- `verify_files` reads every file whole (compaction, before it folds a store), and returns
  what it set aside, for `specrepro compact` to report in its own words (`say=False`).
- Locks: the move takes none (a reader may hold a table folder's lock: a merge); the
  manifest edit takes the root's lock with a bound (`locked(root, wait_s)`), because an
  archive's `settled` takes the root's and then the table folders' shared locks: past the
  bound the line says the manifest was not updated; the quarantine folder still holds it.
"""
from __future__ import annotations

import datetime as dt
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from specrepro.store.schema import ADDED_COLUMNS, CELL_SCHEMA, LEGACY_ITL, REQUEST_SCHEMA
from specrepro.store.sharing import ManifestDamaged, locked, read_manifest, write_json

QUARANTINE = "quarantine"  # the folder of a store's set-aside files
MAGIC = b"PAR1"  # a Parquet file begins and ends with it
LEGACY_REPLACES = ("chunk_gap_us", "chunk_tokens")  # what a legacy file stores as LEGACY_ITL
MANIFEST_WAIT_S = 30.0


@dataclass(frozen=True)
class SetAside:
    """A damaged file: where it was, what was wrong, where it is now."""
    path: Path
    problem: str
    moved_to: Path | None  # None: it could not be moved (`note` says why)
    note: str = ""

    def line(self) -> str:
        """One line: the file, what was wrong, what was done."""
        done = (f"moved to {self.moved_to}" if self.moved_to is not None
                else "left in place and not read")
        note = f" ({self.note})" if self.note else ""
        return (f"specrepro: damaged results file {self.path}: {self.problem}; {done}{note}; "
                "the rest of the store is read")


def damage(f: Path, table: str) -> str | None:
    """What is wrong with f as a file of `table` (cells, requests), from its size, its
    magic bytes and its footer's schema; None where nothing is. FileNotFoundError passes."""
    size = f.stat().st_size
    if size == 0:
        return "empty (0 bytes)"
    with f.open("rb") as fh:
        head = fh.read(4)
        fh.seek(max(size - 4, 0))
        tail = fh.read(4)
    if head != MAGIC:
        return f"not a Parquet file ({size} bytes, does not begin with PAR1)"
    if size < 12 or tail != MAGIC:
        return f"truncated ({size} bytes, no Parquet footer: it does not end with PAR1)"
    try:
        found = pl.read_parquet_schema(f)
    except FileNotFoundError:
        raise
    except (pl.exceptions.PolarsError, OSError, pl.exceptions.PanicException) as err:
        return f"unreadable footer ({first_line(err)})"
    return wrong_schema(found, table)


def wrong_schema(found: dict[str, pl.DataType], table: str) -> str | None:
    """The columns of `table` that a file's schema lacks or stores as another type."""
    schema = CELL_SCHEMA if table == "cells" else REQUEST_SCHEMA
    may_lack = set(ADDED_COLUMNS) | (set(LEGACY_REPLACES) if LEGACY_ITL in found else set())
    missing = [c for c in schema if c not in found and c not in may_lack]
    other = [f"{c} is {found[c]}, expected {schema[c]}" for c in schema
             if c in found and found[c] != schema[c]]
    if not missing and not other:
        return None
    parts = ([f"missing column(s) {', '.join(missing)}"] if missing else []) + other
    return f"wrong schema for the {table} table: {'; '.join(parts)}"


def read_table_file(f: Path, table: str,
                    columns: Sequence[str] | None = None) -> pl.DataFrame | None:
    """f's rows (only `columns`, where given), or None where f is damaged: it is then set
    aside (`set_aside`) and the caller reads on without it."""
    problem = damage(f, table)
    if problem is None:
        try:
            return pl.read_parquet(f, columns=list(columns) if columns else None)
        except FileNotFoundError:
            raise
        except (pl.exceptions.PolarsError, OSError, pl.exceptions.PanicException) as err:
            problem = f"unreadable ({first_line(err)})"
    set_aside(f, table, problem)
    return None


def verify_files(files: Iterable[Path], table: str, say: bool = True) -> list[SetAside]:
    """Every file read whole; the damaged ones set aside (their line printed where `say`),
    and returned."""
    out = []
    for f in files:
        problem = damage(f, table)
        if problem is None:
            try:
                pl.read_parquet(f)
                continue
            except (pl.exceptions.PolarsError, OSError, pl.exceptions.PanicException) as err:
                problem = f"unreadable ({first_line(err)})"
        out.append(set_aside(f, table, problem, say))
    return out


def set_aside(f: Path, table: str, problem: str, say: bool = True) -> SetAside:
    """Move f to its store's quarantine folder (never over a file there), record it in
    the manifest, and print one line saying so (where `say`)."""
    root = f.parent.parent  # <store>/<table>/<name>
    note = ""
    try:
        moved: Path | None = move_aside(f, root / QUARANTINE, f"{table}--{f.name}")
    except OSError as err:  # a read-only store: say so, and read on without it
        moved, note = None, f"could not move it to {root / QUARANTINE}: {first_line(err)}"
    if moved is not None:
        try:
            _record(root, {"file": str(f.relative_to(root)),
                           "moved_to": str(moved.relative_to(root)), "problem": problem,
                           "at": dt.datetime.now(dt.UTC).isoformat(),
                           "by": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])})
            note = f"recorded in {root / 'manifest.json'}"
        except (OSError, TimeoutError, ManifestDamaged) as err:
            note = f"not recorded in the manifest: {first_line(err)}"
    done = SetAside(f, problem, moved, note)
    if say:
        print(done.line(), file=sys.stderr, flush=True)
    return done


def move_aside(f: Path, folder: Path, name: str) -> Path:
    """f linked into folder under name (or name.2, name.3, ... where that exists: link
    never replaces a file) and then unlinked from where it was."""
    folder.mkdir(exist_ok=True)
    stem, suffix = name.removesuffix(".parquet"), ".parquet" if name.endswith(".parquet") else ""
    n = 1
    while True:
        target = folder / (name if n == 1 else f"{stem}.{n}{suffix}")
        try:
            os.link(f, target)
            break
        except FileExistsError:
            n += 1
    os.unlink(f)
    for d in (folder, f.parent):  # both names, on disk
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return target


def _record(root: Path, entry: dict) -> None:
    """Append entry to the manifest's `quarantined` list (under the root's lock). A store
    without a manifest, or with a damaged one, is not given one here: its rebuild
    (manifest_rebuild.py) lists the quarantine folder's files."""
    if not (root / "manifest.json").is_file():
        raise FileNotFoundError(f"{root / 'manifest.json'} is missing: the next run or "
                                "`specrepro compact` rebuilds it, this file listed")
    with locked(root, wait_s=MANIFEST_WAIT_S):
        manifest = read_manifest(root)
        manifest.setdefault("quarantined", []).append(entry)
        write_json(manifest, root / "manifest.json")


def first_line(err: BaseException) -> str:
    """An error as one line: its type and its message's first line."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")
