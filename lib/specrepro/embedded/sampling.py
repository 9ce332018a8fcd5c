"""Logit warping, per-request sampling and the lossless speculative verification rule.

Design:
- Pure tensor functions, batched over rows (one row = one running request); shapes in comments.
- Warping follows vLLM's sampler: temperature first, then top-k, then top-p (vLLM's
  `apply_top_k_top_p`: top-k keeps every token tied with the k-th logit, top-p keeps the
  smallest set of tokens whose mass reaches top_p and always the most likely one).
  Temperature 0 is greedy: its warped distribution is the one-hot of the argmax, so greedy and
  sampled rows verify with the same rule in one batch.
- Randomness is explicit: one `torch.Generator` per request, no global RNG. Each row draws
  only from its own generator, and only as many numbers as its own drafts need, so a seeded
  request's output does not depend on the other rows of its batch.
- Sampling is the exponential race (vLLM's `random_sample`): argmax(p / E), E ~ Exp(1) i.i.d.,
  draws token i with probability p_i / sum(p); it needs no normalisation, so a residual
  max(0, p - q) can be sampled as is.
- Verification is the rule of Leviathan et al. / Chen et al. (vLLM's rejection sampler), with
  ragged draft lengths per row (`num_drafts`), sampled drafts (q given) and deterministic
  drafts (q one-hot: greedy drafters, n-gram lookup).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

_GREEDY_EPS = 1e-5  # vLLM treats temperature < 1e-5 as greedy


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling settings, in OpenAI/vLLM terms."""

    temperature: float = 1.0  # >= 0; 0 = greedy
    top_p: float = 1.0  # in (0, 1]; 1 = off
    top_k: int = -1  # -1 or 0 = off, else >= 1
    seed: int | None = None  # None = a fresh nondeterministic generator

    def __post_init__(self):
        if not (self.temperature >= 0.0):  # also rejects NaN
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if int(self.top_k) != self.top_k or self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be -1, 0 or >= 1, got {self.top_k}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A request's own generator: seeded when the request gives a seed, else nondeterministic."""
    g = torch.Generator(device=device)
    if seed is None:
        g.seed()
    else:
        g.manual_seed(int(seed))
    return g


@dataclass(frozen=True)
class SamplingTensors:
    """The batch's sampling settings as vectors, one entry per row."""

    temperature: torch.Tensor  # [B] float32
    top_p: torch.Tensor  # [B] float32
    top_k: torch.Tensor  # [B] int64, vocabulary size where off
    greedy: torch.Tensor  # [B] bool
    # host-side flags, so warping skips what no row uses without a device sync
    any_top_k: bool = True
    any_top_p: bool = True
    any_greedy: bool = True

    @classmethod
    def from_params(cls, params: Sequence[SamplingParams], vocab_size: int,
                    device: torch.device | str = "cpu") -> SamplingTensors:
        top_k = [p.top_k if p.top_k >= 1 else vocab_size for p in params]
        return cls(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32,
                                     device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            top_k=torch.tensor(top_k, dtype=torch.int64, device=device).clamp(max=vocab_size),
            greedy=torch.tensor([p.is_greedy for p in params], dtype=torch.bool, device=device),
            any_top_k=any(k < vocab_size for k in top_k),
            any_top_p=any(p.top_p < 1.0 for p in params),
            any_greedy=any(p.is_greedy for p in params),
        )


def _as_tensors(params, vocab_size: int, device) -> SamplingTensors:
    if isinstance(params, SamplingTensors):
        return params
    return SamplingTensors.from_params(params, vocab_size, device)


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None,
                      top_p: torch.Tensor | None) -> torch.Tensor:
    """Mask logits outside each row's top-k, then outside its top-p nucleus (vLLM's order).

    logits: [N, V] (already divided by temperature); top_k: [N] int64 in [1, V] or None (off);
    top_p: [N] or None (off). Returns [N, V] with masked entries at -inf.
    """
    if top_k is None and top_p is None:
        return logits
    v = logits.shape[-1]
    logits_sort, idx = logits.sort(dim=-1, descending=False)  # [N, V], ascending
    if top_k is not None:
        kth = logits_sort.gather(1, (v - top_k).unsqueeze(1))  # [N, 1] the k-th largest logit
        logits_sort = logits_sort.masked_fill(logits_sort < kth, float("-inf"))
    if top_p is not None:
        # mass of all tokens up to and including this one, ascending; drop a token when the
        # mass at or below it is within 1 - top_p, and never drop the most likely token
        cum = logits_sort.softmax(dim=-1).cumsum(dim=-1)  # [N, V]
        drop = cum <= (1.0 - top_p).unsqueeze(1)
        drop[:, -1] = False
        logits_sort = logits_sort.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits_sort).scatter_(-1, idx, logits_sort)


