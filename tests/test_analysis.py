"""The analysis package on results written through the store's API (no engine): loading and
choosing cells, tables, the published overlay, gates, verdicts, figures and the index."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from specrepro import analysis as sa
from specrepro import identity, params, pipeline
from specrepro.analysis.finding import finding as finding_mod
from specrepro.analysis.finding import tables
from specrepro.analysis.render import summary
from specrepro.harness.runner import RunSummary
from specrepro.params import Gate, ParamsError
from specrepro.store import ResultStore, load_cells, now

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "params" / "smoke.yaml"
DEFAULT = ROOT / "params" / "default.yaml"


def write_cells(results_dir: Path, params: Path, nb: str, figure, n_prompts=None,
                overrides=None) -> sa.Finding | None:
    """One ok row per declared cell, its figures from figure(cell, profile) (a dict)."""
    suite, study = pipeline.study_for(params, nb, overrides)
    store = ResultStore(results_dir, study.name, suite.run_id)
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
            "repeat": cell.repeat, "seed": cell.seed, "ended_at": now(),
            **figure(cell, prof),
        }
        store.append_cell(row, [{"request_idx": 0, "prompt_id": "p0", "text": "t"}])
    store.end_session()
    return study


def plain(cell, prof) -> dict:
    k = prof.speculative.num_speculative_tokens if prof.speculative else 0
    return {"agg_tok_s": 10.0 * cell.concurrency + k,
            "per_stream_tok_s": (10.0 * cell.concurrency + k) / cell.concurrency,
            "acceptance_length": 1.0 + 0.3 * k,
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
    with pytest.raises(finding_mod.FindingError, match="mode 'auto' or 'run'") as err:
        pipeline.load_finding(SMOKE, "01_drafter_block_sweep", "replay", tmp_path)
    # the study, and the commands that measure it with this very suite
    assert "study '01_drafter_block_sweep' of suite 'smoke'" in str(err.value)
    assert "make nb NB=01_drafter_block_sweep PARAMS=params/smoke.yaml" in str(err.value)
    assert "specrepro run params/smoke.yaml --notebook 01_drafter_block_sweep" in str(err.value)


H200_EMBEDDED = ROOT / "params" / "h200-embedded.yaml"
NO_GPU = {"gpus": [], "note": "no NVIDIA GPU answered NVML: test"}


def test_a_partial_store_replays_what_is_there_and_names_what_is_missing(tmp_path):
    """A run stopped at its deadline: replay keeps the stored cells, counts and names the
    missing ones (all of an arm, or a level's missing repeats), and fills none in."""
    study = write_cells(tmp_path, SMOKE, "06_draft_schedule_under_load", plain)
    # take out one arm and one level of another: rewrite the store without them
    store = tmp_path / study.name
    suite, _ = pipeline.study_for(SMOKE, "06_draft_schedule_under_load")
    cells = load_cells(store / suite.run_id)
    arms = [a.name for a in study.arms]
    gone_arm, cut_arm = arms[-1], arms[1]
    top = max(c.concurrency for c in study.cells())
    keep = cells.filter((pl.col("arm") != gone_arm)
                        & ~((pl.col("arm") == cut_arm) & (pl.col("concurrency") == top)))
    shutil.rmtree(store)
    out = ResultStore(tmp_path, study.name, suite.run_id)
    out.begin_session({"params": {"test": True}})
    for row in keep.to_dicts():
        out.append_cell(row, [{"request_idx": 0, "prompt_id": "p0", "text": "t"}])
    out.end_session()
    f = pipeline.load_finding(SMOKE, "06_draft_schedule_under_load", "replay", tmp_path)
    n_arm = sum(1 for c in study.cells() if c.arm.name == gone_arm)
    n_cut = sum(1 for c in study.cells() if c.arm.name == cut_arm and c.concurrency == top)
    assert f.missing == n_arm + n_cut and f.cells.height == f.declared - f.missing
    text = f.missing_text()
    assert f"{gone_arm}: all {n_arm} cells" in text
    assert f"{cut_arm}: {top} streams" in text
    assert text in f.describe()
    s = summary.summary(f, sa.claims_for(f.notebook_id))
    assert s["partial"].startswith(f"Partial results: {f.missing} of the {f.declared} cells")
    assert "Partial results" in summary.summary_html(s)
    assert not f.cells.filter(pl.col("arm") == gone_arm).height  # nothing stands in


def test_auto_does_not_measure_cuda_arms_on_a_machine_without_a_gpu(tmp_path, monkeypatch):
    """The H200 suite on a CPU: auto replays what is stored and never starts an engine (it
    would fail on --device cuda and write logs into the committed store); a study with
    nothing stored fails naming the study, the reason and the command that measures it."""
    calls = []
    monkeypatch.setattr(pipeline, "measure", lambda *a, **k: calls.append(k) or RunSummary())
    monkeypatch.setattr(finding_mod.provenance, "gpu_info", lambda: NO_GPU)
    with pytest.raises(finding_mod.FindingError) as err:
        pipeline.load_finding(H200_EMBEDDED, "04_engine_comparison", "auto", tmp_path)
    msg = str(err.value)
    assert calls == []
    assert "study '04_engine_comparison' of suite 'h200-embedded'" in msg
    assert "on a GPU (--device cuda, or vLLM or SGLang) and this machine has no NVIDIA GPU" \
        in msg
    assert "make nb NB=04_engine_comparison PARAMS=params/h200-embedded.yaml" in msg
    from specrepro.analysis.render import notebooks
    assert not notebooks.measures("04_engine_comparison", H200_EMBEDDED, "auto", tmp_path)
    # with a GPU, auto measures the missing cells as before
    monkeypatch.setattr(finding_mod.provenance, "gpu_info",
                        lambda: {"gpus": [{"name": "NVIDIA H200"}]})
    assert notebooks.measures("04_engine_comparison", H200_EMBEDDED, "auto", tmp_path)
    with pytest.raises(finding_mod.FindingError):  # the stub stored nothing
        pipeline.load_finding(H200_EMBEDDED, "04_engine_comparison", "auto", tmp_path)
    assert calls == [{"fresh": False}]


def test_launched_vllm_and_sglang_arms_are_never_measured_on_a_machine_without_a_gpu(
        monkeypatch):
    """A vLLM or SGLang arm the harness would launch needs the GPU machine, as a --device
    cuda one does: on a CPU, auto replays (a launch here would only fail, into the committed
    store); an attached engine is wherever its URL is."""
    monkeypatch.setattr(finding_mod.provenance, "gpu_info", lambda: NO_GPU)
    suite = params.load_suite(ROOT / "params" / "h200-engines.yaml")
    for sid in ("01_drafter_block_sweep", "parity-vllm", "parity-sglang"):
        study = params.resolve_study(suite, sid)
        assert finding_mod.cuda_arms(study) == [a.name for a in study.arms]
        assert "vLLM or SGLang" in finding_mod.cannot_measure_here(study)
    from types import SimpleNamespace as NS

    model = {"id": "m", "revision": None}
    proxy = params.Profile.model_validate({"name": "proxy", "engine": "attach",
                                           "url": "http://127.0.0.1:1", "model": model})
    local = params.Profile.model_validate({"name": "local", "engine": "embedded",
                                           "model": model, "flags": {"device": "cpu"}})
    cuda = params.Profile.model_validate({"name": "cuda", "engine": "embedded",
                                          "model": model, "flags": {"device": "cuda:0"}})
    attached = NS(arms=[NS(name="proxy", resolved=proxy), NS(name="local", resolved=local),
                        NS(name="gpu", resolved=cuda)])
    assert finding_mod.cuda_arms(attached) == ["gpu"]


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


def test_a_partial_store_says_which_stored_rows_another_identity_kept_out(tmp_path):
    """An arm whose stored cells were made under another profile (here a flag; on the H200 an
    NVFP4 export written anew, whose content fingerprint is part of the profile): the
    partial line names how many rows were left out and both profile hashes, never 'no
    measurement' alone; an arm measured as declared adds nothing."""
    arms = [{"name": "none", "profile": "embedded-none"},
            {"name": "mtp-control", "profile": "embedded-mtp-memory-matched"},
            {"name": "dflash-k7", "profile": "embedded-dflash"}]
    other = {"arms": [*arms[:2], {**arms[2], "overrides": {"flags": {"seed": 1}}}]}
    then = write_cells(tmp_path, SMOKE, "07_the_bill", plain, overrides=other)
    suite, now = pipeline.study_for(SMOKE, "07_the_bill")
    store = ResultStore(tmp_path, now.name, suite.run_id)
    recorded = {a.name: identity.profile_hash(a.resolved) for a in then.arms}
    store.begin_session({"engines": [{"arm": n, "profile_hash": h}
                                     for n, h in recorded.items()]})
    store.end_session()
    f = pipeline.load_finding(SMOKE, "07_the_bill", "replay", tmp_path)
    assert f.missing == 2 and f.missing_text() == "dflash-k7: all 2 cells"
    current = identity.profile_hash(next(a for a in now.arms if a.name == "dflash-k7").resolved)
    assert recorded["dflash-k7"] != current and recorded["none"] == identity.profile_hash(
        now.arms[0].resolved)
    want = (f"2 stored cells of dflash-k7 at those levels were measured under another "
            f"identity: the manifest records its profile as {recorded['dflash-k7']} at their "
            f"engine starts, resolved now it is {current} (a profile field changed, or the "
            "content of models/embedded is not what the engine served: an export written "
            "anew)")
    assert f.other_identity_text() == want
    assert want in summary.partial(f) and want in f.describe()
    # a session that recorded its folders' content says which part changed
    here = identity.local_model_fingerprint("models/embedded")
    started = {"engines": [{"arm": "dflash-k7", "profile_hash": recorded["dflash-k7"]}],
               "models": [{"id": "models/embedded", "content_sha256": here}]}
    text = finding_mod.other_identity_text(now, f.store_root, {"sessions": [started]})
    assert text.endswith(f"resolved now it is {current} (a profile field changed; its local "
                         "folders hold the bytes recorded)")
    started["models"][0]["content_sha256"] = "0123456789abcdef"
    text = finding_mod.other_identity_text(now, f.store_root, {"sessions": [started]})
    assert text.endswith("(the engine served other bytes of a local folder than this machine "
                         f"holds: models/embedded: content 0123456789abcdef then, {here} "
                         "here, e.g. an export written anew)")


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
    assert titles[0].startswith("article at T=0.7, measured at T=0")
    assert "article A at T=0.7" in titles


def test_embedded_suites_use_completion_form_and_a_greedy_block_sweep():
    for suite in (SMOKE, DEFAULT):
        for nb in params.NOTEBOOK_IDS:  # every finding (neither suite excludes one)
            _, study = pipeline.study_for(suite, nb)
            # HumanEval is a completion with no stop sequences where a suite restates it (its
            # Codex stops end this model's completions at once); every other workload is one
            assert {w.form for w in study.workloads if w.name != "humaneval"} <= {
                "completion"}, (suite.name, nb)
        _, sweep = pipeline.study_for(suite, "01_drafter_block_sweep")
        assert [s.temperature for s in sweep.sampling] == [0.0]
        _, spread = pipeline.study_for(suite, "02_temperature_spread")
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


def test_bill_without_power_says_so_instead_of_zeros(tmp_path):
    write_cells(tmp_path, SMOKE, "07_the_bill", lambda c, p: {
        **plain(c, p), "kv_pool_tokens": 900 if p.method == "dflash" else 1000})
    f = pipeline.load_finding(SMOKE, "07_the_bill", "replay", tmp_path)
    assert not f.has_power
    v = sa.verdict(f)
    power = [c for c in v.checks if "tokens per joule" in c.claim]
    assert power and power[0].outcome == "not testable here" and "no power source" in power[0].reason
    assert tables.name("power_w_mean") not in tables.bill_table(f.cells, with_power=False
                                                                ).frame.columns
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


def test_claims_map_only_published_arms_and_every_notebook_has_one():
    from specrepro.params import NOTEBOOK_IDS

    for nb in NOTEBOOK_IDS:
        claims = sa.claims_for(nb)
        assert claims.claim and claims.cannot_test
    assert json.dumps(sa.claims_for("07_the_bill").arms)


# ----------------------------------------------- issue 15: article values drawn as printed


def by_gid(ax, prefix: str) -> list:
    """The artists of one axes whose gid starts with `prefix`."""
    return [a for a in (*ax.collections, *ax.lines, *ax.patches)
            if (a.get_gid() or "").startswith(prefix)]


def temperature_figure(cell, prof) -> dict:
    """Constructed 02 cells: MTP's runs at T=1.0 at 0.84 of those at T=0.7 (-16 %), each
    repeat 1 tok/s apart."""
    mtp = prof.method == "mtp"
    base = (50.0 + cell.repeat) * (0.84 if cell.sampling.temperature == 1.0 else 1.0)
    return {**plain(cell, prof), "agg_tok_s": base if mtp else 30.0 + cell.repeat,
            "draft_acceptance_rate": 0.2 + 0.05 * cell.repeat}


def test_a_published_mean_is_drawn_as_a_mean_beside_its_runs_never_as_a_run(tmp_path):
    write_cells(tmp_path, SMOKE, "02_temperature_spread", temperature_figure)
    f = pipeline.load_finding(SMOKE, "02_temperature_spread", "replay", tmp_path)
    sa.figures.style()
    fig = sa.figures.temperature_runs(f, sa.claims_for(f.notebook_id))
    article = fig.axes[1]
    # article A: four runs of 7 drafts at T=1.0 (32.5, 26.8, 21.3, 17.1) and their mean 24.4
    dots = [y for c in article.collections for y in c.get_offsets()[:, 1]]
    assert 24.4 not in [round(y, 1) for y in dots]  # the mean is not one more dot
    runs = by_gid(article, "article-runs|dflash-k7|1")
    assert len(runs) == 1
    assert sorted(runs[0].get_offsets()[:, 1]) == pytest.approx([17.1, 21.3, 26.8, 32.5])
    mean = by_gid(article, "article-mean|dflash-k7|1")
    assert len(mean) == 1 and list(mean[0].get_ydata()) == pytest.approx([24.4, 24.4])
    labels = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    assert "article A mean (of its runs)" in labels
    sa.figures.plt.close(fig)


def test_a_published_figure_is_drawn_at_its_own_temperature(tmp_path):
    """Article B prints GSM8K at 8 streams as 6.17 (greedy) and 5.92 (T=1.0): greedy cells
    are compared with 6.17, in the overlay and on the figure alike."""
    over = {"concurrency": [1, 8]}
    write_cells(tmp_path, SMOKE, "03_target_precision", plain, overrides=over)
    f = pipeline.load_finding(SMOKE, "03_target_precision", "replay", tmp_path, over)
    claims = sa.claims_for(f.notebook_id)
    assert set(f.cells.filter(pl.col("workload") == "gsm8k")["temperature"]) == {0.0}
    sa.figures.style()
    fig = sa.figures.acceptance_pairs(f, claims)
    marked = [round(y, 2) for c in fig.axes[0].collections for y in c.get_offsets()[:, 1]]
    assert 5.92 not in marked and 6.17 in marked
    diamonds = by_gid(fig.axes[0], "article|target-nvfp4|gsm8k|8")
    assert [d.get_offsets()[0, 1] for d in diamonds] == [pytest.approx(6.17)]
    sa.figures.plt.close(fig)
    ov = sa.overlay(f.cells, claims, ["acceptance_length"]).filter(
        (pl.col("arm") == "target-nvfp4") & (pl.col("workload") == "gsm8k"))
    assert ov["published"].to_list() == [6.17]


def test_a_same_arm_change_is_the_change_across_the_level_that_differs(tmp_path):
    """Article A's -11 % is MTP at T=1.0 against MTP at T=0.7 (its baseline_arm is its own
    arm); the overlay measures the same thing: -16 % from these cells, not 0."""
    write_cells(tmp_path, SMOKE, "02_temperature_spread", temperature_figure)
    f = pipeline.load_finding(SMOKE, "02_temperature_spread", "replay", tmp_path)
    ov = sa.overlay(f.cells, sa.claims_for(f.notebook_id), ["agg_tok_s_change_pct"])
    mtp = ov.filter(pl.col("arm") == "mtp-k3").to_dicts()
    assert len(mtp) == 1
    row = mtp[0]
    assert row["temperature"] == 1.0 and row["published"] == -11.0
    assert row["measured"] == pytest.approx(-16.0)
    assert row["baseline"] == "the same arm at T=0.7"
    # each run against the baseline's mean
    mtp_runs = f.cells.filter(pl.col("arm") == "mtp-k3")
    base = mtp_runs.filter(pl.col("temperature") == 0.7)["agg_tok_s"].mean()
    runs = sorted(mtp_runs.filter(pl.col("temperature") == 1.0)["agg_tok_s"].to_list())
    assert row["measured_min"] == pytest.approx((runs[0] / base - 1) * 100)
    assert row["runs"] == len(runs) > 1
    # another arm's change stays against its baseline arm at the same level
    k7 = ov.filter(pl.col("arm") == "dflash-k7").to_dicts()
    assert all(r["baseline"] == "MTP, 3 drafts" for r in k7)


def test_every_arm_has_its_own_per_position_bars_and_the_articles_values(tmp_path):
    write_cells(tmp_path, DEFAULT, "01_drafter_block_sweep", plain)
    f = pipeline.load_finding(DEFAULT, "01_drafter_block_sweep", "replay", tmp_path)
    sa.figures.style()
    fig = sa.figures.acceptance_by_arm(f, sa.claims_for(f.notebook_id))
    ax = fig.axes[1]
    drafts = {"MTP, 3 drafts": 3, "block drafter, 4 drafts": 4, "block drafter, 5 drafts": 5,
              "block drafter, 7 drafts": 7}
    assert set(f.cells["label"]) == set(drafts)
    centres = {}
    for label, k in drafts.items():
        bars = by_gid(ax, f"position|{label}|")
        assert len(bars) == k, label
        for b in bars:
            pos = int(b.get_gid().rsplit("|", 1)[1])
            centres.setdefault(pos, []).append(b.get_x() + b.get_width() / 2)
            assert b.get_height() == pytest.approx(100 * 0.5 ** pos)
    for pos, xs in centres.items():  # side by side: no arm's bar hides another's
        assert len(set(xs)) == len(xs) == sum(k >= pos for k in drafts.values())
    k7 = sorted(by_gid(ax, "article-position|dflash2_k7_0280|"), key=lambda a: a.get_gid())
    assert [a.get_offsets()[0, 1] for a in k7] == [75, 52, 36, 28, 22, 15, 12]
    mtp = sorted(by_gid(ax, "article-position|mtp3_traffic_gb10|"), key=lambda a: a.get_gid())
    assert [a.get_offsets()[0, 1] for a in mtp] == [75, 57, 44]
    labels = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    assert any("production traffic" in lab and "not this probe" in lab for lab in labels)
    sa.figures.plt.close(fig)


def test_step_time_is_metrics_step_ms_per_arm_and_level_and_the_article_on_its_own_axis(
        tmp_path):
    write_cells(tmp_path, SMOKE, "01_drafter_block_sweep", lambda c, p: {
        **plain(c, p), "per_stream_tok_s": 10.0 / c.concurrency})
    f = pipeline.load_finding(SMOKE, "01_drafter_block_sweep", "replay", tmp_path)
    sa.figures.style()
    fig = sa.figures.step_time(f, sa.claims_for(f.notebook_id))
    measured, article = fig.axes
    line = next(ln for ln in measured.lines if ln.get_label() == "block drafter, 5 drafts")
    # 1000 x (1 + 0.3 x 5) tokens per step / (10 / streams) tok/s
    assert list(line.get_ydata()) == pytest.approx([1000 * 2.5 / 10, 1000 * 2.5 / 5])
    assert [b.get_height() for b in article.patches] == [121.0, 121.0]  # ~121 ms, on its own
    sa.figures.plt.close(fig)


def lab(color) -> tuple[float, float, float]:
    """sRGB to CIELAB (D65)."""
    from matplotlib.colors import to_rgb

    r, g, b = [v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4
               for v in to_rgb(color)]
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t):
        return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116

    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def distinct(colors) -> bool:
    """Every pair at least 25 apart in CIELAB, and chromatic pairs at least 10 degrees apart
    in hue (seaborn's "colorblind" fails: its 5th and 7th are both pink, 21 and 4 apart)."""
    import itertools
    import math

    for a, b in itertools.combinations(colors, 2):
        la, lb = lab(a), lab(b)
        if math.dist(la, lb) < 25:
            return False
        if math.hypot(*la[1:]) > 10 and math.hypot(*lb[1:]) > 10:
            ha, hb = (math.degrees(math.atan2(v[2], v[1])) % 360 for v in (la, lb))
            if min(abs(ha - hb), 360 - abs(ha - hb)) < 10:
                return False
    return True


