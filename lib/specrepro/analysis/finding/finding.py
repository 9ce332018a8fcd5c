"""A finding's data: its resolved study and the stored cells and requests it is drawn from.

Design:
- A `Finding` is one notebook's resolved study, the stored `ok` cells and requests it is
  drawn from, and the run's manifest; `specrepro.pipeline.load_finding` builds it (replaying
  the store or measuring first). This module only reads results tables.
- Modes (`MODES`, a notebook's `mode` parameter): `replay` reads the results store and never
  measures; `run` measures the whole study anew; `auto` replays when every cell the study
  declares has a stored `ok` row that matches it, and measures otherwise.
- A stored row matches a declared cell when its cell id is the one the declared cell has
  with the row's engine version (`same_identity`, `specrepro.identity.cell_id`); rows of
  the same arm and level made under other parameters (a profile flag, the prompt form, stop
  strings) are left out, so a changed study never mixes its figures with stale ones and
  `auto` measures it anew. Where that leaves a declared cell missing, the finding says so
  (`other_identity_text`): how many rows, the profile hash recorded at their engine starts
  against the one resolved now, and, where the manifest recorded the served folders'
  content fingerprints, the folder whose bytes differ here (an export written anew).
- A store may hold only part of a study (a run stopped at its deadline): the finding keeps
  the missing cells (`missing_cells`) and says in words which they are (`missing_text`);
  nothing stands in for them. `auto` measures them only where this machine can run the
  arms (`cannot_measure_here`: an arm whose engine runs with `--device cuda` needs an NVIDIA
  GPU that NVML sees); elsewhere it replays what is stored and says why it did not measure.
- Paths in a notebook's parameters are relative to the project root (`project_root`,
  `at_project_root`), under Jupyter and under papermill alike.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import polars as pl

from specrepro import identity, provenance
from specrepro.analysis.finding.cell_key import CELL_KEY, LEVEL, READING, at, declared_key, key_of
from specrepro.analysis.finding.text_quality import with_length_share
from specrepro.analysis.finding.window_health import with_health
from specrepro.params import ResolvedStudy, Suite
from specrepro.store import (
    CELL_SCHEMA,
    ResultStore,
    empty,
    load_cells,
    load_requests,
    requests_missing,
)

# A notebook's `mode` parameter: the notebook runner checks it before executing, and
# specrepro.pipeline.load_finding acts on it (defined here, below both).
Mode = Literal["auto", "run", "replay"]
MODES = ("auto", "run", "replay")

# Columns that tie a stored row to the cell the study declares: its key and what the study
# says the arm runs and on how many prompts.
CELL_MATCH = [*CELL_KEY, "profile", "method", "num_speculative_tokens", "n_prompts", "seed"]


class FindingError(RuntimeError):
    """A finding cannot be loaded; the message names the study, the store and what to do."""


def project_root(start: Path | None = None) -> Path:
    """The checkout holding this project: the nearest directory above with pyproject.toml
    and findings/ (a notebook opened in Jupyter runs in its folder findings/<id>/, papermill
    at the root)."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "pyproject.toml").is_file() and (d / "findings").is_dir():
            return d
    raise FindingError(f"no project root (pyproject.toml and findings/) above {here}")


def at_project_root() -> Path:
    """Make the project root the working directory, so every relative path in a notebook's
    parameters means the same thing under Jupyter and under papermill."""
    root = project_root()
    os.chdir(root)
    return root


