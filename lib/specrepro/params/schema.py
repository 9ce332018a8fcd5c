"""The params models: profiles, studies, suites, and what a resolved study runs.

Design:
- Three kinds of file: a **Profile** is one engine configuration (`params/profiles/*.yaml`),
  a **Study** is what one notebook measures (`params/studies/NN_*.yaml`), a **Suite** binds
  every notebook to a study and to one setup's profiles (`params/default.yaml`,
  `params/smoke.yaml`, the GPU suites).
- The models are pydantic v2 with `extra="forbid"` and strict types (`Strict`): an unknown
  key, a string where a number belongs, a draft schedule vLLM would reject, an arm naming a
  missing profile or a baseline naming a missing arm all fail before anything runs. Checks
  across fields are each model's `cross_checks()`, as (key path, message), which the loader
  locates in the file that set the key.
- The speculative method names and the draft-schedule rule are the contract's
  (`specrepro.speculative`); a schedule is checked there and stored exactly as written.
- `Study.cells()` enumerates a study's cells (skips applied, a skip with `repeat` to those
  repeats only; one seed per repeat); what identifies a cell in the results store is
  `specrepro.identity`'s. `Study.placement` is how the harness places a launched engine and
  its load generator on the CPUs (`harness/process.py`); it is no part of a cell's identity.
  `Study.window` times multi-stream speed cells over a steady counter window and
  `Study.interleave` orders repeats across arms (params/window.py).
- A `ResolvedStudy` is what the runner executes: its arms carry their profiles loaded, the
  suite's and the arm's overrides merged in, validated.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

from specrepro import findings
from specrepro.params.errors import Expect, Problem, _duplicates, _one_of
from specrepro.params.substrate import Substrate
from specrepro.params.tree import Tree
from specrepro.params.window import Interleave, Window, window_checks, windowed
from specrepro.speculative import METHODS, check_schedule, draft_tokens_at


class Strict(BaseModel):
    """Base of every params model: unknown keys fail, no silent type coercion."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=False)

    def cross_checks(self) -> list[tuple[tuple, str]]:
        """Checks across fields, as (key path, 'expected ..., found ...'); none by default."""
        return []


PositiveInt = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
Schedule = list[Annotated[list[int], Field(min_length=3, max_length=3)]]  # [[lo, hi, k], ...]


class ModelRef(Strict):
    id: str
    revision: str | None = None  # null where the source gives none; never invented
    served_name: str | None = None


class DrafterRef(Strict):
    id: str
    revision: str | None = None


class SpeculativeConfig(Strict):
    """Engine-neutral speculative settings, in vLLM's `--speculative-config` keys."""

    method: Literal[METHODS]  # type: ignore[valid-type]
    num_speculative_tokens: Annotated[int, Field(ge=1), Expect("a positive integer")] | None = None
    num_speculative_tokens_per_batch_size: (
        Annotated[Schedule, Expect("a list of [lo, hi, k] integer ranges")] | None
    ) = None
    quantization: str | None = None
    model: str | None = None
    prompt_lookup_min: PositiveInt | None = None
    prompt_lookup_max: PositiveInt | None = None
    rejection_sample_method: Literal["standard", "synthetic", "block", "fly"] | None = None
    draft_sample_method: Literal["greedy", "probabilistic"] | None = None

    @field_validator("num_speculative_tokens_per_batch_size", mode="after")
    @classmethod
    def _schedule(cls, value: Schedule | None) -> Schedule | None:
        # vLLM's rule, checked by the contract; the value is stored as given (lists), since
        # a profile's identity hashes it
        if value is not None:
            check_schedule(value)
        return value

    def cross_checks(self) -> list[tuple[tuple, str]]:
        out = []
        if self.method in ("dflash", "draft_model", "mtp") and self.num_speculative_tokens is None:
            out.append(
                (
                    ("num_speculative_tokens",),
                    f"expected a draft length for method {self.method!r}, found none",
                )
            )
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is not None and hi is not None and lo > hi:
            out.append(
                (
                    ("prompt_lookup_min",),
                    f"expected prompt_lookup_min <= prompt_lookup_max, found {lo} > {hi}",
                )
            )
        return out

    def draft_tokens_at(self, batch_size: int) -> int:
        return draft_tokens_at(
            self.num_speculative_tokens_per_batch_size, self.num_speculative_tokens or 0, batch_size
        )


