"""What a notebook displays: the summary table, tables as HTML, figures saved and shown.

Design:
- Notebooks call these and nothing else to display, so every notebook looks the same and
  the HTML index can find what it needs in the executed notebook: the summary
  (analysis/render/summary.py) and each figure are displayed with `specrepro` output metadata
  ({"summary": {...}}, {"figure": "<png path>"}), which `report.py` reads back. No side files.
- Tables are rendered from polars to a plain HTML table (numbers in `tables.fmt`'s one
  format, nulls as an empty cell marked n/a, a measured figure with its spread as "mean
  (min-max, n=3)"), with a caption that says what the rows are and the units, and notes
  in the footer.
"""

from __future__ import annotations

import html
import math
import os
from pathlib import Path

import polars as pl
from IPython.display import HTML, Image, Markdown, display

import specrepro.analysis.figures as figs
from specrepro import probes
from specrepro.analysis.finding import engine_starts, tables, window_health
from specrepro.analysis.finding.finding import Finding, devices
from specrepro.analysis.render.substrates import compare, substrates_html
from specrepro.analysis.render.summary import summary as build_summary
from specrepro.analysis.render.summary import summary_html
from specrepro.analysis.verdict import host_bound
from specrepro.analysis.verdict.claims import Claims


def _cell(value) -> str:
    if isinstance(value, dict) and "mean" in value:
        return _spread_cell(value)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return '<td class="na">n/a</td>'
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f'<td style="text-align:right">{tables.fmt(value)}</td>'
    if isinstance(value, list):
        return "<td>" + ", ".join(f"{v:.2f}" if isinstance(v, float) else str(v)
                                  for v in value) + "</td>"
    return f'<td style="text-align:left">{html.escape(str(value))}</td>'


def _spread_cell(value: dict) -> str:
    """A `tables.spread_of` figure: "mean (min-max, n=3)"; "mean (n=1)" for one run (no
    spread to show); without "n" (the table has a runs column) just the range."""
    if value["mean"] is None:
        return '<td class="na">n/a</td>'
    lo, hi, n = value.get("min"), value.get("max"), value.get("n")
    extra = []
    if lo is not None and hi is not None and lo != hi:
        sep = "\u2013" if lo >= 0 else " to "  # "-24 to -19" reads better than "-24--19"
        extra.append(f"{tables.fmt(lo)}{sep}{tables.fmt(hi)}")
    if n is not None:
        extra.append(f"n={n}")
    text = tables.fmt(value["mean"]) + (f" ({', '.join(extra)})" if extra else "")
    if value.get("flag"):  # tables.flagged: loops, a window not steady: marked, never hidden
        text += f" [{value['flag']}]"
    return f'<td style="text-align:right;white-space:nowrap">{html.escape(text)}</td>'


