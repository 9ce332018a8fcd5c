"""What the analysis reads from a results store: cells and requests as the loaders choose them.

Design: a loader takes a run folder or any folder above one (a study, a results dir) and
reads every table file under it, merged files and parts alike (files.read_rows: each key
once, damaged files set aside). Per cell the latest attempt whose status is `ok` counts;
failed and interrupted attempts stay on disk and in `load_attempts`. `requests_missing`
names the chosen attempts whose requests are not all stored (a requests file set aside in
quarantine/, or removed): such a cell is not done (`ResultStore.completed_cell_ids`), so a
run measures it again; its cells row stays readable meanwhile. Readers take no lock:
a part another session merges away between the listing and the read is read again
(sharing.vanishing_parts_retried), its rows then in the merged file.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from specrepro.store.files import KEYS, read_keys, read_rows, table_files
from specrepro.store.rows import empty
from specrepro.store.schema import CELL_SCHEMA, REQUEST_SCHEMA
from specrepro.store.sharing import vanishing_parts_retried


@vanishing_parts_retried
def load_attempts(path: Path | str) -> pl.DataFrame:
    """Every attempt (ok, failed, interrupted) under a run directory or any directory above."""
    return read_rows(table_files(Path(path), "cells"), "cells")


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
    """The requests of the attempts load_cells() chooses (or of the cells given). A cell
    filed from another study's measurement (`shared_from`: harness/shared_cells.py) keeps
    no requests of its own: they are read from the measured attempt, in the store of that
    study beside this one (same results folder and run id), under this cell's id."""
    root = Path(path)
    picked = load_cells(root) if cells is None else cells
    chosen = picked.select(["study", "run_id", "cell_id", "attempt"])
    by_run: dict[Path, list[Path]] = {}
    for f in table_files(root, "requests"):
        by_run.setdefault(f.parent.parent, []).append(f)
    frames = []
    for run_dir, files in by_run.items():
        study, run_id = run_dir.parent.name, run_dir.name
        want = chosen.filter((pl.col("study") == study) & (pl.col("run_id") == run_id))
        if not want.height:
            continue
        hit = read_rows(files, "requests").join(want.select(KEYS["cells"]),
                                                on=KEYS["cells"], how="semi")
        if hit.height:
            frames.append(hit.with_columns(pl.lit(study).alias("study"),
                                           pl.lit(run_id).alias("run_id")))
    own = {(f["study"][0], c) for f in frames for c in f["cell_id"].unique().to_list()}
    frames += shared_requests(root, picked, own)
    if not frames:
        return empty(REQUEST_SCHEMA).with_columns(
            pl.lit(None, pl.String).alias("study"), pl.lit(None, pl.String).alias("run_id"))
    return pl.concat(frames, how="vertical").sort(["cell_id", "request_idx"])


def shared_requests(root: Path, cells: pl.DataFrame, own: set[tuple[str, str]]
                    ) -> list[pl.DataFrame]:
    """The requests of cells filed from another study's attempt (`shared_from`
    "<study>/<cell_id>") that hold none of their own (`own`: (study, cell id) found), read
    from that study's store beside theirs and keyed as theirs."""
    if "shared_from" not in cells.columns:
        return []
    copies = cells.filter(pl.col("shared_from").is_not_null())
    copies = copies.filter(pl.Series([(st, c) not in own for st, c in
                                      copies.select("study", "cell_id").iter_rows()],
                                     dtype=pl.Boolean))
    if not copies.height:
        return []
    runs = {f.parent.parent for f in table_files(root, "cells")}
    wanted: dict[Path, list[tuple[dict, str]]] = {}  # source store -> (copy, source cell id)
    for row in copies.iter_rows(named=True):
        run = next((r for r in runs if (r.parent.name, r.name) == (row["study"],
                                                                    row["run_id"])), None)
        src_study, _, src_cid = row["shared_from"].partition("/")
        if run is not None and src_cid:
            src = run.parent.parent / src_study / run.name
            if (src / "cells").is_dir():
                wanted.setdefault(src, []).append((row, src_cid))
    out = []
    for src, items in wanted.items():  # each source store read once
        measured = load_cells(src).filter(pl.col("cell_id").is_in([c for _, c in items]))
        reqs = load_requests(src, measured)
        for row, src_cid in items:
            hit = reqs.filter(pl.col("cell_id") == src_cid)
            if hit.height:
                out.append(hit.with_columns(pl.lit(row["cell_id"]).alias("cell_id"),
                                            pl.lit(row["attempt"]).cast(hit.schema["attempt"])
                                            .alias("attempt"),
                                            pl.lit(row["study"]).alias("study"),
                                            pl.lit(row["run_id"]).alias("run_id")))
    return out


