"""Analysis: a finding's stored results as tables, figures, the published overlay, gates
and its verdict (a summary table of checks); the notebook runner and the HTML index.

Design:
- Analysis reads results tables only; it never talks to an engine nor imports the harness.
  Measuring is `specrepro.pipeline`'s: `pipeline.load_finding` replays the store or hands
  the study to the harness's runner first, and returns a `Finding` of this package.
- Notebooks import this package and `specrepro.pipeline` and call the names below; no
  logic lives in a cell.
- One subpackage per concern, so the room a change belongs in shows in the tree; each
  `__init__.py` says what it offers. Layered, an arrow only upwards (tests/test_boundaries.py):
  - `finding`: the data a finding reads: its study and stored cells (`finding.finding`), the
    cell's key, tables, window and text marks, arms across notebooks, engine starts, probes,
    engines side by side (parity, peer table, near-ties);
  - `verdict` (reads finding): claims (each finding's claims.yaml), rules, noise, the
    published overlay, gates, each check's sides, mechanisms (mechanisms.yaml), how busy
    the device was, and the verdict;
  - `figures` (reads finding, verdict): the notebooks' figures, `sa.figures`;
  - `step_cost` (reads finding, verdict's mechanism bounds, figures' shared pieces): a decode
    step's cost from bytes and math on each card, checked on the stand-in and on the
    articles, and notebook 08's view and roofline;
  - `render` (reads all): the display helpers (`sa.show_*`), a report's first table, the
    substrates side by side, the papermill runner
    (`python -m specrepro.analysis.render.notebooks`) and the HTML index (`specrepro report`).
"""

import importlib

from specrepro.analysis.finding import tables
from specrepro.analysis.finding.finding import Finding, at_project_root
from specrepro.analysis.verdict.claims import Claims, claims_for
from specrepro.analysis.verdict.gates import evaluate_gates
from specrepro.analysis.verdict.overlay import overlay, overlay_tables, published_points
from specrepro.analysis.verdict.verdicts import Verdict, verdict

# Drawing and display (matplotlib, seaborn, IPython: ~2 s to import) load on first use, so a
# process that only runs notebooks or writes the index (`specrepro.analysis.render.notebooks`,
# `report`) does not pay for them; a notebook's first `sa.figures` / `sa.show_*` does.
_LAZY = {"figures": ("specrepro.analysis.figures", None),
         **{name: ("specrepro.analysis.render.show", name) for name in (
             "html_table", "show_figure", "show_header", "show_power_note", "show_substrates",
             "show_step_cost", "show_summary", "show_table", "untestable")},
         # notebook 08's tables and figure (the step-cost model)
         "step_cost_view": ("specrepro.analysis.step_cost.view", "step_cost_view")}


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