def test_seven_series_have_distinct_colours_markers_and_line_styles(tmp_path):
    import seaborn as sns

    assert not distinct(sns.color_palette("colorblind", 7))  # the reviewer's pinks
    # notebook 06's seven arms
    write_cells(tmp_path, DEFAULT, "06_draft_schedule_under_load", plain)
    f = pipeline.load_finding(DEFAULT, "06_draft_schedule_under_load", "replay", tmp_path)
    colours = sa.figures.palette(f)
    assert list(colours) == list(f.labels.values()) and len(colours) == 7
    assert distinct(list(colours.values()))
    st = sa.figures.styles(f)  # and a marker and a line style each, told apart without colour
    assert {lab: s["color"] for lab, s in st.items()} == colours
    assert len({s["marker"] for s in st.values()}) == 7
    assert len({str(s["linestyle"]) for s in st.values()}) == 7


FIGURES = [("01_drafter_block_sweep", "block_sweep_speed"),
           ("01_drafter_block_sweep", "acceptance_by_arm"),
           ("01_drafter_block_sweep", "step_time"),
           ("02_temperature_spread", "temperature_runs"),
           ("03_target_precision", "acceptance_pairs"),
           ("06_draft_schedule_under_load", "load_sweep"),
           ("07_the_bill", "bill_chart")]


