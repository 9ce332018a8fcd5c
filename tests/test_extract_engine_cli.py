"""The flag extractor (specrepro.tools.extract_engine_cli, run as scripts/extract_engine_cli.py):
the rules it reads from the engines' wheels, and the lists it committed (in the harness's data
folder, harness/engine_cli/) for vLLM 0.26.0 / 0.33.0 and SGLang 0.5.14 / 0.5.23.

The rule tests build small synthetic wheels (zip files of fake sources in each engine's
layout), so they run on the CPU without network or wheels; a test that needs a real wheel is
skipped when it is absent (SPECREPRO_WHEEL_DIR, .cache/wheels, ~/.cache/specrepro-gpu, /tmp/wheels).
"""

from __future__ import annotations

import ast
import json
import os
import textwrap
import zipfile
from pathlib import Path

import pytest

from specrepro.harness.flags import FlagCheck, engine_cli, render_flags
from specrepro.params import load_profile
from specrepro.tools.extract_engine_cli.extract import extract, main
from specrepro.tools.extract_engine_cli.parser_dump import compare_parser
from specrepro.tools.extract_engine_cli.wheel import (
    ExtractError,
    Wheel,
    literal_values,
    lookup,
    sha256,
)

ROOT = Path(__file__).resolve().parents[1]
CLI_DIR = ROOT / "lib" / "specrepro" / "harness" / "engine_cli"


def make_wheel(tmp_path: Path, name: str, files: dict[str, str]) -> Path:
    path = tmp_path / name
    with zipfile.ZipFile(path, "w") as z:
        for member, text in files.items():
            z.writestr(member, textwrap.dedent(text))
    return path


# ----------------------------------------------------------------------- a fake vLLM wheel

# The shape of vLLM 0.26.0's _compute_kwargs (vllm/engine/arg_utils.py:288-400), cut down.
VLLM_ARG_UTILS = '''
import argparse
import sys
from dataclasses import fields, is_dataclass
from itertools import permutations
from typing import Literal, get_args, get_origin

from vllm.config import CacheConfig, VllmConfig
from vllm.config.cache import DetailedTraceModules


def contains_type(type_hints, type):
    return any(th is type or get_origin(th) is type for th in type_hints)


def literal_to_kwargs(type_hints):
    options = get_args(next(th for th in type_hints if get_origin(th) is Literal))
    kwarg = "metavar" if contains_type(type_hints, str) else "choices"
    return {"type": type(options[0]), kwarg: sorted(options)}


def collection_to_kwargs(type_hints, type):
    return {"type": str, "nargs": "+"}


def is_not_builtin(type_hint):
    return type_hint.__module__ != "builtins"


def _compute_kwargs(cls):
    kwargs = {}
    for field in fields(cls):
        type_hints = get_type_hints(field.type)
        generator = (th for th in type_hints if is_dataclass(th))
        dataclass_cls = next(generator, None)
        name = field.name
        kwargs[name] = {"default": field.default}
        if dataclass_cls is not None:
            def parse_dataclass(val, cls=dataclass_cls):
                return cls(val)
            kwargs[name]["type"] = parse_dataclass
        elif type_hints == {bool, str, type(None)}:
            kwargs[name]["type"] = str
            kwargs[name]["nargs"] = "?"
        elif contains_type(type_hints, bool):
            kwargs[name]["action"] = BOOL_ACTION
        elif contains_type(type_hints, Literal):
            kwargs[name].update(literal_to_kwargs(type_hints))
        elif contains_type(type_hints, list):
            kwargs[name].update(collection_to_kwargs(type_hints, list))
        elif contains_type(type_hints, int):
            kwargs[name]["type"] = int
        elif contains_type(type_hints, str) or any(is_not_builtin(th) for th in type_hints):
            kwargs[name]["type"] = str
        else:
            raise ValueError(name)
        if get_origin(kwargs[name].get("type")) is Literal:
            kwargs[name].update(literal_to_kwargs({kwargs[name]["type"]}))
        if type(None) in type_hints and not contains_type(type_hints, bool):
            if kwargs[name].get("choices"):
                kwargs[name]["choices"].append("None")
    return kwargs


def get_kwargs(cls):
    return _compute_kwargs(cls)


class EngineArgs:
    @staticmethod
    def add_cli_args(parser):
        cache_kwargs = get_kwargs(CacheConfig)
        group = parser.add_argument_group(title="CacheConfig")
        if not ("serve" in sys.argv[1:] and "--help" in sys.argv[1:]):
            group.add_argument("--model", **cache_kwargs["model"])
        group.add_argument("--enable-prefix-caching",
                           **{**cache_kwargs["enable_prefix_caching"], "default": None})
        group.add_argument("--kv-cache-dtype", **cache_kwargs["cache_dtype"])
        group.add_argument("--block-size", "-bs", **cache_kwargs["block_size"])
        group.add_argument("--hash-algo", **cache_kwargs["hash_algo"])
        group.add_argument("--mode", **cache_kwargs["mode"])
        group.add_argument("--calculate-scales", **cache_kwargs["calculate_scales"])
        group.add_argument("--layers", **cache_kwargs["layers"])
        group.add_argument("--offload", **cache_kwargs["offload"])
        group.add_argument("--expert-parallel", "-ep", **cache_kwargs["expert_parallel"])
        choices = cache_kwargs["traces"]["choices"]
        cache_kwargs["traces"]["choices"] += [
            ",".join(p) for p in permutations(get_args(DetailedTraceModules), r=2)]
        group.add_argument("--traces", **cache_kwargs["traces"])
        sleep_kwargs = cache_kwargs["sleep_mode"]
        sleep_kwargs["action"] = "store_true"
        group.add_argument("--sleep-mode", **sleep_kwargs)
        vllm_kwargs = get_kwargs(VllmConfig)
        group.add_argument("--speculative-config", "-sc", **vllm_kwargs["speculative_config"])
        group.add_argument("--enable-lora", action=argparse.BooleanOptionalAction)
        parser.add_argument("--disable-log-stats", action="store_true")
        parser.add_argument("--old-spelling", type=int, deprecated=True)
        parser.add_argument("--backend", choices=["flashinfer", "triton"], default=None)
        return parser


class AsyncEngineArgs(EngineArgs):
    @staticmethod
    def add_cli_args(parser, async_args_only=False):
        if not async_args_only:
            parser = EngineArgs.add_cli_args(parser)
        parser.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction)
        return parser
'''

