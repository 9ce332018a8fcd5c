"""The verdict: what each notebook claims, the rules that check it, and their outcome.

Design:
- Reads the data a finding reads (`specrepro.analysis.finding`) and the published tables;
  imports neither the figures, the step-cost model nor the rendering, which all read it.
- Modules, from the claim to its outcome: `claims` (claims.yaml, loaded and checked: what
  each notebook compares), `rules` (verdict rules as data), `noise` (a suite's own noise;
  a difference inside it is a tie), `overlay` (the article's value beside the measured
  one), `gates` (gates declared before the run, evaluated), `substitute_gates` (a suite's
  own gate beside the article's), `check_sides` (what each side of a check reads),
  `same_drafts` (did a changed drafter reach the engine), `mechanism` (mechanisms.yaml:
  what a check presupposes about the substrate, measured there), `host_bound` (how busy the
  device was; the substrate line, given the step-cost floor by its caller), and
  `verdicts` (a finding's verdict: each check evaluated, one outcome).
- Data files: each finding's `claims.yaml`, in its folder (`findings/<id>/`, read through
  specrepro/findings.py), and `mechanisms.yaml`, read beside its module
  (`importlib.resources`, this package).
- Nothing is re-exported here: callers import the module they read; `specrepro.analysis`
  offers the notebooks' names (`verdict`, `Verdict`, `claims_for`, `overlay_tables`, ...).
"""
