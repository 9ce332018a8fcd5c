"""The embedded target: a small decoder-only model in the Qwen3 architecture.

Design:
- RMSNorm, rotary position embeddings (rotate-half, as Qwen3), grouped-query
  attention with per-head RMSNorm on queries and keys (QK-norm), SwiGLU MLP,
  tied input/output embeddings. Field names of `ModelConfig` are Hugging Face
  `Qwen3Config`'s and parameter names are `Qwen3ForCausalLM`'s, so the saved
  checkpoint loads in `transformers` unchanged (see `to_hf_config`).
- One forward serves training and serving. Without a cache it is a plain causal
  pass over [B, S]. With a `SlotKVCache` it writes the keys and values of the S
  new tokens at (slot, position) and attends causally over the first `kv_len`
  cache positions of each slot: prefill chunks, single-token decode and the
  k+1-token verify of speculative decoding are the same call.
- Rollback of rejected draft tokens is by length: the engine keeps each slot's
  length; stale entries past it are overwritten before any query can see them,
  because a query at position p only reads keys at positions <= p, all of which
  were written by this or an earlier pass with accepted tokens.
- The forward returns hidden states of chosen blocks, which the drafters read
  (the MTP head the last block, the block drafter several depths).
- Weight layout (`relayout_linear_weights`, which the engine applies on the CPU in fp32):
  linear weights stored K-major (column-major [out, in], i.e. [in, out] contiguous) so
  `F.linear` hands MKL its NN layout, which is faster for the few-row GEMMs of decoding: on
  one core of the 2-core dev machine, the target's 43 GEMMs at 8 rows took 2.3-2.5 ms
  K-major against 3.8-4.0 ms row-major (1 row: 1.9-2.3 ms either way), and a compiled
  8-token target pass 1.27-1.38x a 1-token one against 1.66x. Under the shared machine's
  load whole passes moved by more than that (scripts/bench_weight_layout.py; docs/bench).
  Same values, same shapes; bf16 (AMX) gains nothing, and fake-quantized layers keep
  theirs (their rounding to the FP4/FP8 grid would turn the other summation order into
  flipped codes).

This module imports torch only: it runs on the H200 image, which lacks the
analysis stack.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Literal, NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ModelConfig:
    vocab_size: int = 4096
    hidden_size: int = 384
    intermediate_size: int = 1024
    num_hidden_layers: int = 6
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    head_dim: int = 64
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = 0
    pad_token_id: int | None = None

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        # transformers 5 writes rope_theta inside rope_parameters.
        if "rope_theta" not in kw and isinstance(d.get("rope_parameters"), dict):
            kw["rope_theta"] = d["rope_parameters"].get("rope_theta", cls.rope_theta)
        return cls(**kw)

    def to_hf_config(self) -> dict:
        """config.json for `transformers.AutoModelForCausalLM` (Qwen3ForCausalLM)."""
        d = asdict(self)
        d.update(
            architectures=["Qwen3ForCausalLM"],
            model_type="qwen3",
            hidden_act="silu",
            attention_bias=False,
            attention_dropout=0.0,
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=self.num_hidden_layers,
            initializer_range=0.02,
            use_cache=True,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            rope_scaling=None,
            torch_dtype="bfloat16",
        )
        return d

    def num_parameters(self) -> int:
        d, h, kv, hd, f = (self.hidden_size, self.num_attention_heads,
                           self.num_key_value_heads, self.head_dim, self.intermediate_size)
        attn = d * h * hd * 2 + d * kv * hd * 2 + 2 * hd
        block = attn + 3 * d * f + 2 * d
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.vocab_size * d + self.num_hidden_layers * block + d + head

    def kv_bytes_per_token(self, dtype: torch.dtype = torch.float32) -> int:
        """Bytes of K and V a context token occupies across all layers."""
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * elem


class ModelOutput(NamedTuple):
    logits: torch.Tensor | None  # [B, S, V] or [B, 1, V]
    hidden: list[torch.Tensor]  # one [B, S, D] per requested block
    last_hidden: torch.Tensor  # [B, S, D], final block output before the final norm


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS over the last dim of x, times weight (broadcast against x: [dim], or stacked
    [..., dim] weights of several norms at once)."""
    # Normalise in fp32 as Qwen3RMSNorm does, so bf16 runs match transformers.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    # positions: [B, S] -> cos, sin: [B, S, 1, head_dim], broadcast over the heads of the
    # token-major [B, S, heads, head_dim] layout the projections produce (Attention.project)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device,
                                              dtype=torch.float32) / head_dim))
    freqs = positions.float()[..., None] * inv_freq  # [B, S, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [B, S, hd]
    return emb.cos().to(dtype)[:, :, None], emb.sin().to(dtype)[:, :, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, S, H, hd]; rotate-half convention (Llama/Qwen), not interleaved pairs.
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class SlotKVCache(nn.Module):
    """Keys and values per request slot: k, v [L][num_slots, n_kv, max_len, hd]."""

    def __init__(self, cfg: ModelConfig, num_slots: int, max_len: int,
                 device=None, dtype: torch.dtype = torch.float32):
        super().__init__()
        shape = (num_slots, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.num_slots, self.max_len = num_slots, max_len
        for i in range(cfg.num_hidden_layers):
            self.register_buffer(f"k{i}", torch.zeros(shape, device=device, dtype=dtype),
                                 persistent=False)
            self.register_buffer(f"v{i}", torch.zeros(shape, device=device, dtype=dtype),
                                 persistent=False)

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return getattr(self, f"k{i}"), getattr(self, f"v{i}")

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers())


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, h, kv, hd = (cfg.hidden_size, cfg.num_attention_heads,
                        cfg.num_key_value_heads, cfg.head_dim)
        self.n_heads, self.n_kv, self.head_dim = h, kv, hd
        self.q_proj = nn.Linear(d, h * hd, bias=False)
        self.k_proj = nn.Linear(d, kv * hd, bias=False)
        self.v_proj = nn.Linear(d, kv * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def project(self, x, cos, sin):
        """x [B, S, D] -> q [B, H, S, hd], k and v [B, KV, S, hd]: transposed views of the
        token-major tensors the projections produce. The norms and the rotation run on that
        [B, S, heads, hd] layout, contiguous whatever S, rather than on the transposed one,
        which is strided once S > 1. Elementwise, so the same values. Measured on the H200
        (profile of one 8-token target pass): the generic strided elementwise kernels went
        from 85 (161 us) to 73 (140 us), the pass from 746 to 734 us of kernels; the rest
        of them are broadcasts (norm weights, cos/sin), strided on any layout."""
        B, S, _ = x.shape
        q = apply_rope(self.q_norm(self.q_proj(x).view(B, S, self.n_heads, self.head_dim)),
                       cos, sin)
        k = apply_rope(self.k_norm(self.k_proj(x).view(B, S, self.n_kv, self.head_dim)),
                       cos, sin)
        v = self.v_proj(x).view(B, S, self.n_kv, self.head_dim)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x, cos, sin, kv_cache=None, slots=None, positions=None, kv_len=None):
        B, S, _ = x.shape
        q, k, v = self.project(x, cos, sin)  # [B, H|KV, S, hd]
        if kv_cache is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            out = self._cached_attention(q, k, v, kv_cache, slots, positions, kv_len)
        return self.o_proj(out.transpose(1, 2).reshape(B, S, -1))

    def _cached_attention(self, q, k, v, kv_cache, slots, positions, kv_len):
        ck, cv = kv_cache  # [N, KV, T, hd]
        # Write the new keys/values at (slot, position): index [B, S] -> rows of [N, T].
        rows = slots[:, None].expand_as(positions)
        ck[rows, :, positions] = k.transpose(1, 2).to(ck.dtype)  # value [B, S, KV, hd]
        cv[rows, :, positions] = v.transpose(1, 2).to(cv.dtype)
        keys = ck[slots, :, :kv_len].to(q.dtype)  # [B, KV, kv_len, hd]
        vals = cv[slots, :, :kv_len].to(q.dtype)
        key_pos = torch.arange(kv_len, device=q.device)
        mask = key_pos[None, None, None, :] <= positions[:, None, :, None]  # [B, 1, S, kv_len]
        return F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask, enable_gqa=True)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """A Qwen3 block: pre-norm attention and MLP, each added to the residual stream. The
    attention class is a parameter so the block drafter's layers (bidirectional attention
    over context keys, proposers/dflash.py) are the same module with HF's names."""

    def __init__(self, cfg: ModelConfig, attention: type[nn.Module] = Attention):
        super().__init__()
        self.self_attn = attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, **cache_kw):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, **cache_kw)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """`model.*` of Qwen3ForCausalLM: embeddings, blocks, final norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Qwen3Model(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def init_weights(self, std: float = 0.02) -> None:
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, std=std)

    def new_cache(self, num_slots: int, max_len: int, device=None,
                  dtype: torch.dtype = torch.float32) -> SlotKVCache:
        return SlotKVCache(self.config, num_slots, max_len, device=device, dtype=dtype)

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, S]
        positions: torch.Tensor | None = None,  # [B, S]
        cache: SlotKVCache | None = None,
        slots: torch.Tensor | None = None,  # [B]
        kv_len: int | None = None,
        hidden_layers: Sequence[int] = (),
        logits: Literal["all", "last", "none"] = "all",
    ) -> ModelOutput:
        B, S = input_ids.shape
        if positions is None:
            positions = torch.arange(S, device=input_ids.device).expand(B, S)
        if cache is not None:
            if slots is None:
                raise ValueError("a cached forward needs `slots`")
            kv_len = int(positions.max()) + 1 if kv_len is None else kv_len
        x = self.model.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, x.dtype)
        wanted = {i % self.config.num_hidden_layers: None for i in hidden_layers}
        for i, layer in enumerate(self.model.layers):
            kw = {}
            if cache is not None:
                kw = dict(kv_cache=cache.layer(i), slots=slots, positions=positions, kv_len=kv_len)
            x = layer(x, cos, sin, **kw)
            if i in wanted:
                wanted[i] = x
        hidden = [wanted[i % self.config.num_hidden_layers] for i in hidden_layers]
        out_logits = None
        if logits != "none":
            h = x[:, -1:] if logits == "last" else x
            out_logits = self.lm_head(self.model.norm(h))
        return ModelOutput(out_logits, hidden, x)


# --------------------------------------------------------------------------- weight layout
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


def weight_bytes(module) -> int:
    """Bytes of a module's parameters and non-cache buffers (tied tensors counted once)."""
    seen, n = set(), 0
    for t in list(module.parameters()) + [b for name, b in module.named_buffers()
                                          if not name.startswith("cache")]:
        if t is not None and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            n += t.numel() * t.element_size()
    return n
