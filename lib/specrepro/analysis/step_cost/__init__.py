"""The step-cost model: a decode step's cost from bytes and math on each card, checked on the
stand-in's cells and on the articles' own boxes (notebook 08).

Design:
- Reads the data a finding reads (`specrepro.analysis.finding`), the verdict's mechanism
  bounds (`verdict.mechanism`: the busy share a warm step needs) and the figures' shared
  pieces (`figures.common`, for the roofline); the rendering reads it (the summary's floor
  sentence, notebook 08's view). Nothing in the verdict or the figures imports it.
- Modules: `model` (a step's time from the bytes it reads and the math it does), `data`
  (cards and models as validated records, each value with its source: `cards.yaml`,
  `models.yaml`), `cells` (the stand-in's stored speed cells as one table; where they are:
  `check.yaml`), `check` (overheads fitted, every cell predicted), `articles` (the model fed
  each article's own box), `suite` (a suite's own cells and its floor line), `report` (the
  tables for readers), `roofline` (notebook 08's figure) and `view` (notebook 08's tables
  and figure, built once; `sa.step_cost_view`).
- Nothing is re-exported here: `model` is imported as `sc` by the modules that use it.
"""
