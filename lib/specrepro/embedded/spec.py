"""The speculative step: propose -> verify -> accept -> update, batched over running requests.

Design:
- One step serves every running request at once. The rows of a batch share one draft length
  k (chosen by batch size, vLLM's `num_speculative_tokens_per_batch_size`); a row may hold
  fewer real drafts (`num_drafts`: n-gram lookup finds short or no matches), its tail padded
  with token 0. Padding sits *after* the row's real tokens, so under causal attention no real
  query can see it; its cache entries lie past the row's length and are overwritten later
  (rollback by length, model.py).
- The four stages are functions from tensors to tensors (Medusa's
  `generate_candidates` / `tree_decoding` / `evaluate_posterior` / `update_inference_inputs`):
    propose  the drafter's k tokens after `last_token` (and their logits, for q)
    verify   one target pass over [last_token, drafts] -> logits [B, k+1, V], hidden states
    accept   sampling.py's lossless rule -> (num_accepted [B], next_token [B])
    update   the drafter observes the verify pass; lengths advance by num_accepted + 1
- `method: none` is k = 0: the verify pass is a plain decode and accept samples one token.
- Draft sampling follows vLLM's `draft_sample_method`: "greedy" (default) drafts the argmax,
  verified as deterministic drafts (q one-hot), "probabilistic" samples drafts from the
  request's warped draft distribution with the request's own generator (q = that
  distribution). Both are lossless; an all-greedy batch takes the cheaper greedy rule.
- `NgramProposer` (prompt lookup) lives here: it needs no weights, only the token history,
  which it keeps from `observe` like any drafter keeps its caches.
- `draft_verify_observe` is the same stages as one host-read-free tensor program (greedy
  drafts, the drafter observing the verify pass before acceptance, which it does not depend
  on): the engine runs it at fixed shapes and, on CUDA, captures it per (batch bucket, k) in a
  CUDA graph. Greedy acceptance has no host read either (ragged n-gram rows are masked with
  an impossible token rather than counted on the host), so it joins the program.

The step never loops over rows in Python except where a row's own generator must draw.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from specrepro.embedded.sampling import (
    SamplingParams,
    SamplingTensors,
    sample,
    verify_greedy,
    verify_sampled,
    warp,
)

METHODS = ("none", "mtp", "dflash", "draft_model", "ngram")
MODEL_METHODS = ("mtp", "dflash", "draft_model")
_SPEC_KEYS = {"method", "num_speculative_tokens", "num_speculative_tokens_per_batch_size",
              "quantization", "prompt_lookup_min", "prompt_lookup_max", "draft_sample_method",
              "model"}


class SpecConfigError(ValueError):
    """A speculative config is invalid; the message names the key."""


# ----------------------------------------------------------------------------- configuration

@dataclass(frozen=True)
class SpecConfig:
    """`--speculative-config` as data, in vLLM's keys."""

    method: str = "none"
    num_speculative_tokens: int = 0
    schedule: tuple[tuple[int, int, int], ...] | None = None  # [[lo, hi, k], ...]
    quantization: str | None = None  # None | "fp8_per_tensor" (the drafter)
    prompt_lookup_min: int = 5
    prompt_lookup_max: int = 5
    draft_sample_method: str = "greedy"  # "greedy" | "probabilistic"
    model: str | None = None  # a drafter directory other than the target's

    @classmethod
    def from_dict(cls, d: dict | None) -> SpecConfig:
        if not d:
            return cls()
        d = {k.replace("-", "_"): v for k, v in d.items()}  # vLLM converts dashes too
        unknown = sorted(set(d) - _SPEC_KEYS)
        if unknown:
            raise SpecConfigError(f"speculative config: unknown key(s) {unknown}; "
                                  f"expected some of {sorted(_SPEC_KEYS)}")
        method = d.get("method", "none") or "none"
        if method not in METHODS:
            raise SpecConfigError(f"speculative config: method={method!r}, expected one of "
                                  f"{METHODS}")
        k = d.get("num_speculative_tokens")
        if method != "none" and k is None:
            raise SpecConfigError(f"speculative config: method={method!r} needs "
                                  "num_speculative_tokens")
        k = 0 if method == "none" else k
        if not isinstance(k, int) or k < 0 or k > 64:
            raise SpecConfigError(f"speculative config: num_speculative_tokens={k!r}, "
                                  "expected an integer in [0, 64]")
        lo, hi = d.get("prompt_lookup_min"), d.get("prompt_lookup_max")
        lo, hi = (lo or hi or 5), (hi or lo or 5)  # vLLM: both default to 5, one sets the other
        if not (1 <= lo <= hi):
            raise SpecConfigError(f"speculative config: prompt_lookup_min={lo}, "
                                  f"prompt_lookup_max={hi}, expected 1 <= min <= max")
        dsm = d.get("draft_sample_method", "greedy")
        if dsm not in ("greedy", "probabilistic"):
            raise SpecConfigError(f"speculative config: draft_sample_method={dsm!r}, "
                                  "expected 'greedy' or 'probabilistic'")
        quant = d.get("quantization")
        if quant not in (None, "fp8_per_tensor"):
            raise SpecConfigError(f"speculative config: quantization={quant!r}, expected null "
                                  "or 'fp8_per_tensor'")
        sched = d.get("num_speculative_tokens_per_batch_size")
        return cls(method, k, None if sched is None else parse_schedule(sched), quant, lo, hi,
                   dsm, d.get("model"))

    def k_for_batch(self, batch_size: int) -> int:
        """Drafts per request at this batch size (vLLM's dynamic K), capped at k."""
        if self.schedule is None:
            return self.num_speculative_tokens
        return min(schedule_k(self.schedule, batch_size), self.num_speculative_tokens)


