"""The notebook runner: check parameters, execute with papermill, render HTML.

Design:
- Before anything runs, two checks fail on strangers (papermill only warns about unknown
  parameters): the parameters passed must be ones the notebook declares in its cell tagged
  `parameters` (`papermill.inspect_notebook` + `params.check_notebook_params`), and the
  params file must load and resolve this notebook's study with the overrides
  (`params.load_suite` / `resolve_study`: an unknown key names file and key).
- A finding's notebook is `findings/<id>/notebook.ipynb` (specrepro/findings.py); its
  executed copy and report keep the id's name (`<reports_dir>/<id>.ipynb`, `<id>.html`).
- It executes notebooks (which measure through `specrepro.pipeline` in modes `auto`/`run`)
  but imports neither the pipeline nor the harness itself.
- Execution: papermill with the `python3` kernel, which jupyter_client runs with this very
  interpreter (the venv's), in the project root, over IPC sockets in a temporary folder
  (`IPCKernelManager`: over TCP without CurveZMQ keys ipykernel 7 warns on every notebook that
  the channel is unencrypted); the executed notebook goes to
  `<reports_dir>/<nb>.ipynb` (written even when a cell fails, for the traceback), and
  nbconvert renders `<reports_dir>/<nb>.html` with its images embedded, as a reviewer reads
  it (`for_readers`: the summary table right after the title, the substrates table under it, code inputs hidden, papermill's
  parameters once, no echoed return values; `READER_STYLE`: tables that fit 1,400 px, the
  summary's verdict column).
- The machine: a notebook that will measure (mode `run`, or `auto` with cells missing from
  the store) takes `.stamps/machine.lock` exclusively for its whole run, one that only
  replays takes it shared. So `make -j` renders replaying notebooks side by side while a
  measurement always has the cores to itself (its engine and load generator are pinned to
  them: another notebook's kernel would slow both).
- `python -m specrepro.analysis.render.notebooks run NB... --params FILE` is what the Makefile
  calls; `index` rebuilds `<reports_dir>/index.html` (report.py).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

import nbformat
import papermill
from jupyter_client.manager import AsyncKernelManager
from nbconvert import HTMLExporter
from traitlets.config import Config

from specrepro import findings
from specrepro.analysis.finding.finding import MODES, cannot_measure_here, project_root, to_measure
from specrepro.params import ParamsError, check_notebook_params, load_suite, resolve_study

KERNEL = "python3"


def notebook_path(notebook_id: str, findings_dir: str | Path | None = None) -> Path:
    """A finding's notebook: `findings/<id>/notebook.ipynb` (specrepro/findings.py)."""
    path = findings.notebook_path(notebook_id, Path(findings_dir or findings.FOLDER))
    if not path.is_file():
        raise FileNotFoundError(f"no notebook {notebook_id!r} at {path}; expected one of "
                                f"{', '.join(findings.IDS)}")
    return path


def check_parameters(path: Path, parameters: dict[str, Any]) -> None:
    """Fail on a parameter the notebook does not declare, naming it."""
    declared = papermill.inspect_notebook(str(path))
    check_notebook_params(parameters, declared, where=f"{path}: parameters")


def check(notebook_id: str, parameters: dict[str, Any],
          findings_dir: str | Path | None = None) -> Path:
    """Every check that must pass before a notebook runs; returns the notebook's path."""
    path = notebook_path(notebook_id, findings_dir)
    check_parameters(path, parameters)
    mode = parameters.get("mode", "auto")
    if mode not in MODES:
        raise ParamsError(f"{path}: parameter 'mode': expected one of {MODES}, found {mode!r}")
    resolve_study(load_suite(parameters["params_file"]), notebook_id,
                  parameters.get("overrides") or None)
    return path


HIDE_INPUT = "specrepro-hide-input"  # the tag `for_readers` gives the inputs it hides
SUMMARY_CELL = "specrepro-summary"  # the id of the cell `for_readers` moves the summary into


