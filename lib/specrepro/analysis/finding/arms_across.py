"""The same arm measured by several notebooks: each notebook's mean and the spread across them.

Design:
- Several studies measure the same arm at the same settings (no speculation on essays at one
  stream is the baseline of 04, 06 and 07); each report shows its own cells, so a reader
  comparing reports sees 117, 131 and 152 tok/s for one arm and no page says it is one arm.
  The index shows those arms once, with every notebook's mean and the spread across them.
- Which cells a notebook showed: the executed notebook's papermill parameters (params file,
  overrides, results_dir) resolve its study exactly as the notebook did, and
  `finding.stored_cells` picks the same stored rows `pipeline.load_finding` gave it.
- "The same arm at the same settings" is the cell's identity (`identity.cell_identity`:
  the resolved profile with flags, model and drafter fingerprints, quantization and draft
  schedule; the workload as declared, size and max_tokens included; concurrency; sampling;
  engine version; the study's measurement settings) without what only names or repeats a
  measurement: the arm's and profile's names, the repeat and its seed. Two cells agree on
  everything else or they are different arms, however alike their labels.
- A notebook whose store cannot be read (no papermill parameters, a moved store, a params
  file that no longer resolves) is reported by name and reason beside the table, never
  silently left out.
"""

from __future__ import annotations

import html
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import polars as pl

from specrepro import identity
from specrepro.analysis.finding.cell_key import declared_key, key_of
from specrepro.analysis.finding.finding import FindingError, project_root, stored_cells
from specrepro.params import Cell, ParamsError, ResolvedStudy, load_suite, resolve_study
from specrepro.store import ResultStore

# The metrics compared across notebooks: throughput varies with the machine's load from one
# notebook to the next; tokens per step should not (at T=0 it is the same computation), so a
# spread there says the arms are not the same after all.
METRICS = {"agg_tok_s": "aggregate throughput (tok/s)",
           "acceptance_length": "tokens per step (acceptance length)"}


class ArmsError(RuntimeError):
    """A notebook's stored cells cannot be found; the message names the notebook and why."""


@dataclass
class NotebookCells:
    notebook_id: str
    study: ResolvedStudy
    cells: pl.DataFrame


@dataclass
class SharedArm:
    """One arm at one setting, measured by two or more notebooks."""

    settings: dict[str, str]  # column -> text, for the table
    # notebook id -> (arm name there, label there, values of its repeats per metric)
    by_notebook: dict[str, tuple[str, str, dict[str, list[float]]]] = field(default_factory=dict)


def _resolve(base: Path, value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value)
    return path if path.is_absolute() else base / path


def notebook_cells(executed: Path) -> NotebookCells:
    """The study an executed notebook ran and the stored cells it showed, from its papermill
    parameters (paths in them are relative to the project root, papermill's cwd)."""
    nb = nbformat.read(executed, as_version=4)
    params = nb.metadata.get("papermill", {}).get("parameters")
    if not params or not params.get("params_file"):
        raise ArmsError(f"{executed}: no papermill parameters (metadata.papermill.parameters."
                        "params_file): not a notebook executed by specrepro.analysis.render.notebooks")
    try:
        root = project_root()
    except FindingError as err:
        raise ArmsError(f"{executed}: its parameters' paths are relative to the project root, "
                        f"and {err}") from err
    params_file = _resolve(root, params["params_file"])
    notebook_id = params.get("notebook_id") or executed.stem
    try:
        suite = load_suite(params_file)
        study = resolve_study(suite, notebook_id, params.get("overrides") or None)
    except (ParamsError, OSError) as err:
        raise ArmsError(f"{executed}: its params file {params_file} does not resolve "
                        f"{notebook_id} now: {err}") from err
    base = _resolve(root, params.get("results_dir")) or suite.results_path
    store_root = ResultStore(base, study.name, suite.run_id).root
    if not store_root.is_dir():
        raise ArmsError(f"{executed}: no results store at {store_root}")
    return NotebookCells(notebook_id, study, stored_cells(store_root, study))