VLLM_CLI_ARGS = '''
import argparse

from vllm.config.utils import config
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser


class ModulesAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)


class Toggle(argparse.BooleanOptionalAction):
    """A subclass without its own __init__: BooleanOptionalAction's option strings."""


@config
class BaseFrontendArgs:
    trust_request_chat_template: bool = False
    log_error_stack: bool = False
    lora_modules: list[str] | None = None

    @classmethod
    def _customize_cli_kwargs(cls, frontend_kwargs):
        frontend_kwargs["lora_modules"]["action"] = ModulesAction
        frontend_kwargs["log_error_stack"]["action"] = ModulesAction
        return frontend_kwargs

    @classmethod
    def add_cli_args(cls, parser):
        from vllm.engine.arg_utils import get_kwargs

        frontend_kwargs = get_kwargs(cls)
        frontend_kwargs = cls._customize_cli_kwargs(frontend_kwargs)
        group = parser.add_argument_group(title="Frontend")
        for key, value in frontend_kwargs.items():
            extra_flags = value.pop("flags", [])
            group.add_argument(*extra_flags, f"--{key.replace('_', '-')}", **value)
        return parser


@config
class FrontendArgs(BaseFrontendArgs):
    port: int = 8000
    uvicorn_log_level: Literal["info", "debug"] = "info"

    @classmethod
    def _customize_cli_kwargs(cls, frontend_kwargs):
        frontend_kwargs = super()._customize_cli_kwargs(frontend_kwargs)
        frontend_kwargs["port"]["flags"] = ["-p"]
        return frontend_kwargs


def make_arg_parser(parser):
    parser.add_argument("model_tag", type=str, nargs="?")
    parser.add_argument("--headless", action="store_true", default=False)
    parser.add_argument("--grpc", action=Toggle)
    parser.add_argument("--api-server-count", "-asc", type=int, default=None)
    parser = FrontendArgs.add_cli_args(parser)
    parser = AsyncEngineArgs.add_cli_args(parser)
    return parser
'''

VLLM_FLEXIBLE_PARSER = '''
from argparse import ArgumentParser, _ArgumentGroup


class FlexibleArgumentParser(ArgumentParser):
    _deprecated = set()

    def add_argument(self, *args, **kwargs):
        deprecated = kwargs.pop("deprecated", False)
        action = super().add_argument(*args, **kwargs)
        if deprecated:
            FlexibleArgumentParser._deprecated.add(action)
        return action

    class _FlexibleArgumentGroup(_ArgumentGroup):
        def add_argument(self, *args, **kwargs):
            deprecated = kwargs.pop("deprecated", False)
            action = super().add_argument(*args, **kwargs)
            if deprecated:
                FlexibleArgumentParser._deprecated.add(action)
            return action
'''


def vllm_files(**replace: str) -> dict[str, str]:
    files = {
        "vllm/__init__.py": "",
        "vllm/config/__init__.py": '''
            from vllm.config.attention import AttentionConfig
            from vllm.config.cache import CacheConfig, CacheDType
            from vllm.config.compilation import CompilationConfig, CUDAGraphMode
            from vllm.config.speculative import SpeculativeConfig
            from vllm.config.vllm import VllmConfig
            ''',
        "vllm/config/utils.py": '''
            def config(cls):
                return cls
            ''',
        "vllm/config/cache.py": '''
            from dataclasses import field
            from typing import ClassVar, Literal

            from vllm.config.utils import config

            CacheDType = Literal["auto", "fp8"]
            DetailedTraceModules = Literal["model", "worker"]


            @config
            class OffloadConfig:
                size: int = 0


            @config
            class CacheConfig:
                model: str = "m"
                enable_prefix_caching: bool = True
                cache_dtype: CacheDType = "auto"
                block_size: int | None = None
                hash_algo: Literal["sha256", "xxhash"] | None = None
                mode: Literal["a", "b"] | str = "a"
                calculate_scales: bool | str | None = None
                layers: list[Literal["x", "y"]] | None = None
                offload: bool | OffloadConfig = False
                expert_parallel: bool = False
                traces: list[DetailedTraceModules] | None = None
                sleep_mode: bool = False
                registry: ClassVar[bool] = True
            ''',
        "vllm/config/speculative.py": '''
            from typing import Literal

            from vllm.config.utils import config

            EagleTypes = Literal["eagle", "eagle3"]
            SpeculativeMethod = Literal["ngram", "draft_model", EagleTypes]


            @config
            class SpeculativeConfig:
                method: SpeculativeMethod | None = None
                num_speculative_tokens: int | None = None
                draft_sample_method: Literal["greedy", "probabilistic"] = "greedy"
            ''',
        "vllm/config/compilation.py": '''
            import enum

            from vllm.config.utils import config


            class CUDAGraphMode(enum.Enum):
                NONE = 0
                FULL = 2
                FULL_AND_PIECEWISE = (2, 1)

                def decode_mode(self):
                    return self


            @config
            class CompilationConfig:
                mode: int = 0
                cudagraph_mode: CUDAGraphMode | None = None
            ''',
        "vllm/config/attention.py": '''
            from vllm.config.utils import config
            from vllm.v1.attention.backends.registry import AttentionBackendEnum


            @config
            class AttentionConfig:
                backend: AttentionBackendEnum | None = None
            ''',
        "vllm/v1/attention/backends/registry.py": '''
            from enum import Enum


            class AttentionBackendEnum(Enum):
                FLASH_ATTN = "a.FlashAttentionBackend"
                TRITON_ATTN = "a.TritonAttentionBackend"
            ''',
        "vllm/config/vllm.py": '''
            from vllm.config.compilation import CompilationConfig
            from vllm.config.speculative import SpeculativeConfig
            from vllm.config.utils import config


            @config
            class VllmConfig:
                speculative_config: SpeculativeConfig | None = None
                compilation_config: CompilationConfig = None
            ''',
        "vllm/model_executor/layers/quantization/__init__.py": '''
            from typing import Literal

            QuantizationMethods = Literal["fp8", "fp8_per_tensor"]
            ''',
        "vllm/engine/arg_utils.py": VLLM_ARG_UTILS.replace("BOOL_ACTION",
                                                           "argparse.BooleanOptionalAction"),
        "vllm/entrypoints/openai/cli_args.py": "from typing import Literal\n" + VLLM_CLI_ARGS,
        "vllm/utils/argparse_utils.py": VLLM_FLEXIBLE_PARSER,
    }
    files.update(replace)
    return files


