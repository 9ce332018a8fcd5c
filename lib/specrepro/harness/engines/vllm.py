"""vLLM (`vllm serve`): its flags, routes, startup-log lines, metric names and histograms.

Design: `VLLMAdapter` renders `vllm serve MODEL …` checked against the generated flag list
of the profile's engine_version (harness/engine_cli/vllm-*.json, extracted from the
wheels by specrepro.tools.extract_engine_cli); the speculative settings go into one
`--speculative-config` JSON, the drafter as its model/revision. Its facts are read from vLLM's own code (paths in the
0.26.0 wheel, cited beside each): `/health` and `/version` (`ROUTES`), the startup lines
(`VLLM_LOG`), the `vllm:*` counters and latency histograms (`VLLM_METRICS`); acceptance
is the base adapter's, from its counters. The embedded engine (embedded.py) mirrors it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from specrepro.harness.engine_http import Routes
from specrepro.harness.engines.base import EngineAdapter, Probe
from specrepro.harness.flags import FlagCheck, model_flags, profile_file, render_flags
from specrepro.harness.loadgen import RequestFeatures
from specrepro.harness.promtext import MetricNames
from specrepro.harness.startup_log import LogFact
from specrepro.params import Profile

# vLLM 0.26.0 and 0.33.0: /health is 200 once the engine is up; /version {"version"}
ROUTES = Routes(("/health",), ("/version",))

# vLLM 0.26.0 (paths in its wheel); 0.33.0 prints the KV lines as one line, matched alike.
VLLM_LOG = (
    LogFact("kv_pool_tokens", r"GPU KV cache size: ([\d,]+) tokens"),  # kv_cache_utils.py:2177
    LogFact("max_concurrency", r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x"),
    LogFact("tokens_per_request", r"Maximum concurrency for ([\d,]+) tokens per request"),
    LogFact("attention_backend",  # platforms/cuda.py:482; an explicit choice, cuda.py:422
            r"Using (\w+) attention backend out of potential backends"),
    LogFact("attention_backend", r"Using (?:AttentionBackendEnum\.)?(\w+) backend\."),
    LogFact("kernels.flash_attn_version", r"Using FlashAttention version (\d+)"),  # flash_attn.py:776
    LogFact("kernels.model_runner", r"Using (V2) Model Runner"),  # v1/worker/gpu_worker.py:378
    LogFact("kernels.model_runner", r"using the (V1) model runner"),  # config/vllm.py:585
    LogFact("kernels.sampler",  # v1/sample/ops/topk_topp_sampler.py:39-63
            r"(FlashInfer top-p/top-k sampling (?:disabled|unavailable)[^.;]*)"),
    LogFact("kernels.cuda_graphs", r"(Cudagraph is disabled under eager mode)"),  # config/vllm.py:1392
    LogFact("kernels.cuda_graphs",  # v1/worker/gpu_model_runner.py:6845
            r"Graph capturing finished in (\d+ secs, took [\d.]+ GiB)"),
    # the target's precision as the engine runs it (notebook 03): the FP8 GEMM kernel it
    # chose ("Selected CutlassFP8ScaledMMLinearKernel for Fp8LinearMethod"), the NVFP4 GEMM
    # ("Using FlashInferCutlassNvFp4LinearKernel for NVFP4 GEMM") and the Marlin fallback
    # a GPU without FP4 tensor cores (Hopper) takes: article B's "zero Marlin" check turned
    # around. Lines as vLLM 0.2x logs print them elsewhere; no 0.26.0 log of ours has them yet
    LogFact("kernels.fp8_linear", r"Selected (\w+ScaledMMLinearKernel) for \w+"),
    LogFact("kernels.fp4_gemm", r"Using (\w+) for NVFP4 GEMM"),
    LogFact("kernels.fp4_marlin",
            r"(Weight-only FP4 compression will be used leveraging the Marlin kernel)"),
    # where a start's time goes (a start is half a GPU lease): the target's
    # weights, every torch.compile (target and drafter, each its own line), the graphs,
    # and the engine core's whole init (profile, KV cache, compile and capture)
    LogFact("phases.model_loading",  # v1/worker/gpu/model_runner.py:305
            r"Model loading took ([\d.]+ GiB and [\d.]+ seconds)"),
    LogFact("phases.torch_compile", r"torch.compile took ([\d.]+ s) in total"),  # monitor.py:53
    LogFact("phases.torch_compile_last", r"torch.compile took ([\d.]+ s) in total", last=True),
    LogFact("phases.graph_capture",  # v1/worker/gpu/model_runner.py:747
            r"Graph capturing finished in (\d+ secs)"),
    LogFact("phases.init_engine",  # v1/engine/core.py:340
            r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+ s"
            r"(?: \(compilation: [\d.]+ s\))?)"),
)

# field -> scraped sample name; counters end in _total (tests/fixtures/engines/vllm-0.26.0)
VLLM_METRICS = MetricNames(
    family="vllm",
    counters={
        "num_drafts": "vllm:spec_decode_num_drafts_total",
        "num_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
        "num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
        "accepted_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        "generation_tokens": "vllm:generation_tokens_total",
        "prompt_tokens": "vllm:prompt_tokens_total",
        "prompt_tokens_cached": "vllm:prompt_tokens_cached_total",
        "num_preemptions": "vllm:num_preemptions_total",
        "request_success": "vllm:request_success_total",
        "requests_running": "vllm:num_requests_running",
        "requests_waiting": "vllm:num_requests_waiting",
        "kv_usage": "vllm:kv_cache_usage_perc",
        "kv_pool_tokens": "vllm:cache_config_info",
    },
    # phase -> histogram (v1/metrics/loggers.py)
    histograms={"queue": "vllm:request_queue_time_seconds",
                "prefill": "vllm:request_prefill_time_seconds",
                "decode": "vllm:request_decode_time_seconds",
                "ttft": "vllm:time_to_first_token_seconds",
                "itl": "vllm:inter_token_latency_seconds",
                "e2e": "vllm:e2e_request_latency_seconds"},
    lost_without=("acceptance (num_drafts, num_draft_tokens, num_accepted_tokens, "
                  "acceptance_length, draft_acceptance_rate, per_position_acceptance, step_ms), "
                  "the counter check (counters_consistent) and the KV pool where the startup "
                  "log lacks it"),
)


class VLLMAdapter(EngineAdapter):
    """`vllm serve MODEL …`, flags checked against the generated list of the profile's
    engine_version (vLLM 0.26.0 or 0.33.0; 0.33.0 where no list was generated)."""

    kind = "vllm"
    cli = "vllm-0.33.0"
    what = "vLLM 0.33.0"
    routes = ROUTES
    log_facts = VLLM_LOG
    metrics = VLLM_METRICS
    # its OpenAI server streams usage per chunk and returns token ids
    request_features = RequestFeatures(continuous_usage_stats=True, return_token_ids=True)
    reserved: ClassVar[dict[str, str]] = {"--model": "model.id", "--revision": "model.revision",
                "--served-model-name": "model.served_name", "--host": "host", "--port": "port",
                "--tensor-parallel-size": "parallel", "--data-parallel-size": "parallel",
                "--speculative-config": "speculative", "--spec-method": "speculative",
                "--spec-model": "speculative", "--spec-tokens": "speculative"}
    # request slots and tokens: counts (vLLM's defaults follow the GPU: engine-notes.md)
    positive_flags = ("--max-num-seqs", "--max-model-len", "--max-num-batched-tokens")
    context_flag = "--max-model-len"  # unset: the model's max_position_embeddings
    # Methods that read a separate checkpoint: the profile's drafter.
    drafter_methods = ("dflash", "draft_model", "eagle", "eagle3", "dspark")
    # --profiler-config (vllm/config/profiler.py: `profiler` "torch" and an absolute
    # `torch_profiler_dir`; it is left out of the compile cache's hash); the worker's trace
    # holds CPU and GPU events, the front end's a CPU trace of its own
    profiling: ClassVar[dict[str, dict]] = {
        "flags": {"profiler-config": {"profiler": "torch", "torch_profiler_dir": "{dir}"}}}

    detect_rank = 1

    def answers_as(self, probe: Probe) -> bool:
        """Its `/version` answers {"version": ...}."""
        body = probe.json(self.routes.version[0])
        return isinstance(body, dict) and body.get("version") is not None

    def render_argv(self, profile: Profile, source: str | Path | None = None) -> list[str]:
        accepted, what = self.flag_list(profile)
        check = FlagCheck(profile_file(profile, source), what)
        argv = [*self.command(profile), profile.model.id]
        argv += self.model_flags(profile)
        if profile.speculative is not None:
            spec = self.speculative_config(profile, accepted, check)
            argv += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
        if any(self.flag_name(k) == "--disable-log-stats" and v
               for k, v in profile.flags.items()):
            check.fail("flags.disable-log-stats", "expected the engine's metrics on (the harness "
                       "reads acceptance from them), found disable-log-stats, which removes them")
        self.check_compilation(profile, accepted, check)
        argv += render_flags(profile.flags, accepted, self.reserved, check,
                              spell=self.flag_name)
        check.raise_if_any()
        return argv

    def model_flags(self, profile: Profile) -> list[str]:
        return model_flags(profile, "--tensor-parallel-size", "--data-parallel-size")

    def speculative_config(self, profile: Profile, accepted: dict, check: FlagCheck) -> dict:
        """The `--speculative-config` JSON: the profile's keys, the drafter as model/revision."""
        spec = profile.speculative.model_dump(mode="json", exclude_none=True)
        if spec["method"] in self.drafter_methods and "model" not in spec:
            if profile.drafter is None:
                check.fail("drafter", f"expected a drafter checkpoint for method "
                                      f"{spec['method']!r}, found none")
            else:
                spec["model"] = profile.drafter.id
                if profile.drafter.revision:
                    spec["revision"] = profile.drafter.revision
        for key, value in spec.items():
            where = f"speculative.{key}"
            if not check.one_of(where, key, accepted["speculative_config_keys"],
                                "a --speculative-config key"):
                continue
            if key == "method":
                check.one_of(where, value, accepted["speculative_methods"], "a speculative method")
            elif key == "quantization":
                check.one_of(where, value, accepted["quantization_methods"], "a quantization method")
            elif key in accepted["speculative_config_choices"]:
                check.one_of(where, value, accepted["speculative_config_choices"][key],
                             f"a value of {key}")
        return spec

    def check_compilation(self, profile: Profile, accepted: dict, check: FlagCheck) -> None:
        """`compilation-config` keys and its cudagraph_mode (case-insensitive in vLLM)."""
        for key, value in profile.flags.items():
            if self.flag_name(key) != "--compilation-config" or not isinstance(value, dict):
                continue
            for sub, sub_value in value.items():
                where = f"flags.{key}.{sub}"
                if check.one_of(where, sub, accepted["compilation_config_keys"],
                                "a compilation-config key") and sub == "cudagraph_mode":
                    check.one_of(where, str(sub_value).upper(), accepted["cudagraph_modes"],
                                 "a cudagraph_mode")
