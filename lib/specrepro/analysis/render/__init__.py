"""The rendering: what a notebook displays, the report's first table, the HTML index and the
notebook runner.

Design:
- The top of analysis: it may import every other analysis package, and none imports it.
  Importing it stays light (no matplotlib at import): `notebooks` and `report` run as
  processes that only execute notebooks or write the index; `show` loads the figures.
- Modules: `summary` (a report's first table: each check, the article beside the
  measurement, and the substrate line with the step-cost floor), `substrates` (a finding's
  checks on every suite with stored results, side by side), `show` (a notebook's display
  helpers: `sa.show_*`), `where_tested` (the index's first screen), `report` (the HTML index,
  `specrepro report`), `notebooks` (the papermill runner:
  `python -m specrepro.analysis.render.notebooks run ...`, the Makefile's RUN_NB).
- Nothing is re-exported here: `specrepro.analysis` offers the notebooks' names lazily.
"""