@dataclass
class Finding:
    """One notebook's study and its data."""

    notebook_id: str
    study: ResolvedStudy
    suite: Suite
    store_root: Path  # <results_dir>/<study>/<run_id>
    # one ok row per declared cell: CELL_SCHEMA columns, label, and each cell's marks
    # (analysis/finding/window_health.py: `health`, `own_warnings`)
    cells: pl.DataFrame
    requests: pl.DataFrame  # the requests of those attempts
    measured: bool  # this call measured (False: replayed)
    manifest: dict
    missing: int = 0  # declared cells with no ok row (failed or not yet measured)
    not_measured_why: str = ""  # why `auto` replayed with cells missing (cannot_measure_here)
    # the study's A/A twins (arms declared `noise_of`): their cells and the arm each is the
    # noise of. A twin is no arm of the finding: `study` and `cells` leave them out, so no
    # table, figure or claim shows one; analysis/verdict/noise.py reads them.
    twin_cells: pl.DataFrame | None = None
    twin_of: dict[str, str] = field(default_factory=dict)
    # local folders absent here whose cells were matched by the manifest's fingerprint
    recorded: dict[str, str] = field(default_factory=dict)

    @property
    def declared(self) -> int:
        """How many cells the study declares."""
        return declared_cells(self.study).height

    def missing_text(self) -> str:
        """The declared cells with no successful measurement, in words ('' when none)."""
        if not self.missing:
            return ""
        return missing_text(self.study, missing_cells(self.store_root, self.study, self.cells))

    def other_identity_text(self) -> str:
        """Why stored ok rows at a missing cell's level were left out, in words ('' when
        none are): measured under another identity (`other_identity_text`)."""
        if not self.missing:
            return ""
        return other_identity_text(self.study, self.store_root, self.manifest,
                                   missing_cells(self.store_root, self.study, self.cells))

    @property
    def labels(self) -> dict[str, str]:
        return {a.name: a.label or a.name for a in self.study.arms}

    @property
    def challenger(self) -> str:
        """The first arm that is not the baseline (the arm a two-arm study judges)."""
        return next(a.name for a in self.study.arms if a.name != self.study.baseline)

    @property
    def challengers(self) -> list[str]:
        """Every arm that is not the baseline, in the study's order: the judged challenger
        first, then arms a substrate adds beside it (03's FP8 target on the H200)."""
        return [a.name for a in self.study.arms if a.name != self.study.baseline]

    @property
    def engines(self) -> list[str]:
        return sorted({a.resolved.engine for a in self.study.arms})

    @property
    def has_power(self) -> bool:
        return self.cells["power_w_mean"].drop_nulls().len() > 0

    def describe(self) -> str:
        how = "measured now" if self.measured else "replayed from the store"
        engines = ", ".join(sorted(set(self.cells["engine"].drop_nulls().to_list()))) or "none"
        versions = sorted(set(self.cells["engine_version"].drop_nulls().to_list()))
        return (
            f"{self.notebook_id}: {self.cells.height} cells of study {self.study.name!r} "
            f"({how}) from {self.store_root}; engines {engines}"
            + (f" ({', '.join(versions)})" if versions else "")
            + f"; params {self.suite.path.name}"
            + (f"; {self.missing} of the {self.declared} declared cells have no successful "
               f"measurement and are left out, never estimated: {self.missing_text()} (see "
               f"{self.store_root / 'manifest.json'})" if self.missing else "")
            + (f"; {other}" if (other := self.other_identity_text()) else "")
            + (f"; not measured here: {self.not_measured_why}" if self.not_measured_why
               else "")
            + (f"; {', '.join(sorted(self.recorded))} not on this machine: cells matched by "
               "the content fingerprint the manifest recorded where they were measured"
               if self.recorded else "")
        )


def from_store(notebook_id: str, study: ResolvedStudy, suite: Suite, store_root: Path,
               stored: pl.DataFrame, measured: bool = False, why_not: str = "") -> Finding:
    """The Finding of a study's stored ok cells (stored_cells): each labelled with its arm's
    label, their requests, the store's manifest, and how many declared cells are missing."""
    labels = {a.name: a.label or a.name for a in study.arms}
    cells = stored.with_columns(pl.col("arm").replace_strict(labels, default=None).alias("label"))
    reqs = load_requests(store_root, cells)
    # stores written before cells kept it: requests cut at the cap, from their finish_reason
    cells = with_length_share(cells, reqs)
    cells = with_health(cells, study)  # each cell's window and warning marks, judged once
    manifest = ResultStore(store_root.parent.parent, study.name,
                                   store_root.name).manifest()
    twin_of = {a.name: a.noise_of for a in study.arms if a.noise_of is not None}
    twins = cells.filter(pl.col("arm").is_in(list(twin_of)))
    if twin_of:  # the finding's own arms (Finding.twin_cells)
        cells = cells.filter(~pl.col("arm").is_in(list(twin_of)))
        stored = stored.filter(~pl.col("arm").is_in(list(twin_of)))
        reqs = reqs.filter(pl.col("cell_id").is_in(cells["cell_id"].to_list()))
        study = study.model_copy(update={"arms": [a for a in study.arms
                                                  if a.noise_of is None]})
    return Finding(notebook_id, study, suite, store_root, cells, reqs, measured, manifest,
                   missing_cells(store_root, study, stored).height, why_not, twins, twin_of,
                   absent_folders_recorded(store_root, study))


