"""The index and the reports' HTML on constructed notebooks and stores (no engine, no browser):
the summary first in each report, the index's summary table, its self-contained figures, the
substrate and generation lines, and the arms several notebooks measured.

`summary_output`, `constructed_notebook` and `png` build what `show.show_summary` and
`show.show_figure` display; tests/test_report_render.py renders the same in Chromium."""

from __future__ import annotations

import base64
import struct
import zlib
from pathlib import Path

import nbformat
import pytest
import yaml

from specrepro import identity, provenance
from specrepro.analysis.finding import arms_across
from specrepro.analysis.render import notebooks, report
from specrepro.analysis.verdict.verdicts import coverage_text
from specrepro.params import NOTEBOOK_IDS, load_suite, resolve_study
from specrepro.store import ResultStore, now

ROOT = Path(__file__).resolve().parents[1]
SYMBOLS = {"holds": "✓", "holds in direction only": "◐", "does not hold": "✗",
           "not testable here": "–"}


def png(width: int = 40, height: int = 20, rgb=(40, 90, 160)) -> bytes:
    """A real PNG (a browser decodes it), of one colour."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    row = b"\x00" + bytes(rgb) * width
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2,
                                                              0, 0, 0))
            + chunk(b"IDAT", zlib.compress(row * height)) + chunk(b"IEND", b""))


def summary_output(nb: str, outcome: str = "holds", checks: int = 2, verdicts: bool = True):
    """The display output show.show_summary gives: metadata and the table with id summary."""
    rows = [{"claim": f"check {i} of {nb}", "article": f"+{35 + i} %", "measured": f"+{4 + i} %",
             "ratio": 0.1 + i, "outcome": outcome, "symbol": SYMBOLS[outcome],
             "rule": f"RULE-{i}: within ±50 % of the article's change"} for i in range(checks)]
    text = coverage_text(outcome, [(c["outcome"], "") for c in rows])
    summary = {"notebook_id": nb, "title": f"Title {nb}", "article": "A",
               "claim": f"CLAIM-{nb}: the block drafter beats MTP at one stream.",
               "outcome": outcome, "symbol": SYMBOLS[outcome], "text": text,
               "article_substrate": "vLLM 0.28.0, DGX Spark GB10, Qwen3.8-27B NVFP4",
               "substrate": "embedded engine 0.1.0, CPU TEST-CPU (2 threads), models/embedded",
               "checks": rows}
    trs = "".join(
        f"<tr class='check' data-outcome='{c['outcome']}'><td>{c['claim']}</td>"
        f"<td>{c['article']}</td><td>{c['measured']}</td><td>{c['ratio']}</td>"
        f"<td class='noise'>±3.0% (run-to-run 3.0%)</td><td class='verdict'>{(c['outcome'] + ' ' + c['symbol']) if verdicts else ''}</td>"
        f"<td>{c['rule']}</td></tr>" for c in rows)
    # as summary.summary_html writes them: the verdict line with its coverage, the substrate
    # line with the speed precondition (host_bound.substrate_line, mechanism.precondition_line)
    table = (f"<p class='verdict-line' data-outcome='{outcome}'><strong>Verdict: "
             f"{SYMBOLS[outcome]} {text}</strong>. The article's finding: the block drafter "
             "beats MTP at one stream.</p>"
             "<p class='substrate-line'><strong>Substrate:</strong> the embedded 11M target "
             "on a constructed machine, busy share not measured. Precondition, a weight-read "
             "decode step: a speculative step costs at most 1.5 one-token decodes. Measured, "
             "at each arm's lowest level: dflash-k7 1.20 (constructed). The mechanism is "
             "there.</p>"
             "<table id='summary' class='specrepro summary'><thead><tr><th>claim</th>"
             "<th>article</th><th>measured</th><th>ratio</th><th>Noise</th><th>verdict</th>"
             "<th>rule</th>"
             f"</tr></thead><tbody>{trs}</tbody></table>")
    return nbformat.v4.new_output("display_data", {"text/html": table, "text/plain": "summary"},
                                  metadata={"specrepro": {"summary": summary}})


def figure_output(path: str, data: bytes | None):
    out = {"text/plain": "<IPython.core.display.Image object>"}
    if data is not None:
        out["image/png"] = base64.b64encode(data).decode()
    return nbformat.v4.new_output("display_data", out, metadata={"specrepro": {"figure": path}})


def constructed_notebook(nb: str, *, summary=True, figures=("throughput",), parameters=None,
                         outcome="holds", verdicts=True) -> nbformat.NotebookNode:
    """An executed notebook as papermill leaves it: title and introduction, the defaults cell,
    the injected parameters, a header, the summary, a table, figures (PNG embedded)."""
    book = nbformat.v4.new_notebook()
    defaults = nbformat.v4.new_code_cell('mode = "auto"  # DEFAULTS-CELL')
    defaults.metadata["tags"] = ["parameters"]
    injected = nbformat.v4.new_code_cell('mode = "replay"  # INJECTED-CELL')
    injected.metadata["tags"] = ["injected-parameters"]
    header = nbformat.v4.new_code_cell("sa.show_header(finding, claims)  # CODE-CELL")
    header.outputs = [nbformat.v4.new_output("display_data",
                                             {"text/markdown": "## HEADER-OUTPUT"})]
    if summary:
        header.outputs.append(summary_output(nb, outcome, verdicts=verdicts))
    table = nbformat.v4.new_code_cell("sa.show_table(cells)  # CODE-CELL")
    table.outputs = [nbformat.v4.new_output(
        "display_data", {"text/html": "<table class='specrepro'><tr><td>TABLE</td></tr></table>"})]
    figs = nbformat.v4.new_code_cell("sa.show_figure(fig)  # CODE-CELL")
    figs.outputs = [figure_output(f"figures/{nb}__{name}.png", png()) for name in figures]
    book.cells = [nbformat.v4.new_markdown_cell(f"# {nb[:2]} {nb[3:].replace('_', ' ')}\n\n"
                                                "INTRO-TEXT of the notebook."),
                  defaults, injected, header, table, figs]
    if parameters is not None:
        book.metadata["papermill"] = {"parameters": parameters}
    return book


# ------------------------------------------------------------------ reports' HTML


def test_the_summary_comes_right_after_the_title_and_the_reader_style_is_in(tmp_path):
    path = tmp_path / "01_drafter_block_sweep.ipynb"
    nbformat.write(constructed_notebook("01_drafter_block_sweep"), path)
    page = notebooks.to_html(path).read_text()
    title = page.index("01 drafter block sweep")
    summary = page.index("id='summary'") if "id='summary'" in page else page.index('id="summary"')
    assert title < summary < page.index("INTRO-TEXT") < page.index("INJECTED-CELL") \
        < page.index("HEADER-OUTPUT")
    assert page.count("CLAIM-01") == 0  # the summary's metadata is not printed
    assert "table#summary" in page and "td.verdict" in page  # READER_STYLE
    assert "CODE-CELL" not in page and "DEFAULTS-CELL" not in page
    # the executed notebook is left as it was: the summary where the notebook displayed it
    kept = nbformat.read(path, as_version=4)
    assert any("summary" in o.get("metadata", {}).get("specrepro", {})
               for o in kept.cells[3].outputs)


def test_a_notebook_without_summary_or_heading_keeps_its_order():
    book = constructed_notebook("02_temperature_spread", summary=False)
    assert [c.source for c in notebooks.for_readers(book).cells] == [
        c.source for c in book.cells if "DEFAULTS-CELL" not in c.source]
    book = constructed_notebook("02_temperature_spread")
    book.cells[0].source = "No heading here."
    cells = notebooks.for_readers(book).cells
    assert cells[0].id == notebooks.SUMMARY_CELL and cells[1].source == "No heading here."


# --------------------------------------------------------------------------- index


def reports_folder(tmp_path: Path, **per_notebook) -> Path:
    """A reports folder with every notebook executed (constructed), keyword arguments per id
    overriding constructed_notebook's."""
    reports = tmp_path / "reports"
    reports.mkdir()
    for nb in NOTEBOOK_IDS:
        kwargs = per_notebook.get(nb, {})
        if kwargs is None:  # not executed
            continue
        nbformat.write(constructed_notebook(nb, **kwargs), reports / f"{nb}.ipynb")
    return reports


