"""The registry of findings (`specrepro/findings.yaml`) and everything that reads it.

A finding is one id: its notebook, its study, its claims entry. These tests hold the
checkout to the registry (the notebooks folder, the study files, claims.yaml and the
Makefile list the same ids), show that the registry refuses what Make could not read, that
claims.yaml fails on load naming both files when the two disagree, and add a stub finding
to a copy of the project: the registry line, a notebook, a study file, a claims entry and
the binding of the suite that measures it are the whole change, and the Makefile, the
params schema, the claims, the notebook runner and the index all take it.
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

from specrepro import findings
from specrepro.analysis.verdict import claims

ROOT = Path(__file__).resolve().parents[1]
STUB = "09_stub_finding"
# What adding a finding touches (a suite binds the findings it measures; smoke binds all)
STUB_FILES = {"lib/specrepro/findings.yaml", "lib/specrepro/analysis/verdict/claims.yaml",
              f"notebooks/{STUB}.ipynb", f"params/studies/{STUB}.yaml", "params/smoke.yaml"}


def make_notebooks(root: Path) -> list[str]:
    """The Makefile's NOTEBOOKS as Make expands it in `root`."""
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    out = subprocess.run(["make", "-s", "--no-print-directory", "--eval",
                          "print-notebooks: ; @echo $(NOTEBOOKS)", "print-notebooks"],
                         cwd=root, capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.split()


# ------------------------------------------------------------- the checkout agrees with it


def test_every_finding_has_its_notebook_study_and_claims_entry_and_nothing_else_does():
    assert sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb")) == sorted(findings.IDS)
    for nb in findings.IDS:
        study = yaml.safe_load((ROOT / "params" / "studies" / f"{nb}.yaml").read_text())
        assert (study["name"], study["notebook"]) == (nb, nb)
    assert list(claims.all_claims()) == list(findings.IDS)


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


def test_a_finding_without_claims_entry_fails_naming_both(registry):
    registry([*findings.IDS, STUB])
    with pytest.raises(claims.ClaimsError) as err:
        claims.all_claims()
    assert f"no entry for {STUB!r}" in str(err.value) and "findings.yaml" in str(err.value)
    assert str(err.value).startswith("claims.yaml: ")


def test_a_claims_entry_of_no_finding_fails_naming_both(registry):
    *kept, dropped = findings.IDS
    registry(kept)
    with pytest.raises(claims.ClaimsError) as err:
        claims.all_claims()
    assert f"{dropped!r} is not a finding of" in str(err.value)
    assert str(err.value).startswith("claims.yaml: ") and "findings.yaml" in str(err.value)


# -------------------------------------------------------- a stub finding, in a project copy


CHECKS = textwrap.dedent("""
    import sys
    from pathlib import Path

    from specrepro import findings, params
    from specrepro.analysis.render import notebooks, report
    from specrepro.analysis.verdict import claims

    stub = sys.argv[1]
    assert findings.IDS[-1] == stub and params.NOTEBOOK_IDS == findings.IDS, findings.IDS
    suite = params.load_suite("params/smoke.yaml")
    study = params.resolve_study(suite, stub)
    assert study.notebook_id == stub and any(True for _ in study.cells())
    assert list(claims.all_claims()) == list(findings.IDS)
    assert claims.claims_for(stub).title == "A stub finding"
    notebooks.check(stub, {"params_file": "params/smoke.yaml", "notebook_id": stub,
                           "mode": "replay", "results_dir": None, "overrides": {},
                           "figures_dir": "figures"})
    Path(sys.argv[2]).mkdir()  # no notebook executed: every finding's row says so
    index = report.write_index(Path(sys.argv[2])).read_text()
    assert index.index("07_the_bill") < index.index(stub), "the stub's row comes last"
    print("ok")
""")


def test_a_stub_finding_is_its_notebook_study_claims_entry_and_registry_line(tmp_path):
    root = tmp_path / "project"
    for part in ("lib", "params", "notebooks"):
        shutil.copytree(ROOT / part, root / part,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(ROOT / name, root / name)

    # the whole change: one line, three files named by the id, and the suite's binding
    with open(root / "lib/specrepro/findings.yaml", "a") as fh:
        fh.write(f"- {STUB}\n")
    template = "07_the_bill"
    book = (root / f"notebooks/{template}.ipynb").read_text()
    (root / f"notebooks/{STUB}.ipynb").write_text(book.replace(template, STUB))
    study = (root / f"params/studies/{template}.yaml").read_text()
    (root / f"params/studies/{STUB}.yaml").write_text(study.replace(template, STUB))
    entry = yaml.safe_load((root / "lib/specrepro/analysis/verdict/claims.yaml").read_text())[template]
    with open(root / "lib/specrepro/analysis/verdict/claims.yaml", "a") as fh:
        fh.write("\n" + yaml.safe_dump({STUB: {**entry, "title": "A stub finding"}},
                                       sort_keys=False))
    with open(root / "params/smoke.yaml", "a") as fh:
        fh.write(f"\n  {STUB}:\n    study: studies/{STUB}.yaml\n"
                 "    overrides: {repeats: 1, concurrency: [1], reasoning_effort: null}\n")

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
