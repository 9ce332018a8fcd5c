"""The analysis package on results written through the store's API (no engine): loading and
choosing cells, tables, the published overlay, gates, verdicts, figures and the index."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import polars as pl
import pytest

from specrepro import analysis as sa
from specrepro import identity, pipeline, results
from specrepro.analysis import finding as finding_mod
from specrepro.analysis import report, tables
from specrepro.harness.runner import RunSummary
from specrepro.params import Gate, ParamsError

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "params" / "smoke.yaml"
DEFAULT = ROOT / "params" / "default.yaml"


def write_cells(results_dir: Path, params: Path, nb: str, figure, n_prompts=None,
                overrides=None) -> sa.Finding | None:
    """One ok row per declared cell, its figures from figure(cell, profile) (a dict)."""
    suite, study = pipeline.study_for(params, nb, overrides)
    store = results.ResultStore(results_dir, study.name, suite.run_id)
    store.begin_session({"params": {"test": True}})
    for cell in study.cells():
        prof = next(a for a in study.arms if a.name == cell.arm.name).resolved
        spec = prof.speculative
        row = {
            "cell_id": identity.cell_id(study, cell, "test"), "status": "ok",
            "arm": cell.arm.name, "profile": prof.name, "engine": prof.engine,
            "engine_version": "test", "method": prof.method,
            "num_speculative_tokens": spec.num_speculative_tokens if spec else None,
            "schedule": spec.num_speculative_tokens_per_batch_size if spec else None,
            "workload": cell.workload.name, "n_prompts": n_prompts or cell.workload.n,
            "concurrency": cell.concurrency, "temperature": cell.sampling.temperature,
            "repeat": cell.repeat, "seed": cell.seed, "ended_at": results.now(),
            **figure(cell, prof),
        }
        store.append_cell(row, [{"request_idx": 0, "prompt_id": "p0", "text": "t"}])
    store.end_session()
    return study


def plain(cell, prof) -> dict:
    k = prof.speculative.num_speculative_tokens if prof.speculative else 0
    return {"agg_tok_s": 10.0 * cell.concurrency + k, "acceptance_length": 1.0 + 0.3 * k,
            "draft_acceptance_rate": 0.3 if k else None,
            "per_position_acceptance": [0.5 ** (i + 1) for i in range(k)] if k else None,
            "repeated_4gram_share": 0.1}


# ------------------------------------------------------------------- loading, modes


def test_replay_returns_one_row_per_declared_cell(tmp_path):
    study = write_cells(tmp_path, SMOKE, "01_drafter_block_sweep", plain)
    f = pipeline.load_finding(SMOKE, "01_drafter_block_sweep", "replay", tmp_path)
    assert f.cells.height == sum(1 for _ in study.cells())
    assert not f.measured
    assert set(f.cells["label"]) == {"MTP, 3 drafts", "block drafter, 5 drafts"}


def test_replay_of_an_empty_store_says_how_to_measure(tmp_path):
    with pytest.raises(finding_mod.FindingError, match="mode 'auto' or 'run'"):
        pipeline.load_finding(SMOKE, "01_drafter_block_sweep", "replay", tmp_path)


def test_auto_replays_a_complete_store_and_measures_a_partial_one(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(pipeline, "measure", lambda *a, **k: calls.append(k) or RunSummary())
    write_cells(tmp_path, SMOKE, "07_the_bill", plain)
    pipeline.load_finding(SMOKE, "07_the_bill", "auto", tmp_path)
    assert calls == []
    # an empty store: every cell is missing, so auto measures (resuming)
    with pytest.raises(finding_mod.FindingError):  # the stub stored nothing
        pipeline.load_finding(SMOKE, "07_the_bill", "auto", tmp_path / "other")
    assert calls == [{"fresh": False}]
    pipeline.load_finding(SMOKE, "07_the_bill", "run", tmp_path)
    assert calls[-1] == {"fresh": True}


def test_a_measurement_that_stores_nothing_names_its_cause_not_the_mode(tmp_path, monkeypatch):
    """`make nb` against an engine that cannot be reached: the error says what the runner
    said (the URL), not "measure them with mode 'auto'", which it just did."""
    cause = ("profile 'attach-local': no engine answers at http://127.0.0.1:9 (connection "
             "refused)")
    monkeypatch.setattr(pipeline, "measure",
                        lambda *a, **k: RunSummary(failed=6, errors=[cause]))
    with pytest.raises(finding_mod.FindingError) as err:
        pipeline.load_finding(SMOKE, "07_the_bill", "auto", tmp_path)
    assert "no engine answers at http://127.0.0.1:9" in str(err.value)
    assert "6 cells failed" in str(err.value) and "mode 'auto' or 'run'" not in str(err.value)


def test_rows_made_under_other_parameters_are_left_out(tmp_path):
    write_cells(tmp_path, SMOKE, "07_the_bill", plain, n_prompts=99)  # a stale run
    with pytest.raises(finding_mod.FindingError):
        pipeline.load_finding(SMOKE, "07_the_bill", "replay", tmp_path)
    study = write_cells(tmp_path, SMOKE, "07_the_bill", plain)
    f = pipeline.load_finding(SMOKE, "07_the_bill", "replay", tmp_path)
    assert f.cells.height == sum(1 for _ in study.cells())
    assert set(f.cells["n_prompts"]) == {2}


def test_rows_of_the_same_level_under_another_prompt_form_are_left_out(tmp_path):
    # Same arm, workload name, level and prompt count, but measured in chat form: its cell id
    # differs, so a study that now asks for completions must not replay it.
    chat = {"workloads": [{"name": "essays", "n": 2, "form": "chat", "max_tokens": 16}]}
    completion = {"workloads": [{"name": "essays", "n": 2, "form": "completion",
                                 "max_tokens": 16}]}
    write_cells(tmp_path, SMOKE, "07_the_bill", plain, overrides=chat)
    with pytest.raises(finding_mod.FindingError):
        pipeline.load_finding(SMOKE, "07_the_bill", "replay", tmp_path, completion)
    study = write_cells(tmp_path, SMOKE, "07_the_bill", plain, overrides=completion)
    f = pipeline.load_finding(SMOKE, "07_the_bill", "replay", tmp_path, completion)
    assert f.cells.height == sum(1 for _ in study.cells())


def test_overrides_merge_into_the_study_and_unknown_keys_fail(tmp_path):
    _, study = pipeline.study_for(SMOKE, "07_the_bill", {"concurrency": [1]})
    assert study.concurrency == [1]
    with pytest.raises(ParamsError, match="concurency"):
        pipeline.study_for(SMOKE, "07_the_bill", {"concurency": [1]})


# ------------------------------------------------------------------------- tables


def frame(rows: list[dict]) -> pl.DataFrame:
    base = {"label": None, "arm": None, "workload": "w", "concurrency": 1, "temperature": 0.0,
            "repeat": 0}
    return pl.DataFrame([{**base, **r} for r in rows])


def test_gain_over_and_crossing_interpolate_in_log2_streams():
    rows = []
    for c, plain_tps, spec_tps in [(1, 10, 20), (2, 20, 30), (4, 40, 30)]:
        rows += [{"label": "none", "arm": "none", "concurrency": c, "agg_tok_s": float(plain_tps)},
                 {"label": "spec", "arm": "spec", "concurrency": c, "agg_tok_s": float(spec_tps)}]
    cells = frame(rows)
    g = tables.gain_over(cells, "none").filter(pl.col("arm") == "spec")
    assert g["change_pct"].to_list() == pytest.approx([100.0, 50.0, -25.0])
    # +50% at 2 streams, -25% at 4: zero at log2 = 1 + 50/75
    assert tables.crossing(cells, "spec", "none") == pytest.approx(2 ** (1 + 50 / 75))
    assert tables.crossing(cells.filter(pl.col("concurrency") < 4), "spec", "none") is None


def test_positions_average_over_repeats_and_keep_repetition_beside():
    cells = frame([
        {"label": "a", "arm": "a", "repeat": 0, "per_position_acceptance": [0.8, 0.4],
         "repeated_4gram_share": 0.1},
        {"label": "a", "arm": "a", "repeat": 1, "per_position_acceptance": [0.6, 0.2],
         "repeated_4gram_share": 0.3}])
    pos = tables.positions(cells)
    assert pos["acceptance"].to_list() == pytest.approx([0.7, 0.3])
    assert pos["repeated_4gram_share"].to_list() == pytest.approx([0.2, 0.2])


def test_kv_cost_is_against_the_mtp_arm_by_default():
    cells = frame([{"label": "m", "arm": "m", "method": "mtp", "kv_pool_tokens": 1000,
                    "max_concurrency": 2.0},
                   {"label": "b", "arm": "b", "method": "dflash", "kv_pool_tokens": 600,
                    "max_concurrency": 1.2}])
    kv = tables.kv_cost(cells)
    assert kv.filter(pl.col("arm") == "b")["change_pct"][0] == pytest.approx(-40.0)
    assert kv.filter(pl.col("arm") == "b")["tokens_given_up"][0] == 400


# -------------------------------------------------------------------------- overlay


def test_overlay_compares_the_preferred_of_two_published_values(tmp_path):
    write_cells(tmp_path, SMOKE, "05_fp8_drafter_gates", plain)
    f = pipeline.load_finding(SMOKE, "05_fp8_drafter_gates", "replay", tmp_path)
    ov = sa.overlay(f.cells, sa.claims_for(f.notebook_id), ["agg_tok_s"])
    row = ov.filter((pl.col("arm") == "drafter-bf16") & (pl.col("workload") == "essays")
                    & (pl.col("concurrency") == 1)).to_dicts()[0]
    # article B prints 153.4 (confirmation table) and 155.2 (essays aggregate table)
    assert row["published"] == 153.4 and row["source"].startswith("table: confirmation")
    assert "155.2" in row["also_published"]
    assert row["measured"] == pytest.approx(10.0 + 7)


def test_overlay_reads_percent_metrics_in_percent(tmp_path):
    write_cells(tmp_path, SMOKE, "01_drafter_block_sweep", plain)
    f = pipeline.load_finding(SMOKE, "01_drafter_block_sweep", "replay", tmp_path)
    ov = sa.overlay(f.cells, sa.claims_for(f.notebook_id), ["acceptance_length", "step_ms"])
    mtp = ov.filter((pl.col("arm") == "mtp-k3") & (pl.col("metric") == "acceptance_length"))
    assert mtp["published"][0] == 2.55 and mtp["measured"][0] == pytest.approx(1.9)
    assert mtp["published_arm"][0] == "mtp3_0280"
    # the smoke suite runs 01 greedy; the article's sweep is at T=0.7, and each row says both
    assert mtp["temperature"][0] == 0.0 and mtp["published_temperature"][0] == 0.7


def test_published_temperature_compares_across_temperatures_and_labels_it(tmp_path):
    write_cells(tmp_path, SMOKE, "01_drafter_block_sweep", plain)
    f = pipeline.load_finding(SMOKE, "01_drafter_block_sweep", "replay", tmp_path)
    claims = sa.claims_for(f.notebook_id)
    assert claims.temperature_note([0.0]) == "article at T=0.7, measured at T=0"
    assert claims.temperature_note([0.7]) == ""  # the GPU suites: nothing to label
    # article A's T=1.0 runs are never drawn beside the sweep
    assert set(sa.published_points(claims, "agg_tok_s")["temperature"]
               .drop_nulls()) == {0.7}
    # a notebook without published_temperature matches only its own temperature
    plain_claims = sa.claims_for("02_temperature_spread")
    assert plain_claims.compared_temperature(0.0) == 0.0
    assert plain_claims.temperature_note([0.0]) == ""
    sa.figures.style()
    fig = sa.figures.block_sweep_speed(f, claims)
    titles = [fig.get_suptitle(), *(ax.get_title() for ax in fig.axes)]
    sa.figures.plt.close(fig)
    assert "article at T=0.7, measured at T=0" in titles
    assert "article A at T=0.7" in titles


def test_embedded_suites_use_completion_form_and_a_greedy_block_sweep():
    for params in (SMOKE, DEFAULT):
        for nb in ("03_target_precision", "04_engine_comparison", "05_fp8_drafter_gates",
                   "06_draft_schedule_under_load", "07_the_bill"):
            _, study = pipeline.study_for(params, nb)
            # HumanEval stays in chat form: its Codex stops end this model's completions at once
            assert {w.form for w in study.workloads if w.name != "humaneval"} == {
                "completion"}, (params.name, nb)
        _, sweep = pipeline.study_for(params, "01_drafter_block_sweep")
        assert [s.temperature for s in sweep.sampling] == [0.0]
        _, spread = pipeline.study_for(params, "02_temperature_spread")
        assert [s.temperature for s in spread.sampling] == [0.7, 1.0]


def test_default_fp8_gates_judge_acceptance_not_emulated_speed():
    _, study = pipeline.study_for(DEFAULT, "05_fp8_drafter_gates")
    assert "agg_tok_s" not in {g.metric for g in study.gates}
    eight = next(g for g in study.gates if g.concurrency == 8 and g.reference_arm)
    assert (eight.metric, eight.op, eight.threshold, eight.kind) == (
        "acceptance_length", ">=", -5.0, "relative_pct")


# --------------------------------------------------------------------------- gates


def test_gates_pass_fail_and_not_measured():
    cells = frame([{"arm": "new", "workload": "essays", "agg_tok_s": 105.0, "peak_mem_mib": None},
                   {"arm": "ref", "workload": "essays", "agg_tok_s": 100.0}])
    gates = [Gate(name="speed", metric="agg_tok_s", workload="essays", concurrency=1, arm="new",
                  reference_arm="ref", op=">=", threshold=3.0, kind="relative_pct", unit="%"),
             Gate(name="strict", metric="agg_tok_s", workload="essays", concurrency=1, arm="new",
                  reference_arm="ref", op=">=", threshold=6.0, kind="relative_pct", unit="%"),
             Gate(name="memory", metric="peak_mem_mib", workload="essays", concurrency=1,
                  arm="new", op="<=", threshold=85000)]
    g = sa.evaluate_gates(cells, gates)
    assert g["result"].to_list() == ["pass", "fail", "not measured"]
    assert g["value"][0] == pytest.approx(5.0)


# ------------------------------------------------------------------------- verdicts


def test_block_sweep_verdict_follows_the_data(tmp_path):
    write_cells(tmp_path / "a", SMOKE, "01_drafter_block_sweep", plain)
    f = pipeline.load_finding(SMOKE, "01_drafter_block_sweep", "replay", tmp_path / "a")
    v = sa.verdict(f)
    assert v.holds is True and v.text.startswith("shape holds here:")

    def worse(cell, prof):
        d = plain(cell, prof)
        if prof.method == "dflash":
            d.update(acceptance_length=1.1, agg_tok_s=1.0)
        return d

    write_cells(tmp_path / "b", SMOKE, "01_drafter_block_sweep", worse)
    v = sa.verdict(pipeline.load_finding(SMOKE, "01_drafter_block_sweep", "replay", tmp_path / "b"))
    assert v.holds is False and v.text.startswith("does not hold:")
    assert "1.10 tokens per step" in v.text


def test_bill_without_power_says_so_instead_of_zeros(tmp_path):
    write_cells(tmp_path, SMOKE, "07_the_bill", lambda c, p: {
        **plain(c, p), "kv_pool_tokens": 900 if p.method == "dflash" else 1000})
    f = pipeline.load_finding(SMOKE, "07_the_bill", "replay", tmp_path)
    assert not f.has_power
    v = sa.verdict(f)
    assert v.holds is True and "no power source" in v.text
    assert "power_w_mean" not in tables.bill(f.cells, with_power=False).columns
    cant = [c for c, _ in sa.untestable(f, sa.claims_for(f.notebook_id))]
    assert any("watts" in c for c in cant)


# -------------------------------------------------------------------- figures, index


def test_figures_have_stable_names_and_deterministic_svg(tmp_path):
    write_cells(tmp_path, SMOKE, "01_drafter_block_sweep", plain)
    f = pipeline.load_finding(SMOKE, "01_drafter_block_sweep", "replay", tmp_path)
    sa.figures.style()
    claims = sa.claims_for(f.notebook_id)
    outs = []
    for d in ("x", "y"):
        fig = sa.figures.acceptance_by_arm(f, claims)
        outs.append(sa.figures.save_figure(fig, tmp_path / d, f.notebook_id, "acceptance"))
        sa.figures.plt.close(fig)
    png, svg = outs[0]
    assert png.name == "01_drafter_block_sweep__acceptance.png" and svg.suffix == ".svg"
    assert svg.read_bytes() == outs[1][1].read_bytes()
    assert b"<dc:date>" not in svg.read_bytes()
    text = svg.read_text()
    assert "acceptance length (tokens per step)" in text and "article" in text


def test_index_lists_verdicts_and_links_existing_thumbnails(tmp_path):
    fig = tmp_path / "figs" / "07_the_bill__bill.png"
    fig.parent.mkdir()
    fig.write_bytes(b"\x89PNG")
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("x")
    cell.outputs = [
        nbformat.v4.new_output("display_data", {"text/plain": "v"},
                               metadata={"specrepro": {"verdict": "shape holds here: x.",
                                                       "holds": True}}),
        nbformat.v4.new_output("display_data", {"text/plain": "f"},
                               metadata={"specrepro": {"figure": str(fig)}}),
        nbformat.v4.new_output("display_data", {"text/plain": "f"},
                               metadata={"specrepro": {"figure": str(tmp_path / "gone.png")}})]
    nb.cells = [nbformat.v4.new_markdown_cell("# 07 The bill"), cell]
    reports = tmp_path / "reports"
    reports.mkdir()
    nbformat.write(nb, reports / "07_the_bill.ipynb")
    page = report.write_index(reports).read_text()
    assert "07 The bill" in page and "shape holds here: x." in page
    assert "../figs/07_the_bill__bill.png" in page and "gone.png" not in page
    assert report.main(["--reports-dir", str(tmp_path / "nowhere")]) == 2


def test_claims_map_only_published_arms_and_every_notebook_has_one():
    from specrepro.params import NOTEBOOK_IDS

    for nb in NOTEBOOK_IDS:
        claims = sa.claims_for(nb)
        assert claims.claim and claims.cannot_test
    assert json.dumps(sa.claims_for("07_the_bill").arms)
