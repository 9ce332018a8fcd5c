"""The figures and quotes a reviewer flagged (issue 30, item 5), each on constructed cells of
the suite that showed it: 05's gate chart draws pass or fail only where the verdict tested a
gate; 07's KV change is against the arm the article used (the MTP head, whatever method an
engine runs it as) and its tokens per joule sits on an axis of its own; the category labels
of 03's paired bars do not run together; 06's check at the article's lowest level reads the
measured cells at that level; 05's other printed changes name their baselines; 02's spread
check never takes MTP's 18-21 across three days (a claim it cannot test) as the article's
runs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from specrepro import pipeline
from specrepro.analysis import figures
from specrepro.analysis.figures import checks as figure_checks
from specrepro.analysis.figures import load as figures_load
from specrepro.analysis.finding.finding import Finding
from specrepro.analysis.verdict import claims as claims_mod
from specrepro.analysis.verdict import verdicts
from specrepro.analysis.verdict.claims import claims_for
from specrepro.analysis.verdict.overlay import overlay, overlay_tables, published_ranges
from specrepro.store import CELL_SCHEMA, REQUEST_SCHEMA, empty, frame

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "params" / "default.yaml"
ENGINES = ROOT / "params" / "h200-engines.yaml"
EMBEDDED = ROOT / "params" / "h200-embedded.yaml"


def finding(params: Path, nb: str, figure, overrides=None) -> Finding:
    """One ok row per declared cell of the suite's study, its figures from figure(cell, arm
    profile); labelled as the store's loader labels them."""
    suite, study = pipeline.study_for(params, nb, overrides)
    labels = {a.name: a.label or a.name for a in study.arms}
    rows = []
    for i, cell in enumerate(study.cells()):
        prof = next(a for a in study.arms if a.name == cell.arm.name).resolved
        rows.append({"cell_id": f"c{i}", "attempt": 1, "status": "ok", "arm": cell.arm.name,
                     "engine": prof.engine, "method": prof.method,
                     "workload": cell.workload.name, "concurrency": cell.concurrency,
                     "temperature": cell.sampling.temperature, "repeat": cell.repeat,
                     **figure(cell, prof)})
    cells = frame(rows, CELL_SCHEMA).with_columns(
        pl.col("arm").replace_strict(labels, default=None).alias("label"))
    return Finding(nb, study, suite, Path("/nonexistent"), cells,
                   empty(REQUEST_SCHEMA), False, {})


@pytest.fixture(autouse=True)
def _style():
    figures.style()
    yield
    figures.plt.close("all")


def tick_texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.get_xticklabels()]


# ---------------------------------------------------------------------- 05: gates


def fp8(counts_differ: bool):
    """05 cells: the FP8 drafter 1 % under the BF16 one in tokens per step, every output
    identical; its draft counters equal the baseline's unless `counts_differ`."""
    def figure(cell, prof) -> dict:
        is_fp8 = cell.arm.name == "drafter-fp8"
        return {"agg_tok_s": 100.0 + cell.repeat, "acceptance_length": 3.0 * (0.99 if is_fp8 else 1),
                "identical_to_baseline": 1.0 if is_fp8 else None, "peak_mem_mib": 500.0,
                "num_drafts": 1000, "num_accepted_tokens": 2000 + (7 if is_fp8 and counts_differ
                                                                    else 0)}
    return figure


def test_gates_the_verdict_tested_are_drawn_as_pass_or_fail(tmp_path):
    f = finding(DEFAULT, "05_fp8_drafter_gates", fp8(counts_differ=True))
    fig = figures.gate_chart(f, claims_for(f.notebook_id))
    ticks = tick_texts(fig)
    assert [t.split("\n")[0] for t in ticks] == ["PASS"] * 4, ticks
    assert ticks[0] == "PASS\n-1 %"  # the value under the verdict, so a bar of 0 still says
    figures.save_figure(fig, tmp_path, f.notebook_id, "check")  # fitted, then checked


