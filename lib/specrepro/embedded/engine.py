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
- A step: admit waiting requests into free slots; prefill chunks (prefill.py: one target
  pass per prefilling request, or with `batched_prefill` all in one padded pass;
  `max_num_batched_tokens` per step shared with the decode rows, the final chunk samples
  the first token); then one speculative step (decode.py over spec.py's stages) for every
  request that was decoding when the step began. The two stages are modules of their own
  and reach the engine through its public parts: `forward` (the target pass, graphs.py),
  `decode_step` (the static program), `proposer_calls`, `timed` and `emit`.
- The step is batched: rows are gathered into [B] tensors once, the stages run on tensors
  and one `.tolist()` brings the accepted tokens back. A row's output does not depend on its
  batch: drafts are padded after real tokens (invisible under causal attention), sampling
  draws from each request's own `torch.Generator`, quantization scales are static.
- Speed: the attention length is rounded up to a bucket so shapes repeat; `compile=True`
  wraps the target forward (or, static, the decode program) in `torch.compile`, or with
  `compile_scope="layer"` each decoder layer (compilation.py: a deep model's compile time
  is one layer's).
- Static decode (`static_shapes`, on by default wherever CUDA graphs are): a decode step runs
  as one fixed-shape tensor program, captured per (batch bucket, k) in a CUDA graph at
  start-up on CUDA and run eagerly at the same shapes elsewhere; eager passes of varying
  shape on CUDA exclude cuDNN attention. The programs and why: graphs.py.
- Weight layout (`weight_layout`, CPU fp32 by default): linear weights are stored K-major
  there, where few-row GEMMs are faster so; bf16 and CUDA keep the loaded layout
  (model.relayout_linear_weights gives the measurements). The engine re-lays once its
  modules are final, before it captures any graph.

The engine knows nothing of HTTP or text: it takes and returns token ids (the server's
engine_loop.py bridges).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specrepro.embedded import decode, prefill
from specrepro.embedded.compilation import CompiledProposer, allow_recompiles, compile_layers
from specrepro.embedded.config import DTYPES, EngineConfig
from specrepro.embedded.graphs import DecodeStep, TargetForward, eager_attention
from specrepro.embedded.model import relayout_linear_weights, weight_bytes
from specrepro.embedded.proposers import make_ngram
from specrepro.embedded.sampling import SamplingParams, make_generator
from specrepro.speculative import SpecConfig

FINISH_REASONS = ("stop", "length", "abort")


class QueueFullError(RuntimeError):
    """The waiting queue holds `max_waiting` requests already."""


class PromptTooLongError(ValueError):
    """A request can never fit: its prompt (+ max_tokens) exceeds the context or the KV pool."""


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
class RequestState:
    """A request's state while it lives in the engine (the prefill and decode stages advance
    it)."""

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


class LLMEngine:
    """Continuous batching with speculative decoding over a slot KV cache."""

    def __init__(self, config: EngineConfig, *, model=None, tokenizer=None, proposer=None):
        self.config = cfg = config
        self.device = torch.device(cfg.device)
        self.dtype = DTYPES[cfg.dtype]
        self.spec = SpecConfig.from_dict(cfg.speculative)
        if cfg.num_threads is not None:
            # the tiny model's kernels are microseconds long: on a busy 2-core machine
            # OpenMP barriers across threads cost more than they save
            torch.set_num_threads(int(cfg.num_threads))
        self.model, self.tokenizer = self._load_target(model, tokenizer)
        self.proposer = self._load_proposer(proposer)
        self.use_graphs = cfg.cuda_graphs and self.device.type == "cuda"
        self.static = self.use_graphs if cfg.static_shapes is None else bool(cfg.static_shapes)
        if self.proposer is not None:
            self.proposer.static_bound = self.static
        self.ragged = hasattr(self.proposer, "propose_ragged")  # n-gram: rows draft fewer
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
        self.proposer_calls = self.proposer
        self._reset_state()
        if self.proposer is not None and self.spec.quantization == "fp8_per_tensor":
            self._quantize_drafter()
            self._reset_state()  # calibration traffic is not the server's
        if self._compile_whole and not self.static and isinstance(self.proposer, torch.nn.Module):
            self.proposer_calls = CompiledProposer(self.proposer)
        self._relayout_weights()
        if hasattr(self.proposer, "finalize"):  # modules final: fuse what inference reuses
            self.proposer.finalize()
        if cfg.compile and cfg.compile_scope == "layer":
            compile_layers(self.model, self.proposer)
        if cfg.compile:
            allow_recompiles()
        if self.static and self.use_graphs:  # every shape now: timed regions never capture
            with torch.inference_mode():
                self.decode_step.capture_all(self.decode_shapes())

    @property
    def _compile_whole(self) -> bool:
        """torch.compile over the whole decode program or target forward (scope "step")."""
        return self.config.compile and self.config.compile_scope == "step"

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
        return sorted({(DecodeStep.bucket(b), self.spec.k_for_batch(b)) for b in range(1, n + 1)})

    @property
    def graph_failures(self) -> list[str]:
        """Warnings of decode-step captures that fell back (empty when all were captured)."""
        return list(self.decode_step.failures)

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
            return make_ngram(self.spec)
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

    @torch.no_grad()
    def _quantize_target(self) -> None:
        from specrepro.embedded.quant import QuantLinear, calibration_batches, quantize_model
        if any(isinstance(m, QuantLinear) for m in self.model.modules()):
            return  # a model shared between engines (benchmarks) is quantized once
        quantize_model(self.model, "nvfp4", calibration_batches(
            self.tokenizer, self.model.config.vocab_size, self.device))

    @torch.no_grad()
    def _quantize_drafter(self) -> None:
        """FP8 per tensor for the drafter: its activation scales come from a short greedy
        generation of the calibration text through the engine itself (the drafter reads the
        target's hidden states, so it can only be calibrated inside the loop)."""
        from specrepro.embedded.quant import QuantLinear, calibration_batches, quantize_model
        module = self.proposer
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"speculative.quantization=fp8_per_tensor: the {self.spec.method} "
                             "proposer has no nn.Module to quantize")
        if any(isinstance(m, QuantLinear) for m in module.modules()):
            return
        # calibration must see every layer's own input: no fused passes (a drafter shared
        # with an engine built earlier may carry them)
        module.finalize(fuse=False)
        batches = calibration_batches(self.tokenizer, self.model.config.vocab_size,
                                      self.device)

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
        # the target pass the stages call, and the static decode program (graphs.py)
        self.forward = TargetForward(self.model, self.cache, self.config, self.scratch_slot,
                                     self.static, compile=self._compile_whole)
        self.decode_step = DecodeStep(self.model, self.cache, self.proposer,
                                      self.scratch_slot, self.use_graphs, self._compile_whole)
        self.stats = EngineStats(accepted_per_pos=[0] * k_max)
        self.free_slots = list(range(self.config.max_num_seqs - 1, -1, -1))  # pop(): slot 0
        self.waiting: collections.deque[RequestState] = collections.deque()
        self.running: dict[str, RequestState] = {}
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
        w = weight_bytes(self.model)
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
        self.waiting.append(RequestState(req, make_generator(seed, self.device)))
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
                prefill.run(self, prefilling, budget, outputs)
        if decoding:
            decode.run(self, decoding, k, outputs)
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

    def timed(self, fn: Callable, *args, **kw):
        """fn(*args, **kw), its seconds added to `stats.forward_s` when profiling (synchronized
        on CUDA so that they are the pass's own); the stages time their passes through it."""
        if not self.config.profile:
            return fn(*args, **kw)
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        sync()
        t = time.perf_counter()
        out = fn(*args, **kw)
        sync()
        self.stats.forward_s += time.perf_counter() - t
        return out

    def timed_proposer(self):
        """The drafter's calls for a decode step: `proposer_calls`, timed when profiling."""
        if self.proposer is None or not self.config.profile:
            return self.proposer_calls
        return _TimedProposer(self.proposer_calls, self.timed)

    # ------------------------------------------------------------------ outputs
    def emit(self, seq: RequestState, tokens: list[int], outputs: list) -> None:
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

    def _output(self, seq: RequestState, new: list[int], reason: str | None) -> RequestOutput:
        return RequestOutput(seq.req.request_id, new, reason is not None, reason,
                             len(seq.req.prompt_token_ids), seq.spec_steps, seq.accepted,
                             seq.draft_tokens)

    def _finish(self, seq: RequestState, reason: str, new: list[int], outputs=None) -> None:
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
    def warm_up(self, lengths: Sequence[int] = (3, 29), max_tokens: int = 3) -> float:
        """Run the paths a request takes once before serving, then zero the counters; returns
        the seconds it took. With compile=True torch.compile traces lazily, so without this
        the first requests compile inside a timed window: on the H200 the stand-in's first
        one-stream cell read 12.3-15.2 ms a step against 7.6-7.9 once warm (2026-12-04).
        One prompt alone, then prompts of other lengths together: dynamo compiles a static
        graph for a first shape and a dynamic one for the second, which then serves every
        other prompt length and batch (the CPU, which captures no decode shape at start, meets
        batch 1 and 2 here)."""
        t0 = time.perf_counter()
        vocab = self.model.config.vocab_size
        lengths = [min(n, self.config.max_model_len - max_tokens) for n in lengths]
        prompts = [[(7 * i + 3) % vocab for i in range(n)] for n in lengths]
        seed_counter = self._seed_counter
        self.generate(prompts[:1], max_tokens=max_tokens, ignore_eos=True)
        self.generate(prompts[1:] * 2, max_tokens=max_tokens, ignore_eos=True)
        self._seed_counter = seed_counter  # request seeds as if it never ran
        self.stats = EngineStats(accepted_per_pos=[0] * self.spec.num_speculative_tokens)
        return time.perf_counter() - t0

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