def test_the_index_has_every_claim_its_values_and_a_verdict_in_word_and_symbol(tmp_path):
    reports = reports_folder(tmp_path, **{
        "02_temperature_spread": {"outcome": "holds in direction only"},
        "05_fp8_drafter_gates": {"outcome": "not testable here"},
        "06_draft_schedule_under_load": {"summary": False},
        "07_the_bill": None})
    page = report.write_index(reports).read_text()
    n = len(NOTEBOOK_IDS)
    assert page.count("<tbody class='finding'") == n and page.count("<tr class='finding'") == n
    assert "CLAIM-01_drafter_block_sweep" in page and "+35 %" in page and "+4 %" in page
    # the verdict with its coverage (verdicts.coverage_text), two checks each
    assert "✓ holds on all 2 checks (2 holds)</td>" in page
    assert "◐ holds in direction only: 2 of 2 checks tested (2 holds in direction only)</td>" in page
    assert "– not testable here: none of 2 checks tested (2 not testable here: " in page
    assert "? no summary</td>" in page and "displayed no summary" in page  # 06
    assert "not executed into this folder" in page  # 07
    assert "href='01_drafter_block_sweep.html'" in page and "07_the_bill.html" not in page
    assert "RULE-1" in page  # the rule, as the check's tooltip
    assert "CPU TEST-CPU (2 threads)" in page and "DGX Spark GB10" in page
    git = provenance.git_state()
    assert "UTC from commit " + (git["commit"] or "no commit")[:12] in page


