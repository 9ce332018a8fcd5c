"""The results store (specrepro.store): append-only attempts, resume, the loader's choice of attempt, schema, manifest."""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest

from specrepro.identity import digest
from specrepro.store import (
    CELL_SCHEMA,
    REQUEST_SCHEMA,
    ResultsError,
    ResultStore,
    compaction,
    load_attempts,
    load_cells,
    load_requests,
    now,
)
from specrepro.store import files as store_files


def cid(n: int) -> str:
    return digest(arm={"name": "a", "k": 5}, concurrency=n, seed=0)


def requests_for(n: int, text: str = "x") -> list[dict]:
    return [
        {
            "request_idx": i,
            "prompt_id": f"p{i}",
            "ttft_s": 0.1,
            "chunk_gap_us": [100_000, 10_000],
            "chunk_tokens": [1, 1],
            "text": text,
            "token_ids": [1, 2],
            "completion_tokens": 2,
        }
        for i in range(n)
    ]


@pytest.fixture
def store(tmp_path: Path) -> ResultStore:
    s = ResultStore(tmp_path, "01_drafter_block_sweep", "r1")
    s.begin_session({"params": {"concurrency": [1, 2]}})
    return s


def test_cell_id_is_stable_and_sensitive():
    a = digest(arm={"name": "a", "k": 5}, concurrency=1, seed=0)
    assert a == digest(seed=0, concurrency=1, arm={"k": 5, "name": "a"})  # key order
    assert len(a) == 16 and int(a, 16) >= 0
    assert a != digest(arm={"name": "a", "k": 7}, concurrency=1, seed=0)


def test_attempts_append_and_never_overwrite(store: ResultStore):
    c = cid(1)
    assert store.next_attempt(c) == 1
    store.append_cell({"cell_id": c, "status": "failed", "error": "engine died"})
    a1, a2 = (f"{c}-a00{n}--{store.session_id}.parquet" for n in (1, 2))
    first = (store.cells_dir / a1).read_bytes()
    assert store.next_attempt(c) == 2
    store.append_cell({"cell_id": c, "status": "ok", "agg_tok_s": 12.5}, requests_for(2))
    assert sorted(p.name for p in store.cells_dir.iterdir()) == [a1, a2]
    assert (store.cells_dir / a1).read_bytes() == first
    with pytest.raises(ResultsError, match="never overwritten"):
        store.append_cell({"cell_id": c, "attempt": 1, "status": "ok"})
    assert (store.cells_dir / a1).read_bytes() == first
    # a new store on the same directory numbers on from what is on disk
    again = ResultStore(store.root.parents[1], store.study, store.run_id)
    assert again.next_attempt(c) == 3
    assert not list(store.cells_dir.glob(".*"))  # no temp files left behind


def test_resume_skips_only_cells_with_an_ok_attempt(store: ResultStore):
    store.append_cell({"cell_id": cid(1), "status": "ok"})
    store.append_cell({"cell_id": cid(2), "status": "failed", "error": "timeout"})
    store.append_cell({"cell_id": cid(4), "status": "interrupted"})
    store.append_cell({"cell_id": cid(8), "status": "failed"})
    store.append_cell({"cell_id": cid(8), "status": "ok"})
    assert store.completed_cell_ids() == {cid(1), cid(8)}


def test_loader_takes_latest_ok_attempt_and_keeps_failed(store: ResultStore):
    c = cid(1)
    store.append_cell({"cell_id": c, "status": "ok", "agg_tok_s": 1.0}, requests_for(1, "one"))
    store.append_cell({"cell_id": c, "status": "ok", "agg_tok_s": 2.0}, requests_for(2, "two"))
    store.append_cell({"cell_id": c, "status": "failed", "agg_tok_s": 3.0}, requests_for(1, "3"))
    store.append_cell({"cell_id": cid(2), "status": "failed"})
    cells = load_cells(store.root)
    assert cells.height == 1
    assert cells.row(0, named=True)["attempt"] == 2
    assert cells.row(0, named=True)["agg_tok_s"] == 2.0
    reqs = load_requests(store.root)
    assert reqs["text"].to_list() == ["two", "two"] and set(reqs["attempt"]) == {2}
    attempts = load_attempts(store.root.parent.parent)  # from the results dir too
    assert sorted(attempts["status"].to_list()) == ["failed", "failed", "ok", "ok"]


def test_every_part_has_the_same_columns_and_types(store: ResultStore):
    store.append_cell({"cell_id": cid(1), "status": "ok"})
    store.append_cell(
        {
            "cell_id": cid(2),
            "status": "ok",
            "per_position_acceptance": [0.7, 0.5],
            "num_drafts": 12.0,
            "warnings": ["w"],
            "started_at": "2025-01-01T00:00:00",
        },
        requests_for(1),
    )
    for part in store.cells_dir.iterdir():
        assert pl.read_parquet(part).schema == pl.Schema(CELL_SCHEMA)
    for part in store.requests_dir.iterdir():
        assert pl.read_parquet(part).schema == pl.Schema(REQUEST_SCHEMA)
    cells = store.load_cells()
    assert cells.filter(pl.col("cell_id") == cid(1))["warnings"].to_list() == [[]]