class Parallel(Strict):
    tensor_parallel_size: PositiveInt = 1
    data_parallel_size: PositiveInt = 1


class Hardware(Strict):
    name: str
    gpu: str | None = None
    memory_gib: PositiveFloat | None = None
    bandwidth_gbs: PositiveFloat | None = None
    power_limit_w: PositiveFloat | None = None


GPU_ENGINES = ("vllm", "sglang")  # engines the harness launches only on a GPU machine


class Profile(Strict):
    """One engine configuration: how to start it, with which flags, on which hardware."""

    name: str
    # transformers: the in-process peer (harness/peer.py) on the embedded checkpoint
    engine: Literal["vllm", "sglang", "embedded", "attach", "transformers"]
    description: str = ""
    command: Annotated[list[str], Expect("an argv list of strings")] | None = None
    url: str | None = None
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    model: ModelRef
    drafter: DrafterRef | None = None
    flags: dict[str, JsonValue] = Field(default_factory=dict)
    speculative: SpeculativeConfig | None = None
    env: dict[str, str] = Field(default_factory=dict)
    parallel: Parallel = Field(default_factory=Parallel)
    hardware: Hardware | None = None
    engine_version: str | None = None  # the version the profile expects; checked at launch
    ready_timeout_s: PositiveFloat = 600.0
    article_arm: str | None = None
    return_spec_details: bool | None = None  # SGLang: acceptance from per-response fields
    attached_engine: Literal["vllm", "sglang", "embedded"] | None = None  # attach: who answers
    # Which HTTP API the load generator speaks: "openai" (/v1/completions, chat) or "native"
    # (SGLang's POST /generate: token ids and per-request acceptance in meta_info, for
    # completion-form workloads only; harness/loadgen.py). The default is left out of the
    # profile's identity, so cells measured before the key existed keep theirs.
    api: Literal["openai", "native"] = Field(default="openai", exclude_if=lambda v: v == "openai")

    _source: str | None = None  # the file it was loaded from (set by the loaders)

    @property
    def source(self) -> str | None:
        """The profile file, for error messages of code that reads the profile later."""
        return self._source

    def cross_checks(self) -> list[tuple[tuple, str]]:
        out = []
        if self.engine == "attach" and not self.url:
            out.append((("url",), "expected the URL of a running engine, found none"))
        if self.engine in ("attach", "transformers"):
            if self.command is not None:
                out.append(
                    (
                        ("command",),
                        (
                            f"expected null for {self.engine} (nothing to start), "
                            f"found {self.command!r}"
                        ),
                    )
                )
        elif not self.command:
            out.append((("command",), f"expected the argv that starts {self.engine}, found none"))
        if self.engine == "sglang" and self.return_spec_details is not True:
            out.append(
                (
                    ("return_spec_details",),
                    f"expected true for sglang, found {self.return_spec_details!r}",
                )
            )
        if self.engine not in ("sglang", "attach") and self.return_spec_details is not None:
            out.append(
                (
                    ("return_spec_details",),
                    (f"expected it only on sglang, found it on {self.engine}"),
                )
            )
        if self.api == "native" and self.engine != "sglang":
            why = f"expected 'openai' for {self.engine} (api 'native' is SGLang's /generate)"
            out.append((("api",), f"{why}, found 'native'"))
        if self.engine != "attach" and self.attached_engine is not None:
            out.append(
                (("attached_engine",), f"expected it only on attach, found it on {self.engine}")
            )
        if self.speculative is not None:
            out += [(("speculative", *p), m) for p, m in self.speculative.cross_checks()]
        return out

    @property
    def method(self) -> str:
        """The speculative method, or 'none' for plain autoregressive decoding."""
        return self.speculative.method if self.speculative else "none"

    @property
    def needs_gpu(self) -> bool:
        """Whether its engine needs an NVIDIA GPU: run with `--device cuda`, or a vLLM or
        SGLang the harness launches (an attached one is wherever its URL is)."""
        return (str((self.flags or {}).get("device", "")).startswith("cuda")
                or self.engine in GPU_ENGINES)



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
    name: str
    profile: str  # a profile file's name, without .yaml
    overrides: dict[str, JsonValue] = Field(default_factory=dict)
    label: str | None = None
    # An A/A twin: this arm is the named arm again (same profile and overrides), measured as
    # cells of its own, so the difference between the two is the suite's own noise at each
    # level (analysis/noise.py); it is never a finding's arm.
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


