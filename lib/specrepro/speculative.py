"""The speculative-decoding contract, defined once: method names, `--speculative-config` keys,
the batch-size schedule rule and the embedded server's command line.

Design:
- Every name is vLLM's: a profile's `speculative:` block, the embedded server's
  `--speculative-config` and the harness's rendered argv all speak vLLM's keys, and each
  engine adapter maps them to its engine's spelling (SGLang's algorithms, for one).
- `METHODS` are the methods a profile may name (any engine); `EMBEDDED_METHODS` the ones the
  embedded engine serves. The engine's proposer registry, its config parser, the embedded
  adapter and the profile schema all read these tuples; tests fail when one of them drifts.
- The schedule rule (`check_schedule`, `draft_tokens_at`) is vLLM's
  `num_speculative_tokens_per_batch_size`: `[lo, hi, k]` ranges with inclusive ends, the
  first starting at 1, ascending and not overlapping, k >= 0; a batch size in a gap or past
  the last range takes the previous range's k, and every k is capped at
  `num_speculative_tokens`. The profile schema and the engine both validate with it.
- `SpecConfig` is the embedded engine's reading of `--speculative-config` (vLLM's keys and
  defaults); `SERVER_FLAGS` is the embedded server's command line as data: `serve.py` builds
  its parser from it and the embedded adapter accepts exactly these flags, so the server, the
  adapter and docs/architecture.md ("the embedded server's command line") cannot part.
- Pure Python (no torch, no pydantic): the engine, the parameters and the harness import it.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Methods a profile may name, in vLLM's spelling (vLLM 0.33.0's list; SGLang's adapter maps
# them to its algorithms). The embedded engine serves a subset.
METHODS = ("mtp", "dflash", "draft_model", "ngram", "ngram_gpu", "eagle", "eagle3", "suffix",
           "dspark")
EMBEDDED_METHODS = ("mtp", "dflash", "draft_model", "ngram")
# Methods whose drafts come from trained weights (the others look the context up).
MODEL_METHODS = ("mtp", "dflash", "draft_model")
# `--speculative-config` keys the embedded engine reads (vLLM's names and meanings).
SPEC_KEYS = ("method", "num_speculative_tokens", "num_speculative_tokens_per_batch_size",
             "quantization", "prompt_lookup_min", "prompt_lookup_max", "draft_sample_method",
             "model")
DRAFTER_QUANTIZATIONS = (None, "fp8_per_tensor")  # the embedded engine's drafter precisions
DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")
MAX_DRAFT_TOKENS = 64

Schedule = Sequence[Sequence[int]]


class SpecConfigError(ValueError):
    """A speculative config is invalid; the message names the key."""


# ------------------------------------------------------------------------- the schedule rule


def check_schedule(schedule: Schedule) -> tuple[tuple[int, int, int], ...]:
    """Validate `[[lo, hi, k], ...]` by vLLM's rule; return it as tuples, in its order.
    Raises ValueError naming the first range that breaks the rule."""
    try:
        rows = tuple((int(lo), int(hi), int(k)) for lo, hi, k in schedule)
    except (TypeError, ValueError):
        raise ValueError(f"expected a list of [start, end, k] integer triples, "
                         f"found {schedule!r}") from None
    if not rows:
        raise ValueError("expected at least one [lo, hi, k] range, found an empty list")
    if rows[0][0] != 1:
        raise ValueError(f"expected the first range to start at 1, found {list(rows[0])}")
    for lo, hi, k in rows:
        if lo < 1 or hi < lo:
            raise ValueError(f"expected a range with 1 <= start <= end, found {[lo, hi, k]}")
        if k < 0:
            raise ValueError(f"expected k >= 0, found {[lo, hi, k]}")
    for prev, nxt in itertools.pairwise(rows):
        if nxt[0] <= prev[1]:
            raise ValueError(f"expected ascending ranges that do not overlap, found "
                             f"{list(prev)} and {list(nxt)}")
    return rows


def draft_tokens_at(schedule: Schedule | None, num_speculative_tokens: int,
                    batch_size: int) -> int:
    """Drafts per request at this batch size: the covering range's k (a gap or the tail take
    the previous range's), capped at num_speculative_tokens; no schedule: the fixed k."""
    if not schedule:
        return num_speculative_tokens
    k = schedule[0][2]
    for lo, _hi, kk in schedule:
        if batch_size >= lo:
            k = kk
    return min(k, num_speculative_tokens)


# ------------------------------------------------------- the embedded engine's spec config