def parse_schedule(entries) -> tuple[tuple[int, int, int], ...]:
    """Validate `[[lo, hi, k], ...]` as vLLM does: inclusive ends, the first range starts at
    1, no overlaps, k >= 0. Returns the ranges sorted by start."""
    try:
        rows = sorted((int(a), int(b), int(c)) for a, b, c in entries)
    except (TypeError, ValueError) as e:
        raise SpecConfigError("speculative config: num_speculative_tokens_per_batch_size must "
                              f"be a list of [start, end, k] triples, got {entries!r}") from e
    key = "num_speculative_tokens_per_batch_size"
    if not rows or rows[0][0] != 1:
        raise SpecConfigError(f"speculative config: {key}: the first range must start at 1, "
                              f"got {entries!r}")
    for (a, b, c), nxt in zip(rows, rows[1:] + [None]):
        if b < a or c < 0:
            raise SpecConfigError(f"speculative config: {key}: bad range [{a}, {b}, {c}] "
                                  "(need start <= end, k >= 0)")
        if nxt is not None and nxt[0] <= b:
            raise SpecConfigError(f"speculative config: {key}: ranges [{a}, {b}] and "
                                  f"[{nxt[0]}, {nxt[1]}] overlap")
    return tuple(rows)


def schedule_k(schedule: Sequence[tuple[int, int, int]], batch_size: int) -> int:
    """k of the range holding batch_size; in a gap or past the end, the previous range's k."""
    k = schedule[0][2]
    for lo, hi, kk in schedule:
        if lo > batch_size:
            break
        k = kk
    return k


# ----------------------------------------------------------------------------- n-gram lookup

class NgramProposer:
    """Prompt lookup (vLLM's `ngram`): find the latest earlier occurrence of the context's
    last n tokens (n from max down to min) and propose the tokens that followed it."""

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


# ----------------------------------------------------------------------------- the step

@dataclass
class DecodeBatch:
    """The running requests of one step, as the stages see them."""

    slots: torch.Tensor  # [B] int64 cache rows
    context_len: torch.Tensor  # [B] int64 tokens already in the caches
    last_token: torch.Tensor  # [B] int64 sampled, not yet processed, at position context_len
    params: list[SamplingParams]
    generators: list[torch.Generator]
    all_greedy: bool = True
    sampling: SamplingTensors | None = field(default=None)  # built once per step if sampled


class Drafts(NamedTuple):
    tokens: torch.Tensor  # [B, k]
    probs: torch.Tensor | None  # [B, k, V] warped q of sampled drafts; None = deterministic
    num_drafts: torch.Tensor | None  # [B] real drafts per row; None = all k


class Verified(NamedTuple):
    logits: torch.Tensor  # [B, k+1, V]
    input_ids: torch.Tensor  # [B, k+1] last_token then the drafts
    positions: torch.Tensor  # [B, k+1]
    hidden: list  # one [B, k+1, D] per proposer.target_layers entry


class Accepted(NamedTuple):
    num_accepted: torch.Tensor  # [B] drafts accepted
    next_token: torch.Tensor  # [B] the correction or bonus token


def propose(proposer, batch: DecodeBatch, k: int, draft_sample_method: str = "greedy") -> Drafts:
    """Stage 1: k drafts per row after last_token."""
    b, dev = batch.slots.shape[0], batch.slots.device
    if proposer is None or k == 0:
        return Drafts(torch.zeros(b, 0, dtype=torch.int64, device=dev), None, None)
    if hasattr(proposer, "propose_ragged"):
        tokens, num = proposer.propose_ragged(batch.slots, batch.context_len,
                                              batch.last_token, k)
        return Drafts(tokens, None, num)
    if batch.all_greedy or draft_sample_method == "greedy":
        tokens, _ = proposer.propose(batch.slots, batch.context_len, batch.last_token, k)
        return Drafts(tokens, None, None)
    st = batch.sampling

    def draw(logits):  # [B, V] -> [B], each row from its own warped q and generator
        return sample(warp(logits, st), batch.generators)

    tokens, logits = proposer.propose(batch.slots, batch.context_len, batch.last_token, k,
                                      sample=draw)
    return Drafts(tokens, warp(logits, st), None)


