"""The notebooks' figures: measured beside published, every repeat shown, units on axes.

Design:
- One function per figure, taking a `Finding` (and the claims), returning a matplotlib
  Figure; `save_figure` writes it to `<figures_dir>/<notebook>__<name>.png` and `.svg`.
  The figures live by finding: `sweep` (01, 02), `pairs` (03, 04, 05), `load` (06, 07), on
  `common` (series styles, spread, legend, axes), with `marks` (data a verdict did not test,
  drawn marked) and `checks` (what a reviewer sees wrong in a drawn figure, measured); this
  package's face is the one notebooks (`sa.figures`) and `show` call. Notebook 08's roofline
  is the step-cost model's (analysis/step_cost/roofline.py, on `common`).
- Layer: reads the data a finding reads and the verdict (`marks` draws untested data as the
  verdict found it); never the step-cost model nor the rendering, which read it.
- Absolute speeds are not comparable across hardware (a 27B target on a GB10 against a
  12M one on a CPU), so tok/s (and step time) is drawn in two panels, measured and article,
  and the shapes that do carry over (gains in %, tokens per step, acceptance by position,
  ratios) share one axis with the article's values marked (black-edged hollow diamonds,
  labelled "article"), at the temperature the overlay compares.
- Every run is a dot; lines and bars are means over repeats with min-max error bars where
  there are two runs or more, and each figure's title says what the bars are (n=1: none).
- Each arm has one colour (Okabe-Ito), marker and line style in every panel; one legend
  sits below the panels, never over data.
- Stable output: fixed names, `svg.hashsalt`, no dates or software tags in the metadata,
  text kept as text in SVG, fixed size and DPI, so an unchanged result rewrites the same files.
"""

from __future__ import annotations

from pathlib import Path

import seaborn as sns

from specrepro.analysis.figures import checks as figure_checks
from specrepro.analysis.figures.common import PALETTE, fit_text, palette, plt, series, styles
from specrepro.analysis.figures.load import bill_chart, load_sweep
from specrepro.analysis.figures.pairs import acceptance_pairs, gate_chart
from specrepro.analysis.figures.sweep import (
    acceptance_by_arm,
    block_sweep_speed,
    step_time,
    temperature_runs,
)

DPI = 110

__all__ = [
    "DPI", "PALETTE", "acceptance_by_arm", "acceptance_pairs", "bill_chart",
    "block_sweep_speed", "gate_chart", "load_sweep", "palette", "plt", "save_figure",
    "series", "step_time", "style", "styles", "temperature_runs",
]


def style() -> None:
    """The house style, and the settings that make SVG output byte-stable."""
    sns.set_theme(style="whitegrid", context="notebook", font_scale=0.9)
    plt.rcParams.update({"svg.hashsalt": "specrepro", "svg.fonttype": "none",
                         "figure.dpi": DPI, "savefig.dpi": DPI,
                         "figure.constrained_layout.use": True,
                         "axes.prop_cycle": plt.cycler(color=PALETTE)})


class FigureProblems(ValueError):
    """A figure a reviewer would see wrong (figure_checks), named with its file."""


def save_figure(fig: plt.Figure, figures_dir: str | Path, notebook_id: str, name: str
                ) -> list[Path]:
    """Write <notebook>__<name>.png and .svg; returns both paths. Then the figure is checked
    (figure_checks: text past the edge or over other text, a legend entry with nothing
    drawn, a line across a missing level): a fault raises FigureProblems naming the file, so
    `make all` never publishes a figure with one. Checked after writing, since a draw before
    `savefig` would move the constrained layout's last pixels."""
    out = Path(figures_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{notebook_id}__{name}"
    png, svg = stem.with_suffix(".png"), stem.with_suffix(".svg")
    fit_text(fig)
    fig.savefig(png, metadata={"Software": None})
    fig.savefig(svg, metadata={"Date": None, "Creator": None})
    found = figure_checks.problems(fig)
    if found:
        raise FigureProblems(f"{png}: " + "; ".join(found))
    return [png, svg]
