"""What a suite declares for `specrepro plan`: the `plan:` block of a suite file.

Design:
- The planner (harness/plan.py) estimates device seconds from constants that are measured
  first (each engine start's `ready_s` and each cell's seconds, read back from the stores:
  harness/costs.py) and from the priors declared here second: what nothing stored gives (a
  machine's start, an engine bundle's staging, an export such as the stand-in's, the
  penalty of a first start on a fresh machine) and what stands in for a measurement until
  one exists (an engine's start, its one-stream step, its aggregate tok/s by streams, the
  speculative arms' speedup over no speculation). Every prior is a number with its
  `source` (a file of this repository, or words saying where it comes from); `placeholder:
  true` marks one that is a guess until measured, and the plan prints it as such.
- `order` is the order of value: each entry one command line (`specrepro run --notebook
  ... [--engine E] [--arm A ...]`), repeated until its cells are measured, the most
  valuable first. A notebook the order does not name comes after it, alone.
- The limits of the machines the plan splits the work over: a command's seconds
  (`command_s`, of which `command_reserve_s` after the run's deadline stop the engine,
  merge and archive) and a lease's (`lease_s`: one machine, one engine bundle).
- Checks here are the block's own (a reserve below the command's limit, a figure table
  with at least one level); that an order names the suite's notebooks is the suite's
  check (schema.Suite.cross_checks), located in the file like every params error.
"""

from __future__ import annotations

import itertools
import math
from typing import Annotated, Literal

from pydantic import Field

from specrepro.params.engine_kinds import ENGINE_NAMES
from specrepro.params.errors import Expect, one_of
from specrepro.params.strict import PositiveFloat, PositiveInt, Strict
from specrepro.params.study import WORKLOADS

NonNegFloat = Annotated[float, Field(ge=0)]
Engine = Literal[ENGINE_NAMES]  # type: ignore[valid-type]


class Sourced(Strict):
    """Where a prior comes from: a file of the repository, or words; `placeholder`: a
    guess until measured (the plan says so beside it)."""

    source: str = Field(min_length=1)
    placeholder: bool = False


class Figure(Sourced):
    """A prior: one number (seconds unless its key says otherwise) and its source."""

    value: NonNegFloat


class FirstStart(Figure):
    """What a lease's first engine start costs beyond a later one: per `profile` (each
    resolved profile's first start on the machine: vLLM's compile cache) or per `machine`
    (the machine's first start only: the weights' page cache)."""

    per: Literal["profile", "machine"] = "profile"


class ByStreams(Sourced):
    """A prior by concurrency level, interpolated between levels in log2(streams) and
    flat beyond the ends."""

    by_streams: Annotated[dict[PositiveInt, PositiveFloat], Field(min_length=1),
                          Expect("a mapping of streams to positive numbers")]

    def at(self, streams: float) -> float:
        points = sorted(self.by_streams.items())
        if streams <= points[0][0]:
            return points[0][1]
        for (c0, v0), (c1, v1) in itertools.pairwise(points):
            if streams <= c1:
                f = (math.log2(streams) - math.log2(c0)) / (math.log2(c1) - math.log2(c0))
                return v0 + f * (v1 - v0)
        return points[-1][1]


class EnginePriors(Strict):
    """One engine's priors: its bundle, its starts and stops, its speed on this suite's
    model (the cells' model where nothing stored times them)."""

    staging: Figure  # its bundle staged on a fresh machine, s
    start: Figure  # a start to ready, s (a later start of a profile on the machine)
    first_start: FirstStart  # added to a lease's first start (module docstring), s
    stop: Figure  # an engine stopped between launch groups, s
    step_ms: Figure  # one stream's decode step without speculation, ms
    tok_s: ByStreams  # aggregate output tok/s without speculation, above one stream
    speedup: ByStreams  # a speculative arm's tok/s over no speculation, greedy
    sampled_speedup: ByStreams  # the same at temperature > 0
    # environment a command on this engine's bundle sets first (SGLang: SPECREPRO_GPU_ENV)
    command_env: dict[str, str] = Field(default_factory=dict)

    def one_stream_tok_s(self) -> float:
        return 1000.0 / self.step_ms.value if self.step_ms.value else 0.0


class Export(Figure):
    """A file the machine writes before arms can read it: the stand-in (its target and
    drafters), the NVFP4 copy. A lease pays it once, where one of its arms' profiles
    names a model or drafter under one of `paths`."""

    name: str
    paths: Annotated[list[str], Field(min_length=1), Expect("a list of folder paths")]
    command: str  # the command line the plan prints
    # run in a command of its own (no engine up: its memory), else before the lease's
    # first measuring command's run, inside that command
    own_command: bool = False


class Step(Strict):
    """One command line of the order: notebooks (or studies) run together, optionally
    only the arms on one engine (`--engine`) or the arms named (`--arm`)."""

    notebooks: Annotated[list[str], Field(min_length=1)]
    engine: Engine | None = None
    arms: list[str] = Field(default_factory=list)
    note: str = ""


class Plan(Strict):
    """A suite's `plan:` block (module docstring)."""

    order: list[str | Step] = Field(default_factory=list)
    lease_s: PositiveFloat = 1800.0  # one machine's device time
    command_s: PositiveFloat = 600.0  # one command's limit
    command_reserve_s: NonNegFloat = 60.0  # after the run's deadline: stop, merge, archive
    machine_start: Figure  # a fresh machine until its first command runs
    command_overhead: Figure  # per command: transfers, imports, the store copied and merged
    cell_overhead: Figure  # per cell beyond its own seconds: the archive rewritten, grading
    # the share of a request's output cap it decodes on average, by workload (1 where
    # none is declared: every request to its cap)
    tokens_share: dict[Literal[WORKLOADS], Figure] = Field(  # type: ignore[valid-type]
        default_factory=dict)
    engines: dict[Engine, EnginePriors] = Field(default_factory=dict)
    exports: list[Export] = Field(default_factory=list)
    archive: str = "$OUT/{suite}.tar.gz"  # each command's --archive ({suite}: its name)

    def steps(self) -> list[Step]:
        """The order as steps (a bare id is a step of that notebook alone)."""
        return [Step(notebooks=[s]) if isinstance(s, str) else s for s in self.order]

    def cross_checks(self) -> list[tuple[tuple, str]]:
        out: list[tuple[tuple, str]] = []
        if self.command_reserve_s >= self.command_s:
            out.append((("command_reserve_s",),
                        (f"expected less than command_s ({self.command_s:g}), found "
                        f"{self.command_reserve_s:g}")))
        names = [e.name for e in self.exports]
        out += [(("exports", i, "name"), f"expected a unique name, found {n!r} again")
                for i, n in enumerate(names) if n in names[:i]]
        return out

    def order_checks(self, ids: list[str]) -> list[tuple[tuple, str]]:
        """Every notebook an order step names is one of the suite's (`ids`)."""
        out: list[tuple[tuple, str]] = []
        for i, entry in enumerate(self.order):
            names = [entry] if isinstance(entry, str) else entry.notebooks
            for j, name in enumerate(names):
                where = ("order", i) if isinstance(entry, str) else ("order", i, "notebooks", j)
                if name not in ids:
                    out.append((where, one_of("a notebook or study of the suite", ids, name)))
        return out
