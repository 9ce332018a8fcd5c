"""The stand-in's stored speed cells as one table, for the step-cost check.

Design:
- Where the cells are is data (`step_cost/check.yaml`, `standin:`): the H200's bench lines
  (scripts/bench_standin.py's JSON, one speed cell a line, its server a server of the bench
  plan, whose profile says engine, method, drafts, model and drafter) and the H100's results
  store (read through specrepro.store; each cell names its profile and carries its own method,
  drafts and schedule). Nothing here knows a file name.
- One row a measured speed cell (`COLUMNS`): the card, the engine and its runtime (the
  embedded engine compiled or eager: two engines to the model), the arm, the model records
  (step_cost/models.yaml, by the profile's ids and the quantization its engine applies at
  load, `flags.quantization`), drafts at the cell's level (a schedule's
  k there), streams, measured tok/s and acceptance (length, and per position where stored),
  how busy the device was (0-1), context tokens a request, and `source`: the file and line,
  or the store and cell id.
- A stored cell whose target or drafter no record names fails, naming its profile and id:
  priced as another record (the FP8 target as the bf16 one it is quantized from), its error
  would be the wrong model's.
- A cell copied into a second study (`shared_from`) is the first one's measurement and is
  kept once. The acceptance is the cell's own; a level that drafted nothing has none, and a
  step there is plain decoding's.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path

import polars as pl
import yaml
from pydantic import Field, ValidationError

from specrepro.analysis.step_cost.data import (
    MODELS_FILE,
    Sourced,
    StepCostDataError,
    model_by_id,
)
from specrepro.params import load_profile
from specrepro.params.engine_kinds import KINDS
from specrepro.params.strict import Strict
from specrepro.speculative import draft_tokens_at
from specrepro.store import load_cells

CHECK_FILE = "step_cost/check.yaml"
COLUMNS = {"card": pl.String, "engine": pl.String, "runtime": pl.String, "arm": pl.String,
           "profile": pl.String, "target": pl.String, "drafter": pl.String, "drafts": pl.Int64,
           "streams": pl.Int64, "tok_s": pl.Float64, "acceptance_length": pl.Float64,
           "per_position": pl.List(pl.Float64), "busy": pl.Float64,
           "context_tokens": pl.Float64, "source": pl.String, "note": pl.String}


class StandinSource(Strict):
    card: str
    bench: list[str] = Field(default_factory=list)
    plan: str | None = None
    store: str | None = None
    profiles: str
    context_tokens: Sourced | None = None


class ArticleValue(Strict):
    article: str
    workload: str | None = None
    arm: str | None = None
    value: float | None
    source: str


class AcceptanceAtK(Strict):
    article: str
    method: str
    drafts: int
    arm: str
    source: str


class Articles(Strict):
    context_tokens: list[ArticleValue]
    request_slots: list[ArticleValue | dict]
    acceptance_at_k: list[AcceptanceAtK]


class CheckFile(Strict):
    standin: list[StandinSource]
    reference_card: str
    articles: dict


@functools.cache
def check_config() -> dict:
    """step_cost/check.yaml, validated: {'standin': [...], 'reference_card': str, 'articles': {...}}."""
    raw = yaml.safe_load((resources.files("specrepro.analysis") / CHECK_FILE).read_text("utf-8"))
    try:
        parsed = CheckFile.model_validate(raw)
        arts = raw["articles"]
        contexts = [ArticleValue.model_validate(v) for v in arts["context_tokens"]]
        slots = [ArticleValue.model_validate({"article": "B", **v}) for v in arts["request_slots"]]
        at_k = [AcceptanceAtK.model_validate(v) for v in arts["acceptance_at_k"]]
    except (KeyError, TypeError) as err:
        raise StepCostDataError(f"{CHECK_FILE}: articles: missing or malformed {err}") from None
    except ValidationError as err:  # pydantic's message names the key
        raise StepCostDataError(f"{CHECK_FILE}: {err}") from None
    for s in parsed.standin:
        if bool(s.bench) == bool(s.store):
            raise StepCostDataError(f"{CHECK_FILE}: standin card {s.card!r}: expected `bench` "
                                    "lines or a `store`, exactly one")
        if s.bench and (s.plan is None or s.context_tokens is None):
            raise StepCostDataError(f"{CHECK_FILE}: standin card {s.card!r}: bench lines need "
                                    "`plan` and `context_tokens`")
    return {"standin": parsed.standin, "reference_card": parsed.reference_card,
            "context_tokens": contexts, "request_slots": slots, "acceptance_at_k": at_k}


@functools.cache
def _profile(path: Path):
    """A profile file, loaded once (every cell of an arm names the same one)."""
    return load_profile(path)


def runtime_of(profile) -> str:
    """The engine as the model sees it: where the engine's kind has a flag that compiles its
    step (the embedded engine's `compile`), its compiled and eager runs differ; else ''."""
    kind = KINDS.get(profile.engine)
    if kind is None or kind.compile_flag is None:
        return ""
    return "compiled" if profile.flags.get(kind.compile_flag) else "eager"


def target_record(profile) -> str | None:
    """The record of the target a profile serves: its model id and the quantization its
    engine applies at load (`flags.quantization`), or None where no record has both."""
    return model_by_id(profile.model.id, profile.flags.get("quantization"))


def _records(profile, method: str | None) -> tuple[str | None, str | None]:
    target = target_record(profile)
    if method in (None, "none"):
        return target, None
    # an engine's own drafter folder, else the embedded engine's drafter beside its model
    drafter_id = profile.drafter.id if profile.drafter else f"{profile.model.id}/{method}"
    return target, model_by_id(drafter_id)


def _unpriced(profile, target: str | None, drafter: str | None, method: str | None,
              where: str) -> StepCostDataError | None:
    """The error for a measured cell whose target or drafter has no record: priced as
    another record's, its error would be the wrong model's (the FP8 target read as bf16)."""
    if target is None:
        q = profile.flags.get("quantization")
        return StepCostDataError(
            f"{where}: profile {profile.name!r} serves model id {profile.model.id!r}"
            + (f" with quantization {q!r}" if q not in (None, "none") else "")
            + f", which no record of {MODELS_FILE} names (its `ids` and `quantization`)")
    if method and drafter is None:
        return StepCostDataError(f"{where}: profile {profile.name!r} drafts by {method!r} with "
                                 f"a drafter no record of {MODELS_FILE} names")
    return None


def _bench_rows(src: StandinSource, root: Path) -> list[dict]:
    plan = yaml.safe_load((root / src.plan).read_text())
    servers = {name: s["profile"] for ph in plan["phases"].values()
               for name, s in ph["servers"].items()}
    rows = []
    for path in src.bench:
        for n, line in enumerate((root / path).read_text().splitlines(), 1):
            d = json.loads(line)
            if d.get("kind") != "speed":
                continue
            name = servers.get(d["server"])
            if name is None:
                raise StepCostDataError(f"{path}:{n}: server {d['server']!r} is no server of {src.plan}")
            prof = _profile(root / src.profiles / f"{name}.yaml")
            spec = prof.speculative
            method = spec.method if spec else None
            target, drafter = _records(prof, method)
            if target is None:
                continue  # the small target's cells: not the stand-in's
            if err := _unpriced(prof, target, drafter, method, f"{path}:{n}"):
                raise err
            rows.append({"card": src.card, "engine": prof.engine, "runtime": runtime_of(prof),
                         "arm": d["server"], "profile": name, "target": target,
                         "drafter": drafter, "drafts": spec.num_speculative_tokens if spec else 0,
                         "streams": d["concurrency"], "tok_s": d["client_tok_s"],
                         "acceptance_length": d.get("acceptance_length"), "per_position": None,
                         "busy": d["gpu_util_pct"] / 100 if d.get("gpu_util_pct") is not None else None,
                         "context_tokens": src.context_tokens.value, "source": f"{path}:{n}",
                         "note": None})
    return rows


def _store_rows(src: StandinSource, root: Path) -> list[dict]:
    rows = []
    for study in sorted(p for p in (root / src.store).iterdir() if p.is_dir()):
        cells = load_cells(study)
        for c in cells.iter_rows(named=True):
            if c.get("shared_from") or c["agg_tok_s"] is None:
                continue
            prof = _profile(root / src.profiles / f"{c['profile']}.yaml")
            method = c["method"] if c["method"] != "none" else None
            schedule = json.loads(c["schedule"]) if c.get("schedule") else None
            k = draft_tokens_at(schedule, c["num_speculative_tokens"] or 0, c["concurrency"]) \
                if method else 0
            target, drafter = _records(prof, method)
            if err := _unpriced(prof, target, drafter, method,
                                f"{src.store}/{study.name}: {c['arm']} at {c['concurrency']}"):
                raise err
            per_request = max(c["n_requests"] or 1, 1)
            # a level whose schedule drafts nothing, but whose window counted drafts: the batch
            # crossed the schedule's switch inside the window (mixed steps)
            mixed = (f"drafted on part of the window's steps (acceptance "
                     f"{c['acceptance_length']:.2f}): the batch crossed the schedule's switch"
                     if method and not k and c["acceptance_length"] is not None else None)
            rows.append({"card": src.card, "engine": prof.engine, "runtime": runtime_of(prof),
                         "arm": c["arm"], "profile": c["profile"], "target": target,
                         "drafter": drafter, "drafts": k,
                         "streams": c["concurrency"], "tok_s": c["agg_tok_s"],
                         "acceptance_length": c["acceptance_length"] if k else None,
                         "per_position": c["per_position_acceptance"] if k else None,
                         "busy": c["busy_share"],
                         "context_tokens": ((c["prompt_tokens"] or 0)
                                            + (c["output_tokens"] or 0) / 2) / per_request,
                         "source": f"{src.store}/{study.name}: {c['arm']} at {c['concurrency']} "
                                   f"(cell {c['cell_id'][:10]})", "note": mixed})
    return rows


def standin_cells(root: Path | str = ".") -> pl.DataFrame:
    """Every stored speed cell of the stand-in, one row each (`COLUMNS`), read from `root`
    (the project root)."""
    root = Path(root)
    rows: list[dict] = []
    for src in check_config()["standin"]:
        rows += _bench_rows(src, root) if src.bench else _store_rows(src, root)
    return pl.DataFrame(rows, schema=COLUMNS)