def column_notes(page: str) -> dict[str, list[tuple[str, str | None]]]:
    """Per table of the page (its id or first class): each header's column and the text of
    its note in the table's caption (None where it has none)."""
    import html
    import re

    out = {}
    for table in re.findall(r"<table\b.*?</table>", page, re.DOTALL):
        tag = re.match(r"<table([^>]*)>", table).group(1)
        name = (re.search(r"id='([^']+)'", tag) or re.search(r"class='([^']+)'", tag)).group(1)
        caption = re.search(r"<caption[^>]*>(.*?)</caption>", table, re.DOTALL)
        notes = dict(re.findall(r"<span class='col-note' data-column='([^']+)'>(.*?)</span>",
                                caption.group(1) if caption else ""))
        head = re.search(r"<thead>(.*?)</thead>", table, re.DOTALL).group(1)
        cols = re.findall(r"<th data-column='([^']+)'", head)
        assert len(cols) == head.count("<th"), f"{name}: a header without data-column"
        out[name] = [(html.unescape(c), notes.get(c) and html.unescape(
            re.sub(r"^<b>.*?</b>: ", "", notes[c]))) for c in cols]
    return out


def test_every_column_of_the_index_has_its_note_above_the_table(tmp_path):
    reports = reports_folder(tmp_path)
    page = report.write_index(reports).read_text()
    notes = column_notes(page)
    assert {"summary", "substrates"} <= set(notes)
    missing = [(t, c) for t, cols in notes.items() for c, note in cols if not note]
    assert missing == []
    summary = dict(notes["summary"])
    assert list(summary) == [n for n, _, _ in report.COLUMNS]
    # the ratio is said in words: what it divides, and how to read it
    assert "ratio" not in summary
    assert "the measured effect divided by the article's: 1 as large" in summary[
        "measured ÷ article"]
    assert "this suite's own gate" in summary["check"]
    # a note the renderer drops is found: the test can fail
    dropped = page.replace("<span class='col-note' data-column='verdict'>", "<span>", 1)
    assert ("summary", "verdict") in [(t, c) for t, cols in column_notes(dropped).items()
                                      for c, note in cols if not note]