class Study(Strict):
    """What one notebook measures."""

    name: str
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
    # the timing of cells `window` does not cover: every prompt once, or (legacy) every
    # cell over `window_s` from the load's start
    mode: Literal["requests", "window"] = "requests"
    window_s: PositiveFloat | None = None
    window: Window | None = None  # multi-stream speed cells: a steady window (window.py)
    interleave: Interleave = "auto"  # repeats across arms A B C, A B C (window.py)
    warmup: NonNegInt = 0  # requests sent and discarded before measuring each cell
    ignore_eos: bool = False
    thinking: bool | None = None
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    gates: list[Gate] = Field(default_factory=list)
    skip: list[Skip] = Field(default_factory=list)
    probes: list[Probe] = Field(default_factory=list)
    # Where the harness runs a launched engine and its own load generator (runner.py,
    # process.plan_placement): "auto" pins them to disjoint CPU sets where the machine has
    # two CPUs or more; "none" leaves both to the OS. Recorded in the manifest, not part of
    # a cell's identity (it is how the machine was used, like its load).
    placement: Literal["auto", "none"] = "auto"

    def cross_checks(self) -> list[tuple[tuple, str]]:
        out: list[tuple[tuple, str]] = []
        arms = [a.name for a in self.arms]
        loads = [w.name for w in self.workloads]
        out += _duplicates("arms", arms) + _duplicates("workloads", loads)
        out += _duplicates("probes", [p.name for p in self.probes])
        for i, w in enumerate(self.workloads):
            out += [(("workloads", i, *p), m) for p, m in w.cross_checks()]
        if self.baseline is not None and self.baseline not in arms:
            out.append((("baseline",), _one_of("an arm name", arms, self.baseline)))
        for i, a in enumerate(self.arms):
            if a.noise_of is None:
                continue
            twin = next((b for b in self.arms if b.name == a.noise_of and b is not a), None)
            if twin is None:
                out.append((("arms", i, "noise_of"), _one_of("another arm's name", arms,
                                                              a.noise_of)))
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
        if self.mode == "window" and self.window_s is None:
            out.append(
                (
                    ("window_s",),
                    ("expected a window length in seconds for mode 'window', found none"),
                )
            )
        out += window_checks(self)
        for i, g in enumerate(self.gates):
            out += _gate_checks(i, g, arms, loads, self.concurrency)
        for i, s in enumerate(self.skip):
            if s.arm is not None and s.arm not in arms:
                out.append((("skip", i, "arm"), _one_of("an arm name", arms, s.arm)))
            if s.workload is not None and s.workload not in loads:
                out.append((("skip", i, "workload"), _one_of("a workload", loads, s.workload)))
        return out

    def windowed(self, cell: Cell) -> bool:  # timed in `window`? (params/window.py)
        return windowed(self, cell)

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
    from specrepro.results import CELL_SCHEMA  # gates read columns of the cells table

    out = []
    if g.metric not in CELL_SCHEMA:
        out.append(
            (("gates", i, "metric"), _one_of("a cells column", sorted(CELL_SCHEMA), g.metric))
        )
    if g.arm not in arms:
        out.append((("gates", i, "arm"), _one_of("an arm name", arms, g.arm)))
    if g.reference_arm is not None and g.reference_arm not in arms:
        out.append((("gates", i, "reference_arm"), _one_of("an arm name", arms, g.reference_arm)))
    if g.kind == "relative_pct" and g.reference_arm is None:
        out.append(
            (
                ("gates", i, "reference_arm"),
                "expected a reference arm for a relative_pct gate, found none",
            )
        )
    if g.workload not in loads:
        out.append((("gates", i, "workload"), _one_of("a workload", loads, g.workload)))
    if g.concurrency not in levels:
        out.append(
            (("gates", i, "concurrency"), _one_of("a concurrency level", levels, g.concurrency))
        )
    return out