@dataclass(frozen=True)
class SpecConfig:
    """`--speculative-config` as the embedded engine reads it, in vLLM's keys."""

    method: str = "none"
    num_speculative_tokens: int = 0
    schedule: tuple[tuple[int, int, int], ...] | None = None  # [[lo, hi, k], ...]
    quantization: str | None = None  # None | "fp8_per_tensor" (the drafter)
    prompt_lookup_min: int = 5
    prompt_lookup_max: int = 5
    draft_sample_method: str = "greedy"  # "greedy" | "probabilistic"
    model: str | None = None  # a drafter directory other than the target's, or a stored name

    @classmethod
    def from_dict(cls, d: dict | None) -> SpecConfig:
        if not d:
            return cls()
        d = {k.replace("-", "_"): v for k, v in d.items()}  # vLLM converts dashes too
        unknown = sorted(set(d) - set(SPEC_KEYS))
        if unknown:
            raise SpecConfigError(f"speculative config: unknown key(s) {unknown}; "
                                  f"expected some of {sorted(SPEC_KEYS)}")
        method = d.get("method", "none") or "none"
        if method not in ("none", *EMBEDDED_METHODS):
            raise SpecConfigError(f"speculative config: method={method!r}, expected one of "
                                  f"{('none', *EMBEDDED_METHODS)}")
        k = d.get("num_speculative_tokens")
        if method != "none" and k is None:
            raise SpecConfigError(f"speculative config: method={method!r} needs "
                                  "num_speculative_tokens")
        k = 0 if method == "none" else k
        if not isinstance(k, int) or k < 0 or k > MAX_DRAFT_TOKENS:
            raise SpecConfigError(f"speculative config: num_speculative_tokens={k!r}, "
                                  f"expected an integer in [0, {MAX_DRAFT_TOKENS}]")
        lo, hi = d.get("prompt_lookup_min"), d.get("prompt_lookup_max")
        lo, hi = (lo or hi or 5), (hi or lo or 5)  # vLLM: both default to 5, one sets the other
        if not (1 <= lo <= hi):
            raise SpecConfigError(f"speculative config: prompt_lookup_min={lo}, "
                                  f"prompt_lookup_max={hi}, expected 1 <= min <= max")
        dsm = d.get("draft_sample_method", "greedy")
        if dsm not in DRAFT_SAMPLE_METHODS:
            raise SpecConfigError(f"speculative config: draft_sample_method={dsm!r}, "
                                  f"expected one of {DRAFT_SAMPLE_METHODS}")
        quant = d.get("quantization")
        if quant not in DRAFTER_QUANTIZATIONS:
            raise SpecConfigError(f"speculative config: quantization={quant!r}, expected null "
                                  "or 'fp8_per_tensor'")
        sched = d.get("num_speculative_tokens_per_batch_size")
        if sched is not None:
            try:
                sched = check_schedule(sched)
            except ValueError as e:
                raise SpecConfigError("speculative config: num_speculative_tokens_per_batch_size: "
                                      f"{e}") from None
        return cls(method, k, sched, quant, lo, hi, dsm, d.get("model"))

    def k_for_batch(self, batch_size: int) -> int:
        """Drafts per request at this batch size (vLLM's dynamic K), capped at k."""
        return draft_tokens_at(self.schedule, self.num_speculative_tokens, batch_size)


# --------------------------------------------------------- the embedded server's command line


def model_length(text: str) -> int:
    """vLLM's --max-model-len syntax: 4096, 4k (x1000), 4K (x1024)."""
    scale = {"k": 1000, "K": 1024, "m": 10**6, "M": 2**20}.get(text[-1:], 1)
    try:
        return int(float(text[:-1] if scale > 1 else text) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a length: {text!r}") from None


def json_object(text: str) -> dict:
    """A JSON object argument; dashed keys become underscored, as vLLM accepts them."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return {k.replace("-", "_"): v for k, v in value.items()}


def port(text: str) -> int:
    """A TCP port, 0-65535 (0: a free one)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: expected 0-65535 "
                                         "(0 picks a free one)")
    return value


