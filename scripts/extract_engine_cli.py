"""Generate the lists of command-line flags vLLM and SGLang accept, from their wheels.

    python scripts/extract_engine_cli.py [--wheel-dir .cache/wheels] [--out DIR]

Downloads (once, `pip download --no-deps`) the pinned wheels of vLLM 0.33.0 and
SGLang 0.5.23 into a git-ignored cache and reads their source with `ast`; the
packages are never imported (they need torch 2.14 and a GPU). Writes
`lib/specrepro/harness/engine_cli/{vllm-0.33.0,sglang-0.5.23}.json`, which the
engine adapters validate every profile against (`specrepro.harness.flags` reads them).
The lists are this script's output, never typed by hand: regenerate them when an engine
version changes.

How each engine registers its flags, which this script mirrors:

- vLLM: `EngineArgs.add_cli_args` and `make_arg_parser` call
  `add_argument("--flag", **x_kwargs["field"])` where `x_kwargs = get_kwargs(Config)`;
  a field typed `bool` becomes `argparse.BooleanOptionalAction` (so `--no-flag`
  exists too), except `bool | str | None` (an optional-valued flag). The frontend
  flags are every field of `FrontendArgs` and its bases as `--field-name`.
  `--speculative-config` takes the fields of the `SpeculativeConfig` dataclass.
- SGLang: every field of the namespace classes in `sglang/srt/arg_groups/fields/`
  annotated `A[T, "help"]` or `A[T, Arg(...)]` is `--field-name` (or
  `Arg(cli_name=...)`) plus `Arg(aliases=...)`, unless `Arg(no_cli=True)`; plus the
  flags `ServerArgs.add_cli_args` registers by hand.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINES = {
    "vllm": {"version": "0.33.0", "pattern": "vllm-0.33.0-*.whl"},
    "sglang": {"version": "0.5.23", "pattern": "sglang-0.5.23-*.whl"},
}


# --------------------------------------------------------------------------- wheels


def fetch_wheel(engine: str, wheel_dir: Path) -> Path:
    """The engine's wheel from the cache, downloaded there first if missing."""
    spec = ENGINES[engine]
    found = sorted(wheel_dir.glob(spec["pattern"]))
    if not found:
        wheel_dir.mkdir(parents=True, exist_ok=True)
        # The SGLang wheel holds cpython-311 extensions; name the target so the
        # download works from any interpreter.
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.11", "--platform", "manylinux_2_34_x86_64",
               "-d", str(wheel_dir), f"{engine}=={spec['version']}"]
        subprocess.run(cmd, check=True)
        found = sorted(wheel_dir.glob(spec["pattern"]))
    if not found:
        raise SystemExit(f"no wheel matching {spec['pattern']} in {wheel_dir}")
    return found[0]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Wheel:
    """Python sources inside a wheel, parsed on demand."""

    def __init__(self, path: Path):
        self.zip = zipfile.ZipFile(path)

    def tree(self, name: str) -> ast.Module:
        return ast.parse(self.zip.read(name).decode(), filename=name)

    def names(self, prefix: str) -> list[str]:
        return sorted(n for n in self.zip.namelist() if n.startswith(prefix) and n.endswith(".py"))


# --------------------------------------------------------------------------- ast helpers


def strings(node: ast.AST) -> list[str]:
    """String constants in a list/tuple/set literal (or one string)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [s for elt in node.elts for s in strings(elt)]
    return []


def literal_aliases(trees: list[ast.Module]) -> dict[str, ast.AST]:
    """Module-level `Name = Literal[...]` (or any `Name = <expr>`) definitions."""
    out: dict[str, ast.AST] = {}
    for tree in trees:
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    out[target.id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
                out[node.target.id] = node.value
    return out


def literal_values(node: ast.AST, aliases: dict[str, ast.AST], seen=frozenset()) -> list[str] | None:
    """The strings a `Literal[...]` type (through aliases, unions, Optional) admits.

    None when the type is not purely a set of literals (e.g. `... | str`).
    """
    if isinstance(node, ast.Constant):
        return [] if node.value is None else ([node.value] if isinstance(node.value, str) else None)
    if isinstance(node, ast.Attribute):  # me_quant.QuantizationMethods
        node = ast.Name(id=node.attr)
    if isinstance(node, ast.Name):
        if node.id in seen or node.id not in aliases:
            return None
        return literal_values(aliases[node.id], aliases, seen | {node.id})
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left = literal_values(node.left, aliases, seen)
        right = literal_values(node.right, aliases, seen)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if node.value.id in ("Literal", "Optional", "Union"):
            values = [literal_values(elt, aliases, seen) for elt in inner]
            return None if any(v is None for v in values) else [s for v in values for s in v]
    return None


def union_members(node: ast.AST) -> list[str]:
    """Top-level names of a type annotation's union (`bool | str | None` → bool, str, None)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return union_members(node.left) + union_members(node.right)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        if node.value.id in ("Optional", "Union"):
            inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return [m for elt in inner for m in union_members(elt)] + (
                ["None"] if node.value.id == "Optional" else [])
        return [node.value.id]
    if isinstance(node, ast.Constant) and node.value is None:
        return ["None"]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    return ["?"]


