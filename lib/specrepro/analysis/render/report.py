"""The HTML index of executed notebooks: the findings' claims and their verdicts in one table,
the arms several notebooks measured, and each finding's figures.

Design:
- Reads the executed notebooks in the reports folder (`<nb>.ipynb`, papermill's output): the
  title from the first heading, the summary from the output whose `specrepro` metadata has
  `summary` (`show.show_summary`: claim, outcome, symbol, substrates, one check per claim
  with article and measured values, ratio, outcome and rule) and each figure from the
  outputs whose metadata has `figure` (`show.show_figure`).
- Self-contained: the folder can be shared alone. The reports embed their images (nbconvert,
  `notebooks.to_html`); the index writes each figure it shows under `<reports>/figures/`
  from the PNG the notebook displayed (the very image its report shows; the figures folder
  the notebook saved it to may lie elsewhere or be redrawn since), links only to files in
  the folder, and loads nothing from the network. PNGs left there by an earlier render and
  not shown now are removed, so the folder holds what the index shows.
- Every finding of the registry (`findings/findings.yaml`) has a row, in its order: one
  not executed (a suite that skips it, or not run yet), or executed without a summary (it
  failed before), says so instead of dropping out.
- The verdict is a word and a symbol; colour (colour-blind-safe backgrounds) only adds.
- What measured it: the substrate lines of the summaries (this run's engine and hardware,
  and each article's), the generation time, the commit, and the params file the notebooks
  ran.
- The claims on each substrate (`substrates_table`): one row per finding, one column per
  substrate of `substrates.SUITES` (the stand-in on the real engines, the small target on the
  real engines and on the embedded engine on the H200, the embedded engine on the CPU), each
  cell the finding's verdict there (symbol and word), its checks' symbols and how much was
  stored, and the line on what the difference teaches; read from the output metadata
  `substrates` (`show.show_substrates`). A table of its own rather than four more columns in
  the claims table: that table is already eight fixed columns of one row per check with long
  values, and four more would squeeze each to about 90 px at 1,400; a row per finding by four
  substrates reads at a glance, with room for the teaching lines.
- The same arm measured by several notebooks: `arms_across.section`.
- Every column a table shows is explained where it is read: a caption above the table with
  one note per column (`<span class="col-note" data-column=NAME>`, NAME the header's
  `data-column`), never only a tooltip; tests/test_report_render.py checks in the browser
  that each header has its visible note.
- `specrepro report [--reports-dir reports]` writes `<reports-dir>/index.html`.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import html
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from specrepro import findings, provenance
from specrepro.analysis.finding import arms_across
from specrepro.analysis.finding.finding import project_root
from specrepro.analysis.render import where_tested
from specrepro.analysis.render.substrates import SUITES

FIGURES = "figures"  # the index's figures, under the reports folder

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1340px; margin: 1.5em auto;
       padding: 0 1em; color: #222; line-height: 1.4; }
h1 { margin-bottom: .2em; }
p.meta { color: #444; margin: .2em 0; font-size: 14px; }
table.specrepro { border-collapse: collapse; margin: 1em 0; font-size: 13px; width: 100%; }
table.specrepro caption { text-align: left; font-size: 13px; color: #444; padding: .3em 0; }
table.specrepro th, table.specrepro td { border: 1px solid #ccc; padding: 4px 6px;
       vertical-align: top; text-align: left; overflow-wrap: break-word; }
table.specrepro th { background: #f2f2f2; }
table.specrepro td.num { text-align: right; white-space: nowrap; }
table.specrepro ul { margin: 0; padding-left: 1.1em; }
td.verdict, span.verdict { font-weight: 600; }
span.verdict { white-space: normal; overflow-wrap: break-word; }
table#summary { table-layout: fixed; }
td.check-outcome .word { font-weight: 600; }
[data-outcome="holds"] > td.verdict, span.verdict[data-outcome="holds"] { background: #d8ecf7; }
[data-outcome="holds in direction only"] > td.verdict,
  span.verdict[data-outcome="holds in direction only"] { background: #fbe9c8; }
[data-outcome="does not hold"] > td.verdict,
  span.verdict[data-outcome="does not hold"] { background: #f6d5c8; }
[data-outcome="holds in part"] > td.verdict,
  span.verdict[data-outcome="holds in part"] { background: #e8f2f8; }
[data-outcome="not resolvable here"] > td.verdict,
  span.verdict[data-outcome="not resolvable here"],
[data-outcome="not testable here"] > td.verdict, [data-outcome="missing"] > td.verdict,
  span.verdict[data-outcome="not testable here"], span.verdict[data-outcome="missing"]
  { background: #eee; }
span.verdict { padding: 1px 6px; font-size: 15px; }
table#substrates { table-layout: fixed; }
table#substrates td.verdict[data-outcome="holds"] { background: #d8ecf7; }
table#substrates td.verdict[data-outcome="holds in direction only"] { background: #fbe9c8; }
table#substrates td.verdict[data-outcome="does not hold"] { background: #f6d5c8; }
table#substrates td.verdict[data-outcome="not testable here"] { background: #eee; }
table#substrates td.verdict[data-outcome="not resolvable here"] { background: #eee; }
table#substrates td.verdict[data-outcome="holds in part"] { background: #e8f2f8; }
table#substrates td.verdict small { font-weight: normal; }
table#substrates td.na { color: #666; font-style: italic; }
tbody.finding { border-top: 2px solid #888; }
.finding-figures { border-top: 1px solid #ccc; padding: .8em 0; }
.figures figure { margin: .6em 0 1.2em; }
.figures img { display: block; max-width: 100%; height: auto; border: 1px solid #ddd; }
.figures figcaption { font-size: 13px; color: #555; }
.problems { color: #8a1c00; }
td.substitute { color: #555; font-style: italic; }
caption.column-notes { caption-side: top; text-align: left; font-size: 12.5px; color: #333;
       padding: .3em 0 .5em; line-height: 1.45; }
caption.column-notes .col-notes { columns: 2; column-gap: 2em; margin-top: .2em; }
caption.column-notes .col-note { display: block; break-inside: avoid; margin: 0 0 .15em; }
"""

