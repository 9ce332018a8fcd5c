"""Measuring above analysis: a notebook's study, replayed from the results store or measured.

Design:
- `load_finding(params_file, notebook_id, mode, results_dir, overrides)` is the one call a
  notebook makes to get its data. The suite file and the notebook's `overrides` (merged
  into the study as a suite's own overrides are, validated the same way:
  `params.resolve_study`) give the study.
- Modes (`analysis.finding.finding.MODES`): `replay` reads the results store and never measures (an
  empty store is an error that says how to measure); `run` measures the whole study anew
  through the harness's `run_study`; `auto` replays when every cell the study declares has
  a stored `ok` row that matches it, and measures otherwise (the runner resumes: only
  missing cells run), but only where this machine can run the study's arms
  (`finding.cannot_measure_here`: `--device cuda` arms need an NVIDIA GPU); elsewhere it
  replays what is stored, the finding naming the missing cells, and a study with nothing
  stored fails with the command that measures it.
- This is the only module that both reads findings and starts engines: `analysis` reads
  results tables only, the harness measures; here one decides which and calls the other.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from specrepro import probes
from specrepro.analysis.finding.finding import (
    MODES,
    Finding,
    FindingError,
    Mode,
    cannot_measure_here,
    from_store,
    missing_folders,
    project_root,
    stored_cells,
    to_measure,
)
from specrepro.params import ParamsError, ResolvedStudy, Suite, load_suite, resolve_study
from specrepro.store import ResultStore


def study_for(params_file: str | Path, notebook_id: str, overrides: dict | None = None
              ) -> tuple[Suite, ResolvedStudy]:
    """The notebook's study from a suite, with the notebook's overrides merged on top of the
    suite's own (mappings merge key by key, lists replace), validated with file and key."""
    suite = load_suite(params_file)
    return suite, resolve_study(suite, notebook_id, overrides)


def measure(study: ResolvedStudy, results_dir: Path, run_id: str, fresh: bool):
    """Measure the study into the store through the harness's runner (the only call that
    starts engines); fresh=True measures every cell again as a new attempt. Engines start
    in the project root, where the profiles' relative model paths point. Returns the runner's
    RunSummary (its errors say why cells failed)."""
    from specrepro.harness.preflight import problems  # the harness: only to measure
    from specrepro.harness.runner import run_study

    found = problems([study], here=False)  # what the engines would refuse, said first
    if found:
        raise ParamsError(found, f"measuring study {study.name!r}")
    store = ResultStore(results_dir, study.name, run_id)
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
    return summary


def missing_local_folders(study: ResolvedStudy) -> str:
    """Why stored cells may not match here: a model or drafter folder an arm names by a
    local path that does not exist (a cell's identity holds such a folder's fingerprint, so
    without it no stored cell matches), with the command that writes the exported drafters
    or the NVFP4 target."""
    gone = missing_folders(study)
    if not gone:
        return ""
    listed = "; ".join(f"{path} (profile {prof})" for path, prof in gone.items())
    hint = (" `specrepro export-drafters` writes build/engine-drafters/ from models/embedded."
            if any(path.startswith("build/engine-drafters/") for path in gone) else "")
    if "build/nvfp4-target" in gone:  # notebook 03's NVFP4 target on vLLM
        hint += " `specrepro export-nvfp4` writes build/nvfp4-target from models/embedded."
    return (f". Note: these folders do not exist here, so the cells stored for them cannot "
            f"match: {listed}.{hint}")


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
    stored = stored_cells(store_root, study)  # read once; again only after measuring
    why_not = ""
    pending = to_measure(store_root, study, stored).height if mode == "auto" else 0
    if pending:
        why_not = cannot_measure_here(study)
    if mode == "run" or (mode == "auto" and not why_not and pending):
        summary = measure(study, base, suite.run_id, fresh=(mode == "run"))
        measured = True
        stored = stored_cells(store_root, study)
        if stored.height == 0:  # the cause is the measurement's, not a missing mode
            causes = "; ".join(str(e) for e in summary.errors[:3]) or "no error was reported"
            raise FindingError(
                f"{notebook_id}: measuring study {study.name!r} (mode {mode!r}) stored no "
                f"results in {store_root}: {summary.failed} cells failed: {causes}"
                + missing_local_folders(study))
    cells = stored
    if cells.height == 0:
        suite_file = _shown(suite.path)
        why_not = why_not or cannot_measure_here(study)
        store = ResultStore(base, study.name, suite.run_id)
        # a store whose files were damaged was measured: say where they went instead
        gone = [e["file"] for e in store.manifest().get("quarantined", [])]
        raise FindingError(
            f"{notebook_id}: no stored results for study {study.name!r} of suite "
            f"{suite.name!r} in {_shown(store_root)}: "
            + (f"its damaged files ({', '.join(gone)}) were set aside in quarantine/ "
               "(manifest.json: quarantined)" if gone else "it was never measured")
            + (f", and this machine cannot measure it ({why_not})" if why_not else "")
            + f". Measure it{' on a machine with an NVIDIA GPU' if why_not else ''} "
            f"(mode 'auto' or 'run') with `make nb NB={notebook_id} PARAMS={suite_file}` or "
            f"`specrepro run "
            f"{suite_file} --notebook {notebook_id}`; its cells are stored under "
            f"{_shown(store_root.parent)}/"
            # the folders only matter where cells are stored and none matched; a store
            # that was never written has nothing they could match
            + (missing_local_folders(study) if any(store.cells_dir.glob("*.parquet")) else "")
            + probe_answers(study, base, suite.run_id, suite_file))
    return from_store(notebook_id, study, suite, store_root, stored, measured, why_not)


def probe_answers(study: ResolvedStudy, base: Path, run_id: str, suite_file: str) -> str:
    """The study's probes and their stored answers, for a study with no cells to show
    (e.g. an arm moved to another engine once a probe said this one does not start)."""
    store = ResultStore(base, study.name, run_id)
    if not study.probes or not store.manifest_path.is_file():
        return ""
    rows = probes.answers(study, store.manifest(), suite_file).iter_rows(named=True)
    return "; its probes, from the store: " + "; ".join(
        f"{r['probe']} ({r['profile']}): {r['answer']}" + (f" ({r['why']})" if r["why"] else "")
        for r in rows) + "."


def _shown(path: Path) -> str:
    """A path as a reader types it: relative to the project root where it lies below it."""
    try:
        return str(Path(path).resolve().relative_to(project_root()))
    except ValueError:
        return str(path)
