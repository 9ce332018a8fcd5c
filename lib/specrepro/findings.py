"""The findings: `findings.yaml`, the one registry of the ids, read in order.

Design:
- A finding is one id shared by its notebook (`notebooks/<id>.ipynb`), its study
  (`params/studies/<id>.yaml`) and its claims entry (`analysis/verdict/claims.yaml`). The ids are
  listed once, in `findings.yaml`, in the order the index shows them; everything that needs
  the list reads it: the Makefile's `NOTEBOOKS`, `params.NOTEBOOK_IDS` (the keys a suite's
  `notebooks:` may bind), the claims (an entry for every finding and for nothing else,
  `analysis/verdict/claims.py`), the index (`analysis/render/report.py`, a row per finding).
- A suite binds any subset: a finding it leaves out is one that setup does not measure (the
  GB10 suite's documented skips); the index still gives it a row that says it was not
  executed. `make all` renders every finding, so the suites it runs (default, smoke) bind
  them all; a suite with skips runs by name (`make nb NB=<id>`, `specrepro run`).
- Plain lines rather than any YAML: Make reads the file with sed, so this module reads it
  the same way (`- <id>` at the start of a line, `#` comments) and refuses anything else,
  naming the line; then both see the same list. It is still valid YAML (a list of strings).
- Shared data with no project imports: params, analysis and the pipeline may all read it
  (tests/test_boundaries.py, SHARED).
"""

from __future__ import annotations

import re
from pathlib import Path

REGISTRY = Path(__file__).with_name("findings.yaml")
# a file name and one Make word: no spaces, no quoting
ENTRY = re.compile(r"- ([A-Za-z0-9][A-Za-z0-9_.-]*)")


class FindingsError(ValueError):
    """The registry is not a plain list of distinct ids; the message names file and line."""


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


IDS: tuple[str, ...] = load()