@pytest.mark.parametrize(("nb", "name"), FIGURES)
def test_no_legend_sits_over_a_panel(tmp_path, nb, name):
    write_cells(tmp_path, SMOKE, nb, lambda c, p: {**plain(c, p), "kv_pool_tokens": 1000})
    f = pipeline.load_finding(SMOKE, nb, "replay", tmp_path)
    sa.figures.style()
    fig = getattr(sa.figures, name)(f, sa.claims_for(nb))
    fig.canvas.draw()
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    assert legends, "the figure has a legend"
    for lg in legends:
        box = lg.get_window_extent()
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent()), (name, ax.get_title())
    sa.figures.plt.close(fig)


def test_error_bars_are_min_max_over_runs_and_the_title_says_so(tmp_path):
    write_cells(tmp_path, SMOKE, "02_temperature_spread", temperature_figure)
    f = pipeline.load_finding(SMOKE, "02_temperature_spread", "replay", tmp_path)
    n = f.cells.filter((pl.col("arm") == "mtp-k3") & (pl.col("temperature") == 0.7)).height
    assert n > 1
    sa.figures.style()
    fig = sa.figures.temperature_runs(f, sa.claims_for(f.notebook_id))
    assert f"mean of {n} runs; error bars: min-max over the runs" in fig.get_suptitle()
    spans = {tuple(round(v, 6) for v in seg[:, 1]) for c in fig.axes[0].collections
             for seg in getattr(c, "get_segments", list)()}
    mtp = sorted(f.cells.filter((pl.col("arm") == "mtp-k3") & (pl.col("temperature") == 0.7))
                 ["agg_tok_s"].to_list())
    assert (round(mtp[0], 6), round(mtp[-1], 6)) in spans
    sa.figures.plt.close(fig)
    # one run per point: no bar, and the title says n=1
    write_cells(tmp_path / "one", SMOKE, "01_drafter_block_sweep", plain)
    f1 = pipeline.load_finding(SMOKE, "01_drafter_block_sweep", "replay", tmp_path / "one")
    fig = sa.figures.block_sweep_speed(f1, sa.claims_for(f1.notebook_id))
    if f1.cells.group_by(["arm", "concurrency"]).len()["len"].max() == 1:
        assert "n=1" in fig.get_suptitle()
        assert not any(c.get_segments() for ax in fig.axes for c in ax.collections
                       if hasattr(c, "get_segments"))
    sa.figures.plt.close(fig)


