"""Every notebook executes under papermill on the smoke suite against the embedded server on
the tiny checkpoint, and `reports/index.html` and every report render in headless Chromium
with no missing image."""

from __future__ import annotations

import html.parser
import json
import os
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest
import yaml

from specrepro.analysis import notebooks, report
from specrepro.params import NOTEBOOK_IDS

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.slow


def smoke_suite_on(checkpoint: Path, where: Path) -> Path:
    """params/smoke.yaml with its profiles pointed at a checkpoint and its results in tmp:
    a copy of params/profiles whose model and drafter ids name the checkpoint."""
    profiles = where / "profiles"
    profiles.mkdir()
    for path in (ROOT / "params" / "profiles").glob("*.yaml"):
        data = yaml.safe_load(path.read_text())
        for key in ("model", "drafter"):
            if isinstance(data.get(key), dict) and data[key].get("id") == "models/embedded":
                data[key]["id"] = str(checkpoint)
        (profiles / path.name).write_text(yaml.safe_dump(data, sort_keys=False))
    suite = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    for binding in suite["notebooks"].values():
        binding["study"] = str(ROOT / "params" / binding["study"])
    suite.update(profiles=str(profiles), results_dir=str(where / "results"))
    path = where / "smoke.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def executed(tiny_checkpoint, tmp_path_factory):
    """Every notebook run once (mode auto: it measures), then the index."""
    where = tmp_path_factory.mktemp("smoke_notebooks")
    suite = smoke_suite_on(tiny_checkpoint, where)
    reports, figures = where / "reports", where / "figures"
    failures = {}
    for nb in NOTEBOOK_IDS:
        try:
            notebooks.run_notebook(nb, suite, reports_dir=reports, figures_dir=figures)
        except Exception as err:  # noqa: BLE001 - reported per notebook below
            failures[nb] = f"{type(err).__name__}: {err}"
    report.write_index(reports)
    return {"reports": reports, "figures": figures, "failures": failures, "suite": suite}


@pytest.mark.parametrize("nb", NOTEBOOK_IDS)
def test_notebook_executes_on_the_smoke_suite(executed, nb):
    assert nb not in executed["failures"], executed["failures"].get(nb)
    entry = report.read_report(executed["reports"] / f"{nb}.ipynb")
    assert entry["verdict"] and entry["verdict"].split(":")[0] in (
        "shape holds here", "does not hold", "cannot tell here")
    assert entry["figures"], f"{nb} wrote no figure"
    for fig in entry["figures"]:
        assert Path(fig).is_file() and Path(fig).with_suffix(".svg").is_file()
    assert (executed["reports"] / f"{nb}.html").is_file()
    book = nbformat.read(executed["reports"] / f"{nb}.ipynb", as_version=4)
    errors = [o for c in book.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors


def test_a_second_run_replays_without_measuring(executed, capfd):
    before = sorted(p.name for p in (executed["suite"].parent / "results").rglob("*.parquet"))
    notebooks.run_notebook("07_the_bill", executed["suite"], mode="replay",
                           reports_dir=executed["reports"], figures_dir=executed["figures"])
    after = sorted(p.name for p in (executed["suite"].parent / "results").rglob("*.parquet"))
    assert before == after
    # the kernel runs over IPC (notebooks.IPCKernelManager): no "TCP without encryption"
    # warning from ipykernel, and no socket file left beside the project
    assert "without encryption" not in capfd.readouterr().err
    assert not list(ROOT.glob("kernel-*")) and not list(ROOT.glob("127.0.0.1-*"))


class Images(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.srcs: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.srcs.append(dict(attrs).get("src") or "")


def chromium_dom(page: Path, profile: Path) -> str:
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", f"--user-data-dir={profile}", "--virtual-time-budget=10000",
            "--dump-dom", page.as_uri()]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


HARNESS = """<!DOCTYPE html><html><body>{imgs}<pre id="out"></pre><script>
window.addEventListener('load', () => {{
  const r = [...document.images].map(i => [i.getAttribute('src').slice(0, 80), i.naturalWidth]);
  document.getElementById('out').textContent = 'RESULT:' + JSON.stringify(r) + ':END';
}});</script></body></html>"""


def test_index_and_every_report_render_in_chromium_with_no_missing_image(executed, tmp_path):
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI (.ci/run installs Debian's chromium)")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    reports = executed["reports"]
    pages = [reports / "index.html", *(reports / f"{nb}.html" for nb in NOTEBOOK_IDS)]
    for page in pages:
        dom = chromium_dom(page, tmp_path / "profile")
        assert "</html>" in dom and len(dom) > 500, f"{page.name} did not render"
        parser = Images()
        parser.feed(page.read_text())
        assert parser.srcs, f"{page.name} has no image"
        # the page's own <img> sources, loaded from beside it, report their natural width
        harness = page.parent / f"_harness_{page.stem}.html"
        harness.write_text(HARNESS.format(imgs="".join(
            f'<img src="{src}">' for src in parser.srcs)))
        try:
            out = chromium_dom(harness, tmp_path / "profile")
        finally:
            harness.unlink()
        result = json.loads(out.split("RESULT:", 1)[1].split(":END", 1)[0])
        assert len(result) == len(parser.srcs)
        missing = [src for src, width in result if width == 0]
        assert not missing, f"{page.name}: images that did not load: {missing}"