def requests_missing(path: Path | str, cells: pl.DataFrame | None = None) -> pl.DataFrame:
    """The attempts `load_cells` chooses under path whose requests are not all stored:
    fewer request rows than the attempt's `n_requests` (a requests file set aside in
    quarantine/, or removed). A copy filed from another study's attempt (`shared_from`)
    holds none of its own: it counts as missing where its measured attempt is, in the
    store beside it. Columns: study, run_id, cell_id, attempt, n_requests, stored (rows
    found; `cells`: load_cells(path), where the caller has them). Reads the requests
    files' keys only."""
    root = Path(path)
    cells = load_cells(root) if cells is None else cells
    if "shared_from" not in cells.columns:  # pragma: no cover - the schema has it
        cells = cells.with_columns(pl.lit(None, pl.String).alias("shared_from"))
    out = [_own_missing(root, cells.filter(pl.col("shared_from").is_null()))]
    copies = cells.filter(pl.col("shared_from").is_not_null())
    for (study, run_id), rows in copies.group_by(["study", "run_id"], maintain_order=True):
        run = _run_folder(root, study, run_id)
        by_src: dict[str, list[dict]] = {}
        for row in rows.iter_rows(named=True):
            by_src.setdefault(row["shared_from"].partition("/")[0], []).append(row)
        for src_study, items in by_src.items():
            src = run.parent.parent / src_study / run.name if run is not None else None
            measured = load_cells(src) if src is not None and src.is_dir() else None
            found = set() if measured is None else set(measured["cell_id"].to_list())
            lost = set() if measured is None else set(
                _own_missing(src, measured.filter(pl.col("shared_from").is_null()))["cell_id"]
                .to_list())
            gone = [r for r in items if (c := r["shared_from"].partition("/")[2]) not in found
                    or c in lost]
            if gone:
                out.append(pl.DataFrame(
                    [{"study": r["study"], "run_id": r["run_id"], "cell_id": r["cell_id"],
                      "attempt": r["attempt"], "n_requests": r["n_requests"], "stored": 0}
                     for r in gone], schema=MISSING_SCHEMA))
    return pl.concat(out, how="vertical")


MISSING_SCHEMA = {"study": pl.String, "run_id": pl.String, "cell_id": pl.String,
                  "attempt": pl.Int64, "n_requests": pl.Int64, "stored": pl.Int64}


def _run_folder(root: Path, study: str, run_id: str) -> Path | None:
    """The run folder of (study, run_id) at or under root."""
    for run in {f.parent.parent for f in table_files(root, "cells")}:
        if (run.parent.name, run.name) == (study, run_id):
            return run
    return None


def _own_missing(root: Path, cells: pl.DataFrame) -> pl.DataFrame:
    """Of these measured attempts (no copies), those with fewer stored request rows than
    their `n_requests`, counted per run folder (requests rows name no study or run)."""
    want = cells.filter(pl.col("n_requests").fill_null(0) > 0)
    if not want.height:
        return pl.DataFrame(schema=MISSING_SCHEMA)
    by_run: dict[Path, list[Path]] = {}
    for f in table_files(root, "requests"):
        by_run.setdefault(f.parent.parent, []).append(f)
    counts = [read_keys(files, "requests").group_by(KEYS["cells"]).len("stored")
              .with_columns(pl.lit(run.parent.name).alias("study"),
                            pl.lit(run.name).alias("run_id"))
              for run, files in by_run.items()]
    keys = ["study", "run_id", *KEYS["cells"]]
    stored = (pl.concat(counts, how="vertical").select(*keys, pl.col("stored").cast(pl.Int64))
              if counts else pl.DataFrame(schema={k: MISSING_SCHEMA[k] for k in
                                                  [*keys, "stored"]}))
    return (want.select(*keys, "n_requests").join(stored, on=keys, how="left")
            .with_columns(pl.col("stored").fill_null(0))
            .filter(pl.col("stored") < pl.col("n_requests"))
            .select(list(MISSING_SCHEMA)))
