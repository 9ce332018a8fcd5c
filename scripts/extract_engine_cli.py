"""Generate the lists of command-line flags vLLM and SGLang accept, from their wheels.

    python scripts/extract_engine_cli.py [WHEEL ...] [--wheel-dir .cache/wheels] [--download]
                                         [--out DIR]
    python scripts/extract_engine_cli.py --dump-parser vllm|sglang > parser.json
    python scripts/extract_engine_cli.py --compare-parser parser.json engine_cli/vllm-0.26.0.json

Reads each wheel's source with `ast`; the packages are never imported (they need a CUDA
torch and a GPU). With WHEEL arguments it extracts those wheels (engine and version from the
file name); without, every pinned version (`PINNED`) whose wheel is in `--wheel-dir`
(`--download` fetches the missing ones with `pip download --no-deps`). Writes
`lib/specrepro/harness/engine_cli/<engine>-<version>.json`, which the engine adapters validate
every profile against (`specrepro.harness.flags` reads them). The lists are this script's
output, never typed by hand: regenerate them when an engine version changes.

`--dump-parser` runs where the engine is installed: it builds the engine's own parser and
writes its option strings; `--compare-parser` diffs such a dump with a generated list (the
ground truth for the rules below).

How each engine registers its flags, which this script mirrors:

- vLLM (`vllm serve` = `make_arg_parser`, in `vllm/entrypoints/openai/cli_args.py` (0.26.0)
  or `vllm/entrypoints/common/cli_args.py`): its literal `add_argument` calls, then
  `FrontendArgs.add_cli_args` (every field of `FrontendArgs` and its bases as `--field-name`,
  with `_customize_cli_kwargs`'s overrides) and `AsyncEngineArgs.add_cli_args` →
  `EngineArgs.add_cli_args` (`add_argument("--flag", "-alias", **x_kwargs["field"])` with
  `x_kwargs = get_kwargs(Config)`). `get_kwargs` (`_compute_kwargs` in
  `vllm/engine/arg_utils.py`) turns each dataclass field's type into argparse keywords; this
  script reads its if/elif chain from the wheel (`VllmKwargsRules`) and fails on a test it
  does not know. In 0.26.0: a dataclass member → JSON; exactly `bool | str | None` → an
  optional-valued flag; any other type holding `bool` → `argparse.BooleanOptionalAction`, so
  `--no-flag` exists too (never for a short alias such as `-ep`); a `Literal` → `choices`,
  unless `str` is in the union (then only a metavar); a list/tuple/set of a `Literal` →
  `choices`. An explicit `action=` (`store_true`, `BooleanOptionalAction`, a custom class) or
  a mutation of the kwargs before the call wins. Choices listed for an Optional field get the
  string "None", which argparse then rejects (it compares the converted value, None): left
  out here. `FlexibleArgumentParser.add_argument` must only pop `deprecated`, and a
  `BooleanOptionalAction` subclass must not build its own option strings: otherwise the
  script fails naming the line. `--speculative-config` takes the fields of the
  `SpeculativeConfig` dataclass.
- vLLM 0.33.0 adds: `FlexibleArgumentParser.__init__` registers `EnableDisableAction` for
  `BooleanOptionalAction` (vllm/utils/argparse_utils.py), so `--enable-x` also gets
  `--disable-x` and `--disable-x` gets `--enable-x` (its `_inverse_prefixes`), beside `--no-X`
  (hidden from help, still registered); and `make_arg_parser` edits a field's choices in place
  (`…["choices"].remove(PASSTHROUGH_ALL2ALL_BACKEND)`), which the interpreter follows.
- SGLang 0.5.14 (`sglang/srt/server_args.py`): `ServerArgs.add_cli_args` calls
  `add_cli_args_from_dataclass(parser, ServerArgs)` (`sglang/srt/arg_groups/arg_utils.py`):
  every field annotated `A[T, "help"]` or `A[T, Arg(...)]` is `--field-name` (or
  `Arg(cli_name=...)`) plus `Arg(aliases=...)`, unless `Arg(no_cli=True)`; a `bool` is
  `store_true` (no `--no-`) unless `Arg(action=argparse.BooleanOptionalAction)`; choices are
  `Arg(choices=...)` or the `Literal`'s values (checked against the wheel's
  `add_cli_args_from_dataclass`). Then its own `add_argument` calls (dynamic choices,
  deprecated aliases with the `new_flag` they name).
- SGLang 0.5.23 (`sglang/srt/arg_groups/fields/*.py`): the same field rule over the
  namespace classes (those with `_NS_PATH` named in server_args.py's `_INPUT_NAMESPACES`),
  plus `ServerArgs.add_cli_args`'s own calls (the `class ServerArgs` statement: the module
  rebinds the name to a `msgspec.defstruct`). An explicit `nargs=` beside a custom action
  wins over the action class's default.
  The layout is chosen by what the wheel contains.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The versions whose lists are committed; run without WHEEL arguments, the script
# regenerates each one whose wheel is in --wheel-dir.
PINNED = {"vllm": ["0.26.0", "0.33.0"], "sglang": ["0.5.14", "0.5.23"]}


class ExtractError(Exception):
    """A wheel this script cannot read; the message names the wheel and what was looked for."""


# --------------------------------------------------------------------------- wheels


def wheel_identity(path: Path) -> tuple[str, str]:
    """(engine, version) from a wheel's file name: `vllm-0.26.0-cp38-abi3-….whl`."""
    parts = path.name.split("-")
    if len(parts) < 3 or parts[0] not in PINNED:
        raise ExtractError(f"{path.name}: not a vllm or sglang wheel "
                           "(expected <engine>-<version>-<tags>.whl)")
    return parts[0], parts[1]


