"""Prompt lookup (vLLM's `ngram`): drafts copied from the request's own history.

Design:
- It needs no weights, only the token history, which it keeps from `observe` ([slots,
  max_len] token ids) like any drafter keeps its caches; it costs no context capacity.
- `propose_ragged` returns fewer drafts for a row whose lookup finds a short or no match
  (`num_drafts`); the speculative step pads such rows after their real drafts.
- With `static_bound` (CUDA graphs) it searches whole history rows, masking windows past a
  row's length, so its shapes depend only on (batch, k) and it reads nothing back to the host.
"""

from __future__ import annotations

import torch

from specrepro.speculative import SpecConfig


class NgramProposer:
    """Prompt lookup (vLLM's `ngram`): find the latest earlier occurrence of the context's
    last n tokens (n from max down to min) and propose the tokens that followed it."""

    method = "ngram"
    target_layers: tuple[int, ...] = ()
    static_bound: bool = False  # search whole history rows (fixed shapes for CUDA graphs)

    def __init__(self, lookup_min: int = 5, lookup_max: int = 5):
        self.lookup_min, self.lookup_max = lookup_min, lookup_max
        self.tokens: torch.Tensor | None = None  # [num_slots, max_len] token history

    def allocate(self, num_slots: int, max_len: int, device, dtype=None) -> None:
        self.tokens = torch.zeros(num_slots, max_len, dtype=torch.int64, device=device)

    def kv_bytes_per_token(self) -> int:
        return 0  # token ids only, no KV: prompt lookup costs no context capacity (as vLLM)

    def weight_bytes(self) -> int:
        return 0

    def observe(self, slots, tokens, positions, hidden) -> None:
        # tokens, positions: [B, S]
        self.tokens[slots[:, None].expand_as(positions), positions] = tokens

    def release(self, slot: int) -> None:
        pass  # history is overwritten by the next request in the slot (by length)

    def propose_ragged(self, slots, context_len, last_token, k):
        """-> (tokens [B, k], num_drafts [B]); rows without a match get 0 drafts."""
        b = slots.shape[0]
        length = context_len + 1  # [B] the history plus last_token
        # the whole row when static: windows past a row's length are masked out below
        width = self.tokens.shape[1] if self.static_bound else int(length.max())
        ctx = self.tokens[slots, :width].clone()  # [B, W]
        ctx[torch.arange(b, device=ctx.device), context_len] = last_token
        start = torch.full((b,), -1, dtype=torch.int64, device=ctx.device)  # continuation start
        cols = torch.arange(width, device=ctx.device)
        for n in range(self.lookup_max, self.lookup_min - 1, -1):
            if width <= n:
                continue
            tail = ctx.gather(1, (length[:, None] - n + torch.arange(n, device=ctx.device))
                              .clamp(min=0))  # [B, n] the last n tokens
            hit = (ctx.unfold(1, n, 1) == tail[:, None, :]).all(-1)  # [B, W-n+1] window starts
            # a usable match ends before the last token (something follows it) and the row
            # is long enough to hold the n-gram twice over its own length
            ok = hit & (cols[: width - n + 1] + n < length[:, None]) & (length[:, None] > n)
            latest = torch.where(ok, cols[: width - n + 1], -1).amax(dim=1)  # [B]
            found = (latest >= 0) & (start < 0)
            start = torch.where(found, latest + n, start)
        num = torch.where(start >= 0, (length - start).clamp(max=k), 0)  # [B]
        idx = (start.clamp(min=0)[:, None] + torch.arange(k, device=ctx.device)).clamp(
            max=width - 1)
        drafts = torch.where(torch.arange(k, device=ctx.device) < num[:, None],
                             ctx.gather(1, idx), 0)
        return drafts, num


def make_ngram(cfg: SpecConfig) -> NgramProposer:
    return NgramProposer(cfg.prompt_lookup_min, cfg.prompt_lookup_max)
