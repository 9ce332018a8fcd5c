"""Parameters: YAML profiles, studies and suites, validated on load into typed objects.

Design:
- Three kinds of file (DESIGN.md "Parameters"): a **Profile** is one engine
  configuration (`params/profiles/*.yaml`), a **Study** is what one notebook measures
  (`params/studies/NN_*.yaml`), a **Suite** binds every notebook to a study and to one
  setup's profiles (`params/default.yaml`, `params/smoke.yaml`, the GPU suites).
- Any file may start with `include: [a.yaml, ...]` (paths relative to it). Includes are
  deep-merged in order, then the file's own keys on top: mappings merge key by key,
  anything else (lists, scalars) is replaced; later wins. Suite `overrides` and arm
  `overrides` merge the same way, into a study and into a profile.
- Every merged value remembers the file (and key path there) that set it
  (`Provenance`), so a validation error names the file the user must edit, the dotted
  key path, what was expected and what was found.
- The models are pydantic v2 with `extra="forbid"` and strict types: an unknown key,
  a string where a number belongs, a draft schedule vLLM would reject, an arm naming a
  missing profile or a baseline naming a missing arm all fail before anything runs.
- API: load_profile / load_study / load_suite(path); resolve_study(suite, notebook_id) ->
  ResolvedStudy whose arms carry `.resolved` Profiles; study.cells() enumerates the cells
  (skips applied, one seed per repeat); study.cell_identity(cell, engine_version) feeds
  results.cell_id(**...); check_notebook_params(params, papermill_inspect_output).
- Relative paths inside a file (includes, a suite's study files, profiles directory and
  results_dir) are relative to the file that names them, never to the working directory.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import itertools
import json
import sys
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator

from specrepro.fingerprint import local_model_fingerprint

# ---------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a params file: where, what was expected, what was found."""

    file: str
    key: str
    message: str  # "expected ..., found ..." or "unknown key ... (did you mean ...?)"

    def __str__(self) -> str:
        return f"{self.file}: {self.key or '<top>'}: {self.message}"


class ParamsError(ValueError):
    """A params file is wrong; the message names file, key path, expected and found."""

    def __init__(self, problems: list[Problem] | str, context: str = ""):
        self.problems = [problems] if isinstance(problems, Problem) else problems
        if isinstance(problems, str):
            self.problems = []
            text = problems
        else:
            text = "\n".join(str(p) for p in self.problems)
        if context:
            text = f"{text}\n  (while {context})"
        super().__init__(text)


class Expect:
    """Annotated marker: how to describe a field's expected value in an error."""

    def __init__(self, text: str):
        self.text = text


