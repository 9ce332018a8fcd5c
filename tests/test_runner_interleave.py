"""Repeats interleaved across a study's arms (runner.py, engine_pool.py): rounds A B C,
A B C with each cell's round, sequence and launch stored; engines kept side by side or
started anew each round; a run interrupted mid-cell resumes measuring each missing cell
once. Three fake engines (tests/fake_engine.py) stand for three arms' engines."""

from __future__ import annotations

import polars as pl
import pytest
import yaml

from fake_engine import FakeEngine, write_params
from specrepro import identity
from specrepro.harness import runner
from specrepro.harness.runner import run_study
from specrepro.params import resolve_file as resolve
from specrepro.store import ResultStore, load_attempts

ARMS = ["a", "b", "c"]


@pytest.fixture
def fakes():
    made = {arm: FakeEngine(slots=8, step_s=0.005) for arm in ARMS}
    yield made
    for e in made.values():
        e.close()


def write_study(tmp_path, fakes, interleave: str):
    params = write_params(tmp_path, fakes)
    study = {"name": "interleave", "notebook": "06_draft_schedule_under_load",
             "arms": [{"name": arm, "profile": f"fake-{arm}"} for arm in ARMS],
             "baseline": "a",
             "workloads": [{"name": "essays", "n": 2, "form": "completion", "max_tokens": 8}],
             "concurrency": [1, 2], "sampling": [{"temperature": 0.0}], "repeats": 2,
             "seed": 10, "interleave": interleave,
             "window": {"skip_s": 0.0, "window_s": 0.1, "turnovers": 2, "max_window_s": 3.0}}
    path = params / "studies" / "06_interleave.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    (st, _, run_id), = resolve(path)
    return st, ResultStore(tmp_path / "results", st.name, run_id)


def in_order(cells: pl.DataFrame) -> list[tuple]:
    ok = cells.filter(pl.col("status") == "ok").sort(["session_id", "sequence"])
    return list(ok.select("round", "arm", "concurrency").iter_rows())


ROUNDS = [(r, arm, c) for r in (0, 1) for arm in ARMS for c in (1, 2)]


@pytest.mark.parametrize("interleave, launches", [("auto", 3), ("restart", 6)])
def test_repeats_run_a_b_c_a_b_c_and_each_cell_says_where(tmp_path, fakes, interleave,
                                                         launches):
    st, store = write_study(tmp_path, fakes, interleave)
    summary = run_study(st, store, progress=False, power_interval_s=0.2)
    assert (summary.ok, summary.errors) == (12, [])
    cells = store.load_cells()
    assert in_order(cells) == ROUNDS  # never two repeats of one arm back to back
    assert cells["sequence"].sort().to_list() == list(range(12))
    assert (cells["round"] == cells["repeat"]).all()
    # side by side (auto: no arm needs a GPU) one engine start per arm, else one a round
    assert cells["launch"].n_unique() == launches
    per_arm_round = cells.group_by("arm", "round").agg(pl.col("launch").n_unique())
    assert (per_arm_round["launch"] == 1).all()
    session = store.manifest()["sessions"][-1]
    assert session["interleave"]["side_by_side"] is (interleave == "auto")
    assert len(session["engines"]) == launches
    # multi-stream cells timed over a steady window, single-stream ones request by request
    timing = dict(cells.select("concurrency", "timing").unique().iter_rows())
    assert timing == {1: "requests", 2: "window"}
    windows = cells.filter(pl.col("timing") == "window")
    assert windows["window_all_busy"].all() and (windows["window_turnovers_min"] >= 2).all()
    assert windows["ttft_p50_ms"].is_not_null().all()  # the requests inside each window
    assert windows["window_running_start"].is_not_null().all()  # the engine's gauges read
    assert cells.filter(pl.col("timing") == "requests")["window_all_busy"].is_null().all()
    assert store.load_requests()["stream"].is_not_null().all()


def test_a_run_interrupted_mid_cell_resumes_measuring_each_missing_cell_once(
        tmp_path, fakes, monkeypatch):
    st, store = write_study(tmp_path, fakes, "auto")
    calls = []

    class Interrupting(runner.LoadGenerator):
        def run(self, prompts, scrape=None):
            result = super().run(prompts, scrape)
            calls.append(1)
            if len(calls) == 7:  # the seventh cell: round 1's first, arm a at 1 stream
                raise KeyboardInterrupt
            return result

    monkeypatch.setattr(runner, "LoadGenerator", Interrupting)
    first = run_study(st, store, progress=False, power_interval_s=0.2)
    assert (first.ok, first.interrupted, first.stopped) == (6, 1, "ctrl-c")
    monkeypatch.setattr(runner, "LoadGenerator", runner.LoadGenerator.__mro__[1])
    again = run_study(st, store, progress=False, power_interval_s=0.2)
    assert (again.ok, again.skipped, again.errors) == (6, 6, [])
    attempts = load_attempts(store.root)
    ok = attempts.filter(pl.col("status") == "ok")
    version = ok["engine_version"][0]
    declared = {identity.cell_id(st, c, version) for c in st.cells()}
    assert set(ok["cell_id"]) == declared and ok.height == 12  # each once, none twice
    interrupted = attempts.filter(pl.col("status") == "interrupted")
    assert interrupted.height == 1 and interrupted["cell_id"][0] in declared
    # the resumed session measured round 1 in its order, from the cell interrupted on
    resumed = store.load_cells().filter(pl.col("session_id") == ok["session_id"].max())
    assert in_order(resumed) == ROUNDS[6:]


def test_one_start_measures_every_repeat_of_an_arm_back_to_back(tmp_path, fakes):
    """`interleave: one_start` (02's runs differ by seed): A A, B B, C C, one round, one
    engine start per arm, each repeat its own seed."""
    st, store = write_study(tmp_path, fakes, "one_start")
    assert st.rounds == 1
    summary = run_study(st, store, progress=False, power_interval_s=0.2)
    assert (summary.ok, summary.errors) == (12, [])
    cells = store.load_cells()
    ok = cells.filter(pl.col("status") == "ok").sort("sequence")
    arms_in_order = ok["arm"].to_list()
    assert arms_in_order == [arm for arm in ARMS for _ in range(4)]  # never A B A B
    assert (ok["round"] == 0).all() and ok["launch"].n_unique() == 3
    assert ok.group_by("arm").agg(pl.col("seed").n_unique())["seed"].to_list() == [2, 2, 2]
