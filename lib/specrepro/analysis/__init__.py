"""Analysis: a finding's stored results as tables, figures, the published overlay, gates
and its verdict (a summary table of checks); the notebook runner and the HTML index.

Design:
- Analysis reads results tables only; it never talks to an engine nor imports the harness.
  Measuring is `specrepro.pipeline`'s: `pipeline.load_finding` replays the store or hands
  the study to the harness's runner first, and returns a `Finding` of this package.
- Notebooks import this package and `specrepro.pipeline` and call the names below; no
  logic lives in a cell.
- Modules: `finding` (a finding's study and stored cells), `cell_key` (the columns that
  identify a cell), `tables`, `overlay` (published beside measured), `gates`, `verdicts`
  (on `check_sides`: what each side of a check reads), `figures` (by finding in `figures_sweep`,
  `figures_pairs`, `figures_load`, on `figures_common`), `show` (display helpers), `claims`
  (per-notebook data), `rules` (verdict rules as data), `summary` (a report's first
  table), `substrates` (its checks on every suite with stored results, beside each other), `notebooks` (papermill runner), `report` (HTML index, `specrepro report`),
  `arms_across` (the arms several notebooks measured at the same settings), `step_cost*`
  (a decode step's cost from bytes and math on each card, checked on the stand-in
  and on the articles; notebook 08).
"""

import importlib

from specrepro.analysis import tables
from specrepro.analysis.claims import Claims, claims_for
from specrepro.analysis.finding import Finding, at_project_root
from specrepro.analysis.gates import evaluate_gates
from specrepro.analysis.overlay import overlay, overlay_tables, published_points
from specrepro.analysis.verdicts import Verdict, verdict

# Drawing and display (matplotlib, seaborn, IPython: ~2 s to import) load on first use, so a
# process that only runs notebooks or writes the index (`specrepro.analysis.notebooks`,
# `report`) does not pay for them; a notebook's first `sa.figures` / `sa.show_*` does.
_LAZY = {"figures": ("specrepro.analysis.figures", None),
         **{name: ("specrepro.analysis.show", name) for name in (
             "html_table", "show_figure", "show_header", "show_power_note", "show_substrates",
             "show_step_cost", "show_summary", "show_table", "untestable")},
         # notebook 08's tables and figure (the step-cost model)
         "step_cost_view": ("specrepro.analysis.step_cost_view", "step_cost_view")}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'specrepro.analysis' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = importlib.import_module(module)
    value = value if attr is None else getattr(value, attr)
    globals()[name] = value
    return value


__all__ = [
    "Claims", "Finding", "Verdict", "at_project_root", "claims_for", "evaluate_gates",
    "figures", "html_table", "overlay", "overlay_tables", "published_points", "show_figure",
    "show_header", "show_power_note", "show_step_cost", "show_substrates", "show_summary",
    "show_table", "step_cost_view", "tables", "untestable", "verdict",
]