def fetch_wheel(engine: str, version: str, wheel_dir: Path, download: bool) -> Path | None:
    """The engine's wheel from the cache; downloaded there first if missing and asked to."""
    pattern = f"{engine}-{version}-*.whl"
    found = sorted(wheel_dir.glob(pattern))
    if not found and download:
        wheel_dir.mkdir(parents=True, exist_ok=True)
        # The SGLang wheel holds cpython-311 extensions; name the target so the
        # download works from any interpreter. pip does not widen a `manylinux_2_X`
        # platform to older glibc tags, so name vLLM's (manylinux_2_28) as well as
        # SGLang's (manylinux_2_34).
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.11", "--platform", "manylinux_2_34_x86_64",
               "--platform", "manylinux_2_28_x86_64",
               "-d", str(wheel_dir), f"{engine}=={version}"]
        subprocess.run(cmd, check=True)
        found = sorted(wheel_dir.glob(pattern))
    return found[0] if found else None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Wheel:
    """Python sources inside a wheel, parsed on demand; remembers which files were read."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.zip = zipfile.ZipFile(path)
        self.files = set(self.zip.namelist())
        self.read: set[str] = set()
        self._trees: dict[str, ast.Module] = {}
        self._modules: dict[str, Module | None] = {}

    def has(self, name: str) -> bool:
        return name in self.files

    def has_dir(self, prefix: str) -> bool:
        return any(n.startswith(prefix) for n in self.files)

    def names(self, prefix: str) -> list[str]:
        return sorted(n for n in self.files if n.startswith(prefix) and n.endswith(".py"))

    def tree(self, name: str) -> ast.Module:
        if name not in self._trees:
            self._trees[name] = ast.parse(self.zip.read(name).decode(), filename=name)
            self.read.add(name)
        return self._trees[name]

    def module(self, dotted: str) -> Module | None:
        """The module `a.b.c` (`a/b/c.py` or `a/b/c/__init__.py`), None if not in the wheel."""
        if dotted not in self._modules:
            base = dotted.replace(".", "/")
            path = next((p for p in (f"{base}.py", f"{base}/__init__.py") if p in self.files), None)
            self._modules[dotted] = Module(self, dotted, path) if path else None
        return self._modules[dotted]

    def require(self, dotted: str, what: str) -> Module:
        module = self.module(dotted)
        if module is None:
            raise ExtractError(f"{self.path.name}: no {dotted} ({what}) in the wheel")
        return module


# --------------------------------------------------------------------------- static resolution


@dataclass(eq=False)
class Module:
    """One module's top-level names: what it defines and what it imports (TYPE_CHECKING
    and try/except blocks included, as the names exist for type annotations)."""

    wheel: Wheel
    dotted: str
    path: str
    defs: dict[str, ast.AST] = field(default_factory=dict)
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    stars: list[str] = field(default_factory=list)  # `from x import *`: the modules x

    def __post_init__(self):
        self.tree = self.wheel.tree(self.path)
        is_package = self.path.endswith("__init__.py")
        package = self.dotted if is_package else self.dotted.rpartition(".")[0]
        self._scan(self.tree.body, package)

    def _scan(self, body: list[ast.stmt], package: str) -> None:
        for node in body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                self.defs[node.name] = node
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        lazy = lazy_module(node.value)
                        if lazy:
                            self.imports[target.id] = (lazy, None)
                        else:
                            self.defs[target.id] = node.value
            elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                  and node.value):
                self.defs[node.target.id] = node.value
            elif type(node).__name__ == "TypeAlias":  # `type X = ...` (Python 3.12)
                self.defs[node.name.id] = node.value
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.imports[alias.asname] = (alias.name, None)
                    else:
                        top = alias.name.split(".")[0]
                        self.imports.setdefault(top, (top, None))
            elif isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1])
                    source = f"{base}.{source}" if source else base
                for alias in node.names:
                    if alias.name == "*":
                        self.stars.append(source)
                    else:
                        self.imports[alias.asname or alias.name] = (source, alias.name)
            elif isinstance(node, ast.If):
                self._scan(node.body, package)
                self._scan(node.orelse, package)
            elif isinstance(node, ast.Try):
                self._scan(node.body, package)
                for handler in node.handlers:
                    self._scan(handler.body, package)
                self._scan(node.orelse, package)


def lazy_module(value: ast.AST) -> str | None:
    """`x = LazyLoader("name", globals(), "a.b.c")` binds module a.b.c."""
    if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and value.func.id == "LazyLoader" and len(value.args) == 3
            and isinstance(value.args[2], ast.Constant)):
        return value.args[2].value
    return None


@dataclass(frozen=True)
class Ref:
    """What a name stands for: a module, a class or function definition, or a value."""

    module: Module
    node: ast.AST | None = None  # None: the module itself

    @property
    def is_class(self) -> bool:
        return isinstance(self.node, ast.ClassDef)


def lookup(module: Module, name: str, depth: int = 0) -> Ref | None:
    """A module-level name, followed through imports into other modules of the wheel."""
    if depth > 30:
        return None
    if name in module.defs:
        return Ref(module, module.defs[name])
    if name not in module.imports:
        for source in module.stars:  # `from .types import *` (vllm/renderers/chat_utils)
            origin = module.wheel.module(source)
            if origin is not None and origin is not module and star_exports(origin, name):
                found = lookup(origin, name, depth + 1)
                if found is not None:
                    return found
        return None
    source, attr = module.imports[name]
    if attr is None:
        target = module.wheel.module(source)
        return Ref(target) if target else None
    origin = module.wheel.module(source)
    if origin is not None and origin is not module:
        found = lookup(origin, attr, depth + 1)
        if found is not None:
            return found
    sub = module.wheel.module(f"{source}.{attr}")
    return Ref(sub) if sub else None


def star_exports(module: Module, name: str) -> bool:
    """Whether `from module import *` binds name: listed in a literal `__all__`, else public."""
    listed = module.defs.get("__all__")
    if isinstance(listed, (ast.List, ast.Tuple)):
        return any(isinstance(e, ast.Constant) and e.value == name for e in listed.elts)
    return not name.startswith("_")


def resolve(module: Module, node: ast.AST, depth: int = 0) -> Ref | None:
    """A Name or dotted Attribute (`me_quant.QuantizationMethods`, `Backend.ALL`)."""
    if isinstance(node, ast.Name):
        return lookup(module, node.id, depth)
    if isinstance(node, ast.Attribute):
        base = resolve(module, node.value, depth + 1)
        if base is None:
            return None
        if base.node is None:  # a module: its name or submodule
            found = lookup(base.module, node.attr, depth + 1)
            if found is None:
                sub = module.wheel.module(f"{base.module.dotted}.{node.attr}")
                found = Ref(sub) if sub else None
            return found
        if base.is_class:
            for cls_module, cls in class_mro(base):
                for stmt in cls.body:
                    if isinstance(stmt, ast.Assign) and any(
                            isinstance(t, ast.Name) and t.id == node.attr for t in stmt.targets):
                        return Ref(cls_module, stmt.value)
                    if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                            and stmt.target.id == node.attr and stmt.value is not None):
                        return Ref(cls_module, stmt.value)
                    if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)) and stmt.name == node.attr:
                        return Ref(cls_module, stmt)
    return None


def class_mro(ref: Ref, depth: int = 0) -> list[tuple[Module, ast.ClassDef]]:
    """A class and its bases (depth first, as far as the wheel defines them)."""
    out = [(ref.module, ref.node)]
    if depth > 20:
        return out
    for base in ref.node.bases:
        found = resolve(ref.module, base)
        if found is not None and found.is_class:
            out += [c for c in class_mro(found, depth + 1) if c not in out]
    return out


def method(ref: Ref, name: str,
           after: ast.ClassDef | None = None) -> tuple[Module, ast.FunctionDef] | None:
    """A method along the class's MRO; `after` skips up to that class (for super())."""
    mro = class_mro(ref)
    if after is not None:
        index = next((i for i, (_, c) in enumerate(mro) if c is after), -1)
        mro = mro[index + 1:]
    for module, cls in mro:
        for stmt in cls.body:
            if isinstance(stmt, ast.FunctionDef) and stmt.name == name:
                return module, stmt
    return None


def decorator_names(node: ast.ClassDef) -> set[str]:
    names = set()
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(target, ast.Attribute):
            names.add(target.attr)
        elif isinstance(target, ast.Name):
            names.add(target.id)
    return names


def is_dataclass(ref: Ref) -> bool:
    """Decorated `@dataclass` / vLLM's `@config` (a pydantic dataclass), or derived from one."""
    return any(decorator_names(cls) & {"dataclass", "config", "pydantic_dataclass"}
               for _, cls in class_mro(ref))


def dataclass_fields(ref: Ref) -> dict[str, tuple[Module, ast.AnnAssign]]:
    """`dataclasses.fields(cls)`: annotated class attributes, bases first, no ClassVar/InitVar."""
    merged: dict[str, tuple[Module, ast.AnnAssign]] = {}
    for module, cls in reversed(class_mro(ref)):
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                ann = stmt.annotation
                if head_name(ann.value if isinstance(ann, ast.Subscript) else ann) in (
                        "ClassVar", "InitVar"):
                    merged.pop(stmt.target.id, None)
                    continue
                merged[stmt.target.id] = (module, stmt)
    return merged


