"""What a suite's numbers are measured on: the `substrate:` block of a suite file.

Design: a suite states, in words a reader checks against the card, the model's bytes and the
bytes a decode step reads against the card's bandwidth (`summary`, shown on the first screen
of every report), and, by engine, the device's busy share where it was measured outside the
cells (a profile of one decode window: `busy`). Cells measured since 2026-12-04 carry their
own `busy_share` (harness/power.py), which wins; the host-bound rule that reads both is
analysis/verdict/host_bound.py. `step_probe` names the file of an engine's step-stage probe
(scripts/bench_step_stages.py: a speculative step's verify, drafter pass and whole step in
one-token decodes, by drafter and draft length) on the suite's device: the weight-read
precondition (analysis/verdict/mechanism.py) reads it for an arm whose study has no
no-speculation arm to divide its step by. `card` and `target` name the step-cost model's
records of the suite's device and target (lib/specrepro/analysis/step_cost/cards.yaml and
step_cost/models.yaml): the substrate line then states the bandwidth floor against
the card's rated and measured bandwidth with every drafter's bytes (analysis/step_cost/model.py),
and notebook 08 places the suite's cells on the card's roofline. The engines `busy` and
`step_probe` may name are engine_kinds.MEASURING_NAMES (every engine that computes its own
tokens), not a list of their own. The names are checked where
they are read (params cannot import the analysis) and by tests/test_step_cost.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from specrepro.params.engine_kinds import MEASURING_NAMES
from specrepro.params.strict import Strict


class BusyShare(Strict):
    """How busy the device was while an engine decoded, measured outside the cells (a
    profile of one decode window), for stored cells that carry no `busy_share` of their own:
    the share (0-1) and the file in this repository that measured it."""

    share: float = Field(ge=0, le=1)
    source: str  # a file under the repository root (docs/bench/...)
    at: str = ""  # what was measured: arm, streams


class StepProbe(Strict):
    """An engine's step-stage probe on this suite's device: the file (under the repository
    root) whose last JSON line holds its rows, and which engine it measured."""

    engine: Literal[MEASURING_NAMES]  # type: ignore[valid-type]
    source: str


class Substrate(Strict):
    """What a suite's numbers are measured on, in the words the report's first screen shows
    (model bytes, bytes read per step against the card's bandwidth), and the busy shares
    measured outside the cells by engine (the host-bound rule: analysis/verdict/host_bound.py)."""

    summary: str
    busy: dict[Literal[MEASURING_NAMES], BusyShare] = Field(  # type: ignore[valid-type]
        default_factory=dict)
    step_probe: StepProbe | None = None
    card: str | None = None    # a card record of analysis/step_cost/cards.yaml
    target: str | None = None  # a model record of analysis/step_cost/models.yaml


