"""A wheel's Python source, read statically: its modules' top-level names, resolved
through imports, classes, dataclass fields and the literal values the extractors need.

Design: an engine's wheel is a zip of its sources; `Wheel` opens modules from it by dotted
name and records what was read (the generated list's `sources`), never importing the
package (it needs a CUDA torch and a GPU). `Module` holds one module's definitions and
imports (TYPE_CHECKING and lazy `__getattr__` imports included); `lookup`/`resolve`
follow a name to its definition (`Ref`), `class_mro` a class's bases, `dataclass_fields`
its fields; `literal_values` and `strings_of` evaluate the constant expressions the
engines build flags and choices from, `OPEN` standing for choices only known at run time.
An unreadable wheel is an `ExtractError` naming the wheel and what was looked for.
"""
from __future__ import annotations

import ast
import hashlib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ExtractError(Exception):
    """A wheel this script cannot read; the message names the wheel and what was looked for."""


# --------------------------------------------------------------------------- wheels


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
