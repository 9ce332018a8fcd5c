"""The draft model: an independent small `Qwen3Model` that drafts autoregressively.

Design:
- A Hugging Face checkpoint of its own (so `transformers` can use it as an assistant model),
  sharing the target's vocabulary, with its own KV cache; it ignores the target's hidden
  states (`target_layers` is empty).
- `propose` is k one-token passes through the shared draft loop (`draft_loop`), a fixed
  sequence of tensor ops for a given k, so a CUDA graph captures all k steps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specrepro.embedded.model import ModelConfig, Qwen3Model
from specrepro.embedded.proposers.base import DrafterConfig, Proposer, draft_loop


class DraftModel(Proposer):
    method = "draft_model"
    target_layers = ()

    def __init__(self, cfg: DrafterConfig, target_cfg: ModelConfig, target=None):
        super().__init__()
        self.cfg = cfg
        self.model_cfg = ModelConfig.from_dict(
            {**cfg.draft, "vocab_size": target_cfg.vocab_size,
             "max_position_embeddings": target_cfg.max_position_embeddings,
             "eos_token_id": target_cfg.eos_token_id})
        self.model = Qwen3Model(self.model_cfg)

    def training_loss(self, tokens, labels, hidden=None, **_):
        logits = self.model(tokens).logits
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        return loss, loss.detach()[None]

    def allocate(self, num_slots, max_len, device=None, dtype=torch.float32):
        self._cache_dtype = dtype
        self.cache = self.model.new_cache(num_slots, max_len, device=device, dtype=dtype)

    def kv_bytes_per_token(self):
        return self.model_cfg.kv_bytes_per_token(self._cache_dtype)

    @torch.no_grad()
    def observe(self, slots, tokens, positions, hidden=()):
        self.model(tokens, positions=positions, cache=self.cache, slots=slots,
                   kv_len=self._kv_len(positions, self.cache.max_len), logits="none")

    @torch.no_grad()
    def propose(self, slots, context_len, last_token, k, sample=None):
        def step(j, prev):
            x = last_token if prev is None else prev
            pos = (context_len + j)[:, None]
            return self.model(x[:, None], positions=pos, cache=self.cache, slots=slots,
                              kv_len=self._kv_len(pos, self.cache.max_len),
                              logits="last").logits[:, -1]

        return draft_loop(step, k, sample)