def for_readers(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The executed notebook as a reviewer reads it (the .ipynb keeps everything): code inputs
    hidden except papermill's injected parameters, which show the values this run used, once
    (the notebook's own `parameters` cell, the defaults they replaced, is dropped); echoed
    return values (an `Out[n]` of plain text only, such as a figure's file paths) dropped;
    the summary (`show.show_summary`'s output) moved up to right after the title."""
    nb = nbformat.from_dict(nb)  # a copy
    cells = []
    for cell in nb.cells:
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell.cell_type == "code":
            if "parameters" in tags and "injected-parameters" not in tags:
                continue
            if "injected-parameters" not in tags:  # nbconvert's TagRemovePreprocessor
                cell.metadata["tags"] = sorted(tags | {HIDE_INPUT})
            cell.outputs = [o for o in cell.get("outputs", [])
                            if not (o.output_type == "execute_result"
                                    and set(o.get("data", {})) <= {"text/plain"})]
        cells.append(cell)
    nb.cells = summary_first(cells)
    return nb


def _take(cells: list, key: str):
    """The first output whose `specrepro` metadata has `key`, removed from its cell."""
    for cell in cells:
        for i, out in enumerate(cell.get("outputs", [])):
            if key in out.get("metadata", {}).get("specrepro", {}):
                return cell.outputs.pop(i)
    return None


def summary_first(cells: list) -> list:
    """The summary output (metadata `specrepro.summary`), and the substrates table after it
    (`specrepro.substrates`, `show.show_substrates`) where there is one, in a cell of their own
    right after the first `# ` heading, which is split from the rest of its markdown cell; a reader sees the
    verdicts before the notebook's introduction, parameters and tables. Without a summary the
    cells are returned as they are (the browser test fails such a report); without a heading
    the summary goes first."""
    summary, substrates = _take(cells, "summary"), None
    if summary is None:
        return cells
    substrates = _take(cells, "substrates")
    holder = nbformat.v4.new_code_cell("", id=SUMMARY_CELL)
    holder.metadata["tags"] = [HIDE_INPUT]
    holder.outputs = [summary] + ([substrates] if substrates is not None else [])
    for at, cell in enumerate(cells):
        if cell.cell_type != "markdown":
            continue
        lines = cell.source.splitlines(keepends=True)
        heading = next((j for j, line in enumerate(lines) if line.startswith("# ")), None)
        if heading is None:
            continue
        cell.source = "".join(lines[:heading + 1]).rstrip("\n")
        rest = "".join(lines[heading + 1:]).strip("\n")
        after = [nbformat.v4.new_markdown_cell(rest, id=f"{SUMMARY_CELL}-intro")] if rest else []
        return [*cells[:at + 1], holder, *after, *cells[at + 1:]]
    return [holder, *cells]


# Added to nbconvert's lab template: a readable width, tables that wrap to fit 1,400 px (a
# horizontal scrollbar only where a table's narrowest layout is still wider), no In/Out
# prompts (the inputs are hidden), and the summary table's verdict column. Colour only adds to
# the verdict's word and symbol (colour-blind-safe backgrounds).
READER_STYLE = """
body.jp-Notebook { max-width: 1360px; margin: 0 auto; padding: 0 12px; }
.jp-InputPrompt, .jp-OutputPrompt { display: none; }
.jp-RenderedMarkdown p, .jp-RenderedMarkdown li { max-width: 100ch; }
.jp-RenderedHTMLCommon table.specrepro { display: block; max-width: 100%; overflow-x: auto;
  table-layout: auto; margin: 0.4em 0 1.2em 0; font-size: 12.5px; }
.jp-RenderedHTMLCommon table.specrepro caption { text-align: left; caption-side: top;
  color: #444; padding: 0.2em 0; }
.jp-RenderedHTMLCommon table.specrepro th, .jp-RenderedHTMLCommon table.specrepro td {
  padding: 3px 6px; text-align: left; vertical-align: top; white-space: normal;
  overflow-wrap: break-word; }
.jp-RenderedHTMLCommon table#summary { display: table; width: 100%; font-size: 13px;
  border: 1px solid #bbb; margin-top: 0.6em; }
.jp-RenderedHTMLCommon table#summary th, .jp-RenderedHTMLCommon table#summary td {
  border: 1px solid #ddd; }
.jp-RenderedHTMLCommon table#summary td.verdict { font-weight: 600; min-width: 9em; }
.jp-RenderedHTMLCommon table#summary td.verdict small { font-weight: normal; }
.jp-RenderedHTMLCommon table#summary th small { font-weight: normal; }
.jp-RenderedHTMLCommon table#summary tr[data-outcome="holds"] td.verdict { background: #d8ecf7; }
.jp-RenderedHTMLCommon table#summary tr[data-outcome="holds in direction only"] td.verdict {
  background: #fbe9c8; }
.jp-RenderedHTMLCommon table#summary tr[data-outcome="does not hold"] td.verdict {
  background: #f6d5c8; }
.jp-RenderedHTMLCommon table#summary tr[data-outcome="not testable here"] td.verdict {
  background: #eeeeee; }
.jp-RenderedHTMLCommon table#substrates { display: table; width: 100%; font-size: 12.5px;
  border: 1px solid #bbb; }
.jp-RenderedHTMLCommon table#substrates th, .jp-RenderedHTMLCommon table#substrates td {
  border: 1px solid #ddd; }
.jp-RenderedHTMLCommon table#substrates th small, .jp-RenderedHTMLCommon table#substrates
  td.verdict small { font-weight: normal; }
.jp-RenderedHTMLCommon table#substrates td.verdict { font-weight: 600; white-space: nowrap; }
.jp-RenderedHTMLCommon table#substrates td.verdict small { white-space: normal; }
.jp-RenderedHTMLCommon table#substrates td.na { color: #666; font-style: italic;
  text-align: center; }
.jp-RenderedHTMLCommon table#substrates td[data-outcome="holds"] { background: #d8ecf7; }
.jp-RenderedHTMLCommon table#substrates td[data-outcome="holds in direction only"] {
  background: #fbe9c8; }
.jp-RenderedHTMLCommon table#substrates td[data-outcome="does not hold"] { background: #f6d5c8; }
.jp-RenderedHTMLCommon table#substrates td[data-outcome="not testable here"] {
  background: #eeeeee; }
.jp-RenderedHTMLCommon p.substrates-teach { max-width: none; font-size: 13px; }
"""


def to_html(executed: Path) -> Path:
    """Render an executed notebook to HTML beside it, images embedded, as `for_readers` shows it,
    with READER_STYLE after the template's own."""
    nb = for_readers(nbformat.read(executed, as_version=4))
    config = Config()
    config.TagRemovePreprocessor.enabled = True
    config.TagRemovePreprocessor.remove_input_tags = {HIDE_INPUT}
    exporter = HTMLExporter(config=config, template_name="lab", embed_images=True)
    body, _ = exporter.from_notebook_node(nb)
    if "</head>" not in body:
        raise RuntimeError(f"{executed}: nbconvert's lab template gave no </head> to add the "
                           "reader style before")
    body = body.replace("</head>", f"<style>{READER_STYLE}</style>\n</head>", 1)
    out = executed.with_suffix(".html")
    out.write_text(body, encoding="utf-8")
    return out


def measures(notebook_id: str, params_file: str | Path, mode: str,
             results_dir: str | Path | None = None, overrides: dict | None = None) -> bool:
    """Whether running the notebook will measure: mode `run`, or `auto` with a declared cell
    missing from the store, or stored without all its requests (`finding.to_measure`), on a
    machine that can run the study's arms (what
    `pipeline.load_finding` decides, asked beforehand)."""
    if mode != "auto":
        return mode == "run"
    suite = load_suite(params_file)
    study = resolve_study(suite, notebook_id, overrides)
    base = Path(results_dir) if results_dir is not None else suite.results_path
    return (to_measure(base / study.name / suite.run_id, study).height > 0
            and not cannot_measure_here(study))


@contextlib.contextmanager
def machine(exclusive: bool):
    """The machine's lock: exclusive while a notebook measures, shared while one replays."""
    path = project_root() / ".stamps" / "machine.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def run_notebook(notebook_id: str, params_file: str | Path, *, mode: str = "auto",
                 results_dir: str | Path | None = None, overrides: dict | None = None,
                 figures_dir: str | Path = "figures", reports_dir: str | Path = "reports",
                 findings_dir: str | Path | None = None) -> Path:
    """Check, execute and render one notebook; returns the HTML report's path."""
    root = project_root()
    findings_dir = Path(findings_dir) if findings_dir else root / findings.FOLDER.name
    parameters = {"params_file": str(params_file), "notebook_id": notebook_id, "mode": mode,
                  "results_dir": None if results_dir is None else str(results_dir),
                  "overrides": overrides or {}, "figures_dir": str(figures_dir)}
    path = check(notebook_id, parameters, findings_dir)
    reports = Path(reports_dir)
    reports.mkdir(parents=True, exist_ok=True)
    executed = reports / f"{notebook_id}.ipynb"
    exclusive = measures(notebook_id, params_file, mode, results_dir, overrides)
    with machine(exclusive):
        start = time.monotonic()
        try:
            papermill.execute_notebook(str(path), str(executed), parameters=parameters,
                                       kernel_name=KERNEL, cwd=str(root), progress_bar=False,
                                       report_mode=False, kernel_manager_class=IPCKernelManager,
                                       **IPCKernelManager.hooks())
        finally:
            if executed.is_file():
                to_html(executed)
    print(f"{notebook_id}: executed in {time.monotonic() - start:.0f} s -> "
          f"{executed.with_suffix('.html')}")
    return executed.with_suffix(".html")


_SOCKET_DIR: list[str] = []  # this process's folder for kernel sockets, made on first use


def _socket_dir() -> str:
    if not _SOCKET_DIR:
        _SOCKET_DIR.append(tempfile.mkdtemp(prefix="specrepro-kernels-"))
        atexit.register(shutil.rmtree, _SOCKET_DIR[0], True)
    return _SOCKET_DIR[0]


class IPCKernelManager(AsyncKernelManager):
    """The notebook's kernel (nbclient's default manager) over IPC: its sockets are files in a
    temporary folder of this process (not the project root, papermill's cwd), removed at exit.

    No SIGINT at shutdown unless a cell runs: jupyter_client 8 interrupts a kernel before
    asking it to shut down, also one whose notebook has finished, and a kernel caught between
    two messages logs `[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel` after a
    successful run. While a cell runs (papermill stopped by Ctrl-C or SIGTERM) the
    interrupt stays: it is what records a measuring cell as interrupted and stops its engine.
    `CELL` says whether one runs; `run_notebook`'s nbclient hooks keep it."""

    CELL: ClassVar[dict[str, bool]] = {"running": False}

    def __init__(self, **kwargs):
        kwargs.setdefault("transport", "ipc")
        kwargs.setdefault("ip", str(Path(_socket_dir()) / "kernel"))
        super().__init__(**kwargs)

    async def _async_interrupt_kernel(self) -> None:
        if self.shutting_down and not self.CELL["running"]:
            return  # an idle kernel: the shutdown request follows (SIGTERM, SIGKILL back it up)
        await super()._async_interrupt_kernel()

    @classmethod
    def hooks(cls) -> dict[str, Any]:
        """nbclient's cell hooks (papermill passes them on) that keep `CELL`."""
        def start(**_):
            cls.CELL["running"] = True

        def done(**_):
            cls.CELL["running"] = False
        # on_cell_execute: a code cell about to be sent (on_cell_start fires for markdown too,
        # which on_cell_executed never follows); a cell past its timeout never reaches `done`
        cls.CELL["running"] = False
        return {"on_cell_execute": start, "on_cell_executed": done}

    interrupt_kernel = _async_interrupt_kernel  # as AsyncKernelManager binds its public name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specrepro.analysis.render.notebooks",
                                 description="execute notebooks with papermill, render HTML")
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="check, execute and render notebooks")
    run.add_argument("notebooks", nargs="+", help="notebook ids, e.g. 01_drafter_block_sweep")
    run.add_argument("--params", required=True, help="a suite, e.g. params/default.yaml")
    run.add_argument("--mode", default="auto", choices=MODES)
    run.add_argument("--results-dir", default=None)
    run.add_argument("--overrides", default=None, help="JSON merged into the study")
    run.add_argument("--figures-dir", default="figures")
    run.add_argument("--reports-dir", default="reports")
    idx = sub.add_parser("index", help="write <reports-dir>/index.html")
    idx.add_argument("--reports-dir", default="reports")
    args = ap.parse_args(argv)
    if args.command == "index":
        from specrepro.analysis.render.report import write_index

        print(write_index(Path(args.reports_dir)))
        return 0
    overrides = json.loads(args.overrides) if args.overrides else None
    try:  # a finding the suite leaves out (`excluded:`, with its reason) is said and passed
        excluded = load_suite(args.params).excluded  # over: `make all` runs the registry's
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for nb in args.notebooks:
        if nb in excluded:
            print(f"{nb}: not run: {args.params} excludes it: {excluded[nb]}")
            continue
        try:
            run_notebook(nb, args.params, mode=args.mode, results_dir=args.results_dir,
                         overrides=overrides, figures_dir=args.figures_dir,
                         reports_dir=args.reports_dir)
        except (ParamsError, FileNotFoundError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except papermill.PapermillExecutionError as err:
            print(f"error: {nb} failed in cell {err.exec_count}: {err.ename}: {err.evalue}\n"
                  f"  see {Path(args.reports_dir) / (nb + '.html')}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
