"""The training loops: target pre-training, self-distillation data, drafter training.

Design (the steps after the corpus and tokenizer; `cli.py` runs them in order):
- Data: per domain, the training documents' ids joined by end-of-text into one token
  stream [N]; training batches are random windows of it [n, length] drawn with the run's
  seeded CPU generator, so a seed fixes every batch on any device.
- Target: Qwen3 architecture, random windows of the token stream, AdamW (no decay on
  norms and biases) + cosine schedule with warm-up, bf16 autocast and `torch.compile` on
  CUDA; about ten epochs (38 epochs over 3.4M tokens memorised the corpus and wrecked
  held-out perplexity, ~10 generalised far better); the last `long_frac` of the steps at a
  longer sequence length (batch halved, same tokens a step), so few-shot prompts of ~1k
  tokens sit inside training.
- Self-distillation data: continuations of random corpus windows by the frozen target,
  batched with the slot KV cache. Drafters trained on the target's own outputs accept far
  more (as EAGLE and DFlash do it; first-position acceptance on math rose from 52 % to
  74 %), and they need many continuations (with 4,096 the MTP head overfitted, training
  loss 0.02, and acceptance fell). Greedy, or a mix of greedy and sampled ones
  (`distill_mix`, recipe v2), each temperature with its own seeded device generator.
- Drafters: all trained together on the same batches; one frozen target pass per batch
  gives the hidden states they read and the labels (the target's argmax after every
  position). A drafter on a trunk starts from the stored trunk drafter's weights, frozen. A
  block drafter with the engines' block (`block: "engine"`) is trained at a random block
  length per sequence, 2..block_size, since the engines run 1 + k positions at k drafts.
  With a time budget the step rate is timed at steps 10-40 and the step count cut to fit.
- `torch.compile` failures fall back to eager (`maybe_compile`): a compiler bug must not
  lose a run.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specrepro.embedded.checkpoint import load_proposer
from specrepro.embedded.model import ModelConfig, Qwen3Model
from specrepro.embedded.proposers import DrafterConfig, Proposer, build_proposer
from specrepro.embedded.tokenizer import Tokenizer
from specrepro.tools.training.corpus import DOMAINS, Document
from specrepro.tools.training.recipes import Recipe, greedy_only, mix_label


class Log:
    """Progress lines to stderr, with the seconds since start."""

    def __init__(self):
        self.t0 = time.time()

    def __call__(self, msg: str) -> None:
        print(f"[{time.time() - self.t0:7.1f}s] {msg}", file=sys.stderr, flush=True)

    def elapsed(self) -> float:
        return time.time() - self.t0


# --------------------------------------------------------------------------- data
def token_streams(docs: list[Document], tok: Tokenizer, device) -> dict[str, torch.Tensor]:
    """Per domain, the training documents' ids joined by (and ending with) end-of-text."""
    out = {}
    for dom in DOMAINS:
        texts = [d.text for d in docs if d.domain == dom and d.split == "train"]
        if not texts:
            continue
        ids = tok.encode_batch(texts)
        flat = np.fromiter((t for seq in ids for t in (*seq, tok.eos_token_id)), dtype=np.int64)
        out[dom] = torch.from_numpy(flat).to(device)
    return out