# ------------------------------------------------------------- issue 15: reader tables


def test_the_overlay_is_one_small_table_per_metric_in_words(tmp_path):
    write_cells(tmp_path, SMOKE, "05_fp8_drafter_gates", plain)
    f = pipeline.load_finding(SMOKE, "05_fp8_drafter_gates", "replay", tmp_path)
    claims = sa.claims_for(f.notebook_id)
    tabs = sa.overlay_tables(f.cells, claims, ["agg_tok_s", "acceptance_length"])
    assert [t.caption.split(":")[0] for t in tabs] == [
        "aggregate decode throughput (tok/s)", "tokens per step (tokens/step)"]
    for t in tabs:
        # an acceptance table has its text columns beside (repeated 4-grams, ended at cap)
        assert len(t.frame.columns) <= 9 + 2 * t.caption.startswith("tokens per step")
        assert {"arm", "article", "source", "measured", "runs",
                "measured / article"} <= set(t.frame.columns)
        text = sa.html_table(t.frame, t.caption, t.notes)
        for ident in ("agg_tok_s", "drafter-bf16", "dflash2_bf16_0330", "__"):
            assert ident not in text, ident
    speed = tabs[0].frame.filter(pl.col("arm") == "block drafter, unquantized")
    assert set(speed["article arm"]) == {"DFlash 2, BF16 drafter, vLLM 0.33.0 (tuned)"}
    row = speed.filter(pl.col("workload") == "essays").to_dicts()[0]  # 1 stream: all there is
    assert row["article"] == 153.4 and row["measured / article"] == pytest.approx(17 / 153.4)
    assert row["source"].startswith("B: table \u201cconfirmation")
    assert any("155.2" in n for n in tabs[0].notes)  # the other printed value, named
    # a change against an arm this study lacks: named under the table, not a row of n/a
    (change,) = sa.overlay_tables(f.cells, claims, ["agg_tok_s_change_pct"])
    assert change.frame["measured"].null_count() == 0
    assert any("no measured counterpart" in n and "baseline arm is not in this study" in n
               for n in change.notes)


