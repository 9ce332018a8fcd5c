"""What a notebook displays: tables as HTML, figures saved and shown, the verdict line.

Design:
- Notebooks call these and nothing else to display, so every notebook looks the same and
  the HTML index can find what it needs in the executed notebook: the verdict and each
  figure are displayed with `specrepro` output metadata ({"verdict": ..., "holds": ...},
  {"figure": "<png path>"}), which `report.py` reads back. No side files.
- Tables are rendered from polars to a plain HTML table (numbers formatted to a few
  significant digits, nulls as an empty cell marked n/a), with a caption that says what
  the rows are and the units.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import polars as pl
from IPython.display import HTML, Image, Markdown, display

from specrepro.analysis import figures as figs
from specrepro.analysis.claims import Claims
from specrepro.analysis.finding import Finding
from specrepro.analysis.verdicts import Verdict


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return '<td class="na">n/a</td>'
    if isinstance(value, float):
        text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
        return f'<td style="text-align:right">{text}</td>'
    if isinstance(value, int) and not isinstance(value, bool):
        return f'<td style="text-align:right">{value:,}</td>'
    if isinstance(value, list):
        return "<td>" + ", ".join(f"{v:.2f}" if isinstance(v, float) else str(v)
                                  for v in value) + "</td>"
    return f"<td>{html.escape(str(value))}</td>"


def html_table(df: pl.DataFrame, caption: str = "") -> str:
    """A polars frame as an HTML table."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in df.columns)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in df.iter_rows())
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return (f'<table class="specrepro">{cap}<thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


def show_table(df: pl.DataFrame, caption: str = "") -> None:
    display(HTML(html_table(df, caption)))


def untestable(f: Finding, claims: Claims) -> list[tuple[str, str]]:
    """The article claims this run cannot test: on the embedded engine or the transformers
    peer, every listed claim, except those lifted by what was measured (power)."""
    if not set(f.engines) & {"embedded", "transformers"}:
        return []
    out = []
    for u in claims.cannot_test:
        if u.unless == "power" and f.has_power:
            continue
        out.append((u.claim, u.why))
    return out


def show_header(f: Finding, claims: Claims) -> None:
    """Title, the article's claim, where the data comes from, and what cannot be tested."""
    lines = [f"## {claims.title} (article {claims.article})", "",
             f"**The article's finding:** {claims.claim}", "",
             f"**Data:** {f.describe()}.", ""]
    note = claims.temperature_note(f.cells["temperature"].to_list())
    if note:
        lines += [f"**Temperature:** {note}. This suite measures at another temperature than "
                  "the article's (its parameters file says why); the tables and figures put "
                  f"the article's T={claims.published_temperature:g} values beside the "
                  "measured ones, labelled so.", ""]
    cant = untestable(f, claims)
    if cant:
        lines.append("**Not testable on this engine** (docs/design.md, \"What the embedded engine "
                     "can and cannot test\"):")
        lines += [f"- {claim}: {why}." for claim, why in cant]
    display(Markdown("\n".join(lines)))


def show_figure(fig, figures_dir: str | Path, notebook_id: str, name: str) -> list[Path]:
    """Save the figure as PNG and SVG under its stable name, display the PNG, close it."""
    paths = figs.save_figure(fig, figures_dir, notebook_id, name)
    figs.plt.close(fig)
    display(Image(filename=str(paths[0])),
            metadata={"specrepro": {"figure": str(paths[0])}})
    return paths


def show_verdict(v: Verdict) -> None:
    display(Markdown(f"**Verdict.** {v.text}"),
            metadata={"specrepro": {"verdict": v.text, "holds": v.holds}})


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
