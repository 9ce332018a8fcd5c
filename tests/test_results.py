"""results.py: append-only attempts, resume, the loader's choice of attempt, schema, manifest."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from specrepro import results
from specrepro.identity import digest
from specrepro.results import CELL_SCHEMA, REQUEST_SCHEMA, ResultsError, ResultStore


def cid(n: int) -> str:
    return digest(arm={"name": "a", "k": 5}, concurrency=n, seed=0)


def requests_for(n: int, text: str = "x") -> list[dict]:
    return [
        {
            "request_idx": i,
            "prompt_id": f"p{i}",
            "ttft_s": 0.1,
            "itl_s": [0.01, 0.02],
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
    first = (store.cells_dir / f"{c}-a001.parquet").read_bytes()
    assert store.next_attempt(c) == 2
    store.append_cell({"cell_id": c, "status": "ok", "agg_tok_s": 12.5}, requests_for(2))
    assert sorted(p.name for p in store.cells_dir.iterdir()) == [
        f"{c}-a001.parquet",
        f"{c}-a002.parquet",
    ]
    assert (store.cells_dir / f"{c}-a001.parquet").read_bytes() == first
    with pytest.raises(ResultsError, match="never overwritten"):
        store.append_cell({"cell_id": c, "attempt": 1, "status": "ok"})
    assert (store.cells_dir / f"{c}-a001.parquet").read_bytes() == first
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
    cells = results.load_cells(store.root)
    assert cells.height == 1
    assert cells.row(0, named=True)["attempt"] == 2
    assert cells.row(0, named=True)["agg_tok_s"] == 2.0
    reqs = results.load_requests(store.root)
    assert reqs["text"].to_list() == ["two", "two"] and set(reqs["attempt"]) == {2}
    attempts = results.load_attempts(store.root.parent.parent)  # from the results dir too
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
