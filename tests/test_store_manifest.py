"""Integrity over every table of a store (issue 41, items 3, 5 and 8): a requests file that is
damaged or gone makes its cells pending again; a damaged manifest is set aside and rebuilt
from the store's files, saying in one line what was lost; a deleted one is rebuilt so a run
whose cells are all stored starts no engine; `specrepro compact` acts only on the stores it
is pointed at (or one or two levels below, listed first), refuses one a run is writing and
goes on past a bad manifest. Constructed stores only: no engine runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest
import yaml

from conftest import store_cell_id as cid
from conftest import store_requests as requests_for
from specrepro.store import ResultStore, compaction, load_cells, now
from specrepro.store.files import ALL_SESSIONS

STUDY, RUN = "07_the_bill", "r1"


def session(results_dir: Path, cells: list[int], study: str = STUDY, version: str = "v1",
            **row) -> ResultStore:
    """One ended session measuring these cells (n requests for cell n), as the runner
    writes them: arm, profile, engine and version in each row, an engine entry."""
    store = ResultStore(results_dir, study, RUN)
    store.begin_session({"params": {"cells": cells}})
    store.update_session(engines=[{"arm": "a", "profile": "p", "profile_hash": "h",
                                   "version": version}])
    for n in cells:
        store.append_cell({"cell_id": cid(n), "status": "ok", "agg_tok_s": float(n),
                           "arm": "a", "profile": "p", "engine": "embedded",
                           "engine_version": version, "n_requests": n, "started_at": now(),
                           "ended_at": now(), **row},
                          requests_for(n))
    store.end_session()
    return store


@pytest.fixture
def store(tmp_path: Path) -> ResultStore:
    """Cells 1 and 2 folded into session-all.parquet (a committed store), then a later
    session's cells 3 and 4 in their own session file."""
    session(tmp_path, [1, 2])
    compaction.compact(tmp_path)
    return session(tmp_path, [3, 4])


def fresh(store: ResultStore) -> ResultStore:
    """The store as the next command opens it."""
    return ResultStore(store.root.parents[1], store.study, store.run_id)


def manifest(store: ResultStore) -> dict:
    return json.loads(store.manifest_path.read_text())


# ------------------------------------------------------------------ requests tables


def test_a_damaged_requests_file_makes_its_cells_pending_again(store, capsys):
    """Its cells rows stay (read by the analysis meanwhile), but a run measures them again:
    today's `6 already done` with 0 request rows is gone."""
    f = store.requests_dir / ALL_SESSIONS
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])  # truncated
    assert fresh(store).completed_cell_ids() == {cid(3), cid(4)}
    err = capsys.readouterr().err
    assert "damaged results file" in err and (store.root / "quarantine").is_dir()
    (line,) = [ln for ln in err.splitlines() if "are not stored" in ln]
    assert "the requests of 2 cells with an ok attempt are not stored (0 of 3 rows" in line
    assert line.endswith("they are measured again")
    assert load_cells(store.root).height == 4  # nothing measured is lost


def test_a_removed_requests_file_makes_its_cells_pending_again(store, capsys):
    (store.requests_dir / f"session-{store.session_id}.parquet").unlink()
    assert fresh(store).completed_cell_ids() == {cid(1), cid(2)}
    assert "the requests of 2 cells with an ok attempt are not stored (0 of 7 rows" in \
        capsys.readouterr().err


def test_a_copy_is_pending_where_its_measured_attempt_lost_its_requests(tmp_path, capsys):
    """A cell filed from another study's attempt keeps no requests of its own
    (harness/shared_cells.py): it is pending where its source's requests are gone."""
    measured = session(tmp_path, [1, 2], study="06_draft_schedule_under_load")
    copy = session(tmp_path, [1, 2], study=STUDY,
                   shared_from=f"06_draft_schedule_under_load/{cid(1)}")
    for f in copy.requests_dir.iterdir():  # a copy stores none of its own
        f.unlink()
    assert fresh(copy).completed_cell_ids() == {cid(1), cid(2)}  # its source is whole
    (measured.requests_dir / f"session-{measured.session_id}.parquet").unlink()
    assert fresh(copy).completed_cell_ids() == set()
    assert fresh(measured).completed_cell_ids() == set()
    assert "are not stored" in capsys.readouterr().err


def test_compact_reports_cells_whose_requests_are_gone(store, capsys):
    (store.requests_dir / f"session-{store.session_id}.parquet").unlink()
    assert compaction.main([str(store.root)]) == 1
    out = capsys.readouterr().out
    assert f"{store.root}: the requests of 2 cells are not stored: `specrepro run` measures " \
           "them again" in out


# ------------------------------------------------------------------ the manifest


def three_sessions(tmp_path: Path) -> ResultStore:
    for cells, version in (([1], "v1"), ([2], "v1"), ([3], "v2")):
        last = session(tmp_path, cells, version=version)
    return last


