"""What one notebook measures: the study models (findings/<id>/study.yaml) and its cells.

Design:
- A **Study** names its arms (each a profile, with overrides), workloads, concurrency levels,
  sampling settings and repeats; `Study.cells()` enumerates its cells in a stable order
  (skips applied, a skip with `repeat` to those repeats only; one seed per repeat). What
  identifies a cell in the results store is `specrepro.identity`'s.
- Checks across fields (`cross_checks`, located in the file by validation.py): names unique,
  a baseline, an A/A twin (`noise_of`), a skip or a gate naming an arm or workload of the
  study, a gate's metric a column of the cells table (store.CELL_SCHEMA), a window's
  workloads the study's.
- `Study.window` times multi-stream speed cells over a steady counter window (every other
  cell sends every prompt once; the fixed window's `mode` and `window_s` are retired and
  fail saying so, `Study.RETIRED`) and
  `Study.interleave` orders repeats across arms (window.py); `Study.placement` is how the
  harness places a launched engine and its load generator on the CPUs (harness/cpu_placement.py).
  Neither is part of a cell's identity beyond the window's timing.
- A study resolved against a suite (its arms' profiles loaded) is schema.ResolvedStudy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

from pydantic import Field, JsonValue, field_validator

from specrepro.params.errors import Expect, duplicates, one_of
from specrepro.params.strict import FolderName, NonNegInt, PositiveInt, Strict
from specrepro.params.window import Interleave, Window

# prose: held-out WikiText-2 continuations standing in for the articles' essays (workloads.py)
WORKLOADS = ("gsm8k", "humaneval", "essays", "prefill", "prose")


class Workload(Strict):
    name: Literal[WORKLOADS]  # type: ignore[valid-type]
    n: PositiveInt  # prompts (for prefill: prompts per target length)
    form: Literal["chat", "completion"] = "chat"
    shots: Literal[0, 5] = 0
    max_tokens: PositiveInt | None = None  # None: the workload's default (workloads.py)
    prefill_tokens: (
        Annotated[list[PositiveInt], Expect("a list of positive token counts")] | None
    ) = None
    # Stop strings sent with each request. Unset: the workload's own (lm-eval's for GSM8K,
    # the Codex paper's for HumanEval completions); [] sends none (a base model that opens
    # every completion with a comment would otherwise stop after two tokens). Unset, it is
    # left out of a cell's identity, so cells measured before the key existed keep theirs.
    stop: list[str] | None = Field(default=None, exclude_if=lambda v: v is None)

    def cross_checks(self) -> list[tuple[tuple, str]]:
        if self.name == "prefill" and not self.prefill_tokens:
            return [(("prefill_tokens",), "expected target prompt lengths for prefill, found none")]
        if self.name != "prefill" and self.prefill_tokens:
            return [(("prefill_tokens",), f"expected it only on prefill, found it on {self.name}")]
        if self.name == "prose" and self.form != "completion":
            return [(("form",), "expected completion for prose (the embedded target continues "
                                f"plain prose, never as a chat turn), found {self.form}")]
        if self.shots and self.name != "gsm8k":
            return [
                (
                    ("shots",),
                    (f"expected 0 for {self.name} (few-shot is gsm8k's), found {self.shots}"),
                )
            ]
        return []


class Sampling(Strict):
    temperature: Annotated[float, Field(ge=0)] = 0.0
    top_p: Annotated[float, Field(gt=0, le=1), Expect("a number in (0, 1]")] = 1.0
    top_k: int = -1

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int) -> int:
        if value != -1 and value < 1:
            raise ValueError(f"expected -1 (off) or an integer >= 1, found {value}")
        return value

    @property
    def label(self) -> str:
        extra = "" if (self.top_p, self.top_k) == (1.0, -1) else f" p{self.top_p} k{self.top_k}"
        return f"T={self.temperature:g}{extra}"


class Arm(Strict):
    name: FolderName  # its engine's log is logs/<arm>--<profile>.log
    profile: str  # a profile file's name, without .yaml
    overrides: dict[str, JsonValue] = Field(default_factory=dict)
    label: str | None = None
    # An A/A twin: this arm is the named arm again (same profile and overrides), measured as
    # cells of its own, so the difference between the two is the suite's own noise at each
    # level (analysis/verdict/noise.py); it is never a finding's arm.
    noise_of: str | None = None


class Probe(Arm):
    """A question one engine start answers, declared with the study before it is asked:
    does this profile start and serve at all (a quantization path an arm would need, a
    flag an engine release may refuse)? `specrepro probe` asks it and stores the answer in
    the study's results store; the report shows it beside the arms' figures. A probe has
    no cells: whether its engine starts is the measurement."""

    question: str


GATE_OPS = {
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
}


class Gate(Strict):
    """A pass/fail criterion declared before the run."""

    name: str
    metric: str  # a column of the cells table
    workload: str
    concurrency: PositiveInt
    arm: str
    reference_arm: str | None = None
    op: Literal[">=", "<=", ">", "<"]
    threshold: float
    kind: Literal["absolute", "relative_pct"] = "absolute"
    unit: str | None = None
    published: str | None = None  # the article's gate, as text

    def passes(self, value: float, reference: float | None = None) -> bool:
        """Whether a measured value (and its reference arm's value) passes the gate."""
        if self.kind == "relative_pct":
            if reference is None or reference == 0:
                raise ValueError(f"gate {self.name!r}: relative gate needs a nonzero reference")
            value = 100.0 * (value - reference) / reference
        return GATE_OPS[self.op](value, self.threshold)


class Skip(Strict):
    """Combinations the study does not measure; a missing key matches everything.

    `repeat` skips only those repeats (0-based indices) of the combination, e.g. `[1, 2]` to
    measure a cell whose figures are deterministic (greedy acceptance, correctness) once
    while the study repeats its speed cells: the combination itself is still measured. As
    with `concurrency`, values the study does not have skip nothing (a suite may shrink
    `repeats` without restating the study's skips)."""

    arm: str | None = None
    workload: str | None = None
    concurrency: Annotated[list[PositiveInt], Expect("a list of positive integers")] | None = None
    repeat: Annotated[list[NonNegInt], Expect("a list of repeat indices (0-based)")] | None = None

    def matches(self, arm: str, workload: str, concurrency: int, repeat: int | None = None
                ) -> bool:
        """Whether it skips this repeat of the combination (repeat None: the whole
        combination, which a skip limited to some repeats never does)."""
        if self.repeat is not None and (repeat is None or repeat not in self.repeat):
            return False
        return (
            (self.arm is None or self.arm == arm)
            and (self.workload is None or self.workload == workload)
            and (self.concurrency is None or concurrency in self.concurrency)
        )


@dataclass(frozen=True)
class Cell:
    """One arm x workload x concurrency x sampling x repeat of a study."""

    arm: Arm
    workload: Workload
    concurrency: int
    sampling: Sampling
    repeat: int
    seed: int


# The legacy fixed window (`mode: window`: every cell over `window_s` from the load's
# start, ramp-up and drain inside it) is retired: one window, the steady one.
FIXED_WINDOW_RETIRED = (
    "it set the fixed window (`mode: window` with `window_s`), which is gone: time "
    "multi-stream speed cells over the steady window with a `window:` block instead "
    "(params/window.py: e.g. `window: {skip_s: 10.0, window_s: 40.0}`; `min_concurrency: 1` "
    "windows one-stream cells too), and delete `mode` and `window_s`: every cell the window "
    "does not cover sends every prompt once, as `mode: requests` did")


class Study(Strict):
    """What one notebook measures."""

    RETIRED: ClassVar[dict[str, str]] = {"mode": FIXED_WINDOW_RETIRED,
                                         "window_s": FIXED_WINDOW_RETIRED}

    name: FolderName  # its store is <results>/<name>/<run_id>/
    notebook: str
    finding: str = ""
    arms: Annotated[list[Arm], Field(min_length=1)]
    baseline: str | None = None
    workloads: Annotated[list[Workload], Field(min_length=1)]
    concurrency: Annotated[
        list[PositiveInt], Field(min_length=1), Expect("a list of positive integers")
    ]
    sampling: Annotated[list[Sampling], Field(min_length=1)] = Field(
        default_factory=lambda: [Sampling()]
    )
    repeats: PositiveInt = 1
    seeds: Annotated[list[int], Expect("a list of integer seeds, one per repeat")] | None = None
    seed: int = 0  # base seed: repeat r gets seed + r where no explicit list is given
    # multi-stream speed cells: a steady window (window.py); every other cell sends every
    # prompt once
    window: Window | None = None
    interleave: Interleave = "auto"  # repeats across arms A B C, A B C (window.py)
    warmup: NonNegInt = 0  # requests sent and discarded before measuring each cell
    ignore_eos: bool = False
    thinking: bool | None = None
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    gates: list[Gate] = Field(default_factory=list)
    skip: list[Skip] = Field(default_factory=list)
    probes: list[Probe] = Field(default_factory=list)
    # Where the harness runs a launched engine and its own load generator (runner.py,
    # cpu_placement.plan_placement): "auto" pins them to disjoint CPU sets where the machine has
    # two CPUs or more; "none" leaves both to the OS. Recorded in the manifest, not part of
    # a cell's identity (it is how the machine was used, like its load).
    placement: Literal["auto", "none"] = "auto"

    def cross_checks(self) -> list[tuple[tuple, str]]:
        out: list[tuple[tuple, str]] = []
        arms = [a.name for a in self.arms]
        loads = [w.name for w in self.workloads]
        out += duplicates("arms", arms) + duplicates("workloads", loads)
        out += duplicates("probes", [p.name for p in self.probes])
        for i, w in enumerate(self.workloads):
            out += [(("workloads", i, *p), m) for p, m in w.cross_checks()]
        if self.baseline is not None and self.baseline not in arms:
            out.append((("baseline",), one_of("an arm name", arms, self.baseline)))
        for i, a in enumerate(self.arms):
            if a.noise_of is None:
                continue
            twin = next((b for b in self.arms if b.name == a.noise_of and b is not a), None)
            if twin is None:
                out.append((("arms", i, "noise_of"),
                            one_of("another arm's name", arms, a.noise_of)))
            elif (twin.profile, twin.overrides) != (a.profile, a.overrides):
                out.append((("arms", i, "noise_of"),
                            f"an A/A twin runs its arm's profile and overrides: expected "
                            f"profile {twin.profile!r} with {twin.overrides or 'no overrides'}"
                            f", found {a.profile!r} with {a.overrides or 'no overrides'}"))
        if self.seeds is not None and len(self.seeds) != self.repeats:
            out.append(
                (
                    ("seeds",),
                    (f"expected one seed per repeat ({self.repeats}), found {len(self.seeds)}"),
                )
            )
        if self.window is not None:
            out += self.window.checks(loads)
        for i, g in enumerate(self.gates):
            out += _gate_checks(i, g, arms, loads, self.concurrency)
        for i, s in enumerate(self.skip):
            if s.arm is not None and s.arm not in arms:
                out.append((("skip", i, "arm"), one_of("an arm name", arms, s.arm)))
            if s.workload is not None and s.workload not in loads:
                out.append((("skip", i, "workload"), one_of("a workload", loads, s.workload)))
        return out

    def windowed(self, cell: Cell) -> bool:
        """Whether `cell` is timed in the study's steady window (params/window.py)."""
        resolved = getattr(cell.arm, "resolved", None)  # a ResolvedStudy's arms carry it
        return self.window is not None and self.window.covers(
            cell.concurrency, cell.workload.name, None if resolved is None else resolved.engine)

    @property
    def rounds(self) -> int:
        """The passes over the arms its repeats take (window.py: one with `one_start`)."""
        return 1 if self.interleave == "one_start" else self.repeats

    def round_of(self, cell: Cell) -> int:
        """The round a cell is measured in: its repeat, or 0 where every repeat of an arm
        runs on one engine start (`interleave: one_start`)."""
        return 0 if self.interleave == "one_start" else cell.repeat

    def seed_for(self, repeat: int) -> int:
        return self.seeds[repeat] if self.seeds is not None else self.seed + repeat

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)

    def skipped(self, arm: str, workload: str, concurrency: int, repeat: int | None = None
                ) -> bool:
        return any(s.matches(arm, workload, concurrency, repeat) for s in self.skip)

    def cells(self) -> Iterator[Cell]:
        """Every cell the study measures, in a stable order (arm, workload, c, T, repeat)."""
        for arm in self.arms:
            for w in self.workloads:
                for c in self.concurrency:
                    if self.skipped(arm.name, w.name, c):
                        continue
                    for s in self.sampling:
                        for r in range(self.repeats):
                            if not self.skipped(arm.name, w.name, c, r):
                                yield Cell(arm, w, c, s, r, self.seed_for(r))



def _gate_checks(i: int, g: Gate, arms: list, loads: list, levels: list) -> list:
    from specrepro.store import CELL_SCHEMA  # gates read columns of the cells table

    out = []
    if g.metric not in CELL_SCHEMA:
        out.append(
            (("gates", i, "metric"), one_of("a cells column", sorted(CELL_SCHEMA), g.metric))
        )
    if g.arm not in arms:
        out.append((("gates", i, "arm"), one_of("an arm name", arms, g.arm)))
    if g.reference_arm is not None and g.reference_arm not in arms:
        out.append((("gates", i, "reference_arm"), one_of("an arm name", arms, g.reference_arm)))
    if g.kind == "relative_pct" and g.reference_arm is None:
        out.append(
            (
                ("gates", i, "reference_arm"),
                "expected a reference arm for a relative_pct gate, found none",
            )
        )
    if g.workload not in loads:
        out.append((("gates", i, "workload"), one_of("a workload", loads, g.workload)))
    if g.concurrency not in levels:
        out.append(
            (("gates", i, "concurrency"), one_of("a concurrency level", levels, g.concurrency))
        )
    return out