def class_fields(trees: list[ast.Module]) -> dict[str, tuple[list[str], dict[str, ast.AST]]]:
    """Class name → (base names, {field: annotation}) for every class in the trees."""
    out = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
                fields = {s.target.id: s.annotation for s in node.body
                          if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
                out[node.name] = (bases, fields)
    return out


def all_fields(classes, name: str) -> dict[str, ast.AST]:
    """Fields of a dataclass including its bases' (bases first, as dataclasses order them)."""
    if name not in classes:
        return {}
    bases, own = classes[name]
    merged: dict[str, ast.AST] = {}
    for base in bases:
        merged.update(all_fields(classes, base))
    merged.update(own)
    return merged


def is_boolean_optional(annotation: ast.AST, classes) -> bool:
    """vLLM's `_compute_kwargs`: a `bool` field becomes `BooleanOptionalAction`.

    Mirrors its order: a dataclass member wins (JSON), `bool | str | None` is an
    optional-valued flag, any other union holding `bool` gets `--no-`.
    """
    members = union_members(annotation)
    if any(m in classes for m in members):
        return False
    if sorted(members) == ["None", "bool", "str"]:
        return False
    return "bool" in members


def with_negations(flags: list[str]) -> list[str]:
    """argparse.BooleanOptionalAction adds `--no-X` for every `--X`."""
    return flags + ["--no-" + f[2:] for f in flags if f.startswith("--")]


def function(tree: ast.Module, qualname: str) -> ast.FunctionDef:
    parts = qualname.split(".")
    scope: list[ast.stmt] = tree.body
    for part in parts:
        node = next(n for n in scope if isinstance(n, (ast.ClassDef, ast.FunctionDef))
                    and n.name == part)
        scope = node.body
    return node


def keyword(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def is_boolean_action(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "BooleanOptionalAction"


# --------------------------------------------------------------------------- vLLM


VLLM_SOURCES = {
    "arg_utils": "vllm/engine/arg_utils.py",
    "cli_args": "vllm/entrypoints/common/cli_args.py",
    "speculative": "vllm/config/speculative.py",
    "compilation": "vllm/config/compilation.py",
    "quantization": "vllm/model_executor/layers/quantization/__init__.py",
}


def vllm_add_argument_flags(func: ast.FunctionDef, classes, aliases, flags, choices) -> None:
    """Flags of every `add_argument` call in one registering function."""
    kwargs_of: dict[str, tuple[str, str | None]] = {}  # var → (config class, sub-field)
    for node in ast.walk(func):
        # x_kwargs = get_kwargs(Config)   or   get_kwargs(VllmConfig)["logging_config"]
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            value, sub = node.value, None
            if isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant):
                value, sub = value.value, value.slice.value
            if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                    and value.func.id == "get_kwargs" and isinstance(value.args[0], ast.Name)):
                kwargs_of[node.targets[0].id] = (value.args[0].id, sub)
    for node in ast.walk(func):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args
                 if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")]
        if not names:
            continue  # a positional such as model_tag
        annotation = field_annotation(node, kwargs_of, classes)
        boolean = is_boolean_action(keyword(node, "action")) or (
            keyword(node, "action") is None and annotation is not None
            and is_boolean_optional(annotation, classes))
        names = with_negations(names) if boolean else names
        flags.update(names)
        values = strings(keyword(node, "choices")) if keyword(node, "choices") else (
            literal_values(annotation, aliases) if annotation is not None else None)
        if values:
            for name in names:
                if not name.startswith("--no-"):
                    choices[name] = sorted(set(values))


def field_annotation(call: ast.Call, kwargs_of, classes) -> ast.AST | None:
    """The config field behind `**x_kwargs["field"]` in an add_argument call."""
    unpacked = [k.value for k in call.keywords if k.arg is None]
    # `**{**cache_kwargs["enable_prefix_caching"], "default": None}` unpacks one level deeper.
    unpacked += [v for d in unpacked if isinstance(d, ast.Dict)
                 for key, v in zip(d.keys, d.values) if key is None]
    for value in unpacked:
        if isinstance(value, ast.Subscript):
            var, key = value.value, value.slice
            if isinstance(var, ast.Name) and var.id in kwargs_of and isinstance(key, ast.Constant):
                cls, sub = kwargs_of[var.id]
                fields = all_fields(classes, cls)
                if sub is not None:  # get_kwargs(VllmConfig)["logging_config"]["level"]
                    members = union_members(fields.get(sub, ast.Constant(None)))
                    cls = next((m for m in members if m in classes), cls)
                    fields = all_fields(classes, cls)
                return fields.get(key.value)
    return None


def extract_vllm(wheel: Wheel) -> dict:
    trees = {key: wheel.tree(path) for key, path in VLLM_SOURCES.items()}
    config_trees = [wheel.tree(p) for p in wheel.names("vllm/config/")]
    all_trees = config_trees + list(trees.values())
    classes = class_fields(all_trees)
    aliases = literal_aliases(all_trees)

    flags: set[str] = set()
    choices: dict[str, list[str]] = {}
    for qualname in ("EngineArgs.add_cli_args", "AsyncEngineArgs.add_cli_args"):
        vllm_add_argument_flags(function(trees["arg_utils"], qualname), classes, aliases, flags, choices)
    vllm_add_argument_flags(function(trees["cli_args"], "make_arg_parser"), classes, aliases, flags,
                            choices)
    # FrontendArgs.add_cli_args: `add_argument(f"--{key.replace('_', '-')}", ...)` per field.
    for name, annotation in all_fields(classes, "FrontendArgs").items():
        names = [f"--{name.replace('_', '-')}"]
        flags.update(with_negations(names) if is_boolean_optional(annotation, classes) else names)
        values = literal_values(annotation, aliases)
        if values:
            choices[names[0]] = sorted(set(values))

    spec_fields = all_fields(classes, "SpeculativeConfig")
    spec_choices = {key: sorted(set(v)) for key, ann in spec_fields.items()
                    if (v := literal_values(ann, aliases))}
    cudagraph = function(trees["compilation"], "CUDAGraphMode")
    return {
        "flags": sorted(flags),
        "flag_choices": dict(sorted(choices.items())),
        "speculative_config_keys": sorted(spec_fields),
        "speculative_methods": spec_choices.pop("method"),
        "speculative_config_choices": spec_choices,
        # `| str` types take any string, so these are not enforced as choices;
        # listed for profiles' documentation and for checks that want them.
        "quantization_methods": literal_values(aliases["QuantizationMethods"], aliases),
        "kv_cache_dtypes": literal_values(aliases["CacheDType"], aliases),
        "compilation_config_keys": sorted(all_fields(classes, "CompilationConfig")),
        "cudagraph_modes": sorted(t.targets[0].id for t in cudagraph.body
                                  if isinstance(t, ast.Assign) and isinstance(t.targets[0], ast.Name)),
        "sources": sorted(set(VLLM_SOURCES.values()) | {"vllm/config/*.py"}),
    }


# --------------------------------------------------------------------------- SGLang


def sglang_arg(annotation: ast.AST) -> ast.AST | None:
    """The metadata of `A[T, "help"]` / `A[T, Arg(...)]`; None for a non-CLI field."""
    if not (isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name)
            and annotation.value.id in ("A", "Annotated") and isinstance(annotation.slice, ast.Tuple)):
        return None
    for meta in annotation.slice.elts[1:]:
        if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
            return meta
        if isinstance(meta, (ast.JoinedStr, ast.BinOp)):
            return ast.Constant(value="")  # help text built from parts
        if isinstance(meta, ast.Call) and isinstance(meta.func, ast.Name) and meta.func.id == "Arg":
            return meta
    return None