@pytest.fixture
def vllm(tmp_path):
    wheel = make_wheel(tmp_path, "vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl", vllm_files())
    return extract(wheel)


def test_vllm_boolean_fields_get_no_x_and_others_do_not(vllm):
    flags = set(vllm["flags"])
    # a bool field → BooleanOptionalAction; **{**kwargs, "default": None} keeps its action
    assert {"--enable-prefix-caching", "--no-enable-prefix-caching"} <= flags
    assert {"--trust-request-chat-template", "--no-trust-request-chat-template"} <= flags
    # explicit BooleanOptionalAction, also from AsyncEngineArgs
    assert {"--enable-lora", "--no-enable-lora", "--enable-log-requests",
            "--no-enable-log-requests", "--grpc", "--no-grpc"} <= flags  # and a subclass
    # BooleanOptionalAction negates long spellings only: -ep has no --no-ep
    assert {"--expert-parallel", "--no-expert-parallel", "-ep"} <= flags
    assert "--no-ep" not in flags and "--no-ep" not in vllm["boolean_flags"]
    # no --no-X: store_true, bool | str | None (optional-valued), a dataclass member, an int,
    # a mutated action, an action set in _customize_cli_kwargs, a Literal
    for flag in ("--disable-log-stats", "--calculate-scales", "--offload", "--block-size",
                 "--sleep-mode", "--log-error-stack", "--headless", "--kv-cache-dtype",
                 "--port", "--lora-modules"):
        assert flag in flags and "--no-" + flag[2:] not in flags, flag
    assert {"--disable-log-stats", "--sleep-mode", "--headless", "--enable-lora",
            "--expert-parallel", "-ep"} <= set(vllm["boolean_flags"])
    assert "--calculate-scales" not in vllm["boolean_flags"]
    assert "--log-error-stack" not in vllm["boolean_flags"]  # ModulesAction takes a value


def test_vllm_choices_follow_literals_and_drop_none(vllm):
    choices = vllm["flag_choices"]
    assert choices["--kv-cache-dtype"] == ["auto", "fp8"]  # through an alias
    assert choices["--hash-algo"] == ["sha256", "xxhash"]  # Optional: "None" left out
    assert "--mode" not in choices  # Literal | str: any string (metavar only)
    assert choices["--layers"] == ["x", "y"]  # a list of a Literal
    assert "--traces" not in choices  # extended at run time: unknown, so not enforced
    assert choices["--backend"] == ["flashinfer", "triton"]  # explicit choices=
    assert choices["--uvicorn-log-level"] == ["debug", "info"]  # a frontend field


def test_vllm_spellings_aliases_and_deprecated(vllm):
    flags = set(vllm["flags"])
    assert "--model" in flags  # registered in an if branch
    assert "model_tag" not in flags  # the positional
    assert {"-asc", "-bs", "-sc", "-p"} <= flags
    assert vllm["flag_aliases"]["-bs"] == "--block-size"
    assert vllm["flag_aliases"]["-sc"] == "--speculative-config"
    assert vllm["flag_aliases"]["-p"] == "--port"  # from the kwargs' "flags" list
    assert vllm["deprecated_flags"] == {"--old-spelling": ""}
    assert "--registry" not in flags  # a ClassVar is no field


def test_vllm_facts_beside_the_flags(vllm):
    assert vllm["speculative_methods"] == ["draft_model", "eagle", "eagle3", "ngram"]
    assert vllm["speculative_config_keys"] == ["draft_sample_method", "method",
                                               "num_speculative_tokens"]
    assert vllm["speculative_config_choices"] == {"draft_sample_method": ["greedy",
                                                                          "probabilistic"]}
    assert vllm["cudagraph_modes"] == ["FULL", "FULL_AND_PIECEWISE", "NONE"]
    assert vllm["quantization_methods"] == ["fp8", "fp8_per_tensor"]
    assert vllm["kv_cache_dtypes"] == ["auto", "fp8"]
    assert vllm["compilation_config_keys"] == ["cudagraph_mode", "mode"]
    assert vllm["attention_backends"] == ["FLASH_ATTN", "TRITON_ATTN"]
    assert vllm["version"] == "9.9.9" and len(vllm["wheel_sha256"]) == 64
    assert "vllm/engine/arg_utils.py" in vllm["sources"]
    assert vllm["layout"] == "make_arg_parser in vllm/entrypoints/openai/cli_args.py"


def test_vllm_bool_rule_is_read_from_the_wheel(tmp_path):
    # A vLLM whose _compute_kwargs makes bool fields store_true has no --no-X for them.
    files = vllm_files(**{"vllm/engine/arg_utils.py": VLLM_ARG_UTILS.replace(
        "BOOL_ACTION", '"store_true"')})
    data = extract(make_wheel(tmp_path, "vllm-9.9.9-x.whl", files))
    assert "--enable-prefix-caching" in data["flags"]
    assert "--no-enable-prefix-caching" not in data["flags"]
    assert "--enable-prefix-caching" in data["boolean_flags"]
    assert "--no-enable-lora" in data["flags"]  # explicit actions are unaffected


def test_vllm_unknown_rule_fails_naming_its_line(tmp_path):
    changed = VLLM_ARG_UTILS.replace(
        "elif contains_type(type_hints, bool):",
        "elif contains_type(type_hints, bool) and field.default is False:")
    files = vllm_files(**{"vllm/engine/arg_utils.py": changed.replace(
        "BOOL_ACTION", "argparse.BooleanOptionalAction")})
    wheel = make_wheel(tmp_path, "vllm-9.9.9-x.whl", files)
    line = next(i for i, text in enumerate(textwrap.dedent(changed).splitlines(), 1)
                if "field.default is False" in text)
    with pytest.raises(ExtractError, match=rf"vllm/engine/arg_utils.py:{line}: unknown test"):
        extract(wheel)


