"""`specrepro plan` (harness/plan.py, cost_model.py, costs.py, plan_spent.py; params/plan.py):
a tiny suite of vLLM profiles written in tmp_path, its costs constructed (declared priors,
fake stores written through the store's API), nothing started. What each test expects is
derived from the constructed costs and the studies' shapes, never read off the output."""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path

import pytest
import yaml

from specrepro import identity
from specrepro.harness import plan_command
from specrepro.harness.cost_model import CostModel, Estimate
from specrepro.harness.costs import Stored, read_stores
from specrepro.harness.deadline import start_repays
from specrepro.harness.plan import make_plan
from specrepro.harness.plan_report import budget_lines
from specrepro.params import ParamsError, load_suite
from specrepro.params import resolve_file as resolve
from specrepro.store import ResultStore

S06, S07, S01 = "06_draft_schedule_under_load", "07_the_bill", "01_drafter_block_sweep"
WINDOW = {"skip_s": 5.0, "window_s": 10.0, "turnovers": 3, "max_window_s": 30.0,
          "cap_spread": 0.5, "min_concurrency": 2}
STEP_MS = 5.0  # one stream: 200 tok/s
TOK_S = {8: 1000.0, 128: 8000.0}
SPEEDUP = {1: 3.0, 128: 1.0}


def priors(**over) -> dict:
    engine = {"staging": {"value": 120, "source": "test"},
              "start": {"value": 70, "source": "test"},
              "first_start": {"value": 80, "source": "test", "per": "profile"},
              "stop": {"value": 10, "source": "test"},
              "step_ms": {"value": STEP_MS, "source": "test"},
              "tok_s": {"by_streams": TOK_S, "source": "test"},
              "speedup": {"by_streams": SPEEDUP, "source": "test"},
              "sampled_speedup": {"by_streams": {1: 1.5}, "source": "test"}}
    plan = {"machine_start": {"value": 90, "source": "test", "placeholder": True},
            "command_overhead": {"value": 20, "source": "test"},
            "cell_overhead": {"value": 2, "source": "test"},
            "engines": {"vllm": engine}}
    plan.update(over)
    return plan


def profile(spec: dict | None = None) -> dict:
    return {"engine": "vllm", "command": ["vllm", "serve"], "engine_version": "0.26.0",
            "model": {"id": "m", "revision": None},
            **({"speculative": spec} if spec else {})}


PROFILES = {"p-none": profile(), "p-k7": profile({"method": "dflash", "num_speculative_tokens": 7}),
            "p-k3": profile({"method": "dflash", "num_speculative_tokens": 3}),
            "p-mtp": profile({"method": "mtp", "num_speculative_tokens": 3})}


def study(name: str, nb: str, arms: list[tuple[str, str]], **over) -> dict:
    return {"name": name, "notebook": nb,
            "arms": [{"name": a, "profile": p} for a, p in arms], "baseline": arms[0][0],
            "workloads": [{"name": "essays", "n": 8, "form": "completion", "max_tokens": 100}],
            "concurrency": [1, 8], "sampling": [{"temperature": 0.0}], "repeats": 1,
            "seed": 10, "window": WINDOW, **over}


def write(tmp_path: Path, studies: dict[str, dict], plan: dict | None,
          profiles: dict | None = None) -> Path:
    params = tmp_path / "params"
    for sub in ("profiles", "studies"):
        (params / sub).mkdir(parents=True, exist_ok=True)
    for name, body in {**PROFILES, **(profiles or {})}.items():
        (params / "profiles" / f"{name}.yaml").write_text(yaml.safe_dump(body))
    for nb, body in studies.items():
        (params / "studies" / f"{nb}.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    suite = {"name": "t", "run_id": "r", "results_dir": "../results", "profiles": "profiles",
             "binds": "listed",
             "notebooks": {nb: {"study": f"studies/{nb}.yaml"} for nb in studies}}
    if plan is not None:
        suite["plan"] = plan
    path = params / "suite.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    return path


def planned(path: Path, notebooks=(), stored: Stored | None = None):
    plans = resolve(path, notebooks)
    suite = load_suite(path)
    stored = stored or Stored()
    costs = CostModel(suite.plan, stored, str(path))
    studies = {st.notebook_id: st for st, _, _ in plans}
    return make_plan(suite.plan, studies, list(studies), stored, costs, str(path), "t"), costs