class ResolvedArm(Arm):
    """An arm with its profile loaded, overrides merged in, and validated."""

    resolved: Profile


class ResolvedProbe(ResolvedArm):
    """A probe with its profile resolved as an arm's is."""

    question: str


class ResolvedStudy(Study):
    """A study whose arms carry fully resolved profiles (what the runner executes)."""

    arms: list[ResolvedArm]
    probes: list[ResolvedProbe] = Field(default_factory=list)
    notebook_id: str
    source: str  # the file that defined the study

    def api_problems(self) -> list[Problem]:
        """An arm whose profile says `api: native` (SGLang's /generate, which takes a text,
        not messages; harness/loadgen.py) on a chat-form workload."""
        return [Problem(a.resolved.source or f"profile {a.resolved.name}", "api",
                        f"expected 'openai' for arm {a.name!r} of study {self.name!r} "
                        f"({self.source}), whose workload {w.name!r} is chat-form (api "
                        f"'native' is SGLang's /generate: completion-form prompts only; or "
                        f"set that workload's form: completion), found 'native' in profile "
                        f"{a.resolved.name!r}")
                for a in self.arms if a.resolved.api == "native"
                for w in self.workloads if w.form == "chat"]


NOTEBOOK_IDS = findings.IDS  # the keys a suite's `notebooks:` may bind: the registry's ids


class NotebookBinding(Strict):
    study: str  # a study file, relative to the suite file
    overrides: dict[str, JsonValue] = Field(default_factory=dict)
    profiles: dict[str, str] = Field(default_factory=dict)  # study arm profile -> this setup's


class Suite(Strict):
    """One setup: every notebook's study, bound to this setup's profiles and sizes."""

    name: str
    description: str = ""
    results_dir: str = "../results"  # relative to the suite file
    run_id: str
    profiles: str = "profiles"  # directory of profile files, relative to the suite file
    profile_map: dict[str, str] = Field(default_factory=dict)  # for every notebook
    notebooks: dict[Literal[NOTEBOOK_IDS], NotebookBinding]  # type: ignore[valid-type]
    substrate: Substrate | None = None  # what its numbers are measured on
    # its studies' windows sized for this substrate, or null: none (resolve._suite_window)
    window: dict[str, JsonValue] | None = None
    # Studies no notebook renders (a benchmark such as acceptance parity between engines):
    # bound like a notebook's, run only when named (`specrepro run SUITE --study ID`), and
    # never part of `make all`. Their ids must differ from the notebooks'.
    studies: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")],
                  NotebookBinding] = Field(default_factory=dict)

    # filled by load_suite: where the file lives, and its merged tree for error messages
    _path: Path = Path(".")
    _tree: Tree | None = None

    @property
    def path(self) -> Path:
        return self._path

    @property
    def results_path(self) -> Path:
        return (self._path.parent / self.results_dir).resolve()

    @property
    def profiles_path(self) -> Path:
        return (self._path.parent / self.profiles).resolve()

    def binding(self, study_id: str) -> NotebookBinding:
        """A notebook's binding, else a benchmark study's (KeyError if neither)."""
        return self.notebooks[study_id] if study_id in self.notebooks else self.studies[study_id]

    def section(self, study_id: str) -> str:
        """The suite key that binds the study: "notebooks" or "studies"."""
        return "notebooks" if study_id in self.notebooks else "studies"

    def study_path(self, notebook_id: str) -> Path:
        return (self._path.parent / self.binding(notebook_id).study).resolve()

    def cross_checks(self) -> list[tuple[tuple, str]]:
        return [(("studies", sid), f"expected an id that is not a notebook's, found {sid!r}")
                for sid in self.studies if sid in NOTEBOOK_IDS]
