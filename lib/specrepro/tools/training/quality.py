"""The model card's quality figures: perplexity, acceptance by position, repetition.

Design:
- Perplexity of the target on each held-out domain: documents joined with the
  end-of-text token, cut into windows, mean token loss.
- Acceptance is measured the way the engine runs: held-out prompts in a batch of
  slots, each step `propose` k drafts, one target pass verifies last token + k
  drafts, greedy acceptance (leading drafts equal to the target's argmax), the
  proposer `observe`s the whole chunk and rolls back by length. Generation stops
  at end of text (or `max_new`), so repetition past a document's end cannot
  inflate acceptance (repeated text is easy to draft); the share of repeated
  4-grams of the outputs stands beside every figure.
- Prompts: math = held-out GSM8K test questions ("Question: …\\nAnswer:"), code =
  the opening tokens of held-out standard-library files, prose = windows of
  held-out WikiText articles. Two splits of them (`QualitySpec.split`): "validation", the
  first `validation_prompts` of each domain (what recipes are picked on; the checkpoints
  before the engine-layout retrain were picked on these), and "test", the next `prompts`,
  which no recipe was picked on (what a card reports).
- Tokens per step = 1 + accepted drafts / steps (vLLM's acceptance length);
  acceptance at position i = steps whose first i drafts were all accepted / steps.
- Sampled acceptance (`sampled_temperature`, off by default): the same loop at
  temperature T through the same Proposer API, the drafter sampling its drafts
  from its own warped distribution q and the target verifying them with the
  lossless rejection rule (`sampling.verify_sampled`: accept x with probability
  min(1, p(x)/q(x))); one seeded generator per prompt (`sampled_seed` + prompt
  index), so the figure is reproducible and independent of batching. Its rows
  carry `temperature`; greedy rows carry none.
- Imports torch, the package's pure-Python metrics and the embedded sampling rules only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specrepro.embedded.model import Qwen3Model
from specrepro.embedded.proposers import Proposer
from specrepro.embedded.sampling import SamplingParams, make_generator, sample, verify_sampled, warp
from specrepro.embedded.tokenizer import Tokenizer
from specrepro.metrics import pooled_repeated_ngram_share
from specrepro.tools.training.corpus import DOMAINS, Document

SPLITS = ("validation", "test")


@dataclass
class QualitySpec:
    prompts: int = 32  # per domain
    split: str = "validation"  # SPLITS: which held-out prompts (the module docstring)
    validation_prompts: int = 32  # per domain; the test split's prompts come after them
    prompt_tokens: int = 128  # code and prose prompts
    max_new: tuple[tuple[str, int], ...] = (("math", 256), ("code", 128), ("prose", 128))
    ppl_tokens: int = 200_000  # per domain
    ppl_window: int = 1024
    block_ks: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 9)
    mtp_ks: tuple[int, ...] = (3, 5, 7)
    draft_model_ks: tuple[int, ...] = (3, 5, 7)
    # sampled acceptance: off when the temperature is None or a method's ks are empty
    sampled_temperature: float | None = None
    sampled_seed: int = 0
    sampled_block_ks: tuple[int, ...] = ()
    sampled_mtp_ks: tuple[int, ...] = ()
    sampled_draft_model_ks: tuple[int, ...] = ()


# --------------------------------------------------------------------------- prompts
def split_prompts(docs: list[Document], domain: str, spec: QualitySpec,
                  tok: Tokenizer) -> list[list[int]]:
    """The prompts of `spec.split`: validation = the first `validation_prompts`, test = the
    `prompts` after them."""
    if spec.split not in SPLITS:
        raise ValueError(f"quality split {spec.split!r}: expected one of {SPLITS}")
    if spec.split == "validation":
        return heldout_prompts(docs, domain, min(spec.prompts, spec.validation_prompts), tok,
                               spec.prompt_tokens)
    return heldout_prompts(docs, domain, spec.prompts, tok, spec.prompt_tokens,
                           skip=spec.validation_prompts)


def heldout_prompts(docs: list[Document], domain: str, n: int, tok: Tokenizer,
                    prompt_tokens: int, skip: int = 0) -> list[list[int]]:
    """Held-out prompts `skip`..`skip + n` of a domain (the same first ones whatever n)."""
    held = [d.text for d in docs if d.domain == domain and d.split == "heldout"]
    if domain == "math":
        return [tok.encode(t.split("\nAnswer:")[0] + "\nAnswer:") for t in held[skip:skip + n]]
    n += skip
    # Code and prose: windows of prompt_tokens at spread offsets, round robin over docs.
    ids = [tok.encode(t) for t in held]
    out, offset = [], 0
    while len(out) < n and ids:
        for seq in ids:
            if len(out) < n and len(seq) >= offset + prompt_tokens + 16:
                out.append(seq[offset:offset + prompt_tokens])
        offset += 4 * prompt_tokens
        if all(len(s) < offset + prompt_tokens + 16 for s in ids):
            break
    return out[skip:]


# --------------------------------------------------------------------------- perplexity
@torch.no_grad()
def perplexity(target: Qwen3Model, tok: Tokenizer, texts: list[str], max_tokens: int,
               window: int) -> float | None:
    ids: list[int] = []
    for t in texts:
        ids += tok.encode(t) + [tok.eos_token_id]
        if len(ids) >= max_tokens:
            break
    ids = ids[:max_tokens]
    if len(ids) < 2:
        return None
    dev = next(target.parameters()).device
    nll, count = 0.0, 0
    for s in range(0, len(ids) - 1, window):
        chunk = torch.tensor(ids[s:s + window + 1], device=dev)[None]
        logits = target(chunk[:, :-1]).logits.float()
        nll += F.cross_entropy(logits[0], chunk[0, 1:], reduction="sum").item()
        count += chunk.shape[1] - 1
    return math.exp(nll / count)


# --------------------------------------------------------------------------- acceptance
class Sampled:
    """Temperature sampling for a batch of slots, one seeded generator per prompt (slot).

    `drafter(slots)` is the `sample` callable a Proposer's `propose` takes (logits [b, V] ->
    tokens [b]); `verify(slots, drafts, draft_logits, target_logits)` applies the rejection
    rule and returns (accepted [b], next token [b]).
    """

    def __init__(self, temperature: float, seed: int, num_slots: int, device):
        self.params = SamplingParams(temperature=temperature)
        self.gens = [make_generator(seed + b, device) for b in range(num_slots)]

    def _rows(self, slots):
        idx = slots.tolist()
        return [self.params] * len(idx), [self.gens[b] for b in idx]

    def first(self, slot: int, logits):  # logits [V] -> token
        params, gens = self._rows(torch.tensor([slot]))
        return sample(warp(logits[None], params), gens)[0]

    def drafter(self, slots):
        params, gens = self._rows(slots)
        return lambda logits: sample(warp(logits, params), gens)

    def verify(self, slots, drafts, draft_logits, target_logits):
        params, gens = self._rows(slots)
        return verify_sampled(drafts, warp(draft_logits, params), warp(target_logits, params),
                              gens)


@torch.no_grad()
def simulate(target: Qwen3Model, prop: Proposer, prompts: list[list[int]], k: int,
             max_new: int, eos_id: int, temperature: float = 0.0, seed: int = 0) -> dict:
    """Speculative decoding of `prompts` (one slot each) with k drafts a step: greedy
    (temperature 0) or sampled with probabilistic verification (temperature > 0)."""
    dev = next(target.parameters()).device
    sampled = Sampled(temperature, seed, len(prompts), dev) if temperature > 0 else None
    dtype = next(target.parameters()).dtype
    B = len(prompts)
    max_len = max(len(p) for p in prompts) + max_new + k + 2
    cache = target.new_cache(B, max_len, device=dev, dtype=dtype)
    prop.allocate(B, max_len, device=dev, dtype=dtype)
    layers = prop.target_layers
    last = torch.zeros(B, dtype=torch.long, device=dev)
    for b, p in enumerate(prompts):  # prefill each prompt: lengths are ragged
        ids = torch.tensor(p, device=dev)[None]
        pos = torch.arange(len(p), device=dev)[None]
        out = target(ids, positions=pos, cache=cache, slots=torch.tensor([b], device=dev),
                     kv_len=len(p), hidden_layers=layers, logits="last")
        prop.observe(torch.tensor([b], device=dev), ids, pos, out.hidden)
        last[b] = (out.logits[0, -1].argmax() if sampled is None
                   else sampled.first(b, out.logits[0, -1]))
    ctx = torch.tensor([len(p) for p in prompts], device=dev)
    outputs = [[int(last[b])] for b in range(B)]
    active = [b for b in range(B) if outputs[b][-1] != eos_id]
    steps, accepted, per_pos = 0, 0, torch.zeros(k, dtype=torch.long)
    while active:
        act = torch.tensor(active, device=dev)
        drafts, draft_logits = prop.propose(act, ctx[act], last[act], k,
                                            None if sampled is None else sampled.drafter(act))
        chunk = torch.cat([last[act, None], drafts], 1)  # [b, k+1] verify
        pos = ctx[act, None] + torch.arange(k + 1, device=dev)
        out = target(chunk, positions=pos, cache=cache, slots=act, kv_len=int(pos.max()) + 1,
                     hidden_layers=layers)
        if sampled is None:
            greedy = out.logits.argmax(-1)  # [b, k+1]: the target's token after each position
            match = (drafts == greedy[:, :-1]).long().cumprod(1)  # leading accepted drafts
            n = match.sum(1)
            bonus = greedy.gather(1, n[:, None])[:, 0]
        else:  # n accepted, bonus = the residual's or the bonus position's sample
            n, bonus = sampled.verify(act, drafts, draft_logits, out.logits)
            match = (torch.arange(k, device=dev)[None] < n[:, None]).long()  # [b, k]
        prop.observe(act, chunk, pos, out.hidden)
        steps += len(active)
        accepted += int(n.sum())
        per_pos += match.sum(0).cpu()
        ctx[act] += n + 1
        last[act] = bonus
        still = []
        for i, b in enumerate(active):
            new = drafts[i, :int(n[i])].tolist() + [int(bonus[i])]
            outputs[b] += new
            if eos_id in new:
                outputs[b] = outputs[b][:len(outputs[b]) - len(new) + new.index(eos_id) + 1]
            elif len(outputs[b]) < max_new:
                still.append(b)
        active = still
    return {"k": k, "steps": steps, "accepted": accepted,
            "tokens_per_step": 1 + accepted / max(steps, 1),
            "per_position": (per_pos.double() / max(steps, 1)).tolist(),
            "output_tokens": sum(len(o) for o in outputs),
            "ended_at_eos": sum(o[-1] == eos_id for o in outputs) / B,
            "repeated_4gram_share": pooled_repeated_ngram_share(outputs, 4),
            "outputs": outputs}


def acceptance_ks(prop: Proposer, spec: QualitySpec) -> tuple[int, ...]:
    return {"dflash": spec.block_ks, "mtp": spec.mtp_ks,
            "draft_model": spec.draft_model_ks}[prop.method]


def acceptance_runs(prop: Proposer, spec: QualitySpec) -> list[tuple[int, float]]:
    """(k, temperature) of every figure for this drafter: the greedy ones, then the sampled."""
    runs = [(k, 0.0) for k in acceptance_ks(prop, spec)]
    if spec.sampled_temperature:
        ks = {"dflash": spec.sampled_block_ks, "mtp": spec.sampled_mtp_ks,
              "draft_model": spec.sampled_draft_model_ks}[prop.method]
        runs += [(k, float(spec.sampled_temperature)) for k in ks]
    return runs


def evaluate(target: Qwen3Model, tok: Tokenizer, proposers: dict[str, Proposer],
             docs: list[Document], spec: QualitySpec, log=print,
             perplexity_known: dict | None = None) -> dict:
    """All figures: {"perplexity": {domain: ppl}, "acceptance": [rows]}. `perplexity_known`:
    the target's perplexities from another split's run, reused (they do not depend on the
    prompts' split)."""
    result: dict = {"perplexity": {}, "acceptance": [], "prompts": {}, "split": spec.split}
    max_new = dict(spec.max_new)
    domains = [d for d in DOMAINS if any(x.domain == d and x.split == "heldout" for x in docs)]
    for dom in domains:
        texts = [d.text for d in docs if d.domain == dom and d.split == "heldout"]
        result["perplexity"][dom] = (perplexity_known[dom] if perplexity_known else
                                     perplexity(target, tok, texts, spec.ppl_tokens,
                                                spec.ppl_window))
        prompts = split_prompts(docs, dom, spec, tok)
        result["prompts"][dom] = len(prompts)
        if not prompts:  # a small corpus's held-out part can end before the test split
            log(f"quality {dom}: no {spec.split} prompts in the held-out documents; skipped")
            continue
        for name, prop in proposers.items():
            for k, temp in acceptance_runs(prop, spec):
                r = simulate(target, prop, prompts, k, max_new[dom], tok.eos_token_id,
                             temperature=temp, seed=spec.sampled_seed)
                r.pop("outputs")
                row = {"drafter": name, "method": prop.method, "domain": dom, **r,
                       "beyond_training": prop.method == "dflash" and k > prop.block_size - 1}
                if temp:
                    row["temperature"] = temp
                result["acceptance"].append(row)
                at = f" T={temp:g}" if temp else ""
                log(f"quality {dom:5s} {name:12s} k={k}{at}: {r['tokens_per_step']:.2f}"
                    f" tokens/step, repeated 4-grams {r['repeated_4gram_share'] or 0:.2f}")
    return result


# --------------------------------------------------------------------------- tables
def _row(res: dict, drafter: str, domain: str, k: int, temperature: float = 0.0) -> dict | None:
    for r in res["acceptance"]:
        if (r["drafter"] == drafter and r["domain"] == domain and r["k"] == k
                and r.get("temperature", 0.0) == temperature):
            return r
    return None


def markdown_tables(res: dict) -> str:
    """Perplexity, tokens per step by drafter and k, and per-position acceptance."""
    lines = ["| held-out domain | perplexity | prompts |", "| --- | --- | --- |"]
    for dom, ppl in res["perplexity"].items():
        lines.append(f"| {dom} | {ppl:.2f} | {res['prompts'].get(dom, 0)} |")
    drafters = list(dict.fromkeys(r["drafter"] for r in res["acceptance"]))
    temps = sorted({r.get("temperature", 0.0) for r in res["acceptance"]})
    for dom, temp in ((d, t) for t in temps for d in res["perplexity"]):
        how = (f"sampled at T = {temp:g}, probabilistic verification" if temp
               else "tokens per step")
        if not any(r["domain"] == dom and r.get("temperature", 0.0) == temp
                   for r in res["acceptance"]):
            continue
        lines += ["", f"**{dom}**: {how} (repeated 4-gram share of the outputs)", "",
                  ("| drafter | k | tokens/step | acceptance at positions 1..k (%) |"
                   " repeated 4-grams | ended at EOS |"),
                  "| --- | --- | --- | --- | --- | --- |"]
        for name in drafters:
            for r in res["acceptance"]:
                if (r["drafter"] != name or r["domain"] != dom
                        or r.get("temperature", 0.0) != temp):
                    continue
                pp = " / ".join(f"{100 * p:.0f}" for p in r["per_position"])
                note = " (block extended past training)" if r.get("beyond_training") else ""
                rep = r["repeated_4gram_share"]
                lines.append(f"| {name} | {r['k']}{note} | {r['tokens_per_step']:.2f} | {pp} | "
                             f"{'' if rep is None else f'{rep:.3f}'} | {r['ended_at_eos']:.2f} |")
    return "\n".join(lines) + "\n"


def headline(res: dict, block: str = "dflash", mtp: str = "mtp") -> dict:
    """The issue's targets on held-out math: block at k=7 vs MTP at k=3."""
    b, m = _row(res, block, "math", 7), _row(res, mtp, "math", 3)
    if b is None or m is None:
        return {}
    head = {"block_k7_tokens_per_step": b["tokens_per_step"],
            "mtp_k3_tokens_per_step": m["tokens_per_step"],
            "ratio": b["tokens_per_step"] / m["tokens_per_step"]}
    temps = sorted({r.get("temperature", 0.0) for r in res["acceptance"]} - {0.0})
    for t in temps:  # the same two figures sampled, when measured
        bs, ms = _row(res, block, "math", 7, t), _row(res, mtp, "math", 3, t)
        if bs is not None:
            head[f"sampled_T{t:g}_block_k7_tokens_per_step"] = bs["tokens_per_step"]
        if ms is not None:
            head[f"sampled_T{t:g}_mtp_k3_tokens_per_step"] = ms["tokens_per_step"]
    return head
