"""Every notebook executes under papermill on the smoke suite against the embedded server on
the tiny checkpoint, and `reports/index.html` and every report render in headless Chromium:
each report opens with its summary table (a verdict in every check's row), shows no code
input but papermill's parameters, loads every image and fits 1,400 px; the index has one row
per finding with a verdict and loads every image from the reports folder.

The checks run in the page (`CHECK_JS`, on load) on a copy of it in a temporary folder whose
`<base>` is the page's own folder, so relative images resolve as they do for a reader and
nothing is written beside the reports. `page_problems` returns what is wrong, in words; the
constructed-report tests show it finds a missing image, a visible code input, no summary and
an empty verdict. Chromium's tests are marked `chromium`: without it they skip, except under
CI=1 (`make test` sets it, and so .ci/run), where they fail."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import nbformat
import pytest
import yaml

from specrepro.analysis.render import notebooks, report
from specrepro.analysis.render.substrates import SUITES
from specrepro.analysis.verdict import rules
from specrepro.params import NOTEBOOK_IDS, load_suite
from test_report_index import constructed_notebook, reports_folder

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# a check's outcomes, and a finding's (which adds "holds in part": verdicts.FINDING_SYMBOLS)
OUTCOMES = (*rules.OUTCOMES, "holds in part")
# the coverage a verdict states wherever it appears (verdicts.coverage_text): how many of its
# checks were tested
COVERAGE = re.compile(r"holds on (all )?\d+ (of \d+ )?checks?|: \d+ of \d+ checks? tested|"
                      r"none of \d+ checks? tested|\(no checks\)")
WIDTH = 1400  # the reviewer's window


@pytest.fixture(scope="module")
def chromium():
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing and CI is set (`make test` sets CI=1; .ci/run "
                        "installs Debian's chromium): apt-get install -y chromium, or "
                        "`make test CI=` to skip the rendering tests")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    return CHROMIUM


# Runs on the page's load event and writes its findings as JSON into <pre id=...>, which
# --dump-dom prints. Code inputs: a code cell's input area (lab and classic templates) that
# is laid out and has text, papermill's injected parameters excepted.
CHECK_JS = """<script>
window.addEventListener('load', () => setTimeout(() => {
  const shown = el => el.getClientRects().length > 0 && getComputedStyle(el).visibility !== 'hidden';
  const text = el => (el ? el.textContent.trim() : null);
  const r = {};
  r.images = [...document.images].map(i => [(i.getAttribute('src') || '').slice(0, 80),
                                            i.complete && i.naturalWidth > 0]);
  const t = document.querySelector('table#summary');
  r.summary = t !== null;
  r.checks = t ? [...t.querySelectorAll('tr.check')].map(tr => text(tr.querySelector('td.verdict'))) : [];
  r.findings = t ? [...t.querySelectorAll('tr.finding')].map(tr => text(tr.querySelector('td.verdict'))) : [];
  r.summary_fits = t ? t.getBoundingClientRect().right <= window.innerWidth + 1 : null;
  const cells = [...document.querySelectorAll('.jp-Cell, .cell')];
  const title = cells.findIndex(c => c.querySelector('h1'));
  r.summary_after_title = t ? title >= 0 && title + 1 < cells.length && cells[title + 1].contains(t) : null;
  r.code = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-editor, .code_cell .input_area')]
    .filter(el => !el.closest('.celltag_injected-parameters') && shown(el) && text(el))
    .map(el => text(el).replace(/\\s+/g, ' ').slice(0, 80));
  r.injected = document.querySelectorAll('.celltag_injected-parameters .jp-InputArea').length;
  const sub = document.querySelector('table#substrates');
  r.substrates = sub ? {
    rows: [...sub.tBodies[0].rows].map(tr => [...tr.querySelectorAll('td.verdict, td.na')]
      .map(td => td.classList.contains('na') ? 'not measured' : (td.dataset.outcome || ''))),
    fits: sub.getBoundingClientRect().right <= window.innerWidth + 1} : null;
  // every column header and whether its note (a .col-note of the same data-column in the
  // table's caption) is laid out with text: [table id or class, column, shown]
  r.columns = [...document.querySelectorAll('table')].flatMap(tb => {
    const head = tb.tHead ? tb.tHead.rows[0] : null;
    if (!head) return [];
    const notes = [...tb.querySelectorAll('caption .col-note')];
    return [...head.cells].map(th => {
      const key = th.dataset.column || text(th);
      const note = notes.find(n => n.dataset.column === key);
      return [tb.id || tb.className, key, !!note && shown(note) && text(note).length > key.length + 2];
    });
  });
  // issue 30: every report opens with what its numbers are measured on, and its summary
  // shows the noise band each verdict had to clear
  const subs = [...document.querySelectorAll('p')].filter(
    p => shown(p) && /^Substrate:\\s*\\S/.test(text(p)) && text(p).length > 40);
  r.substrate_line = subs.length > 0;
  // on the first screen: above the summary table, not after it
  r.substrate_first = !!t && subs.some(
    p => p.compareDocumentPosition(t) & Node.DOCUMENT_POSITION_FOLLOWING);
  r.noise_column = t ? [...t.querySelectorAll('thead th')].some(th => /^Noise/.test(text(th))) : null;
  r.noise_cells = t ? [...t.querySelectorAll('tr.check')].map(tr => tr.querySelector('td.noise') !== null) : [];
  // issue 38: the verdict line states its coverage; the precondition the speed checks rest
  // on, with what was measured, is shown above the summary
  const vl = document.querySelector('p.verdict-line');
  r.verdict_line = vl && shown(vl) ? text(vl) : null;
  r.precondition = [...document.querySelectorAll('p')].some(
    p => shown(p) && /Precondition, .+ Measured, at each arm's lowest level: /.test(text(p)));
  // issue 42: the index opens with the stand-in suite's verdicts (where-tested's first
  // substrate column): its header and each finding's cell as shown
  const wt = document.querySelector('table#where-tested');
  r.where = wt && wt.tHead ? {head: [...wt.tHead.rows[0].cells].map(text),
    rows: [...wt.tBodies[0].rows].map(tr => [tr.dataset.notebook, ...[...tr.cells].slice(1).map(text)]),
    first: wt.compareDocumentPosition(document.querySelector('table#summary') || wt)
      & Node.DOCUMENT_POSITION_FOLLOWING ? true : false} : null;
  r.page_width = document.documentElement.scrollWidth;
  r.window_width = window.innerWidth;
  const out = document.createElement('pre');
  out.id = 'specrepro-check';
  out.textContent = 'RESULT:' + JSON.stringify(r) + ':END';
  document.body.appendChild(out);
}, 0));
</script>"""


def render_checked(page: Path, work: Path, chromium_path: str) -> dict:
    """CHECK_JS's findings on the page, rendered in headless Chromium at WIDTH px."""
    source = page.read_text(encoding="utf-8")
    head = source.find("<head")
    head_end = source.index(">", head) + 1 if head >= 0 else 0
    base = f'<base href="{page.parent.resolve().as_uri()}/">'
    body_end = source.rfind("</body>")
    body_end = body_end if body_end >= 0 else len(source)
    work.mkdir(parents=True, exist_ok=True)
    copy = work / f"checked_{page.name}"
    copy.write_text(source[:head_end] + base + source[head_end:body_end] + CHECK_JS
                    + source[body_end:], encoding="utf-8")
    argv = [chromium_path, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", f"--user-data-dir={work / 'profile'}",
            "--allow-file-access-from-files", f"--window-size={WIDTH},2000",
            "--virtual-time-budget=15000", "--dump-dom", copy.as_uri()]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{page}: chromium failed: {done.stderr[-2000:]}"
    marker = '<pre id="specrepro-check">RESULT:'  # the element CHECK_JS adds, not its source
    if marker not in done.stdout:
        raise AssertionError(f"{page}: the page's load event never ran the checks "
                             f"(dumped {len(done.stdout)} characters)")
    found = done.stdout.split(marker, 1)[1].split(":END</pre>", 1)[0]
    return json.loads(html.unescape(found))


def substrate_problems(name: str, found: dict | None) -> list[str]:
    """table#substrates as a reader sees it: one verdict (or 'not measured') per substrate of
    substrates.SUITES on every row, inside the window."""
    if found is None:
        return [f"{name}: no table#substrates"]
    problems = [] if found["rows"] else [f"{name}: table#substrates has no rows"]
    for i, row in enumerate(found["rows"]):
        if len(row) != len(SUITES):
            problems.append(f"{name}: table#substrates row {i + 1} shows {len(row)} "
                            f"substrates, expected {len(SUITES)}")
        problems += [f"{name}: table#substrates row {i + 1}, substrate {j + 1}: no verdict"
                     for j, v in enumerate(row) if v not in (*OUTCOMES, "not measured")]
    if not found["fits"]:
        problems.append(f"{name}: table#substrates is wider than {WIDTH} px")
    return problems


def where_problems(name: str, found: dict | None, verdicts: bool) -> list[str]:
    """The index's first table as a reader sees it: above the summary, the stand-in suite
    (substrates.SUITES[0]) as its first substrate column, and (verdicts=True: reports that
    replayed the committed stores) a verdict there for every finding whose stand-in store
    holds cells (the committed results decide which)."""
    if found is None:
        return [f"{name}: no table#where-tested"]
    problems = [] if found["first"] else [f"{name}: table#where-tested is not above table#summary"]
    if len(found["head"]) < 2 or found["head"][1] != SUITES[0].role:
        problems.append(f"{name}: table#where-tested's first substrate is "
                        f"{found['head'][1:2]}, expected {SUITES[0].role!r}")
    store = load_suite(ROOT / SUITES[0].params).results_path
    verdict = re.compile(rf"^\S+ ({'|'.join(map(re.escape, OUTCOMES))}): ")
    for nb, *cells in found["rows"] if verdicts else []:
        measured = any((store / nb).rglob("*.parquet"))
        if measured and not (cells and verdict.match(cells[0])):
            problems.append(f"{name}: table#where-tested, {nb}: no stand-in verdict "
                            f"(shows {cells[:1]})")
    return problems


def page_problems(page: Path, work: Path, chromium_path: str, *, index: bool = False,
                  rows: int = len(NOTEBOOK_IDS), substrates: bool = False) -> list[str]:
    """What a reviewer would find wrong with a report (or, index=True, the index), in words;
    substrates=True also reads its table#substrates."""
    r = render_checked(page, work, chromium_path)
    name = page.name
    problems = [f"{name}: image did not load: {src}" for src, ok in r["images"] if not ok]
    if substrates:
        problems += substrate_problems(name, r["substrates"])
    if not r["images"]:
        problems.append(f"{name}: shows no image")
    if not r["summary"]:
        return [*problems, f"{name}: no table#summary"]
    verdicts = r["findings"] if index else r["checks"]
    what = "tr.finding" if index else "tr.check"
    if not verdicts:
        problems.append(f"{name}: table#summary has no {what} row")
    for i, v in enumerate(verdicts):
        if not v or not any(o in v for o in OUTCOMES):
            problems.append(f"{name}: {what} {i + 1} has no verdict (td.verdict: {v!r})")
        elif index and not COVERAGE.search(v):
            problems.append(f"{name}: {what} {i + 1} does not say how many of its checks "
                            f"were tested (td.verdict: {v[:80]!r})")
    if index:  # every column a table shows has its note, visible, not only a tooltip
        problems += [f"{name}: column '{col}' of table {table!r} has no visible note"
                     for table, col, ok in r["columns"] if not ok]
        if not r["columns"]:
            problems.append(f"{name}: no table header found")
    if index:
        problems += where_problems(name, r["where"], substrates)
    if index and len(verdicts) != rows:
        problems.append(f"{name}: {len(verdicts)} findings in table#summary, expected {rows}")
    if not r["summary_fits"]:
        problems.append(f"{name}: table#summary is wider than {WIDTH} px")
    if r["page_width"] > r["window_width"]:
        problems.append(f"{name}: the page scrolls sideways ({r['page_width']} px wide)")
    if not index:
        if not r["substrate_line"]:
            problems.append(f"{name}: no substrate line (a shown 'Substrate: ...' paragraph)")
        elif not r["substrate_first"]:
            problems.append(f"{name}: the substrate line is not above table#summary")
        if not r["noise_column"]:
            problems.append(f"{name}: table#summary has no Noise column")
        problems += [f"{name}: tr.check {i + 1} has no td.noise"
                     for i, ok in enumerate(r["noise_cells"]) if not ok]
        problems += [f"{name}: code input shown: {c!r}" for c in r["code"]]
        if r["injected"] != 1:
            problems.append(f"{name}: papermill's parameters shown {r['injected']} times")
        if not r["summary_after_title"]:
            problems.append(f"{name}: table#summary is not right after the title")
        if not r["verdict_line"]:
            problems.append(f"{name}: no verdict line (p.verdict-line)")
        elif not COVERAGE.search(r["verdict_line"]):
            problems.append(f"{name}: the verdict line does not say how many of its checks "
                            f"were tested ({r['verdict_line'][:80]!r})")
        if not r["precondition"]:
            problems.append(f"{name}: no precondition line ('Precondition, ...: Measured, "
                            "at each arm's lowest level: ...')")
    return problems


# ------------------------------------------------------- constructed reports (no engine)


@pytest.mark.chromium
def test_the_browser_check_passes_a_good_report_and_names_what_is_wrong_in_bad_ones(
        chromium, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()

    def render(name, **kwargs) -> Path:
        path = reports / f"{name}.ipynb"
        nbformat.write(constructed_notebook("01_drafter_block_sweep", **kwargs), path)
        return notebooks.to_html(path)

    good = render("good")
    assert page_problems(good, tmp_path / "w", chromium) == []

    missing = reports / "missing_image.html"
    missing.write_text(good.read_text().replace(
        "<img ", "<img src='figures/not-there.png' data-x=", 1))
    assert page_problems(missing, tmp_path / "w", chromium) == [
        "missing_image.html: image did not load: figures/not-there.png"]

    bare = reports / "no_substrate_no_noise.html"  # issue 30: both are checked
    bare.write_text(good.read_text().replace("Substrate:", "Setup:", 1)
                    .replace("<th>Noise</th>", "<th>Spread</th>", 1))
    assert page_problems(bare, tmp_path / "w", chromium) == [
        "no_substrate_no_noise.html: no substrate line (a shown 'Substrate: ...' paragraph)",
        "no_substrate_no_noise.html: table#summary has no Noise column"]

    below = reports / "substrate_below.html"  # the line after the table: not first screen
    page = good.read_text()
    line = page[page.index('<p class="substrate-line">'):page.index('<table class="specrepro summary"')]
    below.write_text(page.replace(line, "", 1).replace("</table>", "</table>" + line, 1))
    assert page_problems(below, tmp_path / "w", chromium) == [
        "substrate_below.html: the substrate line is not above table#summary"]

    # issue 38: the verdict line says how many checks were tested, and the precondition the
    # speed checks rest on is shown; each missing is named
    page = good.read_text()
    line = page[page.index("Verdict: "):page.index("</strong>", page.index("Verdict: "))]
    bare = reports / "no_coverage.html"  # one page for both, one render
    bare.write_text(page.replace(line, "Verdict: ✓ holds", 1).replace("Precondition, ",
                                                                     "Assumed, ", 1))
    said = repr("Verdict: ✓ holds. The article's finding: the block drafter beats MTP at "
                "one stream."[:80])  # the problem quotes the line's first 80 characters
    assert page_problems(bare, tmp_path / "w", chromium) == [
        (f"no_coverage.html: the verdict line does not say how many of its checks were tested "
        f"({said})"),
        ("no_coverage.html: no precondition line ('Precondition, ...: Measured, at each "
        "arm's lowest level: ...')")]

    no_summary = render("no_summary", summary=False)
    assert page_problems(no_summary, tmp_path / "w", chromium) == [
        "no_summary.html: no table#summary"]

    empty = render("empty_verdicts", verdicts=False)
    assert page_problems(empty, tmp_path / "w", chromium) == [
        "empty_verdicts.html: tr.check 1 has no verdict (td.verdict: '')",
        "empty_verdicts.html: tr.check 2 has no verdict (td.verdict: '')"]

    # nbconvert without for_readers: every input shown, the defaults cell too
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter(template_name="lab").from_notebook_node(
        nbformat.read(reports / "good.ipynb", as_version=4))
    code = reports / "code_shown.html"
    code.write_text(body)
    found = page_problems(code, tmp_path / "w", chromium)
    assert "code_shown.html: code input shown: 'sa.show_table(cells) # CODE-CELL'" in found
    assert any("DEFAULTS-CELL" in p for p in found)
    assert "code_shown.html: table#summary is not right after the title" in found


@pytest.mark.chromium
def test_the_browser_check_of_the_index_counts_findings_and_loads_its_figures(
        chromium, tmp_path):
    reports = reports_folder(tmp_path, **{"07_the_bill": None})
    index = report.write_index(reports)
    assert page_problems(index, tmp_path / "w", chromium, index=True) == [
        "index.html: tr.finding 7 has no verdict (td.verdict: '? no summary')"]
    # a column whose note is gone, or hidden, is named
    page = index.read_text(encoding="utf-8")
    cut = page.replace("<span class='col-note' data-column='measured ÷ article'>",
                       "<span class='col-note' data-column='measured ÷ article' "
                       "style='display:none'>", 1)
    assert cut != page
    (reports / "hidden_note.html").write_text(cut, encoding="utf-8")
    assert "hidden_note.html: column 'measured ÷ article' of table 'summary' has no visible " \
        "note" in page_problems(reports / "hidden_note.html", tmp_path / "w", chromium, index=True)
    (reports / "figures" / "02_temperature_spread__throughput.png").unlink()
    assert "index.html: image did not load: figures/02_temperature_spread__throughput.png" in \
        page_problems(index, tmp_path / "w", chromium, index=True)


# --------------------------------------------------------- the smoke suite, executed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def smoke_suite_on(checkpoint: Path, where: Path) -> Path:
    """params/smoke.yaml with its profiles pointed at a checkpoint and its results in tmp:
    a copy of params/profiles whose model and drafter ids name the checkpoint, on a free port
    (a `make all` or `make serve` beside the tests holds the profiles' own, 8100)."""
    profiles = where / "profiles"
    profiles.mkdir()
    port = free_port()
    for path in (ROOT / "params" / "profiles").glob("*.yaml"):
        data = yaml.safe_load(path.read_text())
        for key in ("model", "drafter"):
            if isinstance(data.get(key), dict) and data[key].get("id") == "models/embedded":
                data[key]["id"] = str(checkpoint)
        if "port" in data:
            data["port"] = port
        (profiles / path.name).write_text(yaml.safe_dump(data, sort_keys=False))
    suite = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    suite.update(profiles=str(profiles), results_dir=str(where / "results"))
    path = where / "smoke.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def executed(tiny_checkpoint, tmp_path_factory, engine_exports):
    """Every notebook run once (mode auto: it measures), then the index; the build folders
    the committed GPU stores' profiles name are there first (conftest.engine_exports), as
    after `make all`, whichever test ran before."""
    where = tmp_path_factory.mktemp("smoke_notebooks")
    suite = smoke_suite_on(tiny_checkpoint, where)
    reports, figures = where / "reports", where / "figures"
    failures = {}
    for nb in NOTEBOOK_IDS:
        try:
            notebooks.run_notebook(nb, suite, reports_dir=reports, figures_dir=figures)
        except Exception as err:  # noqa: BLE001 - reported per notebook below
            failures[nb] = f"{type(err).__name__}: {err}"
    report.write_index(reports)
    return {"reports": reports, "figures": figures, "failures": failures, "suite": suite}


@pytest.mark.slow
@pytest.mark.parametrize("nb", NOTEBOOK_IDS)
def test_notebook_executes_on_the_smoke_suite(executed, nb):
    assert nb not in executed["failures"], executed["failures"].get(nb)
    entry = report.read_report(executed["reports"] / f"{nb}.ipynb")
    assert entry.summary, f"{nb} displayed no summary"
    assert entry.summary["outcome"] in OUTCOMES
    assert entry.summary["checks"] and all(c["outcome"] in OUTCOMES
                                           for c in entry.summary["checks"])
    assert entry.figures, f"{nb} wrote no figure"
    for _, data, saved in entry.figures:
        assert data, f"{nb} displayed {saved} without its image"
        assert Path(saved).is_file() and Path(saved).with_suffix(".svg").is_file()
    assert (executed["reports"] / f"{nb}.html").is_file()
    book = nbformat.read(executed["reports"] / f"{nb}.ipynb", as_version=4)
    errors = [o for c in book.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors


@pytest.mark.slow
def test_the_index_shows_arms_the_notebooks_share(executed):
    page = (executed["reports"] / "index.html").read_text()
    # the smoke suite measures no speculation on essays at one stream in 04, 06 and 07
    assert "The same arm in several reports" in page and "class='arm'" in page
    assert "stored cells could not be read" not in page


@pytest.mark.slow
def test_a_second_run_replays_without_measuring(executed, capfd):
    before = sorted(p.name for p in (executed["suite"].parent / "results").rglob("*.parquet"))
    notebooks.run_notebook("07_the_bill", executed["suite"], mode="replay",
                           reports_dir=executed["reports"], figures_dir=executed["figures"])
    after = sorted(p.name for p in (executed["suite"].parent / "results").rglob("*.parquet"))
    assert before == after
    # the kernel runs over IPC (notebooks.IPCKernelManager): no "TCP without encryption"
    # warning from ipykernel, and no socket file left beside the project
    assert "without encryption" not in capfd.readouterr().err
    assert not list(ROOT.glob("kernel-*")) and not list(ROOT.glob("127.0.0.1-*"))


@pytest.mark.slow
@pytest.mark.chromium
def test_index_and_every_report_pass_the_browser_check(executed, chromium, tmp_path):
    """Every report and the index, with the substrates table of each (the stand-in's H100
    store and the committed H200 and CPU stores, four substrates side by side) read in the
    browser as well."""
    reports = executed["reports"]
    problems = page_problems(reports / "index.html", tmp_path / "w", chromium, index=True,
                             substrates=True)
    for nb in NOTEBOOK_IDS:
        problems += page_problems(reports / f"{nb}.html", tmp_path / "w", chromium,
                                  substrates=True)
    assert not problems, "\n".join(problems)
    # the index opens with the stand-in's verdicts, and the check can fail: one taken out
    index = (reports / "index.html").read_text(encoding="utf-8")
    row = index.index("<tr data-notebook='01_drafter_block_sweep'>", index.index("where-tested"))
    cell = index.index("<td>", index.index("</td>", row)) + len("<td>")
    (reports / "no_standin.html").write_text(index[:cell] + "pending" + index[
        index.index("</td>", cell):], encoding="utf-8")
    found = page_problems(reports / "no_standin.html", tmp_path / "w", chromium, index=True,
                          substrates=True)
    assert "no_standin.html: table#where-tested, 01_drafter_block_sweep: no stand-in verdict " \
        "(shows ['pending'])" in found
    # the check can fail: the first substrate's verdict in the first row made unreadable
    page = (reports / "01_drafter_block_sweep.html").read_text(encoding="utf-8")
    first = page.index('<tr class="substrate-check">')  # as nbconvert writes it
    cut = page.index('data-outcome="', first)
    bad = reports / "bad_substrates.html"
    bad.write_text(page[:cut] + page[cut:].replace('data-outcome="', 'data-outcome="x', 1),
                   encoding="utf-8")
    found = page_problems(bad, tmp_path / "w", chromium, substrates=True)
    assert "bad_substrates.html: table#substrates row 1, substrate 1: no verdict" in found