def test_speed_tables_show_mean_spread_runs_and_thousands_separators():
    cells = frame([{"label": "a", "arm": "a", "repeat": r, "agg_tok_s": v,
                    "repeated_4gram_share": 0.1}
                   for r, v in enumerate([1200.0, 1300.0, 1500.0])]
                  + [{"label": "b", "arm": "b", "agg_tok_s": 61.1, "repeated_4gram_share": 0.1}])
    t = tables.by_streams(cells, "agg_tok_s")
    assert t.frame.columns == ["a", "b"]  # one level: it moves to the caption
    assert "all at w, 1 stream, T=0" in t.caption
    html = sa.html_table(t.frame, t.caption)
    assert "1,333 (1,200\u20131,500, n=3)" in html
    assert "61.1 (n=1)" in html
    change = tables.change_by_streams(cells, "b")
    assert change.frame["a"][0]["n"] == 3
    assert change.frame["a"][0]["mean"] == pytest.approx((1333.3333 / 61.1 - 1) * 100)
    assert tables.fmt(1366.7) == "1,367" and tables.fmt(0.0376) == "0.0376"


def test_paired_tables_are_one_per_metric_with_labels_and_change():
    cells = frame([{"label": "ref arm", "arm": "ref", "agg_tok_s": 100.0,
                    "repeated_4gram_share": 0.10, "gsm8k_strict_correct": None},
                   {"label": "new arm", "arm": "new", "agg_tok_s": 90.0,
                    "repeated_4gram_share": 0.25, "gsm8k_strict_correct": None},
                   {"label": "ref arm", "arm": "ref", "workload": "gsm8k", "agg_tok_s": 50.0,
                    "repeated_4gram_share": 0.1, "gsm8k_strict_correct": 3},
                   {"label": "new arm", "arm": "new", "workload": "gsm8k", "agg_tok_s": 50.0,
                    "repeated_4gram_share": 0.1, "gsm8k_strict_correct": 4}])
    speed, rep, gsm = tables.paired_tables(cells, "new", "ref", [
        "agg_tok_s", "repeated_4gram_share", "gsm8k_strict_correct"])
    assert speed.frame.columns == ["workload", "ref arm", "new arm", "change (%)"]
    w = speed.frame["workload"].to_list().index("w")
    assert speed.frame["change (%)"][w] == pytest.approx(-10.0)
    assert speed.caption.startswith("aggregate decode throughput (tok/s): new arm against "
                                    "ref arm")
    assert rep.frame["difference (points)"][w] == pytest.approx(15.0)  # 10 % to 25 %
    assert gsm.frame["workload"].to_list() == ["gsm8k"]  # no row of n/a for the essays