def html_table(df: pl.DataFrame, caption: str = "", notes: tuple[str, ...] = ()) -> str:
    """A polars frame as an HTML table; `notes` go in its footer, one line each."""
    # words left, numbers right (nbconvert's style right-aligns every cell)
    head = "".join(f'<th style="text-align:{"left" if t == pl.String else "right"}">'
                   f"{html.escape(c)}</th>" for c, t in df.schema.items())
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in df.iter_rows())
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    foot = "".join(f'<tr><td colspan="{len(df.columns)}" class="note" '
                   f'style="font-size:85%;text-align:left">{html.escape(n)}</td></tr>'
                   for n in notes)
    return (f'<table class="specrepro">{cap}<thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody>" + (f"<tfoot>{foot}</tfoot>" if foot else "") + "</table>")


def show_table(table: pl.DataFrame | tables.Table | list, caption: str = "") -> None:
    """Display a frame (with `caption`), a `tables.Table`, or a list of either (the
    overlay's per-metric tables), each as its own HTML table."""
    for t in table if isinstance(table, list) else [table]:
        if isinstance(t, tables.Table):
            display(HTML(html_table(t.frame, t.caption, t.notes)))
        else:
            display(HTML(html_table(t, caption)))


def untestable(f: Finding, claims: Claims) -> list[tuple[str, str]]:
    """The article claims this run cannot test: on any engine, the speed, step and energy
    checks where an arm's device was below analysis/verdict/host_bound.py's busy threshold; on the
    embedded engine or the transformers peer, every listed claim, except those lifted by
    what was measured (power) and those said only of another device (`device: cpu | cuda`
    against where the arms ran)."""
    out = []
    slow = host_bound.host_bound_arms(f)
    if slow:
        arms = ", ".join(f"{arm} ({b.text()})" for arm, b in slow)
        out.append(("speed, step time and energy (every check of throughput, step or joules)",
                    (f"host-bound: below {host_bound.THRESHOLD:.0%} busy the step is timed on "
                     f"the engine's host code, not on the weight read the articles describe; "
                     f"{arms}")))
    if not set(f.engines) & {"embedded", "transformers"}:
        return out
    where = devices(f.study)
    for u in claims.cannot_test:
        if u.unless == "power" and f.has_power:
            continue
        if u.device is not None and u.device not in where:
            continue
        out.append((u.claim, u.why))
    return out


def show_header(f: Finding, claims: Claims) -> None:
    """Where the data comes from, the temperatures compared, what cannot be tested, the
    warnings every cell carries (a cell's own are marked in the tables, window_health.py),
    the probes' answers and how each arm's engine started."""
    # the article's finding and the substrate line open the summary above (show_summary)
    lines = [f"**Data:** {f.describe()}.", ""]
    note = claims.temperature_note(f.cells["temperature"].to_list())
    if note:
        lines += [(f"**Temperature:** {note}. This suite measures at another temperature than "
                   "the article's (its parameters file says why); the tables and figures put "
                   f"the article's T={claims.published_temperature:g} values beside the "
                   "measured ones, labelled so."), ""]
    cant = untestable(f, claims)
    if cant:
        lines.append("**Not testable on this substrate** (docs/design.md, \"What the embedded "
                     "engine can and cannot test\"; analysis/verdict/host_bound.py):")
        lines += [f"- {claim}: {why}." for claim, why in cant]
    every = window_health.common_warnings(f.cells)
    if every:
        lines += ["", ("**Warnings every cell carries** (a cell's own are marked in the "
                       "tables, with their text under them):")]
        lines += [f"- {w}" for w in every]
    display(Markdown("\n".join(lines)))
    if f.study.probes:
        show_table(probes.answers(f.study, f.manifest, os.path.relpath(f.suite.path)),
                   "Probes: questions one engine start answers, declared with the study "
                   "(`specrepro probe`); the latest answer for each, and where it comes from")
    started = engine_starts.starts(f.study, f.manifest)
    if started.height:
        show_table(started, engine_starts.CAPTION)


def show_figure(fig, figures_dir: str | Path, notebook_id: str, name: str) -> list[Path]:
    """Save the figure as PNG and SVG under its stable name, display the PNG, close it."""
    paths = figs.save_figure(fig, figures_dir, notebook_id, name)
    figs.plt.close(fig)
    display(Image(filename=str(paths[0])),
            metadata={"specrepro": {"figure": str(paths[0])}})
    return paths


def show_summary(f: Finding, claims: Claims) -> dict:
    """The report's first table (analysis/render/summary.py), with its data as output metadata for
    the index."""
    s = build_summary(f, claims)
    display(HTML(summary_html(s)), metadata={"specrepro": {"summary": s}})
    return s


def show_substrates(f: Finding, claims: Claims) -> dict:
    """The article's checks on every substrate with stored results (analysis/render/substrates.py),
    replayed from each suite's store, and what the difference teaches; its data as output
    metadata for the index. The reader's report shows it right after the summary."""
    cmp = compare(f.notebook_id, claims)
    data = cmp.as_dict()
    display(HTML(substrates_html(cmp, str(f.suite.path))),
            metadata={"specrepro": {"substrates": data}})
    return data


def show_step_cost(f: Finding, claims: Claims) -> None:
    """The finding's published speeds beside the step-cost model's figures for the article's
    box and the stand-in's card (analysis/step_cost/view.py), or a line saying there are
    none to set side by side."""
    from specrepro.analysis.step_cost.view import speed_rows

    table = speed_rows(list(claims.arms.values()))
    if table.frame.height:
        show_table(table)
    else:
        display(Markdown("**Step cost:** no published speed of this finding's article arms is "
                         "covered by the step-cost model (notebook 08 lists why)."))


def show_power_note(f: Finding) -> None:
    """Where the watts come from, or that this run had no power source (never zeros)."""
    if f.has_power:
        text = ("**Power:** board power sampled through NVML during each cell; tokens per "
                "joule = output tokens / energy.")
    else:
        notes = [s.get("power_note") for s in f.manifest.get("sessions", []) if s.get("power_note")]
        why = f" ({notes[-1]})" if notes else ""
        text = ("**No power source on this run**" + why + ": there is no NVIDIA GPU for NVML "
                "to read, so watts and tokens per joule are not shown rather than shown as zero.")
    display(Markdown(text))
