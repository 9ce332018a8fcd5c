"""The step-cost model's data: cards and models as validated records, each value with its source.

Design:
- Two YAML files beside this module hold the facts:
  `step_cost/cards.yaml` (rated and measured bandwidth, peak math by precision, power cap,
  memory) and `step_cost/models.yaml` (what one pass of a target or drafter reads and
  computes, its layers and KV bytes a token, how a step runs it, and which records a
  published arm runs). Both are read once and validated here into frozen pydantic models.
- Every value is a `Sourced`: a number (or null) and where it comes from. The source must
  open with one of `SOURCE_KINDS` (a measurement here, the vendor's figure, an article's own
  figure, arithmetic on those); a null must say why in its source. A measured source names a
  file of this repository first (tests/test_step_cost.py checks it exists).
- Units live in the keys and are decimal (GB = 1e9 bytes, GB/s, TFLOP/s, GFLOP). A size may
  be given as the article prints it, in exactly one of `bytes`, `gb` or `gib`; `Size.bytes`
  converts it, here and nowhere else, so a GiB is never divided by a TB/s as if it were a GB
  (a slip once found in a README).
- A record is found by what a profile serves: its model or drafter id and the quantization
  the engine applies at load (`model_by_id`). The same checkpoint served as stored and
  quantized at load (vLLM's `--quantization fp8`, a profile's `flags.quantization`) reads
  different bytes a step, so the two are two records: one with `quantization: null` (as
  stored; a quantized checkpoint such as an NVFP4 export has an id of its own) and one naming
  the method. Each (id, quantization) belongs to one record, checked on load.
- A bad file fails on load with `StepCostDataError` naming the file, the key path, what was
  expected and what was found.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from specrepro.params.strict import Strict

CARDS_FILE = "step_cost/cards.yaml"
MODELS_FILE = "step_cost/models.yaml"
SOURCE_KINDS = ("measured:", "vendor:", "article A:", "article B:", "derived:", "not published")
GIB = 2**30
GB = 1e9


class StepCostDataError(ValueError):
    """A step-cost data file is malformed; the message names the file and the key."""


class Sourced(Strict):
    """A number and where it comes from; null only with the reason in the source."""

    value: float | None
    source: str

    @model_validator(mode="after")
    def _source_kind(self) -> Sourced:
        if not self.source.startswith(SOURCE_KINDS):
            raise ValueError(f"source must open with one of {list(SOURCE_KINDS)}, found "
                             f"{self.source[:40]!r}")
        if self.value is not None and self.value <= 0:
            raise ValueError(f"expected a positive number or null, found {self.value}")
        return self


class Size(Strict):
    """A size in exactly one unit: bytes, gb (1e9 B) or gib (2^30 B)."""

    bytes: int | None = Field(default=None, gt=0)
    gb: float | None = Field(default=None, gt=0)
    gib: float | None = Field(default=None, gt=0)
    source: str

    @model_validator(mode="after")
    def _one_unit(self) -> Size:
        given = [k for k in ("bytes", "gb", "gib") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"expected exactly one of bytes, gb, gib, found {given or 'none'}")
        if not self.source.startswith(SOURCE_KINDS):
            raise ValueError(f"source must open with one of {list(SOURCE_KINDS)}")
        return self

    @property
    def n_bytes(self) -> float:
        if self.bytes is not None:
            return float(self.bytes)
        return self.gb * GB if self.gb is not None else self.gib * GIB


class Card(Strict):
    """One card (or CPU): what a decode step is priced against."""

    label: str
    profile_hardware: list[str] = Field(default_factory=list)
    published: str | None = None
    memory_gb: Sourced
    rated_bandwidth_gb_s: Sourced
    measured_bandwidth_gb_s: Sourced
    peak_tflop_s: dict[str, Sourced] = Field(default_factory=dict)
    measured_peak_tflop_s: dict[str, Sourced] = Field(default_factory=dict)
    power_cap_w: Sourced

    @model_validator(mode="after")
    def _some_bandwidth(self) -> Card:
        if self.rated_bandwidth_gb_s.value is None and self.measured_bandwidth_gb_s.value is None:
            raise ValueError("expected a rated or a measured bandwidth, found neither")
        return self

    @property
    def bandwidth_gb_s(self) -> float:
        """What the model divides bytes by: the measured GEMM read, else the rated figure."""
        m = self.measured_bandwidth_gb_s.value
        return m if m is not None else self.rated_bandwidth_gb_s.value

    @property
    def bandwidth_source(self) -> str:
        return "measured" if self.measured_bandwidth_gb_s.value is not None else "rated"

    def peak(self, precision: str) -> tuple[float, str]:
        """(TFLOP/s, 'measured' | 'rated') for a precision: measured where measured, else the
        vendor's dense figure; a precision the card has neither for raises, naming both."""
        for kind, table in (("measured", self.measured_peak_tflop_s), ("rated", self.peak_tflop_s)):
            got = table.get(precision)
            if got is not None and got.value is not None:
                return got.value, kind
        raise StepCostDataError(f"{CARDS_FILE}: card {self.label!r} has no peak for precision "
                                f"{precision!r} (measured: {sorted(self.measured_peak_tflop_s)}, "
                                f"rated: {sorted(self.peak_tflop_s)})")