MISSING = {"outcome": "missing", "symbol": "?"}  # a row whose notebook left no summary


@dataclass
class Report:
    """What the index shows of one executed notebook."""

    id: str
    title: str
    executed: Path | None  # None: the notebook was not executed into this folder
    summary: dict | None = None  # show.show_summary's metadata, None when it displayed none
    substrates: dict | None = None  # show.show_substrates's metadata, None when none
    figures: list[tuple[str, bytes | None, str]] = field(default_factory=list)
    # (file name, the PNG it displayed or None, the path it was saved to)
    params_file: str | None = None


def read_report(executed: Path) -> Report:
    """Title, summary, figures and params file of one executed notebook."""
    nb = nbformat.read(executed, as_version=4)
    rep = Report(executed.stem, executed.stem, executed)
    rep.params_file = nb.metadata.get("papermill", {}).get("parameters", {}).get("params_file")
    titled = False
    for cell in nb.cells:
        if cell.cell_type == "markdown" and not titled:
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    rep.title, titled = line[2:].strip(), True
                    break
        for out in cell.get("outputs", []):
            meta = out.get("metadata", {}).get("specrepro", {})
            if "summary" in meta and rep.summary is None:
                rep.summary = meta["summary"]
            if "substrates" in meta and rep.substrates is None:
                rep.substrates = meta["substrates"]
            if "figure" in meta:
                png = out.get("data", {}).get("image/png")
                data = base64.b64decode(png) if isinstance(png, str) else None
                rep.figures.append((Path(meta["figure"]).name, data, meta["figure"]))
    return rep


def write_figures(reports: list[Report], reports_dir: Path
                  ) -> dict[str, list[tuple[str, str | None, str]]]:
    """Each report's figures as PNGs under <reports_dir>/figures/; returns, per notebook, one
    (file name, link relative to the index or None, why it is not shown) per figure."""
    where = reports_dir / FIGURES
    where.mkdir(parents=True, exist_ok=True)
    written, links = set(), {}
    for rep in reports:
        links[rep.id] = []
        for name, data, saved in rep.figures:
            if data is None:  # displayed without its image (constructed notebooks): the file
                path = Path(saved) if Path(saved).is_absolute() else project_root() / saved
                data = path.read_bytes() if path.is_file() else None
            if data is None:
                why = f"the notebook displayed no image and {saved} does not exist"
                links[rep.id].append((name, None, why))
                continue
            (where / name).write_bytes(data)
            written.add(name)
            links[rep.id].append((name, f"{FIGURES}/{name}", ""))
    for stale in where.glob("*.png"):
        if stale.name not in written:
            stale.unlink()
    return links


def _verdict(summary: dict | None) -> tuple[str, str]:
    s = summary or MISSING
    word = "no summary" if s["outcome"] == "missing" else (s.get("text") or s["outcome"])
    return s["outcome"], f"{s['symbol']} {word}"


