"""The step-cost model (issue 39): its units, its floor, its bound, its data and its fits,
from constructed cards and models; and the stored stand-in cells it is checked against.

The constructed records are validated through the same loader as the shipped files, so a
test of the model is also a test that the data files' rules hold for what it builds.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest
import yaml

from specrepro import params, pipeline
from specrepro.analysis.step_cost import articles as arts
from specrepro.analysis.step_cost import cells as cells_mod
from specrepro.analysis.step_cost import check as chk
from specrepro.analysis.step_cost import data
from specrepro.analysis.step_cost import model as sc
from specrepro.analysis.step_cost import suite as step_cost_suite
from specrepro.analysis.step_cost.cells import COLUMNS

ROOT = Path(__file__).resolve().parents[1]


def make_card(rated=1000.0, measured=None, peak=100.0, **extra) -> data.Card:
    """A card: rated (and measured) GB/s, a bf16 dense peak in TFLOP/s."""
    src = "vendor: a constructed datasheet"
    return data.Card.model_validate({
        "label": "constructed card", "memory_gb": {"value": 80, "source": src},
        "rated_bandwidth_gb_s": {"value": rated, "source": src},
        "measured_bandwidth_gb_s": {"value": measured, "source": "measured: none here"},
        "peak_tflop_s": {"bf16": {"value": peak, "source": src}},
        "power_cap_w": {"value": 700, "source": src}, **extra})


def make_model(weights: dict, gflop=2.0, role="target", drafts=None, kv=0.0) -> data.Model:
    src = "derived: constructed"
    return data.Model.model_validate({
        "label": f"constructed {role}", "role": role, "drafts": drafts,
        "weights": {**weights, "source": src},
        "gflop_per_token": {"bf16": {"value": gflop, "source": src}},
        "layers": {"value": 1, "source": src},
        "kv_bytes_per_token": {"value": kv or None, "source": src}})


# ------------------------------------------------------------------ units and the floor


def test_the_floor_divides_bytes_by_decimal_bandwidth_and_a_gib_is_not_a_gb():
    card = make_card(rated=1000.0, measured=800.0)  # 1 TB/s rated, 0.8 measured
    gib, gb = make_model({"gib": 1}), make_model({"gb": 1})
    assert gb.weights.n_bytes == 1e9 and gib.weights.n_bytes == 2**30
    floors = sc.floor_ms(card, gib.weights.n_bytes)
    # 1 GiB = 1.0737 GB: 1.0737 ms at 1 TB/s, not the 1.00 ms a GiB read as a GB gives
    assert floors["rated"] == pytest.approx(1.073741824)
    assert floors["measured"] == pytest.approx(1.073741824 / 0.8)
    assert sc.floor_ms(card, gb.weights.n_bytes)["rated"] == pytest.approx(1.0)
    # the model divides by the measured figure where one exists, else the rated one
    assert card.bandwidth_gb_s == 800.0 and make_card().bandwidth_gb_s == 1000.0


def test_a_size_takes_exactly_one_unit_and_names_the_key_when_it_does_not():
    text = yaml.safe_dump({"models": {"t": {
        "label": "t", "role": "target", "weights": {"gb": 1, "gib": 1, "source": "derived: x"},
        "gflop_per_token": {"bf16": {"value": 1, "source": "derived: x"}},
        "layers": {"value": 1, "source": "derived: x"},
        "kv_bytes_per_token": {"value": None, "source": "derived: x"}}},
        "published": {"targets": [], "drafters": []}})
    with pytest.raises(data.StepCostDataError,
                       match=r"step_cost/models.yaml: models\.t\.weights: .*exactly one of bytes, gb, gib"):
        data.validate_text(data.MODELS_FILE, text)


def test_a_value_without_a_known_kind_of_source_fails_naming_file_and_key():
    raw = yaml.safe_load((ROOT / "lib/specrepro/analysis" / data.CARDS_FILE).read_text())
    raw["cards"]["h200"]["power_cap_w"]["source"] = "about 700 W, I think"
    with pytest.raises(data.StepCostDataError,
                       match=r"step_cost/cards.yaml: cards\.h200\.power_cap_w: .*source must open"):
        data.validate_text(data.CARDS_FILE, yaml.safe_dump(raw))


# ------------------------------------------------------- drafter bytes in the floor


def test_a_speculative_step_reads_its_drafters_bytes_block_once_and_chain_k_times():
    target = make_model({"gb": 20})
    block = make_model({"gb": 3}, gflop=0.6, role="drafter", drafts="block")
    head = make_model({"gb": 0.5}, gflop=0.1, role="drafter", drafts="chain")

    def weights(parts):
        return sum(p.weight_bytes for p in parts) / 1e9

    assert weights(sc.passes(target, None, 0, 1, 0)) == pytest.approx(20)
    assert weights(sc.passes(target, block, 7, 1, 0)) == pytest.approx(23)
    assert weights(sc.passes(target, head, 3, 1, 0)) == pytest.approx(21.5)
    # a zero tier of a schedule is plain decoding: no drafter pass
    assert weights(sc.passes(target, block, 0, 1, 0)) == pytest.approx(20)
    # the block drafter runs over the 1 + k positions the target verifies
    parts = sc.passes(target, block, 7, 4, 0)
    assert parts[0].flops["bf16"] == pytest.approx(2e9 * 4 * 8)
    assert parts[1].flops["bf16"] == pytest.approx(0.6e9 * 4 * 8)


def test_the_substrate_floor_line_puts_the_drafters_bytes_in_and_states_both_floors():
    card, target = data.card("h200"), data.model("standin-target")

    def arm(name, spec=None, drafter=None):
        prof = SimpleNamespace(speculative=spec, drafter=drafter, flags={}, model=SimpleNamespace(
            id="build/standin/target"))
        return SimpleNamespace(name=name, noise_of=None, resolved=prof)

    spec = SimpleNamespace(method="dflash", num_speculative_tokens=7)
    study = SimpleNamespace(arms=[arm("none"), arm("dflash-k7", spec, SimpleNamespace(
        id="build/standin/vllm/dflash"))])
    cells = pl.DataFrame({"arm": ["none", "dflash-k7"], "concurrency": [1, 1],
                          "step_ms": [7.05, 8.90]})
    f = SimpleNamespace(suite=SimpleNamespace(substrate=SimpleNamespace(
        card="h200", target="standin-target")), study=study, cells=cells)
    line = step_cost_suite.floor_line(f)
    with_drafter = target.weights.n_bytes + data.model("standin-dflash").weights.n_bytes
    assert f"{with_drafter / 1e9:.3g} GB" in line and "22.5 GB" in line
    assert "rated" in line and "measured" in line
    # the block drafter's step against a floor that includes its 3.38 GB: 77 % measured
    measured = sc.floor_ms(card, with_drafter)["measured"]
    assert f"{100 * measured / 8.90:.0f} % of the measured floor's speed" in line
    rated = sc.floor_ms(card, target.weights.n_bytes)["rated"]
    assert f"{100 * rated / 7.05:.0f} % of the rated floor's speed" in line


def test_notebook_03s_arms_each_read_their_own_precisions_bytes_in_the_h100_floor():
    """The H100 suite's 03: bf16, FP8 at load and the NVFP4 export are three records, so the
    floor line and the model's rows give each arm its own bytes a step and share of the floor."""
    f = pipeline.load_finding(ROOT / "params/h100-standin.yaml", "03_target_precision", "replay")
    drafter = data.model("standin-dflash").weights.n_bytes
    own = {"target-bf16": "standin-target", "target-fp8": "standin-target-fp8",
           "target-nvfp4": "standin-target-nvfp4"}
    rows = step_cost_suite.finding_cells(f)
    assert dict(zip(rows["arm"], rows["target"], strict=True)) == own
    line = step_cost_suite.floor_line(f)
    h100 = data.card("h100")
    for arm, record in own.items():
        step = data.model(record).weights.n_bytes + drafter  # one block pass of the drafter
        assert f"{step / 1e9:.3g} GB, floor {sc.floor_ms(h100, step)['rated']:.2f} ms rated" in line
        ms = float(f.cells.filter((pl.col("arm") == arm) & (pl.col("concurrency") == 1))
                   ["step_ms"].mean())
        share = 100 * sc.floor_ms(h100, step)["rated"] / ms
        assert f"{arm} {ms:.2f} ms ({share:.0f} % of the rated floor's speed)" in line
    assert "its own target: " + data.model("standin-target-fp8").label in line
    assert "No target record" not in line
    # the targets' bytes a step, as the records say: FP8 a byte a weight, NVFP4 4.5 bits (a
    # scale a 16), each with the bf16 head and what vLLM allocates beyond the tensors
    bf16, fp8, nvfp4 = (data.model(own[a]).weights.n_bytes for a in own)
    assert 0.49 < fp8 / bf16 < 0.52 and 0.27 < nvfp4 / bf16 < 0.30


