"""SGLang's `launch_server` parser, walked statically from its wheel: the flags it registers.

Design: the field rule (`sglang_field`) over its server-args dataclass or namespace
classes, then its own `add_argument` calls through `SglangInterpreter` (vllm.py's
interpreter, SGLang's differences); `extract_sglang` records the result. The rules:

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

import ast

from specrepro.tools.extract_engine_cli.registry import (
    Action,
    Registry,
    action_name,
    custom_action_no_value,
    keyword,
)
from specrepro.tools.extract_engine_cli.vllm import VllmInterpreter
from specrepro.tools.extract_engine_cli.wheel import (
    ExtractError,
    Module,
    Ref,
    Wheel,
    annotation,
    dataclass_fields,
    enum_members,
    head_name,
    literal_values,
    lookup,
    method,
    resolve,
    strings_of,
    subscript_args,
)

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