def _display_file(path: Path | str) -> str:
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def dotted(loc: Iterable[str | int]) -> str:
    """('arms', 1, 'concurrency') -> 'arms[1].concurrency'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _found(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ------------------------------------------------------------------------ provenance


@dataclass
class Provenance:
    """Which file set each key path of a merged tree.

    entries maps a key path in the merged data to (file, key path in that file); a
    lookup takes the longest recorded prefix and appends the rest of the path.
    """

    entries: dict[tuple, tuple[str, tuple]] = field(default_factory=dict)

    @classmethod
    def of_file(cls, file: str) -> Provenance:
        return cls({(): (file, ())})

    def locate(self, path: tuple) -> tuple[str, tuple]:
        for n in range(len(path), -1, -1):
            hit = self.entries.get(path[:n])
            if hit is not None:
                return hit[0], hit[1] + path[n:]
        return "<params>", path

    def set(self, path: tuple, origin: tuple[str, tuple]) -> None:
        for key in [k for k in self.entries if len(k) > len(path) and k[: len(path)] == path]:
            del self.entries[key]
        self.entries[path] = origin


@dataclass
class Tree:
    """A YAML mapping together with the provenance of each of its keys."""

    data: dict
    prov: Provenance


def deep_merge(base: Tree, over: Tree, at: tuple = (), src: tuple = ()) -> None:
    """Merge over.data[src] into base.data[at] in place: mappings merge, the rest is replaced."""
    target = _get(base.data, at)
    source = _lookup(over.data, src)
    if not isinstance(source, dict):  # nothing to merge (e.g. an arm without overrides)
        return
    for key, value in source.items():
        here, there = at + (key,), src + (key,)
        if isinstance(value, dict):
            if not isinstance(target.get(key), dict):
                target[key] = {}
                base.prov.set(here, over.prov.locate(there))
            deep_merge(base, over, here, there)
        else:
            target[key] = copy.deepcopy(value)
            base.prov.set(here, over.prov.locate(there))


def _get(data: Any, path: tuple) -> Any:
    for part in path:
        data = data[part]
    return data


def _lookup(data: Any, path: tuple) -> Any:
    """The value at path, or None where the path does not exist."""
    try:
        return _get(data, path)
    except (KeyError, IndexError, TypeError):
        return None


def read_tree(path: Path | str, _seen: tuple[Path, ...] = ()) -> Tree:
    """Read one YAML file with its `include:` chain resolved (later wins, own keys last)."""
    path = Path(path)
    name = _display_file(path)
    if not path.is_file():
        raise ParamsError([Problem(name, "", "expected a YAML file, found nothing at this path")])
    if path.resolve() in _seen:
        chain = " -> ".join(_display_file(p) for p in (*_seen, path))
        raise ParamsError([Problem(name, "include", f"expected no include cycle, found {chain}")])
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ParamsError([Problem(name, "", f"expected valid YAML, found {err}")]) from None
    if not isinstance(raw, dict):
        raise ParamsError(
            [Problem(name, "", f"expected a mapping at the top, found {_found(raw)}")]
        )
    includes = raw.pop("include", [])
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        msg = f"expected a list of relative paths, found {_found(includes)}"
        raise ParamsError([Problem(name, "include", msg)])
    tree = Tree({}, Provenance.of_file(name))
    for rel in includes:
        deep_merge(tree, read_tree(path.parent / rel, (*_seen, path.resolve())))
    deep_merge(tree, Tree(raw, Provenance.of_file(name)))
    return tree


# ------------------------------------------------------------------- error reporting


def _unwrap(tp: Any) -> list[Any]:
    """The alternatives of a type: Optional[X] / X | Y -> [X, Y] (None dropped)."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return [a for arg in typing.get_args(tp) if arg is not type(None) for a in _unwrap(arg)]
    return [tp]