def test_an_arm_serving_what_no_record_names_is_priced_as_the_suites_target_and_said_so():
    target = data.model("standin-target").weights.n_bytes

    def arm(name, flags):
        prof = SimpleNamespace(speculative=None, drafter=None, flags=flags,
                               model=SimpleNamespace(id="build/standin/target"))
        return SimpleNamespace(name=name, noise_of=None, resolved=prof)

    study = SimpleNamespace(arms=[arm("plain", {}), arm("int4", {"quantization": "awq"})])
    f = SimpleNamespace(suite=SimpleNamespace(substrate=SimpleNamespace(
        card="h100", target="standin-target")), study=study,
        cells=pl.DataFrame({"arm": ["plain"], "concurrency": [1], "step_ms": [9.0]}))
    line = step_cost_suite.floor_line(f)
    assert f"plain, int4: {target / 1e9:.3g} GB" in line
    assert line.endswith("No target record for what int4 (build/standin/target, quantization "
                         "awq) serves: priced as the suite's target.")


# ------------------------------------------------------------------ the bound and the ridge


def test_a_level_past_the_ridge_is_predicted_compute_bound_and_one_below_memory_bound():
    card = make_card(rated=1000.0, peak=100.0)        # 1 TB/s, 100 TFLOP/s
    target = make_model({"gb": 1}, gflop=2.0)         # 1 ms of reads; 0.02 ms of math a token
    assert sc.ridge_tokens(card, target) == pytest.approx(50)
    low = sc.step(card, sc.passes(target, None, 0, 10, 0))
    high = sc.step(card, sc.passes(target, None, 0, 200, 0))
    assert low.bound == "memory" and high.bound == "compute"
    assert high.math_ms == pytest.approx(4.0) and high.memory_ms == pytest.approx(1.0)
    assert high.total_ms == pytest.approx(5.0)                       # read and math added
    assert sc.step(card, high.passes, combine="max").total_ms == pytest.approx(4.0)
    # speculation past the ridge stops paying: a crossover exists, near the ridge's streams
    drafter = make_model({"gb": 0.1}, gflop=0.2, role="drafter", drafts="block")
    cross = sc.crossover(card, target, sc.Arm(drafter, 7, 3.0), sc.Arm(), sc.Overheads(), 0.0)
    assert cross is not None and 1 < cross * 8 / sc.ridge_tokens(card, target) < 4