def verify(forward: Callable, batch: DecodeBatch, drafts: Drafts,
           hidden_layers: Sequence[int]) -> Verified:
    """Stage 2: one target pass over [last_token, drafts] at the rows' next positions.

    forward(input_ids [B, S], positions [B, S], slots [B], hidden_layers) -> ModelOutput;
    the engine binds the cache and the attention length.
    """
    s = drafts.tokens.shape[1] + 1
    ids = torch.cat([batch.last_token[:, None], drafts.tokens], dim=1)  # [B, k+1]
    pos = batch.context_len[:, None] + torch.arange(s, device=ids.device)  # [B, k+1]
    out = forward(ids, pos, batch.slots, hidden_layers)
    return Verified(out.logits, ids, pos, out.hidden)


def accept(batch: DecodeBatch, drafts: Drafts, verified: Verified) -> Accepted:
    """Stage 3: the lossless rule (sampling.py), greedy when every row is greedy."""
    if batch.all_greedy:
        return accept_greedy(drafts, verified)
    p = warp(verified.logits, batch.sampling)  # [B, k+1, V]
    return Accepted(*verify_sampled(drafts.tokens, drafts.probs, p, batch.generators,
                                    drafts.num_drafts))


def accept_greedy(drafts: Drafts, verified: Verified) -> Accepted:
    """Stage 3 for greedy rows, with no host read: a row's padding past its `num_drafts` is
    replaced by -1, which never equals the target's argmax, so acceptance stops there exactly
    as `verify_greedy`'s draft mask would stop it."""
    tokens, k = drafts.tokens, drafts.tokens.shape[1]
    if k == 0:
        return Accepted(torch.zeros(tokens.shape[0], dtype=torch.int64, device=tokens.device),
                        verified.logits[:, 0].argmax(-1))
    if drafts.num_drafts is not None:
        real = torch.arange(k, device=tokens.device) < drafts.num_drafts[:, None]  # [B, k]
        tokens = torch.where(real, tokens, -1)
    return Accepted(*verify_greedy(tokens, verified.logits))


def update(proposer, batch: DecodeBatch, verified: Verified, accepted: Accepted) -> None:
    """Stage 4: the drafter observes the verify pass (entries past each row's accepted length
    are stale and get overwritten); the rows' lengths and next inputs advance in place."""
    if proposer is not None:
        proposer.observe(batch.slots, verified.input_ids, verified.positions, verified.hidden)
    advance(batch, accepted)


def advance(batch: DecodeBatch, accepted: Accepted) -> None:
    """The rest of stage 4 once the drafter has observed: lengths and next inputs."""
    batch.context_len += accepted.num_accepted + 1
    batch.last_token = accepted.next_token


def draft_verify_observe(forward: Callable, proposer, slots: torch.Tensor,
                         context_len: torch.Tensor, last_token: torch.Tensor, k: int,
                         hidden_layers: Sequence[int]) -> tuple[Drafts, Verified]:
    """Stages 1, 2 and the drafter's half of 4 for greedy drafts, as one tensor program.

    slots, context_len, last_token: [B]; forward as in `verify`, at a fixed attention span
    (the proposer's `static_bound` likewise), so for a given (B, k) every shape is fixed and
    nothing is read back to the host: the engine captures it in a CUDA graph. The drafter
    observes the whole verify pass before acceptance; entries past a row's accepted length
    are overwritten later (rollback by length), so the order does not change its caches.
    """
    batch = DecodeBatch(slots, context_len, last_token, params=[], generators=[])
    drafts = propose(proposer, batch, k, "greedy")
    verified = verify(forward, batch, drafts, hidden_layers)
    if proposer is not None:
        proposer.observe(slots, verified.input_ids, verified.positions, verified.hidden)
    return drafts, verified


def speculative_step(forward: Callable, proposer, batch: DecodeBatch, k: int,
                     draft_sample_method: str = "greedy") -> tuple[Drafts, Accepted]:
    """propose -> verify -> accept -> update, for every row of the batch."""
    drafts = propose(proposer, batch, k, draft_sample_method)
    hidden_layers = tuple(getattr(proposer, "target_layers", ()) or ())
    verified = verify(forward, batch, drafts, hidden_layers)
    accepted = accept(batch, drafts, verified)
    update(proposer, batch, verified, accepted)
    return drafts, accepted