def positive_bytes(text: str) -> int:
    """A byte count of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of bytes >= 1")
    return value


def nonempty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is empty")
    return text


# (option strings, argparse keywords). The embedded server mirrors `vllm serve`.
SERVER_FLAGS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("--model",), dict(default="models/embedded",
                        help="checkpoint directory (default: %(default)s, the shipped checkpoint,"
                             " from the repository root)")),
    (("--served-model-name",), dict(type=nonempty, default=None,
                                    help="model id (default: the --model folder's name, "
                                         "`embedded`; the server answers to --model too)")),
    (("--host",), dict(default="127.0.0.1")),
    (("--port",), dict(type=port, default=8000, help="0 picks a free port")),
    (("--api-key",), dict(type=nonempty, default=None,
                          help="as vLLM's: every /v1 request must send `Authorization: Bearer "
                               "KEY` (401 otherwise); /health, /version and /metrics stay "
                               "open")),
    (("--device",), dict(choices=("cpu", "cuda"), default="cpu")),
    (("--dtype",), dict(choices=("float32", "bfloat16"), default="float32")),
    (("--quantization",), dict(choices=("none", "nvfp4"), default="none",
                               help="the target's weights and activations")),
    (("--max-num-seqs",), dict(type=int, default=8, help="request slots")),
    (("--max-model-len",), dict(type=model_length, default=4096)),
    (("--max-num-batched-tokens",), dict(type=int, default=512)),
    (("--batched-prefill",), dict(action="store_true",
                                  help="prefill every chunk of a step in one padded pass "
                                       "(default: one pass per request, batch-invariant)")),
    (("--kv-cache-memory-bytes",), dict(type=positive_bytes, default=None,
                                        help="KV budget in bytes; the target's and the "
                                             "drafter's caches draw from it")),
    (("--speculative-config", "-sc"), dict(type=json_object, default=None,
                                           help="speculative decoding, a JSON object in vLLM's "
                                                "keys: " + ", ".join(SPEC_KEYS)
                                                + " (examples below; default: none)")),
    (("--max-waiting",), dict(type=int, default=256,
                              help="waiting-queue bound; a request past it gets 503")),
    (("--seed",), dict(type=int, default=0)),
    (("--compile",), dict(action=argparse.BooleanOptionalAction, default=False)),
    (("--compile-scope",), dict(choices=("step", "layer"), default="step",
                                help="what --compile wraps: the whole decode step, or each "
                                     "decoder layer (one layer's compile time for a deep "
                                     "model; the CUDA graph still records the whole step)")),
    (("--threads",), dict(type=int, default=None,
                          help="torch CPU threads (default: 1 on --device cpu, where the tiny "
                               "model's kernels are microseconds long and OpenMP waits cost "
                               "more than a second thread saves; torch's default on cuda)")),
    (("--log-file",), dict(default=None)),
    (("--per-request-spec-decode-metrics",), dict(choices=("none", "summary"), default="none",
                                                  help="add metrics.speculative_decoding to "
                                                       "responses")),
    (("--default-chat-template-kwargs",), dict(type=json_object, default=None)),
    (("--profile-dir",), dict(default=None,
                              help="where POST /start_profile and /stop_profile write a "
                                   "torch.profiler trace of the engine thread (Chrome JSON), "
                                   "as vLLM's --profiler-config torch_profiler_dir; the two "
                                   "endpoints exist only with it")),
)


def server_flag_names() -> list[str]:
    """Every long option the embedded server accepts (a boolean one with its --no- form)."""
    names = []
    for options, kw in SERVER_FLAGS:
        long = options[0]
        names.append(long)
        if kw.get("action") is argparse.BooleanOptionalAction:
            names.append("--no-" + long[2:])
    return names


def server_flag_default(name: str) -> Any:
    """A server flag's default value (`--max-model-len` -> 4096)."""
    return next(kw.get("default") for options, kw in SERVER_FLAGS if options[0] == name)


def server_flag_choices() -> dict[str, list[str]]:
    """The flags with a closed set of values, and those values."""
    return {options[0]: list(kw["choices"]) for options, kw in SERVER_FLAGS if "choices" in kw}


# One `--speculative-config` per method the embedded engine serves, for `specrepro serve --help`
# (tests/test_contract.py parses each with SpecConfig).
SPEC_CONFIG_EXAMPLES: tuple[tuple[str, str], ...] = (
    ("MTP head (EAGLE-style), 3 drafts", '{"method": "mtp", "num_speculative_tokens": 3}'),
    ("block drafter, 7 drafts", '{"method": "dflash", "num_speculative_tokens": 7}'),
    ("light block drafter, 5 drafts",
     '{"method": "dflash", "model": "dflash_light", "num_speculative_tokens": 5}'),
    ("draft model, 5 drafts", '{"method": "draft_model", "num_speculative_tokens": 5}'),
    ("n-gram lookup, 3 drafts",
     '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'),
    ("block drafter, 7 drafts up to 12 streams and 3 beyond",
     '{"method": "dflash", "num_speculative_tokens": 7, '
     '"num_speculative_tokens_per_batch_size": [[1, 12, 7], [13, 512, 3]]}'),
)


def spec_config_epilog() -> str:
    """`--speculative-config` examples, one per method, as help text."""
    lines = ["--speculative-config examples:"]
    for what, cfg in SPEC_CONFIG_EXAMPLES:
        lines += [f"  {what}:", f"    -sc '{cfg}'"]
    return "\n".join(lines)


def add_server_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the embedded server's flags to a parser (serve.py's is built this way)."""
    for options, kw in SERVER_FLAGS:
        parser.add_argument(*options, **kw)
    return parser