def enum_members(ref: Ref) -> list[tuple[str, ast.AST]]:
    """An Enum class's members: (name, value node), methods and private names left out."""
    out = []
    for stmt in ref.node.body:
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)):
            name = stmt.targets[0].id
            if not name.startswith("_"):
                out.append((name, stmt.value))
    return out


def annotation(node: ast.AST) -> ast.AST:
    """A string annotation (forward reference) as an expression."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return node
    return node


def subscript_args(node: ast.Subscript) -> list[ast.AST]:
    return list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]


def head_name(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


# --------------------------------------------------------------------------- values


OPEN = object()  # choices the script cannot know statically (computed, extended at run time)


def literal_values(module: Module, node: ast.AST, depth: int = 0,
                   in_literal: bool = False) -> list | None:
    """The values a `Literal[...]` type (through aliases, unions, Optional, nesting) admits.

    None when the type is not purely a set of literals (e.g. `... | str`); None itself
    adds nothing. A string is a value inside `Literal[...]`, a forward reference outside."""
    if isinstance(node, ast.Constant) and (in_literal or not isinstance(node.value, str)):
        return [] if node.value is None else [node.value]
    node = annotation(node)
    if depth > 30 or isinstance(node, ast.Constant):
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left = literal_values(module, node.left, depth + 1)
        right = literal_values(module, node.right, depth + 1)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.Subscript):
        name = head_name(node.value)
        if name in ("Literal", "Optional", "Union"):
            values = [literal_values(module, arg, depth + 1, in_literal=name == "Literal")
                      for arg in subscript_args(node)]
            return None if any(v is None for v in values) else [s for v in values for s in v]
        if name == "Annotated":
            return literal_values(module, subscript_args(node)[0], depth + 1)
        return None
    if isinstance(node, (ast.Name, ast.Attribute)):
        if head_name(node) == "None":
            return []
        ref = resolve(module, node)
        if ref is None or ref.node is None or ref.is_class or isinstance(ref.node, ast.FunctionDef):
            return None
        return literal_values(ref.module, ref.node, depth + 1)
    return None


def strings_of(module: Module, node: ast.AST, local: dict[str, Any] | None = None,
               depth: int = 0) -> list[str] | object:
    """A choices expression as strings: literals, module constants (followed through imports),
    class attributes (`Backend.ALL`), `+`, `|`, `list(d.keys())`, `sorted(...)`, and
    comprehensions over an Enum (`[m.name.lower() for m in E]`). OPEN when unknown."""
    local = local or {}
    if depth > 30:
        return OPEN
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or node.value is None:
            return OPEN
        return [str(node.value)]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        out = []
        for elt in node.elts:
            inner = strings_of(module, elt.value if isinstance(elt, ast.Starred) else elt,
                               local, depth + 1)
            if inner is OPEN:
                return OPEN
            out += inner
        return out
    if isinstance(node, ast.Dict):  # iterating a dict gives its keys
        return strings_of(module, ast.List(elts=[k for k in node.keys if k is not None]),
                          local, depth + 1) if None not in node.keys else OPEN
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.BitOr)):
        left = strings_of(module, node.left, local, depth + 1)
        right = strings_of(module, node.right, local, depth + 1)
        return OPEN if left is OPEN or right is OPEN else left + right
    if isinstance(node, ast.Call):
        func = node.func
        if (isinstance(func, ast.Name) and len(node.args) == 1
                and func.id in ("list", "sorted", "set", "tuple", "frozenset")):
            return strings_of(module, node.args[0], local, depth + 1)
        if isinstance(func, ast.Attribute) and func.attr == "keys" and not node.args:
            return strings_of(module, func.value, local, depth + 1)
        if isinstance(func, ast.Name) and func.id == "get_args" and len(node.args) == 1:
            values = literal_values(module, node.args[0])
            return OPEN if values is None else [str(v) for v in values]
        return OPEN
    if isinstance(node, ast.ListComp) and len(node.generators) == 1:
        gen = node.generators[0]
        ref = resolve(module, gen.iter)
        if ref is None or not ref.is_class or not isinstance(gen.target, ast.Name) or gen.ifs:
            return OPEN
        out = []
        for name, value in enum_members(ref):
            item = member_expr(ref.module, node.elt, gen.target.id, name, value)
            if item is OPEN:
                return OPEN
            out.append(item)
        return out
    if isinstance(node, ast.Name) and node.id in local:
        bound = local[node.id]
        if isinstance(bound, ast.AST):
            return strings_of(module, bound, local, depth + 1)
        return bound if isinstance(bound, list) else OPEN
    if isinstance(node, (ast.Name, ast.Attribute)):
        ref = resolve(module, node)
        if ref is None or ref.node is None or isinstance(ref.node, ast.FunctionDef):
            return OPEN
        if ref.is_class:  # iterating an Enum gives its members; as choices, their values
            return OPEN
        scope = {}
        if isinstance(node, ast.Attribute):  # `Backend.ALL = (FULL, …)`: names of the class body
            owner = resolve(module, node.value)
            if owner is not None and owner.is_class:
                scope = {t.id: stmt.value for stmt in owner.node.body
                         if isinstance(stmt, ast.Assign)
                         for t in stmt.targets if isinstance(t, ast.Name)}
        values = strings_of(ref.module, ref.node, scope, depth + 1)
        if values is OPEN and isinstance(ref.node, ast.Subscript):  # a Literal alias
            literal = literal_values(ref.module, ref.node)
            return OPEN if literal is None else [str(v) for v in literal]
        return values
    return OPEN


def member_expr(module: Module, node: ast.AST, var: str, name: str, value: ast.AST):
    """`m.name`, `m.value`, `m.name.lower()` for one Enum member."""
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == var):
        if node.attr == "name":
            return name
        if node.attr == "value":
            values = strings_of(module, value)
            return values[0] if values is not OPEN and len(values) == 1 else OPEN
        return OPEN
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("lower", "upper") and not node.args):
        inner = member_expr(module, node.func.value, var, name, value)
        return OPEN if inner is OPEN else getattr(inner, node.func.attr)()
    return OPEN


# --------------------------------------------------------------------------- registry


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


# --------------------------------------------------------------------------- vLLM


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


class VllmInterpreter:
    """Walks vLLM's registering functions as the parser would run them."""

    def __init__(self, wheel: Wheel, registry: Registry, rules: VllmKwargsRules | None = None):
        self.wheel, self.registry, self.rules = wheel, registry, rules

    def get_kwargs(self, ref: Ref) -> KwargsMap:
        if self.rules is None:
            raise ExtractError(f"{self.wheel.path.name}: get_kwargs({ref.node.name}) called, "
                               "but no _compute_kwargs was read")
        fields = {}
        for name, (module, stmt) in dataclass_fields(ref).items():
            fields[name] = FieldKwargs(self.rules.kwargs(module, stmt.annotation), name)
        return KwargsMap(fields)

    def run(self, module: Module, func: ast.FunctionDef, cls: Ref | None,
            args: dict[str, Any]) -> Any:
        env: dict[str, Any] = dict(args)
        return self.block(module, func.body, cls, env, func)

    def block(self, module, body, cls, env, func) -> Any:
        result = None
        for stmt in body:
            result = self.stmt(module, stmt, cls, env, func)
        return result

    def stmt(self, module, stmt, cls, env, func):
        if isinstance(stmt, ast.Assign):
            value = self.expr(module, stmt.value, cls, env, func)
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    if value is None and isinstance(env.get(target.id), (KwargsMap, FieldKwargs)):
                        continue  # `k = cls._customize_cli_kwargs(k)`: mutated in place
                    env[target.id] = value if value is not None else stmt.value
                elif isinstance(target, ast.Subscript):
                    self.mutate(module, target, stmt.value, cls, env, func, augment=False)
        elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Subscript):
            self.mutate(module, stmt.target, stmt.value, cls, env, func, augment=True)
        elif isinstance(stmt, ast.Delete):
            for target in stmt.targets:
                if isinstance(target, ast.Subscript):
                    holder = self.expr(module, target.value, cls, env, func)
                    key = target.slice.value if isinstance(target.slice, ast.Constant) else None
                    if isinstance(holder, FieldKwargs):
                        holder.values.pop(key, None)
        elif isinstance(stmt, (ast.Expr, ast.Return)) and stmt.value is not None:
            return self.expr(module, stmt.value, cls, env, func)
        elif isinstance(stmt, ast.If):
            # Both branches: a flag registered on any path exists (vLLM registers --model
            # unless the command line is `serve --help`).
            self.block(module, stmt.body, cls, env, func)
            self.block(module, stmt.orelse, cls, env, func)
        elif isinstance(stmt, (ast.With, ast.Try)):
            self.block(module, stmt.body, cls, env, func)
            for handler in getattr(stmt, "handlers", []):
                self.block(module, handler.body, cls, env, func)
        elif isinstance(stmt, ast.For):
            iterable = stmt.iter
            holder = None
            if (isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Attribute)
                    and iterable.func.attr == "items"):
                holder = self.expr(module, iterable.func.value, cls, env, func)
            if isinstance(holder, KwargsMap) and isinstance(stmt.target, ast.Tuple) \
                    and len(stmt.target.elts) == 2:
                key_var, value_var = (getattr(e, "id", None) for e in stmt.target.elts)
                for name, kwargs in holder.fields.items():
                    bound = {**env, key_var: name, value_var: kwargs}
                    self.block(module, stmt.body, cls, bound, func)
            else:
                self.block(module, stmt.body, cls, env, func)
        return None

    def mutate(self, module, target: ast.Subscript, value: ast.AST, cls, env, func, augment: bool):
        """`x_kwargs["field"]["action"] = …`, `…["choices"] += …`, `…["flags"] = [...]`."""
        holder = self.expr(module, target.value, cls, env, func)
        key = target.slice.value if isinstance(target.slice, ast.Constant) else None
        if not isinstance(holder, FieldKwargs) or key is None:
            return
        if key == "action":
            holder.values["action"] = action_name(module, value)
        elif key in ("choices", "flags"):
            found = strings_of(module, value, self.locals(env))
            if augment:
                before = holder.values.get(key)
                found = OPEN if found is OPEN or not isinstance(before, list) else before + found
            holder.values[key] = found
        else:
            holder.values[key] = "set"

    def mutate_list(self, module, target: ast.Subscript, verb: str, arg: ast.AST, cls, env,
                    func) -> None:
        """`x_kwargs["f"]["choices"].append(v)` / `.extend(vs)` / `.remove(v)`, in place."""
        holder = self.expr(module, target.value, cls, env, func)
        key = target.slice.value if isinstance(target.slice, ast.Constant) else None
        if not isinstance(holder, FieldKwargs) or key not in ("choices", "flags"):
            return
        before = holder.values.get(key)
        found = strings_of(module, arg if verb == "extend" else ast.List(elts=[arg]),
                           self.locals(env))
        if not isinstance(before, list) or found is OPEN:
            holder.values[key] = OPEN
        elif verb == "remove":
            if found[0] not in before:
                raise ExtractError(f"{module.wheel.path.name}: {module.path}:{target.lineno}: "
                                   f"removes {found[0]!r} from {holder.field}'s {key}, which "
                                   f"do not hold it here ({before}); re-read the rule")
            before.remove(found[0])
        else:
            before += found

    @staticmethod
    def locals(env: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in env.items() if isinstance(v, (ast.AST, list))}

    def class_ref(self, module, node, cls, env) -> Ref | None:
        if isinstance(node, ast.Name) and node.id == "cls" and cls is not None:
            return cls
        if isinstance(node, ast.Name) and isinstance(env.get(node.id), Ref):
            return env[node.id]
        ref = resolve(module, node)
        return ref if ref is not None and ref.is_class else None

    def expr(self, module, node, cls, env, func) -> Any:
        if isinstance(node, ast.Name):
            return env.get(node.id)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Subscript):
            holder = self.expr(module, node.value, cls, env, func)
            key = node.slice.value if isinstance(node.slice, ast.Constant) else None
            if isinstance(holder, KwargsMap):
                return holder.fields.get(key)
            if isinstance(holder, FieldKwargs):
                got = holder.values.get(key)
                return got if isinstance(got, list) else None
            return None
        if isinstance(node, ast.JoinedStr):
            parts = []
            for value in node.values:
                if isinstance(value, ast.Constant):
                    parts.append(str(value.value))
                else:
                    inner = self.expr(module, value.value, cls, env, func)
                    if not isinstance(inner, str):
                        return None
                    parts.append(inner)
            return "".join(parts)
        if not isinstance(node, ast.Call):
            return None
        f = node.func
        if isinstance(f, ast.Name) and f.id == "get_kwargs" and node.args:
            ref = self.class_ref(module, node.args[0], cls, env)
            return self.get_kwargs(ref) if ref is not None else None
        if isinstance(f, ast.Attribute):
            if f.attr == "replace" and len(node.args) == 2:  # key.replace("_", "-")
                base = self.expr(module, f.value, cls, env, func)
                old, new = (self.expr(module, a, cls, env, func) for a in node.args)
                if isinstance(base, str) and isinstance(old, str) and isinstance(new, str):
                    return base.replace(old, new)
                return None
            if f.attr == "pop" and node.args:  # value.pop("flags", [])
                holder = self.expr(module, f.value, cls, env, func)
                key = node.args[0].value if isinstance(node.args[0], ast.Constant) else None
                if isinstance(holder, FieldKwargs):
                    got = holder.values.pop(key, None)
                    return got if isinstance(got, list) else []
                return None
            if f.attr == "add_argument":
                self.add_argument(module, node, cls, env, func)
                return None
            if (f.attr in ("append", "extend", "remove") and len(node.args) == 1
                    and isinstance(f.value, ast.Subscript)):
                # `parallel_kwargs["all2all_backend"]["choices"].remove(PASSTHROUGH_…)`
                self.mutate_list(module, f.value, f.attr, node.args[0], cls, env, func)
                return None
            target = self.method_call(module, f, cls, env, func)
            if target is not None:
                (m_module, m_func), owner = target
                params = [a.arg for a in m_func.args.args]
                is_static = any(head_name(d) == "staticmethod" for d in m_func.decorator_list)
                params = params if is_static else params[1:]
                call_args = {p: self.expr(module, a, cls, env, func)
                             for p, a in zip(params, node.args)}
                return self.run(m_module, m_func, owner, call_args)
        return None

    def method_call(self, module, f: ast.Attribute, cls, env, func):
        """`X.add_cli_args(parser)`, `cls._customize_cli_kwargs(k)`, `super()._customize…(k)`."""
        if f.attr not in ("add_cli_args", "_customize_cli_kwargs"):
            return None
        base = f.value
        if isinstance(base, ast.Call) and head_name(base.func) == "super":
            if cls is None:
                return None
            defining = self.defining_class(cls, func)
            found = method(cls, f.attr, after=defining)
            return (found, cls) if found else None
        ref = self.class_ref(module, base, cls, env)
        if ref is None:
            return None
        found = method(ref, f.attr)
        return (found, ref) if found else None

    @staticmethod
    def defining_class(owner: Ref, func: ast.FunctionDef) -> ast.ClassDef | None:
        for _, c in class_mro(owner):
            if func in c.body:
                return c
        return None

    def add_argument(self, module, call: ast.Call, cls, env, func):
        names: list[str] = []
        for arg in call.args:
            if isinstance(arg, ast.Starred):
                value = self.expr(module, arg.value, cls, env, func)
                names += [v for v in value if isinstance(v, str)] if isinstance(value, list) else []
            else:
                value = self.expr(module, arg, cls, env, func)
                if isinstance(value, str):
                    names.append(value)
        names = [n for n in names if n.startswith("-")]
        if not names:
            return  # a positional such as model_tag
        merged: dict[str, Any] = {}
        for kw in call.keywords:
            if kw.arg is not None:
                continue
            for source in self.unpacked(module, kw.value, cls, env, func):
                merged.update(source)
        no_value = False
        for kw in call.keywords:
            if kw.arg == "action":
                merged["action"] = action_name(module, kw.value)
                no_value = custom_action_no_value(module, kw.value)
            elif kw.arg == "choices":
                merged["choices"] = strings_of(module, kw.value, self.locals(env))
            elif kw.arg == "deprecated":
                merged["deprecated"] = kw.value
        nargs = keyword(call, "nargs")
        if nargs is not None and keyword(call, "action") is not None:
            # an explicit nargs wins over the action class's default (SGLang 0.5.23's
            # `--monokernel-backend`: DeprecatedStoreConstAction with nargs=None takes a value)
            no_value = isinstance(nargs, ast.Constant) and nargs.value == 0
        deprecated = merged.get("deprecated")
        self.registry.add(Action(
            names=names, action=merged.get("action"), choices=merged.get("choices"),
            deprecated="" if isinstance(deprecated, ast.Constant) and deprecated.value else None,
            where=f"{module.path}:{call.lineno}", no_value=no_value))

    def unpacked(self, module, node, cls, env, func) -> list[dict[str, Any]]:
        """`**x_kwargs["f"]`, `**name`, `**{**x_kwargs["f"], "default": None}` as dicts."""
        if isinstance(node, ast.Dict):
            out = []
            for key, value in zip(node.keys, node.values):
                if key is None:
                    out += self.unpacked(module, value, cls, env, func)
                elif isinstance(key, ast.Constant) and key.value == "action":
                    out.append({"action": action_name(module, value)})
                elif isinstance(key, ast.Constant) and key.value == "choices":
                    out.append({"choices": strings_of(module, value, self.locals(env))})
            return out
        value = self.expr(module, node, cls, env, func)
        return [dict(value.values)] if isinstance(value, FieldKwargs) else []


