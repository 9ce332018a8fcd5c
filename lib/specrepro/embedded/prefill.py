"""The prefill stage: each prefilling request's next prompt chunk through the target, the
final chunk sampling the request's first output token.

Design:
- The chunks. In arrival order, each prefilling request takes the rest of its prompt or
  what is left of the step's token budget (`max_num_batched_tokens` less the decode rows,
  engine.py), until the budget is spent.
- One pass per request (the default): a chunk is one [1, T] target pass, eager (prompt
  lengths vary, so no CUDA graph), and one host read of its first token. A request's
  prefill shares no pass with another, so its output never depends on what else arrived
  (the engine's batch invariance). Under load that admission is serial: 32 GSM8K prompts
  arriving at once on the H200 got their first tokens over 36-448 ms
  (docs/bench/peer-h200-2026-12-02.md).
- Batched (`EngineConfig.batched_prefill`, the server's `--batched-prefill`): every chunk
  of the step in one [B, T] pass, right-padded to the longest chunk T, and one host read
  for all first tokens. A row's pads take the positions after its real tokens in the
  request's own cache row, so the attention mask (a key's position <= the query's) keeps
  them from every real query, and nothing reads a position at or past a request's length
  before it is written again (the rollback-by-length rule of model.py and the drafters'
  caches, which observe the same padded batch). A row whose pads would run past its cache
  row prefills alone. Each first token is read from its row's last real position.
  The price: a chunk shares its GEMMs with other rows, so its numbers can differ from its
  one-request prefill in the last bits (bf16 on a GPU most of all), and a near-tie may
  then pick another token; it is off by default and a profile turns it on.
"""

from __future__ import annotations

import torch

from specrepro.embedded.sampling import sample, warp


def chunks(prefilling: list, budget: int) -> list[tuple]:
    """[(seq, start, end)]: each prefilling request's next chunk, until the budget is spent."""
    out = []
    for seq in prefilling:
        if budget <= 0:
            break
        start = seq.num_computed
        end = min(len(seq.req.prompt_token_ids), start + budget)
        out.append((seq, start, end))
        budget -= end - start
    return out


def run(engine, prefilling: list, budget: int, outputs: list) -> None:
    """Prefill the step's chunks, one pass each or (batched_prefill) padded into one."""
    work = chunks(prefilling, budget)
    if not engine.config.batched_prefill or len(work) < 2:
        for seq, start, end in work:
            _one(engine, seq, start, end, outputs)
        return
    width = max(end - start for _, start, end in work)
    alone = [c for c in work if c[1] + width > engine.cache_len]  # pads would leave the row
    for seq, start, end in alone:
        _one(engine, seq, start, end, outputs)
    batch = [c for c in work if c[1] + width <= engine.cache_len]
    if len(batch) == 1:
        _one(engine, *batch[0], outputs)
    elif batch:
        _padded(engine, batch, width, outputs)


def _target_layers(engine) -> tuple:
    return tuple(getattr(engine.proposer, "target_layers", ()) or ())


def _one(engine, seq, start: int, end: int, outputs: list) -> None:
    prompt = seq.req.prompt_token_ids
    dev = engine.device
    ids = torch.tensor([prompt[start:end]], dtype=torch.int64, device=dev)  # [1, T]
    pos = torch.arange(start, end, device=dev)[None]  # [1, T]
    slot = torch.tensor([seq.slot], device=dev)
    last = end == len(prompt)
    out = engine.timed(engine.forward, ids, pos, slot, _target_layers(engine),
                        "last" if last else "none")
    if engine.proposer is not None:
        engine.timed(engine.proposer_calls.observe, slot, ids, pos, out.hidden)
    _advance(engine, seq, start, end)
    if last:  # the prompt's last logits give the first output token
        _first_tokens(engine, [seq], out.logits[:, -1], outputs)  # logits [1, V]


def _padded(engine, batch: list[tuple], width: int, outputs: list) -> None:
    dev = engine.device
    ids = torch.zeros(len(batch), width, dtype=torch.int64)  # [B, T], pads are token 0
    pos = torch.empty(len(batch), width, dtype=torch.int64)  # [B, T]
    for i, (seq, start, end) in enumerate(batch):
        ids[i, : end - start] = torch.tensor(seq.req.prompt_token_ids[start:end])
        pos[i] = torch.arange(start, start + width)  # pads follow the real positions
    ids, pos = ids.to(dev), pos.to(dev)
    slots = torch.tensor([seq.slot for seq, _, _ in batch], device=dev)  # [B]
    out = engine.timed(engine.forward, ids, pos, slots, _target_layers(engine), "none")
    if engine.proposer is not None:
        engine.timed(engine.proposer_calls.observe, slots, ids, pos, out.hidden)
    for seq, start, end in batch:
        _advance(engine, seq, start, end)
    finals = [i for i, (seq, _, end) in enumerate(batch)
              if end == len(seq.req.prompt_token_ids)]
    if not finals:
        return
    rows = torch.tensor(finals, device=dev)
    last = torch.tensor([batch[i][2] - batch[i][1] - 1 for i in finals], device=dev)
    h = out.last_hidden[rows, last]  # [F, D]: each final row's last real position
    head = engine.model
    logits = engine.timed(lambda: head.lm_head(head.model.norm(h)))  # [F, V], as "last" does
    _first_tokens(engine, [batch[i][0] for i in finals], logits, outputs)


def _advance(engine, seq, start: int, end: int) -> None:
    seq.num_computed = seq.context_len = end
    engine.stats.prompt_tokens += end - start


def _first_tokens(engine, seqs: list, logits: torch.Tensor, outputs: list) -> None:
    """Sample each request's first token from its row of logits [F, V]: greedy rows in one
    host read, sampled rows each with the request's own generator."""
    params = [s.req.sampling for s in seqs]
    greedy = logits.argmax(-1).tolist() if any(p.is_greedy for p in params) else []
    for i, (seq, p) in enumerate(zip(seqs, params)):
        tok = (greedy[i] if p.is_greedy
               else int(sample(warp(logits[i:i + 1], [p]), [seq.generator])[0]))
        engine.emit(seq, [tok], outputs)