def test_gates_the_verdict_could_not_test_are_never_drawn_as_pass_or_fail(tmp_path):
    # the engine served one drafter to both arms (SGLang 0.5.14's "FP8" drafter): the verdict
    # calls every gate not testable here, so the chart may not print PASS or FAIL on them
    f = finding(ENGINES, "05_fp8_drafter_gates", fp8(counts_differ=False))
    fig = figures.gate_chart(f)  # the notebook's claims unless given
    assert not any(t.startswith(("PASS", "FAIL")) for t in tick_texts(fig))
    assert len(fig.axes) == 1 and not fig.axes[0].patches  # no bar, no empty panel
    note = next(t for t in fig.axes[0].texts if t.get_gid() == "gates-not-tested").get_text()
    for gate in f.study.gates:
        assert f"\u2022 {gate.name} (" in note
    note = " ".join(note.split())  # as read, lines joined
    assert note.count("the engine served the same drafter to both arms") == len(f.study.gates)
    assert fig.axes[0].get_title().startswith("not testable here")
    figures.save_figure(fig, tmp_path, f.notebook_id, "check")  # fitted, then checked


# ------------------------------------------------------------------ 03: tick labels


def test_paired_bars_label_each_group_in_lines_that_do_not_run_together():
    # the H200 suites' 03: four groups whose labels ended "...75%rep. 4-grams 76%"; the CPU
    # suite's pooled 0.13 (BF16) and 0.41 (NVFP4) into one "rep. 27 %": per arm, never pooled
    share = {"target-bf16": 0.13, "target-nvfp4": 0.41}
    f = finding(EMBEDDED, "03_target_precision", lambda c, p: {
        "acceptance_length": 3.0, "agg_tok_s": 100.0 * c.concurrency,
        "repeated_4gram_share": share.get(c.arm.name, 0.75)})
    fig = figures.acceptance_pairs(f, claims_for(f.notebook_id))
    figures.fit_text(fig)
    assert not [p for p in figure_checks.problems(fig) if "tick label" in p]
    order = [share.get(a, 0.75) for a in f.labels]  # the legend's order
    assert tick_texts(fig)[0] == ("essays\n1 stream\nrep. "
                                  + "/".join(f"{100 * v:.0f}" for v in order) + "%")
    assert "27%" not in tick_texts(fig)[0]
    assert fig.axes[0].get_xlabel() == ("rep.: the outputs' repeated 4-grams, per arm in the "
                                        "legend's order")


def test_the_changed_drafter_the_engine_never_served_is_labelled_as_served():
    # SGLang 0.5.14 served the BF16 drafter to the "FP8" arm: identical draft counters
    f = finding(ENGINES, "05_fp8_drafter_gates", fp8(counts_differ=False))
    fig = figures.acceptance_pairs(f, claims_for(f.notebook_id))
    fp8_label = f.labels["drafter-fp8"]
    names = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(" ".join(n.split()).startswith(f"{fp8_label}; as served: ") for n in names), names
    assert fp8_label not in names  # never the bare "FP8" label
    g = finding(ENGINES, "05_fp8_drafter_gates", fp8(counts_differ=True))
    fig = figures.acceptance_pairs(g, claims_for(g.notebook_id))
    assert fp8_label in [t.get_text() for t in fig.legends[0].get_texts()]


def test_the_article_bars_are_named_as_the_articles_arms_not_in_the_measured_colours():
    f = finding(EMBEDDED, "04_engine_comparison", lambda c, p: {
        "acceptance_length": 3.0, "agg_tok_s": 100.0, "repeated_4gram_share": 0.2})
    fig = figures.acceptance_pairs(f, claims_for(f.notebook_id))
    art = [b for b in fig.axes[2].patches if (b.get_gid() or "").startswith("article-bar|")]
    assert art, "the article's bars are drawn"
    measured = {figures.palette(f)[lab] for lab in f.labels.values()}
    from matplotlib.colors import to_hex
    assert not {to_hex(b.get_facecolor()) for b in art} & {m.lower() for m in measured}
    names = [" ".join(t.get_text().split()) for t in fig.legends[0].get_texts()]
    article = [n for n in names if n.startswith("article B: ")]
    assert article and not set(article) & set(f.labels.values()), names