def test_bad_rows_fail_naming_the_column(store: ResultStore):
    with pytest.raises(ResultsError, match="unknown column.*'tok_s'"):
        store.append_cell({"cell_id": cid(1), "status": "ok", "tok_s": 1.0})
    with pytest.raises(ResultsError, match="column 'num_drafts': expected Int64, found 1.5"):
        store.append_cell({"cell_id": cid(1), "status": "ok", "num_drafts": 1.5})
    with pytest.raises(ResultsError, match="column 'status'"):
        store.append_cell({"cell_id": cid(1), "status": "done"})
    assert store.next_attempt(cid(1)) == 1  # nothing was written


def test_manifest_sessions_append_with_required_fields(store: ResultStore):
    store.update_session(
        engines={
            "name": "embedded",
            "version": "specrepro-embedded 0.1.0",
            "flags": {"max-num-seqs": 8},
            "argv": ["python", "-m", "x"],
        },
        models=[{"id": "models/embedded", "revision": None}],
    )
    store.end_session()
    second = ResultStore(store.root.parents[1], store.study, store.run_id)
    second.begin_session({"params": {"concurrency": [1]}})
    manifest = json.loads(store.manifest_path.read_text())
    assert manifest["study"] == store.study and len(manifest["sessions"]) == 2
    first = manifest["sessions"][0]
    for key in (
        "params",
        "git",
        "packages",
        "engines",
        "models",
        "host",
        "gpu",
        "started_at",
        "ended_at",
    ):
        assert key in first, key
    assert {"commit", "dirty"} <= set(first["git"])
    assert {"torch", "specrepro", "polars", "transformers"} <= set(first["packages"])
    assert first["packages"]["polars"] == pl.__version__
    assert first["engines"][0]["version"] == "specrepro-embedded 0.1.0"
    assert first["gpu"]["gpus"] or first["gpu"]["note"]  # a GPU, or a note saying why none
    assert first["ended_at"] and manifest["sessions"][1]["ended_at"] is None
    assert manifest["sessions"][1]["params"] == {"concurrency": [1]}


# ------------------------------------------------------------------- merging and compacting


def files(store: ResultStore, table: str) -> list[str]:
    return sorted(p.name for p in (store.root / table).iterdir())


