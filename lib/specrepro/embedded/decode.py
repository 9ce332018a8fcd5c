"""The decode stage: one speculative step (spec.py) for every request that was decoding when
the engine's step began, and the step's tokens handed back to the engine.

Design:
- Two paths, one result. Static (`EngineConfig.static_shapes`, on with CUDA graphs): one run
  of graphs.py's fixed-shape program for (batch bucket, k), replayed from a CUDA graph on
  CUDA; it drafts greedily, so it serves batches that are all greedy, n-gram drafts, or
  `draft_sample_method: greedy`; a sampled row is then accepted eagerly from the program's
  logits with its own generator. Staged (the CPU default, and sampled drafts, whose
  per-request generators a graph cannot hold): spec.speculative_step's four stages one by
  one. Both end in the same [B, k + 3] rows.
- One host read per step: the rows (num_drafts, num_accepted, drafts..., next token) come
  back with one `.tolist()`; counters and outputs are then plain Python.
- Counters are vLLM's: a row that drafted counts one draft, its draft tokens and its
  accepted ones, and each accepted position (`accepted_per_pos`).
- It reads the engine's public parts only (`forward`, `decode_step`, `timed`,
  `timed_proposer`, `emit`), as prefill.py does.
"""

from __future__ import annotations

import torch

from specrepro.embedded import spec as spec_mod
from specrepro.embedded.graphs import eager_attention
from specrepro.embedded.sampling import SamplingTensors
from specrepro.embedded.spec import DecodeBatch


def run(engine, seqs: list, k: int, outputs: list) -> None:
    """One speculative step for the decoding requests `seqs` (engine.py's `RequestState`s)
    at k drafts each; their new tokens go to `outputs` through `engine.emit`."""
    params = [s.req.sampling for s in seqs]
    all_greedy = all(p.is_greedy for p in params)
    # the fixed-shape program drafts greedily; sampled drafts take the staged path
    if engine.static and (all_greedy or engine.ragged
                          or engine.spec.draft_sample_method == "greedy"):
        rows = _static(engine, seqs, k, params, all_greedy)
    else:
        with eager_attention(engine.device):
            rows = _staged(engine, seqs, k, params, all_greedy)
    # rows: [B] lists (num_drafts, num_accepted, drafts..., next token), one host read
    stats = engine.stats
    stats.num_spec_steps += 1
    for seq, row in zip(seqs, rows):
        nd, na = row[0], row[1]
        if nd > 0:
            seq.spec_steps += 1
            seq.draft_tokens += nd
            seq.accepted += na
            stats.num_drafts += 1
            stats.num_draft_tokens += nd
            stats.num_accepted_tokens += na
            for i in range(na):  # vLLM's accepted-per-position counter
                stats.accepted_per_pos[i] += 1
        seq.context_len += na + 1
        engine.emit(seq, row[2:2 + na] + [row[-1]], outputs)


def _batch(engine, seqs: list, params, all_greedy: bool, slots=None, context_len=None,
           last_token=None) -> DecodeBatch:
    """The stages' view of `seqs`: [B] int64 slots, context lengths and last tokens on the
    engine's device (built here unless given), and the sampling tensors of sampled rows."""
    dev = engine.device

    def col(values):
        return torch.tensor(values, dtype=torch.int64, device=dev)  # [B]
    return DecodeBatch(
        slots=col([s.slot for s in seqs]) if slots is None else slots,
        context_len=col([s.context_len for s in seqs]) if context_len is None else context_len,
        last_token=col([s.last_token for s in seqs]) if last_token is None else last_token,
        params=params, generators=[s.generator for s in seqs], all_greedy=all_greedy,
        sampling=None if all_greedy else SamplingTensors.from_params(
            params, engine.model.config.vocab_size, dev))


def _static(engine, seqs: list, k: int, params, all_greedy: bool) -> list:
    """One replay of the (bucket, k) program; sampled rows then verify eagerly."""
    b = len(seqs)
    program = engine.decode_step
    host = program.inputs([s.slot for s in seqs], [s.context_len for s in seqs],
                          [s.last_token for s in seqs])  # [3, bucket] on the host
    out = engine.timed(program, host, k)
    if all_greedy:  # acceptance ran inside the program
        return out["rows"][:b].tolist()
    inputs = host[:, :b].to(engine.device)  # [3, B]: slots, context_len, last_token
    batch = _batch(engine, seqs, params, False, *inputs)
    num = out["num_drafts"][:b]  # [B]
    drafts = spec_mod.Drafts(out["drafts"][:b], None, num if engine.ragged else None)
    verified = spec_mod.Verified(out["logits"][:b], None, None, [])  # logits [B, k+1, V]
    acc = spec_mod.accept(batch, drafts, verified)
    return spec_mod.step_rows(drafts, acc)[1].tolist()


def _staged(engine, seqs: list, k: int, params, all_greedy: bool) -> list:
    """The four stages one by one (spec.speculative_step): the CPU default, and sampled
    drafts (each row draws from its own generator, which a graph cannot hold)."""
    batch = _batch(engine, seqs, params, all_greedy)
    end = max(s.context_len for s in seqs) + k + 1  # the attention length the verify needs

    def forward(ids, pos, slots, layers):
        return engine.timed(engine.forward, ids, pos, slots, layers, "all", end)
    drafts, acc = spec_mod.speculative_step(forward, engine.timed_proposer(), batch, k,
                                            engine.spec.draft_sample_method)
    # one transfer back: [B, k + 3] = (num_drafts, num_accepted, drafts..., next token)
    return spec_mod.step_rows(drafts, acc)[1].tolist()
