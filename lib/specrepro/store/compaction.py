"""A results store made ready to commit: `specrepro compact DIR...`.

Design: a store is written append-only while sessions run (result_store.py); before it is
committed, compaction rewrites its files into their smallest lossless form, each step
checked before anything is deleted, and each run again changes nothing:
- every table file read whole first (integrity.verify_files): a damaged one (empty,
  truncated, wrong schema) is moved to `<store>/quarantine/`, recorded in the manifest and
  reported, and compaction goes on with the rest (exit status 1: the store lost rows);
- parts of killed sessions merged into their session's file (ResultStore.merge), and the
  manifest's repeated session params stored once (ResultStore.dedupe_manifest);
- legacy requests files (per-token gaps in float seconds) rewritten as the chunks they were
  split from, once every request's gaps read back within a microsecond (`upgrade_requests`);
- every merged session file of a table folded into one `session-all.parquet`
  (`fold_sessions`): a Parquet footer is most of a file of a few cells; each row keeps its
  session in its `session_id` column;
- engine logs gzipped, one gzip member per launch (`pack_log`; the runner packs each log
  when its engine stops, compact those a killed session left).
What it acts on (`stores`): the folder it is pointed at where that is a store (a run's
folder: `manifest.json`, `cells/` or `requests/`), else the stores one level below it (a
study's runs) or two (a results folder's `<study>/<run_id>`, as `results/default`), listed
before it acts; nothing deeper is searched, so pointing it at `/tmp` or a home folder
touches no store that happens to lie somewhere below. A store a session is writing
(sharing.hold_live) is refused, naming the session; a damaged or missing manifest is
rebuilt (manifest_rebuild.py) and reported; a store that fails is reported and the next
one compacted (exit status 1 where any store was refused, lost rows or failed).
"""
from __future__ import annotations

import argparse
import gzip
import os
import sys
from pathlib import Path

from specrepro.metrics import token_gaps_s
from specrepro.store.files import (
    ALL_SESSIONS,
    KEYS,
    MERGED,
    fsync,
    merge_parts,
    read_rows,
    table_files,
    temp_parquet,
)
from specrepro.store.integrity import SetAside, first_line, read_table_file, verify_files
from specrepro.store.loaders import requests_missing
from specrepro.store.manifest_rebuild import MANIFEST, rebuild
from specrepro.store.result_store import ResultStore
from specrepro.store.rows import ResultsError
from specrepro.store.schema import LEGACY_ITL
from specrepro.store.sharing import ManifestDamaged, locked, quiet, read_manifest


def pack_log(path: Path | str) -> Path:
    """An engine log (`<name>.log`, plain while its engine runs: the harness parses it) as
    one more gzip member of `<name>.log.gz`, then the plain file removed: gzip members
    concatenate, so `zcat` reads every launch's lines in order. A launch's log is mostly
    access lines and repeats; gzipped it is about a tenth."""
    path = Path(path)
    packed = path.with_name(path.name + ".gz")
    data = path.read_bytes()
    with packed.open("ab") as fh:
        fh.write(gzip.compress(data, mtime=0))
        fh.flush()
        os.fsync(fh.fileno())
    path.unlink()
    return packed


def append_log(path: Path | str, text: str) -> Path:
    """`text` as one more gzip member of `<path>.gz` (a launch's log copied into the store
    of another study that ran on it)."""
    packed = Path(str(path) + ".gz")
    packed.parent.mkdir(parents=True, exist_ok=True)
    with packed.open("ab") as fh:
        fh.write(gzip.compress(text.encode(), mtime=0))
    return packed


def compact_store(store: ResultStore) -> dict[str, int | list[SetAside]]:
    """Every table file verified (the damaged set aside: `quarantined`), every part of
    this run into its session's merged file (killed sessions, old stores), the manifest
    with each repeated session params stored once, legacy requests files with chunks
    (`upgrade_requests`), the session files folded into one per table (`fold_sessions`)
    and plain engine logs gzipped (`pack_log`): run it on a store no session is writing,
    before committing. Returns the parts merged per table, `upgraded` (requests files
    rewritten), `folded` (session files folded), `logs_packed` and, where any file was
    set aside, `quarantined` (integrity.SetAside, one a file)."""
    quarantined = [bad for t in KEYS  # main reports them
                   for bad in verify_files(table_files(store.root, t), t, say=False)]
    manifest = None  # what was wrong with the manifest, where it was rebuilt
    try:
        read_manifest(store.root)
        if not store.manifest_path.exists() and table_files(store.root, "cells"):
            manifest = "missing"
            rebuild(store.root, None)
    except ManifestDamaged as err:
        manifest = err.problem
        rebuild(store.root, err)
    done: dict = store.merge()
    store.dedupe_manifest()
    done["upgraded"] = upgrade_requests(store)
    done["folded"] = fold_sessions(store)
    done["logs_packed"] = len([pack_log(f) for f in sorted(store.logs_dir.glob("*.log"))])
    if quarantined:
        done["quarantined"] = quarantined
    if manifest:
        done["manifest"] = manifest
    lost = requests_missing(store.root)
    if lost.height:
        done["requests_missing"] = lost.height
    return done