def _static7(below_first: bool):
    """06 cells: static 7 drafts against no speculation, below it at every level, or above
    at the lowest and below from 4 streams on."""
    def figure(cell, prof) -> dict:
        ratio = 1.0
        if cell.arm.name == "static-k7":
            ratio = 0.6 if below_first or cell.concurrency >= 4 else 1.3
        return {"agg_tok_s": 100.0 * cell.concurrency * ratio, "acceptance_length": 3.0}
    return figure


def test_a_crossover_is_drawn_only_where_the_ratio_crosses_one_between_levels():
    f = finding(DEFAULT, "06_draft_schedule_under_load", _static7(below_first=True))
    fig = figures.load_sweep(f, claims_for(f.notebook_id))
    assert not any(ln.get_label().startswith("static 7") for ln in fig.axes[2].lines)
    assert "below no speculation at every level measured" in fig._suptitle.get_text()
    g = finding(DEFAULT, "06_draft_schedule_under_load", _static7(below_first=False))
    fig = figures.load_sweep(g, claims_for(g.notebook_id))
    line = [ln for ln in fig.axes[2].lines if ln.get_label().startswith("static 7 crosses")]
    assert line and 2 < line[0].get_xdata()[0] < 4


def test_the_crossing_arm_is_the_one_the_claims_say_crosses_not_a_method_or_draft_count():
    f = finding(DEFAULT, "06_draft_schedule_under_load", _static7(below_first=False))
    claims = claims_for(f.notebook_id)
    assert figures_load.crossing_arm(f, claims) == "static-k7"

    def moved(to: str | None, also: str | None = None) -> claims_mod.Claims:
        checks = []
        for r in claims.checks:
            if r.a is not None and r.a.arm == "static-k7" and r.b is not None:
                if to is None:
                    continue
                checks.append(replace(r, a=replace(r.a, arm=to)))
                if also:
                    checks.append(replace(r, a=replace(r.a, arm=also)))
            else:
                checks.append(r)
        return replace(claims, checks=tuple(checks))

    assert figures_load.crossing_arm(f, moved("static-k5")) == "static-k5"
    assert figures_load.crossing_arm(f, moved(None)) is None
    with pytest.raises(claims_mod.ClaimsError,
                       match=r"06_draft_schedule_under_load/claims.yaml: "
                             r".*'static-k5', 'static-k7'.* one"):
        figures_load.crossing_arm(f, moved("static-k7", also="static-k5"))


# ------------------------------------------------------------------------ 07: the bill


def pools(c, p) -> dict:
    """07 cells: KV pools of 1,000 (no speculation), 800 (MTP) and 500 (block drafter)
    tokens, tokens per joule 4-124 with watts where `power`."""
    pool = {"none": 1000, "mtp-control": 800, "dflash-k7": 500}[c.arm.name]
    return {"kv_pool_tokens": pool, "agg_tok_s": 10.0 * c.concurrency,
            "tokens_per_joule": 4.0 * c.concurrency ** 0.99, "power_w_mean": 125.0}


def test_the_kv_change_is_against_the_mtp_arm_whatever_method_an_engine_runs_it_as(tmp_path):
    # vLLM runs the MTP head as an EAGLE head (method eagle): the articles' KV changes are
    # still against it, never against no speculation
    f = finding(ENGINES, "07_the_bill", pools)
    assert {a.name: a.resolved.method for a in f.study.arms}["mtp-control"] == "eagle"
    fig = figures.bill_chart(f, claims_for(f.notebook_id))
    kv = fig.axes[1]
    assert kv.get_ylabel().replace("\n", " ").startswith("KV pool against MTP head as EAGLE")
    bars = {t.get_text(): p.get_height() for t, p in zip(kv.get_xticklabels(), kv.patches,
                                                         strict=False)}
    assert bars == pytest.approx({"no speculation (vLLM 0.26.0)": 25.0,
                                  "block drafter, 7 drafts (vLLM 0.26.0)": -37.5})
    a_line = [ln for ln in kv.lines if ln.get_label().startswith("article A")]
    assert len(a_line) == 1 and a_line[0].get_ydata()[0] == pytest.approx(-17.4, abs=0.1)
    assert "none is drawn" not in fig.get_suptitle()
    figures.save_figure(fig, tmp_path, f.notebook_id, "check")  # fitted, then checked


