"""A profile's engine flags: checked against what the engine version accepts, rendered to argv.

Design:
- Flags are data (`profile.flags`), rendered to an argv list, never a shell string
  (`render_flags`): true → the bare flag, false → its `--no-` form (or nothing for a
  store_true flag), a mapping → compact JSON, a list → one value per item (nargs), anything
  else → its text. How a key is spelled as a flag is the engine's fact: `render_flags` asks
  the adapter's `flag_name` (`EngineAdapter.flag_separator`: `--max-num-seqs` for every
  engine here, `--max_num_seqs` for one whose flags join their words with `_`).
- Every vLLM/SGLang flag, speculative-config key and method value is checked against the
  lists `scripts/extract_engine_cli.py` generated from the real wheels (`engine_cli/*.json`,
  read by `engine_cli`); the embedded engine's list is its server's command line
  (`specrepro.speculative.SERVER_FLAGS`). A wrong one fails as a `ParamsError` naming the
  profile file and the flag, with the closest valid name; `FlagCheck` collects every
  problem of one profile so the error lists them all at once.
- Flags the adapter derives from profile fields (model, port, parallelism, speculation) are
  `reserved`: they may not also appear in `flags`.
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from specrepro.params import ParamsError, Problem, Profile


def engine_cli_versions(engine: str) -> list[str]:
    """The versions of one engine that have a generated list (`vllm` → ["0.26.0", "0.33.0"])."""
    folder = resources.files("specrepro.harness").joinpath("engine_cli")
    names = (p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")
             and not p.name.endswith(".parser.json"))
    versions = [n.removeprefix(f"{engine}-") for n in names if n.startswith(f"{engine}-")]
    return sorted(versions, key=lambda v: [(int(x), "") if x.isdigit() else (-1, x)
                                           for x in v.split(".")])


@functools.cache
def engine_cli(name: str) -> dict:
    """The generated list of what one engine version accepts (engine_cli/<name>.json, e.g.
    `vllm-0.26.0`); a version without one fails naming those there are."""
    path = resources.files("specrepro.harness").joinpath("engine_cli", f"{name}.json")
    if not path.is_file():
        engine = name.split("-")[0]
        known = ", ".join(f"{engine}-{v}" for v in engine_cli_versions(engine)) or "none"
        raise LookupError(f"no generated flag list for {name} (there are: {known}); "
                          "scripts/extract_engine_cli.py makes one from the engine's wheel")
    return json.loads(path.read_text())


def profile_file(profile: Profile, source: str | Path | None = None) -> str:
    """The file to name in an error: the given source, else the profile's conventional path."""
    if source is not None:
        return str(source)
    return str(getattr(profile, "source", None) or f"params/profiles/{profile.name}.yaml")


FLAG_SEPARATORS = ("-", "_")  # how an engine's flags join their words


def flag_name(key: str, separator: str = "-") -> str:
    """`gpu-memory-utilization`, `--gpu-memory-utilization` or `gpu_memory_utilization` →
    `--gpu-memory-utilization`, its words joined by the engine's `separator` (`_`:
    `--gpu_memory_utilization`)."""
    if separator not in FLAG_SEPARATORS:
        raise ValueError(f"flag separator {separator!r}: expected one of {FLAG_SEPARATORS}")
    other = FLAG_SEPARATORS[1 - FLAG_SEPARATORS.index(separator)]
    return "--" + key.lstrip("-").replace(other, separator)


def _suggest(found: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(found, valid, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


@dataclass
class FlagCheck:
    """Collects every problem of one profile's argv so the error lists them all at once."""

    file: str
    what: str  # "vLLM 0.33.0"
    problems: list[Problem] = field(default_factory=list)

    def fail(self, key: str, message: str) -> None:
        self.problems.append(Problem(self.file, key, message))

    def raise_if_any(self) -> None:
        if self.problems:
            raise ParamsError(self.problems)

    def one_of(self, key: str, found: Any, valid: list[str], what: str) -> bool:
        if found in valid:
            return True
        self.fail(key, f"expected {what} {self.what} accepts, found {found!r}"
                       f"{_suggest(str(found), valid)}")
        return False


def render_flags(flags: dict[str, Any], accepted: dict, reserved: dict[str, str],
                 check: FlagCheck, spell: Callable[[str], str] = flag_name) -> list[str]:
    """profile.flags → argv: true → bare flag, false → `--no-flag` (or nothing for a
    store_true flag), a mapping → compact JSON, a list → one value per item (nargs),
    anything else → its text. Each flag and each listed choice is checked. `spell`: how
    the engine spells a key as a flag (its adapter's `flag_name`)."""
    known, choices = set(accepted["flags"]), accepted.get("flag_choices", {})
    argv: list[str] = []
    for key, value in flags.items():
        name, where = spell(key), f"flags.{key}"
        if name in reserved:
            check.fail(where, f"expected it from the profile's {reserved[name]}, found it in flags")
            continue
        if not check.one_of(where, name, sorted(known), "a flag"):
            continue
        if value is None:
            continue
        if value is True:
            argv.append(name)
        elif value is False:
            negated = spell("no-" + name[2:])
            argv += [negated] if negated in known else []
        elif isinstance(value, dict):
            argv += [name, json.dumps(value, separators=(",", ":"))]
        elif isinstance(value, list):
            argv += [name, *(str(v) for v in value)]
        else:
            if name in choices:
                check.one_of(where, str(value), choices[name], f"a value of {name}")
            argv += [name, str(value)]
    return argv


def model_flags(profile: Profile, tp_flag: str, dp_flag: str) -> list[str]:
    """Revision, served name, address and the engine's own parallelism flags."""
    argv = []
    if profile.model.revision:
        argv += ["--revision", profile.model.revision]
    if profile.model.served_name:
        argv += ["--served-model-name", profile.model.served_name]
    argv += ["--host", profile.host, "--port", str(profile.port)]
    if profile.parallel.tensor_parallel_size > 1:
        argv += [tp_flag, str(profile.parallel.tensor_parallel_size)]
    if profile.parallel.data_parallel_size > 1:
        argv += [dp_flag, str(profile.parallel.data_parallel_size)]
    return argv