def _esc(value) -> str:
    return "" if value is None else html.escape(str(value))


def summary_rows(rep: Report) -> str:
    """One tbody per finding: its first row names it, gives the claim and the verdict (which
    span its checks), then one row per check."""
    outcome, verdict = _verdict(rep.summary)
    link = (f"<a href='{_esc(rep.id)}.html'>{_esc(rep.title)}</a>" if rep.executed
            else _esc(rep.title))
    if rep.summary is None:
        why = ("not executed into this folder" if rep.executed is None else
               "the notebook displayed no summary (it failed before it; see its report)")
        return (f"<tbody class='finding' data-notebook='{_esc(rep.id)}' "
                f"data-outcome='{outcome}'><tr class='finding' data-outcome='{outcome}'>"
                f"<td>{link}</td><td colspan='6'>{_esc(why)}</td>"
                f"<td class='verdict'>{_esc(verdict)}</td></tr></tbody>")
    s = rep.summary
    checks = s.get("checks") or [{}]
    span = f" rowspan='{len(checks)}'" if len(checks) > 1 else ""
    # a partial store (summary.partial) is said beside the claim, as in the report
    partial = (f"<br><small class='partial'><strong>{_esc(s['partial'])}.</strong></small>"
               if s.get("partial") else "")
    rows = []
    for i, c in enumerate(checks):
        ratio = c.get("ratio")
        # a substitute gate is this suite's own and does not decide the verdict (its claim
        # says so, summary.py); the row is set apart too
        sub = " class='substitute'" if c.get("substitute") else ""
        reason = f"<br><small>{_esc(c['reason'])}</small>" if c.get("reason") else ""
        check = (f"<td{sub}>{_esc(c.get('claim'))}</td><td>{_esc(c.get('article'))}</td>"
                 f"<td>{_esc(c.get('measured'))}</td>"
                 f"<td class='num'>{'' if ratio is None else f'{ratio:.2f}'}</td>"
                 f"<td class='check-outcome' title='{_esc(c.get('rule'))}'><span class='word'>"
                 f"{_esc(c.get('symbol'))}&nbsp;{_esc(c.get('outcome'))}</span>{reason}</td>")
        if i == 0:
            rows.append(f"<tr class='finding' data-outcome='{_esc(outcome)}'>"
                        f"<td{span}>{link}<br><small>article {_esc(s.get('article'))}</small></td>"
                        f"<td{span}>{_esc(s.get('claim'))}{partial}</td>{check}"
                        f"<td class='verdict'{span}>{_esc(verdict)}</td></tr>")
        else:
            rows.append(f"<tr class='check-more'>{check}</tr>")
    return (f"<tbody class='finding' data-notebook='{_esc(rep.id)}' "
            f"data-outcome='{_esc(outcome)}'>{''.join(rows)}</tbody>")


# The summary table's columns: header, width (%) and what the column holds. The widths are
# fixed, so a long measured value wraps in its own column instead of widening the table past
# the page; the notes stand in the caption above it (column_notes).
COLUMNS = (
    ("finding", 9, "the notebook (its link opens the report) and the article it re-measures"),
    ("the article's claim", 17, "the finding as the article states it"),
    ("check", 17, ("one measurable part of the claim; a substitute is this suite's own gate, "
                   "with its own rule, standing beside the article's and never deciding the "
                   "verdict")),
    ("article", 14, ("the article's figure for the check at the level and unit of the "
                     "measured one: the change between its two arms (their values; streams, "
                     "temperature), or its gate")),
    ("measured", 16, ("the same from this suite's stored cells: the change between the arms' "
                      "means (each arm's mean, its range over runs and the run count)")),
    ("measured ÷ article", 8, ("the measured effect divided by the article's: 1 as large, 0.5 "
                               "half, below 0 the other way; blank where the check sizes no "
                               "effect (a 'same' check, a gate, a figure not printed)")),
    ("check's outcome", 10, ("✓ holds, ◐ holds in direction only, ✗ does not hold, ≈ not "
                             "resolvable here (the noise is at least the article's effect), – "
                             "not testable here (the mechanism is absent), by the check's rule (its report's summary prints "
                             "it; here on hover), with what decided it")),
    ("verdict", 9, ("the finding's, judged over the article's checks only, with how many of "
                    "them were tested (◔ holds in part: every tested check holds, some were "
                    "not tested)")),
)


