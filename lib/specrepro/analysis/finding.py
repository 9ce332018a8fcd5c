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
  `auto` measures it anew.
- Paths in a notebook's parameters are relative to the project root (`project_root`,
  `at_project_root`), under Jupyter and under papermill alike.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import polars as pl

from specrepro import identity, results
from specrepro.params import ResolvedStudy, Suite

# A notebook's `mode` parameter: the notebook runner checks it before executing, and
# specrepro.pipeline.load_finding acts on it (defined here, below both).
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
        keep.append(any(identity.cell_id(study, c, row["engine_version"]) == row["cell_id"]
                        for c in cands))
    return keep


def missing_cells(store_root: Path, study: ResolvedStudy,
                  stored: pl.DataFrame | None = None) -> pl.DataFrame:
    """Declared cells with no matching ok row in the store (`stored`: the store's
    `stored_cells`, when the caller has them already)."""
    if stored is None:
        stored = stored_cells(store_root, study)
    have = stored.select(CELL_MATCH)
    return declared_cells(study).join(have, on=CELL_MATCH, how="anti", nulls_equal=True)