def test_a_truncated_manifest_is_set_aside_and_rebuilt(tmp_path, capsys):
    store = three_sessions(tmp_path)
    text = store.manifest_path.read_bytes()
    third = text.rindex(b'"session_id"')  # cut inside the last session
    damaged = text[:third]
    store.manifest_path.write_bytes(damaged)
    got = fresh(store).manifest()  # today: JSONDecodeError
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line: what was wrong, where it went, what was lost
    line = err[0]
    assert line.startswith(f"specrepro: damaged manifest {store.manifest_path}: not JSON: ")
    assert "(the end of the file: truncated)" in line
    assert f"moved to {store.root / 'quarantine' / 'manifest.json'}" in line
    assert "2 sessions read whole from the damaged file, 1 session from their cells rows" in line
    assert "params, command, git commit, host, packages, engine argv" in line
    assert (store.root / "quarantine" / "manifest.json").read_bytes() == damaged  # kept
    sessions = got["sessions"]
    assert len(sessions) == 3 and sessions[0]["params"] == {"cells": [1]}  # salvaged whole
    assert sessions[2]["params"] is None and sessions[2]["status"] == "unknown"
    assert sessions[2]["engines"] == [{"arm": "a", "profile": "p", "engine": "embedded",
                                       "version": "v2", "profile_hash": None,
                                       "rebuilt": True}]
    (entry,) = manifest(store)["quarantined"]
    assert entry["file"] == "manifest.json" and entry["moved_to"] == "quarantine/manifest.json"
    # written: the next reader reads it as it is, with nothing to say
    assert fresh(store).manifest() == manifest(store)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("content", [b"", b"[]", b'{"study": "x"}', b"\xff\xfe{"],
                         ids=["empty", "a list", "no sessions", "not text"])
def test_a_manifest_that_is_no_manifest_is_rebuilt(tmp_path, content, capsys):
    store = three_sessions(tmp_path)
    store.manifest_path.write_bytes(content)
    assert len(fresh(store).manifest()["sessions"]) == 3
    assert "damaged manifest" in capsys.readouterr().err
    assert (store.root / "quarantine" / "manifest.json").read_bytes() == content


def test_compact_goes_on_past_a_damaged_manifest(tmp_path, capsys):
    """Today: a JSONDecodeError traceback at the first store, the others untouched."""
    bad = three_sessions(tmp_path)
    good = session(tmp_path, [5], study="06_draft_schedule_under_load")
    bad.manifest_path.write_bytes(bad.manifest_path.read_bytes()[:100])
    assert compaction.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"{bad.root}: manifest.json was damaged (not JSON: " in out
    assert "set aside in quarantine/ and rebuilt from the cells rows" in out
    assert [p.name for p in good.cells_dir.iterdir()] == [ALL_SESSIONS]  # the next one done
    assert [p.name for p in bad.cells_dir.iterdir()] == [ALL_SESSIONS]


def test_a_file_set_aside_while_the_manifest_is_gone_is_listed_by_the_rebuild(store, capsys):
    store.manifest_path.unlink()
    f = store.cells_dir / ALL_SESSIONS
    f.write_bytes(b"")
    assert load_cells(store.root).height == 2  # the reader sets it aside, writes no manifest
    assert not store.manifest_path.exists()
    assert "not recorded in the manifest" in capsys.readouterr().err
    (entry,) = fresh(store).manifest()["quarantined"]
    assert entry == {**entry, "file": f"cells/{ALL_SESSIONS}",
                     "moved_to": f"quarantine/cells--{ALL_SESSIONS}", "problem": "empty (0 bytes)"}


def stored_study(tmp_path: Path):
    """A one-arm study of two cells (one and two streams) and its store, every cell stored
    ok with its one request, as the runner stores them (engine version v9)."""
    from specrepro import identity
    from specrepro.params import load_suite, resolve_study

    params = tmp_path / "params"
    (params / "profiles").mkdir(parents=True)
    (params / "studies").mkdir()
    (params / "profiles" / "p.yaml").write_text(yaml.safe_dump(
        {"engine": "embedded", "command": ["{python}", "-m", "specrepro.embedded.serve"],
         "model": {"id": "models/embedded"}, "port": 8199}))
    (params / "studies" / "s.yaml").write_text(yaml.safe_dump(
        {"name": STUDY, "notebook": STUDY, "arms": [{"name": "a", "profile": "p"}],
         "workloads": [{"name": "essays", "n": 2, "form": "completion", "max_tokens": 8}],
         "concurrency": [1, 2]}))
    (params / "suite.yaml").write_text(yaml.safe_dump(
        {"name": "t", "run_id": RUN, "results_dir": "../results", "binds": "listed",
         "notebooks": {STUDY: {"study": "studies/s.yaml"}}}))
    study = resolve_study(load_suite(params / "suite.yaml"), STUDY)
    store = ResultStore(tmp_path / "results", STUDY, RUN)
    store.begin_session({"params": {}})
    for cell in study.cells():
        store.append_cell({"cell_id": identity.cell_id(study, cell, "v9"), "status": "ok",
                           "arm": "a", "profile": "p", "engine": "embedded",
                           "engine_version": "v9", "n_requests": 1}, requests_for(1))
    store.end_session()
    return study, store


