"""The findings: `findings/findings.yaml`, the one registry of the ids, and each one's folder.

Design:
- A finding is one folder, `findings/<id>/`: its notebook (`notebook.ipynb`), its study
  (`study.yaml`) and its claims entry (`claims.yaml`), the three named by the folder, never
  by a list elsewhere. The ids are listed once, in `findings/findings.yaml`, in the order the
  index shows them; everything that needs the list reads it: the Makefile's `NOTEBOOKS`,
  `params.NOTEBOOK_IDS` (the findings every suite binds unless it excludes one),
  the claims (`analysis/verdict/claims.py`: a claims file for every finding), the index
  (`analysis/render/report.py`, a row per finding).
- Every suite binds every finding by default (params/schema.py, `Suite`): a suite says only
  where its sizes, arms or profiles differ, or excludes a finding with a reason. `make all`
  renders every finding on the suite it runs (default, smoke: neither excludes any).
- Plain lines rather than any YAML: Make reads the registry with sed, so this module reads
  it the same way (`- <id>` at the start of a line, `#` comments) and refuses anything else,
  naming the line; then both see the same list. It is still valid YAML (a list of strings).
  `check_folders` holds the folders to the registry: a registered id without its three
  files, or a folder of a finding's files that no line registers, fails naming both.
- The folders live in the checkout beside `params/` (this file is
  `<checkout>/lib/specrepro/findings.py`), as the notebooks always have.
- Shared data with no project imports: params, analysis and the pipeline may all read it
  (tests/test_boundaries.py, SHARED).
"""

from __future__ import annotations

import re
from pathlib import Path

FOLDER = Path(__file__).resolve().parents[2] / "findings"  # the checkout's findings/
REGISTRY = FOLDER / "findings.yaml"
# A finding's files, inside its folder
NOTEBOOK, STUDY, CLAIMS = "notebook.ipynb", "study.yaml", "claims.yaml"
FILES = (NOTEBOOK, STUDY, CLAIMS)
# a file name and one Make word: no spaces, no quoting
ENTRY = re.compile(r"- ([A-Za-z0-9][A-Za-z0-9_.-]*)")


class FindingsError(ValueError):
    """The registry is not a plain list of distinct ids, or the folders disagree with it;
    the message names the file and line, or the folder."""


def load(path: Path = REGISTRY) -> tuple[str, ...]:
    """The finding ids of a registry file, in its order."""
    ids: list[str] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = line.split("#", 1)[0].rstrip()
        if not text:
            continue
        entry = ENTRY.fullmatch(text)
        if entry is None:
            raise FindingsError(f"{path}:{n}: expected '- <id>' at the start of the line (id: "
                                f"letters, digits, _ . -), found {line!r}")
        if entry[1] in ids:
            raise FindingsError(f"{path}:{n}: {entry[1]!r} is listed twice")
        ids.append(entry[1])
    if not ids:
        raise FindingsError(f"{path}: lists no finding")
    return tuple(ids)


def folder(finding: str, root: Path = FOLDER) -> Path:
    """A finding's folder: `findings/<id>/`."""
    return root / finding


def notebook_path(finding: str, root: Path = FOLDER) -> Path:
    return folder(finding, root) / NOTEBOOK


def study_path(finding: str, root: Path = FOLDER) -> Path:
    return folder(finding, root) / STUDY


def claims_path(finding: str, root: Path = FOLDER) -> Path:
    return folder(finding, root) / CLAIMS


def shown(finding: str, name: str = CLAIMS) -> str:
    """A finding's file as messages name it, relative to the checkout:
    `findings/<id>/claims.yaml`."""
    return f"{FOLDER.name}/{finding}/{name}"


def check_folders(ids: tuple[str, ...], root: Path = FOLDER) -> None:
    """Fail unless every registered finding has its folder's three files and every folder
    holding one of them is registered."""
    where = root / REGISTRY.name
    for nb in ids:
        missing = [name for name in FILES if not (folder(nb, root) / name).is_file()]
        if missing:
            raise FindingsError(f"{folder(nb, root)}: expected {', '.join(missing)} of "
                                f"finding {nb!r}, registered in {where}; found none")
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        if d.name not in ids and any((d / name).is_file() for name in FILES):
            raise FindingsError(f"{d}: a finding's folder that {where} does not list; add "
                                f"'- {d.name}' there or remove the folder")


IDS: tuple[str, ...] = load()
