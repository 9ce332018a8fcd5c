"""What a params file can get wrong, and how it is said: `Problem` and `ParamsError`.

Design:
- A `Problem` is one thing wrong in one file: the file the user must edit, the dotted key
  path there (`arms[1].concurrency`), and "expected ..., found ..." (or "unknown key ...
  (did you mean ...?)"). A `ParamsError` carries every problem found, one a line, and
  optionally what was being done ("while resolving notebook ... of suite ...").
- `Expect` annotates a field with how to describe its expected value in an error, where
  pydantic's own words would name an internal type.
- `shown` cuts a found value for a message; `one_of` / `duplicates` phrase the cross-field
  checks the models run after their types validate (a name among the valid ones, with a
  close match suggested; a name used twice).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a params file: where, what was expected, what was found."""

    file: str
    key: str
    message: str  # "expected ..., found ..." or "unknown key ... (did you mean ...?)"

    def __str__(self) -> str:
        return f"{self.file}: {self.key or '<top>'}: {self.message}"


class ParamsError(ValueError):
    """A params file is wrong; the message names file, key path, expected and found."""

    def __init__(self, problems: list[Problem] | str, context: str = ""):
        self.problems = [problems] if isinstance(problems, Problem) else problems
        if isinstance(problems, str):
            self.problems = []
            text = problems
        else:
            text = "\n".join(str(p) for p in self.problems)
        if context:
            text = f"{text}\n  (while {context})"
        super().__init__(text)


class Expect:
    """Annotated marker: how to describe a field's expected value in an error."""

    def __init__(self, text: str):
        self.text = text


def dotted(loc: Iterable[str | int]) -> str:
    """('arms', 1, 'concurrency') -> 'arms[1].concurrency'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def shown(value: Any) -> str:
    """A found value as an error message shows it: its repr, cut at 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def duplicates(key: str, names: list[str]) -> list[tuple[tuple, str]]:
    """A cross check: each name under `key` used again, as (key path, message)."""
    return [
        ((key, i, "name"), f"expected a unique name, found {n!r} again")
        for i, n in enumerate(names)
        if n in names[:i]
    ]


def one_of(what: str, valid: list, found: Any) -> str:
    """'expected <what> among <valid>, found <found>', the closest valid one suggested."""
    close = difflib.get_close_matches(str(found), [str(v) for v in valid], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"expected {what} among {valid}, found {found!r}{hint}"
