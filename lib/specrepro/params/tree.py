"""YAML files as merged trees that remember which file set each key.

Design:
- Any params file may start with `include: [a.yaml, ...]` (paths relative to it). Includes
  are deep-merged in order, then the file's own keys on top: mappings merge key by key,
  anything else (lists, scalars) is replaced; later wins. Suite `overrides`, a notebook's
  `overrides` parameter and arm `overrides` merge the same way, into a study and into a
  profile (`deep_merge`).
- Every merged value remembers the file (and key path there) that set it (`Provenance`),
  so a validation error names the file the user must edit and the key path in it. A
  lookup takes the longest recorded prefix of a path and appends the rest.
- Files are displayed relative to the working directory where they lie below it
  (`display_file`), else as given.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from specrepro.params.errors import ParamsError, Problem, shown


def display_file(path: Path | str) -> str:
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# ------------------------------------------------------------------------ provenance


@dataclass
class Provenance:
    """Which file set each key path of a merged tree.

    entries maps a key path in the merged data to (file, key path in that file); a
    lookup takes the longest recorded prefix and appends the rest of the path.
    """

    entries: dict[tuple, tuple[str, tuple]] = field(default_factory=dict)

    @classmethod
    def of_file(cls, file: str) -> Provenance:
        return cls({(): (file, ())})

    def locate(self, path: tuple) -> tuple[str, tuple]:
        for n in range(len(path), -1, -1):
            hit = self.entries.get(path[:n])
            if hit is not None:
                return hit[0], hit[1] + path[n:]
        return "<params>", path

    def set(self, path: tuple, origin: tuple[str, tuple]) -> None:
        for key in [k for k in self.entries if len(k) > len(path) and k[: len(path)] == path]:
            del self.entries[key]
        self.entries[path] = origin


@dataclass
class Tree:
    """A YAML mapping together with the provenance of each of its keys."""

    data: dict
    prov: Provenance


def deep_merge(base: Tree, over: Tree, at: tuple = (), src: tuple = ()) -> None:
    """Merge over.data[src] into base.data[at] in place: mappings merge, the rest is replaced."""
    target = _get(base.data, at)
    source = lookup(over.data, src)
    if not isinstance(source, dict):  # nothing to merge (e.g. an arm without overrides)
        return
    for key, value in source.items():
        here, there = at + (key,), src + (key,)
        if isinstance(value, dict):
            if not isinstance(target.get(key), dict):
                target[key] = {}
                base.prov.set(here, over.prov.locate(there))
            deep_merge(base, over, here, there)
        else:
            target[key] = copy.deepcopy(value)
            base.prov.set(here, over.prov.locate(there))


def _get(data: Any, path: tuple) -> Any:
    for part in path:
        data = data[part]
    return data


def lookup(data: Any, path: tuple) -> Any:
    """The value at path, or None where the path does not exist."""
    try:
        return _get(data, path)
    except (KeyError, IndexError, TypeError):
        return None


# libyaml's safe loader where PyYAML was built with it (a suite resolves ~200 files a
# report; the pure-Python parser spent 2.4 s of a notebook's 7-s analysis there), the same
# tags and values as yaml.safe_load
FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_tree(path: Path | str, _seen: tuple[Path, ...] = ()) -> Tree:
    """Read one YAML file with its `include:` chain resolved (later wins, own keys last)."""
    path = Path(path)
    name = display_file(path)
    if not path.is_file():
        raise ParamsError([Problem(name, "", "expected a YAML file, found nothing at this path")])
    if path.resolve() in _seen:
        chain = " -> ".join(display_file(p) for p in (*_seen, path))
        raise ParamsError([Problem(name, "include", f"expected no include cycle, found {chain}")])
    text = path.read_text()
    try:
        raw = yaml.load(text, Loader=FAST_LOADER) or {}
    except yaml.YAMLError:
        try:  # the pure-Python parser's message shows the line with a caret under the fault
            yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ParamsError([Problem(name, "", f"expected valid YAML, found {err}")]) from None
        raise
    if not isinstance(raw, dict):
        raise ParamsError(
            [Problem(name, "", f"expected a mapping at the top, found {shown(raw)}")]
        )
    includes = raw.pop("include", [])
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        msg = f"expected a list of relative paths, found {shown(includes)}"
        raise ParamsError([Problem(name, "include", msg)])
    tree = Tree({}, Provenance.of_file(name))
    for rel in includes:
        deep_merge(tree, read_tree(path.parent / rel, (*_seen, path.resolve())))
    deep_merge(tree, Tree(raw, Provenance.of_file(name)))
    return tree
