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
- The drafters are `proposers/` (n-gram lookup included); `--speculative-config` is read by
  `specrepro.speculative.SpecConfig`.
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


def step_rows(drafts: Drafts, accepted: Accepted) -> tuple[torch.Tensor, torch.Tensor]:
    """A step's outcome for one host read: (num_drafts [B], rows [B, k+3] int64 =
    (num_drafts, num_accepted, drafts..., next token)); num_drafts is k where the drafter
    gives no count (every draft real)."""
    k = drafts.tokens.shape[1]
    num = (drafts.num_drafts if drafts.num_drafts is not None
           else torch.full_like(accepted.num_accepted, k))
    rows = torch.cat([num[:, None], accepted.num_accepted[:, None], drafts.tokens,
                      accepted.next_token[:, None]], dim=1)
    return num, rows


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