def test_a_missing_exported_drafter_is_named_when_nothing_replays(tmp_path, monkeypatch):
    # the H200 suite's profiles name build/engine-drafters/... (git-ignored): in a checkout
    # without them no stored cell's identity matches, and the error says what to run
    _, study = pipeline.study_for(ROOT / "params" / "h200-engines.yaml", "01_drafter_block_sweep")
    monkeypatch.chdir(tmp_path)
    note = pipeline.missing_local_folders(study)
    assert "build/engine-drafters/vllm/dflash (profile vllm-0.26-dflash-k4)" in note
    assert "specrepro export-drafters" in note
    (tmp_path / "build" / "engine-drafters" / "vllm" / "dflash").mkdir(parents=True)
    (tmp_path / "build" / "engine-drafters" / "vllm" / "mtp").mkdir(parents=True)
    (tmp_path / "models" / "embedded").mkdir(parents=True)
    assert pipeline.missing_local_folders(study) == ""


def test_a_study_never_measured_names_no_folders_for_cells_it_does_not_have(tmp_path):
    # the stand-in suites' profiles name build/standin/... (written on the GPU machine): where
    # nothing was ever stored, no cell could match them, so the error does not blame them
    with pytest.raises(finding_mod.FindingError) as err:
        pipeline.load_finding(ROOT / "params" / "h200-standin.yaml", "05_fp8_drafter_gates",
                              mode="replay", results_dir=tmp_path)
    assert "it was never measured" in str(err.value)
    assert "do not exist here" not in str(err.value)


