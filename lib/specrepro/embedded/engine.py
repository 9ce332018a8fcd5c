"""The engine core: request slots, a KV budget, a waiting queue and continuous batching.

Design:
- Slots. The target's `SlotKVCache` holds one contiguous row per request slot
  (`max_num_seqs` rows, plus one scratch row that padded batch rows write to on CUDA).
  Rollback of rejected drafts is by length: the engine keeps each slot's length and stale
  entries past it are overwritten before any query reads them (model.py).
- KV budget. `kv_cache_memory_bytes` divided by the bytes one context token costs (the
  target's K and V **plus the drafter's own caches**, `Proposer.kv_bytes_per_token()`) gives
  the pool in tokens, so a drafter costs context capacity. Without a budget the pool is
  `max_num_seqs * max_model_len`. Admission reserves a request's worst case, prompt +
  max_tokens, against the pool and never preempts: a request that does not fit waits
  (first come, first served, no overtaking). A memory-matched configuration with many slots
  therefore runs as many requests as its tokens allow, a slot-limited one as many as its
  slots allow. Accounting is by tokens, as a paged cache would be; the contiguous rows
  themselves are allocated for `max_model_len` each.
- A step: admit waiting requests into free slots; prefill chunks (one target pass per
  prefilling request, `max_num_batched_tokens` per step shared with the decode rows, the
  final chunk samples the first token); then one speculative step (spec.py) for every
  request that was decoding when the step began.
- The step is batched: rows are gathered into [B] tensors once, the stages run on tensors
  and one `.tolist()` brings the accepted tokens back. A row's output does not depend on its
  batch: drafts are padded after real tokens (invisible under causal attention), sampling
  draws from each request's own `torch.Generator`, quantization scales are static.
- Speed: the attention length is rounded up to a bucket so shapes repeat; `compile=True`
  wraps the target forward in `torch.compile`.
- Static decode (`static_shapes`, on by default wherever CUDA graphs are): a decode step's
  propose -> verify -> observe and greedy acceptance run as one tensor program
  (`spec.draft_verify_observe`) at fixed shapes: the batch padded to a power-of-two bucket
  with the scratch slot, every attention (target and drafter) over whole cache rows under the
  causal mask, no host read inside. On CUDA each (batch bucket, k) the engine can meet is
  captured in a CUDA graph at start-up (a timed region never captures), checked against an
  eager run of the same inputs, and replayed; a capture that fails falls back, with a printed
  warning, to a capture without cuDNN attention and then to the same program run eagerly.
  One host read per step brings back [B, k+3] (drafts, acceptance, next token).
- Weight layout (`weight_layout`, CPU fp32 by default): linear weights are stored K-major
  (column-major [out, in], i.e. [in, out] contiguous) so `F.linear` hands MKL its NN layout,
  which is faster for the few-row GEMMs of decoding: on one core of the 2-core dev machine,
  the target's 43 GEMMs at 8 rows took 2.3-2.5 ms K-major against 3.8-4.0 ms row-major
  (1 row: 1.9-2.3 ms either way), and a compiled 8-token target pass 1.27-1.38x a 1-token one
  against 1.66x. Under the shared machine's load whole passes moved by more than that
  (scripts/bench_weight_layout.py; docs/bench). Same values, same shapes; bf16 (AMX)
  gains nothing, so only fp32 on the CPU switches, and fake-quantized layers keep theirs
  (their rounding to the FP4/FP8 grid would turn the other summation order into flipped
  codes: `relayout_linear_weights`).
- Eager passes of varying shape on CUDA (prefill chunks, the staged fallback) exclude cuDNN
  attention: SDPA may pick it on Hopper, and it builds a cuDNN graph (tens of milliseconds)
  for every new shape, which made every eager drafter call on the H200 cost that much.

The engine knows nothing of HTTP or text: it takes and returns token ids (serve.py bridges).
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specrepro.embedded import spec as spec_mod
from specrepro.embedded.sampling import (
    SamplingParams,
    SamplingTensors,
    make_generator,
    sample,
    warp,
)
from specrepro.embedded.spec import DecodeBatch, SpecConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FINISH_REASONS = ("stop", "length", "abort")
WEIGHT_LAYOUTS = ("auto", "k_major", "row_major")
# torch.compile keys its cache by code object: every engine's decode program shares one, and
# each (batch bucket, k) is a recompilation. Past dynamo's default limit (8) it silently runs
# eagerly, so a benchmark's later engines would be measured uncompiled.
RECOMPILE_LIMIT = 256

# A fixed text for the activation-scale calibration of quantized layers (NVFP4 target, FP8
# drafter): some arithmetic, some code and some prose, like the model's training mix.
CALIBRATION_TEXT = (
    "Question: A baker makes 24 muffins in the morning and 18 in the afternoon. She sells 35 "
    "of them and gives 2 to a neighbour. How many muffins are left?\nAnswer: She made 24 + 18 "
    "= <<24+18=42>>42 muffins. She sold or gave away 35 + 2 = <<35+2=37>>37. So 42 - 37 = "
    "<<42-37=5>>5 muffins are left.\n#### 5\n\n"
    "def moving_average(values, window):\n    \"\"\"Return the mean of each window of values.\"\"\"\n"
    "    if window <= 0:\n        raise ValueError('window must be positive')\n    out = []\n"
    "    for i in range(len(values) - window + 1):\n        out.append(sum(values[i:i + window])"
    " / window)\n    return out\n\n"
    "The river rises in the hills to the north of the town and flows south through a wide "
    "valley of farms and orchards . In the nineteenth century a canal was cut beside it , and "
    "the mills that grew along its banks employed most of the people of the district .\n"
)


class QueueFullError(RuntimeError):
    """The waiting queue holds `max_waiting` requests already."""


class PromptTooLongError(ValueError):
    """A request can never fit: its prompt (+ max_tokens) exceeds the context or the KV pool."""


@dataclass
class EngineConfig:
    model_dir: str | None = None
    device: str = "cpu"
    dtype: str = "float32"  # the target's (and the caches') dtype
    quantization: str = "none"  # "none" | "nvfp4" (the target's weights and activations)
    max_num_seqs: int = 8
    max_model_len: int = 4096
    max_num_batched_tokens: int = 512
    kv_cache_memory_bytes: int | None = None
    speculative: dict | None = None  # vLLM's --speculative-config keys
    max_waiting: int = 256
    seed: int = 0
    # torch.compile: with static shapes the whole decode program (one compile per (bucket, k),
    # then captured), else the target forward and the drafter's calls (dynamic shapes)
    compile: bool = False
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
        if self.weight_layout not in WEIGHT_LAYOUTS:
            raise ValueError(f"EngineConfig.weight_layout={self.weight_layout!r}, expected one "
                             f"of {list(WEIGHT_LAYOUTS)}")
        for name in ("max_num_seqs", "max_model_len", "max_num_batched_tokens", "max_waiting"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 16
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False


@dataclass
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_spec_steps: int
    num_accepted_draft_tokens: int
    num_draft_tokens: int


@dataclass
class EngineStats:
    """Cumulative counters and current gauges, in vLLM's metric terms."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_preemptions: int = 0  # always 0: admission reserves, it never preempts
    request_success: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS,
                                                                                  0))
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    num_steps: int = 0  # engine steps that ran a target pass
    num_spec_steps: int = 0  # decode/verify passes
    step_s: float = 0.0  # wall time inside step()
    forward_s: float = 0.0  # time inside target and drafter passes (profile=True)


