"""Cells two studies of one command share (harness/shared_cells.py) and A/A twins started
on their own (launch_plan.py): 06-like and 07-like studies on fake engines (tests/fake_engine.py)."""

from __future__ import annotations

import polars as pl
import pytest
import yaml

from fake_engine import FakeEngine, write_params
from specrepro.harness.launch_plan import launch_groups
from specrepro.harness.runner import _Run, run_studies
from specrepro.params import resolve_file as resolve
from specrepro.store import ResultStore

WINDOW = {"skip_s": 0.0, "window_s": 0.1, "turnovers": 2, "max_window_s": 3.0}
ESSAYS = [{"name": "essays", "n": 2, "form": "completion", "max_tokens": 8}]


@pytest.fixture
def fakes():
    made = {arm: FakeEngine(slots=8, step_s=0.005) for arm in ("a", "b", "c")}
    yield made
    for e in made.values():
        e.close()


def write(tmp_path, fakes, studies: list[dict]):
    params = write_params(tmp_path, fakes)
    out = []
    for spec in studies:
        study = {"workloads": ESSAYS, "concurrency": [1, 2],
                 "sampling": [{"temperature": 0.0}], "seed": 10, "window": WINDOW, **spec}
        path = params / "studies" / f"{spec['name']}.yaml"
        path.write_text(yaml.safe_dump(study, sort_keys=False))
        (st, _, run_id), = resolve(path)
        out.append((st, ResultStore(tmp_path / "results", st.name, run_id)))
    return out


SCHEDULE = {"name": "06_sched", "notebook": "06_draft_schedule_under_load",
            "arms": [{"name": "none", "profile": "fake-a"},
                     {"name": "static-k7", "profile": "fake-b"}], "baseline": "none"}
BILL = {"name": "07_bill", "notebook": "07_the_bill",
        "arms": [{"name": "none", "profile": "fake-a"},
                 {"name": "mtp-control", "profile": "fake-c"},
                 {"name": "dflash-k7", "profile": "fake-b"}], "baseline": "none"}


def test_a_cell_two_studies_ask_for_is_measured_once_and_filed_under_both(tmp_path, fakes):
    (_, s1), (_, s2) = plans = write(tmp_path, fakes, [SCHEDULE, BILL])
    one, two = run_studies(plans, progress=False, power_interval_s=0.2)
    assert (one.ok, one.shared, one.errors) == (4, 0, [])
    # 07's none and dflash-k7 are 06's none and static-k7: filed, not measured
    assert (two.ok, two.shared, two.skipped, two.errors) == (2, 4, 0, [])
    c1, c2 = s1.load_cells(), s2.load_cells()
    assert c1["shared_from"].null_count() == 4
    copies = c2.filter(pl.col("shared_from").is_not_null()).sort("arm", "concurrency")
    assert copies["arm"].to_list() == ["dflash-k7", "dflash-k7", "none", "none"]
    assert c2.filter(pl.col("arm") == "mtp-control")["shared_from"].null_count() == 2
    for row in copies.iter_rows(named=True):
        study, cid = row["shared_from"].split("/")
        assert study == "06_sched"
        src = c1.filter(pl.col("cell_id") == cid).row(0, named=True)
        assert src["arm"] == {"dflash-k7": "static-k7", "none": "none"}[row["arm"]]
        for col in ("agg_tok_s", "output_tokens", "wall_s", "timing", "concurrency",
                    "sequence", "launch", "power_w_mean"):
            assert row[col] == src[col], col
        # a cell's id holds its arm's name, not its study's: none is none in both
        assert (row["cell_id"] == cid) == (row["arm"] == "none") and row["study"] == "07_bill"
        assert any("measured once for 06_sched" in w for w in row["warnings"])
        r1 = s1.load_requests().filter(pl.col("cell_id") == cid)
        r2 = s2.load_requests().filter(pl.col("cell_id") == row["cell_id"])
        assert r2.height == r1.height > 0
        assert r2["text"].to_list() == r1["text"].to_list()
    # the receiving study's baseline comparison is its own: greedy fakes answer alike
    k7 = copies.filter(pl.col("arm") == "dflash-k7")
    assert k7["identical_to_baseline"].to_list() == [1.0, 1.0]
    # nothing left: a second command measures nothing and files nothing again
    again = run_studies(plans, progress=False, power_interval_s=0.2)
    assert [(s.ok, s.shared, s.skipped) for s in again] == [(0, 0, 4), (0, 0, 6)]


