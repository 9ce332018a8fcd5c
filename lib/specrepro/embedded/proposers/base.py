"""The drafter contract the engine calls (`Proposer`), a drafter's shape as data
(`DrafterConfig`) and what every drafter shares.

Design:
- Every drafter is a `Proposer` (the engine's contract, docs/architecture.md):
  `observe` after each target pass (prefill chunk or verify) with the tokens, their
  positions and the target's hidden states at `target_layers`; `propose` drafts k
  tokens after `last_token` (the target's next token, at position `context_len`,
  not yet processed). Each keeps its own per-slot caches, batched over slots, and
  rolls back by length like the target: entries at positions >= a slot's accepted
  length are overwritten before anything reads them, so ragged acceptance needs no
  call. `release` frees nothing (the caches are preallocated per slot).
- Static attention bound (`static_bound`, set by the engine when it captures CUDA graphs):
  every drafter attention spans the whole cache row [0, max_len) under the causal (or
  context-length) mask instead of [0, max position + 1), so `observe` and `propose` read no
  length back to the host and their shapes depend only on (batch, k): one CUDA graph per
  (batch bucket, k) holds a whole propose, MTP's k re-runs and the draft model's k steps
  included (`draft_loop`). Off on the CPU, where the shorter span is cheaper and a host read
  is free.
- The MTP head and the block drafter borrow the target's embedding and output head
  (`SharedTarget`), never as submodules: a drafter's state dict holds its own weights only.
- Training losses live beside each forward (`training_loss`): the labels are the
  frozen target's greedy predictions (self-distillation: a draft is accepted when it is
  what the target itself would produce, so the target's outputs, not the corpus's tokens,
  are what a drafter learns).
- Imports torch only (plus the target model module).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace

import torch
from torch import nn

from specrepro.embedded.model import ModelConfig, Qwen3Model
from specrepro.speculative import MODEL_METHODS

Sampler = Callable[[torch.Tensor], torch.Tensor]  # logits [B, V] -> tokens [B]



@dataclass
class DrafterConfig:
    """A drafter's shape, as data. Hidden size and heads follow the target's (the
    MTP head and block drafter read its hidden states and share its embedding)."""

    method: str
    num_hidden_layers: int = 1
    intermediate_size: int = 768
    target_layers: tuple[int, ...] = ()  # MTP: (last,); dflash: several depths
    block_size: int = 8  # dflash: last real token + block_size-1 masks
    loss_decay: float = 0.9  # weight of draft position j is loss_decay**(j-1)
    # MTP: steps unrolled in training. 1 = DeepSeek-V3 / Qwen3-Next: one module trained
    # for the next-next token, re-run on its own output at inference.
    mtp_train_depth: int = 1
    # draft_model only: its own small model (a Hugging Face Qwen3 config).
    draft: dict = field(default_factory=dict)
    # dflash only: {"drafter": name, "layers": L, "intermediate_size": m}: the first L layers
    # (MLP m wide), `fc`, `hidden_norm` and `mask_embedding` (when it has one) are those of the
    # stored block drafter `name`; this drafter's own layers run after them.
    trunk: dict = field(default_factory=dict)
    # dflash only, the layout (proposers/dflash.py): the mask is the drafter's own learned
    # `mask_embedding` (None) or the frozen row of the target's embedding at this token id
    # (the engines' layout, docs/engine-layouts.md)
    mask_token_id: int | None = None
    # dflash only: "fixed" (trained at block_size; k < block_size drafts run that block and
    # keep the first k) or "engine" (k drafts are a block of 1 + k, as vLLM and SGLang run it;
    # trained over random block lengths 2..block_size)
    block: str = "fixed"
    # mtp only, the head's layout (proposers/mtp.py): "deepseek" (DeepSeek-V3 MTP: eh_proj over
    # [norm(h); norm(emb)], a Qwen3 layer, a final norm) or "eagle" (EAGLE-1, the layout vLLM
    # 0.26.0 and SGLang 0.5.14 load for a Qwen3 target: fc over [emb; h] with no norms, a Llama
    # layer without QK-norm or input norm, no final norm, fed the target's final-normed hidden)
    layout: str = "deepseek"

    TRUNK_KEYS = ("drafter", "layers", "intermediate_size")
    BLOCKS = ("fixed", "engine")
    LAYOUTS = ("deepseek", "eagle")

    def __post_init__(self):
        if self.method not in MODEL_METHODS:
            raise ValueError(f"drafter method {self.method!r} not in {MODEL_METHODS}")
        self.target_layers = tuple(int(i) for i in self.target_layers)
        if self.block not in self.BLOCKS:
            raise ValueError(f"drafter config 'block' must be one of {self.BLOCKS}, "
                             f"got {self.block!r}")
        m = self.mask_token_id
        if m is not None and (not isinstance(m, int) or isinstance(m, bool) or m < 0):
            raise ValueError(f"drafter config 'mask_token_id' must be a token id >= 0 or null,"
                             f" got {m!r}")
        if self.method != "dflash" and (m is not None or self.block != "fixed"):
            raise ValueError(f"drafter config 'mask_token_id'/'block': only a dflash drafter"
                             f" has them, not {self.method!r}")
        if self.layout not in self.LAYOUTS:
            raise ValueError(f"drafter config 'layout' must be one of {self.LAYOUTS}, "
                             f"got {self.layout!r}")
        if self.method != "mtp" and self.layout != "deepseek":
            raise ValueError(f"drafter config 'layout': only an mtp head has one, not "
                             f"{self.method!r}")
        if self.trunk:
            if self.method != "dflash":
                raise ValueError(f"drafter config 'trunk': only a dflash drafter has one, "
                                 f"not {self.method!r}")
            if sorted(self.trunk) != sorted(self.TRUNK_KEYS):
                raise ValueError(f"drafter config 'trunk' {self.trunk!r}: expected exactly the "
                                 f"keys {list(self.TRUNK_KEYS)}")
            for key in ("layers", "intermediate_size"):
                v = self.trunk[key]
                if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                    raise ValueError(f"drafter config 'trunk.{key}' must be an integer >= 1,"
                                     f" got {v!r}")
            if not isinstance(self.trunk["drafter"], str) or not self.trunk["drafter"]:
                raise ValueError(f"drafter config 'trunk.drafter' must name a stored drafter,"
                                 f" got {self.trunk['drafter']!r}")

    @classmethod
    def from_dict(cls, d: dict) -> DrafterConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown drafter config keys {sorted(unknown)}")
        return cls(**d)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["target_layers"] = list(self.target_layers)
        # keys at their defaults are left out, so a drafter of today's layout is stored as
        # before the keys existed
        for key, default in (("trunk", {}), ("mask_token_id", None), ("block", "fixed"),
                             ("layout", "deepseek")):
            if d[key] == default:
                del d[key]
        return d

    def layer_config(self, target: ModelConfig) -> ModelConfig:
        return replace(target, num_hidden_layers=self.num_hidden_layers,
                       intermediate_size=self.intermediate_size)


class SharedTarget:
    """The target's embedding, final norm and output head, borrowed (not a submodule: the
    drafter's state dict holds its own weights only)."""

    def __init__(self, target: Qwen3Model):
        self.embed = target.model.embed_tokens
        self.norm = target.model.norm
        self.lm_head = target.lm_head