def test_overheads_add_the_speculative_part_only_to_a_drafting_step():
    card, target = make_card(), make_model({"gb": 1})
    drafter = make_model({"gb": 0.1}, role="drafter", drafts="block")
    over = sc.Overheads(fixed_ms=1.0, speculative_ms=0.5)
    plain = sc.step(card, sc.passes(target, None, 0, 1, 0), over)
    spec = sc.step(card, sc.passes(target, drafter, 3, 1, 0), over)
    assert plain.overhead_ms == 1.0 and spec.overhead_ms == 1.5


def test_tokens_a_step_come_from_acceptance_and_queued_requests_add_nothing():
    assert sc.tokens_per_step(per_position=[0.75, 0.5, 0.25], k=2) == pytest.approx(2.25)
    assert sc.tokens_per_step(acceptance_length=3.4, k=7) == 3.4
    assert sc.tokens_per_step(acceptance_length=3.4, k=0) == 1.0
    with pytest.raises(ValueError, match="at least 1"):
        sc.tokens_per_step(acceptance_length=0.5)
    with pytest.raises(ValueError, match=r"fractions in \[0, 1\]"):
        sc.tokens_per_step(per_position=[75, 50], k=2)
    assert sc.running(32, 6) == 6 and sc.running(4, 6) == 4 and sc.running(8, None) == 8
    assert sc.crossing([1, 8, 16], [1.3, 1.1, 0.9]) == pytest.approx(12)
    assert sc.crossing([1, 8], [1.3, 1.1]) is None


# ------------------------------------------------------------------ fits from cells


def constructed_cells(rows: list[dict]) -> pl.DataFrame:
    base = {"card": "h200", "engine": "vllm", "runtime": "", "profile": "p",
            "target": "standin-target", "drafter": None, "drafts": 0,
            "acceptance_length": None, "per_position": None, "context_tokens": 0.0,
            "note": None}
    return pl.DataFrame([{**base, **r} for r in rows], schema=COLUMNS)