def test_vllm_parser_that_rewrites_arguments_fails(tmp_path):
    rewriting = VLLM_FLEXIBLE_PARSER.replace(
        'deprecated = kwargs.pop("deprecated", False)\n        action',
        'deprecated = kwargs.pop("deprecated", False)\n'
        '        args = args + tuple("--disable-" + a[9:] for a in args)\n'
        '        action', 1)
    assert rewriting != VLLM_FLEXIBLE_PARSER
    wheel = make_wheel(tmp_path, "vllm-9.9.9-x.whl",
                       vllm_files(**{"vllm/utils/argparse_utils.py": rewriting}))
    with pytest.raises(ExtractError, match=r"vllm/utils/argparse_utils.py:\d+: "
                                             r"FlexibleArgumentParser.add_argument assigns args"):
        extract(wheel)


def test_vllm_boolean_action_subclass_with_own_init_fails(tmp_path):
    cli = VLLM_CLI_ARGS.replace(
        'parser.add_argument("--headless", action="store_true", default=False)',
        'parser.add_argument("--headless", action=EnableDisable)').replace(
        "@config\nclass BaseFrontendArgs:",
        "class EnableDisable(argparse.BooleanOptionalAction):\n"
        "    def __init__(self, option_strings, dest, **kw):\n"
        "        super().__init__(option_strings, dest, **kw)\n\n\n"
        "@config\nclass BaseFrontendArgs:")
    wheel = make_wheel(tmp_path, "vllm-9.9.9-x.whl", vllm_files(
        **{"vllm/entrypoints/openai/cli_args.py": "from typing import Literal\n" + cli}))
    with pytest.raises(ExtractError, match="EnableDisable subclasses BooleanOptionalAction"):
        extract(wheel)


def test_vllm_cli_module_found_where_the_wheel_has_it(tmp_path):
    files = vllm_files()
    files["vllm/entrypoints/common/cli_args.py"] = files.pop("vllm/entrypoints/openai/cli_args.py")
    data = extract(make_wheel(tmp_path, "vllm-9.9.9-x.whl", files))
    assert data["layout"] == "make_arg_parser in vllm/entrypoints/common/cli_args.py"
    assert "--no-enable-prefix-caching" in data["flags"]
    del files["vllm/entrypoints/common/cli_args.py"]
    with pytest.raises(ExtractError, match=r"vllm-9.9.9-y.whl: no make_arg_parser .*"
                                             r"vllm/entrypoints/openai/cli_args.py.*"
                                             r"vllm/entrypoints/common/cli_args.py"):
        extract(make_wheel(tmp_path, "vllm-9.9.9-y.whl", files))


# ----------------------------------------------------------------------- fake SGLang wheels

# vLLM 0.33.0's FlexibleArgumentParser (vllm/utils/argparse_utils.py:120-179), cut down.
VLLM_ENABLE_DISABLE = '''
from argparse import BooleanOptionalAction


class EnableDisableAction(BooleanOptionalAction):
    _inverse_prefixes = {"--enable-": "--disable-", "--disable-": "--enable-"}

    def __init__(self, option_strings, dest, *args, **kwargs):
        super().__init__(option_strings, dest, *args, **kwargs)
        inverses = [
            inverse + opt.removeprefix(prefix)
            for opt in option_strings
            for prefix, inverse in self._inverse_prefixes.items()
            if opt.startswith(prefix)
        ]
        self.option_strings = [*self.option_strings, *inverses]
'''


def enable_disable_parser(register: str) -> str:
    return (VLLM_FLEXIBLE_PARSER.replace(
        "from argparse import ArgumentParser, _ArgumentGroup",
        "from argparse import ArgumentParser, BooleanOptionalAction, _ArgumentGroup")
        .replace("    _deprecated = set()\n",
                 "    _deprecated = set()\n\n"
                 "    def __init__(self, *args, **kwargs):\n"
                 "        super().__init__(*args, **kwargs)\n"
                 f"        {register}\n")
        + VLLM_ENABLE_DISABLE)


def test_vllm_enable_disable_action_pairs_enable_with_disable(tmp_path):
    # 0.33.0 registers EnableDisableAction for BooleanOptionalAction: --enable-x gets
    # --disable-x (no value) beside --no-enable-x; other booleans only --no-X.
    parser = enable_disable_parser(
        'self.register("action", BooleanOptionalAction, EnableDisableAction)')
    data = extract(make_wheel(tmp_path, "vllm-9.9.9-x.whl", vllm_files(
        **{"vllm/utils/argparse_utils.py": parser})))
    flags = set(data["flags"])
    assert {"--enable-prefix-caching", "--no-enable-prefix-caching",
            "--disable-prefix-caching"} <= flags
    assert {"--enable-lora", "--no-enable-lora", "--disable-lora"} <= flags
    assert "--disable-prefix-caching" in data["boolean_flags"]
    assert "--disable-prefix-caching" not in data["flag_aliases"]
    assert "--no-expert-parallel" in flags and "--disable-expert-parallel" not in flags
    plain = extract(make_wheel(tmp_path, "vllm-9.9.9-y.whl", vllm_files()))
    assert flags - set(plain["flags"]) == {"--disable-prefix-caching", "--disable-lora",
                                           "--disable-log-requests"}


def test_vllm_unknown_action_registration_fails(tmp_path):
    parser = enable_disable_parser('self.register("action", "store_true", EnableDisableAction)')
    with pytest.raises(ExtractError, match=r"argparse_utils.py:\d+: .*registers an action"):
        extract(make_wheel(tmp_path, "vllm-9.9.9-x.whl", vllm_files(
            **{"vllm/utils/argparse_utils.py": parser})))
    changed = enable_disable_parser(
        'self.register("action", BooleanOptionalAction, EnableDisableAction)').replace(
        "self.option_strings = [*self.option_strings, *inverses]",
        "self.option_strings = inverses")
    with pytest.raises(ExtractError, match="EnableDisableAction .* is not the rule"):
        extract(make_wheel(tmp_path, "vllm-9.9.9-y.whl", vllm_files(
            **{"vllm/utils/argparse_utils.py": changed})))