def windows(stream: torch.Tensor, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """n random windows [n, length] of a token stream."""
    starts = torch.randint(0, len(stream) - length, (n,), generator=gen, device="cpu")
    return stream[(starts[:, None] + torch.arange(length)).to(stream.device)]


def cosine_lr(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def adamw(params, lr, weight_decay):
    params = [p for p in params if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), fused=torch.cuda.is_available())


def maybe_compile(fn, enabled: bool, log: Log):
    if not enabled:
        return fn
    compiled = torch.compile(fn, dynamic=False)
    state = {"fn": compiled}

    def call(*a, **kw):
        try:
            return state["fn"](*a, **kw)
        except Exception as e:  # a compiler failure must not lose the run: fall back
            if state["fn"] is fn:
                raise
            log(f"torch.compile failed ({type(e).__name__}: {str(e)[:200]}); running eager")
            state["fn"] = fn
            return fn(*a, **kw)

    return call


def bf16_autocast(device: torch.device) -> torch.autocast:
    """bf16 autocast on CUDA; disabled (fp32) on any other device."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                          enabled=device.type == "cuda")


# --------------------------------------------------------------------------- target
def train_target(r: Recipe, cfg: ModelConfig, streams, device, gen, log: Log, compile_: bool):
    model = Qwen3Model(cfg).to(device)
    model.init_weights(std=0.02)
    opt = adamw(model.parameters(), r.lr, r.weight_decay)
    stream = torch.cat(list(streams.values()))
    amp = bf16_autocast(device)

    def loss_fn(x, y):
        with amp:
            logits = model(x).logits
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    step_fn = maybe_compile(loss_fn, compile_, log)
    long_from = int(r.target_steps * (1 - r.long_frac))
    losses, t_start = [], time.time()
    log(f"target: {cfg.num_parameters() / 1e6:.2f}M parameters, {len(stream):,} training tokens,"
        f" {r.target_steps} steps")
    for step in range(r.target_steps):
        seq, bs = ((r.long_seq_len, r.batch_size // 2) if step >= long_from
                   else (r.seq_len, r.batch_size))
        w = windows(stream, bs, seq + 1, gen)
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, r.target_steps, r.lr, r.warmup)
        loss = step_fn(w[:, :-1], w[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.detach())
        if step % 100 == 0 or step == r.target_steps - 1:
            log(f"target step {step}: loss {loss.item():.3f} (seq {seq})")
    final = torch.stack(losses[-20:]).mean().item()
    tokens = (long_from * r.batch_size * r.seq_len
              + (r.target_steps - long_from) * (r.batch_size // 2) * r.long_seq_len)
    stats = {"final_loss": final, "steps": r.target_steps, "wall_s": time.time() - t_start,
             "tokens_seen": tokens, "epochs": tokens / len(stream)}
    return model.eval(), stats


# --------------------------------------------------------------------------- distillation data
@torch.no_grad()
def target_continuations(target: Qwen3Model, prompts: torch.Tensor, gen_len: int,
                         batch: int, temperature: float = 0.0,
                         gen: torch.Generator | None = None) -> torch.Tensor:
    """[N, P] prompts -> [N, P + gen_len]: prompts followed by the target's tokens, greedy
    at temperature 0, else sampled from softmax(logits / temperature) with `gen` (a
    generator on the prompts' device: one stream for the whole batch, no per-row loop)."""
    dev = prompts.device

    def next_token(logits):  # [n, V] -> [n]
        if temperature <= 0:
            return logits.argmax(-1)
        probs = torch.softmax(logits.float() / temperature, -1)
        return torch.multinomial(probs, 1, generator=gen)[:, 0]

    outs = []
    amp = bf16_autocast(dev)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    for s in range(0, len(prompts), batch):
        p = prompts[s:s + batch]
        n, P = p.shape
        cache = target.new_cache(n, P + gen_len, device=dev, dtype=dtype)
        slots = torch.arange(n, device=dev)
        toks = []
        with amp:
            out = target(p, positions=torch.arange(P, device=dev).expand(n, P), cache=cache,
                         slots=slots, kv_len=P, logits="last")
            for t in range(gen_len):
                toks.append(next_token(out.logits[:, -1]))
                if t == gen_len - 1:
                    break
                pos = torch.full((n, 1), P + t, device=dev)
                out = target(toks[-1][:, None], positions=pos, cache=cache, slots=slots,
                             kv_len=P + t + 1, logits="last")
        outs.append(torch.cat([p, torch.stack(toks, 1)], 1))
        del cache
    return torch.cat(outs)


def distillation_data(target, streams, r: Recipe, gen, log: Log) -> torch.Tensor:
    mix = {d: w for d, w in r.cont_mix.items() if d in streams}
    total = sum(mix.values())
    prompts = torch.cat([windows(streams[d], round(r.n_continuations * w / total), r.prompt_len, gen)
                         for d, w in mix.items()])
    t0 = time.time()
    if greedy_only(r):
        # all greedy: no shuffle, so the default recipe draws exactly the random numbers it did
        seqs = target_continuations(target, prompts, r.gen_len, r.gen_batch)
    else:
        seqs = torch.cat([target_continuations(target, p, r.gen_len, r.gen_batch, t, g)
                          for t, p, g in mixed_prompts(prompts, r, gen)])
    log(f"distillation data: {len(seqs):,} continuations of {r.gen_len} tokens after"
        f" {r.prompt_len}-token windows ({mix_label(r.distill_mix)}) in {time.time() - t0:.1f}s")
    return seqs

def mixed_prompts(prompts: torch.Tensor, r: Recipe, gen: torch.Generator):
    """Split the prompts (in a seeded random order, so every temperature gets every domain)
    by `distill_mix` shares: [(temperature, prompts [n_t, P], device generator), ...]."""
    temps = [float(t) for t, _ in r.distill_mix]
    shares = [float(w) for _, w in r.distill_mix]
    if any(t < 0 for t in temps) or any(w < 0 for w in shares) or sum(shares) <= 0:
        raise ValueError(f"recipe {r.name!r}: distill_mix {r.distill_mix!r} needs temperatures"
                         " >= 0 and shares >= 0 with a positive sum")
    order = torch.randperm(len(prompts), generator=gen).to(prompts.device)
    bounds = np.rint(np.cumsum([0.0] + shares) / sum(shares) * len(prompts)).astype(int)
    out = []
    for i, t in enumerate(temps):
        g = torch.Generator(device=prompts.device).manual_seed(r.seed * 1000 + i)
        out.append((t, prompts[order[bounds[i]:bounds[i + 1]]], g))
    return out


# --------------------------------------------------------------------------- drafters
def train_drafters(target: Qwen3Model, seqs: torch.Tensor, r: Recipe, device, gen, log: Log,
                   compile_: bool, deadline: float | None = None, stored: Path | None = None
                   ) -> tuple[dict[str, Proposer], dict]:
    """Train the recipe's drafters together; a drafter on a trunk starts from (and freezes)
    the trunk drafter stored in `stored`."""
    target.requires_grad_(False)
    props, trunks = {}, {}  # trunks: the stored drafters' state dicts, read once each
    for name, d in r.drafters.items():
        cfg = DrafterConfig.from_dict(d)
        prop = build_proposer(cfg, target)
        if cfg.trunk:
            if stored is None:
                raise ValueError(f"drafter {name!r} sits on a stored drafter: pass `stored`")
            t = cfg.trunk["drafter"]
            if t not in trunks:
                trunks[t] = load_proposer(stored, "dflash", target, device="cpu",
                                          dtype=torch.float32, name=t).state_dict()
            prop.init_from_trunk(trunks[t])
        props[name] = prop.to(device).train()
    L = target.config.num_hidden_layers
    layers = sorted({i % L for p in props.values() for i in p.target_layers} | {L - 1})
    params = [p for prop in props.values() for p in prop.parameters() if p.requires_grad]
    opt = adamw(params, r.drafter_lr, 0.01)
    amp = bf16_autocast(device)
    P, T = r.prompt_len, seqs.shape[1]
    block = max((p.block_size for p in props.values() if p.method == "dflash"), default=2)
    # block drafters with the engines' block learn every length they will run: one random
    # length 2..block per training sequence (drawn only when one trains, so the other recipes
    # draw the random numbers they always did)
    engine_blocks = any(getattr(p, "engine_block", False) for p in props.values())

    def losses_fn(seq, anchors, block_lens):
        with torch.no_grad(), amp:
            out = target(seq, hidden_layers=layers)
        labels = out.logits.argmax(-1)  # the target's greedy token for position i+1
        hid = dict(zip(layers, out.hidden))
        # MTP steps >= 2 and block drafts >= 2 must read greedy tokens: label only the
        # continuation (anchors already start there).
        cont_labels = labels.clone()
        cont_labels[:, :P] = -100
        res = {}
        with amp:
            for name, prop in props.items():
                lab = labels if prop.method == "draft_model" else cont_labels
                extra = ({"block_lens": block_lens.clamp(max=prop.block_size)}
                         if getattr(prop, "engine_block", False) else {})
                res[name] = prop.training_loss(seq, lab, [hid[i % L] for i in prop.target_layers],
                                               anchors=anchors, **extra)
        return res

    step_fn = maybe_compile(losses_fn, compile_, log)
    hist: dict[str, list] = {n: [] for n in props}
    t_start = time.time()
    sizes = ", ".join(f"{n} {sum(p.numel() for p in pr.parameters() if p.requires_grad) / 1e6:.2f}M"
                      for n, pr in props.items())
    log(f"drafters: {sizes}; up to {r.drafter_steps} steps of {r.drafter_batch} sequences")
    total, probe = r.drafter_steps, (10, 40)  # steps between which the step rate is timed
    step = 0
    while step < total:
        if deadline is not None and step in probe and device.type == "cuda":
            torch.cuda.synchronize()
        if deadline is not None and step == probe[0]:
            t_probe = time.time()
        if deadline is not None and step == probe[1]:
            rate = (time.time() - t_probe) / (probe[1] - probe[0])
            total = max(step + 1, min(total, step + int((deadline - time.time()) / rate)))
            log(f"drafter steps: {rate * 1e3:.1f} ms each; {total} fit the time budget")
        idx = torch.randint(0, len(seqs), (r.drafter_batch,), generator=gen).to(seqs.device)
        anchors = torch.randint(P - 1, T - block + 2, (r.drafter_batch, r.anchors),
                                generator=gen).to(seqs.device)
        block_lens = (engine_block_lens(r, block, gen).to(seqs.device)
                      if engine_blocks else None)  # [drafter_batch]
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, total, r.drafter_lr, r.warmup)
        res = step_fn(seqs[idx], anchors, block_lens)
        loss = sum(v[0] for v in res.values())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        for n, v in res.items():
            hist[n].append(v[0].detach())
        if step % 500 == 0 or step == total - 1:
            log(f"drafter step {step}: " + ", ".join(f"{n} {v[0].item():.3f}" for n, v in res.items()))
        step += 1
    stats = {"steps": total, "batch": r.drafter_batch, "wall_s": time.time() - t_start,
             "final_loss": {n: torch.stack(h[-20:]).mean().item() for n, h in hist.items()}}
    return {n: p.eval() for n, p in props.items()}, stats


def engine_block_lens(r: Recipe, block: int, gen: torch.Generator) -> torch.Tensor:
    """[drafter_batch] block lengths for engine-block drafters: `full_block_share` of the
    sequences at the full length `block` (the most drafts the studies run: draft position
    block-1 is trained only on blocks that long), the rest uniform over 2..block."""
    lens = torch.randint(2, block + 1, (r.drafter_batch,), generator=gen)
    if r.full_block_share > 0:
        full = torch.rand(r.drafter_batch, generator=gen) < r.full_block_share
        lens = torch.where(full, torch.full_like(lens, block), lens)
    return lens


def distill_and_train_drafters(target, streams, r: Recipe, device, gen, log: Log, compile_: bool,
                               stored: Path | None = None):
    """Distillation data from the frozen target, then the recipe's drafters on it, stopping
    early enough to leave the recipe's quality reserve: (drafters, stats, distillation s)."""
    t0 = time.time()
    seqs = distillation_data(target, streams, r, gen, log)
    distill_s = time.time() - t0
    deadline = (None if r.time_budget_s is None
                else log.t0 + r.time_budget_s - r.quality_reserve_s)
    props, dstats = train_drafters(target, seqs, r, device, gen, log, compile_, deadline, stored)
    return props, dstats, distill_s

