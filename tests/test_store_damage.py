"""A damaged results file (truncated, empty, wrong schema) is named, set aside in the
store's quarantine/ folder and recorded in its manifest; the rest of the store stays
readable, through the loaders the notebooks use and through `specrepro compact`."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from conftest import store_cell_id as cid
from conftest import store_requests as requests_for
from specrepro.store import ResultStore, compaction, load_cells, load_requests
from specrepro.store.files import ALL_SESSIONS
from specrepro.store.integrity import damage

STUDY, RUN = "01_drafter_block_sweep", "r1"
REPO = Path(__file__).resolve().parents[1]


def session(results_dir: Path, cells: list[int]) -> ResultStore:
    store = ResultStore(results_dir, STUDY, RUN)
    store.begin_session({"params": {"cells": cells}})
    for n in cells:
        store.append_cell({"cell_id": cid(n), "status": "ok", "agg_tok_s": float(n)},
                          requests_for(n))
    store.end_session()
    return store


@pytest.fixture
def store(tmp_path: Path) -> ResultStore:
    """Two cells folded into session-all.parquet (a committed store), then a later
    session's two cells in their own session file: two files per table."""
    session(tmp_path, [1, 2])
    compaction.compact(tmp_path)
    later = session(tmp_path, [3, 4])
    assert {p.name for p in later.cells_dir.iterdir()} == {
        ALL_SESSIONS, f"session-{later.session_id}.parquet"}
    return later


def truncated(f: Path) -> str:
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return "truncated"


def emptied(f: Path) -> str:
    f.write_bytes(b"")
    return "empty (0 bytes)"


def wrong_schema(f: Path) -> str:
    """The file rewritten without two of its table's columns and with `attempt` a string."""
    df = pl.read_parquet(f)
    gone = ["status", "arm"] if "arm" in df.columns else ["request_idx", "ttft_s"]
    df.drop(gone).with_columns(pl.col("attempt").cast(pl.String)).write_parquet(f)
    return f"missing column(s) {', '.join(gone)}; attempt is String, expected Int64"


DAMAGES = [truncated, emptied, wrong_schema]


def manifest(store: ResultStore) -> dict:
    return json.loads(store.manifest_path.read_text())


def check_set_aside(store: ResultStore, table: str, what: str, damaged: bytes, err: str,
                    name: str = ALL_SESSIONS) -> None:
    """The reader's one line naming the file, what was wrong and where it went, and
    `check_quarantined`."""
    path = store.root / table / name
    moved = store.root / "quarantine" / f"{table}--{name}"
    lines = [ln for ln in err.splitlines() if "damaged results file" in ln]
    assert len(lines) == 1, err
    assert str(path) in lines[0] and what in lines[0] and f"moved to {moved}" in lines[0]
    assert not path.exists()
    check_quarantined(store, table, what, damaged, name)


def check_quarantined(store: ResultStore, table: str, what: str, damaged: bytes,
                      name: str = ALL_SESSIONS) -> None:
    """The bytes in quarantine/ as they were; the manifest's record."""
    moved = store.root / "quarantine" / f"{table}--{name}"
    assert moved.read_bytes() == damaged  # moved, never changed
    (entry,) = manifest(store)["quarantined"]
    assert entry["file"] == f"{table}/{name}"
    assert entry["moved_to"] == f"quarantine/{table}--{name}"
    assert what in entry["problem"] and entry["at"] and entry["by"]


@pytest.mark.parametrize("hurt", DAMAGES, ids=lambda d: d.__name__)
def test_damaged_cells_file_through_the_loaders(store, hurt, capsys):
    f = store.cells_dir / ALL_SESSIONS
    what = hurt(f)
    damaged = f.read_bytes()
    cells = load_cells(store.root.parents[1])  # what the notebooks read
    assert sorted(cells["cell_id"]) == sorted([cid(3), cid(4)])  # the later session's
    check_set_aside(store, "cells", what, damaged, capsys.readouterr().err)
    assert load_requests(store.root)["cell_id"].n_unique() == 2
    # read again: nothing more to say, the same rows
    assert load_cells(store.root).equals(cells)
    assert "damaged" not in capsys.readouterr().err


@pytest.mark.parametrize("hurt", DAMAGES, ids=lambda d: d.__name__)
def test_damaged_requests_file_through_the_loaders(store, hurt, capsys):
    f = store.requests_dir / ALL_SESSIONS
    what = hurt(f)
    damaged = f.read_bytes()
    reqs = load_requests(store.root)
    assert set(reqs["cell_id"]) == {cid(3), cid(4)} and reqs.height == 3 + 4
    check_set_aside(store, "requests", what, damaged, capsys.readouterr().err)
    assert load_cells(store.root).height == 4  # the cells table is whole