def greedy(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(-1)


class Proposer(nn.Module):
    """The engine's drafter contract (docs/architecture.md, "Contract: drafters")."""

    method: str = ""
    target_layers: tuple[int, ...] = ()
    static_bound: bool = False  # attend over whole cache rows (CUDA graphs); see the docstring

    def _kv_len(self, positions: torch.Tensor, max_len: int) -> int:
        """Attention span of a cached pass at `positions` [B, S]: the whole row when static,
        else up to the furthest position (a host read)."""
        return max_len if self.static_bound else int(positions.max()) + 1

    def allocate(self, num_slots: int, max_len: int, device=None,
                 dtype: torch.dtype = torch.float32) -> None:
        raise NotImplementedError

    def kv_bytes_per_token(self) -> int:
        raise NotImplementedError

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())

    def observe(self, slots, tokens, positions, hidden) -> None:
        raise NotImplementedError

    def propose(self, slots, context_len, last_token, k, sample: Sampler | None = None):
        raise NotImplementedError

    def release(self, slot: int) -> None:
        """Nothing to free: caches are per slot and roll back by length."""

    def finalize(self, fuse: bool = True) -> None:
        """Called by the engine once the drafter's modules are final (after quantization and
        weight relayout), before any CUDA graph capture: precompute what inference reuses.
        `fuse=False` drops it (the engine calls that before calibrating quantized layers,
        which must see every layer's own input). Nothing to do by default."""

    def _elem(self) -> int:
        return torch.empty((), dtype=self._cache_dtype).element_size()


def draft_loop(step, k: int, sample: Sampler | None):
    """Run `step(j, prev_tokens) -> logits [B, V]` k times; returns tokens [B, k], logits
    [B, k, V]. A fixed sequence of tensor ops for a given k (no host reads), so a CUDA graph
    captures the whole loop."""
    sample = sample or greedy
    toks, logits = [], []
    for j in range(k):
        lg = step(j, toks[-1] if toks else None)
        logits.append(lg)
        toks.append(sample(lg))
    return torch.stack(toks, 1), torch.stack(logits, 1)