def test_a_notebook_measures_the_cells_whose_requests_are_gone(tmp_path, capsys):
    """What a notebook in mode auto measures is what `specrepro run` would: a stored cell
    whose requests file was removed is to be measured again, not replayed without them."""
    from specrepro import identity
    from specrepro.analysis.finding.finding import declared_cells, to_measure

    study, store = stored_study(tmp_path)
    ids = [identity.cell_id(study, cell, "v9") for cell in study.cells()]
    stored = declared_cells(study).with_columns(pl.Series("cell_id", ids))
    assert to_measure(store.root, study, stored).height == 0  # all stored, all whole
    (store.requests_dir / f"session-{store.session_id}.parquet").unlink()
    again = to_measure(store.root, study, stored)
    assert sorted(again["concurrency"].to_list()) == [1, 2]
    assert to_measure(store.root, study, stored.head(1))["concurrency"].to_list() == [2, 1]


def test_a_deleted_manifest_is_rebuilt_and_a_run_starts_no_engine(tmp_path, monkeypatch,
                                                                 capsys):
    """Every cell stored, the manifest deleted: the run skips every cell without starting
    the engine (today: the session history silently dropped and every engine started to
    learn its version)."""
    from specrepro.harness import engine_pool
    from specrepro.harness.runner import run_studies

    study, store = stored_study(tmp_path)
    store.manifest_path.unlink()
    started = []

    def start(arm, *a, **k):
        started.append(arm.name)
        raise RuntimeError("the test starts no engine")

    monkeypatch.setattr(engine_pool, "start_engine", start)
    (summary,) = run_studies([(study, fresh(store))], progress=False)
    assert started == [] and (summary.ok, summary.skipped, summary.errors) == (0, 2, [])
    assert "manifest.json is missing while the store holds 2 attempts; rebuilt from its " \
           "cells rows, as 1 session" in capsys.readouterr().err
    sessions = manifest(store)["sessions"]
    assert len(sessions) == 2 and sessions[0]["engines"][0]["version"] == "v9"


# ------------------------------------------------------------------ compact's reach


def test_compact_touches_no_store_deeper_than_two_levels(tmp_path, capsys):
    """Today `compact /tmp` recursed into every store below it and rewrote them."""
    deep = session(tmp_path / "someone" / "else", [1])
    before = sorted(p.name for p in deep.cells_dir.iterdir())
    (deep.logs_dir / "x.log").write_text("an engine's log")
    assert compaction.main([str(tmp_path)]) == 2
    assert "no results store in" in capsys.readouterr().err
    assert sorted(p.name for p in deep.cells_dir.iterdir()) == before
    assert (deep.logs_dir / "x.log").is_file()


def test_compact_lists_the_stores_before_it_acts(tmp_path, capsys):
    session(tmp_path, [1])
    session(tmp_path, [2], study="06_draft_schedule_under_load")
    assert compaction.main([str(tmp_path)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == (f"specrepro compact: 2 stores in {tmp_path}: "
                     f"06_draft_schedule_under_load/{RUN}, {STUDY}/{RUN}")


def test_compact_refuses_a_store_a_run_is_writing(tmp_path, capsys):
    """Today it merged the live session's parts and gzipped the log its engine wrote."""
    live = ResultStore(tmp_path, STUDY, RUN)
    live.begin_session({"params": {}})
    live.append_cell({"cell_id": cid(1), "status": "ok"}, requests_for(1))
    (live.logs_dir / "a--p.log").write_text("Starting...\n")
    before = sorted(p.name for p in live.cells_dir.iterdir())
    assert compaction.main([str(tmp_path)]) == 1
    line = capsys.readouterr().out.splitlines()[1]
    assert line.startswith(f"{live.root}: a run is writing it (session {live.session_id} "
                           f"(pid {os.getpid()} on ")
    assert line.endswith("not compacted; compact it once the run has ended")
    assert sorted(p.name for p in live.cells_dir.iterdir()) == before
    assert (live.logs_dir / "a--p.log").read_text() == "Starting...\n"
    live.end_session()  # ended: compacted
    assert compaction.main([str(tmp_path)]) == 0
    assert not (live.logs_dir / "a--p.log").exists()
    assert pl.read_parquet(live.cells_dir / ALL_SESSIONS).height == 1