def test_the_shared_arm_tables_explain_each_column():
    arm = arms_across.SharedArm(
        {"engine": "vllm 0.26.0", "speculation": "none", "quantization": "target none",
         "workload": "essays (completion), 8 prompts x 48 tokens", "load": "1 stream, T=0"},
        {"04_engine_comparison": ("a", "A", {"agg_tok_s": [10.0, 11.0], "acceptance_length": []}),
         "06_draft_schedule_under_load": ("b", "B", {"agg_tok_s": [12.0],
                                                      "acceptance_length": []})})
    notes = column_notes(arms_across.render_tables([arm]))
    assert list(notes) == ["specrepro arms"]
    assert [c for c, n in notes["specrepro arms"] if not n] == []
    assert dict(notes["specrepro arms"])["load"] == "concurrent streams and temperature"


def test_the_index_writes_its_figures_inside_the_reports_folder(tmp_path):
    reports = reports_folder(tmp_path, **{
        "01_drafter_block_sweep": {"figures": ("throughput", "acceptance")}})
    stale = reports / "figures" / "old__figure.png"
    stale.parent.mkdir()
    stale.write_bytes(png())
    # a figure displayed without its image and whose file is gone is said, not linked
    broken = reports / "03_target_precision.ipynb"
    book = nbformat.read(broken, as_version=4)
    book.cells[-1].outputs = [figure_output(str(tmp_path / "gone.png"), None)]
    nbformat.write(book, broken)
    page = report.write_index(reports).read_text()
    written = sorted(p.name for p in (reports / "figures").iterdir())
    assert "01_drafter_block_sweep__acceptance.png" in written and "old__figure.png" not in written
    assert (reports / "figures" / "01_drafter_block_sweep__throughput.png").read_bytes() == png()
    srcs = [s.split("'")[0] for s in page.split("<img src='")[1:]]
    # every notebook one figure, 01 two, 03 none
    assert len(srcs) == len(NOTEBOOK_IDS) - 1 + 1
    assert all(s.startswith("figures/") and (reports / s).is_file() for s in srcs)
    assert "../" not in page and "http" not in page
    assert "gone.png does not exist" in page


# --------------------------------------------------------------- arms across notebooks


@pytest.fixture
def smoke_suite(tmp_path) -> Path:
    """params/smoke.yaml with its results in tmp (studies and profiles still the project's)."""
    suite = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    suite.update(profiles=str(ROOT / "params" / "profiles"), results_dir=str(tmp_path / "results"))
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    return path


def store_cells(suite_path: Path, nb: str, tok_s, overrides=None) -> None:
    """One ok row per declared cell of the notebook's study, agg_tok_s = tok_s(cell)."""
    suite = load_suite(suite_path)
    study = resolve_study(suite, nb, overrides)
    store = ResultStore(suite.results_path, study.name, suite.run_id)
    for cell in study.cells():
        prof = next(a for a in study.arms if a.name == cell.arm.name).resolved
        spec = prof.speculative
        store.append_cell({
            "cell_id": identity.cell_id(study, cell, "test 0.1"), "status": "ok",
            "arm": cell.arm.name, "profile": prof.name, "engine": prof.engine,
            "engine_version": "test 0.1", "method": prof.method,
            "num_speculative_tokens": spec.num_speculative_tokens if spec else None,
            "workload": cell.workload.name, "n_prompts": cell.workload.n,
            "concurrency": cell.concurrency, "temperature": cell.sampling.temperature,
            "repeat": cell.repeat, "seed": cell.seed, "ended_at": now(),
            "agg_tok_s": tok_s(cell), "acceptance_length": 2.0 if spec else None},
            [{"request_idx": 0, "prompt_id": "p0", "text": "t"}])


def executed_with(reports: Path, nb: str, suite: Path, overrides=None) -> Path:
    path = reports / f"{nb}.ipynb"
    nbformat.write(constructed_notebook(nb, parameters={
        "params_file": str(suite), "notebook_id": nb, "mode": "replay", "results_dir": None,
        "overrides": overrides or {}}), path)
    return path