def warp(logits: torch.Tensor, params: SamplingTensors | Sequence[SamplingParams]) -> torch.Tensor:
    """Logits -> the distribution a request samples from, in float32.

    logits: [B, ..., V]; params: one entry per row (B). Every position of a row is warped
    with that row's settings (a verify pass gives [B, k+1, V]). Returns probs [B, ..., V].
    Greedy rows get the one-hot of the argmax.
    """
    shape = logits.shape
    b, v = shape[0], shape[-1]
    st = _as_tensors(params, v, logits.device)
    if st.temperature.shape[0] != b:
        raise ValueError(f"warp: {st.temperature.shape[0]} sampling rows for {b} logit rows")
    x = logits.reshape(b, -1, v).float()  # [B, N, V]
    n = x.shape[1]
    per_pos = lambda t: t.repeat_interleave(n)  # [B] -> [B*N], row-major like x
    temp = torch.where(st.greedy, torch.ones_like(st.temperature), st.temperature)
    x = (x / temp.view(b, 1, 1)).reshape(b * n, v)  # [B*N, V]
    x = apply_top_k_top_p(x, per_pos(st.top_k) if st.any_top_k else None,
                          per_pos(st.top_p) if st.any_top_p else None)
    probs = x.softmax(dim=-1)  # [B*N, V]
    if st.any_greedy:
        onehot = torch.zeros_like(probs).scatter_(-1, x.argmax(-1, keepdim=True), 1.0)
        probs = torch.where(per_pos(st.greedy).unsqueeze(1), onehot, probs)
    return probs.reshape(shape)