def snapshot(root: Path) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Everything the loaders give, in a stable order."""
    return (load_attempts(root).sort("cell_id", "attempt"), load_cells(root),
            load_requests(root))


def same(a: tuple, b: tuple) -> bool:
    return all(x.equals(y) for x, y in zip(a, b, strict=True))


def fill(store: ResultStore) -> None:
    """Three cells, four attempts, one failed; requests for each."""
    store.append_cell({"cell_id": cid(1), "status": "failed"}, requests_for(1, "f"))
    store.append_cell({"cell_id": cid(1), "status": "ok", "agg_tok_s": 1.0}, requests_for(2, "a"))
    store.append_cell({"cell_id": cid(2), "status": "ok", "agg_tok_s": 2.0}, requests_for(3, "b"))
    store.append_cell({"cell_id": cid(4), "status": "interrupted"}, requests_for(1, "i"))


def test_session_end_merges_its_parts_into_one_file_per_table(store: ResultStore):
    fill(store)
    before = snapshot(store.root)
    assert len(files(store, "cells")) == 4 and len(files(store, "requests")) == 4
    store.end_session()
    merged = [f"session-{store.session_id}.parquet"]
    assert files(store, "cells") == merged and files(store, "requests") == merged
    assert same(snapshot(store.root), before)  # no row lost, none added
    assert before[0].height == 4 and before[2]["text"].to_list() == ["a", "a", "b", "b", "b"]
    for table, schema in (("cells", CELL_SCHEMA), ("requests", REQUEST_SCHEMA)):
        assert pl.read_parquet(store.root / table / merged[0]).schema == pl.Schema(schema)
    assert "merge_error" not in store.manifest()["sessions"][0]
    # attempt numbers go on from the merged file in the next session
    second = ResultStore(store.root.parents[1], store.study, store.run_id)
    second.begin_session()
    assert second.next_attempt(cid(1)) == 3 and second.next_attempt(cid(8)) == 1
    second.append_cell({"cell_id": cid(1), "status": "ok", "agg_tok_s": 3.0}, requests_for(1))
    with pytest.raises(ResultsError, match="never overwritten"):
        second.append_cell({"cell_id": cid(2), "attempt": 1, "status": "ok"})
    second.end_session()
    assert len(files(second, "cells")) == 2  # one file per session
    cells = second.load_cells()
    assert cells.filter(pl.col("cell_id") == cid(1))["attempt"].to_list() == [3]
    assert load_attempts(second.root).height == 5


def test_a_killed_session_keeps_its_parts_loads_and_compacts(store: ResultStore):
    fill(store)  # the session never ends: killed
    killed = store.session_id
    before = snapshot(store.root)
    later = ResultStore(store.root.parents[1], store.study, store.run_id)
    assert same(snapshot(later.root), before) and later.completed_cell_ids() == {cid(1), cid(2)}
    later.begin_session()
    assert later.next_attempt(cid(1)) == 3  # numbering increases across sessions
    later.append_cell({"cell_id": cid(4), "status": "ok"}, requests_for(1, "new"))
    later.end_session()
    # the later session merged its own part only; the killed one's stay until compacted
    assert f"session-{later.session_id}.parquet" in files(later, "cells")
    assert sum(killed in n for n in files(later, "cells")) == 4
    after_later = snapshot(later.root)
    assert after_later[0].height == 5
    # the killed session's 4 parts merged into its file, then both sessions' files folded
    # into one per table (2 files of each table)
    assert compaction.compact(later.root.parents[1]) == {later.root: {
        "requests": 4, "cells": 4, "upgraded": 0, "folded": 4, "logs_packed": 0}}
    assert files(later, "cells") == ["session-all.parquet"] == files(later, "requests")
    assert same(snapshot(later.root), after_later)
    # compacting again changes nothing, byte for byte
    blobs = {p: p.read_bytes() for p in later.root.glob("*/*.parquet")}
    assert compaction.compact_store(later) == {"requests": 0, "cells": 0, "upgraded": 0, "folded": 0,
                               "logs_packed": 0}
    assert {p: p.read_bytes() for p in later.root.glob("*/*.parquet")} == blobs
    # a session after the fold: its own file, folded in by the next compact; attempts go on
    third = ResultStore(later.root.parents[1], later.study, later.run_id)
    third.begin_session()
    highest = load_attempts(third.root).filter(pl.col("cell_id") == cid(4))["attempt"]
    assert third.next_attempt(cid(4)) == highest.max() + 1  # read from the folded file
    third.append_cell({"cell_id": cid(4), "status": "ok"}, requests_for(1, "newer"))
    third.end_session()
    assert compaction.compact_store(third)["folded"] == 2
    assert files(third, "cells") == ["session-all.parquet"]
    assert third.load_requests().filter(pl.col("cell_id") == cid(4))["text"].to_list() == ["newer"]


def test_leftover_parts_beside_their_merged_file_count_once(store: ResultStore):
    fill(store)
    parts = {p: p.read_bytes() for p in store.root.glob("*/*.parquet")}
    before = snapshot(store.root)
    store.end_session()
    for path, blob in parts.items():  # killed after the rename, before deleting the parts
        path.write_bytes(blob)
    (store.cells_dir / f".session-{store.session_id}.parquet.x.tmp").write_bytes(b"half")
    assert same(snapshot(store.root), before)
    assert load_requests(store.root).height == 5  # no request twice
    assert compaction.compact_store(store) == {"requests": 4, "cells": 4, "upgraded": 0, "folded": 2,
                               "logs_packed": 0}
    assert files(store, "cells") == ["session-all.parquet"]  # temp file gone
    assert same(snapshot(store.root), before)


def test_a_merge_that_would_lose_rows_keeps_the_parts(store: ResultStore, monkeypatch):
    fill(store)
    before = snapshot(store.root)
    real = store_files.read_rows
    monkeypatch.setattr(store_files, "read_rows", lambda fs, table: real(fs, table).head(1))
    store.end_session()  # the merged file lacks rows: no part is deleted, the session says so
    assert "rows of" in store.manifest()["sessions"][0]["merge_error"]
    monkeypatch.undo()
    # a part goes only once its rows are in the merged file: the others are all still there
    assert len(files(store, "cells")) == 4 and len(files(store, "requests")) > 1
    assert same(snapshot(store.root), before)
    compaction.compact_store(store)
    assert same(snapshot(store.root), before)
    assert files(store, "cells") == ["session-all.parquet"]  # merged, then folded


def test_an_old_store_of_attempt_parts_loads_and_compacts_by_session(tmp_path: Path):
    old = ResultStore(tmp_path, "07_the_bill", "default")
    old.begin_session()
    session = old.session_id
    old.session_id = None  # parts as stores wrote them before sessions merged: no session id
    old.append_cell({"cell_id": cid(1), "status": "ok", "started_at": now()},
                    requests_for(2))
    old.append_cell({"cell_id": cid(2), "status": "ok", "started_at": "2020-01-01T00:00:00"},
                    requests_for(1))  # before any session of the manifest
    assert files(old, "cells") == [f"{cid(1)}-a001.parquet", f"{cid(2)}-a001.parquet"]
    before = snapshot(tmp_path)
    assert before[1].height == 2 and before[2].height == 3
    compaction.compact(tmp_path)
    assert files(old, "cells") == ["session-all.parquet"]  # by session, then folded
    # each row names the session it went to: the one running when it started, or none
    by = dict(load_attempts(tmp_path).select("cell_id", "session_id").rows())
    assert by == {cid(1): session, cid(2): None}
    # and nothing else changed: the same rows, the session named where it was found
    after = snapshot(tmp_path)
    assert same(tuple(d.drop("session_id", strict=False) for d in after),
                tuple(d.drop("session_id", strict=False) for d in before))
    assert ResultStore(tmp_path, "07_the_bill", "default").next_attempt(cid(2)) == 2


def killed(store: ResultStore) -> None:
    """The session's process killed: the kernel drops its live mark (sharing.hold_live)."""
    os.close(store._live)
    store._live = None


