"""vLLM's `get_kwargs(Config)`: how a config dataclass field's type becomes argparse
keywords, read from the wheel's own if/elif chain (`_compute_kwargs` in
`vllm/engine/arg_utils.py`) so a rule the wheel adds fails here instead of passing.

Design: `VllmKwargsRules` reads the chain's tests in order and applies them to a field's
type hints (`vllm_type_hints`), failing on a test it does not know; `FieldKwargs` is one
field's keywords (mutable, as vLLM edits them before `add_argument`), `KwargsMap` the
whole `get_kwargs` result. The rules of 0.26.0: a dataclass member → JSON; exactly
`bool | str | None` → an optional-valued flag; any other type holding `bool` →
`argparse.BooleanOptionalAction`; a `Literal` → `choices` unless `str` is in the union;
a list/tuple/set of a `Literal` → `choices` (vllm.py has the rest).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

from specrepro.tools.extract_engine_cli.registry import action_name
from specrepro.tools.extract_engine_cli.wheel import (
    ExtractError,
    Module,
    annotation,
    head_name,
    is_dataclass,
    literal_values,
    resolve,
    subscript_args,
)


@dataclass
class FieldKwargs:
    """vLLM's `get_kwargs(Config)["field"]`: the argparse keywords of one field, mutable."""

    values: dict[str, Any]
    field: str


@dataclass
class KwargsMap:
    """vLLM's `get_kwargs(Config)`: the fields of a config dataclass and their keywords."""

    fields: dict[str, FieldKwargs]