def check_flexible_parser(ref: Ref) -> None:
    """FlexibleArgumentParser (and its argument group) may override `add_argument` only to
    pop `deprecated` (vllm/utils/argparse_utils.py in 0.26.0); an override that rewrites
    option strings or actions would make these lists wrong, so it fails here."""
    for cls in (n for n in ast.walk(ref.node) if isinstance(n, ast.ClassDef)):
        for func in (n for n in cls.body
                     if isinstance(n, ast.FunctionDef) and n.name == "add_argument"):
            vararg = func.args.vararg.arg if func.args.vararg else None
            kwarg = func.args.kwarg.arg if func.args.kwarg else None
            for n in ast.walk(func):
                bad = None
                if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    for t in targets:
                        base = t.value if isinstance(t, ast.Subscript) else t
                        if isinstance(base, ast.Name) and base.id in (vararg, kwarg):
                            bad = f"assigns {ast.unparse(t)}"
                elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                        and head_name(n.func.value) in (vararg, kwarg)):
                    first = n.args[0] if n.args else None
                    key = first.value if isinstance(first, ast.Constant) else None
                    if not (n.func.attr in ("pop", "get") and key == "deprecated"):
                        bad = f"calls {ast.unparse(n)}"
                elif isinstance(n, ast.Call) and head_name(n.func) == "add_argument":
                    plain = ([type(a) for a in n.args] == [ast.Starred]
                             and [k.arg for k in n.keywords] == [None])
                    if not plain:
                        bad = f"passes changed arguments on: {ast.unparse(n)}"
                if bad:
                    raise ExtractError(
                        f"{ref.module.wheel.path.name}: {ref.module.path}:{n.lineno}: "
                        f"{cls.name}.add_argument {bad}; the flag lists assume it only pops "
                        "`deprecated` (re-read it and extend this script)")