def _marks(tp: Any) -> list[Any]:
    """Annotated metadata inside a union such as Annotated[int, Expect(...)] | None."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return list(tp.__metadata__)
    if origin in (Union, types.UnionType):
        return [m for arg in typing.get_args(tp) for m in _marks(arg)]
    return []


def _walk(model: type[BaseModel], loc: tuple) -> tuple[tuple, tuple | None, str | None, Any]:
    """Follow a pydantic error location through the model's types.

    Returns (location without union tags, location of the deepest field carrying an
    Expect marker or None, its text, the model class that owns the last key).
    """
    clean: tuple = ()
    marked: tuple | None = None
    text: str | None = None
    current: list[Any] = [model]
    owner: Any = model
    for part in loc:
        if part == "[key]":  # pydantic's marker for an invalid mapping key
            continue
        models = [t for t in current if isinstance(t, type) and issubclass(t, BaseModel)]
        if isinstance(part, str) and models and any(part in m.model_fields for m in models):
            owner = next(m for m in models if part in m.model_fields)
            info = owner.model_fields[part]
            clean += (part,)
            marks = [m for m in (*info.metadata, *_marks(info.annotation)) if isinstance(m, Expect)]
            if marks:
                marked, text = clean, marks[0].text
            current = _unwrap(info.annotation)
            continue
        containers = [t for t in current if typing.get_origin(t) in (list, dict, tuple)]
        if containers and (isinstance(part, int) or typing.get_origin(containers[0]) is dict):
            clean += (part,)
            args = typing.get_args(containers[0])
            current = _unwrap(args[-1] if args else Any)
            continue
        if isinstance(part, str) and models:  # an unknown key of a model
            owner = models[0]
            clean += (part,)
            current = [Any]
            continue
        # anything else is a union tag such as 'list[int]' or 'function-after[...]'
    return clean, marked, text, owner


def _problems_from(err: ValidationError, model: type[BaseModel], tree: Tree) -> list[Problem]:
    problems: list[Problem] = []
    seen: set[tuple[str, str]] = set()
    for item in err.errors():
        clean, marked, expect_text, owner = _walk(model, tuple(item["loc"]))
        kind, msg = item["type"], item["msg"]
        if kind == "extra_forbidden":
            key = clean[-1]
            valid = list(owner.model_fields) if isinstance(owner, type) else []
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            message = f"unknown key {key!r}{hint}; expected one of: {', '.join(valid)}"
            path = clean
        elif kind == "missing":
            path, message = clean, "expected a value, found the key missing"
        elif kind.startswith("value_error") or kind == "assertion_error":
            path = clean
            message = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        else:
            path = marked if marked is not None else clean
            expected = expect_text or msg.removeprefix("Input should be ").removeprefix(
                "input should be "
            )
            for words, sign in (
                ("greater than or equal to ", ">= "),
                ("less than or equal to ", "<= "),
                ("greater than ", "> "),
                ("less than ", "< "),
            ):
                expected = expected.replace(words, sign)
            found = clean[-1] if "[key]" in item["loc"] else _lookup(tree.data, path)
            message = f"expected {expected}, found {_found(found)}"
        file, key = tree.prov.locate(path)
        if (dotted(key), message) not in seen:
            seen.add((dotted(key), message))
            problems.append(Problem(file, dotted(key), message))
    return problems


def _validate(model: type[BaseModel], tree: Tree, context: str = "") -> Any:
    try:
        obj = model.model_validate(tree.data)
    except ValidationError as err:
        raise ParamsError(_problems_from(err, model, tree), context) from None
    problems = [Problem(*_located(tree, path), message) for path, message in obj.cross_checks()]
    if problems:
        raise ParamsError(problems, context)
    return obj


def _located(tree: Tree, path: tuple) -> tuple[str, str]:
    file, key = tree.prov.locate(path)
    return file, dotted(key)


# -------------------------------------------------------------------------- models


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


SPEC_METHODS = (
    "mtp",
    "dflash",
    "draft_model",
    "ngram",
    "ngram_gpu",
    "eagle",
    "eagle3",
    "suffix",
    "dspark",
)


def check_schedule(schedule: Schedule) -> Schedule:
    """vLLM's rule for num_speculative_tokens_per_batch_size (dynamic/utils.py):
    [lo, hi, k] ranges, ends inclusive, the first starting at 1, no overlap, k >= 0."""
    if not schedule:
        raise ValueError("expected at least one [lo, hi, k] range, found an empty list")
    if schedule[0][0] != 1:
        raise ValueError(f"expected the first range to start at 1, found {list(schedule[0])}")
    for lo, hi, k in schedule:
        if lo < 1 or hi < lo:
            raise ValueError(f"expected a range with 1 <= lo <= hi, found {[lo, hi, k]}")
        if k < 0:
            raise ValueError(f"expected k >= 0, found {[lo, hi, k]}")
    for prev, nxt in itertools.pairwise(schedule):
        if nxt[0] <= prev[1]:
            raise ValueError(
                f"expected ascending ranges that do not overlap, found {list(prev)} and {list(nxt)}"
            )
    return schedule


def draft_tokens_at(schedule: Schedule | None, default: int, batch_size: int) -> int:
    """Draft length vLLM uses at a batch size: the covering range's k; gaps and the tail
    take the previous range's k; every k is capped at num_speculative_tokens."""
    if not schedule:
        return default
    k = schedule[0][2]
    for lo, _hi, kk in schedule:
        if batch_size >= lo:
            k = kk
    return min(k, default)


class SpeculativeConfig(Strict):
    """Engine-neutral speculative settings, in vLLM's `--speculative-config` keys."""

    method: Literal[SPEC_METHODS]  # type: ignore[valid-type]
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
        return None if value is None else check_schedule(value)

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

    def identity(self) -> dict:
        """What defines the measurement (excludes prose and timeouts) for the cell hash.
        A model or drafter that is a local directory adds its content fingerprint
        (fingerprint.py), so cells measured on other weights at the same path are not replayed."""
        ident = self.model_dump(
            mode="json", exclude={"description", "article_arm", "ready_timeout_s"}
        )
        for key, ref in (("model", self.model), ("drafter", self.drafter)):
            content = local_model_fingerprint(ref.id) if ref is not None else None
            if content is not None:
                ident[key]["content_sha256"] = content
        return ident


