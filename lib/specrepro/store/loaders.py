"""What the analysis reads from a results store: cells and requests as the loaders choose them.

Design: a loader takes a run folder or any folder above one (a study, a results dir) and
reads every table file under it, merged files and parts alike (files.read_rows: each key
once, damaged files set aside). Per cell the latest attempt whose status is `ok` counts;
failed and interrupted attempts stay on disk and in `load_attempts`. Readers take no lock:
a part another session merges away between the listing and the read is read again
(sharing.vanishing_parts_retried), its rows then in the merged file.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from specrepro.store.files import KEYS, read_rows, table_files
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
