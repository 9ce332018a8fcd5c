"""The ground truth for the extractors: an installed engine's own parser, dumped, and
compared with a generated list.

Design: `dump_parser` builds the engine's parser where the engine is installed (`DUMPERS`,
one function per engine, importing it) and `parser_actions` writes each action's option
strings; `compare_parser` says which flags a generated list misses or adds.
"""
from __future__ import annotations

import argparse
import sys


def vllm_parser() -> tuple[argparse.ArgumentParser, str]:
    from vllm import __version__ as version
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    return make_arg_parser(FlexibleArgumentParser(prog="vllm serve")), version


def sglang_parser() -> tuple[argparse.ArgumentParser, str]:
    from sglang import __version__ as version
    from sglang.srt.server_args import ServerArgs
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser, version


DUMPERS = {"vllm": vllm_parser, "sglang": sglang_parser}  # engine -> (its parser, version)


def dump_parser(engine: str) -> dict:
    """The engine's own parser (import the installed engine: run where it is installed)."""
    parser, version = DUMPERS[engine]()
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
