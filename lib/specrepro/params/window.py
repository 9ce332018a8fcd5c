"""How a study times its multi-stream speed cells: the `window:` block of a study.

Design:
- A multi-stream speed cell is timed over a steady window of the engine's own counters
  (harness/steady.py says how, and why each default is what it is): the load starts, the
  window opens `skip_s` later but never before every stream has received a token (ramp-up
  excluded), stays open at least `window_s` and until every stream has completed
  `turnovers` requests inside it (at most `max_window_s`), and closes before any stream
  stops sending (drain excluded). Output caps are spread over
  `[cap * (1 - cap_spread), cap]` so the streams turn over at different steps.
- Which cells: those at `min_concurrency` streams or more, of the workloads listed (every
  workload where `workloads` is omitted), on an engine with counters (the in-process
  transformers peer has none and serves one request at a time: its cells send every prompt
  once). Every cell the window does not cover sends every prompt once (the window is the
  one way a cell is timed over a span; the fixed window, `mode: window`, is retired). A
  single-stream cell is left to that by default: one stream has no ramp-up across streams
  and no drain, n prompts turn it over n times, and each output is graded whole
  (`min_concurrency: 1` windows it too, as article A's one-stream windows did). A
  correctness cell (GSM8K counted "of 200") sends every prompt once too: list only the
  speed workloads.
- The defaults are sized for the articles' GPUs (article A read a 40-second counter window);
  a suite for a slower substrate overrides them (params/default.yaml: the CPU's). The timing
  fields (not the selectors) enter the identity of a windowed cell only
  (`identity.measurement`), so declaring a window re-measures exactly the cells it covers
  and leaves every other stored cell valid.
- `Study.interleave` says how repeats are interleaved across a study's arms (runner.py,
  harness/engine_pool.py): `restart` starts each arm's engine anew in every round (A B C,
  A B C: a repeat is a fresh engine start), `side_by_side` keeps every arm's engine up,
  each on its own port, idle while another arm's cells are timed; `auto` is side by side
  where no arm needs a GPU (an idle CPU engine holds memory only) and restart otherwise (a
  GPU engine takes the card's memory the next one needs); `one_start` measures every repeat
  of an arm on one engine start, back to back (A A A A, B B B B: a study whose repeats
  differ by their sampling seed, 02's temperature spread, where what varies run to run is
  the sampling and not the start; the suite's A/A twins measure what a start changes).
  How the machine was used, like
  `placement`: no part of a cell's identity; each cell records its `round` and `sequence`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from specrepro.params.engine_kinds import KINDS
from specrepro.params.strict import Strict

INTERLEAVE = ("auto", "restart", "side_by_side", "one_start")
Interleave = Literal["auto", "restart", "side_by_side", "one_start"]

# The fields that change what a windowed cell measures (identity.measurement); the
# selectors (`workloads`, `min_concurrency`) only choose the cells.
TIMING_FIELDS = ("skip_s", "window_s", "turnovers", "max_window_s", "cap_spread")


class Window(Strict):
    """The steady-state counter window of a study's multi-stream speed cells."""

    # Load start to the window's first scrape, at least (the window also waits for every
    # stream's first token). 10 s on a GPU: a new batch size's first steps (CUDA graphs,
    # allocator growth) fall before it; measured on SGLang, the first 8-stream cell after
    # a 1-stream one read 1,182 tok/s against 1,759-1,767 for the next three.
    skip_s: Annotated[float, Field(ge=0)] = 10.0
    # The window's shortest span: article A's 40-second counter window.
    window_s: Annotated[float, Field(gt=0)] = 40.0
    # Requests every stream completes inside the window before it closes: "every stream
    # turns over several times", so the window holds whole cycles of each stream's
    # prefill-decode-finish, not one request's.
    turnovers: Annotated[int, Field(ge=1)] = 3
    # The window closes here even where a stream has not turned over `turnovers` times
    # (the cell says so: window_turnovers_min and a warning).
    max_window_s: Annotated[float, Field(gt=0)] = 120.0
    # Output caps spread over [cap * (1 - cap_spread), cap], request by request: requests
    # that stop at their cap together would turn every stream over on the same step.
    cap_spread: Annotated[float, Field(ge=0, lt=1)] = 0.5
    # Cells at fewer streams send every prompt once (module docstring).
    min_concurrency: Annotated[int, Field(ge=1)] = 2
    # The speed workloads; None: every workload of the study.
    workloads: list[str] | None = None

    def timing(self) -> dict:
        """What of the window defines a windowed cell's measurement."""
        return self.model_dump(mode="json", include=set(TIMING_FIELDS))

    def covers(self, concurrency: int, workload: str, engine: str | None) -> bool:
        """Whether a cell at this many streams, of this workload, on this engine (None: the
        arm's profile not resolved yet) is timed in the window (module docstring)."""
        if concurrency < self.min_concurrency:
            return False
        if self.workloads is not None and workload not in self.workloads:
            return False
        return not KINDS[engine].in_process  # an in-process peer serves one request at a time

    def checks(self, workloads: list[str]) -> list[tuple[tuple, str]]:
        """Its workloads must be the study's (`workloads`); its longest span not below its
        shortest. Key paths start at the study (`window`, ...)."""
        out = []
        for i, name in enumerate(self.workloads or []):
            if name not in workloads:
                out.append((("window", "workloads", i),
                            (f"expected a workload of the study ({', '.join(workloads)}), "
                             f"found {name!r}")))
        if self.max_window_s < self.window_s:
            out.append((("window", "max_window_s"),
                        (f"expected at least window_s ({self.window_s:g}), "
                         f"found {self.max_window_s:g}")))
        return out
