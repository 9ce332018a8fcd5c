"""The MTP head (DeepSeek-V3 style): one decoder layer that drafts by re-running on its own
output.

Design:
- One decoder layer on `eh_proj([norm(h_p); norm(emb(x_{p+1}))])` at position p, predicting
  x_{p+2} through the target's (shared, frozen) embedding and output head.
- Its entry at p needs the *next* token, so `observe` writes entries for all but the last
  position of a chunk and keeps the target's hidden states per position (`hbuf`, [slots,
  max_len, D]); `propose` writes the entry at context_len-1 with `last_token`, then re-runs
  the layer on its own output k times.
- Trained for `mtp_train_depth` steps (1 = DeepSeek-V3 / Qwen3-Next: the next-next token),
  step j reading step j-1's output as inference does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specrepro.embedded.model import (
    DecoderLayer,
    ModelConfig,
    Qwen3Model,
    RMSNorm,
    SlotKVCache,
    rope_cos_sin,
)
from specrepro.embedded.proposers.base import DrafterConfig, Proposer, SharedTarget, draft_loop


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
        self.hnorm = RMSNorm(d, target_cfg.rms_norm_eps)
        self.enorm = RMSNorm(d, target_cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * d, d, bias=False)
        self.layer = DecoderLayer(self.layer_cfg)
        self.norm = RMSNorm(d, target_cfg.rms_norm_eps)
        self.shared = SharedTarget(target)

    def step(self, h, next_tokens, positions, slots=None):
        # h: [B, S, D] hidden at positions; next_tokens: [B, S] tokens at positions+1.
        # With `slots`, K/V go to (slot, position) of the head's cache (serving).
        z = self.eh_proj(torch.cat([self.hnorm(h), self.enorm(self.shared.embed(next_tokens))], -1))
        cos, sin = rope_cos_sin(positions, self.target_cfg.head_dim, self.target_cfg.rope_theta,
                                z.dtype)
        kw = {}
        if slots is not None:
            kw = {"kv_cache": self.cache.layer(0), "slots": slots, "positions": positions,
                  "kv_len": self._kv_len(positions, self.cache.max_len)}
        return self.layer(z, cos, sin, **kw)  # [B, S, D]

    def logits(self, h):
        return self.shared.lm_head(self.norm(h))

    def training_loss(self, tokens, labels, hidden, **_):
        """tokens, labels [B, T] (labels[:, i] = target's greedy token for i+1);
        hidden: [last-layer hidden [B, T, D]]. Unrolls `mtp_train_depth` steps, step j
        reading step j-1's output as inference does."""
        h, T = hidden[0], tokens.shape[1]
        total, weight, per_step = 0.0, 0.0, []
        for j in range(1, self.cfg.mtp_train_depth + 1):
            n = T - j  # step j at index i reads (h_i, x_{i+j}) and predicts label[i+j]
            pos = torch.arange(n, device=tokens.device).expand(tokens.shape[0], n)
            h = self.step(h[:, :n], tokens[:, j:], pos)
            loss = F.cross_entropy(self.logits(h).flatten(0, 1).float(),
                                   labels[:, j:].flatten(), ignore_index=-100)
            w = self.cfg.loss_decay ** (j - 1)
            total, weight = total + w * loss, weight + w
            per_step.append(loss.detach())
        return total / weight, torch.stack(per_step)

    # -- Proposer --------------------------------------------------------------
    def allocate(self, num_slots, max_len, device=None, dtype=torch.float32):
        self._cache_dtype = dtype
        self.cache = SlotKVCache(self.layer_cfg, num_slots, max_len, device=device, dtype=dtype)
        # The target's last hidden state per position: propose needs h at context_len-1,
        # which after a verify lies inside the observed chunk, not at its end.
        self.hbuf = torch.zeros(num_slots, max_len, self.target_cfg.hidden_size,
                                device=device, dtype=dtype)

    def kv_bytes_per_token(self):
        return (self.layer_cfg.kv_bytes_per_token(self._cache_dtype)
                + self.target_cfg.hidden_size * self._elem())

    @torch.no_grad()
    def observe(self, slots, tokens, positions, hidden):
        h = hidden[0]
        self.hbuf[slots[:, None].expand_as(positions), positions] = h.to(self.hbuf.dtype)
        if tokens.shape[1] > 1:  # entries whose next token is inside the chunk
            self.step(h[:, :-1].to(self.eh_proj.weight.dtype), tokens[:, 1:], positions[:, :-1],
                      slots)

    @torch.no_grad()
    def propose(self, slots, context_len, last_token, k, sample=None):
        pos = (context_len - 1)[:, None]  # [B, 1]
        state = {"h": self.hbuf[slots, context_len - 1][:, None].to(self.eh_proj.weight.dtype)}

        def step(j, prev):
            nxt = last_token[:, None] if prev is None else prev[:, None]
            p = pos + j
            state["h"] = self.step(state["h"], nxt, p, slots)
            return self.logits(state["h"])[:, 0]

        return draft_loop(step, k, sample)

