"""The MTP head: one decoder layer that drafts by re-running on its own output, in two layouts.

Design:
- `layout: "deepseek"` (DeepSeek-V3 / Qwen3-Next MTP): one Qwen3 decoder layer on
  `eh_proj([norm(h_p); norm(emb(x_{p+1}))])` at position p, h the target's last block output
  before its final norm, predicting x_{p+2} through the head's own final norm and the
  target's (shared, frozen) output head.
- `layout: "eagle"` (EAGLE-1, what vLLM 0.26.0 `llama_eagle.py` and SGLang 0.5.14
  `LlamaForCausalLMEagle` run for a Qwen3 target, docs/engine-layouts.md §3-4): `fc([emb(x_{p+1});
  h_p])`, embedding first, no norms and no bias; h the target's *final-normed* hidden state; a
  Llama layer (no QK-norm) whose input norm is the identity; no final norm: the target's head
  reads the layer's raw output, which is also the next step's h. Neither real engine runs the
  DeepSeek layout for a plain Qwen3 target (vLLM's `mtp` needs a target architecture with its
  own MTP layer), so the suite's MTP arm is this EAGLE-style head in every engine. The
  parameter names are the engines' (`fc`, `layers.0.*`), so the export renames nothing.
- Its entry at p needs the *next* token, so `observe` writes entries for all but the last
  position of a chunk and keeps the target's hidden states per position (`hbuf`, [slots,
  max_len, D]); `propose` writes the entry at context_len-1 with `last_token`, then re-runs
  the layer on its own output k times.
- Trained for `mtp_train_depth` steps (1 = DeepSeek-V3 / Qwen3-Next: the next-next token),
  step j reading step j-1's output at the position and with the keys `propose` gives it
  (`training_loss`: the step-1 entries of the context plus the chain's own, not the
  same-step entries of every earlier position). The EAGLE head's later steps read its
  own un-normed output where the first reads a normed hidden state, so it is trained unrolled
  to the depth it runs (3).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specrepro.embedded.model import (
    Attention,
    DecoderLayer,
    ModelConfig,
    Qwen3Model,
    RMSNorm,
    SlotKVCache,
    apply_rope,
    rope_cos_sin,
)
from specrepro.embedded.proposers.base import DrafterConfig, Proposer, SharedTarget, draft_loop


class LlamaAttention(Attention):
    """The target's attention without QK-norm (a Llama layer, as the engines' EAGLE-1 heads)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        del self.q_norm, self.k_norm

    def project(self, x, cos, sin):
        # x [B, S, D] -> q [B, H, S, hd], k and v [B, KV, S, hd] (as Attention.project)
        B, S, _ = x.shape
        q = apply_rope(self.q_proj(x).view(B, S, self.n_heads, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(B, S, self.n_kv, self.head_dim), cos, sin)
        v = self.v_proj(x).view(B, S, self.n_kv, self.head_dim)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


class EagleLayer(DecoderLayer):
    """Layer 0 of an EAGLE-1 head: a Llama layer whose input norm is the identity (vLLM
    `llama_eagle.py` and SGLang `llama_eagle.py` replace it; `fc`'s output goes straight in)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, LlamaAttention)
        self.input_layernorm = nn.Identity()


class MTPHead(Proposer):
    method = "mtp"

    def __init__(self, cfg: DrafterConfig, target_cfg: ModelConfig, target: Qwen3Model):
        super().__init__()
        if cfg.num_hidden_layers != 1:
            raise ValueError("the MTP head has exactly one layer")
        d = target_cfg.hidden_size
        self.cfg, self.target_cfg = cfg, target_cfg
        self.layer_cfg = cfg.layer_config(target_cfg)
        self.target_layers = (target_cfg.num_hidden_layers - 1,)
        self.eagle = cfg.layout == "eagle"
        if self.eagle:  # the engines' names: fc, layers.0.*
            self.fc = nn.Linear(2 * d, d, bias=False)
            self.layers = nn.ModuleList([EagleLayer(self.layer_cfg)])
        else:
            self.hnorm = RMSNorm(d, target_cfg.rms_norm_eps)
            self.enorm = RMSNorm(d, target_cfg.rms_norm_eps)
            self.eh_proj = nn.Linear(2 * d, d, bias=False)
            self.layer = DecoderLayer(self.layer_cfg)
            self.norm = RMSNorm(d, target_cfg.rms_norm_eps)
        self.shared = SharedTarget(target)

    @property
    def _in_proj(self) -> nn.Linear:
        return self.fc if self.eagle else self.eh_proj

    @property
    def _layer(self) -> DecoderLayer:
        return self.layers[0] if self.eagle else self.layer

    def _layer_input(self, h, next_tokens):
        # h [B, S, D], next_tokens [B, S] -> the layer's input [B, S, D], in each layout's order
        emb = self.shared.embed(next_tokens)
        if self.eagle:
            return self.fc(torch.cat([emb, h], -1))
        return self.eh_proj(torch.cat([self.hnorm(h), self.enorm(emb)], -1))

    def _rope(self, positions, dtype):
        return rope_cos_sin(positions, self.target_cfg.head_dim, self.target_cfg.rope_theta, dtype)

    def head_input(self, h):
        """The target's hidden state as the head reads it at its first step: h [B, S, D] is the
        last block's output before the final norm; EAGLE reads it after the target's norm."""
        return self.shared.norm(h) if self.eagle else h

    def step(self, h, next_tokens, positions, slots=None):
        # h: [B, S, D] hidden at positions (head_input's, or the previous step's output);
        # next_tokens: [B, S] tokens at positions+1. With `slots`, K/V go to (slot, position)
        # of the head's cache (serving).
        z = self._layer_input(h, next_tokens)
        cos, sin = self._rope(positions, z.dtype)
        kw = {}
        if slots is not None:
            kw = {"kv_cache": self.cache.layer(0), "slots": slots, "positions": positions,
                  "kv_len": self._kv_len(positions, self.cache.max_len)}
        return self._layer(z, cos, sin, **kw)  # [B, S, D]

    def logits(self, h):
        return self.shared.lm_head(h if self.eagle else self.norm(h))

    def _unrolled_layer(self, z, positions, past_k, past_v, mask):
        """The head's layer over z [B, n, D] at positions [B, n], attending to past keys and
        values [B, KV, P, hd] (None at step 1) and its own, under mask [n, P + n] (True =
        attend). Returns the output [B, n, D] and the keys and values it attended to, the past
        ones then its own [B, KV, P + n, hd]: the next step's past."""
        layer = self._layer
        cos, sin = self._rope(positions, z.dtype)
        q, k, v = layer.self_attn.project(layer.input_layernorm(z), cos, sin)
        keys = k if past_k is None else torch.cat([past_k, k], 2)
        vals = v if past_v is None else torch.cat([past_v, v], 2)
        out = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask, enable_gqa=True)
        z = z + layer.self_attn.o_proj(out.transpose(1, 2).reshape(*z.shape[:2], -1))
        return z + layer.mlp(layer.post_attention_layernorm(z)), keys, vals

    def unrolled_logits(self, tokens, hidden):
        """tokens [B, T]; hidden: [last-layer hidden [B, T, D]] -> one logits tensor
        [B, T-j, V] per step j = 1..mtp_train_depth, unrolled as `propose` runs the steps.
        Chain i drafts after position i: step 1 is the entry at position i on (h_i, x_{i+1}),
        the one `observe` writes, and attends causally to the step-1 entries; step j >= 2 sits
        at position i + j - 1 on (step j-1's output, x_{i+j}) and attends to the step-1
        entries at positions <= i (the context a propose at context length i + 1 finds in the
        head's cache) and to its own chain's entries of steps 2..j (the ones propose wrote
        before it). Step j's entry i predicts the token at i + j + 1."""
        h, (B, T) = self.head_input(hidden[0]), tokens.shape
        dev = tokens.device
        out = []
        past_k = past_v = None  # keys of step 1 [B, KV, T-1, hd], then of steps 2..j-1
        for j in range(1, self.cfg.mtp_train_depth + 1):
            n = T - j  # chains 0..n-1 still have a label at step j
            pos = (torch.arange(n, device=dev) + j - 1).expand(B, n)
            z = self._layer_input(h[:, :n], tokens[:, j:])
            rows = torch.arange(n, device=dev)[:, None]
            if j == 1:
                mask = rows >= torch.arange(n, device=dev)[None]  # causal [n, n]
            else:
                # step 1's keys (T-1 of them): positions <= i; each later step's (T-m of them,
                # m = 2..j, the last being this step's own): chain i's entry only
                blocks = [rows >= torch.arange(T - 1, device=dev)[None]]
                blocks += [rows == torch.arange(T - m, device=dev)[None] for m in range(2, j + 1)]
                mask = torch.cat(blocks, 1)
            h, past_k, past_v = self._unrolled_layer(z, pos, past_k, past_v, mask)
            out.append(self.logits(h))
        return out

    def training_loss(self, tokens, labels, hidden, **_):
        """tokens, labels [B, T] (labels[:, i] = target's greedy token for i+1);
        hidden: [last-layer hidden [B, T, D]]. The loss of every unrolled step
        (`unrolled_logits`), step j weighted loss_decay**(j-1)."""
        total, weight, per_step = 0.0, 0.0, []
        for j, logits in enumerate(self.unrolled_logits(tokens, hidden), start=1):
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels[:, j:].flatten(),
                                   ignore_index=-100)
            w = self.cfg.loss_decay ** (j - 1)
            total, weight = total + w * loss, weight + w
            per_step.append(loss.detach())
        return total / weight, torch.stack(per_step)

    # -- Proposer --------------------------------------------------------------
    def allocate(self, num_slots, max_len, device=None, dtype=torch.float32):
        self._cache_dtype = dtype
        self.cache = SlotKVCache(self.layer_cfg, num_slots, max_len, device=device, dtype=dtype)
        # The target's last hidden state per position (as head_input gives it): propose needs
        # h at context_len-1, which after a verify lies inside the observed chunk, not at its end.
        self.hbuf = torch.zeros(num_slots, max_len, self.target_cfg.hidden_size,
                                device=device, dtype=dtype)

    def kv_bytes_per_token(self):
        return (self.layer_cfg.kv_bytes_per_token(self._cache_dtype)
                + self.target_cfg.hidden_size * self._elem())

    @torch.no_grad()
    def observe(self, slots, tokens, positions, hidden):
        h = self.head_input(hidden[0])
        self.hbuf[slots[:, None].expand_as(positions), positions] = h.to(self.hbuf.dtype)
        if tokens.shape[1] > 1:  # entries whose next token is inside the chunk
            self.step(h[:, :-1].to(self._in_proj.weight.dtype), tokens[:, 1:], positions[:, :-1],
                      slots)

    @torch.no_grad()
    def propose(self, slots, context_len, last_token, k, sample=None):
        pos = (context_len - 1)[:, None]  # [B, 1]
        state = {"h": self.hbuf[slots, context_len - 1][:, None].to(self._in_proj.weight.dtype)}

        def step(j, prev):
            nxt = last_token[:, None] if prev is None else prev[:, None]
            p = pos + j
            state["h"] = self.step(state["h"], nxt, p, slots)
            return self.logits(state["h"])[:, 0]

        return draft_loop(step, k, sample)

