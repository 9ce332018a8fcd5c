"""The GPU suites: every one validates, binds real engines, renders to argv, and keeps the
articles' setups (sizes, gates declared before any run, exclusions with their reasons).

Every finding of the registry is bound unless the suite excludes it (tests/test_findings.py
holds that for every suite): what is checked here of "every notebook" holds for each finding a
suite binds, read from the registry, the studies and the suites, never from a list of ids."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from specrepro import params
from specrepro.harness.engines import adapter_for
from specrepro.harness.engines.base import EngineError
from specrepro.published import load_gates

PARAMS = Path(__file__).resolve().parent.parent / "params"
SERVED = ("vllm", "sglang", "attach")
# suite file -> the engines its arms may resolve to
SUITES = {
    "rtx-pro-6000.yaml": SERVED,
    "dgx-spark-gb10.yaml": SERVED,
    "h200.yaml": SERVED,
    # notebook 04's second engine is the in-process transformers peer, on the same card
    "h200-embedded.yaml": ("embedded", "transformers"),
    "h200-engines.yaml": ("vllm", "sglang"),
    # the stand-in (issue 31): the real engines, and the embedded engine in its peer study
    "h200-standin.yaml": ("vllm", "sglang", "embedded"),
}
CARD_SAMPLING = (1.0, 0.95, 20)  # the DFlash 2 model card's sampling (article B)


@functools.cache
def resolved(name: str) -> dict[str, params.ResolvedStudy]:
    """Every notebook's study and every study of `studies:` (run only when named)."""
    suite = params.load_suite(PARAMS / name)
    return {sid: params.resolve_study(suite, sid) for sid in [*suite.notebooks, *suite.studies]}


def arms(name: str):
    return [(nb, arm) for nb, study in resolved(name).items() for arm in study.arms]


def skipped_notebooks(name: str) -> set[str]:
    return set(params.NOTEBOOK_IDS) - set(params.load_suite(PARAMS / name).notebooks)


@pytest.mark.parametrize("name", SUITES)
def test_suite_validates_and_every_notebook_has_cells(name: str):
    assert params.summarize(PARAMS / name).startswith(str(PARAMS / name))
    for nb, study in resolved(name).items():
        assert study.notebook_id == nb
        assert any(True for _ in study.cells()), f"{name}: {nb} measures nothing"


@pytest.mark.parametrize("name", SUITES)
def test_every_arm_binds_this_setups_engines(name: str):
    for nb, arm in arms(name):
        assert arm.resolved.engine in SUITES[name], f"{name}: {nb} arm {arm.name}"


@pytest.mark.parametrize("name", SUITES)
def test_every_profile_renders_to_argv(name: str):
    rendered = 0
    for nb, arm in arms(name):
        profile = arm.resolved
        if profile.engine == "transformers":  # in-process peer: no command line to render
            with pytest.raises(EngineError, match="not an HTTP server"):
                adapter_for(profile)
            continue
        argv = adapter_for(profile).render_argv(profile)
        assert all(isinstance(part, str) for part in argv), f"{nb} {arm.name}"
        assert profile.model.id in argv, f"{nb} {arm.name}: {argv}"
        rendered += 1
    assert rendered


@pytest.mark.parametrize("name", SUITES)
def test_exclusions_are_documented(name: str):
    """A finding a setup cannot run is excluded with its reason; no other is missing."""
    suite = params.load_suite(PARAMS / name)
    assert skipped_notebooks(name) == set(suite.excluded)
    for nb, why in suite.excluded.items():
        assert len(why.split()) >= 8, f"{name} excludes {nb} without saying why"


def test_the_gpu_suites_exclude_alike_and_article_a_s_box_only_adds_what_it_lacks():
    """Every GPU suite leaves out the same findings for the same reason (the step-cost
    finding: its notebook reads the stand-in's stored cells and the articles' rows itself, its
    own cells are the CPU suite's); article A's GB10 adds only findings article A has no data
    for, each reason saying so. The CPU suites `make all` renders exclude nothing."""
    excluded = {name: params.load_suite(PARAMS / name).excluded for name in SUITES}
    gb10 = excluded.pop("dgx-spark-gb10.yaml")
    shared = next(iter(excluded.values()))
    assert shared and all(e == shared for e in excluded.values()), excluded
    assert {nb: gb10[nb] for nb in shared} == shared
    assert set(gb10) > set(shared)
    assert all("article A" in why for nb, why in gb10.items() if nb not in shared)
    for name in ("default.yaml", "smoke.yaml"):
        assert params.load_suite(PARAMS / name).excluded == {}, name


def test_article_b_gates_declared_exactly():
    """Notebook 05 on article B's card declares its four gates, and they agree with the
    gates transcribed from the article (published/gates.csv)."""
    gates = resolved("rtx-pro-6000.yaml")["05_fp8_drafter_gates"].gates
    declared = [(g.metric, g.workload, g.concurrency, g.arm, g.reference_arm, g.op,
                 g.threshold, g.kind) for g in gates]
    assert declared == [
        ("agg_tok_s", "essays", 1, "drafter-fp8", "drafter-bf16", ">=", 3.0, "relative_pct"),
        ("agg_tok_s", "essays", 32, "drafter-fp8", "drafter-bf16", ">=", -2.0, "relative_pct"),
        ("gsm8k_flexible_correct", "gsm8k", 8, "drafter-fp8", None, ">=", 194.0, "absolute"),
        ("peak_mem_mib", "essays", 32, "drafter-fp8", None, "<=", 85000.0, "absolute"),
    ]
    published = load_gates().sort("gate")
    assert sorted(zip(published["op"], published["threshold"])) == sorted(
        (g.op, g.threshold) for g in gates)
    study = resolved("rtx-pro-6000.yaml")["05_fp8_drafter_gates"]
    profiles = {a.name: a.resolved.name for a in study.arms}
    assert profiles == {"drafter-bf16": "vllm-b-dflash2-tuned",
                        "drafter-fp8": "vllm-b-dflash2-fp8-drafter"}
    gsm8k = next(w for w in study.workloads if w.name == "gsm8k")
    assert gsm8k.n == 200