WORKLOADS = ("gsm8k", "humaneval", "essays", "prefill")


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
    """Combinations the study does not measure; a missing key matches everything."""

    arm: str | None = None
    workload: str | None = None
    concurrency: Annotated[list[PositiveInt], Expect("a list of positive integers")] | None = None

    def matches(self, arm: str, workload: str, concurrency: int) -> bool:
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
    mode: Literal["requests", "window"] = "requests"
    window_s: PositiveFloat | None = None
    warmup: NonNegInt = 0  # requests sent and discarded before measuring each cell
    ignore_eos: bool = False
    thinking: bool | None = None
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    gates: list[Gate] = Field(default_factory=list)
    skip: list[Skip] = Field(default_factory=list)

    def cross_checks(self) -> list[tuple[tuple, str]]:
        out: list[tuple[tuple, str]] = []
        arms = [a.name for a in self.arms]
        loads = [w.name for w in self.workloads]
        out += _duplicates("arms", arms) + _duplicates("workloads", loads)
        for i, w in enumerate(self.workloads):
            out += [(("workloads", i, *p), m) for p, m in w.cross_checks()]
        if self.baseline is not None and self.baseline not in arms:
            out.append((("baseline",), _one_of("an arm name", arms, self.baseline)))
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
        for i, g in enumerate(self.gates):
            out += _gate_checks(i, g, arms, loads, self.concurrency)
        for i, s in enumerate(self.skip):
            if s.arm is not None and s.arm not in arms:
                out.append((("skip", i, "arm"), _one_of("an arm name", arms, s.arm)))
            if s.workload is not None and s.workload not in loads:
                out.append((("skip", i, "workload"), _one_of("a workload", loads, s.workload)))
        return out

    def seed_for(self, repeat: int) -> int:
        return self.seeds[repeat] if self.seeds is not None else self.seed + repeat

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)

    def skipped(self, arm: str, workload: str, concurrency: int) -> bool:
        return any(s.matches(arm, workload, concurrency) for s in self.skip)

    def cells(self) -> Iterator[Cell]:
        """Every cell the study measures, in a stable order (arm, workload, c, T, repeat)."""
        for arm in self.arms:
            for w in self.workloads:
                for c in self.concurrency:
                    if self.skipped(arm.name, w.name, c):
                        continue
                    for s in self.sampling:
                        for r in range(self.repeats):
                            yield Cell(arm, w, c, s, r, self.seed_for(r))

    def measurement(self) -> dict:
        """Study-level settings that change what a cell measures (part of its identity)."""
        return self.model_dump(
            mode="json",
            include={"mode", "window_s", "warmup", "ignore_eos", "thinking", "reasoning_effort"},
        )


def _duplicates(key: str, names: list[str]) -> list[tuple[tuple, str]]:
    return [
        ((key, i, "name"), f"expected a unique name, found {n!r} again")
        for i, n in enumerate(names)
        if n in names[:i]
    ]