def test_an_arm_measured_by_several_notebooks_is_shown_once_with_its_spread(
        smoke_suite, tmp_path):
    # the smoke suite's no-speculation arm on essays, 2 prompts: 04 (engine-a-none), 06 and
    # 07 (none); each notebook's throughput differs, as on a shared machine
    base = {"04_engine_comparison": 100.0, "06_draft_schedule_under_load": 110.0,
            "07_the_bill": 130.0}
    for nb, tok in base.items():
        store_cells(smoke_suite, nb, lambda c, tok=tok: tok * c.concurrency + c.repeat)
    reports = tmp_path / "reports"
    reports.mkdir()
    paths = [executed_with(reports, nb, smoke_suite) for nb in base]
    found = [arms_across.notebook_cells(p) for p in paths]
    shared = arms_across.shared_arms(found)
    one_stream = [a for a in shared if a.settings["load"] == "1 stream, T=0"
                  and a.settings["speculation"] == "none"]
    assert len(one_stream) == 1
    arm = one_stream[0]
    assert sorted(arm.by_notebook) == sorted(base)
    assert arm.by_notebook["04_engine_comparison"][0] == "engine-a-none"
    assert arm.by_notebook["07_the_bill"][2]["agg_tok_s"] == [130.0]
    assert "essays (completion), 2 prompts x 32 tokens" == arm.settings["workload"]
    s = arms_across.spread([100.0, 110.0, 130.0])
    assert s["low"] == 100.0 and s["high"] == 130.0
    assert s["spread_pct"] == pytest.approx(100 * 30 / (340 / 3))
    # the transformers peer's no-speculation arm of 04 is another engine: never merged
    assert not any("transformers" in a.settings["engine"] for a in shared)
    html = arms_across.section(paths)
    assert "<b>100</b>" in html and "<b>110</b>" in html and "<b>130</b>" in html
    assert "26.5 %" in html  # (130 - 100) / 113.3


def test_the_same_arm_at_another_size_is_another_arm_and_unreadable_stores_are_named(
        smoke_suite, tmp_path):
    bigger = {"workloads": [{"name": "essays", "n": 3, "form": "completion", "max_tokens": 32}]}
    store_cells(smoke_suite, "06_draft_schedule_under_load", lambda c: 100.0)
    store_cells(smoke_suite, "07_the_bill", lambda c: 120.0, overrides=bigger)
    reports = tmp_path / "reports"
    reports.mkdir()
    paths = [executed_with(reports, "06_draft_schedule_under_load", smoke_suite),
             executed_with(reports, "07_the_bill", smoke_suite, overrides=bigger)]
    assert arms_across.shared_arms([arms_across.notebook_cells(p) for p in paths]) == []
    orphan = reports / "03_target_precision.ipynb"
    nbformat.write(constructed_notebook("03_target_precision"), orphan)
    moved = executed_with(reports, "02_temperature_spread", smoke_suite)  # nothing stored
    html = arms_across.section([*paths, orphan, moved])
    assert "No arm was measured by more than one notebook" in html
    assert f"{orphan}: no papermill parameters" in html
    assert "02_temperature_spread.ipynb: no results store at" in html


def test_where_tested_gives_each_substrates_verdict_and_the_checks_it_tested():
    from specrepro.analysis.render import where_tested

    assert where_tested.substrate_cell({"status": "measured", "checks": ["✓", "–", "≈", "–"]}
                                       ) == "1 of 4 tested ✓–≈–"
    assert where_tested.substrate_cell(
        {"status": "measured", "checks": ["✗", "✓", "–"], "symbol": "✗",
         "outcome": "does not hold"}) == "✗ does not hold: 2 of 3 tested ✗✓–"
    assert where_tested.substrate_cell({"status": "measured", "checks": ["–", "≈"]}
                                       ) == "none of 2 tested –≈"
    assert where_tested.substrate_cell({"status": "not measured"}) == "not measured"
    assert where_tested.substrate_cell(None) == "not measured"
    # the stand-in suites: where stored, pending, or (excluded by both) why not theirs
    assert where_tested.standin_cell("01_drafter_block_sweep").startswith(
        "stored on h100-standin.yaml (replay: make all PARAMS=params/h100-standin.yaml)")
    assert where_tested.standin_cell("08_step_cost").startswith(
        "not a stand-in finding: it reads the stand-in's stored cells")