def fold_sessions(store: ResultStore) -> int:
    """Every merged session file of each table into one `session-all.parquet`: a
    Parquet file's footer (some 10 KB for the cells table's 56 columns) is most of a
    file of a few cells, and a committed store is read whole. Under the table's lock,
    as a merge (`merge_parts`: a file goes only once its keys are read back). Which
    session measured a row stays in the row (`session_id`, filled from the file's name
    for rows written before rows named it). Returns the files folded in."""
    n = 0
    for table, folder in (("requests", store.requests_dir), ("cells", store.cells_dir)):
        if not folder.is_dir():
            continue
        with locked(folder):
            files = [f for f in sorted(folder.glob("session-*.parquet"))
                     if f.name != ALL_SESSIONS and MERGED.match(f.name)]
            if files:
                merge_parts(folder / ALL_SESSIONS, files, table)
                n += len(files)
    return n


def upgrade_requests(store: ResultStore) -> int:
    """Rewrite each merged requests file that still stores per-token gaps as the chunks
    they came from (as files.read_rows reads them), once the gaps read back from the chunks
    (metrics.token_gaps_s) match the stored ones to the microsecond, row by row; at the
    first file that does not, compaction stops with an error naming it and the request,
    and that file is kept as it is. Returns the files rewritten."""
    if not store.requests_dir.is_dir():
        return 0
    n = 0
    with locked(store.requests_dir):
        for f in sorted(store.requests_dir.glob("session-*.parquet")):
            old = read_table_file(f, "requests")
            if old is None or LEGACY_ITL not in old.columns:
                continue
            new = read_rows([f], "requests")
            for key, gaps, (at, m) in zip(
                    old.select(KEYS["requests"]).rows(), old[LEGACY_ITL].to_list(),
                    new.select("chunk_gap_us", "chunk_tokens").rows(), strict=True):
                back = token_gaps_s(at, m)
                gaps = gaps or []
                if len(back) != len(gaps) or any(abs(a - b) * (m_i or 1) > 1.5e-6 for
                                                 a, b, m_i in zip(back, gaps, _per_token(m))):
                    raise ResultsError(f"{f}: request {key}: the chunks do not give back "
                                       "its stored gaps to the microsecond; file kept")
            os.replace(temp_parquet(new.sort(KEYS["requests"]), f.parent, f.name), f)
            fsync(f.parent)
            n += 1
    return n


def _per_token(chunk_tokens: list[int]) -> list[int]:
    """Each token's chunk size (the first chunk's first token excluded: it has no gap)."""
    out = [m for m in chunk_tokens for _ in range(m)]
    return out[1:]


def stores(path: Path | str) -> list[Path]:
    """The stores `specrepro compact` acts on for a folder: the folder itself where it is
    one, else those one level below it, else two (module docstring); never deeper."""
    root = Path(path)
    if _is_store(root):
        return [root]
    for pattern in ("*", "*/*"):
        found = sorted(d for d in root.glob(pattern) if d.is_dir() and _is_store(d))
        if found:
            return found
    return []


def _is_store(d: Path) -> bool:
    return (d / MANIFEST).is_file() or (d / "cells").is_dir() or (d / "requests").is_dir()


def compact(path: Path | str) -> dict[Path, dict[str, int]]:
    """`compact_store` on every store `stores(path)` finds (a run's folder, a study's, a
    results folder). Returns {run folder: what compact_store returned for it}."""
    return {run: compact_store(ResultStore(run.parent.parent, run.parent.name, run.name))
            for run in stores(path)}


class StoreLive(ResultsError):
    """A session is writing the store: compaction would rewrite its files under it."""