class Model(Strict):
    """A target or drafter: what one pass reads and computes."""

    label: str
    role: Literal["target", "drafter"]
    drafts: Literal["block", "chain"] | None = None
    ids: list[str] = Field(default_factory=list)
    # the quantization the engine applies to the checkpoint at load (a profile's
    # `flags.quantization`); null: served as stored
    quantization: str | None = None
    weights: Size
    gflop_per_token: dict[str, Sourced]
    layers: Sourced
    kv_bytes_per_token: Sourced

    @model_validator(mode="after")
    def _drafts(self) -> Model:
        if (self.role == "drafter") != (self.drafts is not None):
            raise ValueError("a drafter gives `drafts` (block or chain), a target none")
        if not self.gflop_per_token or any(v.value is None for v in self.gflop_per_token.values()):
            raise ValueError("expected gflop_per_token with a number for each precision")
        if self.quantization == "none":  # model_by_id reads a profile's 'none' as null
            raise ValueError("expected quantization null for a checkpoint served as stored, "
                             "found 'none'")
        return self

    @property
    def kv_bytes(self) -> float:
        return self.kv_bytes_per_token.value or 0.0


class PublishedTarget(Strict):
    article: Literal["A", "B"]
    precision: str
    model: str


class PublishedDrafter(Strict):
    article: Literal["A", "B"]
    method: str
    precision: str | None = None
    model: str


class PublishedMap(Strict):
    targets: list[PublishedTarget]
    drafters: list[PublishedDrafter]


class CardsFile(Strict):
    cards: dict[str, Card]


class ModelsFile(Strict):
    models: dict[str, Model]
    published: PublishedMap

    @model_validator(mode="after")
    def _known(self) -> ModelsFile:
        for entry in [*self.published.targets, *self.published.drafters]:
            if entry.model not in self.models:
                raise ValueError(f"published: {entry.model!r} is no record of `models`")
        # one record a served (id, quantization): else which one a profile finds would
        # depend on the file's order
        claimed: dict[tuple[str, str | None], str] = {}
        for name, m in self.models.items():
            for mid in m.ids:
                other = claimed.setdefault((mid, m.quantization), name)
                if other != name:
                    raise ValueError(f"models: records {other!r} and {name!r} both serve id "
                                     f"{mid!r} with quantization {m.quantization!r}")
        return self


def _load(name: str, schema: type[Strict], text: str | None = None) -> Strict:
    raw = yaml.safe_load(text if text is not None else
                         (resources.files("specrepro.analysis") / name).read_text("utf-8"))
    try:
        return schema.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top)"
        found = first.get("input")
        found = found if not isinstance(found, dict) else f"a mapping with {sorted(found)}"
        raise StepCostDataError(f"{name}: {where}: {first['msg']} (found {found!r})") from None


@functools.cache
def cards() -> dict[str, Card]:
    return _load(CARDS_FILE, CardsFile).cards


@functools.cache
def _models_file() -> ModelsFile:
    return _load(MODELS_FILE, ModelsFile)


def models() -> dict[str, Model]:
    return _models_file().models


def card(name: str) -> Card:
    got = cards().get(name)
    if got is None:
        raise StepCostDataError(f"{CARDS_FILE}: no card {name!r} (cards: {sorted(cards())})")
    return got


def model(name: str) -> Model:
    got = models().get(name)
    if got is None:
        raise StepCostDataError(f"{MODELS_FILE}: no model {name!r} (models: {sorted(models())})")
    return got


def served_quantization(value: object) -> str | None:
    """A profile's quantization flag as a record's `quantization`: None where the checkpoint
    is served as stored (no flag, null, or the embedded engine's 'none')."""
    return None if value in (None, "none") else str(value)


def model_by_id(model_id: str, quantization: str | None = None) -> str | None:
    """The record of what a profile serves, or None: its model or drafter id, and the
    quantization the engine applies at load (a profile's `flags.quantization`; None or
    'none': as stored). Both must match: the bf16 record is not the FP8 one's stand-in."""
    quantization = served_quantization(quantization)
    for name, m in models().items():
        if model_id in m.ids and m.quantization == quantization:
            return name
    return None


def card_for_hardware(name: str | None) -> str | None:
    """The card a profile's `hardware.name` or a published arm's `hardware` denotes."""
    for cid, c in cards().items():
        if name is not None and (name == cid or name == c.published or name in c.profile_hardware):
            return cid
    return None


def published_records(article: str, target_precision: str | None, method: str,
                      drafter_precision: str | None) -> tuple[str | None, str | None]:
    """(target, drafter) records of a published arm; None where the map has none. An arm of
    both articles ("A|B": the vendor's rows both quote) reads article B's records."""
    art = "B" if "B" in article.split("|") else article
    pub = _models_file().published
    target = next((t.model for t in pub.targets
                   if t.article == art and t.precision == target_precision), None)
    drafter = next((d.model for d in pub.drafters if d.article == art and d.method == method
                    and d.precision in (None, drafter_precision)), None)
    return target, drafter


def validate_text(name: str, text: str) -> Strict:
    """Validate a data file's text as `name` (for tests and for editing the files)."""
    schema = {CARDS_FILE: CardsFile, MODELS_FILE: ModelsFile}.get(name)
    if schema is None:
        raise StepCostDataError(f"no step-cost data file {name!r}")
    return _load(name, schema, text)
