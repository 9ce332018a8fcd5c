"""The harness's modules import one another without cycles and through public names only.

Every import counts (top level, inside functions, under TYPE_CHECKING): a cycle means two
modules cannot be read, tested or moved apart, and a private name (`_x`) imported from, or
read on, another harness module is a seam that was never made an interface.
"""

from __future__ import annotations

import ast
from pathlib import Path

LIB = Path(__file__).resolve().parents[1] / "lib"
HARNESS = LIB / "specrepro" / "harness"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(LIB).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(HARNESS.rglob("*.py"))}


def imported(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, harness module, names taken from it) of each import of a harness module."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names if a.name in MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if sub in MODULES:  # `from package import module`
                    out.append((node.lineno, sub, []))
                elif node.module in MODULES:
                    out.append((node.lineno, node.module, [a.name]))
    return out


def graph() -> dict[str, set[str]]:
    edges = {}
    for name, path in MODULES.items():
        # a package's modules import its __init__ when imported: only explicit edges count
        edges[name] = {m for _, m, _ in imported(path) if m != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    return found


def test_harness_modules_form_no_import_cycle():
    found = cycles(graph())
    assert not found, "import cycles in the harness:\n" + "\n".join(" -> ".join(c)
                                                                   for c in found)


def test_no_private_name_crosses_harness_modules():
    bad = []
    for path in MODULES.values():
        aliases = {}
        tree = ast.parse(path.read_text())
        for line, module, names in imported(path):
            bad += [f"{path.relative_to(LIB)}:{line}: imports {n} from {module}"
                    for n in names if n.startswith("_") and not n.startswith("__")]
        for node in ast.walk(tree):  # `from specrepro.harness import steady as s`: s._x
            if isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    if f"{node.module}.{a.name}" in MODULES:
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                bad.append(f"{path.relative_to(LIB)}:{node.lineno}: reads "
                           f"{aliases[node.value.id]}.{node.attr}")
    assert not bad, "private names across harness modules:\n" + "\n".join(bad)


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
