"""A finding's data: its resolved study and the stored cells and requests it is drawn from.

Design:
- `load_finding(params_file, notebook_id, mode, results_dir, overrides)` is the one call a
  notebook makes to get its data. The suite file and the notebook's `overrides` (merged
  into the study as a suite's own overrides are, validated the same way) give the study.
- Modes: `replay` reads the results store and never measures (an empty store is an error
  that says how to measure); `run` measures the whole study anew through the harness's
  `run_study`; `auto` replays when every cell the study declares has a stored `ok` row
  that matches it, and measures otherwise (the runner resumes: only missing cells run).
- A stored row matches a declared cell when its cell id is the one the declared cell has
  with the row's engine version (`same_identity`); rows of the same arm and level made
  under other parameters (a profile flag, the prompt form, stop strings) are left out, so
  a changed study never mixes its figures with stale ones and `auto` measures it anew.
- Analysis reads results tables only (docs/architecture.md); measuring is delegated.
"""

from __future__ import annotations

import copy
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import polars as pl

from specrepro import results
from specrepro.params import (
    Provenance,
    ResolvedStudy,
    Suite,
    Tree,
    deep_merge,
    load_suite,
    resolve_study,
)

Mode = Literal["auto", "run", "replay"]
MODES = ("auto", "run", "replay")

# Columns that tie a stored row to the cell the study declares.
CELL_KEY = ["arm", "workload", "concurrency", "temperature", "repeat"]
CELL_MATCH = [*CELL_KEY, "profile", "method", "num_speculative_tokens", "n_prompts", "seed"]


class FindingError(RuntimeError):
    """A finding cannot be loaded; the message names the study, the store and what to do."""


def project_root(start: Path | None = None) -> Path:
    """The checkout holding this project: the nearest directory above with pyproject.toml
    and notebooks/ (a notebook opened in Jupyter runs in notebooks/, papermill at the root)."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "pyproject.toml").is_file() and (d / "notebooks").is_dir():
            return d
    raise FindingError(f"no project root (pyproject.toml and notebooks/) above {here}")


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
    cells: pl.DataFrame  # one ok row per declared cell (CELL_SCHEMA columns + label)
    requests: pl.DataFrame  # the requests of those attempts
    measured: bool  # this call measured (False: replayed)
    manifest: dict
    missing: int = 0  # declared cells with no ok row (failed or not yet measured)

    @property
    def labels(self) -> dict[str, str]:
        return {a.name: a.label or a.name for a in self.study.arms}

    @property
    def challenger(self) -> str:
        """The first arm that is not the baseline (the arm a two-arm study judges)."""
        return next(a.name for a in self.study.arms if a.name != self.study.baseline)

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
            + (f"; {self.missing} declared cells have no successful measurement (see "
               f"{self.store_root / 'manifest.json'})" if self.missing else "")
        )


def study_for(params_file: str | Path, notebook_id: str, overrides: dict | None = None
              ) -> tuple[Suite, ResolvedStudy]:
    """The notebook's study from a suite, with the notebook's overrides merged on top of the
    suite's own (mappings merge key by key, lists replace), validated with file and key."""
    suite = load_suite(params_file)
    if overrides:
        suite = copy.copy(suite)
        tree = copy.deepcopy(suite._tree)
        patch = Tree({"notebooks": {notebook_id: {"overrides": copy.deepcopy(overrides)}}},
                     Provenance.of_file(f"notebook parameter 'overrides' of {notebook_id}"))
        deep_merge(tree, patch)
        suite._tree = tree
    return suite, resolve_study(suite, notebook_id)


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
    schema = {c: results.CELL_SCHEMA[c] for c in CELL_MATCH}
    return pl.DataFrame(rows, schema=schema, orient="row")


def stored_cells(store_root: Path, study: ResolvedStudy) -> pl.DataFrame:
    """The store's ok rows that match a declared cell (latest attempt per cell)."""
    declared = declared_cells(study)
    cells = results.load_cells(store_root) if store_root.is_dir() else results.empty(
        results.CELL_SCHEMA)
    # a null matches a null (no speculation has no draft count)
    joined = cells.join(declared.select(CELL_MATCH), on=CELL_MATCH, how="semi", nulls_equal=True)
    joined = joined.filter(pl.Series(same_identity(study, joined), dtype=pl.Boolean))
    latest = (joined.sort("ended_at", nulls_last=False)
              .group_by(CELL_KEY, maintain_order=True).last())
    order = {a.name: i for i, a in enumerate(study.arms)}
    return (latest.with_columns(pl.col("arm").replace_strict(order, default=None)
                                .alias("_order"))
            .sort(["_order", "workload", "concurrency", "temperature", "repeat"])
            .drop("_order"))