def test_star_import_is_followed(tmp_path):
    # vllm/renderers/chat_utils/__init__.py: `from .types import *` re-exports a Literal.
    wheel = Wheel(make_wheel(tmp_path, "vllm-9.9.9-x.whl", {
        "pkg/__init__.py": "from .types import *\n",
        "pkg/types.py": "from typing import Literal\n__all__ = ['Fmt']\n"
                        "Fmt = Literal['auto', 'string']\n_Hidden = 1\n"}))
    module = wheel.module("pkg")
    assert literal_values(module, ast.Name(id="Fmt")) == ["auto", "string"]
    assert lookup(module, "_Hidden") is None


SGLANG_ARG_UTILS = '''
import dataclasses
from typing import Annotated, Any, List, Optional

A = Annotated


@dataclasses.dataclass(frozen=True)
class Arg:
    help: str = ""
    choices: Optional[list] = None
    aliases: Optional[List[str]] = None
    cli_name: Optional[str] = None
    action: Optional[Any] = None
    no_cli: bool = False


def add_cli_args_from_dataclass(parser, cls, *, fields=None):
    for field in dataclasses.fields(cls):
        raw_type, arg_meta = unwrap(field)
        if arg_meta is None or arg_meta.no_cli:
            continue
        names = [arg_meta.cli_name or "--" + field.name.replace("_", "-")]
        names += arg_meta.aliases or []
        if arg_meta.action is not None:
            parser.add_argument(*names, action=arg_meta.action)
        elif raw_type is bool:
            parser.add_argument(*names, action="store_true")
        else:
            parser.add_argument(*names, choices=arg_meta.choices)
'''

SGLANG_ACTIONS = '''
import argparse


class DeprecatedStoreTrueAction(argparse.Action):
    def __init__(self, option_strings, dest, new_flag=None, nargs=0, const=True, default=None,
                 **kwargs):
        super().__init__(option_strings, dest, nargs=nargs, const=const, default=default, **kwargs)


class DeprecatedAliasStoreAction(argparse.Action):
    def __init__(self, option_strings, dest, new_flag=None, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
'''

SGLANG_SPEC = {
    "sglang/srt/speculative/spec_info.py": '''
        from enum import Enum, auto


        class SpeculativeAlgorithm(Enum):
            DFLASH = auto()
            EAGLE = auto()
            NONE = auto()

            @classmethod
            def from_string(cls, name):
                return cls[name.upper()]
        ''',
    "sglang/srt/speculative/spec_registry.py": '''
        _RESERVED_ALIASES = frozenset({"NEXTN"})
        ''',
}

SGLANG_SERVER_ARGS_0514 = '''
from __future__ import annotations

import argparse
import dataclasses
from enum import IntEnum
from typing import Literal, Optional

from sglang.srt.arg_groups.arg_utils import A, Arg, add_cli_args_from_dataclass
from sglang.srt.arg_groups.argparse_actions import (
    DeprecatedAliasStoreAction,
    DeprecatedStoreTrueAction,
)
from sglang.srt.layers.backends import ATTENTION_BACKENDS

SAMPLING_BACKEND_CHOICES = {"flashinfer", "pytorch"}


class Backend:
    FULL = "full"
    DISABLED = "disabled"
    ALL = (FULL, DISABLED)


class Mode(IntEnum):
    NONE = 0
    ALL = 2


class ReasoningParser:
    DetectorMap = {"qwen3": 1, "deepseek-r1": 2}


@dataclasses.dataclass
class ServerArgs:
    model_path: A[str, Arg(help="The model.", aliases=["--model"])]
    fp8_gemm_runner_backend: A[str, Arg(help="GEMM.", cli_name="--fp8-gemm-backend")] = "auto"
    disable_radix_cache: A[bool, "Disable the prefix cache."] = False
    lora_strict_loading: A[bool, Arg(help="Strict.", action=argparse.BooleanOptionalAction)] = False
    attention_backend: A[Optional[str], Arg(help="Attention.", choices=ATTENTION_BACKENDS)] = None
    sampling_backend: A[Optional[str], Arg(choices=SAMPLING_BACKEND_CHOICES)] = None
    kv_cache_dtype: A[Literal["auto", "fp8_e4m3"], "The KV dtype."] = "auto"
    cuda_graph_backend: A[Optional[Literal["full", "disabled"]], Arg(choices=Backend.ALL)] = None
    enable_metrics: A[bool, f"Enable {'prometheus'} metrics."] = False
    hidden: A[bool, Arg(no_cli=True)] = False
    plain: int = 3

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        add_cli_args_from_dataclass(parser, ServerArgs)
        reasoning_parser_choices = list(ReasoningParser.DetectorMap.keys())
        parser.add_argument("--reasoning-parser", type=str,
                            choices=["auto"] + reasoning_parser_choices)
        parser.add_argument("--kv-canary", type=str, choices=[m.name.lower() for m in Mode])
        parser.add_argument("--disable-cuda-graph", action=DeprecatedStoreTrueAction,
                            new_flag="--cuda-graph-backend=disabled")
        parser.add_argument("--cuda-graph-max-bs", type=int, action=DeprecatedAliasStoreAction,
                            new_flag="--cuda-graph-max-bs-decode")
'''


def sglang_0514_files(**replace: str) -> dict[str, str]:
    files = {
        "sglang/srt/server_args.py": SGLANG_SERVER_ARGS_0514,
        "sglang/srt/arg_groups/arg_utils.py": SGLANG_ARG_UTILS,
        "sglang/srt/arg_groups/argparse_actions.py": SGLANG_ACTIONS,
        "sglang/srt/layers/backends.py": 'ATTENTION_BACKENDS = ["triton", "fa3"]\n',
        **SGLANG_SPEC,
    }
    files.update(replace)
    return files