def missing_folders(study: ResolvedStudy, root: Path = Path(".")) -> dict[str, str]:
    """The model and drafter folders the study's arms name by a local path that does not
    exist under root ({path: the first profile naming it}): a cell's identity holds such a
    folder's fingerprint, so without it no stored cell matches."""
    gone: dict[str, str] = {}
    for arm in study.arms:
        p = arm.resolved
        for ref in (p.model, p.drafter):
            if ref is not None and ref.id.startswith(("build/", "models/", "./", "/")) \
                    and not (root / ref.id).is_dir():
                gone.setdefault(ref.id, p.name)
    return gone


def declared_cells(study: ResolvedStudy) -> pl.DataFrame:
    """The cells the study declares, with the columns a stored row must match."""
    rows = []
    for cell in study.cells():
        prof = next(a for a in study.arms if a.name == cell.arm.name).resolved
        spec = prof.speculative
        rows.append({
            "arm": cell.arm.name,
            "workload": cell.workload.name,
            "concurrency": cell.concurrency,
            "temperature": cell.sampling.temperature,
            "repeat": cell.repeat,
            "profile": prof.name,
            "method": prof.method,
            "num_speculative_tokens": spec.num_speculative_tokens if spec else None,
            "n_prompts": cell.workload.n,
            "seed": cell.seed,
        })
    schema = {c: CELL_SCHEMA[c] for c in CELL_MATCH}
    return pl.DataFrame(rows, schema=schema, orient="row")


def stored_cells(store_root: Path, study: ResolvedStudy) -> pl.DataFrame:
    """The store's ok rows that match a declared cell (latest attempt per cell)."""
    declared = declared_cells(study)
    cells = load_cells(store_root) if store_root.is_dir() else empty(
        CELL_SCHEMA)
    # a null matches a null (no speculation has no draft count)
    joined = cells.join(declared.select(CELL_MATCH), on=CELL_MATCH, how="semi", nulls_equal=True)
    recorded = absent_folders_recorded(store_root, study)
    joined = joined.filter(pl.Series(same_identity(study, joined, recorded), dtype=pl.Boolean))
    latest = (joined.sort("ended_at", nulls_last=False)
              .group_by(CELL_KEY, maintain_order=True).last())
    order = {a.name: i for i, a in enumerate(study.arms)}
    return (latest.with_columns(pl.col("arm").replace_strict(order, default=None)
                                .alias("_order"))
            .sort(["_order", *LEVEL, "repeat"])
            .drop("_order"))


def absent_folders_recorded(store_root: Path, study: ResolvedStudy) -> dict[str, str]:
    """For the local folders the study's arms name that do not exist here (the GPU
    machine's stand-in, `missing_folders`), the content fingerprint the store's manifest
    recorded where they were measured: a replay elsewhere matches its cells by the record
    (the report says so, `Finding.describe`); a folder that exists is read from its bytes."""
    gone = missing_folders(study)
    if not gone or not (store_root / "manifest.json").is_file():
        return {}
    manifest = ResultStore(store_root.parent.parent, study.name, store_root.name).manifest()
    return {k: v for k, v in identity.recorded_fingerprints(manifest).items() if k in gone}