def test_the_fixed_overhead_is_the_warm_plain_steps_residual_and_cold_cells_set_nothing():
    card, target = data.card("h200"), data.model("standin-target")
    floor = sc.step(card, sc.passes(target, None, 0, 1, 0)).total_ms
    cells = constructed_cells([
        {"arm": "none", "streams": 1, "tok_s": 1e3 / (floor + 1.0), "busy": 0.99, "source": "a"},
        {"arm": "none", "streams": 1, "tok_s": 1e3 / (floor + 9.0), "busy": 0.30, "source": "cold"},
        {"arm": "none", "streams": 8, "tok_s": 500.0, "busy": 0.99, "source": "b"}])
    fits = chk.fit(cells, reference_card="h200")
    assert fits.overheads[("h200", "vllm")].fixed_ms == pytest.approx(1.0)
    assert fits.fitted_cells == {"a"}
    checked = chk.check(cells, fits)
    cold = checked.filter(pl.col("source") == "cold").row(0, named=True)
    assert cold["error_pct"] > 10 and "30% busy" in cold["reason"]
    # a card without a fit of its own carries the reference card's overheads
    assert fits.of("gb10", "vllm").fixed_ms == pytest.approx(1.0)
    assert "carried from h200" in fits.of("gb10", "vllm").fixed_source


# ------------------------------------------------------------------ the data files


SOURCE_PATH = re.compile(r"^measured: ([\w./*-]+)")


def sourced_values(obj, path=""):
    """Every (key path, value, source) of a parsed data file."""
    if isinstance(obj, dict):
        if "source" in obj:
            value = next((obj[k] for k in ("value", "bytes", "gb", "gib") if k in obj), None)
            yield path, value, obj["source"]
        for k, v in obj.items():
            yield from sourced_values(v, f"{path}.{k}" if path else str(k))


@pytest.mark.parametrize("name", [data.CARDS_FILE, data.MODELS_FILE])
def test_every_constant_cites_its_source_and_a_measured_one_names_a_file_here(name):
    raw = yaml.safe_load((ROOT / "lib/specrepro/analysis" / name).read_text())
    found = list(sourced_values(raw))
    assert found
    for path, value, source in found:
        m = SOURCE_PATH.match(source)
        if m and value is not None:  # a measurement made here: its file exists
            assert list(ROOT.glob(m.group(1))), f"{name}: {path}: no file {m.group(1)}"
        if source.startswith("vendor:") and value is not None:
            assert re.search(r"https?://|datasheet|presentation|product page", source), \
                f"{name}: {path}: a vendor figure names its document"
        if value is None:  # a null says why
            assert len(source) > 30, f"{name}: {path}: a null without its reason"


def test_every_card_has_a_bandwidth_and_the_shipped_suites_name_known_records():
    for cid, c in data.cards().items():
        assert c.bandwidth_gb_s > 0, cid
    for path in sorted((ROOT / "params").glob("*.yaml")):
        sub = params.load_suite(path).substrate
        if sub is not None and sub.card:
            assert data.card(sub.card) and data.model(sub.target).role == "target", path.name


@pytest.mark.parametrize(("profile", "record"), [
    ("profiles-h100/vllm-0.26-fp8-standin-dflash-k7", "standin-target-fp8"),
    ("profiles-h100/vllm-nvfp4-0.26-standin-dflash-k7", "standin-target-nvfp4"),
    ("profiles-h100/vllm-0.26-standin-dflash-k7", "standin-target"),
    ("profiles/embedded-standin-none", "standin-target"),   # the embedded engine's 'none'
    ("profiles/embedded-none", "small-target-fp32"),
])
def test_a_profile_finds_its_target_by_model_id_and_the_quantization_it_is_served_with(
        profile, record):
    prof = params.load_profile(ROOT / "params" / f"{profile}.yaml")
    assert cells_mod.target_record(prof) == record


def test_05s_fp8_drafter_checkpoint_is_priced_by_its_own_record():
    """The stand-in's FP8 drafter (export-fp8-drafter) is its own record, half the BF16
    drafter's bytes less the q/k/v kept in bf16, not the BF16 drafter's bytes."""
    prof = params.load_profile(
        ROOT / "params" / "profiles-h100" / "vllm-0.26-standin-dflash-k7-fp8-drafter.yaml")
    assert cells_mod._records(prof, "dflash") == ("standin-target", "standin-dflash-fp8")
    fp8, bf16 = data.model("standin-dflash-fp8"), data.model("standin-dflash")
    assert 0.5 < fp8.weights.n_bytes / bf16.weights.n_bytes < 0.52