def _one_of(what: str, valid: list, found: Any) -> str:
    close = difflib.get_close_matches(str(found), [str(v) for v in valid], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"expected {what} among {valid}, found {found!r}{hint}"


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


class ResolvedStudy(Study):
    """A study whose arms carry fully resolved profiles (what the runner executes)."""

    arms: list[ResolvedArm]
    notebook_id: str
    source: str  # the file that defined the study

    def cell_identity(self, cell: Cell, engine_version: str | None) -> dict:
        """Everything that defines a cell, for results.cell_id(): the resolved arm
        (profile and overrides, model revisions inside), workload, concurrency,
        sampling, repeat, seed, engine version and the study's measurement settings."""
        arm = next(a for a in self.arms if a.name == cell.arm.name)
        return {
            "arm": {"name": arm.name, "profile": arm.resolved.identity()},
            "workload": cell.workload.model_dump(mode="json"),
            "concurrency": cell.concurrency,
            "sampling": cell.sampling.model_dump(mode="json"),
            "repeat": cell.repeat,
            "seed": cell.seed,
            "engine_version": engine_version,
            "measurement": self.measurement(),
        }


NOTEBOOK_IDS = (
    "01_drafter_block_sweep",
    "02_temperature_spread",
    "03_target_precision",
    "04_engine_comparison",
    "05_fp8_drafter_gates",
    "06_draft_schedule_under_load",
    "07_the_bill",
)


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

    def study_path(self, notebook_id: str) -> Path:
        return (self._path.parent / self.notebooks[notebook_id].study).resolve()


# ---------------------------------------------------------------------------- loading


def load_profile(path: Path | str) -> Profile:
    """Read and validate one profile file; `name` defaults to the file's stem."""
    tree = read_tree(path)
    tree.data.setdefault("name", Path(path).stem)
    profile = _validate(Profile, tree)
    profile._source = _display_file(path)
    return profile


def load_study(path: Path | str) -> Study:
    """Read and validate one study file (its arms' profiles are not loaded)."""
    return _validate(Study, read_tree(path))


def load_suite(path: Path | str) -> Suite:
    """Read and validate a suite file; resolve_study() then gives each notebook's study."""
    path = Path(path)
    tree = read_tree(path)
    suite = _validate(Suite, tree)
    suite._path = path.resolve()
    suite._tree = tree
    for nb in suite.notebooks:
        if not suite.study_path(nb).is_file():
            file, key = _located(tree, ("notebooks", nb, "study"))
            raise ParamsError(
                [
                    Problem(
                        file,
                        key,
                        f"expected a study file, found nothing at "
                        f"{_display_file(suite.study_path(nb))}",
                    )
                ]
            )
    return suite


def resolve_study(suite: Suite, notebook_id: str) -> ResolvedStudy:
    """The study of one notebook with the suite's overrides and profile map applied and
    every arm's profile loaded, overridden and validated."""
    if notebook_id not in suite.notebooks:
        file, _ = _located(suite._tree, ()) if suite._tree else (str(suite.path), "")
        raise ParamsError(
            [
                Problem(
                    file, "notebooks", _one_of("a notebook id", list(suite.notebooks), notebook_id)
                )
            ]
        )
    binding = suite.notebooks[notebook_id]
    tree = read_tree(suite.study_path(notebook_id))
    deep_merge(tree, suite._tree, (), ("notebooks", notebook_id, "overrides"))
    context = f"resolving notebook {notebook_id} of suite {_display_file(suite.path)}"
    study = _validate(Study, tree, context)
    mapping = {**suite.profile_map, **binding.profiles}
    used = {a.profile for a in study.arms}
    for key in binding.profiles:
        if key not in used:
            file, where = _located(suite._tree, ("notebooks", notebook_id, "profiles", key))
            raise ParamsError(
                [
                    Problem(
                        file,
                        where,
                        _one_of("a profile used by the study's arms", sorted(used), key),
                    )
                ],
                context,
            )
    arms = [
        _resolve_arm(suite, notebook_id, tree, i, arm, mapping, context)
        for i, arm in enumerate(study.arms)
    ]
    data = study.model_dump() | {
        "arms": arms,
        "notebook_id": notebook_id,
        "source": tree.prov.locate(())[0],
    }
    return ResolvedStudy.model_validate(data, strict=False)


def _resolve_arm(
    suite: Suite, notebook_id: str, study_tree: Tree, i: int, arm: Arm, mapping: dict, context: str
) -> dict:
    name = mapping.get(arm.profile, arm.profile)
    path = suite.profiles_path / f"{name}.yaml"
    if not path.is_file():
        available = sorted(p.stem for p in suite.profiles_path.glob("*.yaml"))
        file, key = _located(study_tree, ("arms", i, "profile"))
        for where in (("notebooks", notebook_id, "profiles"), ("profile_map",)):
            if name != arm.profile and arm.profile in (_lookup(suite._tree.data, where) or {}):
                file, key = _located(suite._tree, (*where, arm.profile))
                break
        msg = _one_of(f"a profile in {_display_file(suite.profiles_path)}", available, name)
        raise ParamsError([Problem(file, key, msg)], context)
    profile_tree = read_tree(path)
    profile_tree.data.setdefault("name", name)
    deep_merge(profile_tree, study_tree, (), ("arms", i, "overrides"))
    profile = _validate(Profile, profile_tree, f"{context}, arm {arm.name!r}")
    profile._source = _display_file(path)
    return arm.model_dump() | {"resolved": profile}


def standalone_suite(study_path: Path | str, notebook_id: str, profiles: Path | str) -> Suite:
    """A suite of one study file as it stands, bound to a profiles directory."""
    study_path = Path(study_path).resolve()
    data = {
        "name": "standalone",
        "run_id": "standalone",
        "profiles": str(Path(profiles).resolve()),
        "notebooks": {notebook_id: {"study": str(study_path)}},
    }
    suite = Suite.model_validate(data)
    suite._path = study_path
    suite._tree = Tree(data, Provenance.of_file(_display_file(study_path)))
    return suite


def resolve_all(suite: Suite) -> dict[str, ResolvedStudy]:
    return {nb: resolve_study(suite, nb) for nb in suite.notebooks}


def check_notebook_params(
    params: Mapping[str, Any],
    allowed: Mapping[str, Any] | Iterable[str],
    where: str = "notebook parameters",
) -> None:
    """Fail on keys a notebook does not declare (papermill only warns about them).

    allowed: papermill.inspect_notebook(path) output (name -> info) or a list of names.
    """
    names = list(allowed.keys() if isinstance(allowed, Mapping) else allowed)
    problems = []
    for key in params:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(
                Problem(
                    where,
                    key,
                    f"unknown parameter {key!r}{hint}; expected one of: {', '.join(names)}",
                )
            )
    if problems:
        raise ParamsError(problems)


def params_hash(obj: Any) -> str:
    """Short stable hash of any params object or mapping (sorted-key JSON, sha256)."""
    if isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json")
    text = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------ CLI


def _kind(tree: Tree, path: Path) -> str:
    if "notebooks" in tree.data:
        return "suite"
    if "arms" in tree.data:
        return "study"
    if "engine" in tree.data or path.parent.name == "profiles":
        return "profile"
    return "unknown"


def summarize(path: Path | str) -> str:
    """Validate one file of any kind and describe it in a few lines."""
    path = Path(path)
    kind = _kind(read_tree(path), path)
    if kind == "suite":
        suite = load_suite(path)
        lines = [
            (
                f"{path}: suite {suite.name!r}, run_id {suite.run_id!r}, "
                f"results in {_display_file(suite.results_path)}"
            )
        ]
        for nb in suite.notebooks:
            st = resolve_study(suite, nb)
            n_cells = sum(1 for _ in st.cells())
            arms = ", ".join(f"{a.name}={a.resolved.name}" for a in st.arms)
            lines.append(f"  {nb}: {n_cells} cells; arms {arms}")
        return "\n".join(lines)
    if kind == "study":
        st = load_study(path)
        profiles = path.parent.parent / "profiles"
        resolved = st.notebook in NOTEBOOK_IDS and profiles.is_dir()
        if resolved:  # a study beside params/profiles: check its arms' profiles too
            st = resolve_study(standalone_suite(path, st.notebook, profiles), st.notebook)
        return (
            f"{path}: study {st.name!r}, {len(st.arms)} arms, "
            f"{len(st.workloads)} workloads, concurrency {st.concurrency}, "
            f"{sum(1 for _ in st.cells())} cells"
            + ("" if resolved else " (profiles not resolved outside a suite)")
        )
    if kind == "profile":
        pr = load_profile(path)
        return f"{path}: profile {pr.name!r}, engine {pr.engine}, method {pr.method}"
    raise ParamsError(
        [
            Problem(
                _display_file(path),
                "",
                "expected a suite (notebooks:), a study "
                "(arms:) or a profile (engine:), found "
                f"keys {sorted(read_tree(path).data)}",
            )
        ]
    )


def main(argv: list[str] | None = None) -> int:
    """`specrepro check FILE...`: validate params files; exit 2 on the first error."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: specrepro check FILE... (suite, study or profile YAML)")
        return 0 if argv else 2
    status = 0
    for file in argv:
        try:
            print(summarize(file))
        except ParamsError as err:
            print(f"error: {err}", file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
