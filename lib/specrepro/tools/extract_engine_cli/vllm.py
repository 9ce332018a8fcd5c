"""vLLM's `vllm serve` parser, walked statically from its wheel: the flags it registers.

Design: `VllmInterpreter` runs the registering functions as the parser would
(`make_arg_parser`, `FrontendArgs.add_cli_args`, `AsyncEngineArgs.add_cli_args` →
`EngineArgs.add_cli_args`), evaluating kwargs with vllm_kwargs.py's rules, and
`extract_vllm` records the result with the `--speculative-config` keys. The rules it
mirrors:

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
"""
from __future__ import annotations

import ast
from typing import Any

from specrepro.tools.extract_engine_cli.registry import (
    Action,
    Registry,
    action_name,
    custom_action_no_value,
    keyword,
)
from specrepro.tools.extract_engine_cli.vllm_kwargs import (
    FieldKwargs,
    KwargsMap,
    VllmKwargsRules,
    vllm_type_hints,
)
from specrepro.tools.extract_engine_cli.wheel import (
    OPEN,
    ExtractError,
    Module,
    Ref,
    Wheel,
    class_mro,
    dataclass_fields,
    enum_members,
    head_name,
    literal_values,
    lookup,
    method,
    resolve,
    strings_of,
)


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