def check_no_conflicts(wheel: Wheel, registry: Registry) -> None:
    """argparse refuses an option string registered twice (conflict_handler "error"): two
    actions sharing one means this reading is wrong, not the engine."""
    owner: dict[str, Action] = {}
    for a in registry.actions:
        spellings = [*a.names, *a.inverses]
        if a.negatable:
            spellings += ["--no-" + n[2:] for n in a.names if n.startswith("--")]
        for s in spellings:
            if s in owner and owner[s] is not a:
                raise ExtractError(f"{wheel.path.name}: {s} registered by {owner[s].where} and "
                                   f"{a.where}; argparse would refuse that")
            owner[s] = a


def parser_action_registry(ref: Ref) -> dict[str, dict[str, str]]:
    """What FlexibleArgumentParser registers in place of an action: vLLM 0.33.0's `__init__`
    calls `self.register("action", BooleanOptionalAction, EnableDisableAction)`, so every
    `action=argparse.BooleanOptionalAction` builds an EnableDisableAction
    (vllm/utils/argparse_utils.py): `--X` and `--no-X` as before, plus `--disable-x` for
    `--enable-x` and `--enable-x` for `--disable-x` (its `_inverse_prefixes`). Help hides
    `--no-enable-x`/`--no-disable-x` afterwards (`_register_action`), but they stay registered
    and parse. Returns {"BooleanOptionalAction": inverse prefixes}; any other registration,
    or a substitute this reading does not recognise, fails naming its line."""
    out: dict[str, dict[str, str]] = {}
    where = ref.module.wheel.path.name
    for n in ast.walk(ref.node):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and n.func.attr == "register" and n.args):
            continue
        group = n.args[0]
        if not (isinstance(group, ast.Constant) and group.value == "action"):
            continue
        line = f"{where}: {ref.module.path}:{n.lineno}"
        if len(n.args) != 3 or head_name(n.args[1]) != "BooleanOptionalAction":
            raise ExtractError(f"{line}: {ast.unparse(n)} registers an action this script "
                               "does not know (re-read it and extend parser_action_registry)")
        out["BooleanOptionalAction"] = enable_disable_prefixes(ref.module, n.args[2], line)
    for n in ast.walk(ref.module.tree):  # the hidden spellings must stay registered
        if (isinstance(n, ast.Delete) and "_option_string_actions" in ast.unparse(n)) or (
                isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and n.func.attr in ("pop", "remove", "clear")
                and head_name(n.func.value) == "_option_string_actions"):
            raise ExtractError(f"{where}: {ref.module.path}:{n.lineno}: removes option strings "
                               "from the parser; the flag lists assume none is removed")
    return out