def test_compact_command(store: ResultStore, capsys):
    fill(store)
    killed(store)
    results_dir = store.root.parents[1]
    assert compaction.main([str(results_dir)]) == 0
    out = capsys.readouterr().out
    assert "merged 4 cells and 4 requests parts; now 1 cells and 1 requests files" in out
    assert compaction.main([str(results_dir / "nowhere")]) == 2
    assert "no such directory" in capsys.readouterr().err
    from specrepro.cli import SUBCOMMANDS

    assert SUBCOMMANDS["compact"][0] == "specrepro.store.compaction"


def test_a_legacy_requests_file_reads_as_chunks_and_compact_rewrites_it(tmp_path):
    """Requests stored before 2026-12-02 kept per-token gaps (`itl_s`, float seconds):
    they read as the chunks they were split from, and compact rewrites the file so, once
    the chunks give the stored gaps back to the microsecond."""
    from specrepro.metrics import token_gaps_s

    store = ResultStore(tmp_path, "01_drafter_block_sweep", "r1")
    store.begin_session({"params": {}})
    store.append_cell({"cell_id": cid(1), "status": "ok"}, requests_for(2))
    store.end_session()
    f = next(store.requests_dir.glob("session-*.parquet"))
    legacy_gaps = [[0.0, 0.0, 0.0123456789, 0.0123456789, 0.0031], [0.004, 0.004]]
    legacy = (pl.read_parquet(f).drop("chunk_gap_us", "chunk_tokens")
              .with_columns(pl.Series("itl_s", legacy_gaps), pl.Series("ttft_s", [0.25, 0.5])))
    legacy.write_parquet(f)
    read = store.load_requests().sort("request_idx")
    assert read["chunk_gap_us"].to_list() == [[250_000, 24_691, 3_100], [500_000, 8_000]]
    assert read["chunk_tokens"].to_list() == [[3, 2, 1], [1, 2]]
    assert compaction.compact_store(store)["upgraded"] == 1
    f = store.requests_dir / "session-all.parquet"  # folded in after the rewrite
    assert "itl_s" not in pl.read_parquet(f).columns
    assert store.load_requests().equals(read)  # the same rows before and after
    for row, gaps in zip(read.iter_rows(named=True), legacy_gaps):
        assert token_gaps_s(row["chunk_gap_us"], row["chunk_tokens"]) == pytest.approx(
            gaps, abs=1e-6)
    assert compaction.compact_store(store)["upgraded"] == 0  # once


def test_engine_logs_are_gzipped_one_member_per_launch(tmp_path: Path):
    """A launch's plain log becomes one more gzip member of <name>.log.gz; zcat (gzip's
    own reader) reads every launch's lines in order; compact packs a plain log a killed
    session left."""
    import gzip

    store = ResultStore(tmp_path, "07_the_bill", "r")
    store.begin_session()
    log = store.logs_dir / "none--vllm.log"
    log.write_text("first launch\n")
    assert compaction.pack_log(log) == store.logs_dir / "none--vllm.log.gz" and not log.exists()
    log.write_text("second launch\n")  # a later launch: a plain log again while it runs
    compaction.pack_log(log)
    compaction.append_log(tmp_path / "other" / "none--vllm.log", "copied\n")
    log.write_text("killed\n")
    assert compaction.compact_store(store)["logs_packed"] == 1
    text = gzip.decompress((store.logs_dir / "none--vllm.log.gz").read_bytes()).decode()
    assert text == "first launch\nsecond launch\nkilled\n"
    assert gzip.decompress((tmp_path / "other" / "none--vllm.log.gz").read_bytes()) == b"copied\n"