def test_without_an_mtp_arm_no_article_kv_change_is_drawn_and_the_title_says_so(tmp_path):
    arms = {"arms": [{"name": "none", "profile": "embedded-none", "label": "no speculation"},
                     {"name": "dflash-k7", "profile": "embedded-dflash",
                      "label": "block drafter, 7 drafts"}]}
    f = finding(DEFAULT, "07_the_bill", pools, overrides=arms)
    fig = figures.bill_chart(f, claims_for(f.notebook_id))
    kv = fig.axes[1]
    assert not [a for a in (*kv.lines, *kv.collections)
                if a.get_label().startswith("article") or (a.get_gid() or "").startswith(
                    ("article", "key|article"))]
    assert "against no speculation" in kv.get_ylabel().replace("\n", " ")
    assert ("the articles' are against MTP, and no arm of this study stands for it, so none "
            "is drawn") in fig.get_suptitle().replace("\n", " ")
    figures.save_figure(fig, tmp_path, f.notebook_id, "check")  # fitted, then checked


def test_the_articles_tokens_per_joule_has_an_axis_of_its_own(tmp_path):
    f = finding(ENGINES, "07_the_bill", pools)
    assert f.has_power
    fig = figures.bill_chart(f, claims_for(f.notebook_id))
    measured, article = fig.axes[2], fig.axes[3]
    assert not [c for c in measured.collections if (c.get_gid() or "").startswith("article")]
    pts = [y for c in article.collections if (c.get_gid() or "").startswith("article-tpj|")
           for _, y in c.get_offsets()]
    # article B's 0.20 at one stream to 5.39 at 32, each inside its own axis
    assert min(pts) == pytest.approx(0.20) and max(pts) == pytest.approx(5.39)
    lo, hi = article.get_ylim()
    assert lo <= 0.2 and 5.39 <= hi < 10 and article.get_yscale() == "log"
    assert measured.get_ylim()[1] > 100  # the measured 4-124 tok/J on its own
    figures.save_figure(fig, tmp_path, f.notebook_id, "check")  # fitted, then checked


# ------------------------------------------------------------- 06: the article's level


def load(c, p) -> dict:
    """06 cells: static 7 drafts half of no speculation at one stream, +78 % at 8 (the
    article's 792 against 444 tok/s at 8 streams), -10 % at 32; a speculative step 1.2
    decodes (a weight-read step: the speed precondition holds, analysis/verdict/mechanism.py)."""
    base = {1: 100.0, 2: 180.0, 4: 300.0, 8: 444.0, 32: 1361.0}[c.concurrency] + c.repeat
    k7 = {1: 0.5, 2: 0.8, 4: 1.3, 8: 1.78, 32: 0.9}[c.concurrency]
    return {"agg_tok_s": base * (k7 if c.arm.name == "static-k7" else 1.0),
            "step_ms": 10.0 * (1.2 if p.speculative else 1.0)}


def test_the_lowest_level_is_the_articles_where_the_study_measured_it():
    # article B's under-load sweep starts at 8 streams: its +78 % is set beside the measured
    # 8 streams, not beside 1 stream, which the study measured too
    f = finding(DEFAULT, "06_draft_schedule_under_load", load)
    c = next(c for c in verdicts.verdict(f).checks if c.claim.startswith(
        "Static 7 drafts beats no speculation at low load"))
    assert "; 8 streams, T=0)" in c.article and "; 8 streams, T=0)" in c.measured, c
    assert c.measured.startswith("+78.0%") and c.outcome == "holds"


def test_a_declared_article_level_missing_from_the_store_is_not_judged_lower_down():
    f = finding(DEFAULT, "06_draft_schedule_under_load", load)
    f.cells = f.cells.filter(~((pl.col("arm") == "static-k7") & (pl.col("concurrency") == 8)))
    c = next(c for c in verdicts.verdict(f).checks if c.claim.startswith(
        "Static 7 drafts beats no speculation at low load"))
    assert c.outcome == "not testable here" and "8 streams were not measured" in c.reason, c