def compact_quiet(run: Path) -> dict:
    """compact_store on one store that no session is writing (sharing.quiet), held so
    while it runs; StoreLive naming the running sessions where one is."""
    try:
        with quiet(run):
            return compact_store(ResultStore(run.parent.parent, run.parent.name, run.name))
    except BlockingIOError:
        try:
            live = [s for s in read_manifest(run)["sessions"] if s.get("status") == "running"]
        except ManifestDamaged:
            live = []
        who = "; ".join(f"session {s.get('session_id')} (pid {s.get('pid', '?')} on "
                        f"{(s.get('host') or {}).get('hostname', '?')}, started "
                        f"{s.get('started_at')})" for s in live) or "a session"
        raise StoreLive(f"a run is writing it ({who}): not compacted; compact it once the "
                        "run has ended") from None


def main(argv: list[str] | None = None) -> int:
    """`specrepro compact DIR...`: make results stores ready to commit (merge the parts of
    killed sessions, fold session files, rewrite legacy requests, gzip engine logs)."""
    ap = argparse.ArgumentParser(prog="specrepro compact", description=main.__doc__)
    ap.add_argument("dirs", nargs="+", type=Path,
                    help="a run's folder (results/default/07_the_bill/default), a study's "
                         "folder (its runs) or a results folder (results/default: its "
                         "studies' runs); nothing deeper is searched")
    args = ap.parse_args(argv)
    missing = [str(d) for d in args.dirs if not d.exists()]
    if missing:
        print(f"specrepro compact: no such directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    files = [str(d) for d in args.dirs if not d.is_dir()]
    if files:
        print(f"specrepro compact: not a folder: {', '.join(files)} (give a run's folder, a "
              "study's or a results folder)", file=sys.stderr)
        return 2
    found = {d: stores(d) for d in args.dirs}
    empty = [str(d) for d, runs in found.items() if not runs]
    if empty:
        print(f"specrepro compact: no results store in {', '.join(empty)} nor one or two "
              "levels below it (a store is a run's folder, <results>/<study>/<run_id>, "
              "holding manifest.json, cells/ or requests/); nothing was changed",
              file=sys.stderr)
        return 2
    code = 0
    for d, runs in found.items():
        print(f"specrepro compact: {len(runs)} store{'s' if len(runs) != 1 else ''} in {d}: "
              + ", ".join(str(r.relative_to(d)) if r != d else "." for r in runs), flush=True)
        for run in runs:
            try:
                merged = compact_quiet(run)
            except (ResultsError, OSError) as err:  # reported; the next store is compacted
                print(f"{run}: {err if isinstance(err, StoreLive) else first_line(err)}",
                      flush=True)
                code = 1
                continue
            code = max(code, report(run, merged))
    return code


def report(run: Path, merged: dict) -> int:
    """What compaction did to one store, one line each: a file set aside, a manifest
    rebuilt, requests not stored, then the summary; 1 where the store lost anything."""
    code = 0
    for bad in merged.get("quarantined", []):
        print(f"{run}: set aside {bad.path.relative_to(run)}: {bad.problem} -> "
              + (str(bad.moved_to.relative_to(run)) if bad.moved_to else "not moved")
              + (f" ({bad.note})" if bad.note else ""))
        code = 1
    if merged.get("manifest"):
        what = ("was missing:" if merged["manifest"] == "missing"
                else f"was damaged ({merged['manifest']}): set aside in quarantine/ and")
        print(f"{run}: {MANIFEST} {what} rebuilt from the cells rows (each session's "
              "params, command and engine argv lost)")
        code = 1
    if merged.get("requests_missing"):
        print(f"{run}: the requests of {merged['requests_missing']} cells are not stored: "
              "`specrepro run` measures them again")
        code = 1
    files = {t: len(list((run / t).glob("session-*.parquet"))) for t in KEYS}
    print(f"{run}: merged {merged.get('cells', 0)} cells and "
          f"{merged.get('requests', 0)} requests parts; now {files['cells']} cells "
          f"and {files['requests']} requests files"
          + (f"; {merged['upgraded']} requests files rewritten from per-token gaps "
             "to chunks" if merged.get("upgraded") else "")
          + (f"; {merged['folded']} session files folded into {ALL_SESSIONS}"
             if merged.get("folded") else "")
          + (f"; {merged['logs_packed']} logs gzipped" if merged.get("logs_packed")
             else "")
          + (f"; {len(merged['quarantined'])} damaged files set aside in quarantine/"
             if merged.get("quarantined") else ""), flush=True)
    return code