def enable_disable_prefixes(module: Module, node: ast.AST, line: str) -> dict[str, str]:
    """EnableDisableAction's `_inverse_prefixes`, after checking its `__init__` is the rule
    read above: BooleanOptionalAction's own `__init__`, then
    `self.option_strings = [*self.option_strings, *inverses]` with each inverse
    `inverse + opt.removeprefix(prefix)` over `self._inverse_prefixes.items()`."""
    ref = resolve(module, node)
    if ref is None or not ref.is_class or not any(
            head_name(b) == "BooleanOptionalAction" for b in ref.node.bases):
        raise ExtractError(f"{line}: {ast.unparse(node)} is not a BooleanOptionalAction "
                           "subclass in the wheel")
    prefixes = None
    for stmt in ref.node.body:
        if (isinstance(stmt, (ast.Assign, ast.AnnAssign)) and "_inverse_prefixes" in
                [getattr(t, "id", "") for t in (stmt.targets if isinstance(stmt, ast.Assign)
                                                else [stmt.target])]
                and isinstance(stmt.value, ast.Dict)
                and all(isinstance(x, ast.Constant) and isinstance(x.value, str)
                        for x in [*stmt.value.keys, *stmt.value.values])):
            prefixes = {k.value: v.value for k, v in zip(stmt.value.keys, stmt.value.values)}
    init = next((f for f in ref.node.body if isinstance(f, ast.FunctionDef)
                 and f.name == "__init__"), None)
    text = ast.unparse(init) if init is not None else ""
    calls_super = init is not None and any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "__init__"
        and isinstance(n.func.value, ast.Call) and head_name(n.func.value.func) == "super"
        for n in ast.walk(init))
    sets = [n for n in ast.walk(init) if isinstance(n, ast.Assign)
            and any(ast.unparse(t) == "self.option_strings" for t in n.targets)] if init else []
    extends = (len(sets) == 1 and isinstance(sets[0].value, ast.List)
               and len(sets[0].value.elts) == 2
               and all(isinstance(e, ast.Starred) for e in sets[0].value.elts)
               and ast.unparse(sets[0].value.elts[0].value) == "self.option_strings")
    if (prefixes is None or not calls_super or not extends
            or "self._inverse_prefixes.items()" not in text or ".removeprefix(" not in text):
        raise ExtractError(f"{line}: {ref.node.name} ({ref.module.path}:{ref.node.lineno}) is not "
                           "the rule this script mirrors (BooleanOptionalAction's strings plus "
                           "`_inverse_prefixes` inverses); re-read it and extend "
                           "enable_disable_prefixes")
    return prefixes


VLLM_CLI_MODULES = ("vllm.entrypoints.openai.cli_args", "vllm.entrypoints.common.cli_args",
                    "vllm.entrypoints.cli_args")


def find_class(wheel: Wheel, name: str, modules: list[str], prefix: str) -> Ref:
    """A class or alias by name: from the listed modules first, else any module under prefix."""
    for dotted in modules:
        module = wheel.module(dotted)
        if module is not None:
            ref = lookup(module, name)
            if ref is not None and ref.node is not None:
                return ref
    for path in wheel.names(prefix):
        dotted = path[:-3].replace("/", ".").removesuffix(".__init__")
        module = wheel.module(dotted)
        if module is not None and name in module.defs:
            return Ref(module, module.defs[name])
    raise ExtractError(f"{wheel.path.name}: no {name} in {', '.join(modules)} or {prefix}*.py")


def extract_vllm(wheel: Wheel) -> dict:
    cli = next((m for m in (wheel.module(d) for d in VLLM_CLI_MODULES)
                if m is not None and "make_arg_parser" in m.defs), None)
    if cli is None:
        paths = ", ".join(d.replace(".", "/") + ".py" for d in VLLM_CLI_MODULES)
        raise ExtractError(f"{wheel.path.name}: no make_arg_parser (the `vllm serve` parser) "
                           f"in any of {paths}")
    rules = VllmKwargsRules(wheel.require("vllm.engine.arg_utils", "EngineArgs and get_kwargs"))
    parser_cls = lookup(cli, "FlexibleArgumentParser")
    substitutes: dict[str, dict[str, str]] = {}
    if parser_cls is not None and parser_cls.is_class:
        check_flexible_parser(parser_cls)
        substitutes = parser_action_registry(parser_cls)
    registry = Registry()
    VllmInterpreter(wheel, registry, rules).run(cli, cli.defs["make_arg_parser"], None, {})
    for action in registry.actions:
        if action.action == "BooleanOptionalAction" and substitutes.get(action.action):
            action.inverse_prefixes = substitutes[action.action]
    check_no_conflicts(wheel, registry)
    if not registry.actions:
        raise ExtractError(f"{wheel.path.name}: make_arg_parser in {cli.path} registered no flags")

    config = ["vllm.config"]
    spec = find_class(wheel, "SpeculativeConfig", config + ["vllm.config.speculative"],
                      "vllm/config/")
    spec_fields = dataclass_fields(spec)
    spec_choices = {}
    for key, (module, stmt) in spec_fields.items():
        values = literal_values(module, stmt.annotation)
        if values:
            spec_choices[key] = sorted(set(map(str, values)))
    compilation = find_class(wheel, "CompilationConfig", config + ["vllm.config.compilation"],
                             "vllm/config/")
    cudagraph = find_class(wheel, "CUDAGraphMode", config + ["vllm.config.compilation"],
                           "vllm/config/")
    quant = find_class(wheel, "QuantizationMethods", ["vllm.model_executor.layers.quantization"],
                       "vllm/model_executor/layers/quantization/")
    cache_dtype = find_class(wheel, "CacheDType", config + ["vllm.config.cache"], "vllm/config/")
    # --attention-backend is typed by an Enum (a str flag): AttentionConfig's validator
    # takes a member's name in any case, or "auto" (vllm/config/attention.py).
    attention = find_class(wheel, "AttentionConfig", config + ["vllm.config.attention"],
                           "vllm/config/")
    backend_enum = None
    if "backend" in dataclass_fields(attention):
        module, stmt = dataclass_fields(attention)["backend"]
        backend_enum = next((d for k, d in vllm_type_hints(module, stmt.annotation)
                             if k == "class"), None)
    return {
        "flags": registry.flags(),
        "flag_choices": registry.choices(),
        "flag_aliases": registry.aliases(),
        "boolean_flags": registry.boolean_flags(),
        "deprecated_flags": registry.deprecated(),
        "speculative_config_keys": sorted(spec_fields),
        "speculative_methods": spec_choices.pop("method"),
        "speculative_config_choices": spec_choices,
        # `| str` types take any string, so these are not enforced as choices;
        # listed for profiles' documentation and for checks that want them.
        "quantization_methods": literal_values(quant.module, quant.node),
        "kv_cache_dtypes": literal_values(cache_dtype.module, cache_dtype.node),
        "compilation_config_keys": sorted(dataclass_fields(compilation)),
        "cudagraph_modes": sorted(name for name, _ in enum_members(cudagraph)),
        "attention_backends": sorted(name for name, _ in enum_members(backend_enum))
        if backend_enum is not None else None,
        "layout": f"make_arg_parser in {cli.path}",
    }


# --------------------------------------------------------------------------- SGLang


SGLANG_FIELDS_DIR = "sglang/srt/arg_groups/fields/"
SGLANG_SERVER_ARGS = "sglang/srt/server_args.py"


def sglang_meta(module: Module, ann: ast.AST) -> ast.AST | None:
    """`_unwrap_annotated`: the first `Arg(...)` or help string of `A[T, ...]`; None: no CLI."""
    ann = annotation(ann)
    if not (isinstance(ann, ast.Subscript) and head_name(ann.value) in ("A", "Annotated")):
        return None
    for meta in subscript_args(ann)[1:]:
        if isinstance(meta, ast.Call) and head_name(meta.func) == "Arg":
            return meta
        if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
            return meta
        if isinstance(meta, (ast.JoinedStr, ast.BinOp)):
            return ast.Constant(value="")  # help text built from parts
        if isinstance(meta, ast.Name):
            ref = resolve(module, meta)
            if ref is not None and isinstance(ref.node, (ast.Constant, ast.JoinedStr, ast.BinOp)):
                return ast.Constant(value="")
    return None