def setting_key(study: ResolvedStudy, cell: Cell, row: dict) -> str:
    """What makes a stored cell's measurement, less its names and repeat (module docstring)."""
    ident = identity.cell_identity(study, cell, row["engine_version"])
    profile = {k: v for k, v in ident["arm"]["profile"].items() if k != "name"}
    rest = {k: v for k, v in ident.items() if k not in ("arm", "repeat", "seed")}
    return identity.digest(profile=profile, **rest)


def declared_by_level(study: ResolvedStudy) -> dict[tuple, Cell]:
    """The study's cells by the stored rows' key (cell_key.CELL_KEY), to find a row's cell."""
    return {declared_key(c): c for c in study.cells()}


def _settings(study: ResolvedStudy, row: dict) -> dict[str, str]:
    """The table's description of a setting (the key above decides sameness; this says it)."""
    arm = next(a for a in study.arms if a.name == row["arm"])
    prof = arm.resolved
    spec = prof.speculative
    workload = next(w for w in study.workloads if w.name == row["workload"])
    drafts = "none"
    if spec is not None:
        drafts = f"{spec.method}, {spec.num_speculative_tokens} drafts"
        if spec.model:
            drafts += f" ({spec.model})"
        if spec.num_speculative_tokens_per_batch_size:
            drafts += ", schedule " + ", ".join(
                f"{lo}-{hi}: {k}" for lo, hi, k in spec.num_speculative_tokens_per_batch_size)
    target_q = prof.flags.get("quantization") or "none"
    quant = f"target {target_q}"
    if spec is not None:
        quant += f", drafter {spec.quantization or 'none'}"
    size = f"{workload.n} prompts"
    if workload.max_tokens:
        size += f" x {workload.max_tokens} tokens"
    version = row["engine_version"] or ""
    engine = version if row["engine"] in version else f"{row['engine']} {version}".strip()
    return {"engine": engine,
            "speculation": drafts, "quantization": quant,
            "workload": f"{workload.name} ({workload.form}), {size}",
            "load": (f"{row['concurrency']} stream{'s' if row['concurrency'] != 1 else ''}, "
                     f"T={row['temperature']:g}")}


def shared_arms(notebooks: list[NotebookCells]) -> list[SharedArm]:
    """Arms measured at the same settings by two or more of the notebooks, in the order the
    first of them shows them."""
    arms: dict[str, SharedArm] = {}
    for nbc in notebooks:
        labels = {a.name: a.label or a.name for a in nbc.study.arms}
        declared = declared_by_level(nbc.study)
        for row in nbc.cells.iter_rows(named=True):
            # stored_cells keeps only rows of declared cells, so the lookup cannot miss
            cell = declared[key_of(row)]
            key = setting_key(nbc.study, cell, row)
            arm = arms.setdefault(key, SharedArm(_settings(nbc.study, row)))
            _, _, values = arm.by_notebook.setdefault(
                nbc.notebook_id, (row["arm"], labels[row["arm"]], {m: [] for m in METRICS}))
            for metric in METRICS:
                v = row[metric]
                if v is not None and not (isinstance(v, float) and math.isnan(v)):
                    values[metric].append(float(v))
    return [a for a in arms.values() if len(a.by_notebook) > 1]


def spread(means: list[float]) -> dict[str, float]:
    """Across notebooks: mean of their means, lowest, highest, and (highest - lowest) / mean
    in percent."""
    mean = statistics.fmean(means)
    lo, hi = min(means), max(means)
    return {"mean": mean, "low": lo, "high": hi,
            "spread_pct": 100.0 * (hi - lo) / mean if mean else math.nan}


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def _per_notebook(nb: str, arm: str, label: str, values: list[float], unit: str) -> str:
    mean = statistics.fmean(values)
    runs = f"{len(values)} run{'s' if len(values) != 1 else ''}"
    sd = f" ± {_num(statistics.stdev(values))}" if len(values) > 1 else ""
    name = html.escape(label if label == arm else f"{label} ({arm})")
    return (f"<li><a href='{html.escape(nb)}.html'>{html.escape(nb[:2])}</a> {name}: "
            f"<b>{_num(mean)}</b>{sd} {unit} ({runs})</li>")


SETTING_COLUMNS = ("engine", "speculation", "quantization", "workload", "load")