def test_a_missing_nvfp4_target_is_named_with_its_exporter(tmp_path, monkeypatch):
    # notebook 03's NVFP4 arm on vLLM serves build/nvfp4-target (git-ignored), which
    # `specrepro export-nvfp4` writes; the BF16 and FP8 arms serve models/embedded
    _, study = pipeline.study_for(ROOT / "params" / "h200-engines.yaml", "03_target_precision")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "build" / "engine-drafters" / "vllm" / "dflash").mkdir(parents=True)
    (tmp_path / "models" / "embedded").mkdir(parents=True)
    note = pipeline.missing_local_folders(study)
    assert "build/nvfp4-target (profile vllm-nvfp4-0.26-dflash-k7)" in note
    assert "`specrepro export-nvfp4` writes build/nvfp4-target" in note
    assert "export-drafters" not in note
    (tmp_path / "build" / "nvfp4-target").mkdir()
    assert pipeline.missing_local_folders(study) == ""


def test_a_studys_aa_twins_are_no_arm_of_its_finding(tmp_path):
    """A twin (`noise_of`) is measured and stored like an arm, but the finding's tables,
    figures and claims see the study's own arms; the verdicts' noise reads the twin."""
    _, study = pipeline.study_for(SMOKE, "06_draft_schedule_under_load")
    arms = [a.model_dump(include={"name", "profile", "overrides", "label"}) for a in study.arms]
    base = next(a for a in arms if a["name"] == study.baseline)
    twin = {**base, "name": f"{base['name']}-aa", "noise_of": base["name"]}
    over = {"arms": [*arms, twin]}

    def figures(cell, prof):
        out = plain(cell, prof)
        if cell.arm.name == twin["name"]:
            out["agg_tok_s"] *= 1.05  # the same arm again reads 5 % higher
        return out

    write_cells(tmp_path, SMOKE, "06_draft_schedule_under_load", figures, overrides=over)
    f = pipeline.load_finding(SMOKE, "06_draft_schedule_under_load", "replay", tmp_path,
                              overrides=over)
    assert twin["name"] not in f.cells["arm"].to_list()
    assert twin["name"] not in [a.name for a in f.study.arms]
    assert f.twin_of == {twin["name"]: base["name"]}
    assert set(f.twin_cells["arm"].to_list()) == {twin["name"]}
    assert f.missing == 0 and f.cells.height == f.declared
    from specrepro.analysis.verdict import noise
    c = f.cells["concurrency"].min()
    nz = noise.measure(f, "agg_tok_s", [(base["name"], [1.0], None, None, c)])
    assert nz.aa_pct == pytest.approx(5.0) and twin["name"] in nz.aa_where


