"""The notebooks as committed (thin, no outputs, a parameters cell) and the runner's checks
that fail before anything runs."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import nbformat
import papermill
import pytest
import yaml

from specrepro import findings
from specrepro.analysis.render import notebooks
from specrepro.params import NOTEBOOK_IDS, ParamsError

ROOT = Path(__file__).resolve().parents[1]
PARAMETERS = {"params_file", "notebook_id", "mode", "results_dir", "overrides", "figures_dir"}


@pytest.mark.parametrize("nb", NOTEBOOK_IDS)
def test_notebook_is_committed_thin_and_without_outputs(nb):
    path = findings.notebook_path(nb)
    book = nbformat.read(path, as_version=4)
    nbformat.validate(book)
    tagged = [c for c in book.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    assert set(papermill.inspect_notebook(str(path))) == PARAMETERS
    assert f'notebook_id = "{nb}"' in tagged[0].source
    for cell in book.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{nb}: strip outputs"
            assert "def " not in cell.source and "import " not in cell.source.replace(
                "from specrepro import analysis as sa, pipeline", ""), f"{nb}: logic belongs in the package"
    sources = "\n".join(c.source for c in book.cells)
    for call in ("pipeline.load_finding", "sa.show_header", "sa.overlay", "sa.show_figure",
                 "sa.show_summary"):
        assert call in sources, f"{nb} lacks {call}"


def test_an_unknown_notebook_parameter_fails_before_anything_runs():
    with pytest.raises(ParamsError, match="figure_dir.*did you mean 'figures_dir'"):
        notebooks.check("07_the_bill", {"params_file": str(ROOT / "params" / "smoke.yaml"),
                                        "figure_dir": "x"})


def portable_smoke(tmp_path: Path, **changes) -> Path:
    """params/smoke.yaml copied to tmp_path with its relative paths made absolute."""
    suite = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    suite["profiles"] = str(ROOT / "params" / "profiles")
    suite["results_dir"] = str(tmp_path / "results")
    suite.update(changes)
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


def test_a_params_file_with_an_unknown_key_fails_before_anything_runs(tmp_path):
    bad = portable_smoke(tmp_path)
    suite = yaml.safe_load(bad.read_text())
    suite["notebooks"].setdefault("07_the_bill", {}).setdefault("overrides", {})[
        "concurrencies"] = [1]
    bad.write_text(yaml.safe_dump(suite))
    reports = tmp_path / "reports"
    with pytest.raises(ParamsError, match="concurrencies"):
        notebooks.run_notebook("07_the_bill", bad, reports_dir=reports,
                               figures_dir=tmp_path / "f")
    assert not reports.exists() and not (tmp_path / "results").exists()
    code = notebooks.main(["run", "07_the_bill", "--params", str(bad), "--reports-dir",
                           str(reports)])
    assert code == 2 and not reports.exists()


def test_a_finding_the_suite_excludes_is_passed_over_with_its_reason(tmp_path, capsys):
    """`make all PARAMS=params/h200-embedded.yaml` runs every registered finding; the suite
    excludes 08_step_cost with its reason, and the runner stopped the whole make on it
    ("expected a notebook or study id among ..."). Now it says why and goes on."""
    suite = ROOT / "params" / "h200-embedded.yaml"
    excluded = yaml.safe_load(suite.read_text())["excluded"]
    nb = next(iter(excluded))
    reports = tmp_path / "reports"
    assert notebooks.main(["run", nb, "--params", str(suite), "--reports-dir",
                           str(reports)]) == 0
    out = capsys.readouterr().out
    assert f"{nb}: not run: {suite} excludes it: " in out and excluded[nb].split()[0] in out
    assert not reports.exists()


def test_an_unknown_top_level_key_and_a_bad_mode_fail_too(tmp_path):
    bad = portable_smoke(tmp_path, result_dir="x")
    with pytest.raises(ParamsError, match="result_dir"):
        notebooks.run_notebook("07_the_bill", bad, reports_dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()
    with pytest.raises(ParamsError, match="mode"):
        notebooks.check("07_the_bill", {"params_file": str(ROOT / "params" / "smoke.yaml"),
                                        "mode": "measure"})


def test_the_html_shows_results_and_the_run_s_parameters_once_but_no_code(tmp_path):
    """notebooks.to_html (via for_readers): code inputs hidden, papermill's injected parameters
    shown once (the default parameters cell dropped), echoed return values dropped, displayed
    outputs kept; the .ipynb itself is left whole."""
    import nbformat

    from specrepro.analysis.render.notebooks import to_html

    nb = nbformat.v4.new_notebook()
    defaults = nbformat.v4.new_code_cell('mode = "auto"  # DEFAULTS-CELL')
    defaults.metadata["tags"] = ["parameters"]
    injected = nbformat.v4.new_code_cell('mode = "replay"  # INJECTED-CELL')
    injected.metadata["tags"] = ["injected-parameters"]
    code = nbformat.v4.new_code_cell("show_table(cells)  # CODE-CELL")
    code.outputs = [
        nbformat.v4.new_output("display_data", data={"text/html": "<b>DISPLAYED-TABLE</b>"}),
        nbformat.v4.new_output("execute_result", data={"text/plain": "[PosixPath('ECHO')]"},
                               execution_count=3)]
    nb.cells = [nbformat.v4.new_markdown_cell("# Title"), defaults, injected, code]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    page = to_html(path).read_text()
    assert "INJECTED" in page and "DISPLAYED-TABLE" in page
    assert "DEFAULTS" not in page and "CODE-CELL" not in page and "ECHO" not in page
    assert "CODE-CELL" in path.read_text()  # the notebook keeps its code


def test_a_notebook_that_measures_takes_the_machine_alone(tmp_path, monkeypatch):
    suite = portable_smoke(tmp_path)
    # nothing stored: auto will measure, so it needs the machine to itself; replay never does
    assert notebooks.measures("07_the_bill", suite, "auto")
    assert notebooks.measures("07_the_bill", suite, "run")
    assert not notebooks.measures("07_the_bill", suite, "replay")
    # the lock: a shared holder waits while an exclusive one holds it, two shared do not
    monkeypatch.setattr(notebooks, "project_root", lambda: tmp_path)
    order = []

    def shared(tag):
        with notebooks.machine(exclusive=False):
            order.append(tag)

    with notebooks.machine(exclusive=True):
        t = threading.Thread(target=shared, args=("shared after exclusive",))
        t.start()
        time.sleep(0.3)
        order.append("exclusive released")
    t.join(5)
    with notebooks.machine(exclusive=False):
        shared("shared beside shared")
    assert order == ["exclusive released", "shared after exclusive", "shared beside shared"]


def test_a_finished_notebook_s_kernel_is_shut_down_without_sigint(tmp_path):
    """jupyter_client interrupts a kernel before shutting it down; after a successful run the
    kernel logged `[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel` (issue 41). The
    runner's manager sends no SIGINT to an idle kernel: a cell marks the kernel's SIGINT by
    writing a file, keeps that handler past the cell, and the file must not appear."""
    import asyncio

    marker = tmp_path / "sigint"
    code = ("import signal\nget_ipython().kernel.post_handler_hook = lambda: None\n"
            f"signal.signal(signal.SIGINT, lambda *a: open({str(marker)!r}, 'w').close())")

    async def run() -> None:
        km = notebooks.IPCKernelManager(kernel_name=notebooks.KERNEL)
        getattr(notebooks.IPCKernelManager, "hooks", dict)()  # as run_notebook: no cell runs
        await km.start_kernel()
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=60)
            kc.execute(code)
            reply = await kc.get_shell_msg(timeout=60)
            assert reply["content"]["status"] == "ok", reply["content"]
            await km.shutdown_kernel()
        finally:
            kc.stop_channels()
    asyncio.run(run())
    assert not marker.exists(), "the idle kernel got SIGINT at shutdown"


def test_a_running_cell_is_still_interrupted_at_shutdown():
    """Papermill stopped mid-cell (Ctrl-C, SIGTERM): the interrupt stays, so that a measuring
    cell records itself as interrupted and stops its engine. No kernel here: the manager
    goes on to jupyter_client's interrupt, which finds none running."""
    import asyncio

    km = notebooks.IPCKernelManager(kernel_name=notebooks.KERNEL)
    hooks = notebooks.IPCKernelManager.hooks()
    km.shutting_down = True
    asyncio.run(km.interrupt_kernel())  # idle: nothing sent, nothing raised
    hooks["on_cell_execute"](cell=None, cell_index=0)
    try:
        with pytest.raises(RuntimeError, match="No kernel is running"):
            asyncio.run(km.interrupt_kernel())
    finally:
        hooks["on_cell_executed"](cell=None, cell_index=0, execute_reply=None)