@dataclass
class _Sequence:
    """A request's state while it lives in the engine."""

    req: EngineRequest
    generator: torch.Generator
    slot: int = -1
    reserved: int = 0  # tokens held against the KV pool
    num_computed: int = 0  # prompt tokens already in the caches
    context_len: int = 0  # tokens in the caches (prompt, then accepted outputs)
    last_token: int = -1  # sampled, not yet in the caches
    output: list = field(default_factory=list)
    spec_steps: int = 0
    draft_tokens: int = 0
    accepted: int = 0

    @property
    def prefilled(self) -> bool:
        return self.num_computed >= len(self.req.prompt_token_ids)


class _Forward:
    """The target pass the stages call: binds the cache, buckets the attention length,
    optionally compiled, and on CUDA replays a captured graph per (batch, length) shape."""

    def __init__(self, model, cache, cfg: EngineConfig, scratch_slot: int, static: bool = False):
        self.model, self.cache, self.cfg = model, cache, cfg
        self.scratch_slot = scratch_slot
        self.fn = torch.compile(model, dynamic=True) if cfg.compile and not static else model
        self.graphs = {}  # (B, S, hidden_layers) -> _Graph | None (None: capture failed)
        self.use_graphs = cfg.cuda_graphs and torch.device(cfg.device).type == "cuda"

    def kv_len(self, positions: torch.Tensor, end: int | None = None) -> int:
        end = int(positions.max()) + 1 if end is None else end
        b = self.cfg.kv_len_bucket
        return min(-(-end // b) * b, self.cache.max_len)

    def __call__(self, ids, positions, slots, hidden_layers=(), logits="all", end=None):
        if self.use_graphs and logits == "all":
            return self._graphed(ids, positions, slots, tuple(hidden_layers))
        with eager_attention(ids.device):
            return self.fn(ids, positions=positions, cache=self.cache, slots=slots,
                           kv_len=self.kv_len(positions, end), hidden_layers=hidden_layers,
                           logits=logits)

    # ---- CUDA graphs: one per (padded batch, k+1), attending over the whole cache row
    def _graphed(self, ids, positions, slots, hidden_layers):
        b, s = ids.shape
        pb = 1 << (b - 1).bit_length()  # batch bucket: next power of two
        key = (pb, s, hidden_layers)
        if key not in self.graphs:
            self.graphs[key] = self._capture(pb, s, hidden_layers)
        g = self.graphs[key]
        if g is None:
            with eager_attention(ids.device):
                return self.model(ids, positions=positions, cache=self.cache, slots=slots,
                                  kv_len=self.cache.max_len, hidden_layers=hidden_layers)
        g["ids"][:b].copy_(ids)
        g["pos"][:b].copy_(positions)
        g["slots"][:b].copy_(slots)
        g["ids"][b:].zero_()
        g["slots"][b:].fill_(self.scratch_slot)
        g["pos"][b:].copy_(torch.arange(s, device=ids.device))
        g["graph"].replay()
        out = g["out"]
        return type(out)(out.logits[:b], [h[:b] for h in out.hidden], out.last_hidden[:b])

    def _capture(self, pb, s, hidden_layers):
        dev = self.cache.k0.device
        st = {"ids": torch.zeros(pb, s, dtype=torch.int64, device=dev),
              "pos": torch.arange(s, device=dev).repeat(pb, 1),
              "slots": torch.full((pb,), self.scratch_slot, dtype=torch.int64, device=dev)}

        def run():
            return self.model(st["ids"], positions=st["pos"], cache=self.cache, slots=st["slots"],
                              kv_len=self.cache.max_len, hidden_layers=hidden_layers)
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    run()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                st["out"] = run()
            st["graph"] = graph
            return st
        except Exception as e:  # noqa: BLE001 — a shape the graph cannot hold runs eagerly from now on
            print(f"[engine] CUDA graph capture failed for batch {pb} x {s}: {e}; eager")
            return None


def eager_attention(device):
    """A context for eager passes on CUDA: SDPA without cuDNN attention, which builds a cuDNN
    graph for every new shape (EMBEDDED_NOTES: tens of ms per drafter call on the H200).
    Flash, memory-efficient and math attention have no per-shape set-up."""
    if torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.MATH])


