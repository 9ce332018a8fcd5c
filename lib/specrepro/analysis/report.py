"""The HTML index of executed notebooks: each finding, its verdict and its figures.

Design:
- Reads only the executed notebooks in the reports folder (`<nb>.ipynb`, papermill's
  output): the title from the first heading, the verdict and each figure from the
  `specrepro` metadata that `show.show_verdict` / `show.show_figure` attach to outputs.
- Links are relative (the report page beside the index, each thumbnail to its PNG under
  the figures folder), so the folder can be opened from disk or served; a figure that no
  longer exists is left out rather than linked broken.
- `specrepro report [--reports-dir reports]` writes `<reports-dir>/index.html`.
"""

from __future__ import annotations

import argparse
import html
import os
import sys
from pathlib import Path

import nbformat

from specrepro.analysis.finding import project_root
from specrepro.params import NOTEBOOK_IDS

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }
.finding { border-top: 1px solid #ccc; padding: 1em 0; }
.holds { color: #176117; } .fails { color: #a11d1d; } .unknown { color: #666; }
.thumbs img { height: 150px; margin: 4px; border: 1px solid #ddd; }
"""


def read_report(executed: Path) -> dict:
    """Title, verdict, whether it holds, and figure paths of one executed notebook."""
    nb = nbformat.read(executed, as_version=4)
    title, verdict, holds, figures = executed.stem, None, None, []
    for cell in nb.cells:
        if cell.cell_type == "markdown" and title == executed.stem:
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    title = line[2:].strip()
                    break
        for out in cell.get("outputs", []):
            meta = out.get("metadata", {}).get("specrepro", {})
            if "verdict" in meta:
                verdict, holds = meta["verdict"], meta.get("holds")
            if "figure" in meta:
                figures.append(meta["figure"])
    return {"id": executed.stem, "title": title, "verdict": verdict, "holds": holds,
            "figures": figures}


def _figure_link(figure: str, reports_dir: Path) -> str | None:
    path = Path(figure)
    if not path.is_absolute():
        path = project_root() / path
    if not path.is_file():
        return None
    return os.path.relpath(path.resolve(), reports_dir.resolve())


def render_index(entries: list[dict], reports_dir: Path) -> str:
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
             "<title>specrepro: findings</title>", f"<style>{STYLE}</style></head><body>",
             "<h1>specrepro: the findings, re-measured</h1>",
             ("<p>One executed notebook per finding. Each verdict says whether the article's "
             "shape holds on the engine and card these results were measured on.</p>")]
    for e in entries:
        cls = {True: "holds", False: "fails"}.get(e["holds"], "unknown")
        verdict = html.escape(e["verdict"] or "no verdict (the notebook did not finish)")
        parts.append(f"<div class='finding'><h2><a href='{html.escape(e['id'])}.html'>"
                     f"{html.escape(e['title'])}</a></h2><p class='{cls}'>{verdict}</p>"
                     "<div class='thumbs'>")
        for fig in e["figures"]:
            link = _figure_link(fig, reports_dir)
            if link:
                link = html.escape(link)
                parts.append(f"<a href='{link}'><img src='{link}' alt='{link}'></a>")
        parts.append("</div></div>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_index(reports_dir: Path | str = "reports") -> Path:
    """index.html over every executed notebook in the folder, in the findings' order."""
    reports_dir = Path(reports_dir)
    executed = [reports_dir / f"{nb}.ipynb" for nb in NOTEBOOK_IDS
                if (reports_dir / f"{nb}.ipynb").is_file()]
    entries = [read_report(p) for p in executed]
    out = reports_dir / "index.html"
    out.write_text(render_index(entries, reports_dir), encoding="utf-8")
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
