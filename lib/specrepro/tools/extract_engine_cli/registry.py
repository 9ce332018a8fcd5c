"""The flags a parser registers, as the extractors collect them: option strings, whether
each takes a value, its choices and its aliases.

Design: `Registry` keeps one `Action` per `add_argument` the interpreters walk, in the
order the engine registers them, and says which option strings take a value
(`NO_VALUE_ACTIONS`, a custom action class's `nargs=0`, `custom_action_no_value`) and what
an `action=` names (`action_name`). Its `record()` is the generated list's content.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from specrepro.tools.extract_engine_cli.wheel import (
    ExtractError,
    Module,
    class_mro,
    head_name,
    method,
    resolve,
)


@dataclass
class Action:
    """One `add_argument`: its option strings and what this script knows of its action."""

    names: list[str]
    action: str | None = None  # "BooleanOptionalAction", "store_true", a class name, …
    choices: list[str] | object | None = None  # OPEN: choices exist but cannot be listed
    deprecated: str | None = None  # the replacement it names ("" when none)
    where: str = ""
    no_value: bool = False  # takes no argument: store_true, BooleanOptionalAction, nargs=0
    # vLLM 0.33.0's EnableDisableAction (the parser's stand-in for BooleanOptionalAction):
    # `--enable-x` also registers `--disable-x` and the reverse ({"--enable-": "--disable-", …})
    inverse_prefixes: dict[str, str] | None = None

    def __post_init__(self):
        self.no_value = self.no_value or self.negatable or self.action in NO_VALUE_ACTIONS

    @property
    def negatable(self) -> bool:
        """argparse.BooleanOptionalAction (or a subclass named so) adds `--no-X` for `--X`."""
        return bool(self.action) and self.action.endswith("BooleanOptionalAction")

    @property
    def inverses(self) -> list[str]:
        """EnableDisableAction's paired spellings: `--enable-x` → `--disable-x` and back."""
        if not (self.negatable and self.inverse_prefixes):
            return []
        return [inverse + n.removeprefix(prefix) for n in self.names
                for prefix, inverse in self.inverse_prefixes.items() if n.startswith(prefix)]


class Registry:
    def __init__(self):
        self.actions: list[Action] = []

    def add(self, action: Action) -> None:
        self.actions.append(action)

    def flags(self) -> list[str]:
        out = set()
        for a in self.actions:
            out.update(a.names)
            if a.negatable:
                out.update("--no-" + n[2:] for n in a.names if n.startswith("--"))
            out.update(a.inverses)
        return sorted(out)

    def choices(self) -> dict[str, list[str]]:
        out = {}
        for a in self.actions:
            if isinstance(a.choices, list) and a.choices:
                for name in a.names:
                    out[name] = sorted(set(a.choices))
        return dict(sorted(out.items()))

    def aliases(self) -> dict[str, str]:
        """Every other spelling of an option → its first long one (`-tp` → `--tensor-…`)."""
        out = {}
        for a in self.actions:
            longs = [n for n in a.names if n.startswith("--")]
            canonical = longs[0] if longs else a.names[0]
            for name in a.names:
                if name != canonical:
                    out[name] = canonical
        return dict(sorted(out.items()))

    def deprecated(self) -> dict[str, str]:
        return dict(sorted((n, a.deprecated) for a in self.actions if a.deprecated is not None
                           for n in a.names))

    def boolean_flags(self) -> list[str]:
        """Flags that take no value (store_true, BooleanOptionalAction, nargs=0 actions)."""
        return sorted({n for a in self.actions if a.no_value for n in [*a.names, *a.inverses]})


NO_VALUE_ACTIONS = {"store_true", "store_false", "store_const", "append_const", "count"}


def custom_action_no_value(module: Module, node: ast.AST | None) -> bool:
    """A custom argparse.Action class whose `__init__` defaults `nargs` to 0 (SGLang's
    DeprecatedStoreTrueAction and the like) takes no value."""
    if not isinstance(node, (ast.Name, ast.Attribute)):
        return False
    ref = resolve(module, node)
    if ref is None or not ref.is_class:
        return False
    found = method(ref, "__init__")
    if found is None:
        return False
    args = found[1].args
    defaults = dict(zip([a.arg for a in args.args][-len(args.defaults):], args.defaults)) \
        if args.defaults else {}
    defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
    nargs = defaults.get("nargs")
    return isinstance(nargs, ast.Constant) and nargs.value == 0


def action_name(module: Module, node: ast.AST | None) -> str | None:
    """`argparse.BooleanOptionalAction` → its class name; `"store_true"` → itself."""
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = head_name(node)
        if name.endswith("BooleanOptionalAction"):
            return name
        ref = resolve(module, node)
        if ref is not None and ref.is_class:  # a subclass of BooleanOptionalAction counts
            mro = class_mro(ref)
            for i, (cls_module, cls) in enumerate(mro):
                if any(head_name(b) == "BooleanOptionalAction" for b in cls.bases):
                    # ...unless it builds its own option strings, which this script cannot know
                    for _, sub in mro[:i + 1]:
                        init = next((f for f in sub.body if isinstance(f, ast.FunctionDef)
                                     and f.name == "__init__"), None)
                        if init is not None:
                            raise ExtractError(
                                f"{module.wheel.path.name}: {cls_module.path}:{init.lineno}: "
                                f"{sub.name} subclasses BooleanOptionalAction with its own "
                                "__init__; its option strings are not `--X`/`--no-X` for sure "
                                "(re-read it and extend this script)")
                    return "BooleanOptionalAction"
        return name
    return "?"


def keyword(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)
