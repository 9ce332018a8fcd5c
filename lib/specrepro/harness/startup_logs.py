"""What each engine's startup log says, as tables of patterns: the KV pool, the request
slots, the attention backend and the kernels it chose (process.StartupInfo).

Design: one tuple of `process.LogFact` per engine family, read by `process.parse_log`; an
adapter (engines.py) names its table. Each pattern cites where the engine prints the line
(paths in its wheel) or, where no log of ours has the line yet, says so. Several facts may
fill one field: the first that matches does.
"""
from __future__ import annotations

from specrepro.harness.process import LogFact, StartupInfo, parse_log

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
)
# SGLang 0.5.14: the scheduler's capacity line (managers/scheduler.py:936) is printed after
# any reset of max_running_requests, so the last wins; the rest is its server_args line.
SGLANG_LOG = (
    LogFact("kv_pool_tokens", r"max_total_num_tokens=(\d+)", last=True),
    LogFact("max_running_requests", r"max_running_requests=(\d+), context_len", last=True),
    LogFact("max_concurrency", r"max_running_requests=(\d+), context_len", last=True),
    LogFact("tokens_per_request", r"max_running_requests=\d+, context_len=(\d+)", last=True),
    LogFact("attention_backend", r"server_args=ServerArgs\(.*?, attention_backend='([\w-]+)'"),
    LogFact("kernels.decode_attention_backend", r", decode_attention_backend='([\w-]+)'"),
    LogFact("kernels.prefill_attention_backend", r", prefill_attention_backend='([\w-]+)'"),
    LogFact("kernels.sampling_backend", r", sampling_backend='([\w-]+)'"),
    LogFact("kernels.draft_attention_backend",  # speculative/dflash_worker_v2.py:195
            r"draft runner\. attention_backend=([\w-]+)"),
    LogFact("kernels.draft_attention_backend", r", speculative_draft_attention_backend='([\w-]+)'"),
    LogFact("kernels.cuda_graph_decode",
            r"cuda_graph_config=CudaGraphConfig\(decode=PhaseConfig\(backend='(\w+)'"),
    LogFact("kernels.kv_cache_dtype", r"KV Cache is allocated\. dtype: ([\w.]+)"),  # memory_pool.py:1023
)
def parse_vllm_log(text: str) -> StartupInfo:
    return parse_log(text, VLLM_LOG)


def parse_sglang_log(text: str) -> StartupInfo:
    return parse_log(text, SGLANG_LOG)