def same_identity(study: ResolvedStudy, rows: pl.DataFrame) -> list[bool]:
    """Per stored row: was it measured for one of the declared cells at its level, exactly?

    The row's cell id hashes everything that defines the cell (resolved profile with its
    flags, workload form, shots, stop strings, sampling, measurement settings, engine
    version). Recomputing it for the declared cells with the row's own engine version keeps
    out rows made under other parameters that share the arm, workload name and level.
    """
    by_level: dict[tuple, list] = {}
    for cell in study.cells():
        level = (cell.arm.name, cell.workload.name, cell.concurrency,
                 cell.sampling.temperature, cell.repeat)
        by_level.setdefault(level, []).append(cell)
    keep = []
    for row in rows.select([*CELL_KEY, "cell_id", "engine_version"]).iter_rows(named=True):
        cands = by_level.get(tuple(row[k] for k in CELL_KEY), [])
        keep.append(any(results.cell_id(study.cell_identity(c, row["engine_version"]))
                        == row["cell_id"] for c in cands))
    return keep


def missing_cells(store_root: Path, study: ResolvedStudy) -> pl.DataFrame:
    """Declared cells with no matching ok row in the store."""
    have = stored_cells(store_root, study).select(CELL_MATCH)
    return declared_cells(study).join(have, on=CELL_MATCH, how="anti", nulls_equal=True)


def measure(study: ResolvedStudy, results_dir: Path, run_id: str, fresh: bool) -> None:
    """Measure the study into the store through the harness's runner (the only call that
    starts engines); fresh=True measures every cell again as a new attempt. Engines start
    in the project root, where the profiles' relative model paths point."""
    from specrepro.harness.runner import run_study  # the harness is needed only to measure

    store = results.ResultStore(results_dir, study.name, run_id)
    # The load generator calls asyncio.run(), which refuses to start inside a running event
    # loop, and a Jupyter kernel has one: measure in a worker thread, which has none.
    with ThreadPoolExecutor(max_workers=1) as pool:
        summary = pool.submit(run_study, study, store, root=project_root(), fresh=fresh,
                              progress=False,
                              command=["specrepro.analysis", study.notebook_id]).result()
    print(f"{study.name}: {summary.ok} cells measured, {summary.failed} failed, "
          f"{summary.skipped} already stored -> {store.root}")
    for err in summary.errors:
        print(f"  error: {err}")


def load_finding(params_file: str | Path, notebook_id: str, mode: Mode = "auto",
                 results_dir: str | Path | None = None, overrides: dict[str, Any] | None = None
                 ) -> Finding:
    """The notebook's study and its stored cells, measuring first where the mode says so."""
    if mode not in MODES:
        raise FindingError(f"mode: expected one of {MODES}, found {mode!r}")
    suite, study = study_for(params_file, notebook_id, overrides)
    base = Path(results_dir) if results_dir is not None else suite.results_path
    store_root = base / study.name / suite.run_id
    measured = False
    if mode == "run" or (mode == "auto" and missing_cells(store_root, study).height):
        measure(study, base, suite.run_id, fresh=(mode == "run"))
        measured = True
    cells = stored_cells(store_root, study)
    if cells.height == 0:
        raise FindingError(
            f"{notebook_id}: no stored results for study {study.name!r} in {store_root}; "
            "measure them with mode 'auto' or 'run' (make nb NB=... or make all)")
    labels = {a.name: a.label or a.name for a in study.arms}
    cells = cells.with_columns(pl.col("arm").replace_strict(labels, default=None).alias("label"))
    reqs = results.load_requests(store_root, cells)
    manifest = results.ResultStore(base, study.name, suite.run_id).manifest()
    return Finding(notebook_id, study, suite, store_root, cells, reqs, measured, manifest,
                   missing_cells(store_root, study).height)