def test_a_level_the_study_does_not_declare_keeps_the_studys_own():
    # 01's highest in article A is 16 streams; the default suite declares 1-8: judged at 8
    f = finding(DEFAULT, "01_drafter_block_sweep", lambda c, p: {
        "agg_tok_s": 10.0 * c.concurrency * (1.2 if c.arm.name == "dflash-k5" else 1.0)})
    c = next(c for c in verdicts.verdict(f).checks if c.claim.startswith(
        "5 drafts keeps a gain over MTP at the highest load"))
    assert "; 16 streams, T=0.7)" in c.article and "; 8 streams, T=0)" in c.measured, c


# ------------------------------------------------------------- 05: other printed figures


def test_each_other_printed_change_names_the_arm_it_is_against():
    f = finding(DEFAULT, "05_fp8_drafter_gates", lambda c, p: {"agg_tok_s": 100.0 + c.repeat})
    ov = overlay(f.cells, claims_for(f.notebook_id), ["agg_tok_s_change_pct"])
    row = ov.filter((pl.col("arm") == "drafter-fp8") & (pl.col("concurrency") == 8)).row(
        0, named=True)
    assert row["published"] == 0.7 and row["published_baseline"].startswith("DFlash 2, BF16")
    # +15.2 % at 8 streams is against memory-matched MTP, not the BF16 drafter
    assert row["also_published"].startswith("15.2 against MTP, memory-matched, vLLM 0.27.1 (")
    assert row["also_published"].endswith(
        "; the compared 0.7 is against DFlash 2, BF16 drafter, vLLM 0.33.0 (tuned)")
    notes = [n for t in overlay_tables(f.cells, claims_for(f.notebook_id),
                                               ["agg_tok_s_change_pct"]) for n in t.notes]
    assert any("the article also prints 15.2 against MTP, memory-matched" in n for n in notes)
    assert any(n.startswith("block drafter, unquantized: the article's 3 against DFlash 2")
               for n in notes), notes


# ----------------------------------------------------- 02: a claim it cannot test, quoted


def spread(c, p) -> dict:
    """02 cells at T=1.0: the 7-draft block spreads 30 % run to run, MTP 3 %."""
    k7 = c.arm.name == "dflash-k7"
    return {"agg_tok_s": (30.0 + 3.0 * c.repeat) if k7 else (50.0 + 0.5 * c.repeat),
            "draft_acceptance_rate": 0.3}


def test_a_quote_of_a_claim_it_cannot_test_is_never_compared():
    claims = claims_for("02_temperature_spread")
    # MTP's 18 to 21 over three days is listed as not testable here, so it is not the
    # article's runs of MTP at T=1.0 (the article prints none)
    f = finding(DEFAULT, "02_temperature_spread", spread)
    c = next(c for c in verdicts.verdict(f, claims).checks
             if c.claim.startswith("At T=1.0 the block drafter at 7 drafts spreads more"))
    assert "18, 21" not in c.article and c.ratio is None, c
    assert c.article.startswith("0.63 (runs 32.5, 26.8, 21.3, 17.1) against not printed (the "
                                "article prints no runs of 'mtp3_0280' but a claim not "
                                "testable here: run-to-run spread across days")
    # the measured spreads (0.29 against 0.02) decide only where the speed mechanism exists:
    # the CPU suite's step-stage probe puts the block drafter's step at 2.22 decodes
    assert c.outcome == "not testable here" and "decode step absent" in c.reason, c
    # the overlay and the figures' points leave it out too
    assert not published_ranges(claims, "agg_tok_s").filter(
        pl.col("study_arm") == "mtp-k3").height


def test_a_quoted_source_must_be_published_and_untestable_everywhere():
    known = {"text: a sentence"}
    u = claims_mod._untestable("nb", 0, {"claim": "c", "why": "w", "sources": ["text: a sentence"]},
                               known)
    assert u.sources == ("text: a sentence",)
    with pytest.raises(claims_mod.ClaimsError,
                       match=r"nb/claims.yaml: cannot_test\[0\].sources: no published"):
        claims_mod._untestable("nb", 0, {"claim": "c", "why": "w", "sources": ["text: typo"]},
                               known)
    with pytest.raises(claims_mod.ClaimsError, match="untestable on every substrate"):
        claims_mod._untestable("nb", 0, {"claim": "c", "why": "w", "device": "cpu",
                                         "sources": ["text: a sentence"]}, known)