@pytest.mark.parametrize("name", ["rtx-pro-6000.yaml", "h200.yaml"])
def test_article_b_sizes(name: str):
    sizes = {"gsm8k": (200, 512), "humaneval": (32, 512), "essays": (32, 512)}
    samplings = set()
    for study in resolved(name).values():
        for w in study.workloads:
            assert (w.n, w.max_tokens) == sizes[w.name], f"{name}: {study.name} {w.name}"
        samplings |= {(s.temperature, s.top_p, s.top_k) for s in study.sampling}
    assert (0.0, 1.0, -1) in samplings and CARD_SAMPLING in samplings
    levels = {nb: s.concurrency for nb, s in resolved(name).items()}
    assert levels["05_fp8_drafter_gates"] == [1, 8, 32]
    assert levels["06_draft_schedule_under_load"] == [1, 2, 4, 8, 16, 32]


def test_rtx_arms_are_the_articles_engine_versions():
    versions = {(nb, a.name): a.resolved.engine_version for nb, a in arms("rtx-pro-6000.yaml")}
    assert versions[("04_engine_comparison", "engine-b-spec")] == "0.5.23"
    assert versions[("05_fp8_drafter_gates", "drafter-fp8")] == "0.33.0"
    assert versions[("07_the_bill", "mtp-production")] == "0.27.1"
    # article A's findings on this card: MTP and DFlash 2 on the same engine release
    assert {versions[("01_drafter_block_sweep", a)] for a in
            ("mtp-k3", "dflash-k4", "dflash-k5", "dflash-k7")} == {"0.32.0"}
    assert all(a.resolved.hardware.name == "ai02" for _, a in arms("rtx-pro-6000.yaml"))


def test_gb10_keeps_article_a_probe():
    for nb, study in resolved("dgx-spark-gb10.yaml").items():
        # article A's 40-second counter window: every speed cell (HumanEval, its code probe,
        # in its findings), one stream included, over the steady window; the 12K prefill
        # sends each prompt once (never twice)
        for cell in study.cells():
            assert study.windowed(cell) == (cell.workload.name != "prefill"), (nb, cell)
        assert (study.window.window_s, study.window.min_concurrency) == (40.0, 1), nb
        for arm in study.arms:
            assert arm.resolved.engine_version == "0.28.0"
            assert "GB10" in arm.resolved.hardware.gpu
    sweep = resolved("dgx-spark-gb10.yaml")["01_drafter_block_sweep"]
    assert sweep.concurrency == [1, 2, 4, 8, 16]
    drafts = {a.name: a.resolved.speculative.num_speculative_tokens for a in sweep.arms}
    assert drafts == {"mtp-k3": 3, "dflash-k4": 4, "dflash-k5": 5, "dflash-k7": 7}
    prefill = [(c.workload.prefill_tokens, c.concurrency) for c in sweep.cells()
               if c.workload.name == "prefill"]
    assert prefill and all(p == ([12000], 1) for p in prefill)
    spread = resolved("dgx-spark-gb10.yaml")["02_temperature_spread"]
    assert [s.temperature for s in spread.sampling] == [0.7, 1.0] and spread.repeats == 4
    assert "HumanEval" in params.load_suite(PARAMS / "dgx-spark-gb10.yaml").description


def test_h200_static_arms_have_no_schedule_and_swapped_arms_no_drafter():
    for nb, arm in arms("h200.yaml"):
        profile = arm.resolved
        if profile.engine != "vllm":
            assert profile.hardware.name == "h200", f"{nb} {arm.name}"
            continue
        assert profile.engine_version == "0.33.0" and profile.hardware.name == "h200"
        spec = profile.speculative
        if spec is None or spec.method == "mtp":
            assert profile.drafter is None, f"{nb} {arm.name} keeps a drafter it does not use"
        if "static" in arm.name or arm.name.startswith(("dflash-k", "mtp-k")):
            assert spec.num_speculative_tokens_per_batch_size is None, f"{nb} {arm.name}"


def test_h200_embedded_runs_on_cuda_in_bf16():
    for nb, arm in arms("h200-embedded.yaml"):
        flags = arm.resolved.flags
        assert (flags["device"], flags["dtype"]) == ("cuda", "bfloat16"), f"{nb} {arm.name}"
        assert arm.resolved.hardware.name == "h200"
    default = params.resolve_all(params.load_suite(PARAMS / "default.yaml"))
    for nb, study in resolved("h200-embedded.yaml").items():  # default's sizes or larger
        if nb not in default:  # a study no notebook renders (parity): its own sizes
            continue
        assert max(study.concurrency) >= max(default[nb].concurrency), nb
        base = {w.name: w for w in default[nb].workloads}
        for w in study.workloads:
            assert w.n >= base[w.name].n and w.max_tokens >= base[w.name].max_tokens, nb