def sample(probs: torch.Tensor, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """Draw one token per row (and per position) with the row's own generator.

    probs: [B, ..., V], nonnegative, need not sum to one. Returns tokens [B, ...] int64.
    """
    if len(generators) != probs.shape[0]:
        raise ValueError(f"sample: {len(generators)} generators for {probs.shape[0]} rows")
    noise = torch.empty_like(probs, dtype=torch.float32)
    for row, g in enumerate(generators):
        noise[row].exponential_(generator=g)
    return _race(probs, noise)


def _race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Exponential race: argmax_i p_i / E_i picks i with probability p_i / sum(p).

    probs, noise (E ~ Exp(1)): [..., V] -> [...]. E is clamped away from 0 so a
    zero-probability entry never becomes 0/0 = NaN.
    """
    return (probs.float() / noise.clamp(min=torch.finfo(torch.float32).tiny)).argmax(dim=-1)


def _drafts_mask(num_drafts: torch.Tensor | None, b: int, k: int, device) -> torch.Tensor:
    """[B, k] bool: position i holds a real draft of the row (i < num_drafts)."""
    if num_drafts is None:
        return torch.ones(b, k, dtype=torch.bool, device=device)
    if int(num_drafts.min()) < 0 or int(num_drafts.max()) > k:
        raise ValueError(f"num_drafts must be in [0, {k}], got {num_drafts.tolist()}")
    return torch.arange(k, device=device).unsqueeze(0) < num_drafts.to(device).unsqueeze(1)


def _leading_true(mask: torch.Tensor) -> torch.Tensor:
    """[B, k] bool -> [B] int64: length of the run of True at the start of each row."""
    return mask.to(torch.int64).cumprod(dim=1).sum(dim=1)


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor,
                  num_drafts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification: accept drafts while they equal the target's argmax.

    draft_tokens: [B, k]; target_logits: [B, k+1, V] (position i scores the token after
    draft i-1; position num_drafts is the bonus); num_drafts: [B] drafts per row (default k).
    Returns (num_accepted [B], next_token [B]): next_token is the target's argmax at the first
    mismatch (the correction), or at position num_drafts (the bonus) when all drafts pass;
    both are argmax[num_accepted].
    """
    b, k = draft_tokens.shape
    target = target_logits.argmax(dim=-1)  # [B, k+1]
    match = (draft_tokens == target[:, :k]) & _drafts_mask(num_drafts, b, k, draft_tokens.device)
    num_accepted = _leading_true(match)  # [B]
    next_token = target.gather(1, num_accepted.unsqueeze(1)).squeeze(1)  # [B]
    return num_accepted, next_token


def verify_sampled(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
                   target_probs: torch.Tensor, generators: Sequence[torch.Generator],
                   num_drafts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless rejection sampling: the emitted tokens are distributed as the target's.

    draft_tokens: [B, k]; draft_probs q: [B, k, V] the (warped) distributions the drafts were
    drawn from, or None for deterministic drafts (q = one-hot of the draft); target_probs p:
    [B, k+1, V] warped target distributions; generators: one per row; num_drafts: [B] (default k).
    Returns (num_accepted [B], next_token [B]).

    For draft x_i ~ q_i, with u_i ~ U[0, 1) from the row's generator:
      accept x_i  iff  u_i < min(1, p_i(x) / q_i(x))     (written u·q < p: no division, q=0 safe)
      p >= q: always accept;  p < q: accept with probability p/q
      at the first rejection i: next ~ norm(max(0, p_i - q_i))   (the "residual")
      all n drafts accepted:    next ~ p_n                       (the bonus token)
    One-hot q (deterministic draft x): accept with probability p(x), and the residual
    max(0, p - onehot(x)) is p with x removed.
    """
    b, k = draft_tokens.shape
    if len(generators) != b:
        raise ValueError(f"verify_sampled: {len(generators)} generators for {b} rows")
    dev = target_probs.device
    real = _drafts_mask(num_drafts, b, k, dev)  # [B, k]
    n_real = real.sum(dim=1)  # [B]
    n_host = n_real.tolist()  # one sync, not one per row
    p_draft = target_probs[:, :k].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [B, k]
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)
    else:
        q_draft = draft_probs.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [B, k]

    # each row draws, from its own generator and in one call (one kernel per row on a GPU),
    # the V uniforms of its next-token race and then its own number of acceptance uniforms,
    # so the batch's composition never shifts a row's random stream
    v = target_probs.shape[-1]
    draws = torch.ones(b, v + k, dtype=torch.float32, device=dev)  # [B, V + k]
    for row, g in enumerate(generators):
        torch.rand(v + n_host[row], generator=g, device=dev, out=draws[row, : v + n_host[row]])
    u = draws[:, v:]  # [B, k], ones past a row's drafts (masked by `real` anyway)
    race_noise = -torch.log1p(-draws[:, :v])  # [B, V] ~ Exp(1) by inversion
    accepted = (u * q_draft < p_draft) & real
    num_accepted = _leading_true(accepted)  # [B]

    # the distribution of the next token: residual at the first rejection, else p at the bonus
    pos = num_accepted.view(b, 1, 1).expand(b, 1, target_probs.shape[-1])
    p_next = target_probs.gather(1, pos).squeeze(1).float()  # [B, V]
    rejected = num_accepted < n_real  # [B]
    q_pos = pos.clamp(max=k - 1) if k > 0 else pos
    if k == 0:
        q_next = torch.zeros_like(p_next)
    elif draft_probs is None:
        x = draft_tokens.gather(1, q_pos[:, :, 0]).squeeze(1)  # [B]
        q_next = torch.zeros_like(p_next).scatter_(1, x.unsqueeze(1), 1.0)
    else:
        q_next = draft_probs.gather(1, q_pos).squeeze(1).float()  # [B, V]
    residual = (p_next - q_next).clamp(min=0.0)
    # rounding can empty the residual (it has positive mass only in exact arithmetic): fall
    # back to p, which is what the residual tends to as its mass vanishes from rounding alone
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_next)
    next_dist = torch.where(rejected.unsqueeze(1), residual, p_next)
    return num_accepted, _race(next_dist, race_noise)


def accepted_per_position(num_accepted: torch.Tensor, k: int) -> torch.Tensor:
    """[B] -> [k] int64: rows that accepted at least i+1 drafts, for vLLM's
    `spec_decode_num_accepted_tokens_per_pos` counter (label position="i")."""
    positions = torch.arange(k, device=num_accepted.device)
    return (num_accepted.unsqueeze(1) > positions.unsqueeze(0)).sum(dim=0)


def emitted_tokens(draft_tokens: torch.Tensor, num_accepted: torch.Tensor,
                   next_token: torch.Tensor, pad: int = -1) -> torch.Tensor:
    """The tokens a step emits per row: the accepted drafts, then the next token.

    draft_tokens: [B, k]; num_accepted, next_token: [B]. Returns [B, k+1] int64, row i holding
    num_accepted[i] + 1 tokens followed by `pad`.
    """
    b, k = draft_tokens.shape
    out = torch.full((b, k + 1), pad, dtype=torch.int64, device=draft_tokens.device)
    cols = torch.arange(k + 1, device=draft_tokens.device).unsqueeze(0)  # [1, k+1]
    out[:, :k] = torch.where(cols[:, :k] < num_accepted.unsqueeze(1), draft_tokens, pad)
    out.scatter_(1, num_accepted.unsqueeze(1), next_token.unsqueeze(1).to(torch.int64))
    return out