def extract_sglang(wheel: Wheel) -> dict:
    field_trees = [wheel.tree(p) for p in wheel.names("sglang/srt/arg_groups/fields/")
                   if not p.endswith("__init__.py")]
    choice_tree = wheel.tree("sglang/srt/arg_groups/choices.py")
    aliases = literal_aliases(field_trees + [choice_tree])
    flags: set[str] = set()
    choices: dict[str, list[str]] = {}
    for tree in field_trees:
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            if not any(isinstance(s, ast.Assign) and getattr(s.targets[0], "id", "") == "_NS_PATH"
                       for s in cls.body):
                continue
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    sglang_field_flags(stmt, aliases, flags, choices)
    server = wheel.tree("sglang/srt/server_args.py")
    for node in ast.walk(function(server, "ServerArgs.add_cli_args")):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            names = [s for a in node.args for s in strings(a) if s.startswith("-")]
            flags.update(with_negations(names) if is_boolean_action(keyword(node, "action")) else names)

    spec_info = wheel.tree("sglang/srt/speculative/spec_info.py")
    enum = function(spec_info, "SpeculativeAlgorithm")
    members = [s.targets[0].id for s in enum.body
               if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name)]
    registry = literal_aliases([wheel.tree("sglang/srt/speculative/spec_registry.py")])
    reserved = [s for arg in registry["_RESERVED_ALIASES"].args for s in strings(arg)]
    return {
        "flags": sorted(flags),
        "flag_choices": dict(sorted(choices.items())),
        "speculative_algorithms": sorted(set(members) - {"NONE"} | set(reserved)),
        "sources": ["sglang/srt/arg_groups/fields/*.py", "sglang/srt/arg_groups/choices.py",
                    "sglang/srt/server_args.py", "sglang/srt/speculative/spec_info.py",
                    "sglang/srt/speculative/spec_registry.py"],
    }