def column_notes(notes, caption: str = "") -> str:
    """A caption above a table: an optional sentence, then one visible note per column."""
    spans = "".join(f"<span class='col-note' data-column='{_esc(name)}'><b>{_esc(name)}</b>: "
                    f"{_esc(note)}</span>" for name, note in notes)
    lead = _esc(caption) if caption else ""
    return f"<caption class='column-notes'>{lead}<div class='col-notes'>{spans}</div></caption>"


def summary_table(reports: list[Report]) -> str:
    cols = "".join(f"<col style='width:{w}%'>" for _, w, _ in COLUMNS)
    head = "<thead><tr>" + "".join(f"<th data-column='{_esc(n)}'>{_esc(n)}</th>"
                                   for n, _, _ in COLUMNS) + "</tr></thead>"
    notes = column_notes([(n, note) for n, _, note in COLUMNS],
                         "One row per check of each finding; the columns:")
    return (f"<table id='summary' class='specrepro summary index'>{notes}<colgroup>{cols}"
            f"</colgroup>{head}" + "".join(summary_rows(r) for r in reports) + "</table>")


def _substrate_cell(sub: dict | None) -> str:
    if sub is None:
        return "<td class='na'>no substrate data</td>"
    if sub["status"] == "not measured":
        return f"<td class='na' title='{_esc(sub.get('why'))}'>not measured</td>"
    checks = " ".join(sub.get("checks") or [])
    return (f"<td class='verdict' data-outcome='{_esc(sub['outcome'])}'>"
            f"{_esc(sub['symbol'])}&nbsp;{_esc(sub.get('coverage') or sub['outcome'])}<br>"
            f"<small>checks {_esc(checks)}"
            f"; {_esc(sub['header'])}" + (f"; noise {_esc(sub['noise'])}" if sub.get("noise")
                                          else "")
            + (f"; {_esc(sub['busy'])}" if sub.get("busy") else "") + "</small></td>")


def substrates_table(reports: list[Report]) -> str:
    """The findings' claims × the substrates: verdict symbols and the teaching line per finding."""
    width = 14
    cols = ("<col style='width:12%'>" + f"<col style='width:{width}%'>" * len(SUITES)
            + f"<col style='width:{88 - width * len(SUITES)}%'>")
    head = ("<tr><th data-column='finding'>finding</th>" + "".join(
        f"<th data-column='each substrate'>{_esc(r.role)}<br><small>{_esc(r.params)}</small>"
        "</th>" for r in SUITES)
        + "<th data-column='what the difference teaches'>what the difference between the "
        "substrates teaches</th></tr>")
    notes = column_notes([
        ("finding", "the notebook; its link opens the report"),
        ("each substrate", ("one suite's stored results (its params file under the name): "
                            "the finding's verdict there, its checks' symbols in the order of "
                            "the table above, how many cells were stored, the widest noise band "
                            "its checks met (run-to-run spread or A/A difference: a difference "
                            "inside it is a tie) and how busy its device was (under 70 %, speed "
                            "checks are host-bound), or 'not measured'")),
        ("what the difference teaches", ("which checks change verdict between substrates, "
                                         "with each one's effect"))])
    rows = []
    for rep in reports:
        link = (f"<a href='{_esc(rep.id)}.html'>{_esc(rep.title)}</a>" if rep.executed
                else _esc(rep.title))
        data = rep.substrates or {}
        by = {d["params"]: d for d in data.get("substrates", [])}
        cells = "".join(_substrate_cell(by.get(r.params) if data else None) for r in SUITES)
        teach = data.get("teaching") or ("the notebook displayed no substrates table"
                                         if rep.executed else "not executed into this folder")
        rows.append(f"<tr data-notebook='{_esc(rep.id)}'><td>{link}</td>{cells}"
                    f"<td class='teaching'><small>{_esc(teach)}</small></td></tr>")
    return ("<h2 id='claims-on-substrates'>The claims on each substrate</h2>"
            "<p class='meta'>Each suite's stored results replayed and judged by the same "
            "rules; a substrate with nothing stored for a finding says so, never a number. "
            "Each report's second table gives the checks one by one.</p>"
            f"<table id='substrates' class='specrepro substrates index'>{notes}<colgroup>{cols}"
            f"</colgroup><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>")