def vllm_type_hints(module: Module, node: ast.AST, depth: int = 0) -> list[tuple[str, Any]]:
    """vLLM's `get_type_hints`: Annotated and unions flattened, aliases followed.

    Each hint is (kind, detail): ("bool"|"str"|"int"|"float"|"None"|"dict"|"other", None),
    ("Literal", values), ("list"|"tuple"|"set", element hints), ("class", Ref)."""
    node = annotation(node)
    if depth > 30:
        return [("other", None)]
    if isinstance(node, ast.Constant) and node.value is None:
        return [("None", None)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return (vllm_type_hints(module, node.left, depth + 1)
                + vllm_type_hints(module, node.right, depth + 1))
    if isinstance(node, ast.Subscript):
        name, args = head_name(node.value), subscript_args(node)
        if name in ("Annotated", "SkipValidation"):  # pydantic's SkipValidation[X] is Annotated
            return vllm_type_hints(module, args[0], depth + 1)
        if name == "Union":
            return [h for a in args for h in vllm_type_hints(module, a, depth + 1)]
        if name == "Optional":
            return vllm_type_hints(module, args[0], depth + 1) + [("None", None)]
        if name == "Literal":
            values = literal_values(module, node)
            return [("Literal", values or [])]
        if name in ("list", "List", "tuple", "Tuple", "set", "Set"):  # not Sequence: its
            kind = name.lower()                                          # origin is not list
            elems = [a for a in args if not (isinstance(a, ast.Constant) and a.value is Ellipsis)]
            return [(kind, vllm_type_hints(module, elems[0], depth + 1) if elems else [])]
        if name in ("dict", "Dict"):
            return [("dict", None)]
        return [("other", None)]
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = head_name(node)
        if name in ("bool", "str", "int", "float", "dict", "list", "tuple", "set"):
            return [(name, None)]
        if name == "None":
            return [("None", None)]
        ref = resolve(module, node)
        if ref is None or ref.node is None:
            return [("other", None)]
        if ref.is_class:
            return [("class", ref)]
        if isinstance(ref.node, ast.FunctionDef):
            return [("other", None)]
        return vllm_type_hints(ref.module, ref.node, depth + 1)  # a type alias
    return [("other", None)]


HINT_KINDS = {"bool", "str", "int", "float", "dict", "list", "tuple", "set", "Literal"}


class VllmKwargsRules:
    """vLLM's `_compute_kwargs` (vllm/engine/arg_utils.py), read from the wheel: the if/elif
    chain that turns a field's type hints into argparse keywords, as (predicate, effect)
    branches. A test or an effect outside the vocabulary below fails naming its line, so a
    changed rule is read anew instead of assumed."""

    def __init__(self, module: Module):
        self.module = module
        func = module.defs.get("_compute_kwargs") or module.defs.get("get_kwargs")
        if not isinstance(func, ast.FunctionDef):
            raise ExtractError(f"{module.wheel.path.name}: no _compute_kwargs or get_kwargs in "
                               f"{module.path}")
        loop = next((n for n in ast.walk(func) if isinstance(n, ast.For)
                     and isinstance(n.iter, ast.Call) and head_name(n.iter.func) == "fields"), None)
        if loop is None:
            raise self.error(func, "no `for field in fields(cls)` loop")
        # `generator = (th for th in type_hints if is_dataclass(th))`,
        # `dataclass_cls = next(generator, None)`: names holding the dataclass member.
        self.dataclass_vars: set[str] = set()
        assigns = [n for n in ast.walk(loop) if isinstance(n, ast.Assign)
                   and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)]
        for _ in range(3):
            for n in assigns:
                if any((isinstance(c, ast.Call) and head_name(c.func) == "is_dataclass")
                       or (isinstance(c, ast.Name) and c.id in self.dataclass_vars)
                       for c in ast.walk(n.value)):
                    self.dataclass_vars.add(n.targets[0].id)
        names = self.dataclass_vars | {"type_hints"}
        chain = next((n for n in loop.body if isinstance(n, ast.If)
                      and any(isinstance(x, ast.Name) and x.id in names for x in ast.walk(n.test))
                      and self.effects(n.body).get("type") == "json"), None)
        if chain is None:
            raise self.error(loop, "no if/elif chain over the field's type hints")
        self.branches: list[tuple[Any, dict, int]] = []
        node: ast.If | None = chain
        while node is not None:
            self.branches.append((self.predicate(node.test), self.effects(node.body), node.lineno))
            orelse = node.orelse
            if len(orelse) == 1 and isinstance(orelse[0], ast.If):  # elif
                node = orelse[0]
            elif orelse:  # the final else: always taken
                node = ast.If(test=ast.Constant(True), body=orelse, orelse=[],
                              lineno=orelse[0].lineno)
            else:
                node = None
        # After the chain: a list/tuple/set of a Literal gets the Literal's choices.
        self.collection_literal = any(
            isinstance(n, ast.If) and {"get_origin", "Literal"} <= {
                head_name(x) for x in ast.walk(n.test)}
            for n in loop.body)
        self.literal_metavar_with_str = self.read_literal_to_kwargs()

    def error(self, node: ast.AST, what: str) -> ExtractError:
        return ExtractError(f"{self.module.wheel.path.name}: {self.module.path}:"
                            f"{getattr(node, 'lineno', '?')}: {what}; the script's reading of "
                            "vLLM's type → argparse rule needs updating")

    def read_literal_to_kwargs(self) -> bool:
        """`kwarg = "metavar" if contains_type(type_hints, str) else "choices"`."""
        func = self.module.defs.get("literal_to_kwargs")
        if not isinstance(func, ast.FunctionDef):
            raise self.error(self.module.tree, "no literal_to_kwargs")
        for n in ast.walk(func):
            if (isinstance(n, ast.IfExp) and isinstance(n.body, ast.Constant)
                    and n.body.value == "metavar"):
                return True
        if any(isinstance(n, ast.Constant) and n.value == "choices" for n in ast.walk(func)):
            return False
        raise self.error(func, "literal_to_kwargs sets neither choices nor metavar")

    def predicate(self, test: ast.AST):
        """A branch test as a function of (kinds, has_dataclass, has_nonbuiltin)."""
        if isinstance(test, ast.Constant) and test.value is True:
            return lambda kinds, dc, nb: True
        if isinstance(test, ast.BoolOp):
            parts = [self.predicate(v) for v in test.values]
            if isinstance(test.op, ast.And):
                return lambda kinds, dc, nb: all(p(kinds, dc, nb) for p in parts)
            return lambda kinds, dc, nb: any(p(kinds, dc, nb) for p in parts)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = self.predicate(test.operand)
            return lambda kinds, dc, nb: not inner(kinds, dc, nb)
        if (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Name)
                and test.left.id in self.dataclass_vars
                and isinstance(test.comparators[0], ast.Constant)
                and test.comparators[0].value is None):
            wanted = isinstance(test.ops[0], ast.IsNot)
            return lambda kinds, dc, nb: dc == wanted
        if (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
                and isinstance(test.left, ast.Name) and test.left.id == "type_hints"
                and isinstance(test.comparators[0], ast.Set)):
            wanted = {self.kind(e) for e in test.comparators[0].elts}
            return lambda kinds, dc, nb: kinds == wanted
        if (isinstance(test, ast.Call) and head_name(test.func) == "contains_type"
                and len(test.args) == 2):
            kind = self.kind(test.args[1])
            return lambda kinds, dc, nb: kind in kinds
        if (isinstance(test, ast.Call) and head_name(test.func) == "any" and test.args
                and isinstance(test.args[0], ast.GeneratorExp)
                and head_name(getattr(test.args[0].elt, "func", None)) == "is_not_builtin"):
            return lambda kinds, dc, nb: nb
        raise self.error(test, f"unknown test `{ast.unparse(test)}`")

    def kind(self, node: ast.AST) -> str:
        if isinstance(node, ast.Call) and head_name(node.func) == "type" and node.args \
                and isinstance(node.args[0], ast.Constant) and node.args[0].value is None:
            return "None"
        if isinstance(node, ast.Constant) and node.value is None:
            return "None"
        name = head_name(node)
        if name not in HINT_KINDS:
            raise self.error(node, f"unknown type `{ast.unparse(node)}`")
        return name

    def effects(self, body: list[ast.stmt]) -> dict:
        """What one branch sets: action, nargs, Literal choices, a collection, JSON."""
        out: dict[str, Any] = {}
        for n in (x for stmt in body for x in ast.walk(stmt)):
            if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Subscript) \
                    and isinstance(n.targets[0].slice, ast.Constant):
                key = n.targets[0].slice.value
                if key == "action":
                    out["action"] = action_name(self.module, n.value)
                elif key == "nargs":
                    out["nargs"] = n.value.value if isinstance(n.value, ast.Constant) else "?"
                elif (key == "type" and isinstance(n.value, ast.Name)
                      and n.value.id.startswith("parse_dataclass")):
                    out["type"] = "json"
            elif isinstance(n, ast.FunctionDef) and n.name.startswith("parse_dataclass"):
                out["type"] = "json"
            elif isinstance(n, ast.Call) and head_name(n.func) == "literal_to_kwargs":
                out["literal"] = True
            elif isinstance(n, ast.Call) and head_name(n.func) == "collection_to_kwargs":
                out["collection"] = True
        return out

    def kwargs(self, module: Module, ann: ast.AST) -> dict[str, Any]:
        hints = vllm_type_hints(module, ann)
        kinds = {k for k, _ in hints if k in HINT_KINDS | {"None"}}
        dc = any(k == "class" and is_dataclass(d) for k, d in hints)
        nb = any(k in ("class", "other", "Literal") for k, _ in hints)
        for predicate, effect, line in self.branches:
            if not predicate(kinds, dc, nb):
                continue
            out: dict[str, Any] = {}
            if effect.get("type") == "json":
                out["type"] = "json"
            if "action" in effect:
                out["action"] = effect["action"]
            if "nargs" in effect:
                out["nargs"] = effect["nargs"]
            literal = next((d for k, d in hints if k == "Literal"), None)
            if effect.get("literal") and literal is not None:
                key = "metavar" if self.literal_metavar_with_str and "str" in kinds else "choices"
                out[key] = sorted(map(str, literal))
            if effect.get("collection"):
                out.setdefault("nargs", "+")
                elems = next((d for k, d in hints if k in ("tuple", "list", "set")), [])
                inner = next((d for k, d in elems if k == "Literal"), None)
                if inner is not None and self.collection_literal:
                    out["choices"] = sorted(map(str, inner))
            return out
        return {}
