"""No module outside the engines' package branches on an engine's name.

An engine's facts live on its adapter (lib/specrepro/harness/engines/, one module per
engine) and, for what a profile is validated by, in params/engine_kinds.py; everything
else asks them. This test reads every other module of lib/specrepro with `ast` and fails
on a comparison (==, !=, in, not in, a `match` case) against an engine's name, naming
the file and line, so a new engine never has to be added to a branch elsewhere. The
names it looks for are read from `engine_kinds.KINDS` and the adapters' registry, so a new
engine is covered without being added here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from specrepro.harness import engines
from specrepro.params.engine_kinds import KINDS

PKG = Path(__file__).resolve().parents[1] / "lib" / "specrepro"
ENGINES_PKG = PKG / "harness" / "engines"
# every engine a profile names (params/engine_kinds.py) and every adapter registered, the
# one attach.py may find behind a URL but no profile names (`generic`) included
ENGINE_NAMES = {*KINDS, *engines.ENGINES, *engines.ATTACHABLE}
COMPARING = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def names_in(node: ast.AST) -> list[str]:
    """Engine names a comparison operand spells: a string, or a tuple/list/set of them."""
    if isinstance(node, ast.Constant) and node.value in ENGINE_NAMES:
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for elt in node.elts for n in names_in(elt)]
    return []


def branches(source: str, filename: str) -> list[tuple[int, str]]:
    """(line, engine names) of every comparison against an engine's name in a module."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Compare) and any(isinstance(op, COMPARING) for op in node.ops):
            names = [n for side in (node.left, *node.comparators) for n in names_in(side)]
            if names:
                found.append((node.lineno, ", ".join(sorted(set(names)))))
        elif isinstance(node, ast.match_case):
            names = [n for sub in ast.walk(node.pattern) if isinstance(sub, ast.MatchValue)
                     for n in names_in(sub.value)]
            if names:
                found.append((node.pattern.lineno, ", ".join(sorted(set(names)))))
    return found


def outside_engines() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if ENGINES_PKG not in p.parents)


# Modules that still compare engine names, with how many comparisons and why: the
# exporters (tools/export/) write a drafter checkpoint in each serving engine's format and,
# run on the GPU image, may import neither params nor the harness; the others are outside
# the files issue 33's engine change owned (params/window.py, analysis/) and are its known
# debt. A new comparison in any module, these included, fails; lower a count once one is
# fixed.
KNOWN: dict[str, tuple[int, str]] = {
    "specrepro/tools/export/drafters.py": (2, "a drafter checkpoint in vLLM's or SGLang's format"),
    "specrepro/tools/export/standin.py": (1, "SGLang's fc bias, in its export format"),
}


def test_no_module_outside_the_engines_package_branches_on_an_engine_name():
    bad = []
    for path in outside_engines():
        rel = str(path.relative_to(PKG.parent))
        found = branches(path.read_text(), rel)
        allowed = KNOWN.get(rel, (0, ""))[0]
        if len(found) > allowed:
            bad += [f"lib/{rel}:{line}: compares against engine name(s) {names}; ask the "
                    "engine's adapter (harness/engines/) or params/engine_kinds.py"
                    for line, names in found]
    assert not bad, "branches on an engine's name:\n" + "\n".join(bad)


def test_the_known_debts_are_still_there():
    """A debt fixed is taken off KNOWN, so the count cannot hide a new branch later."""
    for rel, (count, _) in KNOWN.items():
        path = PKG.parent / rel
        assert len(branches(path.read_text(), rel)) == count, rel


@pytest.mark.parametrize("body", [
    'if profile.engine == "sglang":\n    pass\n',
    'x = 1 if family != "vllm" else 2\n',
    'ok = engine in ("attach", "transformers")\n',
    'match kind:\n    case "embedded":\n        pass\n',
])
def test_a_branch_on_an_engine_name_is_caught(body):
    assert [line for line, _ in branches(body, "planted.py")] == [1 + body.startswith("match")]


def test_other_comparisons_and_lookups_pass():
    body = ('a = engines["vllm"]\nb = name == "vllm-0.26.0"\nc = {"sglang": 1}.get(kind)\n'
            'd = "vllm" + suffix\n')
    assert branches(body, "planted.py") == []