@pytest.mark.parametrize("table", ["cells", "requests"])
@pytest.mark.parametrize("hurt", DAMAGES, ids=lambda d: d.__name__)
def test_compact_verifies_and_reports_what_it_set_aside(store, table, hurt, capsys):
    f = store.root / table / ALL_SESSIONS
    what = hurt(f)
    damaged = f.read_bytes()
    assert compaction.main([str(store.root.parents[1])]) == 1  # the store lost rows: say so
    out, err = capsys.readouterr()
    (line,) = [ln for ln in out.splitlines() if ": set aside " in ln]  # one line a file
    assert line.startswith(f"{store.root}: set aside {table}/{ALL_SESSIONS}: ") and what in line
    assert f"-> quarantine/{table}--{ALL_SESSIONS} (recorded in " in line
    assert "1 damaged files set aside in quarantine/" in out and err == ""
    check_quarantined(store, table, what, damaged)
    # the rest compacted: the later session folded into session-all.parquet, readable
    for t in ("cells", "requests"):
        assert [p.name for p in (store.root / t).iterdir()] == [ALL_SESSIONS]
    kept = {cid(3), cid(4)} | ({cid(1), cid(2)} if table == "requests" else set())
    assert set(load_cells(store.root)["cell_id"]) == kept
    assert compaction.main([str(store.root)]) == 0  # nothing more to set aside
    assert "damaged" not in capsys.readouterr().err


def test_a_damaged_part_is_set_aside_and_the_session_still_merges(tmp_path, capsys):
    store = ResultStore(tmp_path, STUDY, RUN)
    store.begin_session()
    for n in (1, 2):
        store.append_cell({"cell_id": cid(n), "status": "ok"}, requests_for(1))
    part = store.cells_dir / store.part_name(cid(1), 1)
    emptied(part)
    store.end_session()
    assert "merge_error" not in manifest(store)["sessions"][0]
    assert list(store.cells_dir.iterdir()) == [store.cells_dir /
                                               f"session-{store.session_id}.parquet"]
    assert set(load_cells(store.root)["cell_id"]) == {cid(2)}
    check_set_aside(store, "cells", "empty", b"", capsys.readouterr().err, part.name)


def test_a_run_resumes_past_a_damaged_file(store, capsys):
    """What `specrepro run` reads first: the cells done (to skip) and the attempt numbers."""
    truncated(store.cells_dir / ALL_SESSIONS)
    again = ResultStore(store.root.parents[1], STUDY, RUN)
    assert again.completed_cell_ids() == {cid(3), cid(4)}  # 1 and 2 are measured again
    assert again.next_attempt(cid(3)) == 2
    assert capsys.readouterr().err.count("damaged results file") == 1


def test_quarantine_never_overwrites_an_earlier_file_of_the_same_name(store, capsys):
    emptied(store.cells_dir / ALL_SESSIONS)
    load_cells(store.root)
    compaction.compact(store.root)  # the later session's cells: a new session-all.parquet
    truncated(store.cells_dir / ALL_SESSIONS)
    second = (store.cells_dir / ALL_SESSIONS).read_bytes()
    assert load_cells(store.root).height == 0
    q = store.root / "quarantine"
    assert sorted(p.name for p in q.iterdir()) == [
        "cells--session-all.2.parquet", "cells--session-all.parquet"]
    assert (q / "cells--session-all.parquet").read_bytes() == b""
    assert (q / "cells--session-all.2.parquet").read_bytes() == second
    assert [e["moved_to"] for e in manifest(store)["quarantined"]] == [
        "quarantine/cells--session-all.parquet", "quarantine/cells--session-all.2.parquet"]


def test_what_is_not_damage(store, tmp_path):
    """A file with columns this checkout does not know (a newer store) or without a column
    added since (an older one) is read, not set aside."""
    f = store.cells_dir / ALL_SESSIONS
    df = pl.read_parquet(f)
    df.with_columns(pl.lit(1).alias("a_later_column")).drop("engine_busy_share").write_parquet(f)
    assert damage(f, "cells") is None
    assert load_cells(store.root).height == 4


def test_every_committed_store_file_passes():
    files = sorted(REPO.glob("results/**/*.parquet"))
    assert files
    bad = {str(f): why for f in files
           if (why := damage(f, "cells" if f.parent.name == "cells" else "requests"))}
    assert not bad