def events(result, kind: str, notebook: str | None = None):
    return [e for lease in result.leases for c in lease.commands for e in c.events
            if e.kind == kind and (notebook is None or e.notebook == notebook)]


def commands(result):
    return [c for lease in result.leases for c in lease.commands]


BIG = {"lease_s": 1e6, "command_s": 1e6}  # one command holds everything


# ------------------------------------------------------------------------- counting


def test_a_cell_two_notebooks_of_one_command_share_is_measured_once(tmp_path):
    levels7 = [1, 8]
    s6 = study("06", S06, [("none", "p-none"), ("static-k7", "p-k7")], concurrency=[1, 8, 32])
    s7 = study("07", S07, [("none", "p-none"), ("mtp-control", "p-mtp"), ("dflash-k7", "p-k7")],
               concurrency=levels7)
    path = write(tmp_path, {S06: s6, S07: s7},
                 priors(order=[{"notebooks": [S06, S07]}], **BIG))
    result, _ = planned(path)
    assert len(commands(result)) == 1
    copies = events(result, "copy", S07)
    # 07's none and dflash-k7 are 06's none and static-k7 at 07's levels: filed, not measured
    assert sorted((e.pc.cell.arm.name, e.pc.cell.concurrency) for e in copies) == sorted(
        (arm, c) for arm in ("none", "dflash-k7") for c in levels7)
    measured7 = events(result, "cell", S07)
    assert {e.pc.cell.arm.name for e in measured7} == {"mtp-control"}
    cells = events(result, "cell")
    assert len({e.pc.shared for e in cells}) == len(cells)  # no measurement twice
    # seconds: 06's cells and 07's own arm, each once
    assert sum(e.s for e in cells) == pytest.approx(
        sum(e.est.s for e in cells if e.notebook == S06) + sum(e.est.s for e in measured7))
    # alone, 07 measures its shared cells itself
    alone, _ = planned(path, [S07])
    assert not events(alone, "copy") and len(events(alone, "cell")) == 3 * len(levels7)


def test_a_stored_cell_of_an_arm_the_command_does_not_run_is_a_source_of_copies(tmp_path):
    s6 = study("06", S06, [("none", "p-none"), ("static-k7", "p-k7")])
    s7 = study("07", S07, [("none", "p-none"), ("dflash-k7", "p-k7")])
    path = write(tmp_path, {S06: s6, S07: s7},
                 priors(order=[{"notebooks": [S06, S07], "arms": ["dflash-k7"]}], **BIG))
    (st6, _, _), _ = resolve(path)
    store_with(tmp_path, "06", cells=[
        cell_row("p-k7", c.concurrency, 20.0, arm="static-k7", repeat=0, seed=c.seed,
                 top_p=1.0, top_k=-1, timing=None)
        for c in st6.cells() if c.arm.name == "static-k7"])
    result, _ = planned(path, [S06, S07], stored=read_stores([tmp_path / "results"]))
    first = commands(result)[0]
    # 06 runs no arm here (--arm dflash-k7 is 07's), yet its stored static-k7 cells are
    # what SharedCells files 07's dflash-k7 from: no engine start for them
    assert "--arm dflash-k7" in first.line
    assert [e.kind for e in first.events] == ["copy"] * len(s7["concurrency"])


def test_twins_start_again_after_every_other_group_and_rounds_restart_each_group(tmp_path):
    repeats = 3
    s6 = study("06", S06, [("none", "p-none"), ("static-k7", "p-k7"),
                           ("none-aa", "p-none")], repeats=repeats,
               skip=[{"arm": "none-aa", "concurrency": [8]},
                     {"arm": "static-k7", "concurrency": [1, 8], "repeat": [2]}])
    s6["arms"][2]["noise_of"] = "none"
    path = write(tmp_path, {S06: s6}, priors(**BIG))
    result, _ = planned(path)
    starts = events(result, "start")
    arms = [e.what.split("(arm ")[1].rstrip(")") for e in starts]
    # a start per group per round where the group has cells (static-k7 has none in the
    # last round), the twin's group after every other group of its round
    assert arms == ["none", "static-k7", "none-aa"] * (repeats - 1) + ["none", "none-aa"]
    # each profile's first start on the lease pays the penalty; the twin's never does
    assert [e.s for e in starts] == [70 + 80 if i < 2 else 70 for i in range(len(starts))]
    # cells: every declared cell once
    assert len(events(result, "cell")) == sum(1 for _ in resolve(path)[0][0].cells())