def unwrap_optional(module: Module, node: ast.AST) -> ast.AST:
    """`_unwrap_optional`: Optional[X] / X | None / Union[X, None] → X (one non-None member)."""
    node = annotation(node)
    members = None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        members = [node.left, node.right]
    elif isinstance(node, ast.Subscript) and head_name(node.value) == "Optional":
        return subscript_args(node)[0]
    elif isinstance(node, ast.Subscript) and head_name(node.value) == "Union":
        members = subscript_args(node)
    if members is not None:
        rest = [m for m in members if not (isinstance(m, ast.Constant) and m.value is None)
                and head_name(m) != "None"]
        if len(rest) == 1:
            return rest[0]
    return node


def is_literal_type(module: Module, node: ast.AST, depth: int = 0) -> bool:
    """`Literal[...]`, or a name bound to one (`_unwrap_literal` sees through aliases)."""
    if isinstance(node, ast.Subscript):
        return head_name(node.value) == "Literal"
    if isinstance(node, (ast.Name, ast.Attribute)) and depth < 10:
        ref = resolve(module, node)
        return ref is not None and isinstance(ref.node, (ast.Subscript, ast.Name, ast.Attribute)) \
            and is_literal_type(ref.module, ref.node, depth + 1)
    return False


def sglang_field(module: Module, name: str, ann: ast.AST, registry: Registry) -> None:
    """`add_cli_args_from_dataclass` for one field (sglang/srt/arg_groups/arg_utils.py)."""
    meta = sglang_meta(module, ann)
    if meta is None:
        return
    arg = meta if isinstance(meta, ast.Call) else None

    def get(key):
        return keyword(arg, key) if arg is not None else None

    if isinstance(get("no_cli"), ast.Constant) and get("no_cli").value:
        return
    cli_name = get("cli_name")
    default = "--" + name.replace("_", "-")
    names = [cli_name.value if isinstance(cli_name, ast.Constant) else default]
    aliases = strings_of(module, get("aliases")) if get("aliases") is not None else []
    names += aliases if isinstance(aliases, list) else []
    where = f"{module.path}:{ann.lineno}" if hasattr(ann, "lineno") else module.path
    listed = strings_of(module, get("choices")) if get("choices") is not None else None

    if get("action") is not None:  # a custom action: choices only through action_kwargs
        choices = None
        extra = get("action_kwargs")
        if isinstance(extra, ast.Dict):
            for key, value in zip(extra.keys, extra.values):
                if isinstance(key, ast.Constant) and key.value == "choices":
                    choices = strings_of(module, value)
        registry.add(Action(names, action_name(module, get("action")), choices, where=where,
                            no_value=custom_action_no_value(module, get("action"))))
        return
    inner = unwrap_optional(module, subscript_args(annotation(ann))[0])
    if is_literal_type(module, inner):
        values = literal_values(module, inner) or []
        choices = listed if listed is not None else [str(v) for v in values]
        registry.add(Action(names, None, choices, where=where))
        return
    if head_name(inner) == "bool":
        registry.add(Action(names, "store_true", None, where=where))
        return
    registry.add(Action(names, None, listed, where=where))


def sglang_dataclass(ref: Ref, registry: Registry) -> None:
    for name, (module, stmt) in dataclass_fields(ref).items():
        sglang_field(module, name, stmt.annotation, registry)


def check_sglang_field_rule(ref: Ref | None) -> None:
    """`add_cli_args_from_dataclass` (sglang/srt/arg_groups/arg_utils.py) must still be the
    rule `sglang_field` mirrors: `no_cli`, `cli_name` and `aliases` read, a bool stored with
    `store_true`, no BooleanOptionalAction of its own."""
    where = f"{ref.module.path}:{ref.node.lineno}" if ref is not None and ref.node else "?"
    if ref is None or not isinstance(ref.node, ast.FunctionDef):
        raise ExtractError("add_cli_args_from_dataclass: not found in the wheel")
    names = {n.attr for n in ast.walk(ref.node) if isinstance(n, ast.Attribute)}
    consts = {n.value for n in ast.walk(ref.node) if isinstance(n, ast.Constant)}
    missing = [x for x in ("no_cli", "cli_name", "aliases") if x not in names]
    if missing or "store_true" not in consts or "BooleanOptionalAction" in names:
        raise ExtractError(
            f"{ref.module.wheel.path.name}: {where}: add_cli_args_from_dataclass is not the rule "
            "this script mirrors (no_cli, cli_name, aliases; bool → store_true); re-read it "
            "and extend sglang_field")


class SglangInterpreter(VllmInterpreter):
    """`ServerArgs.add_cli_args`: its `add_argument` calls and `add_cli_args_from_dataclass`."""

    def expr(self, module, node, cls, env, func):
        if (isinstance(node, ast.Call) and head_name(node.func) == "add_cli_args_from_dataclass"
                and len(node.args) >= 2):
            check_sglang_field_rule(resolve(module, node.func))
            ref = self.class_ref(module, node.args[1], cls, env)
            if ref is not None:
                sglang_dataclass(ref, self.registry)
            return None
        return super().expr(module, node, cls, env, func)

    def add_argument(self, module, call, cls, env, func):
        before = len(self.registry.actions)
        super().add_argument(module, call, cls, env, func)
        if len(self.registry.actions) > before:  # SGLang's deprecated actions name the new flag
            action = self.registry.actions[-1]
            if action.action and action.action.startswith("Deprecated"):
                new = keyword(call, "new_flag")
                action.deprecated = new.value if isinstance(new, ast.Constant) else ""