def render_tables(arms: list[SharedArm]) -> str:
    """One table per metric: a row per shared arm, its settings, each notebook's mean (with
    the spread of its repeats) and the spread across notebooks."""
    parts = []
    for metric, title in METRICS.items():
        unit = "tok/s" if metric == "agg_tok_s" else "tokens"
        rows = []
        for arm in arms:
            measured = {nb: v for nb, v in arm.by_notebook.items() if v[2][metric]}
            if len(measured) < 2:
                continue
            means = [statistics.fmean(v[2][metric]) for v in measured.values()]
            s = spread(means)
            cells = "".join(f"<td>{html.escape(arm.settings[c])}</td>" for c in SETTING_COLUMNS)
            lines = "".join(_per_notebook(nb, a, lab, vals[metric], unit)
                            for nb, (a, lab, vals) in measured.items())
            rows.append(
                f"<tr class='arm'>{cells}<td><ul class='per-notebook'>{lines}</ul></td>"
                f"<td class='num'>{_num(s['mean'])}</td>"
                f"<td class='num'>{_num(s['low'])} to {_num(s['high'])}</td>"
                f"<td class='num'>{s['spread_pct']:.1f} %</td></tr>")
        if not rows:
            continue
        head = "".join(f"<th data-column='{c}'>{c}</th>" for c in SETTING_COLUMNS)
        notes = "".join(
            f"<span class='col-note' data-column='{html.escape(name)}'><b>{html.escape(name)}"
            f"</b>: {html.escape(note)}</span>" for name, note in column_notes(title))
        parts.append(
            f"<table class='specrepro arms' data-metric='{metric}'><caption class='column-notes'>"
            f"{html.escape(title)} of each arm measured by several notebooks at the same "
            f"settings; the columns: {notes}</caption>"
            f"<thead><tr>{head}<th data-column='per notebook'>per notebook</th>"
            "<th data-column='mean'>mean</th><th data-column='range'>range</th>"
            f"<th data-column='spread'>spread</th></tr></thead><tbody>{''.join(rows)}</tbody>"
            "</table>")
    return "\n".join(parts)


def column_notes(title: str) -> list[tuple[str, str]]:
    """What each column of a shared-arm table holds (shown above it, one note a column)."""
    return [("engine", "the engine and its version"),
            ("speculation", "the method and its draft count, or none"),
            ("quantization", "the target's and the drafter's precision"),
            ("workload", "the prompts, their form and size (prompts x max tokens)"),
            ("load", "concurrent streams and temperature"),
            ("per notebook", (f"each notebook's mean {title} (± the standard deviation of "
                              "its repeats), with the arm's name there")),
            ("mean", "the mean of those means"),
            ("range", "the lowest to the highest of them"),
            ("spread", "(highest - lowest) / mean, in %")]


def section(executed: list[Path]) -> str:
    """The index's section on shared arms: the tables, or a sentence saying there are none,
    and every notebook whose cells could not be read, with the reason."""
    found, problems = [], []
    for path in executed:
        try:
            found.append(notebook_cells(path))
        except ArmsError as err:
            problems.append(str(err))
    arms = shared_arms(found)
    parts = ["<h2 id='shared-arms'>The same arm in several reports</h2>"]
    if arms:
        parts.append("<p>These arms were measured by more than one notebook at exactly the same "
                     "settings (engine and version, speculation and drafts, quantization, "
                     "workload and its size, streams, temperature and every other parameter "
                     "of the cell); each report shows only its own measurement. A spread in "
                     "throughput here is the machine's noise between notebooks measured minutes "
                     "apart, and a difference between arms within a report that is smaller "
                     "deserves caution; tokens per step should agree (at T=0 it is the same "
                     "computation).</p>")
        parts.append(render_tables(arms))
    else:
        parts.append("<p>No arm was measured by more than one notebook at the same settings.</p>")
    if problems:
        parts.append("<p class='problems'>Left out, their stored cells could not be read:</p>"
                     "<ul class='problems'>"
                     + "".join(f"<li>{html.escape(p)}</li>" for p in problems) + "</ul>")
    return "\n".join(parts)