def test_the_fp8_target_is_not_the_bf16_records_and_an_unknown_quantization_has_none():
    assert data.model_by_id("build/standin/target", "fp8") == "standin-target-fp8"
    assert data.model_by_id("build/standin/target") == "standin-target"
    assert data.model_by_id("build/standin/target", "awq") is None
    assert data.model_by_id("build/standin-nvfp4", "fp8") is None


def models_text(**extra) -> str:
    """The shipped models file with `extra` records added."""
    raw = yaml.safe_load((ROOT / "lib/specrepro/analysis" / data.MODELS_FILE).read_text())
    raw["models"].update(extra)
    return yaml.safe_dump(raw)


def test_a_record_key_the_schema_lacks_fails_naming_the_file_and_the_record():
    raw = yaml.safe_load((ROOT / "lib/specrepro/analysis" / data.MODELS_FILE).read_text())
    fp8 = {**raw["models"]["standin-target-fp8"], "quantisation": "fp8"}
    with pytest.raises(data.StepCostDataError,
                       match=r"step_cost/models.yaml: models\.copy\.quantisation: Extra inputs"):
        data.validate_text(data.MODELS_FILE, models_text(copy=fp8))


def test_two_records_serving_the_same_id_and_quantization_fail_naming_both():
    raw = yaml.safe_load((ROOT / "lib/specrepro/analysis" / data.MODELS_FILE).read_text())
    both = r"records '(copy|{0})' and '(copy|{0})' both serve id 'build/standin/target' " \
           r"with quantization {1}"
    with pytest.raises(data.StepCostDataError, match=r"step_cost/models.yaml: .*"
                       + both.format("standin-target-fp8", "'fp8'")):
        data.validate_text(data.MODELS_FILE,
                           models_text(copy=raw["models"]["standin-target-fp8"]))
    # the same id with no quantization is the bf16 record's
    bf16 = {k: v for k, v in raw["models"]["standin-target-fp8"].items() if k != "quantization"}
    with pytest.raises(data.StepCostDataError, match=both.format("standin-target", "None")):
        data.validate_text(data.MODELS_FILE, models_text(copy=bf16))
    with pytest.raises(data.StepCostDataError, match=r"models\.copy: .*quantization null"):
        data.validate_text(data.MODELS_FILE, models_text(
            copy={**raw["models"]["standin-target-fp8"], "quantization": "none"}))


def test_a_stored_cell_whose_target_no_record_names_fails_naming_its_profile():
    prof = SimpleNamespace(name="vllm-awq", flags={"quantization": "awq"},
                           model=SimpleNamespace(id="build/standin/target"))
    err = cells_mod._unpriced(prof, None, "standin-dflash", "dflash", "a store: arm at 1")
    assert isinstance(err, data.StepCostDataError)
    assert str(err) == ("a store: arm at 1: profile 'vllm-awq' serves model id "
                        "'build/standin/target' with quantization 'awq', which no record of "
                        "step_cost/models.yaml names (its `ids` and `quantization`)")
    assert cells_mod._unpriced(prof, "standin-target", "standin-dflash", "dflash", "x") is None


def test_a_published_schedule_gives_its_tiers_drafts_at_each_level():
    arm = {"drafts": 7, "schedule": "7@1-12,3@13-32"}
    assert arts.parse_schedule(arm["schedule"]) == [(1, 12, 7), (13, 32, 3)]
    assert [arts.drafts_at(arm, c) for c in (1, 12, 13, 32)] == [7, 7, 3, 3]
    assert arts.drafts_at({"drafts": 7, "schedule": "0@25-32"}, 8) == 7


# ------------------------------------------------------------------ the stored cells


def test_on_the_stand_ins_stored_cells_the_median_error_at_1_to_32_streams_is_within_10_pct():
    """Issue 39's bound, on the committed cells (the H200's bench lines, the H100's store):
    over every cell and over the cells that set no fit alike."""
    checked = chk.check()
    s = chk.summary(checked, 1, 32)
    assert s["cells"] >= 60 and s["predicted_cells"] >= 40
    assert s["median_abs_error_pct"] <= 10 and s["predicted_median_abs_error_pct"] <= 10
    misses = checked.filter(pl.col("streams").is_between(1, 32)
                            & (pl.col("error_pct").abs() > chk.MISS_PCT))
    assert misses["reason"].str.len_chars().min() > 0  # every large miss says what was measured
