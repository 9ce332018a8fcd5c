"""The embedded engine's settings (`EngineConfig`): vLLM's engine arguments where vLLM has
one, plus the knobs of this engine's execution (compile, CUDA graphs, static shapes, weight
layout, profiling).

Design:
- Plain data checked at construction (`__post_init__` names the field, the value and what
  was expected); the server builds one from its command line, tests and benchmarks directly.
- What each execution knob does lives where it acts: graphs.py (CUDA graphs, static shapes),
  compilation.py (compile, compile scope), model.py (weight layout), engine.py (KV budget,
  batching), prefill.py (batched prefill).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WEIGHT_LAYOUTS = ("auto", "k_major", "row_major")
COMPILE_SCOPES = ("step", "layer")


@dataclass
class EngineConfig:
    model_dir: str | None = None
    device: str = "cpu"
    dtype: str = "float32"  # the target's (and the caches') dtype
    quantization: str = "none"  # "none" | "nvfp4" (the target's weights and activations)
    max_num_seqs: int = 8
    max_model_len: int = 4096
    max_num_batched_tokens: int = 512
    # every prefill chunk of a step in one padded pass (prefill.py: faster admission under
    # load; a chunk's numbers then depend on its batch in the last bits); off: one pass each
    batched_prefill: bool = False
    kv_cache_memory_bytes: int | None = None
    speculative: dict | None = None  # vLLM's --speculative-config keys
    max_waiting: int = 256
    seed: int = 0
    # torch.compile: with static shapes the whole decode program (one compile per (bucket, k),
    # then captured), else the target forward and the drafter's calls (dynamic shapes)
    compile: bool = False
    # what torch.compile wraps: "step" (the whole decode program, or the target forward) or
    # "layer" (each decoder layer of the target and the drafter, one compiled code shared by
    # all layers: a deep model compiles one layer's graph per shape instead of an unrolled
    # program of every layer; the CUDA graph still records the whole step)
    compile_scope: str = "step"
    cuda_graphs: bool = True  # capture fixed-shape decode/verify passes on CUDA
    # decode steps as one fixed-shape program (whole-row attention, padded batch buckets);
    # None: on when CUDA graphs are used. True on the CPU runs the graphs' code path eagerly.
    static_shapes: bool | None = None
    kv_len_bucket: int = 64  # attention length rounded up to a multiple (shapes repeat)
    # "auto": K-major linear weights on the CPU in float32 (few-row GEMMs), else as loaded;
    # "k_major" | "row_major" force one
    weight_layout: str = "auto"
    profile: bool = False  # time the forward passes (synchronizing on CUDA)
    num_threads: int | None = None  # torch CPU threads (process-wide); None leaves torch's

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"EngineConfig.dtype={self.dtype!r}, expected one of "
                             f"{sorted(DTYPES)}")
        if self.quantization not in ("none", "nvfp4"):
            raise ValueError(f"EngineConfig.quantization={self.quantization!r}, expected "
                             "'none' or 'nvfp4'")
        if self.compile_scope not in COMPILE_SCOPES:
            raise ValueError(f"EngineConfig.compile_scope={self.compile_scope!r}, expected one "
                             f"of {list(COMPILE_SCOPES)}")
        if self.weight_layout not in WEIGHT_LAYOUTS:
            raise ValueError(f"EngineConfig.weight_layout={self.weight_layout!r}, expected one "
                             f"of {list(WEIGHT_LAYOUTS)}")
        for name in ("max_num_seqs", "max_model_len", "max_num_batched_tokens", "max_waiting"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")