def test_a_machine_first_start_penalty_is_paid_once_a_lease(tmp_path):
    s = study("06", S06, [("none", "p-none"), ("k7", "p-k7"), ("k3", "p-k3")], repeats=2)
    plan = priors(**BIG)
    plan["engines"]["vllm"]["first_start"]["per"] = "machine"
    result, _ = planned(write(tmp_path, {S06: s}, plan))
    assert [e.s for e in events(result, "start")] == [70 + 80] + [70] * (3 * 2 - 1)


# ---------------------------------------------------------------------------- costs


def expected_window(full: float, w: dict) -> float:
    mean = full * (1 - w["cap_spread"] / 2)
    span = min(max(full + (w["turnovers"] - 1) * mean, w["window_s"]), w["max_window_s"])
    return w["skip_s"] + span + full


@pytest.mark.parametrize("cap, streams", [(100, 8), (600, 8), (2000, 128), (100, 32)])
def test_windowed_cells_from_priors_clamp_their_window(tmp_path, cap, streams):
    s = study("06", S06, [("none", "p-none")], concurrency=[streams],
              workloads=[{"name": "essays", "n": 8, "form": "completion", "max_tokens": cap}])
    path = write(tmp_path, {S06: s}, priors())
    (st, _, _), = resolve(path)
    cell, = st.cells()
    costs = CostModel(load_suite(path).plan, Stored(), str(path))
    lo, hi = sorted(TOK_S)
    f = (math.log2(streams) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
    agg = TOK_S[lo] + min(max(f, 0), 1) * (TOK_S[hi] - TOK_S[lo])
    full = cap / (agg / streams)
    est = costs.cell(st, cell)
    assert not est.measured and st.windowed(cell)
    assert est.s == pytest.approx(expected_window(full, WINDOW))


def test_requests_cells_send_every_prompt_once_in_waves(tmp_path):
    n, cap = 9, 100
    s = study("02", "02_temperature_spread", [("mtp", "p-mtp"), ("none", "p-none")],
              concurrency=[1, 8], window=None,
              sampling=[{"temperature": 0.0}, {"temperature": 0.7}],
              workloads=[{"name": "essays", "n": n, "form": "completion", "max_tokens": cap}])
    path = write(tmp_path, {"02_temperature_spread": s}, priors())
    (st, _, _), = resolve(path)
    costs = CostModel(load_suite(path).plan, Stored(), str(path))
    one = 1000 / STEP_MS
    for cell in st.cells():
        c = cell.concurrency
        rate = (one if c == 1 else TOK_S[8]) / c
        if cell.arm.name == "mtp":
            greedy = SPEEDUP[1] + (SPEEDUP[128] - SPEEDUP[1]) * math.log2(c) / math.log2(128)
            rate *= greedy if cell.sampling.temperature == 0 else 1.5
        assert costs.cell(st, cell).s == pytest.approx(math.ceil(n / c) * cap / rate), cell


def store_with(tmp_path: Path, study_name: str, *, engines=(), cells=(), at=None,
               host: str = ""):
    """A store of one session; its machine unnamed unless `host` names it (starts on an
    unnamed machine all count as later starts: cost_model.CostModel.split_first_starts)."""
    store = ResultStore(tmp_path / "results", study_name, "r")
    store.begin_session({"params": None})
    store.update_session(host={"hostname": "vm", "boot_id": host} if host else {"hostname": ""})
    if at is not None:
        store.update_session(started_at=at.isoformat())
    if engines:
        store.update_session(engines=list(engines))
    for i, row in enumerate(cells):
        store.append_cell({"cell_id": f"{i:016x}", "status": "ok", **row})
    store.end_session("ok")
    return store


T0 = dt.datetime(2026, 12, 10, 12, 0, tzinfo=dt.UTC)


def cell_row(profile_: str, conc: int, seconds: float, **over) -> dict:
    return {"arm": "x", "profile": profile_, "engine": "vllm", "workload": "essays",
            "n_prompts": 8, "concurrency": conc, "temperature": 0.0, "timing": "window",
            "started_at": T0, "ended_at": T0 + dt.timedelta(seconds=seconds), **over}


def test_measured_constants_come_first_then_the_engine_then_the_priors(tmp_path):
    s = study("06", S06, [("none", "p-none"), ("k7", "p-k7"), ("k3", "p-k3")],
              concurrency=[1, 8, 32])
    path = write(tmp_path, {S06: s}, priors())
    store_with(tmp_path, "other", engines=[
        {"arm": "a", "profile": "p-none", "engine": "vllm", "ready_s": 100.0},
        {"arm": "a", "profile": "p-none", "engine": "vllm", "ready_s": 120.0},
        {"arm": "b", "profile": "p-none", "engine": "vllm", "ready_s": 999.0,
         "shared_launch": {"study": "x"}},  # a launch counted under its launcher only
        {"arm": "c", "profile": "p-none", "engine": "vllm", "ready_s": None},  # attached
        {"arm": "d", "profile": "p-k7", "engine": "vllm", "ready_s": 60.0,
         "error": "did not start"},
        {"arm": "e", "profile": "p-mtp", "engine": "vllm", "ready_s": 40.0}], cells=[
        cell_row("p-none", 8, 30.0), cell_row("p-none", 8, 40.0), cell_row("p-none", 8, 50.0),
        cell_row("p-none", 8, 500.0, shared_from="y/0000000000000000"),  # a copy: no cost
        cell_row("p-none", 8, 700.0, status="failed"),
        cell_row("p-mtp", 32, 22.0)])
    stored = read_stores([tmp_path / "results"])
    costs = CostModel(load_suite(path).plan, stored, str(path))
    (st, _, _), = resolve(path)
    arms = {a.name: a.resolved for a in st.arms}
    none = costs.start(arms["none"])
    assert (none.s, none.measured) == (110.0, True)  # median of its profile's starts
    k7 = costs.start(arms["k7"])  # no start of its own: the engine's median (100, 120, 40)
    assert (k7.s, k7.measured) == (100.0, True) and "engine vllm" in k7.source
    cells = {(c.arm.name, c.concurrency): c for c in st.cells()}
    same = costs.cell(st, cells[("none", 8)])
    assert (same.s, same.measured) == (40.0, True)  # same profile and level, median
    near = costs.cell(st, cells[("k7", 32)])  # the engine's windowed cells at 32 streams
    assert (near.s, near.measured) == (22.0, True)
    engine = costs.cell(st, cells[("k3", 8)])  # nothing of p-k3: the engine's at 8 ...
    assert engine.measured and engine.s == 40.0  # ... p-none's, its copy and failure left out
    prior = costs.cell(st, cells[("k3", 1)])  # one stream: requests mode, nothing stored
    assert not prior.measured and prior.s == pytest.approx(
        8 * 100 / (1000 / STEP_MS * SPEEDUP[1]))
    # an engine nothing stored times and the plan gives no priors for: said where
    empty = CostModel(load_suite(path).plan.model_copy(update={"engines": {}}), stored,
                      str(path))
    assert empty.start(arms["none"]).measured
    with pytest.raises(ParamsError) as err:
        empty.cell(st, cells[("k3", 1)])
    assert str(path) in str(err.value) and "plan.engines.vllm" in str(err.value)


def test_a_first_start_on_a_machine_is_told_from_its_later_starts(tmp_path):
    """A profile's first start on a machine pays the compile its later starts there reuse:
    `start` reads the later starts, the first-start penalty is measured from both (a first
    start with no later one there is set against the profile's later starts elsewhere, else
    the engine's)."""
    s = study("06", S06, [("none", "p-none"), ("k7", "p-k7"), ("k3", "p-k3")])
    path = write(tmp_path, {S06: s}, priors())
    # machine A: p-none 90 then 50, 52; p-k7 110 then 46; p-mtp once (a first start only);
    # both machines are named "vm", as leased ones are: their boot ids tell them apart
    store_with(tmp_path, "a", host="A", at=T0, engines=[
        {"arm": "n", "profile": "p-none", "engine": "vllm", "ready_s": 90.0, "launch": 1},
        {"arm": "k", "profile": "p-k7", "engine": "vllm", "ready_s": 110.0, "launch": 2},
        {"arm": "m", "profile": "p-mtp", "engine": "vllm", "ready_s": 95.0, "launch": 3},
        {"arm": "n2", "profile": "p-none", "engine": "vllm", "ready_s": 50.0, "launch": 4},
        {"arm": "k2", "profile": "p-k7", "engine": "vllm", "ready_s": 46.0, "launch": 5}])
    # a later session on machine A: p-none again (a later start); machine B: p-none first
    store_with(tmp_path, "b", host="A", at=T0 + dt.timedelta(hours=1), engines=[
        {"arm": "n", "profile": "p-none", "engine": "vllm", "ready_s": 52.0, "launch": 1}])
    store_with(tmp_path, "c", host="B", at=T0 + dt.timedelta(hours=2), engines=[
        {"arm": "n", "profile": "p-none", "engine": "vllm", "ready_s": 99.0, "launch": 1}])
    costs = CostModel(load_suite(path).plan, read_stores([tmp_path / "results"]), str(path))
    (st, _, _), = resolve(path)
    arms = {a.name: a.resolved for a in st.arms}
    assert costs.start(arms["none"]).s == 51.0      # later starts 50, 52 (first 90, 99 out)
    assert costs.start(arms["k7"]).s == 46.0
    k3 = costs.start(arms["k3"])                    # the engine's later starts: 50, 52, 46
    assert (k3.s, k3.measured) == (50.0, True)
    pen, per = costs.first_start("vllm")
    # p-none on A: 90 - 51 = 39; p-k7 on A: 110 - 46 = 64; p-none on B, no later start there:
    # 99 - 51 (p-none's later starts on A); p-mtp, started once anywhere: 95 - 50 (the
    # engine's later starts 50, 52, 46), as the H100's 5-draft arm on 2026-12-07 (202 s)
    assert (pen.s, pen.measured, per) == (46.5, True, "profile")  # median of 39, 45, 48, 64
    # where no profile was started both ways, the declared prior
    empty = CostModel(load_suite(path).plan, Stored(), str(path))
    assert empty.first_start("vllm")[0] == Estimate(80, empty.used["first start vllm"])


def test_an_arms_own_draft_schedule_is_not_costed_by_its_profiles_other_cells(tmp_path):
    sched = [[1, 12, 7], [13, 128, 3]]
    extra = {"p-sched": profile({"method": "dflash", "num_speculative_tokens": 7,
                                 "num_speculative_tokens_per_batch_size": sched})}
    s = study("06", S06, [("schedule", "p-sched"), ("zero-tail", "p-sched")], concurrency=[8])
    s["arms"][1]["overrides"] = {"speculative": {
        "num_speculative_tokens_per_batch_size": [[1, 4, 7], [5, 128, 0]]}}
    path = write(tmp_path, {S06: s}, priors(), extra)
    store_with(tmp_path, "other", cells=[cell_row("p-sched", 8, 33.0, schedule=json.dumps(sched))])
    costs = CostModel(load_suite(path).plan, read_stores([tmp_path / "results"]), str(path))
    (st, _, _), = resolve(path)
    own, other = (costs.cell(st, c) for c in st.cells())
    assert own.s == other.s == 33.0  # the second only as the engine's cell at the level
    assert "p-sched" in own.source and "engine vllm" in other.source


# ------------------------------------------------------------------ commands, leases


def test_commands_fit_a_call_and_leases_the_budget_in_the_declared_order(tmp_path):
    s1 = study("01", S01, [("a", "p-none"), ("b", "p-k7"), ("c", "p-k3")],
               concurrency=[1, 8, 128], repeats=2)
    s6 = study("06", S06, [("none", "p-none"), ("static-k7", "p-k7")], concurrency=[8, 128])
    lease_s, command_s, reserve = 1200.0, 400.0, 60.0
    path = write(tmp_path, {S01: s1, S06: s6},
                 priors(order=[S06, S01], lease_s=lease_s, command_s=command_s,
                        command_reserve_s=reserve))
    result, _costs = planned(path)
    cmds = commands(result)
    assert len(cmds) > 2 and len(result.leases) > 1
    for c in cmds:
        assert c.deadline_s + reserve + sum(e.value for e in c.exports) <= command_s
        assert c.run_s <= c.deadline_s
        # the simulation never started an engine the runner's rule refuses
        starts = [e for e in c.events if e.kind == "start"]
        assert starts or not c.work
    for lease in result.leases:
        assert lease.total_s <= lease_s
    # the declared order: every 06 cell before any 01 cell
    order = [e.notebook for e in events(result, "cell")]
    assert order.index(S01) > max(i for i, nb in enumerate(order) if nb == S06)
    # every declared cell is planned exactly once
    declared = sum(1 for st, _, _ in resolve(path) for _ in st.cells())
    assert len(events(result, "cell")) + len(result.unplanned) == declared
    # a budget: what fits and what is left out
    total = result.total_s
    lines, kept = budget_lines(result, total)
    assert "fits" in lines[0] and len(kept) == len(cmds)
    first = result.leases[0].total_s
    lines, kept = budget_lines(result, first)
    assert "does NOT fit" in lines[0]
    assert kept == {id(c) for c in result.leases[0].commands}
    assert any(S01 in line for line in lines[1:])


@pytest.mark.parametrize("lease_s, same_machine", [(1e6, True), (None, False)])
def test_a_step_on_another_engine_stages_its_bundle_where_the_lease_has_room(
        tmp_path, lease_s, same_machine):
    """vLLM's cells, then SGLang's: with room left, SGLang's bundle is staged on the same
    machine (a staging command, no second machine start, the stand-in not exported again);
    without room for the staging and a command, it opens a lease of its own."""
    sg = {**priors()["engines"]["vllm"], "staging": {"value": 170, "source": "test"}}
    profiles = {"s-none": {**profile(), "engine": "sglang", "command": ["sglang"],
                           "engine_version": "0.5.14", "return_spec_details": True}}
    s6 = study("06", S06, [("none", "p-none")], concurrency=[8])
    s1 = study("01", S01, [("none", "s-none")], concurrency=[8])
    path = write(tmp_path, {S06: s6, S01: s1}, priors(
        order=[S06, S01], engines={"vllm": priors()["engines"]["vllm"], "sglang": sg},
        lease_s=1800.0), profiles)
    if lease_s is None:  # room for vLLM's command only: the staging and one more do not fit
        first, _ = planned(path, [S06])
        lease_s = first.total_s + 170 + 20 + 60 - 1
        suite = yaml.safe_load(path.read_text())
        suite["plan"]["lease_s"] = lease_s
        path.write_text(yaml.safe_dump(suite, sort_keys=False))
    result, _ = planned(path)
    staged = [c for c in commands(result) if c.staged]
    if same_machine:
        lease, = result.leases
        assert lease.engines == ["vllm", "sglang"] and [c.staged for c in staged] == ["sglang"]
        assert staged[0].device_s == 170
        i = lease.commands.index(staged[0])  # after vLLM's commands, before SGLang's
        assert {c.work.engine for c in lease.commands[:i]} == {"vllm"}
        assert {c.work.engine for c in lease.commands[i + 1:]} == {"sglang"}
        assert sum(e.s for _, e in lease.fixed) == 90 + 120  # one machine start, one staging
    else:
        assert not staged and [ls.engines for ls in result.leases] == [["vllm"], ["sglang"]]
        assert sum(e.s for _, e in result.leases[1].fixed) == 90 + 170
    assert len(events(result, "cell")) == 2


def test_the_runner_deadline_rule_stops_a_command_before_a_start_that_does_not_repay(tmp_path):
    s = study("06", S06, [("none", "p-none"), ("k7", "p-k7")], concurrency=[8])
    command_s = 60 + 20 + 150 + 40  # reserve, one first start, a little room
    path = write(tmp_path, {S06: s}, priors(command_s=float(command_s), lease_s=1e6))
    result, _ = planned(path)
    cmds = commands(result)
    assert [len([e for e in c.events if e.kind == "start"]) for c in cmds] == [1, 1]
    first = cmds[0]
    starts = [e.s for e in first.events if e.kind == "start"]
    cells = [e.s + 2 for e in first.events if e.kind == "cell"]
    left = first.deadline_s - sum(starts) - sum(cells) - 10
    assert not start_repays(left, starts, cells, first.bound_s, 1)
    assert "would not repay" in first.stopped


def test_exports_a_lease_needs_run_once_per_lease(tmp_path):
    big = {"p-big": {**profile(), "model": {"id": "build/big/target", "revision": None}}}
    s = study("06", S06, [("none", "p-big")], concurrency=[8])
    exports = [{"name": "big", "value": 40, "source": "test", "paths": ["build/big"],
                "command": "make-big"},
               {"name": "other", "value": 300, "source": "test", "paths": ["build/o"],
                "command": "make-o", "own_command": True}]
    path = write(tmp_path, {S06: s}, priors(exports=exports, **BIG), big)
    result, _ = planned(path)
    cmd, = commands(result)
    assert [e.name for e in cmd.exports] == ["big"] and cmd.line.startswith("make-big && ")
    assert cmd.device_s == pytest.approx(20 + 40 + cmd.run_s + cmd.teardown_s)


def test_stored_cells_are_not_planned_again(tmp_path):
    s = study("06", S06, [("none", "p-none")], concurrency=[1, 8])
    path = write(tmp_path, {S06: s}, priors(**BIG))
    (st, _, _), = resolve(path)
    one = next(c for c in st.cells() if c.concurrency == 8)
    store_with(tmp_path, "06", cells=[cell_row("p-none", 8, 33.0, arm="none", repeat=0,
                                                seed=one.seed, top_p=1.0, top_k=-1)])
    stored = read_stores([tmp_path / "results"])
    result, _ = planned(path, stored=stored)
    assert [e.pc.cell.concurrency for e in events(result, "cell")] == [1]
    assert len(result.stored[S06]) == 1


def test_a_copy_filed_in_a_store_is_stored_not_filed_again(tmp_path):
    # 07's dflash-k7 filed from 06's static-k7 by an earlier command: the copy is 07's cell,
    # so no later command plans it (a command that only files copies costs a call)
    s6 = study("06", S06, [("none", "p-none"), ("static-k7", "p-k7")])
    s7 = study("07", S07, [("none", "p-none"), ("dflash-k7", "p-k7")])
    path = write(tmp_path, {S06: s6, S07: s7},
                 priors(order=[{"notebooks": [S06, S07]}], **BIG))
    (st6, _, _), (st7, _, _) = resolve(path)
    row = dict(repeat=0, top_p=1.0, top_k=-1)
    store_with(tmp_path, "06", cells=[cell_row("p-none" if c.arm.name == "none" else "p-k7",
                                               c.concurrency, 20.0, arm=c.arm.name,
                                               seed=c.seed, **row) for c in st6.cells()])
    sevens = [c for c in st7.cells() if c.arm.name == "dflash-k7"]
    store_with(tmp_path, "07", cells=[cell_row("p-k7", c.concurrency, 20.0, arm="dflash-k7",
                                               seed=c.seed, shared_from=f"06/{i:016x}", **row)
                                      for i, c in enumerate(sevens)])
    stored = read_stores([tmp_path / "results"])
    assert len(stored.copies) == len(sevens) and all(c.study == "07" for c in stored.copies)
    result, _ = planned(path, stored=stored)
    assert len(result.stored[S07]) == len(sevens)  # counted as stored
    # 07's none is 06's stored none: filed by the plan, once; dflash-k7 is not filed again
    assert sorted(e.pc.cell.arm.name for e in events(result, "copy", S07)) == (
        ["none"] * len(s7["concurrency"]))
    assert not events(result, "cell")


# -------------------------------------------------------------------- params errors


@pytest.mark.parametrize("change, key, words", [
    (lambda p: p["engines"]["vllm"].update(strat={"value": 1, "source": "x"}),
     "plan.engines.vllm.strat", "unknown key 'strat'"),
    (lambda p: p.update(order=[S06, "08_nothing"]), "plan.order[1]", "08_nothing"),
    (lambda p: p.update(order=[{"notebooks": ["zz"]}]), "plan.order[0].notebooks[0]", "'zz'"),
    (lambda p: p.update(command_reserve_s=700.0), "plan.command_reserve_s", "less than"),
    (lambda p: p["engines"]["vllm"]["start"].pop("source"), "plan.engines.vllm.start.source",
     "missing"),
    (lambda p: p["engines"]["vllm"]["tok_s"].update(by_streams={"eight": 1.0}),
     "plan.engines.vllm.tok_s.by_streams", "expected"),
])
def test_a_bad_plan_block_is_refused_naming_the_file_and_the_key(tmp_path, change, key, words):
    plan = priors()
    change(plan)
    path = write(tmp_path, {S06: study("06", S06, [("none", "p-none")])}, plan)
    with pytest.raises(ParamsError) as err:
        load_suite(path)
    text = str(err.value)
    assert f"suite.yaml: {key}:" in text and words in text, text


def test_a_suite_without_a_plan_block_is_refused_clearly(tmp_path, capsys):
    path = write(tmp_path, {S06: study("06", S06, [("none", "p-none")])}, None)
    assert plan_command.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "plan: expected a plan: block" in err


# ------------------------------------------------------------------- command line


def test_the_command_prints_the_plan_and_planned_against_spent(tmp_path, capsys):
    s = study("06", S06, [("none", "p-none"), ("k7", "p-k7")], concurrency=[8])
    path = write(tmp_path, {S06: s}, priors(**BIG))
    assert plan_command.main([str(path), "--budget-s", "10"]) == 0
    out = capsys.readouterr().out
    assert "does NOT fit" in out and "bash scripts/gpu_measure.sh" in out
    assert "--notebook 06_draft_schedule_under_load" in out and "[PLACEHOLDER]" in out
    # a lease's sessions: a start and a cell stored after T0, and one before it
    (st, _, _), = resolve(path)
    cell = next(c for c in st.cells() if c.arm.name == "none")
    before = T0 - dt.timedelta(days=1)
    store_with(tmp_path, "06", at=before, engines=[
        {"arm": "none", "profile": "p-none", "profile_hash": "h", "engine": "vllm",
         "ready_s": 50.0}])
    store_with(tmp_path, "06", at=T0, engines=[
        {"arm": "none", "profile": "p-none", "profile_hash": "h", "engine": "vllm",
         "ready_s": 130.0}],
        cells=[cell_row("p-none", 8, 25.0, arm="none", repeat=0, seed=cell.seed,
                        top_p=1.0, top_k=-1),
               cell_row("p-none", 8, 7.0, arm="none", status="interrupted")])
    assert plan_command.main([str(path), "--spent", "--since", T0.isoformat()]) == 0
    out = capsys.readouterr().out
    window = expected_window(100 / (TOK_S[8] / 8), WINDOW)
    # planned from what was stored before T0: p-none's 50-s start, its first on the host
    assert f"Planned {50 + 80 + window:,.0f} s, spent {130 + 25 + 7:,.0f} s" in out
    assert "lost 7 s." in out  # an interrupted attempt spent its seconds, planned none


def test_a_studys_unanswered_probes_are_listed_with_a_start_each(tmp_path, capsys):
    s = study("06", S06, [("none", "p-none")], concurrency=[8],
              probes=[{"name": "asked", "profile": "p-k3", "question": "starts?"},
                      {"name": "new", "profile": "p-mtp", "question": "starts?"}])
    path = write(tmp_path, {S06: s}, priors(**BIG))
    (st, _, _), = resolve(path)
    asked = st.probes[0].resolved
    store_with(tmp_path, "06", engines=[{"arm": "x", "profile": asked.name, "engine": "vllm",
                                         "profile_hash": identity.profile_hash(asked),
                                         "ready_s": 30.0}])
    assert plan_command.main([str(path)]) == 0
    out = capsys.readouterr().out.split("Probes (not in the commands above)")[1]
    assert f"{S06} probe asked: answered" in out
    assert f"{S06} probe new (p-mtp): not answered; about {30 + 80:,.0f} s" in out  # the
    # engine's stored start (p-mtp has none of its own) and a first start's penalty


def test_the_stand_in_suite_plans_its_seven_notebooks(capsys):
    root = Path(__file__).resolve().parents[1]
    suite = root / "params" / "h200-standin.yaml"
    assert plan_command.main([str(suite)]) == 0
    out = capsys.readouterr().out
    plan = load_suite(suite).plan
    assert "Total:" in out and "Lease 1 (vllm's bundle)" in out
    for nb in load_suite(suite).notebooks:
        assert f"--notebook {nb}" in out
    for line in out.splitlines():
        if "gpu_measure.sh" in line:
            deadline = int(line.split("gpu_measure.sh ")[1].split()[1])
            assert deadline <= plan.command_s - plan.command_reserve_s
