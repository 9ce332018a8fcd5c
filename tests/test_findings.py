"""The registry of findings (`findings/findings.yaml`), the findings' folders and everything
that reads them.

A finding is one folder, `findings/<id>/`: its notebook, its study and its claims entry.
These tests hold the checkout to the registry (the folders, the study files, the claims and
the Makefile list the same ids; every shipped suite binds every finding but those it
excludes with a reason), show that the registry refuses what Make could not read, that the
claims fail on load naming the finding and the registry when the two disagree, and add a
stub finding to a copy of the project: its folder and the registry line are the whole
change, and the Makefile, every suite, the claims, the notebook runner and the index all
take it.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from specrepro import findings, params
from specrepro.analysis.verdict import claims

ROOT = Path(__file__).resolve().parents[1]
# an id no finding has: the next number after the registry's (09_stub_finding today)
STUB = next(i for i in (f"{n:02d}_stub_finding" for n in range(len(findings.IDS) + 1, 100))
            if i not in findings.IDS)
# What adding a finding touches: its folder and the registry line (every suite binds it)
STUB_FILES = {"findings/findings.yaml", *(f"findings/{STUB}/{name}" for name in findings.FILES)}
SUITES = sorted((ROOT / "params").glob("*.yaml"))


def make_notebooks(root: Path) -> list[str]:
    """The Makefile's NOTEBOOKS as Make expands it in `root`."""
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    out = subprocess.run(["make", "-s", "--no-print-directory", "--eval",
                          "print-notebooks: ; @echo $(NOTEBOOKS)", "print-notebooks"],
                         cwd=root, capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.split()


# ------------------------------------------------------------- the checkout agrees with it


def test_every_finding_is_its_folder_and_nothing_else_is():
    assert findings.FOLDER == ROOT / "findings" and findings.REGISTRY.parent == findings.FOLDER
    findings.check_folders(findings.IDS)
    assert sorted(p.name for p in findings.FOLDER.iterdir() if p.is_dir()) == sorted(findings.IDS)
    for nb in findings.IDS:
        study = yaml.safe_load(findings.study_path(nb).read_text())
        assert (study["name"], study["notebook"]) == (nb, nb)  # its store: <results>/<id>/
    assert list(claims.all_claims()) == list(findings.IDS)
    assert not (ROOT / "notebooks").exists()  # the notebooks live in their folders


@pytest.mark.parametrize("path", SUITES, ids=lambda p: p.name)
def test_every_suite_binds_every_finding_it_does_not_exclude_to_its_own_study(path):
    """A suite says only where a finding differs: none binds a finding to another study
    file, and one it leaves out is excluded with the reason."""
    suite = params.load_suite(path)
    assert suite.binds == "all"
    assert list(suite.notebooks) == [nb for nb in findings.IDS if nb not in suite.excluded]
    for nb in suite.notebooks:
        assert suite.study_path(nb) == findings.study_path(nb), (path.name, nb)
    assert all(len(why.split()) >= 5 for why in suite.excluded.values()), suite.excluded


def test_the_makefile_reads_the_registry():
    assert make_notebooks(ROOT) == list(findings.IDS)


# ------------------------------------------------------------------------- what it refuses


@pytest.mark.parametrize("line", ['- "quoted"', "  - indented", "- two words", "-no_space",
                                  "01_no_dash"])
def test_registry_refuses_what_make_would_read_otherwise(tmp_path, line):
    path = tmp_path / "findings.yaml"
    path.write_text(f"# a comment\n- 01_first  # a note\n{line}\n")
    with pytest.raises(findings.FindingsError, match=r"findings.yaml:3: expected '- <id>'"):
        findings.load(path)


def test_registry_refuses_a_twice_listed_id_and_an_empty_list(tmp_path):
    path = tmp_path / "findings.yaml"
    path.write_text("- a\n- b\n- a\n")
    with pytest.raises(findings.FindingsError, match=r"findings.yaml:3: 'a' is listed twice"):
        findings.load(path)
    path.write_text("# nothing\n")
    with pytest.raises(findings.FindingsError, match="lists no finding"):
        findings.load(path)


@pytest.fixture
def registry(monkeypatch):
    """findings.IDS to replace; claims re-read under it, and again after."""
    claims.all_claims.cache_clear()
    yield lambda ids: monkeypatch.setattr(findings, "IDS", tuple(ids))
    monkeypatch.undo()
    claims.all_claims.cache_clear()


def test_a_finding_without_its_folder_fails_naming_both(registry):
    registry([*findings.IDS, STUB])
    with pytest.raises(claims.ClaimsError) as err:
        claims.all_claims()
    msg = str(err.value)
    assert msg.startswith(f"{findings.FOLDER / STUB}: expected notebook.ipynb, study.yaml, "
                          f"claims.yaml of finding {STUB!r}")
    assert str(findings.REGISTRY) in msg


def test_a_finding_folder_the_registry_does_not_list_fails_naming_both(registry):
    *kept, dropped = findings.IDS
    registry(kept)
    with pytest.raises(claims.ClaimsError) as err:
        claims.all_claims()
    msg = str(err.value)
    assert msg.startswith(f"{findings.FOLDER / dropped}: a finding's folder that ")
    assert f"add '- {dropped}' there" in msg and str(findings.REGISTRY) in msg


# -------------------------------------------------------- a stub finding, in a project copy


CHECKS = textwrap.dedent("""
    import sys
    from pathlib import Path

    from specrepro import findings, params
    from specrepro.analysis.render import notebooks, report
    from specrepro.analysis.verdict import claims

    stub = sys.argv[1]
    assert findings.IDS[-1] == stub and params.NOTEBOOK_IDS == findings.IDS, findings.IDS
    for path in sorted(Path("params").glob("*.yaml")):  # every suite binds it, and resolves it
        study = params.resolve_study(params.load_suite(path), stub)
        assert study.notebook_id == stub and any(True for _ in study.cells()), path
    smoke = params.resolve_study(params.load_suite("params/smoke.yaml"), stub)
    assert max(smoke.concurrency) <= 2 and all(w.n <= 4 for w in smoke.workloads)  # its sizes
    assert list(claims.all_claims()) == list(findings.IDS)
    assert claims.claims_for(stub).title == "A stub finding"
    notebooks.check(stub, {"params_file": "params/smoke.yaml", "notebook_id": stub,
                           "mode": "replay", "results_dir": None, "overrides": {},
                           "figures_dir": "figures"})
    Path(sys.argv[2]).mkdir()  # no notebook executed: every finding's row says so
    index = report.write_index(Path(sys.argv[2])).read_text()
    assert index.index(findings.IDS[-2]) < index.index(stub), "the stub's row comes last"
    print("ok")
""")


def test_a_stub_finding_is_its_folder_and_its_registry_line(tmp_path):
    root = tmp_path / "project"
    for part in ("lib", "params", "findings"):
        shutil.copytree(ROOT / part, root / part,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(ROOT / name, root / name)

    # the whole change: one line, and a finding's folder copied and renamed
    with open(root / "findings/findings.yaml", "a") as fh:
        fh.write(f"- {STUB}\n")
    # a finding every suite binds, copied as a new contributor would copy one
    template = next(nb for nb in reversed(findings.IDS)
                    if not any(nb in params.load_suite(p).excluded for p in SUITES))
    shutil.copytree(root / "findings" / template, root / "findings" / STUB)
    for name in (findings.NOTEBOOK, findings.STUDY):
        path = root / "findings" / STUB / name
        path.write_text(path.read_text().replace(template, STUB))
    path = root / "findings" / STUB / findings.CLAIMS
    entry = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**entry, "title": "A stub finding"}, sort_keys=False))

    def differs(path: Path) -> bool:
        original = ROOT / path.relative_to(root)
        return not original.is_file() or not filecmp.cmp(path, original, shallow=False)

    changed = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and differs(p)}
    assert changed == STUB_FILES

    assert make_notebooks(root) == [*findings.IDS, STUB]
    env = {**os.environ, "PYTHONPATH": str(root / "lib")}
    out = subprocess.run([sys.executable, "-c", CHECKS, STUB, str(tmp_path / "reports")],
                         cwd=root, env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
