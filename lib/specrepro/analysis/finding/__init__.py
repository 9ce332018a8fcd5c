"""The data a finding reads: its study and stored cells, and the tables drawn from them.

Design:
- The bottom of analysis: it reads the results store (`specrepro.store`) and the resolved
  params, and imports no other analysis package. The verdict judges what these modules
  read; figures, the step-cost model and the rendering show it.
- Modules: `finding` (a `Finding`: a notebook's resolved study, its stored `ok` cells and
  requests, the manifest; modes replay / run / auto), `cell_key` (the columns that identify
  a cell), `tables` (tidy tables of a finding's cells, one per view), `window_health` (the
  mark of a cell whose window was not healthy), `text_quality` (repetition, requests cut at
  the cap, the loop flag), `arms_across` (one arm measured by several notebooks),
  `engine_starts` (how each arm's engine started), `probes` (a study's probes and their
  answers), `acceptance_levels` (does acceptance change with the level), and the engines
  side by side: `parity` (acceptance parity, cell for cell), `peer_table` (the peer table),
  `near_ties` (where greedy outputs part on a near-tie).
- Nothing is re-exported here: callers import the module they read
  (`from specrepro.analysis.finding.finding import Finding`); `specrepro.analysis` offers the
  notebooks' names.
"""