def test_sglang_0514_layout_field_rules(tmp_path):
    data = extract(make_wheel(tmp_path, "sglang-9.9.9-cp311-cp311-x.whl", sglang_0514_files()))
    flags = set(data["flags"])
    assert data["layout"] == "sglang/srt/server_args.py"
    assert {"--model-path", "--model"} <= flags
    assert data["flag_aliases"]["--model"] == "--model-path"
    assert "--fp8-gemm-backend" in flags and "--fp8-gemm-runner-backend" not in flags  # cli_name
    assert "--disable-radix-cache" in flags  # store_true: no --no-
    assert "--no-disable-radix-cache" not in flags
    assert {"--lora-strict-loading", "--no-lora-strict-loading"} <= flags  # BooleanOptionalAction
    assert "--enable-metrics" in flags  # help text built from parts still makes a flag
    assert "--hidden" not in flags and "--plain" not in flags  # no_cli; no A[...]
    assert {"--disable-radix-cache", "--enable-metrics", "--lora-strict-loading",
            "--disable-cuda-graph"} <= set(data["boolean_flags"])  # nargs=0 action included
    assert "--cuda-graph-max-bs" not in data["boolean_flags"]


def test_sglang_0514_choices_and_deprecated(tmp_path):
    data = extract(make_wheel(tmp_path, "sglang-9.9.9-cp311-cp311-x.whl", sglang_0514_files()))
    choices = data["flag_choices"]
    assert choices["--attention-backend"] == ["fa3", "triton"]  # imported from another module
    assert choices["--sampling-backend"] == ["flashinfer", "pytorch"]  # a set
    assert choices["--kv-cache-dtype"] == ["auto", "fp8_e4m3"]  # the Literal
    assert choices["--cuda-graph-backend"] == ["disabled", "full"]  # Arg(choices=Backend.ALL)
    assert choices["--reasoning-parser"] == ["auto", "deepseek-r1", "qwen3"]  # local + dict keys
    assert choices["--kv-canary"] == ["all", "none"]  # [m.name.lower() for m in Enum]
    assert data["deprecated_flags"] == {"--cuda-graph-max-bs": "--cuda-graph-max-bs-decode",
                                        "--disable-cuda-graph": "--cuda-graph-backend=disabled"}
    assert data["speculative_algorithms"] == ["DFLASH", "EAGLE", "NEXTN"]  # NONE out, alias in


def test_sglang_changed_field_rule_fails(tmp_path):
    changed = SGLANG_ARG_UTILS.replace('action="store_true"',
                                       "action=argparse.BooleanOptionalAction")
    wheel = make_wheel(tmp_path, "sglang-9.9.9-x.whl", sglang_0514_files(
        **{"sglang/srt/arg_groups/arg_utils.py": changed}))
    with pytest.raises(ExtractError, match="add_cli_args_from_dataclass is not the rule"):
        extract(wheel)


def test_sglang_0523_layout_reads_namespace_fields(tmp_path):
    files = {
        "sglang/srt/arg_groups/fields/__init__.py": "",
        "sglang/srt/arg_groups/fields/spec.py": '''
            from typing import Optional

            from sglang.srt.arg_groups.arg_utils import A, Arg
            from sglang.srt.arg_groups.choices import QUANTIZATION_CHOICES


            class SpecArgs:
                _NS_PATH = "speculative"
                speculative_draft_model_path: A[
                    Optional[str], Arg(help="Draft.", aliases=["--speculative-draft-model"])] = None
                speculative_draft_model_quantization: A[
                    Optional[str], Arg(help="Q.", choices=QUANTIZATION_CHOICES)] = None
                speculative_use_block_verification: A[bool, "Block verification."] = False


            class Helper:
                not_a_flag: A[int, "No _NS_PATH: not a namespace."] = 1
            ''',
        "sglang/srt/arg_groups/choices.py": 'QUANTIZATION_CHOICES = ["fp8", "unquant"]\n',
        "sglang/srt/arg_groups/arg_utils.py": SGLANG_ARG_UTILS,
        "sglang/srt/server_args.py": '''
            import argparse


            class ServerArgs:
                @staticmethod
                def add_cli_args(parser: argparse.ArgumentParser):
                    parser.add_argument("--config", type=str)
            ''',
        **SGLANG_SPEC,
    }
    data = extract(make_wheel(tmp_path, "sglang-9.9.9-cp311-cp311-x.whl", files))
    assert data["layout"] == "sglang/srt/arg_groups/fields/*.py"
    assert {"--speculative-draft-model-path", "--speculative-draft-model", "--config",
            "--speculative-use-block-verification"} <= set(data["flags"])
    assert "--no-speculative-use-block-verification" not in data["flags"]
    assert "--not-a-flag" not in data["flags"]
    assert data["flag_choices"]["--speculative-draft-model-quantization"] == ["fp8", "unquant"]


def test_sglang_without_either_layout_fails_naming_both(tmp_path):
    wheel = make_wheel(tmp_path, "sglang-9.9.9-cp311-cp311-x.whl",
                       {"sglang/srt/other.py": "", **SGLANG_SPEC})
    with pytest.raises(ExtractError) as err:
        extract(wheel)
    text = str(err.value)
    assert "sglang-9.9.9-cp311-cp311-x.whl" in text
    assert "sglang/srt/arg_groups/fields/" in text and "sglang/srt/server_args.py" in text


def test_main_exits_with_the_message(tmp_path):
    wheel = make_wheel(tmp_path, "sglang-9.9.9-cp311-cp311-x.whl", {"sglang/x.py": ""})
    with pytest.raises(SystemExit, match="extract_engine_cli: sglang-9.9.9"):
        main([str(wheel), "--out", str(tmp_path / "out")])
    main([str(make_wheel(tmp_path, "sglang-9.9.8-cp311-cp311-x.whl", sglang_0514_files())),
            "--out", str(tmp_path / "out")])
    written = json.loads((tmp_path / "out" / "sglang-9.9.8.json").read_text())
    assert written["generated_by"] == "scripts/extract_engine_cli.py"
    assert written["wheel"] == "sglang-9.9.8-cp311-cp311-x.whl"