def same_identity(study: ResolvedStudy, rows: pl.DataFrame,
                  recorded: dict[str, str] | None = None) -> list[bool]:
    """Per stored row: was it measured for one of the declared cells at its level, exactly?

    The row's cell id hashes everything that defines the cell (resolved profile with its
    flags, workload form, shots, stop strings, sampling, measurement settings, engine
    version). Recomputing it for the declared cells with the row's own engine version keeps
    out rows made under other parameters that share the arm, workload name and level.
    """
    by_level: dict[tuple, list] = {}
    for cell in study.cells():
        by_level.setdefault(declared_key(cell), []).append(cell)
    # each arm's profile identity once, not once a row: it walks the local model folders' files
    profiles: dict[str, dict] = {}
    keep = []
    for row in rows.select([*CELL_KEY, "cell_id", "engine_version"]).iter_rows(named=True):
        cands = by_level.get(key_of(row), [])
        keep.append(any(identity.cell_id(study, c, row["engine_version"], recorded, profiles)
                        == row["cell_id"] for c in cands))
    return keep


def other_identity_text(study: ResolvedStudy, store_root: Path, manifest: dict,
                        missing: pl.DataFrame | None = None) -> str:
    """The store's ok rows at a missing cell's level (arm, workload, load, sampling, repeat)
    whose identity is not the declared cell's, per arm in words: how many, and whether the
    arm's profile as resolved now differs from the one the manifest recorded at their starts
    (a profile field, or the content of a local model or drafter folder it names: an export
    written anew) or not (then the study's workload or measurement settings changed).
    `missing`: the study's `missing_cells`, when the caller has them already."""
    if not store_root.is_dir():
        return ""
    if missing is None:
        missing = missing_cells(store_root, study)
    # a cell is missing when no ok row at its level has its identity (`stored_cells`), so
    # every ok row at a missing cell's level is one that same_identity kept out
    other = load_cells(store_root).join(missing.select(CELL_MATCH), on=CELL_MATCH,
                                                how="semi", nulls_equal=True)
    parts = []
    for arm in study.arms:
        rows = other.filter(pl.col("arm") == arm.name)
        if not rows.height:
            continue
        now = identity.profile_hash(arm.resolved)
        then = [s for s in manifest.get("sessions", [])
                if any(e.get("arm") == arm.name and e.get("profile_hash") not in (None, now)
                       for e in s.get("engines") or [])]
        recorded = sorted({e.get("profile_hash") for s in then for e in s.get("engines") or []
                           if e.get("arm") == arm.name and e.get("profile_hash")} - {now})
        n = rows.height
        text = (f"{n} stored cell{'s' if n != 1 else ''} of {arm.name} at those levels "
                f"{'were' if n != 1 else 'was'} measured under another identity")
        if recorded:
            text += (f": the manifest records its profile as {', '.join(recorded)} at their "
                     f"engine starts, resolved now it is {now} ({_what_changed(arm, then)})")
        else:
            text += (" (its profile is the one recorded; the study's workload, sampling or "
                     "measurement settings changed)")
        parts.append(text)
    return "; ".join(parts)


def _what_changed(arm, sessions: list[dict]) -> str:
    """Which part of an arm's profile changed since `sessions` started it: a local model or
    drafter folder whose content fingerprint those sessions recorded and this machine's
    differs from, else a profile field when every folder's recorded content is this one's,
    else either (sessions older than the recorded fingerprints cannot tell)."""
    changed, unknown = [], []
    for ref in (arm.resolved.model, arm.resolved.drafter):
        here = identity.local_model_fingerprint(ref.id) if ref is not None else None
        if here is None:
            continue
        seen = sorted({m["content_sha256"] for s in sessions for m in s.get("models") or []
                       if m.get("id") == ref.id and m.get("content_sha256")})
        if not seen:
            unknown.append(ref.id)
        elif here not in seen:
            changed.append(f"{ref.id}: content {', '.join(seen)} then, {here} here")
    if changed:
        return ("the engine served other bytes of a local folder than this machine holds: "
                + "; ".join(changed) + ", e.g. an export written anew")
    if not unknown:
        return "a profile field changed; its local folders hold the bytes recorded"
    return ("a profile field changed, or the content of " + " or ".join(unknown)
            + " is not what the engine served: an export written anew")