def sglang_server_args(server: Module | None) -> Ref | None:
    """The `class ServerArgs` of sglang/srt/server_args.py. 0.5.23 rebinds the name at module
    level (`ServerArgs = msgspec.defstruct("ServerArgs", …, namespace=vars(ServerArgs))`),
    which keeps the class body's methods (`add_cli_args`): the class statement is read."""
    if server is None:
        return None
    node = server.defs.get("ServerArgs")
    if isinstance(node, ast.ClassDef):
        return Ref(server, node)
    classes = [n for n in server.tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"]
    return Ref(server, classes[-1]) if classes else None


def sglang_input_namespaces(server: Module | None) -> set[str] | None:
    """The class names in server_args.py's `_INPUT_NAMESPACES = [Model, …]`, if it has one."""
    node = server.defs.get("_INPUT_NAMESPACES") if server is not None else None
    if not isinstance(node, (ast.List, ast.Tuple)):
        return None
    return {e.id for e in node.elts if isinstance(e, ast.Name)}


def extract_sglang(wheel: Wheel) -> dict:
    registry = Registry()
    server = wheel.module("sglang.srt.server_args")
    server_cls = sglang_server_args(server)
    if wheel.has_dir(SGLANG_FIELDS_DIR):  # 0.5.23: namespace classes, one file per group
        layout = SGLANG_FIELDS_DIR + "*.py"
        # ServerArgs collects the fields of the classes in its `_INPUT_NAMESPACES` list
        # (`collect_input_fields`); without such a list, every class with `_NS_PATH`.
        wanted = sglang_input_namespaces(server)
        seen = set()
        for path in wheel.names(SGLANG_FIELDS_DIR):
            if path.endswith("__init__.py"):
                continue
            module = wheel.module(path[:-3].replace("/", "."))
            for cls in (n for n in module.tree.body if isinstance(n, ast.ClassDef)):
                if wanted is not None and cls.name not in wanted:
                    continue
                if any(isinstance(s, ast.Assign) and getattr(s.targets[0], "id", "") == "_NS_PATH"
                       for s in cls.body):
                    seen.add(cls.name)
                    for stmt in cls.body:
                        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                            sglang_field(module, stmt.target.id, stmt.annotation, registry)
        if wanted is not None and wanted - seen:
            raise ExtractError(f"{wheel.path.name}: {SGLANG_SERVER_ARGS}: _INPUT_NAMESPACES "
                               f"names {', '.join(sorted(wanted - seen))}, not found as classes "
                               f"with _NS_PATH in {SGLANG_FIELDS_DIR}")
    elif server_cls is not None:  # 0.5.14: one dataclass
        layout = SGLANG_SERVER_ARGS
    else:
        raise ExtractError(f"{wheel.path.name}: neither {SGLANG_FIELDS_DIR} (SGLang 0.5.23's "
                           f"layout) nor ServerArgs in {SGLANG_SERVER_ARGS} (0.5.14's) is in "
                           "the wheel")
    if server_cls is not None:
        ref = server_cls
        found = method(ref, "add_cli_args")
        if found is None:
            raise ExtractError(f"{wheel.path.name}: ServerArgs in {SGLANG_SERVER_ARGS} has no "
                               "add_cli_args")
        SglangInterpreter(wheel, registry).run(found[0], found[1], ref, {})
    if not registry.actions:
        raise ExtractError(f"{wheel.path.name}: no flags found in {layout}")

    spec_info = wheel.require("sglang.srt.speculative.spec_info", "the speculative algorithms")
    enum = lookup(spec_info, "SpeculativeAlgorithm")
    members = [name for name, _ in enum_members(enum)]
    reserved: list[str] = []  # names from_string accepts beside the members (NEXTN)
    aliases = wheel.module("sglang.srt.speculative.spec_registry")
    if aliases is not None and "_RESERVED_ALIASES" in aliases.defs:
        value = strings_of(aliases, aliases.defs["_RESERVED_ALIASES"])
        reserved = value if isinstance(value, list) else []
    return {
        "flags": registry.flags(),
        "flag_choices": registry.choices(),
        "flag_aliases": registry.aliases(),
        "boolean_flags": registry.boolean_flags(),
        "deprecated_flags": registry.deprecated(),
        "speculative_algorithms": sorted(set(members) - {"NONE"} | set(reserved)),
        "layout": layout,
    }


# --------------------------------------------------------------------------- parser dumps


def dump_parser(engine: str) -> dict:
    """The engine's own parser (import the installed engine: run where it is installed)."""
    if engine == "vllm":
        from vllm import __version__ as version
        from vllm.entrypoints.openai.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    else:
        from sglang import __version__ as version
        from sglang.srt.server_args import ServerArgs
        parser = argparse.ArgumentParser(prog="sglang serve")
        ServerArgs.add_cli_args(parser)
    return parser_actions(parser, engine, version)


def parser_actions(parser: argparse.ArgumentParser, engine: str, version: str) -> dict:
    """Each action's option strings as the parser registered them (`_option_string_actions`):
    vLLM 0.33.0 hides `--no-enable-x`/`--no-disable-x` from `option_strings` (help) after
    registering them, and they still parse."""
    registered: dict[int, list[str]] = {}
    for string, a in parser._option_string_actions.items():
        registered.setdefault(id(a), []).append(string)
    actions = []
    for a in parser._actions:
        if not a.option_strings or isinstance(a, argparse._HelpAction):
            continue
        strings = list(a.option_strings) + [s for s in registered.get(id(a), [])
                                            if s not in a.option_strings]
        actions.append({"option_strings": strings, "action": type(a).__name__,
                        "nargs": a.nargs,
                        "choices": [str(c) for c in a.choices] if a.choices else None})
    return {"engine": engine, "version": version, "python": sys.version.split()[0],
            "actions": actions}


def compare_parser(dump: dict, generated: dict) -> dict:
    """Flags and choices where a generated list and the engine's own parser differ."""
    real = {s for a in dump["actions"] for s in a["option_strings"]}
    listed = set(generated["flags"])
    choices = {}
    for a in dump["actions"]:
        if not a["choices"]:
            continue
        real_choices = sorted(set(a["choices"]) - {"None"})  # argparse rejects "None" (above)
        for s in a["option_strings"]:
            if s.startswith("--no-"):
                continue
            mine = generated.get("flag_choices", {}).get(s)
            if mine != real_choices:
                choices[s] = {"parser": real_choices, "generated": mine}
    no_value = {s for a in dump["actions"] if a.get("nargs") == 0 for s in a["option_strings"]
                if not s.startswith("--no-")}
    mine = {s for s in generated.get("boolean_flags", []) if not s.startswith("--no-")}
    return {"missing": sorted(real - listed), "extra": sorted(listed - real), "choices": choices,
            "boolean_missing": sorted(no_value - mine), "boolean_extra": sorted(mine - no_value)}


# --------------------------------------------------------------------------- main


EXTRACTORS = {"vllm": extract_vllm, "sglang": extract_sglang}


def extract(wheel_path: Path) -> dict:
    engine, version = wheel_identity(wheel_path)
    wheel = Wheel(wheel_path)
    data = {
        "engine": engine,
        "version": version,
        "wheel": wheel_path.name,
        "wheel_sha256": sha256(wheel_path),
        "generated_by": "scripts/extract_engine_cli.py",
        **EXTRACTORS[engine](wheel),
    }
    data["sources"] = sorted(wheel.read)
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheels", nargs="*", type=Path, help="wheels to extract (default: the "
                        "pinned versions found in --wheel-dir)")
    parser.add_argument("--wheel-dir", type=Path, default=ROOT / ".cache" / "wheels")
    parser.add_argument("--download", action="store_true",
                        help="pip download the pinned wheels missing from --wheel-dir")
    parser.add_argument("--out", type=Path, default=ROOT / "lib/specrepro/harness/engine_cli")
    parser.add_argument("--dump-parser", choices=sorted(EXTRACTORS),
                        help="print the installed engine's own parser's options as JSON")
    parser.add_argument("--compare-parser", nargs=2, type=Path, metavar=("DUMP", "LIST"),
                        help="compare a --dump-parser output with a generated list")
    args = parser.parse_args(argv)
    if args.dump_parser:
        print(json.dumps(dump_parser(args.dump_parser), indent=1))
        return 0
    if args.compare_parser:
        dump, listed = (json.loads(p.read_text()) for p in args.compare_parser)
        diff = compare_parser(dump, listed)
        print(json.dumps(diff, indent=1))
        return 1 if diff["missing"] or diff["extra"] else 0

    wheels = list(args.wheels)
    if not wheels:
        for engine, versions in PINNED.items():
            for version in versions:
                found = fetch_wheel(engine, version, args.wheel_dir, args.download)
                if found is None:
                    print(f"{engine} {version}: no {engine}-{version}-*.whl in {args.wheel_dir} "
                          "(--download fetches it); its list is left as it is", file=sys.stderr)
                else:
                    wheels.append(found)
        if not wheels:
            raise SystemExit(f"no pinned wheel in {args.wheel_dir}")
    args.out.mkdir(parents=True, exist_ok=True)
    for wheel_path in wheels:
        try:
            data = extract(wheel_path)
        except ExtractError as err:
            raise SystemExit(f"extract_engine_cli: {err}") from None
        out = args.out / f"{data['engine']}-{data['version']}.json"
        out.write_text(json.dumps(data, indent=1) + "\n")
        print(f"{out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}: "
              f"{len(data['flags'])} flags")
    return 0


if __name__ == "__main__":
    sys.exit(main())