def test_compare_parser_reports_each_difference():
    dump = {"actions": [
        {"option_strings": ["--a", "--no-a"], "action": "BooleanOptionalAction", "nargs": 0,
         "choices": None},
        {"option_strings": ["--b"], "action": "_StoreAction", "nargs": None,
         "choices": ["x", "None"]},
        {"option_strings": ["--c"], "action": "_StoreTrueAction", "nargs": 0, "choices": None}]}
    listed = {"flags": ["--a", "--b", "--d", "--no-a"], "flag_choices": {"--b": ["x"]},
              "boolean_flags": ["--a", "--d"]}
    assert compare_parser(dump, listed) == {
        "missing": ["--c"], "extra": ["--d"], "choices": {},
        "boolean_missing": ["--c"], "boolean_extra": ["--d"]}


# ----------------------------------------------------------------------- the committed lists

NEW = ["vllm-0.26.0", "sglang-0.5.14"]
# Every list regenerated by the current script and checked against its engine's own parser.
CHECKED = NEW + ["vllm-0.33.0", "sglang-0.5.23"]
ALL = sorted(p.stem for p in CLI_DIR.glob("*.json") if not p.stem.endswith(".parser"))


@pytest.mark.parametrize("name", ALL)
def test_every_list_records_its_wheel_and_sources(name):
    data = engine_cli(name)
    engine, version = name.split("-")
    assert (data["engine"], data["version"]) == (engine, version)
    assert data["generated_by"] == "scripts/extract_engine_cli.py"
    assert data["wheel"].startswith(f"{engine}-{version}-") and data["wheel"].endswith(".whl")
    assert len(data["wheel_sha256"]) == 64 and int(data["wheel_sha256"], 16) >= 0
    assert data["sources"] and all(s.endswith(".py") for s in data["sources"])


@pytest.mark.parametrize("name", CHECKED)
def test_no_x_only_for_flags_that_take_no_value(name):
    data = engine_cli(name)
    flags, boolean = set(data["flags"]), set(data["boolean_flags"])
    assert boolean <= flags
    for flag in flags:
        if flag.startswith("--no-"):
            assert "--" + flag[5:] in boolean, flag
    assert set(data["flag_choices"]) <= flags
    assert set(data["flag_aliases"]) <= flags and set(data["flag_aliases"].values()) <= flags
    assert not set(data["flag_choices"]) & boolean


def test_vllm_0260_holds_what_the_gpu_recipe_needs():
    data = engine_cli("vllm-0.26.0")
    flags = set(data["flags"])
    assert {"--no-enable-prefix-caching", "--enforce-eager", "--gpu-memory-utilization",
            "--max-num-seqs", "--speculative-config", "--compilation-config",
            "--max-model-len", "--kv-cache-dtype", "--attention-backend"} <= flags
    assert {"--no-enforce-eager", "--enable-chunked-prefill",
            "--no-enable-chunked-prefill"} <= flags
    assert "--enforce-eager" in data["boolean_flags"]
    assert "--disable-log-stats" in data["boolean_flags"]
    assert "--no-disable-log-stats" not in flags  # store_true
    assert "--no-gpu-memory-utilization" not in flags
    assert data["flag_aliases"]["-sc"] == "--speculative-config"
    assert data["flag_aliases"]["-cc"] == "--compilation-config"
    assert data["flag_aliases"]["-tp"] == "--tensor-parallel-size"
    # 0.33.0 spellings that 0.26.0 does not have
    assert "--per-request-spec-decode-metrics" not in flags
    assert "--disable-chunked-prefill" not in flags
    assert {"ngram", "ngram_gpu", "draft_model", "eagle", "eagle3", "mtp", "dflash", "suffix",
            "medusa"} <= set(data["speculative_methods"])
    assert "dflash2" not in data["speculative_methods"]
    assert {"num_speculative_tokens_per_batch_size", "draft_sample_method",
            "rejection_sample_method", "quantization", "num_speculative_tokens", "method",
            "model"} <= set(data["speculative_config_keys"])
    assert data["speculative_config_choices"]["draft_sample_method"] == ["greedy",
                                                                         "probabilistic"]
    assert data["cudagraph_modes"] == ["FULL", "FULL_AND_PIECEWISE", "FULL_DECODE_ONLY",
                                       "NONE", "PIECEWISE"]
    assert {"FLASH_ATTN", "TRITON_ATTN", "FLASHINFER"} <= set(data["attention_backends"])
    assert {"auto", "bfloat16", "fp8"} <= set(data["flag_choices"]["--kv-cache-dtype"])


def test_vllm_0330_pairs_enable_and_disable():
    # vllm/utils/argparse_utils.py:120-179 (EnableDisableAction), checked against the parser
    data = engine_cli("vllm-0.33.0")
    flags, boolean = set(data["flags"]), set(data["boolean_flags"])
    assert {"--enable-chunked-prefill", "--disable-chunked-prefill",
            "--no-enable-chunked-prefill", "--enable-prefix-caching",
            "--disable-prefix-caching", "--no-enable-prefix-caching",
            "--disable-custom-all-reduce", "--enable-custom-all-reduce",
            "--no-disable-custom-all-reduce"} <= flags
    assert {"--disable-chunked-prefill", "--enable-custom-all-reduce"} <= boolean
    assert "--per-request-spec-decode-metrics" in flags
    assert "--disable-log-stats" in boolean and "--enable-log-stats" not in flags  # store_true
    assert "--disable-enforce-eager" not in flags and "--no-enforce-eager" in flags
    # ParallelConfig's Literal holds "passthrough"; make_arg_parser removes it from the CLI
    assert "passthrough" not in data["flag_choices"]["--all2all-backend"]
    assert data["flag_choices"]["--chat-template-content-format"] == ["auto", "openai",
                                                                       "string"]


