"""Analysis: a finding's stored results as tables, figures, the published overlay, gates
and its verdict (a summary table of checks); the notebook runner and the HTML index.

Design:
- Analysis reads results tables only; it never talks to an engine nor imports the harness.
  Measuring is `specrepro.pipeline`'s: `pipeline.load_finding` replays the store or hands
  the study to the harness's runner first, and returns a `Finding` of this package.
- Notebooks import this package and `specrepro.pipeline` and call the names below; no
  logic lives in a cell.
- Modules: `finding` (a finding's study and stored cells), `tables`, `overlay` (published
  beside measured), `gates`, `verdicts`, `figures` (by finding in `figures_sweep`,
  `figures_pairs`, `figures_load`, on `figures_common`), `show` (display helpers), `claims`
  (per-notebook data), `rules` (verdict rules as data), `summary` (a report's first
  table), `notebooks` (papermill runner), `report` (HTML index, `specrepro report`),
  `arms_across` (the arms several notebooks measured at the same settings).
"""

from specrepro.analysis import figures, tables
from specrepro.analysis.claims import Claims, claims_for
from specrepro.analysis.finding import Finding, at_project_root
from specrepro.analysis.gates import evaluate_gates
from specrepro.analysis.overlay import overlay, overlay_tables, published_points
from specrepro.analysis.show import (
    html_table,
    show_figure,
    show_header,
    show_power_note,
    show_summary,
    show_table,
    untestable,
)
from specrepro.analysis.verdicts import Verdict, verdict

__all__ = [
    "Claims", "Finding", "Verdict", "at_project_root", "claims_for", "evaluate_gates",
    "figures", "html_table", "overlay", "overlay_tables", "published_points", "show_figure",
    "show_header", "show_power_note", "show_summary", "show_table", "tables", "untestable", "verdict",
]
