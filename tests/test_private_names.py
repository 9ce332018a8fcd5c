"""No module of lib/specrepro reaches into another module's private names.

A leading underscore says "this module's own, free to change"; a name another module needs
is part of its owner's interface and loses the underscore there (issue 33: files split by
size along private seams had 21 such crossings). Read with `ast`, every module of the
package (imports inside functions too):
- `from specrepro.x import _name` (relative imports resolved) fails naming file, line, name;
- `mod._name` fails where `mod` is bound in that file to a project module (`import
  specrepro.x as mod`, `from specrepro import x`, `from specrepro.x import y` where `y` is a
  module);
- a package with a public interface (`PUBLIC_PACKAGES`: its `__init__` names what others
  use) is imported from outside only as itself, never as one of its modules.
Dunder names (`__version__`, `__doc__`) are not private.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / "lib"
PKG = LIB / "specrepro"

# Packages whose modules are their own business: code outside imports the package only.
PUBLIC_PACKAGES = ("specrepro.store",)

def module_name(path: Path) -> str:
    parts = list(path.relative_to(LIB).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(name: str) -> bool:
    """Whether a dotted name of the project is a module or package (not a function)."""
    base = LIB.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def resolved(node: ast.ImportFrom, path: Path) -> str:
    """The module an ImportFrom names, a relative one resolved against path's package."""
    if not node.level:
        return node.module or ""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def crossings(path: Path) -> list[tuple[str, str]]:
    """(`file:name`, `file:line: what`) for every private name of another project module
    this file uses, and every import of a public package's inner module from outside it."""
    rel = path.relative_to(LIB.parent)
    me = module_name(path)
    tree = ast.parse(path.read_text(), filename=str(path))
    modules: dict[str, str] = {}  # local name -> project module it is bound to
    bad = []

    def outside_interface(line: int, target: str) -> None:
        for pkg in PUBLIC_PACKAGES:
            inner = target.startswith(pkg + ".")
            if inner and not (me == pkg or me.startswith(pkg + ".")):
                bad.append((f"{rel}:{target}", (f"{rel}:{line}: imports {target}; outside "
                                                f"{pkg}, import its public interface `{pkg}`")))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("specrepro."):
                    outside_interface(node.lineno, a.name)
                    if a.asname:
                        modules[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            base = resolved(node, path)
            if not (base == "specrepro" or base.startswith("specrepro.")):
                continue
            outside_interface(node.lineno, base)
            for a in node.names:
                if private(a.name) and base != me:
                    bad.append((f"{rel}:{a.name}",
                                f"{rel}:{node.lineno}: imports {a.name} from {base}"))
                elif is_module(f"{base}.{a.name}"):
                    outside_interface(node.lineno, f"{base}.{a.name}")
                    modules[a.asname or a.name] = f"{base}.{a.name}"
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules and private(node.attr)
                and modules[node.value.id] != me):
            bad.append((f"{rel}:{node.attr}", (f"{rel}:{node.lineno}: uses {node.attr} of "
                                               f"{modules[node.value.id]} "
                                               f"({node.value.id}.{node.attr})")))
    return bad


def all_crossings() -> list[tuple[str, str]]:
    found = [c for path in sorted(PKG.rglob("*.py")) for c in crossings(path)]
    return sorted(set(found), key=found.index)  # a name used twice on a line: once


def test_no_module_uses_another_modules_private_names():
    bad = [line for _, line in all_crossings()]
    assert not bad, "private names crossing modules:\n" + "\n".join(bad)


@pytest.mark.parametrize("where, body, words", [
    ("analysis/planted.py", "from specrepro.analysis.finding.tables import _x\n",
     "imports _x from specrepro.analysis.finding.tables"),
    ("analysis/finding/planted.py", "def f():\n    from .tables import _x\n",
     "imports _x from specrepro.analysis.finding.tables"),
    ("analysis/planted.py", "from specrepro.analysis.finding import tables\ntables._x()\n",
     "uses _x of specrepro.analysis.finding.tables (tables._x)"),
    ("analysis/planted.py", "import specrepro.analysis.finding.tables as t\nt._x\n",
     "uses _x of specrepro.analysis.finding.tables (t._x)"),
    ("analysis/planted.py", "from specrepro.store.files import KEYS\n",
     "imports specrepro.store.files; outside specrepro.store"),
    ("analysis/planted.py", "from specrepro.store import files\n",
     "imports specrepro.store.files; outside specrepro.store"),
])
def test_a_crossing_is_caught_and_named(tmp_path, monkeypatch, where, body, words):
    """The checker itself: a planted private use fails naming the file, line and name."""
    fake_lib = tmp_path / "lib"
    for module in ("analysis/finding/tables.py", "store/__init__.py", "store/files.py"):
        (fake_lib / "specrepro" / module).parent.mkdir(parents=True, exist_ok=True)
        (fake_lib / "specrepro" / module).write_text("")
    target = fake_lib / "specrepro" / where
    target.write_text(body)
    monkeypatch.setattr(__import__(__name__), "LIB", fake_lib)
    bad = crossings(target)
    assert len(bad) == 1 and words in bad[0][1] and "planted.py:" in bad[0][1], bad


def test_own_names_dunders_and_public_names_pass(tmp_path, monkeypatch):
    fake_lib = tmp_path / "lib"
    (fake_lib / "specrepro" / "store").mkdir(parents=True)
    (fake_lib / "specrepro" / "store" / "__init__.py").write_text("")
    (fake_lib / "specrepro" / "store" / "files.py").write_text("")
    inner = fake_lib / "specrepro" / "store" / "loaders.py"
    inner.write_text("from specrepro.store.files import KEYS\nfrom . import files\n"
                     "from specrepro import __version__\nfiles.__doc__\n")
    monkeypatch.setattr(__import__(__name__), "LIB", fake_lib)
    assert crossings(inner) == []
