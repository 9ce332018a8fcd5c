"""The engine's fixed-shape programs: the target pass with CUDA graphs (`TargetForward`),
the static decode step (`DecodeStep`), and the one way both capture a graph
(`capture_graph`). The engine holds one of each (`LLMEngine.forward`, `.decode_step`);
prefill.py and decode.py call them.

Design:
- Static decode (`EngineConfig.static_shapes`, on by default wherever CUDA graphs are): a
  decode step's propose -> verify -> observe and greedy acceptance run as one tensor program
  (`spec.draft_verify_observe`) at fixed shapes: the batch padded to a power-of-two bucket
  with the scratch slot, every attention (target and drafter) over whole cache rows under the
  causal mask, no host read inside. On CUDA each (batch bucket, k) the engine can meet is
  captured in a CUDA graph at start-up (a timed region never captures), checked against an
  eager run of the same inputs, and replayed; a capture that fails falls back, with a printed
  warning, to a capture without cuDNN attention and then to the same program run eagerly.
  One host read per step brings back [B, k+3] (drafts, acceptance, next token). Elsewhere
  the same program runs eagerly at the same shapes, so a CPU test runs the code the GPU
  replays.
- The target pass (`TargetForward`) buckets the attention length so shapes repeat
  (optionally through `torch.compile`) and, on CUDA, replays a graph per (padded batch,
  length, hidden layers) over whole cache rows; a shape whose capture fails runs eagerly
  from then on.
- A capture (`capture_graph`): two warm-up runs on a side stream (lazy initialisation,
  cuDNN/cuBLAS plans, the allocator's pools), the current stream waits for them, then
  `torch.cuda.CUDAGraph` records one more run; the recorded run's outputs are static
  tensors that every replay rewrites. The engine and scripts/bench_step_stages.py capture
  this way only.
- Eager passes of varying shape on CUDA (prefill chunks, the staged fallback) exclude cuDNN
  attention (`eager_attention`): SDPA may pick it on Hopper, and it builds a cuDNN graph
  (tens of milliseconds) for every new shape, which made every eager drafter call on the
  H200 cost that much.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from specrepro.embedded import spec as spec_mod
from specrepro.embedded.config import EngineConfig


def capture_graph(run: Callable[[], Any], warmup: int = 2,
                  keep: Callable[[Any], Any] | None = None) -> tuple[torch.cuda.CUDAGraph, Any, Any]:
    """Capture `run()` in a CUDA graph after `warmup` runs on a side stream.

    Returns (graph, the captured run's outputs: static tensors each replay rewrites,
    keep(the last warm-up's outputs) or None). `keep` runs on the current stream once it has
    waited for the warm-up, before the capture; without it the warm-up's outputs are freed
    as they come. The graph has not been replayed yet."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    kept = None
    with torch.cuda.stream(side):  # warm-up: lazy init, cuDNN/cuBLAS plans, allocator
        for _ in range(warmup):
            warm = run()
            if keep is None:
                del warm
    torch.cuda.current_stream().wait_stream(side)
    if keep is not None:
        kept = keep(warm)
        del warm
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    return graph, out, kept


class TargetForward:
    """The target pass the stages call: binds the cache, buckets the attention length,
    optionally compiled, and on CUDA replays a captured graph per (batch, length) shape."""

    def __init__(self, model, cache, cfg: EngineConfig, scratch_slot: int, static: bool = False,
                 compile: bool | None = None):
        self.model, self.cache, self.cfg = model, cache, cfg
        self.scratch_slot = scratch_slot
        compile = cfg.compile if compile is None else compile  # False: layers compiled instead
        self.fn = torch.compile(model, dynamic=True) if compile and not static else model
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
            st["graph"], st["out"], _ = capture_graph(run)
            return st
        except Exception as e:  # noqa: BLE001 — a shape the graph cannot hold runs eagerly from now on
            print(f"[engine] CUDA graph capture failed for batch {pb} x {s}: {e}; eager")
            return None


def eager_attention(device):
    """A context for eager passes on CUDA: SDPA without cuDNN attention, which builds a cuDNN
    graph for every new shape (tens of ms per drafter call on the H200).
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


class DecodeStep:
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
        num, rows = spec_mod.step_rows(drafts, acc)
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
        # the last warm-up's logits, an eager run of the same inputs, are the reference
        graph, out, ref = capture_graph(lambda: fn(inputs, k),
                                        keep=lambda warm: warm["logits"].float().clone())
        graph.replay()
        torch.cuda.synchronize()
        got = out["logits"].float()
        err = float((got - ref).abs().max())
        tol = 1e-2 * float(ref.abs().max()) + 1e-2
        if not torch.isfinite(got).all() or err > tol:
            raise RuntimeError(f"replayed logits differ from eager ones by {err:.3g} "
                               f"(tolerance {tol:.3g})")
        return _Captured(graph, inputs, out)