@dataclass
class _Captured:
    graph: object  # torch.cuda.CUDAGraph
    inputs: torch.Tensor  # [3, bucket] static input rows the graph reads
    out: dict  # static outputs the graph writes


class _DecodeStep:
    """A decode step (propose -> verify -> observe, greedy acceptance) as a fixed-shape
    program per (batch bucket, k): captured in a CUDA graph on CUDA, run eagerly at the same
    shapes elsewhere, so a CPU test runs the code the GPU replays.

    inputs: [3, bucket] int64 rows (slots, context_len, last_token), padding rows at the
    scratch slot with context_len 1 (every index stays in range). Outputs (all [bucket, ...]):
    drafts [.., k], num_drafts [..], logits [.., k+1, V], rows [.., k+3] = (num_drafts,
    greedy num_accepted, drafts..., greedy next token)."""

    def __init__(self, model_fn, cache, proposer, scratch_slot: int, use_graphs: bool,
                 compile: bool = False):
        self.fn, self.cache, self.proposer = model_fn, cache, proposer
        # compile=True: the whole program through torch.compile (static shapes: one compile per
        # (bucket, k)); a compiled capture that fails falls back to the plain program
        self.compiled = torch.compile(self.program, dynamic=False) if compile else None
        self.scratch_slot = scratch_slot
        self.layers = tuple(getattr(proposer, "target_layers", ()) or ())
        self.use_graphs = use_graphs
        self.capture_enabled = False  # on once the engine's modules are final (after fp8)
        self.graphs: dict[tuple[int, int], _Captured | None] = {}
        self.failures: list[str] = []

    @staticmethod
    def bucket(b: int) -> int:
        return 1 << (b - 1).bit_length()  # next power of two

    def inputs(self, slots: list[int], context_len: list[int], last_token: list[int]):
        pad = self.bucket(len(slots)) - len(slots)
        return torch.tensor([slots + [self.scratch_slot] * pad, context_len + [1] * pad,
                             last_token + [0] * pad], dtype=torch.int64)  # [3, bucket], host

    def program(self, inputs: torch.Tensor, k: int) -> dict:
        slots, context_len, last_token = inputs[0], inputs[1], inputs[2]
        span = self.cache.max_len

        def forward(ids, pos, s, hidden_layers):
            return self.fn(ids, positions=pos, cache=self.cache, slots=s, kv_len=span,
                           hidden_layers=hidden_layers)
        drafts, verified = spec_mod.draft_verify_observe(forward, self.proposer, slots,
                                                         context_len, last_token, k,
                                                         self.layers)
        acc = spec_mod.accept_greedy(drafts, verified)
        num = (drafts.num_drafts if drafts.num_drafts is not None
               else torch.full_like(acc.num_accepted, k))
        rows = torch.cat([num[:, None], acc.num_accepted[:, None], drafts.tokens,
                          acc.next_token[:, None]], dim=1)
        return {"drafts": drafts.tokens, "num_drafts": num, "logits": verified.logits,
                "rows": rows}

    def __call__(self, host_inputs: torch.Tensor, k: int) -> dict:
        key = (host_inputs.shape[1], k)
        if self.use_graphs and self.capture_enabled and key not in self.graphs:
            self.graphs[key] = self.capture(*key)
        g = self.graphs.get(key)
        if g is None:
            dev = self.cache.k0.device
            run = self.compiled if self.compiled is not None and not self.use_graphs \
                else self.program
            with eager_attention(dev):
                return run(host_inputs.to(dev), k)
        g.inputs.copy_(host_inputs)  # one small host-to-device copy
        g.graph.replay()
        return g.out

    def capture_all(self, keys) -> None:
        self.capture_enabled = True
        for key in keys:
            if key not in self.graphs:
                self.graphs[key] = self.capture(*key)

    def capture(self, bucket: int, k: int) -> _Captured | None:
        """Capture (bucket, k): default attention backends first, then without cuDNN; each
        capture is replayed once and checked against an eager run of the same inputs."""
        host = torch.tensor([[self.scratch_slot] * bucket, [1] * bucket, [0] * bucket],
                            dtype=torch.int64)
        attempts = [("default attention", self.program, contextlib.nullcontext),
                    ("attention without cuDNN", self.program, lambda: eager_attention("cuda"))]
        if self.compiled is not None:
            attempts.insert(0, ("torch.compile", self.compiled, contextlib.nullcontext))
        for label, fn, ctx in attempts:
            try:
                with ctx():
                    return self._capture_once(fn, host, k)
            except Exception as e:  # noqa: BLE001 — fall back, never crash a server or a bench
                msg = (f"[engine] CUDA graph capture of the decode step failed for batch "
                       f"bucket {bucket}, k={k} with {label}: {type(e).__name__}: {e}")
                self.failures.append(msg)
                print(msg, flush=True)
        print(f"[engine] batch bucket {bucket}, k={k} runs eagerly (no CUDA graph)", flush=True)
        return None

    def _capture_once(self, fn, host: torch.Tensor, k: int) -> _Captured:
        inputs = host.to(self.cache.k0.device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: lazy init, cuDNN/cuBLAS plans, allocator
            for _ in range(2):
                ref = fn(inputs, k)
        torch.cuda.current_stream().wait_stream(side)
        ref = ref["logits"].float().clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(inputs, k)
        graph.replay()
        torch.cuda.synchronize()
        got = out["logits"].float()
        err = float((got - ref).abs().max())
        tol = 1e-2 * float(ref.abs().max()) + 1e-2
        if not torch.isfinite(got).all() or err > tol:
            raise RuntimeError(f"replayed logits differ from eager ones by {err:.3g} "
                               f"(tolerance {tol:.3g})")
        return _Captured(graph, inputs, out)


def relayout_linear_weights(module, k_major: bool) -> int:
    """Store every plain linear weight ([out, in], read by `F.linear`) K-major or row-major,
    in place; the values and shapes are unchanged. Returns how many weights were touched.

    Fake-quantized layers (`QuantLinear`) keep their layout: their input is rounded to the
    E2M1/E4M3 grid, which turns the other layout's fp32 summation order (a different last
    bit, and a different one at 1 row than at several) into flipped codes; with them K-major,
    the NVFP4 lossless test's batched and unbatched outputs parted at a 0.11 logit gap.
    A weight moves to new storage: a CUDA graph captured earlier on the same module would
    read the old one, so an engine re-lays before it captures (and "auto" never re-lays on
    CUDA)."""
    n = 0
    for m in module.modules():
        if type(m) is not torch.nn.Linear or m.weight.dim() != 2:
            continue
        w = m.weight.data
        # K-major: the transpose [in, out] is contiguous; a tied weight is re-laid once
        new = w.t().contiguous().t() if k_major else w.contiguous()
        if new.data_ptr() == w.data_ptr():
            continue
        m.weight.data = new
        n += 1
    return n


def _weight_bytes(module) -> int:
    """Bytes of a module's parameters and non-cache buffers (tied tensors counted once)."""
    seen, n = set(), 0
    for t in list(module.parameters()) + [b for name, b in module.named_buffers()
                                          if not name.startswith("cache")]:
        if t is not None and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            n += t.numel() * t.element_size()
    return n


class LLMEngine:
    """Continuous batching with speculative decoding over a slot KV cache."""

    def __init__(self, config: EngineConfig, *, model=None, tokenizer=None, proposer=None):
        self.config = cfg = config
        self.device = torch.device(cfg.device)
        self.dtype = DTYPES[cfg.dtype]
        self.spec = SpecConfig.from_dict(cfg.speculative)
        if cfg.num_threads is not None:
            # the tiny model's kernels are microseconds long: on a busy 2-core machine
            # OpenMP barriers across threads cost more than they save (EMBEDDED_NOTES)
            torch.set_num_threads(int(cfg.num_threads))
        self.model, self.tokenizer = self._load_target(model, tokenizer)
        self.proposer = self._load_proposer(proposer)
        self.use_graphs = cfg.cuda_graphs and self.device.type == "cuda"
        self.static = self.use_graphs if cfg.static_shapes is None else bool(cfg.static_shapes)
        if self.proposer is not None:
            self.proposer.static_bound = self.static
        self._ragged = hasattr(self.proposer, "propose_ragged")  # n-gram: rows draft fewer
        self.eos_token_id = self._eos_id()
        if cfg.quantization == "nvfp4":
            self._quantize_target()
        k_max = self.spec.num_speculative_tokens
        # each row holds a full context plus the k+1 verify tokens that may land past it
        self.cache_len = cfg.max_model_len + k_max + 1
        self.scratch_slot = cfg.max_num_seqs
        self.cache = self.model.new_cache(cfg.max_num_seqs + 1, self.cache_len,
                                          device=self.device, dtype=self.dtype)
        if self.proposer is not None:
            self.proposer.allocate(cfg.max_num_seqs + 1, self.cache_len, self.device, self.dtype)
        self._size_pool()  # after allocate: a drafter knows its cache bytes once allocated
        self._seed_counter = 0
        self._proposer_calls = self.proposer
        self._reset_state()
        if self.proposer is not None and self.spec.quantization == "fp8_per_tensor":
            self._quantize_drafter()
            self._reset_state()  # calibration traffic is not the server's
        if cfg.compile and not self.static and isinstance(self.proposer, torch.nn.Module):
            self._proposer_calls = _CompiledProposer(self.proposer)
        self._relayout_weights()
        if hasattr(self.proposer, "finalize"):  # modules final: fuse what inference reuses
            self.proposer.finalize()
        if cfg.compile:
            dyn = torch._dynamo.config
            dyn.recompile_limit = max(dyn.recompile_limit, RECOMPILE_LIMIT)
            dyn.accumulated_recompile_limit = max(dyn.accumulated_recompile_limit,
                                                  4 * RECOMPILE_LIMIT)
        if self.static and self.use_graphs:  # every shape now: timed regions never capture
            with torch.inference_mode():
                self._decode_step.capture_all(self.decode_shapes())

    def _relayout_weights(self) -> None:
        layout = self.config.weight_layout
        if layout == "auto":
            if self.device.type != "cpu" or self.dtype != torch.float32:
                return  # as loaded: cuBLAS and AMX take either layout at the same speed
            layout = "k_major"
        for module in (self.model, self.proposer):
            if isinstance(module, torch.nn.Module):
                relayout_linear_weights(module, layout == "k_major")

    def decode_shapes(self) -> list[tuple[int, int]]:
        """The (batch bucket, k) pairs decode steps can meet: k by batch size (schedule)."""
        n = self.config.max_num_seqs
        return sorted({(_DecodeStep.bucket(b), self.spec.k_for_batch(b)) for b in range(1, n + 1)})

    @property
    def graph_failures(self) -> list[str]:
        """Warnings of decode-step captures that fell back (empty when all were captured)."""
        return list(self._decode_step.failures)

    # ------------------------------------------------------------------ loading
    def _load_target(self, model, tokenizer):
        if model is None:
            if self.config.model_dir is None:
                raise ValueError("EngineConfig.model_dir is required when no model is given")
            from specrepro.embedded.checkpoint import load_target
            model, tokenizer = load_target(self.config.model_dir, device=self.device,
                                           dtype=self.dtype)
        return model.to(self.device, self.dtype).eval(), tokenizer

    def _load_proposer(self, proposer):
        m = self.spec.method
        if m == "none":
            return None
        if m == "ngram":
            return spec_mod.make_ngram(self.spec)
        if proposer is None:
            from specrepro.embedded.checkpoint import load_proposer
            directory, name = self.config.model_dir, None
            if self.spec.model:  # a drafter folder, or the name of one in the checkpoint
                path = Path(self.spec.model)
                directory, name = ((path.parent, path.name) if (path / "config.json").is_file()
                                   else (self.config.model_dir, self.spec.model))
            proposer = load_proposer(directory, m, target=self.model, device=self.device,
                                     dtype=self.dtype, name=name)
        return proposer

    def _eos_id(self) -> int | None:
        if self.tokenizer is not None and getattr(self.tokenizer, "eos_token_id", None) is not None:
            return int(self.tokenizer.eos_token_id)
        return self.model.config.eos_token_id

    def _calibration_batches(self) -> list[torch.Tensor]:
        vocab = self.model.config.vocab_size
        if self.tokenizer is not None:
            ids = [i for i in self.tokenizer.encode(CALIBRATION_TEXT) if i < vocab]
        else:  # a bare model in tests: a fixed pseudo-random sequence stands in for text
            g = torch.Generator().manual_seed(1234)
            ids = torch.randint(0, vocab, (256,), generator=g).tolist()
        return [torch.tensor([ids], dtype=torch.int64, device=self.device)]

    @torch.no_grad()
    def _quantize_target(self) -> None:
        from specrepro.embedded.quant import QuantLinear, quantize_model
        if any(isinstance(m, QuantLinear) for m in self.model.modules()):
            return  # a model shared between engines (benchmarks) is quantized once
        quantize_model(self.model, "nvfp4", self._calibration_batches())

    @torch.no_grad()
    def _quantize_drafter(self) -> None:
        """FP8 per tensor for the drafter: its activation scales come from a short greedy
        generation of the calibration text through the engine itself (the drafter reads the
        target's hidden states, so it can only be calibrated inside the loop)."""
        from specrepro.embedded.quant import QuantLinear, quantize_model
        module = self.proposer
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"speculative.quantization=fp8_per_tensor: the {self.spec.method} "
                             "proposer has no nn.Module to quantize")
        if any(isinstance(m, QuantLinear) for m in module.modules()):
            return
        # calibration must see every layer's own input: no fused passes (a drafter shared
        # with an engine built earlier may carry them)
        module.finalize(fuse=False)
        batches = self._calibration_batches()

        def run(ids):
            n = min(192, self.config.max_model_len // 2)
            self.add_request(EngineRequest("__calibration__", ids[0, :n].tolist(),
                                           max_tokens=32, ignore_eos=True))
            while self.has_unfinished():
                self.step()
        names = [n for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)]
        quantize_model(module, "fp8_per_tensor", batches, run_forward=run, include=names,
                       exclude=())

    def _reset_state(self) -> None:
        k_max = self.spec.num_speculative_tokens
        self._forward = _Forward(self.model, self.cache, self.config, self.scratch_slot,
                                 self.static)
        self._decode_step = _DecodeStep(self.model, self.cache, self.proposer,
                                        self.scratch_slot, self.use_graphs, self.config.compile)
        self.stats = EngineStats(accepted_per_pos=[0] * k_max)
        self.free_slots = list(range(self.config.max_num_seqs - 1, -1, -1))  # pop(): slot 0
        self.waiting: collections.deque[_Sequence] = collections.deque()
        self.running: dict[str, _Sequence] = {}
        self.reserved_tokens = 0
        self._pending: list[RequestOutput] = []  # abort outputs, returned by the next step

    def _size_pool(self) -> None:
        cfg = self.config
        self.kv_bytes_per_token = self.model.config.kv_bytes_per_token(self.dtype)
        if self.proposer is not None:
            self.kv_bytes_per_token += int(self.proposer.kv_bytes_per_token())
        if cfg.kv_cache_memory_bytes is None:
            self.kv_pool_tokens = cfg.max_num_seqs * cfg.max_model_len
        else:
            self.kv_pool_tokens = int(cfg.kv_cache_memory_bytes) // self.kv_bytes_per_token
        # vLLM's figure: how many full-length requests the pool holds at once
        self.max_concurrency = self.kv_pool_tokens / cfg.max_model_len

    def memory_bytes(self) -> int:
        """Weights (target + drafter) and the KV pool (target + drafter caches), in bytes."""
        w = _weight_bytes(self.model)
        if self.proposer is not None:
            w += int(self.proposer.weight_bytes())
        return w + self.kv_pool_tokens * self.kv_bytes_per_token

    # ------------------------------------------------------------------ requests
    def add_request(self, req: EngineRequest) -> None:
        n = len(req.prompt_token_ids)
        cfg = self.config
        if n == 0:
            raise PromptTooLongError(f"request {req.request_id}: the prompt is empty")
        if req.max_tokens < 1:
            raise ValueError(f"request {req.request_id}: max_tokens must be >= 1, "
                             f"got {req.max_tokens}")
        if n + req.max_tokens > cfg.max_model_len:
            raise PromptTooLongError(
                f"request {req.request_id}: this model's maximum context length is "
                f"{cfg.max_model_len} tokens, but the request asks for {n + req.max_tokens} "
                f"({n} in the prompt, {req.max_tokens} to generate)")
        if n + req.max_tokens > self.kv_pool_tokens:
            raise PromptTooLongError(
                f"request {req.request_id}: {n + req.max_tokens} tokens exceed the KV pool of "
                f"{self.kv_pool_tokens} tokens")
        vocab = self.model.config.vocab_size
        if min(req.prompt_token_ids) < 0 or max(req.prompt_token_ids) >= vocab:
            raise ValueError(f"request {req.request_id}: prompt token ids must be in "
                             f"[0, {vocab})")
        if len(self.waiting) >= cfg.max_waiting:
            raise QueueFullError(f"request {req.request_id}: the waiting queue is full "
                                 f"({cfg.max_waiting} requests)")
        seed = req.sampling.seed
        if seed is None and req.sampling.is_greedy:
            seed = 0  # greedy rows never draw; a fixed seed avoids reading the OS entropy pool
        self.waiting.append(_Sequence(req, make_generator(seed, self.device)))
        self.stats.num_waiting = len(self.waiting)

    def abort(self, request_id: str) -> bool:
        """Drop a request now, waiting or running; its slot and reservation are freed."""
        for seq in self.waiting:
            if seq.req.request_id == request_id:
                self.waiting.remove(seq)
                self._finish(seq, "abort", [])
                return True
        seq = self.running.get(request_id)
        if seq is None:
            return False
        self._finish(seq, "abort", [])
        return True

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self._pending)

    # ------------------------------------------------------------------ the step
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        t0 = time.perf_counter()
        outputs, self._pending = self._pending, []
        self._admit()
        decoding = [s for s in self.running.values() if s.prefilled]
        k = self.spec.k_for_batch(len(decoding)) if decoding else 0
        budget = self.config.max_num_batched_tokens - len(decoding) * (k + 1)
        prefilling = [s for s in self.running.values() if not s.prefilled]
        if prefilling and budget <= 0:  # decode rows fill the budget: still make progress
            budget = max(1, self.config.max_num_batched_tokens // 4)
        if prefilling:
            with eager_attention(self.device):
                for seq in prefilling:
                    if budget <= 0:
                        break
                    budget -= self._prefill_chunk(seq, budget, outputs)
        if decoding:
            self._decode(decoding, k, outputs)
        if decoding or prefilling:
            self.stats.num_steps += 1
        self._update_gauges()
        self.stats.step_s += time.perf_counter() - t0
        return outputs

    def _admit(self) -> None:
        while self.waiting and self.free_slots:
            seq = self.waiting[0]
            need = len(seq.req.prompt_token_ids) + seq.req.max_tokens
            if self.reserved_tokens + need > self.kv_pool_tokens:
                break  # first come, first served: wait for tokens to free up
            self.waiting.popleft()
            seq.slot, seq.reserved = self.free_slots.pop(), need
            self.reserved_tokens += need
            self.running[seq.req.request_id] = seq

    def _timed(self, fn: Callable, *args, **kw):
        if not self.config.profile:
            return fn(*args, **kw)
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        sync()
        t = time.perf_counter()
        out = fn(*args, **kw)
        sync()
        self.stats.forward_s += time.perf_counter() - t
        return out

    def _prefill_chunk(self, seq: _Sequence, budget: int, outputs: list) -> int:
        prompt = seq.req.prompt_token_ids
        start = seq.num_computed
        end = min(len(prompt), start + budget)
        ids = torch.tensor([prompt[start:end]], dtype=torch.int64, device=self.device)
        pos = torch.arange(start, end, device=self.device)[None]
        slot = torch.tensor([seq.slot], device=self.device)
        last = end == len(prompt)
        layers = tuple(getattr(self.proposer, "target_layers", ()) or ())
        out = self._timed(self._forward, ids, pos, slot, layers, "last" if last else "none")
        if self.proposer is not None:
            self._timed(self._proposer_calls.observe, slot, ids, pos, out.hidden)
        seq.num_computed = seq.context_len = end
        self.stats.prompt_tokens += end - start
        if last:  # the prompt's last logits give the first output token
            logits = out.logits[:, -1]  # [1, V]
            if seq.req.sampling.is_greedy:
                tok = int(logits.argmax(-1))
            else:
                tok = int(sample(warp(logits, [seq.req.sampling]), [seq.generator])[0])
            self._emit(seq, [tok], outputs)
        return end - start

    def _decode(self, seqs: list[_Sequence], k: int, outputs: list) -> None:
        params = [s.req.sampling for s in seqs]
        all_greedy = all(p.is_greedy for p in params)
        # the fixed-shape program drafts greedily; sampled drafts take the staged path
        if self.static and (all_greedy or self._ragged
                            or self.spec.draft_sample_method == "greedy"):
            rows = self._decode_static(seqs, k, params, all_greedy)
        else:
            with eager_attention(self.device):
                rows = self._decode_staged(seqs, k, params, all_greedy)
        # rows: [B] lists (num_drafts, num_accepted, drafts..., next token), one host read
        self.stats.num_spec_steps += 1
        for seq, row in zip(seqs, rows):
            nd, na = row[0], row[1]
            if nd > 0:
                seq.spec_steps += 1
                seq.draft_tokens += nd
                seq.accepted += na
                self.stats.num_drafts += 1
                self.stats.num_draft_tokens += nd
                self.stats.num_accepted_tokens += na
                for i in range(na):  # vLLM's accepted-per-position counter
                    self.stats.accepted_per_pos[i] += 1
            seq.context_len += na + 1
            self._emit(seq, row[2:2 + na] + [row[-1]], outputs)

    def _batch(self, seqs: list[_Sequence], params, all_greedy: bool, slots=None,
               context_len=None, last_token=None) -> DecodeBatch:
        dev = self.device

        def col(values):
            return torch.tensor(values, dtype=torch.int64, device=dev)
        return DecodeBatch(
            slots=col([s.slot for s in seqs]) if slots is None else slots,
            context_len=col([s.context_len for s in seqs]) if context_len is None else context_len,
            last_token=col([s.last_token for s in seqs]) if last_token is None else last_token,
            params=params, generators=[s.generator for s in seqs], all_greedy=all_greedy,
            sampling=None if all_greedy else SamplingTensors.from_params(
                params, self.model.config.vocab_size, dev))

    def _decode_static(self, seqs: list[_Sequence], k: int, params, all_greedy: bool) -> list:
        """One replay of the (bucket, k) program; sampled rows then verify eagerly."""
        b = len(seqs)
        host = self._decode_step.inputs([s.slot for s in seqs], [s.context_len for s in seqs],
                                        [s.last_token for s in seqs])
        out = self._timed(self._decode_step, host, k)
        if all_greedy:  # acceptance ran inside the program
            return out["rows"][:b].tolist()
        inputs = host[:, :b].to(self.device)
        batch = self._batch(seqs, params, False, *inputs)
        num = out["num_drafts"][:b]
        drafts = spec_mod.Drafts(out["drafts"][:b], None, num if self._ragged else None)
        verified = spec_mod.Verified(out["logits"][:b], None, None, [])
        acc = spec_mod.accept(batch, drafts, verified)
        return torch.cat([num[:, None], acc.num_accepted[:, None], drafts.tokens,
                          acc.next_token[:, None]], dim=1).tolist()

    def _decode_staged(self, seqs: list[_Sequence], k: int, params, all_greedy: bool) -> list:
        """The four stages one by one (spec.speculative_step): the CPU default, and sampled
        drafts (each row draws from its own generator, which a graph cannot hold)."""
        batch = self._batch(seqs, params, all_greedy)
        end = max(s.context_len for s in seqs) + k + 1

        def forward(ids, pos, slots, layers):
            return self._timed(self._forward, ids, pos, slots, layers, "all", end)
        drafts, acc = spec_mod.speculative_step(forward, self._timed_proposer(), batch, k,
                                                self.spec.draft_sample_method)
        num_drafts = (drafts.num_drafts if drafts.num_drafts is not None
                      else torch.full_like(acc.num_accepted, k))
        # one transfer back: [B, k + 3] = (num_drafts, num_accepted, drafts..., next token)
        return torch.cat([num_drafts[:, None], acc.num_accepted[:, None], drafts.tokens,
                          acc.next_token[:, None]], dim=1).tolist()

    def _timed_proposer(self):
        if self.proposer is None or not self.config.profile:
            return self._proposer_calls
        return _TimedProposer(self._proposer_calls, self._timed)

    # ------------------------------------------------------------------ outputs
    def _emit(self, seq: _Sequence, tokens: list[int], outputs: list) -> None:
        """Append a step's tokens to a request, stopping at eos, a stop id or max_tokens."""
        req = seq.req
        stops = set(req.stop_token_ids)
        if not req.ignore_eos and self.eos_token_id is not None:
            stops.add(self.eos_token_id)
        new, reason = [], None
        for tok in tokens:
            new.append(tok)
            if tok in stops:
                reason = "stop"
                break
            if len(seq.output) + len(new) >= req.max_tokens:
                reason = "length"
                break
        seq.output.extend(new)
        seq.last_token = new[-1]
        self.stats.generation_tokens += len(new)
        if reason is None:
            outputs.append(self._output(seq, new, None))
        else:
            self._finish(seq, reason, new, outputs)

    def _output(self, seq: _Sequence, new: list[int], reason: str | None) -> RequestOutput:
        return RequestOutput(seq.req.request_id, new, reason is not None, reason,
                             len(seq.req.prompt_token_ids), seq.spec_steps, seq.accepted,
                             seq.draft_tokens)

    def _finish(self, seq: _Sequence, reason: str, new: list[int], outputs=None) -> None:
        rid = seq.req.request_id
        if self.running.pop(rid, None) is not None:
            self.free_slots.append(seq.slot)
            self.reserved_tokens -= seq.reserved
            if self.proposer is not None:
                self.proposer.release(seq.slot)
        (self._pending if outputs is None else outputs).append(self._output(seq, new, reason))
        self.stats.request_success[reason] += 1
        self._update_gauges()

    def _update_gauges(self) -> None:
        s = self.stats
        s.num_running, s.num_waiting = len(self.running), len(self.waiting)
        used = sum(q.context_len for q in self.running.values())
        s.kv_usage = used / self.kv_pool_tokens if self.kv_pool_tokens else 0.0

    # ------------------------------------------------------------------ convenience
    def generate(self, prompts: Sequence[Sequence[int]],
                 sampling: SamplingParams | Sequence[SamplingParams] | None = None,
                 max_tokens: int = 16, ignore_eos: bool = False) -> list[list[int]]:
        """Run prompts to completion together (tests, benchmarks); token ids per prompt.
        sampling: one for all prompts or one per prompt; None = greedy."""
        if sampling is None or isinstance(sampling, SamplingParams):
            sampling = [sampling or SamplingParams(temperature=0.0)] * len(prompts)
        ids = []
        for i, (p, sp) in enumerate(zip(prompts, sampling, strict=True)):
            rid = f"gen-{self._seed_counter}-{i}"
            ids.append(rid)
            self.add_request(EngineRequest(rid, list(p), sp, max_tokens, ignore_eos=ignore_eos))
        self._seed_counter += 1
        got = {r: [] for r in ids}
        while self.has_unfinished():
            for out in self.step():
                if out.request_id in got:
                    got[out.request_id].extend(out.new_token_ids)
        return [got[r] for r in ids]


class _TimedProposer:
    """A proposer whose passes are timed into `EngineStats.forward_s` (profile=True)."""

    def __init__(self, inner, timed):
        self.inner, self.timed = inner, timed

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name in ("propose", "propose_ragged", "observe"):
            return lambda *a, **kw: self.timed(attr, *a, **kw)
        return attr


class _CompiledProposer:
    """A drafter whose `propose` and `observe` run through `torch.compile` (compile=True).
    Drafters read lengths with `int(...)`, which splits their graphs; the pieces between
    still fuse. k is a Python int, so each draft length compiles once."""

    def __init__(self, inner):
        self.inner = inner
        self.propose = torch.compile(inner.propose, dynamic=True)
        self.observe = torch.compile(inner.observe, dynamic=True)

    def __getattr__(self, name):
        return getattr(self.inner, name)