def test_sglang_0514_holds_what_the_gpu_recipe_needs():
    data = engine_cli("sglang-0.5.14")
    flags, choices = set(data["flags"]), data["flag_choices"]
    assert {"--disable-radix-cache", "--attention-backend", "--sampling-backend",
            "--mem-fraction-static", "--max-running-requests", "--enable-metrics",
            "--speculative-algorithm", "--speculative-draft-model-path",
            "--speculative-num-steps", "--speculative-eagle-topk",
            "--speculative-num-draft-tokens", "--speculative-draft-model-quantization",
            "--speculative-dflash-block-size", "--model-path", "--tp-size", "--dp-size",
            "--context-length"} <= flags
    assert "--no-disable-radix-cache" not in flags and "--no-enable-metrics" not in flags
    assert {"triton", "fa3", "flashinfer"} <= set(choices["--attention-backend"])
    assert {"pytorch", "flashinfer"} <= set(choices["--sampling-backend"])
    assert {"fp8", "unquant"} <= set(choices["--speculative-draft-model-quantization"])
    assert data["flag_aliases"]["--speculative-draft-model"] == "--speculative-draft-model-path"
    assert data["deprecated_flags"]["--cuda-graph-max-bs"] == "--cuda-graph-max-bs-decode"
    assert {"DFLASH", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE",
            "NGRAM"} <= set(data["speculative_algorithms"])
    assert "DFLASH2" not in data["speculative_algorithms"]
    assert "DSPARK" not in data["speculative_algorithms"]  # 0.5.23's, not 0.5.14's
    # 0.5.23 spellings that 0.5.14 does not have
    assert "--speculative-draft-kv-cache-dtype" not in flags
    assert "--speculative-use-block-verification" not in flags


RECIPE = {
    "vllm-0.26.0": {"enable-prefix-caching": False, "enforce-eager": True,
                    "gpu-memory-utilization": 0.3, "max-num-seqs": 8,
                    "compilation-config": {"cudagraph_mode": "FULL_AND_PIECEWISE"},
                    "kv-cache-dtype": "auto"},
    "sglang-0.5.14": {"disable-radix-cache": True, "attention-backend": "triton",
                      "sampling-backend": "pytorch", "mem-fraction-static": 0.2,
                      "max-running-requests": 8, "enable-metrics": True},
}


@pytest.mark.parametrize("name", NEW)
def test_the_gpu_recipe_renders_against_the_list(name):
    check = FlagCheck("recipe", name)
    argv = render_flags(RECIPE[name], engine_cli(name), {}, check)
    assert check.problems == []
    if name.startswith("vllm"):
        assert "--no-enable-prefix-caching" in argv and "--enforce-eager" in argv
    else:
        assert argv[argv.index("--attention-backend") + 1] == "triton"
    check = FlagCheck("recipe", name)
    render_flags({"attention-backend": "no-such-backend"} if name.startswith("sglang")
                 else {"kv-cache-dtype": "fp9"}, engine_cli(name), {}, check)
    assert len(check.problems) == 1  # a value outside the recorded choices


VERSIONED = [p for p in sorted((ROOT / "params" / "profiles").glob("*.yaml"))
             if (load_profile(p).engine_version or "") in ("0.26.0", "0.5.14", "0.33.0",
                                                           "0.5.23")]


@pytest.mark.parametrize("path", VERSIONED, ids=lambda p: p.stem)
def test_profiles_for_the_gpu_versions_validate(path):
    profile = load_profile(path)
    name = f"{profile.engine}-{profile.engine_version}"
    check = FlagCheck(str(path), name)
    render_flags(profile.flags, engine_cli(name), {}, check)
    assert check.problems == []


@pytest.mark.parametrize("name", CHECKED)
def test_the_list_matches_the_engines_own_parser(name):
    """The ground truth: each engine's own parser (built from the same wheel's sources,
    `<name>.parser.json`) registers exactly these flags and these no-value flags."""
    dump = json.loads((CLI_DIR / f"{name}.parser.json").read_text())
    data = engine_cli(name)
    assert dump["wheel_sha256"] == data["wheel_sha256"]
    diff = compare_parser(dump, data)
    assert diff["missing"] == diff["extra"] == []
    assert diff["boolean_missing"] == diff["boolean_extra"] == []
    # Choices computed at run time are not listed, so not enforced: vLLM 0.26.0 appends the
    # pairs of --collect-detailed-traces' modules (vllm/engine/arg_utils.py:1374-1379); 0.33.0
    # adds the platform's device to --mm-processor-device's (`current_platform.device_type`,
    # "cuda" on a GPU, none on the CPU machine the dump was built on); SGLang 0.5.23 builds
    # the parsers' and --kv-canary-real-data's from registries and an environment variable.
    expected = {"vllm-0.26.0": {"--collect-detailed-traces"}, "sglang-0.5.14": set(),
                "vllm-0.33.0": {"--mm-processor-device"},
                "sglang-0.5.23": {"--reasoning-parser", "--tool-call-parser",
                                  "--kv-canary-real-data"}}[name]
    assert set(diff["choices"]) == expected
    for flag in expected:
        assert diff["choices"][flag]["generated"] is None


# ----------------------------------------------------------------------- the real wheels


def wheel_dirs() -> list[Path]:
    dirs = [Path(d) for d in os.environ.get("SPECREPRO_WHEEL_DIR", "").split(os.pathsep) if d]
    home = Path.home() / ".cache" / "specrepro-gpu"
    return dirs + [ROOT / ".cache" / "wheels", home / "vllm" / "wheels",
                   home / "sglang" / "wheels", Path("/tmp/wheels")]


def real_wheel(name: str) -> Path | None:
    wanted = engine_cli(name)["wheel"]
    return next((d / wanted for d in wheel_dirs() if (d / wanted).is_file()), None)


@pytest.mark.parametrize("name", CHECKED)
def test_committed_list_is_the_scripts_output(name):
    wheel = real_wheel(name)
    if wheel is None:
        pytest.skip(f"{engine_cli(name)['wheel']} is in none of {wheel_dirs()}")
    if sha256(wheel) != engine_cli(name)["wheel_sha256"]:
        pytest.skip(f"{wheel} is not the wheel the list was generated from (sha256 differs)")
    assert extract(wheel) == engine_cli(name)


def test_lists_are_found_by_engine_and_version():
    from specrepro.harness.flags import engine_cli_versions

    assert {"0.26.0", "0.33.0"} <= set(engine_cli_versions("vllm"))
    assert {"0.5.14", "0.5.23"} <= set(engine_cli_versions("sglang"))
    assert engine_cli_versions("sglang").index("0.5.14") < engine_cli_versions("sglang").index(
        "0.5.23")
    with pytest.raises(LookupError, match=r"no generated flag list for vllm-0.27.0 "
                                          r"\(there are: vllm-0.26.0, vllm-0.33.0"):
        engine_cli("vllm-0.27.0")
