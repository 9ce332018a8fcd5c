"""The embedded engine (`python -m specrepro.embedded.serve`): it mirrors `vllm serve`.

Design: `EmbeddedAdapter` is the vLLM adapter with the embedded server's command line.
Its flags, their closed choices, its `--speculative-config` keys, methods and drafter
precisions are read from `specrepro.speculative`, the contract its server's parser is
built from (docs/architecture.md, "the embedded server's command line"), so the two
cannot part. It answers vLLM's routes, prints vLLM's startup lines and exposes vLLM's
metric names (all inherited from vllm.py); what is its own is the CPU-threads flag, the
profiler's folder and the version string attach.py recognises it by (`VERSION_MARK`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from specrepro import speculative
from specrepro.harness.engines.base import Probe
from specrepro.harness.engines.vllm import VLLMAdapter
from specrepro.harness.flags import FlagCheck, profile_file, render_flags
from specrepro.params import Profile


class EmbeddedAdapter(VLLMAdapter):
    """`python -m specrepro.embedded.serve --model DIR …`: it mirrors `vllm serve`.

    Its flags, their closed choices, its `--speculative-config` keys, methods and drafter
    precisions are read from `specrepro.speculative`, the contract its server's parser is
    built from (docs/architecture.md, "the embedded server's command line"); it prints
    vLLM's startup lines and exposes vLLM's metric names.
    """

    kind = "embedded"
    what = "the embedded engine"
    VERSION_MARK = "specrepro-embedded"  # in its /version: how an attached one is told apart
    detect_rank = 0  # before vLLM's, whose /version it shares

    def answers_as(self, probe: Probe) -> bool:
        """vLLM's `/version`, naming the embedded engine."""
        body = probe.json(self.routes.version[0])
        return super().answers_as(probe) and self.VERSION_MARK in str(body.get("version"))
    threads_flag = "--threads"
    profiling: ClassVar[dict[str, dict]] = {"flags": {"profile-dir": "{dir}"}}
    # embedded/config.EngineConfig refuses each below 1 at start; speculative.SpecConfig
    # refuses more drafts than MAX_DRAFT_TOKENS; it loads a local checkpoint folder only
    positive_flags = ("--max-num-seqs", "--max-model-len", "--max-num-batched-tokens",
                      "--max-waiting")
    max_draft_tokens = speculative.MAX_DRAFT_TOKENS
    local_model = True

    def default_context(self) -> int | None:
        """Its server's `--max-model-len` default (speculative.SERVER_FLAGS)."""
        return speculative.server_flag_default("--max-model-len")

    def cpu_threads(self, profile: Profile) -> int | None:
        """The profile's `threads`, else the server's own default: 1 on the CPU device
        (serve.engine_threads), torch's on cuda (as many as it is given)."""
        for key, value in profile.flags.items():
            if self.flag_name(key) == self.threads_flag and value is not None:
                return int(value)
        device = next((v for k, v in profile.flags.items()
                       if self.flag_name(k) == "--device"), "cpu")
        return 1 if device == "cpu" else None

    def render_argv(self, profile: Profile, source: str | Path | None = None) -> list[str]:
        accepted = {"flags": speculative.server_flag_names(),
                    "flag_choices": speculative.server_flag_choices()}
        check = FlagCheck(profile_file(profile, source), self.what)
        if profile.parallel.tensor_parallel_size > 1 or profile.parallel.data_parallel_size > 1:
            check.fail("parallel", "expected 1 and 1 (the embedded engine has no tensor or data "
                                   f"parallelism), found {profile.parallel.model_dump()}")
        argv = [*self.command(profile), "--model", profile.model.id]
        if profile.model.served_name:
            argv += ["--served-model-name", profile.model.served_name]
        argv += ["--host", profile.host, "--port", str(profile.port)]
        if profile.speculative is not None:
            spec = profile.speculative.model_dump(mode="json", exclude_none=True)
            for key, value in spec.items():
                if check.one_of(f"speculative.{key}", key, list(speculative.SPEC_KEYS),
                                "a --speculative-config key") and key == "method":
                    check.one_of("speculative.method", value, list(speculative.EMBEDDED_METHODS),
                                 "a method")
            if spec.get("quantization") not in speculative.DRAFTER_QUANTIZATIONS:
                valid = " or ".join("null" if q is None else repr(q)
                                    for q in speculative.DRAFTER_QUANTIZATIONS)
                check.fail("speculative.quantization", f"expected {valid}, "
                                                       f"found {spec['quantization']!r}")
            argv += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
        argv += render_flags(profile.flags, accepted, self.reserved, check,
                              spell=self.flag_name)
        check.raise_if_any()
        return argv