def meta_lines(reports: list[Report], generated: dt.datetime, git: dict) -> str:
    """What measured the findings, what the articles measured on, and when, from what."""
    lines = []
    substrates: dict[str, list[str]] = {}
    articles: dict[str, str] = {}
    for r in reports:
        if r.summary:
            substrates.setdefault(r.summary.get("substrate") or "not recorded", []).append(r.id[:2])
            if r.summary.get("article"):
                articles.setdefault(r.summary["article"], r.summary.get("article_substrate") or "")
    for sub, ids in substrates.items():
        which = "" if len(substrates) == 1 else f" (notebooks {', '.join(ids)})"
        lines.append(f"<p class='meta substrate'><b>Measured on:</b> {_esc(sub)}{_esc(which)}</p>")
    for art in sorted(articles):
        lines.append(f"<p class='meta'><b>Article {_esc(art)} measured on:</b> "
                     f"{_esc(articles[art])}</p>")
    commit = (git.get("commit") or "")[:12] or "no commit"
    dirty = " with uncommitted changes" if git.get("dirty") else ""
    params = sorted({r.params_file for r in reports if r.params_file})
    lines.append(f"<p class='meta generated'><b>Generated</b> "
                 f"{generated:%Y-%m-%d %H:%M} UTC from commit {_esc(commit)}{dirty}"
                 + (f"; params {_esc(', '.join(params))}" if params else "") + "</p>")
    return "\n".join(lines)


def figure_sections(reports: list[Report],
                    links: dict[str, list[tuple[str, str | None, str]]]) -> str:
    parts = ["<h2 id='figures'>The figures, per finding</h2>"]
    for r in reports:
        outcome, verdict = _verdict(r.summary)
        title = (f"<a href='{_esc(r.id)}.html'>{_esc(r.title)}</a>" if r.executed
                 else _esc(r.title))
        parts.append(f"<section class='finding-figures' id='{_esc(r.id)}'><h3>{title} "
                     f"<span class='verdict' data-outcome='{_esc(outcome)}'>{_esc(verdict)}"
                     "</span></h3><div class='figures'>")
        for name, link, why in links.get(r.id, []):
            if link is None:
                parts.append(f"<p class='problems'>{_esc(name)}: {_esc(why)}</p>")
                continue
            caption = name.removesuffix(".png").split("__")[-1].replace("_", " ")
            parts.append(f"<figure><a href='{_esc(link)}'><img src='{_esc(link)}' "
                         f"alt='{_esc(r.title)}: {_esc(caption)}'></a>"
                         f"<figcaption>{_esc(caption)}</figcaption></figure>")
        if not links.get(r.id):
            parts.append("<p>No figure.</p>")
        parts.append("</div></section>")
    return "\n".join(parts)


LEGEND = ("<p class='meta'>Verdicts: ✓ holds · ◔ holds in part (every tested check holds, "
          "some were not tested) · ◐ holds in direction only · ✗ does not hold · ≈ not "
          "resolvable here (the noise is at least the article's effect) · – not testable here "
          "(the substrate lacks the mechanism). Each check's rule is in its report's summary (and in the "
          "tooltip of its outcome here); a substitute gate's own rule is in its check.</p>")


def render_index(reports: list[Report], links: dict[str, list[tuple[str, str | None, str]]],
                 shared: str, generated: dt.datetime, git: dict) -> str:
    return "\n".join([
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<title>specrepro: findings</title>", f"<style>{STYLE}</style></head><body>",
        "<h1>specrepro: the findings, re-measured</h1>",
        meta_lines(reports, generated, git),
        ("<p>One executed notebook per finding; each row's link opens its report. A verdict "
         "says whether the article's finding holds on the engine and hardware these results "
         "were measured on, by the rule its report prints beside it.</p>"),
        where_tested.table(reports), summary_table(reports), LEGEND, substrates_table(reports),
        shared,
        figure_sections(reports, links),
        "</body></html>"])


def write_index(reports_dir: Path | str = "reports") -> Path:
    """index.html (and its figures/) over the executed notebooks in the folder, a row for
    every finding of the registry, in its order."""
    reports_dir = Path(reports_dir)
    reports = []
    for nb in findings.IDS:
        executed = reports_dir / f"{nb}.ipynb"
        reports.append(read_report(executed) if executed.is_file() else Report(nb, nb, None))
    links = write_figures(reports, reports_dir)
    shared = arms_across.section([r.executed for r in reports if r.executed])
    generated = dt.datetime.now(dt.UTC)
    page = render_index(reports, links, shared, generated, provenance.git_state())
    out = reports_dir / "index.html"
    out.write_text(page, encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="specrepro report",
                                 description="write the HTML index of executed notebooks")
    ap.add_argument("--reports-dir", default="reports")
    args = ap.parse_args(argv)
    if not Path(args.reports_dir).is_dir():
        print(f"error: no reports folder at {args.reports_dir}; run `make all` first",
              file=sys.stderr)
        return 2
    print(write_index(args.reports_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
