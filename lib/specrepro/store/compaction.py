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
Run it on a store no session is writing.
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
from specrepro.store.integrity import SetAside, read_table_file, verify_files
from specrepro.store.result_store import ResultStore
from specrepro.store.rows import ResultsError
from specrepro.store.schema import LEGACY_ITL
from specrepro.store.sharing import locked


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
    done: dict = store.merge()
    store.dedupe_manifest()
    done["upgraded"] = upgrade_requests(store)
    done["folded"] = fold_sessions(store)
    done["logs_packed"] = len([pack_log(f) for f in sorted(store.logs_dir.glob("*.log"))])
    if quarantined:
        done["quarantined"] = quarantined
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


def compact(path: Path | str) -> dict[Path, dict[str, int]]:
    """`compact_store` on every run folder at or under path (a results dir, a study, a
    run). Returns {run folder: what compact_store returned for it}."""
    root = Path(path)
    runs = sorted({f.parent.parent for t in KEYS for f in table_files(root, t)}
                  | {m.parent for m in root.glob("**/manifest.json")})
    return {run: compact_store(ResultStore(run.parent.parent, run.parent.name, run.name))
            for run in runs}


def main(argv: list[str] | None = None) -> int:
    """`specrepro compact DIR...`: make results stores ready to commit (merge the parts of
    killed sessions, fold session files, rewrite legacy requests, gzip engine logs)."""
    ap = argparse.ArgumentParser(prog="specrepro compact", description=main.__doc__)
    ap.add_argument("dirs", nargs="+", type=Path,
                    help="a results dir (results/default), a study's folder or one run's")
    args = ap.parse_args(argv)
    missing = [str(d) for d in args.dirs if not d.is_dir()]
    if missing:
        print(f"specrepro compact: no such directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    code = 0
    for d in args.dirs:
        for run, merged in compact(d).items():
            for bad in merged.get("quarantined", []):
                print(f"{run}: set aside {bad.path.relative_to(run)}: {bad.problem} -> "
                      + (str(bad.moved_to.relative_to(run)) if bad.moved_to else "not moved")
                      + (f" ({bad.note})" if bad.note else ""))
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
                     if merged.get("quarantined") else ""))
    return code