def missing_cells(store_root: Path, study: ResolvedStudy,
                  stored: pl.DataFrame | None = None) -> pl.DataFrame:
    """Declared cells with no matching ok row in the store (`stored`: the store's
    `stored_cells`, when the caller has them already)."""
    if stored is None:
        stored = stored_cells(store_root, study)
    have = stored.select(CELL_MATCH)
    return declared_cells(study).join(have, on=CELL_MATCH, how="anti", nulls_equal=True)


def to_measure(store_root: Path, study: ResolvedStudy,
               stored: pl.DataFrame | None = None) -> pl.DataFrame:
    """The declared cells a measuring run would measure: the missing ones, and the stored
    ones whose requests are not all stored (a requests file set aside in quarantine/ or
    removed; `ResultStore.completed_cell_ids` measures them again), so a notebook in mode
    auto measures what `specrepro run` would."""
    if stored is None:
        stored = stored_cells(store_root, study)
    missing = missing_cells(store_root, study, stored)
    if not stored.height or not store_root.is_dir():
        return missing
    lost = requests_missing(store_root).select("cell_id")
    if not lost.height:
        return missing
    again = stored.join(lost, on="cell_id", how="semi").select(CELL_MATCH)
    return pl.concat([missing, declared_cells(study).join(again, on=CELL_MATCH, how="semi",
                                                            nulls_equal=True)])


def _streams(n: int) -> str:
    return f"{n} stream{'s' if n != 1 else ''}"


def missing_text(study: ResolvedStudy, missing: pl.DataFrame) -> str:
    """The missing cells in words, per arm in the study's order: 'schedule: all 18 cells;
    static-k7: 4 streams (2 of its 3 repeats: 1, 2), 8 streams, ...' (the workload and
    temperature are named where the study has more than one)."""
    if not missing.height:
        return ""
    declared = declared_cells(study)
    multi_work = declared["workload"].n_unique() > 1
    multi_temp = declared["temperature"].n_unique() > 1
    parts = []
    for arm in [a.name for a in study.arms]:
        gone = missing.filter(pl.col("arm") == arm)
        if not gone.height:
            continue
        mine = declared.filter(pl.col("arm") == arm)
        if gone.height == mine.height:
            parts.append(f"{arm}: all {mine.height} cells")
            continue
        levels = []
        for (work, temp, conc), g in gone.group_by(READING, maintain_order=True):
            want = mine.filter(at(dict(zip(READING, (work, temp, conc), strict=True)),
                                  READING))
            where = ", ".join(([work] if multi_work else [])
                              + ([f"T={temp:g}"] if multi_temp else []))
            text = _streams(conc) + (f" at {where}" if where else "")
            if g.height < want.height:
                reps = ", ".join(str(r) for r in sorted(g["repeat"].to_list()))
                text += f" ({g.height} of its {want.height} repeats: {reps})"
            levels.append(text)
        parts.append(f"{arm}: " + ", ".join(levels))
    return "; ".join(parts)


def cuda_arms(study: ResolvedStudy) -> list[str]:
    """The arms whose engine needs an NVIDIA GPU: run with `--device cuda`, or a vLLM or
    SGLang the harness launches (an attached one is wherever its URL is)."""
    return [a.name for a in study.arms if a.resolved.needs_gpu]


def devices(study: ResolvedStudy, arms=None) -> set[str]:
    """Where the named arms (default: all the study's) ran their engine: "cuda" for
    `cuda_arms`, "cpu" for the rest (what claims.yaml's `device: cpu | cuda` entries match)."""
    gpu = set(cuda_arms(study))
    names = [a.name for a in study.arms] if arms is None else arms
    return {"cuda" if a in gpu else "cpu" for a in names}


def cannot_measure_here(study: ResolvedStudy) -> str:
    """Why this machine cannot measure the study's arms ('' when it can): arms that run on
    `--device cuda` and no NVIDIA GPU that NVML sees."""
    arms = cuda_arms(study)
    if not arms:
        return ""
    gpu = provenance.gpu_info()
    if gpu.get("gpus"):
        return ""
    note = f" ({gpu['note']})" if gpu.get("note") else ""
    return (f"arms {', '.join(arms)} run their engine on a GPU (--device cuda, or vLLM or "
            f"SGLang) and this machine has no NVIDIA GPU{note}")
