"""The index's first screen: where each finding can be tested, in one table.

Design:
- One row per finding, one column per stored substrate (analysis/render/substrates.py `SUITES`) and
  one for the stand-in suites, which measure the articles' mechanism (a target whose step is
  a weight read) and are the answer's home once measured.
- A substrate's cell is the finding's verdict there, then the checks it tested against those
  it could not: "✗ does not hold: 2 of 4 tested" with the checks' symbols, "none of 4
  tested" (every check not testable or not resolvable there), or "not measured". The
  stand-in suite is the first column, so the first screen opens with its verdicts. Verdicts
  and counts come from the reports' substrates metadata, the verdicts' own outcomes:
  nothing is judged here.
- A stand-in cell is "pending: not yet measured" where no suite of `STANDINS` stored anything
  for the finding, else which stored it (replayed by `make all PARAMS=<suite>`), or, where
  every stand-in suite excludes the finding, the suites' reason (08 reads their cells
  itself). A constant, as `SUITES` is: the stand-in suites are the project's, not
  discovered.
"""

from __future__ import annotations

import html
from pathlib import Path

from specrepro.analysis.finding.finding import project_root
from specrepro.analysis.render.substrates import SUITES
from specrepro.params import ParamsError, load_suite

STANDINS = ("params/h200-standin.yaml", "params/h100-standin.yaml")
UNTESTED_SYMBOLS = {"–", "≈"}  # rules.SYMBOLS of the outcomes that test nothing


def _e(x) -> str:
    return html.escape("" if x is None else str(x))


def substrate_cell(sub: dict | None) -> str:
    """'✗ does not hold: 2 of 4 tested ✓✗–≈', '– not testable here: none of 4 tested', or
    'not measured': the finding's verdict there, then how much of it was tested."""
    if sub is None or sub.get("status") == "not measured":
        return "not measured"
    marks = sub.get("checks") or []
    tested = sum(m not in UNTESTED_SYMBOLS for m in marks)
    head = f"{tested} of {len(marks)} tested" if tested else f"none of {len(marks)} tested"
    verdict = f"{sub.get('symbol') or ''} {sub.get('outcome') or ''}".strip()
    return (f"{verdict}: " if verdict else "") + f"{head} {''.join(marks)}".strip()


def standin_cell(notebook_id: str, root: Path | None = None) -> str:
    """Which stand-in suite stored results for the finding, that it is pending, or (every
    stand-in suite excludes it) why it is not a stand-in finding."""
    root = root or project_root()
    stored, excluded = [], []
    for params in STANDINS:
        try:
            suite = load_suite(root / params)
        except (ParamsError, OSError):
            continue
        if notebook_id in suite.excluded:
            excluded.append(" ".join(suite.excluded[notebook_id].split()))
            continue
        folder = suite.results_path / notebook_id
        if folder.is_dir() and any(folder.rglob("*.parquet")):
            stored.append(Path(params).name)
    if stored:
        return f"stored on {', '.join(stored)} (replay: make all PARAMS=params/{stored[0]})"
    if excluded and len(excluded) == len(STANDINS):
        return f"not a stand-in finding: {excluded[0]}"
    return "pending: not yet measured"


NOTES = (("finding", "the notebook"),
         ("substrate", ("one stored suite (analysis/render/substrates.py), the stand-in "
                        "first: the finding's verdict there, how many of its checks it tested, "
                        "and each check's symbol (– not testable here: the mechanism is "
                        "absent; ≈ not resolvable here: the noise is at least the article's "
                        "effect)")),
         ("stand-in", ("the stand-in suites (params/h200-standin.yaml, h100-standin.yaml), "
                       "whose target's step is a weight read: stored, or pending")))


def table(reports) -> str:
    """The first screen's table over the reports (analysis/render/report.py `Report`), each column
    with its note above it, as the index's other tables."""
    head = ("<tr><th data-column='finding'>finding</th>" + "".join(
        f"<th data-column='substrate'>{_e(r.role)}</th>" for r in SUITES)
        + "<th data-column='stand-in'>the stand-in suites</th></tr>")
    notes = "".join(f"<span class='col-note' data-column='{_e(n)}'><b>{_e(n)}</b>: "
                    f"{_e(note)}</span>" for n, note in NOTES)
    rows = []
    for rep in reports:
        data = rep.substrates or {}
        by = {d["params"]: d for d in data.get("substrates", [])}
        cells = "".join(f"<td>{_e(substrate_cell(by.get(r.params)))}</td>" for r in SUITES)
        rows.append(f"<tr data-notebook='{_e(rep.id)}'><td>{_e(rep.title)}</td>{cells}"
                    f"<td class='standin'>{_e(standin_cell(rep.id))}</td></tr>")
    return ("<h2 id='where'>Where each finding can be tested</h2>"
            "<table id='where-tested' class='specrepro where index'><caption class="
            "'column-notes'>Each finding's verdict on each substrate and how many of its "
            "checks were tested there; the stand-in comes first, because its target's step is a "
            "weight read, as the articles' 27B targets' is. The CPU "
            "suite cannot express the speed mechanism (a speculative step there costs more "
            "one-token decodes than the bound its reports print beside the articles') and the "
            "small target leaves the H200 mostly idle, so their speed checks read – not "
            "testable; the stand-in suites, whose step is a weight read, are where the speed "
            f"answer is.<div class='col-notes'>{notes}</div></caption><thead>" + head
            + "</thead><tbody>" + "".join(rows) + "</tbody></table>")