def test_a_twin_at_the_ends_gives_a_level_between_them_the_larger_of_its_two_ends(tmp_path):
    _, study = pipeline.study_for(SMOKE, "06_draft_schedule_under_load")
    arms = [a.model_dump(include={"name", "profile", "overrides", "label"}) for a in study.arms]
    base = next(a for a in arms if a["name"] == study.baseline)
    twin = {**base, "name": f"{base['name']}-aa", "noise_of": base["name"]}
    levels = [1, 2, 4]
    inner = [2]
    over = {"arms": [*arms, twin], "concurrency": levels,
            "skip": [{"arm": twin["name"], "concurrency": inner}]}

    def figures(cell, prof):
        out = plain(cell, prof)
        if cell.arm.name == twin["name"]:  # 2 % apart at the lowest, 6 % at the highest
            out["agg_tok_s"] *= 1.02 if cell.concurrency == levels[0] else 1.06
        return out

    write_cells(tmp_path, SMOKE, "06_draft_schedule_under_load", figures, overrides=over)
    f = pipeline.load_finding(SMOKE, "06_draft_schedule_under_load", "replay", tmp_path,
                              overrides=over)
    from specrepro.analysis.verdict import noise
    nz = noise.measure(f, "agg_tok_s", [(base["name"], [1.0], None, None, inner[0])])
    assert nz.aa_pct == pytest.approx(6.0)
    assert f"at {levels[0]}, {levels[-1]} streams, the larger (none at {inner[0]})" in nz.aa_where
    at_end = noise.measure(f, "agg_tok_s", [(base["name"], [1.0], None, None, levels[0])])
    assert at_end.aa_pct == pytest.approx(2.0)