def test_a_study_run_alone_later_files_what_an_earlier_command_measured(tmp_path, fakes):
    """07 run after 06 in a command of its own: its none and dflash-k7 cells come from
    06's store (the command's sources include what its stores held when it began)."""
    (sched, s1), (bill, s2) = write(tmp_path, fakes, [SCHEDULE, BILL])
    (first,) = run_studies([(sched, s1)], progress=False, power_interval_s=0.2)
    assert first.ok == 4
    # a command of 07 alone with 06 named as a source: both studies, 06 all done
    one, two = run_studies([(sched, s1), (bill, s2)], progress=False, power_interval_s=0.2)
    assert (one.ok, one.skipped) == (0, 4) and (two.ok, two.shared) == (2, 4)


def test_cells_differing_in_seed_are_not_shared(tmp_path, fakes):
    (_, _), (_, s2) = plans = write(tmp_path, fakes, [SCHEDULE, {**BILL, "seed": 11}])
    one, two = run_studies(plans, progress=False, power_interval_s=0.2)
    assert (one.ok, two.ok, two.shared) == (4, 6, 0)
    assert s2.load_cells()["shared_from"].null_count() == 6


def test_an_aa_twin_gets_its_own_engine_start_after_every_other_arm(tmp_path, fakes):
    twin = {**SCHEDULE, "arms": [*SCHEDULE["arms"],
                                 {"name": "none-aa", "profile": "fake-a", "noise_of": "none"}],
            "interleave": "restart",
            "skip": [{"arm": "none-aa", "concurrency": [1]}]}
    ((st, store),) = plans = write(tmp_path, fakes, [twin])
    ctxs = [_Run(st, store, None, 0.2, 60.0, [], set(), None, None,
                 {a.name for a in st.arms}, [], [])]
    groups = [[arm.name for _, arm in g] for g in launch_groups(ctxs)]
    assert groups == [["none"], ["static-k7"], ["none-aa"]]  # not on none's start
    (summary,) = run_studies(plans, progress=False, power_interval_s=0.2)
    assert (summary.ok, summary.errors) == (5, [])
    cells = store.load_cells()
    launch = dict(cells.filter(pl.col("concurrency") == 2).select("arm", "launch").iter_rows())
    assert launch["none-aa"] not in (launch["none"], launch["static-k7"])
    seq = dict(cells.filter(pl.col("concurrency") == 2).select("arm", "sequence").iter_rows())
    assert seq["none-aa"] == max(seq.values())  # after every other arm's cells
    assert len(store.manifest()["sessions"][-1]["engines"]) == 3


def test_twins_share_with_twins_only(tmp_path, fakes):
    """07's A/A twin of none is 06's twin again (a start of its own), never 06's none:
    filed from it, its A/A difference would read zero."""
    twins06 = {**SCHEDULE, "arms": [*SCHEDULE["arms"],
                                    {"name": "none-aa", "profile": "fake-a", "noise_of": "none"}]}
    twins07 = {**BILL, "arms": [*BILL["arms"],
                                {"name": "none-aa", "profile": "fake-a", "noise_of": "none"}]}
    (_, s1), (_, s2) = plans = write(tmp_path, fakes, [twins06, twins07])
    one, two = run_studies(plans, progress=False, power_interval_s=0.2)
    assert (one.ok, one.shared) == (6, 0)
    assert (two.ok, two.shared) == (2, 6)
    c1 = s1.load_cells()
    by_id = dict(c1.select("cell_id", "arm").iter_rows())
    for row in s2.load_cells().filter(pl.col("arm") == "none-aa").iter_rows(named=True):
        assert by_id[row["shared_from"].split("/")[1]] == "none-aa"
    for row in s2.load_cells().filter(pl.col("arm") == "none").iter_rows(named=True):
        assert by_id[row["shared_from"].split("/")[1]] == "none"