def sglang_field_flags(stmt: ast.AnnAssign, aliases, flags, choices) -> None:
    meta = sglang_arg(stmt.annotation)
    if meta is None:
        return
    cli_name, extra, action, listed = None, [], None, None
    if isinstance(meta, ast.Call):
        if isinstance(keyword(meta, "no_cli"), ast.Constant) and keyword(meta, "no_cli").value:
            return
        cli_name = strings(keyword(meta, "cli_name")) if keyword(meta, "cli_name") else None
        extra = strings(keyword(meta, "aliases")) if keyword(meta, "aliases") else []
        action = keyword(meta, "action")
        listed = keyword(meta, "choices")
    names = [(cli_name or ["--" + stmt.target.id.replace("_", "-")])[0], *extra]
    flags.update(with_negations(names) if is_boolean_action(action) else names)
    values = None
    if isinstance(listed, ast.Name):
        values = strings(aliases.get(listed.id, ast.Constant(None)))
    elif listed is not None:
        values = strings(listed)
    if not values:
        values = literal_values(stmt.annotation.slice.elts[0], aliases)
    if values:
        for name in names:
            choices[name] = sorted(set(values))


# --------------------------------------------------------------------------- main


EXTRACTORS = {"vllm": extract_vllm, "sglang": extract_sglang}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel-dir", type=Path, default=ROOT / ".cache" / "wheels")
    parser.add_argument("--out", type=Path, default=ROOT / "lib/specrepro/harness/engine_cli")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for engine, spec in ENGINES.items():
        wheel_path = fetch_wheel(engine, args.wheel_dir)
        data = {
            "engine": engine,
            "version": spec["version"],
            "wheel": wheel_path.name,
            "wheel_sha256": sha256(wheel_path),
            "generated_by": "scripts/extract_engine_cli.py",
            **EXTRACTORS[engine](Wheel(wheel_path)),
        }
        out = args.out / f"{engine}-{spec['version']}.json"
        out.write_text(json.dumps(data, indent=1) + "\n")
        print(f"{out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}: "
              f"{len(data['flags'])} flags")
    return 0


if __name__ == "__main__":
    sys.exit(main())
