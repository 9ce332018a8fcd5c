"""The params models: profiles, suites, and what a resolved study runs (study.py: studies).

Design:
- Three kinds of file: a **Profile** is one engine configuration (`params/profiles/*.yaml`),
  a **Study** is what one finding's notebook measures (`findings/<id>/study.yaml`), a
  **Suite** binds every finding to its study and to one setup's profiles and sizes
  (`params/default.yaml`, `params/smoke.yaml`, the GPU suites).
- A suite binds every finding of the registry (specrepro/findings.py) by default, and says
  only what differs on its setup: `defaults` (sizes and measurement settings for every
  finding's study), `profile_map` (the setup's profile for a profile the studies name,
  optionally with overrides: how the setup derives an arm), `window`, and under `notebooks:`
  a finding's own `overrides` and `profiles`; `excluded` leaves a finding out, with the
  reason. `binds: listed` (a test's or an experiment's suite) binds only the findings under
  `notebooks:`. Every shipped suite binds all (tests/test_findings.py).
- The models are pydantic v2 with `extra="forbid"` and strict types (`Strict`, strict.py):
  an unknown key, a string where a number belongs, a draft schedule vLLM would reject, an
  arm naming a missing profile or a baseline naming a missing arm all fail before anything
  runs. Checks across fields are each model's `cross_checks()`, as (key path, message),
  which the loader locates in the file that set the key.
- The speculative method names and the draft-schedule rule are the contract's
  (`specrepro.speculative`); a schedule is checked there and stored exactly as written.
- The study models (`Study`, its arms, workloads, sampling, gates, skips and `Cell`s) are
  study.py's; `Study.cells()` enumerates a study's cells.
- A `ResolvedStudy` is what the runner executes: its arms carry their profiles loaded, the
  suite's and the arm's overrides merged in, validated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, JsonValue, field_validator

from specrepro import findings
from specrepro.params.engine_kinds import ATTACHABLE_NAMES, ENGINE_NAMES, KINDS, names_where
from specrepro.params.errors import Expect, Problem, dotted
from specrepro.params.plan import Plan
from specrepro.params.strict import NAME_PATTERN, FolderName, PositiveFloat, PositiveInt, Strict
from specrepro.params.study import Arm, Study
from specrepro.params.substrate import Substrate
from specrepro.params.tree import Tree
from specrepro.speculative import METHODS, check_schedule, draft_tokens_at

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


class Profile(Strict):
    """One engine configuration: how to start it, with which flags, on which hardware."""

    name: FolderName  # a launch's log is logs/<arm>--<profile>.log
    engine: Literal[ENGINE_NAMES]  # type: ignore[valid-type]  (params/engine_kinds.py)
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
    attached_engine: Literal[ATTACHABLE_NAMES] | None = None  # type: ignore[valid-type]
    # Which HTTP API the load generator speaks: "openai" (/v1/completions, chat) or "native"
    # (SGLang's POST /generate: token ids and per-request acceptance in meta_info, for
    # completion-form workloads only; harness/loadgen.py). The default is left out of the
    # profile's identity, so cells measured before the key existed keep theirs.
    api: Literal["openai", "native"] = Field(default="openai", exclude_if=lambda v: v == "openai")

    _source: str | None = None  # the file it was loaded from (set by the loaders)
    _tree: Tree | None = None  # its merged tree (resolve.py), for `locate`

    @property
    def source(self) -> str | None:
        """The profile file, for error messages of code that reads the profile later."""
        return self._source

    def locate(self, *path: str | int) -> tuple[str, str]:
        """(file, dotted key) that set a key of the resolved profile: the profile file,
        or the study or suite whose arm overrides set it (for checks made after loading,
        harness/preflight.py)."""
        return _located(self._tree, path, self._source or f"profile {self.name}")

    def cross_checks(self) -> list[tuple[tuple, str]]:
        out = []
        kind = KINDS[self.engine]
        if kind.needs_url and not self.url:
            out.append((("url",), "expected the URL of a running engine, found none"))
        if not kind.starts:
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
        if kind.spec_details == "required" and self.return_spec_details is not True:
            out.append(
                (
                    ("return_spec_details",),
                    f"expected true for {self.engine}, found {self.return_spec_details!r}",
                )
            )
        if kind.spec_details == "forbidden" and self.return_spec_details is not None:
            out.append(
                (
                    ("return_spec_details",),
                    (f"expected it only on {names_where(spec_details='required')}, "
                     f"found it on {self.engine}"),
                )
            )
        if self.api == "native" and not kind.native_api:
            why = f"expected 'openai' for {self.engine} (api 'native' is SGLang's /generate)"
            out.append((("api",), f"{why}, found 'native'"))
        if not kind.attaches and self.attached_engine is not None:
            where = names_where(attaches=True)
            out.append(
                (("attached_engine",), f"expected it only on {where}, found it on {self.engine}")
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
                or KINDS[self.engine].gpu_only)


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
    _tree: Tree | None = None  # its merged tree (resolve.py), for `locate`

    def locate(self, *path: str | int) -> tuple[str, str]:
        """(file, dotted key) that set a key of the resolved study: the study file, or the
        suite's overrides (or a notebook's) that set it."""
        return _located(self._tree, path, self.source)

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


def _located(tree: Tree | None, path: tuple, fallback: str) -> tuple[str, str]:
    """Where a key of a merged tree was set; the fallback file where there is no tree."""
    if tree is not None:
        file, key = tree.prov.locate(path)
        return file, dotted(key)
    return fallback, dotted(path)


NOTEBOOK_IDS = findings.IDS  # the findings a suite binds (all but those it excludes)

# The study keys a suite's `defaults:` may set for every finding it binds: sizes and
# measurement settings, never what names the finding's arms, workloads or gates. Its
# `workloads` is a mapping merged into each workload of the study (these keys only).
DEFAULTS_KEYS = ("workloads", "concurrency", "sampling", "repeats", "seeds", "seed", "warmup",
                 "ignore_eos", "thinking", "reasoning_effort", "interleave", "placement")
DEFAULTS_WORKLOAD_KEYS = ("n", "form", "shots", "max_tokens", "stop")


class MappedProfile(Strict):
    """This setup's profile for one the studies name, with the overrides that derive the
    arm from it (merged into the profile before the arm's own overrides)."""

    profile: str
    overrides: dict[str, JsonValue] = Field(default_factory=dict)


ProfileRef = str | MappedProfile  # a profile's name, or a profile with overrides


class NotebookBinding(Strict):
    """A finding as a suite binds it: its own study (`findings/<id>/study.yaml`) unless
    `study` names another file, with this suite's overrides and profile map for it."""

    study: str | None = None  # a study file, relative to the suite file; None: the finding's
    overrides: dict[str, JsonValue] = Field(default_factory=dict)
    profiles: dict[str, ProfileRef] = Field(default_factory=dict)  # study's profile -> this setup's


class StudyBinding(NotebookBinding):
    """A study no notebook renders (`studies:`): its file is always named."""

    study: str  # a study file, relative to the suite file


class Suite(Strict):
    """One setup: every finding's study, bound to this setup's profiles and sizes."""

    name: FolderName  # reports/<name>/ where its reports go
    description: str = ""
    results_dir: str = "../results"  # relative to the suite file
    run_id: FolderName  # each store is <results_dir>/<study>/<run_id>/
    profiles: str = "profiles"  # directory of profile files, relative to the suite file
    profile_map: dict[str, ProfileRef] = Field(default_factory=dict)  # for every study
    # The findings whose binding says something (overrides, profiles); every other finding
    # is bound as its study stands, with `defaults` (unless `binds: listed`)
    notebooks: dict[Literal[NOTEBOOK_IDS], NotebookBinding] = Field(  # type: ignore[valid-type]
        default_factory=dict)
    # A finding this setup does not measure -> why (shown by `specrepro check`, the plan)
    excluded: dict[Literal[NOTEBOOK_IDS], str] = Field(  # type: ignore[valid-type]
        default_factory=dict)
    binds: Literal["all", "listed"] = "all"  # every finding (but the excluded), or the listed
    # Study keys for every finding's study on this setup, before its own overrides
    # (DEFAULTS_KEYS; `workloads`: merged into each workload)
    defaults: dict[str, JsonValue] = Field(default_factory=dict)
    substrate: Substrate | None = None  # what its numbers are measured on
    # its studies' windows sized for this substrate, or null: none (resolve._suite_window)
    window: dict[str, JsonValue] | None = None
    # Studies no notebook renders (a benchmark such as acceptance parity between engines):
    # bound like a notebook's, run only when named (`specrepro run SUITE --study ID`), and
    # never part of `make all`. Their ids must differ from the notebooks'.
    studies: dict[Annotated[str, Field(pattern=NAME_PATTERN)],
                  StudyBinding] = Field(default_factory=dict)
    # how `specrepro plan` costs and orders its notebooks: priors and the order of value
    # (params/plan.py); null: the planner refuses to plan it, saying so
    plan: Plan | None = None

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

    def bind_every_finding(self) -> None:
        """Bind every registered finding not excluded (`binds: all`), in the registry's
        order, those the file does not list as their study stands (load_suite calls it)."""
        if self.binds == "all":
            self.notebooks = {nb: self.notebooks.get(nb) or NotebookBinding()
                              for nb in NOTEBOOK_IDS if nb not in self.excluded}

    def binding(self, study_id: str) -> NotebookBinding:
        """A notebook's binding, else a benchmark study's (KeyError if neither)."""
        return self.notebooks[study_id] if study_id in self.notebooks else self.studies[study_id]

    def section(self, study_id: str) -> str:
        """The suite key that binds the study: "notebooks" or "studies"."""
        return "notebooks" if study_id in self.notebooks else "studies"

    def study_path(self, notebook_id: str) -> Path:
        """The binding's study file (relative to the suite file), else the finding's own."""
        study = self.binding(notebook_id).study
        if study is None:
            return findings.study_path(notebook_id)
        return (self._path.parent / study).resolve()

    def cross_checks(self) -> list[tuple[tuple, str]]:
        out = [(("studies", sid), f"expected an id that is not a notebook's, found {sid!r}")
               for sid in self.studies if sid in NOTEBOOK_IDS]
        out += [(("excluded", nb), f"expected a finding not bound under notebooks:, found "
                                   f"{nb!r} bound there too") for nb in self.excluded
                if nb in self.notebooks]
        out += [(("excluded", nb), "expected the reason, in words, found none")
                for nb, why in self.excluded.items() if not why.strip()]
        if self.binds == "listed" and self.excluded:
            out.append((("excluded",), "expected none with `binds: listed` (it binds only the "
                                       "findings under notebooks:)"))
        out += _defaults_checks(self.defaults)
        if self.plan is not None:
            ids = [*self.notebooks, *self.studies]
            out += [(("plan", *p), m)
                    for p, m in [*self.plan.cross_checks(), *self.plan.order_checks(ids)]]
        return out


def _defaults_checks(defaults: dict) -> list[tuple[tuple, str]]:
    """`defaults:` sets only DEFAULTS_KEYS, its `workloads` a mapping of the keys a workload
    may take from a suite (their values are checked in each study, located here)."""
    out = [(("defaults", key), f"expected one of {', '.join(DEFAULTS_KEYS)} (a suite's "
                               f"defaults for every finding's study), found {key!r}")
           for key in defaults if key not in DEFAULTS_KEYS]
    loads = defaults.get("workloads")
    if loads is not None and not isinstance(loads, dict):
        out.append((("defaults", "workloads"), "expected a mapping merged into each workload of "
                                               f"a study (e.g. {{n: 8}}), found {loads!r}"))
    elif loads:
        out += [(("defaults", "workloads", key), f"expected one of "
                 f"{', '.join(DEFAULTS_WORKLOAD_KEYS)}, found {key!r}")
                for key in loads if key not in DEFAULTS_WORKLOAD_KEYS]
    return out
