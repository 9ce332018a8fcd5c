"""The block drafter (DFlash style): one bidirectional pass fills a block of mask positions,
conditioned on the target's hidden states injected as extra keys and values.

Design:
- Target hidden states of several depths (`target_layers`), concatenated and projected
  (`fc`, `hidden_norm`), are injected as extra keys and values in every drafter layer; the
  block is the last real token plus mask positions, filled in one bidirectional pass.
- Two layouts, chosen by the config (`DrafterConfig.mask_token_id`, `.block`); the computation
  of a layer is the same in both (docs/engine-layouts.md §5: it matches vLLM's
  `qwen3_dflash.py` and SGLang's `models/dflash.py`):
  - today's (the default, the shipped `dflash` and `dflash_light`): the mask is the drafter's
    own learned `mask_embedding` [D]; the block is trained at `block_size` (8) and at
    k <= block_size-1 drafts the trained block runs and the first k are kept (so k drafts are a
    prefix of k+1 drafts); at k >= block_size the block grows past its training.
  - the engines' (`mask_token_id` set, `block: "engine"`), the layout vLLM 0.26.0 and SGLang
    0.5.14 load and run (docs/engine-layouts.md §1, §2): their loaders have no mask tensor
    (SGLang drops any unknown name; vLLM reads a mask only from a separate `mask_embedding.pt`),
    so the mask is the frozen row of the target's embedding at `mask_token_id`, a token the
    vocabulary has (`<|im_start|>`), and the drafter has no mask parameter; and their block at
    k drafts is 1 + k positions (vLLM `num_query_per_req = 1 + num_speculative_tokens`, SGLang
    `--speculative-dflash-block-size k+1`), so the drafter is trained over a random block
    length 2..block_size per training sequence (`training_loss`'s `block_lens`) and runs 1 + k
    positions at any k, past block_size-1 too. With the engines' target layer ids (<= L-2, which
    SGLang can capture) and one `intermediate_size`, the same weights run in all three engines.
- A light drafter on a trunk (`DrafterConfig.trunk`): its first layers, `fc`, `hidden_norm`
  and `mask_embedding` (today's layout) are a stored block drafter's, frozen and read from that
  drafter's file; its own layers run after them (`trunk_names`, `init_from_trunk`).
- At inference: since every layer's context keys and values come from the same context
  features, they live in one stacked cache [L, slots, KV, T+block, hd]; `observe` projects
  all layers with one joined weight (`finalize`) and one scatter, and `propose` gathers
  every layer's context once and writes each layer's block keys into the gathered copy's
  free tail, where training concatenates them. The same keys in the same order, so the
  same drafts; the per-layer passes stay for training, fake-quantized layers and blocks
  past the free tail. On the H200 (CUDA graphs, where each small kernel costs its launch)
  this took the light drafter's k=7 step from 2.03 to 1.75 ms
  (docs/bench/engine-h200-fused-2026-12-01.txt). `propose` reads nothing back to the host
  with `static_bound` (its shapes depend on (batch, k) only: the block is fixed per k in both
  layouts), so the engine's static decode program (graphs.py) captures it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from specrepro.embedded.model import (
    Attention,
    DecoderLayer,
    ModelConfig,
    Qwen3Model,
    RMSNorm,
    apply_rope,
    rms_norm,
    rope_cos_sin,
)
from specrepro.embedded.proposers.base import DrafterConfig, Proposer, SharedTarget


class BlockAttention(Attention):
    """Attention of block positions over injected context keys/values and the block.

    The target's attention layout (same projections, QK-norm and parameter names); only
    the forward differs: bidirectional inside the block, context keys injected."""

    def kv(self, x, cos, sin):
        # x: [B, S, D] -> k, v: [B, KV, S, hd] (rotated token-major, as Attention.project)
        B, S, _ = x.shape
        k = apply_rope(self.k_norm(self.k_proj(x).view(B, S, self.n_kv, self.head_dim)),
                       cos, sin)
        v = self.v_proj(x).view(B, S, self.n_kv, self.head_dim)
        return k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):
        # x: [B, Q, D]; ctx_k/v: [B, KV, C, hd]; mask: [B, 1, Q, C+Q] (True = attend)
        B, Q, _ = x.shape
        q, k, v = self.project(x, cos, sin)
        keys = torch.cat([ctx_k.to(q.dtype), k], 2)
        vals = torch.cat([ctx_v.to(q.dtype), v], 2)
        out = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(B, Q, -1))

    def forward_into(self, x, cos, sin, keys, vals, start, mask):
        """As `forward`, with the context already in `keys`/`vals` [B, KV, start+Q, hd] (a
        gathered copy whose last Q positions are free): the block's keys and values are
        written there, so the attention reads the same [context; block] keys as `forward`'s
        concatenation without copying the context again."""
        B, Q, _ = x.shape
        q, k, v = self.project(x, cos, sin)
        keys[:, :, start:start + Q] = k.to(keys.dtype)
        vals[:, :, start:start + Q] = v.to(vals.dtype)
        out = F.scaled_dot_product_attention(q, keys.to(q.dtype), vals.to(q.dtype),
                                             attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(B, Q, -1))


class BlockLayer(DecoderLayer):
    """A target block with BlockAttention: same modules and names, other forwards."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, BlockAttention)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_into(self, x, cos, sin, keys, vals, start, mask):
        x = x + self.self_attn.forward_into(self.input_layernorm(x), cos, sin, keys, vals,
                                            start, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class BlockDrafter(Proposer):
    method = "dflash"

    def __init__(self, cfg: DrafterConfig, target_cfg: ModelConfig, target: Qwen3Model):
        super().__init__()
        if len(cfg.target_layers) < 1:
            raise ValueError("the block drafter needs target_layers")
        d = target_cfg.hidden_size
        self.cfg, self.target_cfg = cfg, target_cfg
        self.layer_cfg = cfg.layer_config(target_cfg)
        self.target_layers = cfg.target_layers
        self.block_size = cfg.block_size
        self.fc = nn.Linear(len(cfg.target_layers) * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, target_cfg.rms_norm_eps)
        trunk = []
        if cfg.trunk:
            trunk_cfg = replace(target_cfg, num_hidden_layers=cfg.trunk["layers"],
                                intermediate_size=cfg.trunk["intermediate_size"])
            trunk = [BlockLayer(trunk_cfg) for _ in range(cfg.trunk["layers"])]
        self.layers = nn.ModuleList(
            trunk + [BlockLayer(self.layer_cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(d, target_cfg.rms_norm_eps)
        self.engine_block = cfg.block == "engine"  # k drafts: a block of 1 + k
        self.mask_token_id = cfg.mask_token_id
        if self.mask_token_id is None:  # today's layout: a learned mask [D]
            self.mask_embedding = nn.Parameter(torch.zeros(d))
        elif not self.mask_token_id < target_cfg.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} is outside the target's "
                             f"vocabulary ({target_cfg.vocab_size} tokens)")
        self.shared = SharedTarget(target)
        # finalize(): the joined context K/V weight [L*2*KV*hd, D], the stacked key-norm
        # weights [L, hd] and what they were joined from; plain tensors, never saved
        self._ctx_proj = self._k_norm_w = self._ctx_proj_key = None

    def trunk_names(self) -> list[str]:
        """State-dict keys read from the trunk drafter's file (none without a trunk)."""
        if not self.cfg.trunk:
            return []
        n = self.cfg.trunk["layers"]
        return [k for k in self.state_dict()
                if k.split(".")[0] in ("fc", "hidden_norm", "mask_embedding")
                or (k.startswith("layers.") and int(k.split(".")[1]) < n)]

    @torch.no_grad()
    def init_from_trunk(self, trunk_state: dict[str, torch.Tensor]) -> None:
        """Load the trunk's tensors from `trunk_state` (the trunk drafter's state dict) and
        freeze them; start own layer i from the trunk's layer L+i (its first MLP units when
        the own MLP is narrower) and the own final norm from the trunk's, so training begins
        at the trunk drafter's own next computation."""
        borrowed = set(self.trunk_names())
        own = self.state_dict()  # views of the parameters: copying into them sets the weights
        for key in borrowed:
            own[key].copy_(trunk_state[key])
        for key, dst in own.items():
            if key in borrowed or not key.startswith("layers."):
                continue
            src = trunk_state.get(key)  # own layer L+i <- the trunk drafter's layer L+i
            if src is None:  # more own layers than the trunk drafter has: keep the random init
                continue
            dst.copy_(src[tuple(slice(0, s) for s in dst.shape)])
        own["norm.weight"].copy_(trunk_state["norm.weight"])
        for name, prm in self.named_parameters():
            prm.requires_grad_(name not in borrowed)

    def _rope(self, positions, dtype):
        return rope_cos_sin(positions, self.target_cfg.head_dim, self.target_cfg.rope_theta, dtype)

    def context(self, hidden: Sequence[torch.Tensor]) -> torch.Tensor:
        # hidden: one [B, S, D] per target layer -> context features [B, S, D]
        return self.hidden_norm(self.fc(torch.cat(list(hidden), -1)))

    def _blocks(self, anchor_tokens, n):
        # anchor_tokens: [B, nb] -> [B, nb, n, D]: the real token, then n-1 mask embeddings
        if self.mask_token_id is not None:  # the engines': ids [B, nb, n] = [anchor, mask...]
            masks = anchor_tokens.new_full((*anchor_tokens.shape, n - 1), self.mask_token_id)
            return self.shared.embed(torch.cat([anchor_tokens[..., None], masks], -1))
        emb = self.shared.embed(anchor_tokens)  # [B, nb, D]
        masks = self.mask_embedding.to(emb.dtype).expand(*anchor_tokens.shape, n - 1, emb.shape[-1])
        return torch.cat([emb[:, :, None], masks], 2)

    def run_layers(self, x, cos, sin, ctx_kv, mask, logits_at: slice = slice(None)):
        # x: [B, Q, D] -> logits [B, Q', V] of the query positions `logits_at` selects: the
        # output head is the widest GEMM (V = 4096), so only the positions a step drafts pay it
        for layer, (ck, cv) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, ck, cv, mask)
        return self.shared.lm_head(self.norm(x[:, logits_at]))

    def block_logits(self, tokens, hidden, anchors, block_lens=None):
        """tokens [B, T]; hidden: one [B, T, D] per target layer; anchors [B, nb] positions in
        [1, T-block_size+1]; block_lens [B] or None: the engine block's length per sequence
        (2..block_size; None: every block block_size long). -> logits [B, nb, n-1, V] of the
        draft positions 1..n-1 of each block, n = block_size. Block b reads context positions
        < anchor_b (the anchor token itself has no target hidden state at inference). A block
        shorter than n is computed as n positions whose keys past its length are masked out:
        its real positions see exactly what a block of its length sees at inference."""
        B, T = tokens.shape
        n, nb, dev = self.block_size, anchors.shape[1], tokens.device
        ctx = self.context(hidden)
        ctx_pos = torch.arange(T, device=dev).expand(B, T)
        cos_c, sin_c = self._rope(ctx_pos, ctx.dtype)
        ctx_kv = [layer.self_attn.kv(ctx, cos_c, sin_c) for layer in self.layers]
        offs = torch.arange(n, device=dev)
        pos = (anchors[:, :, None] + offs).reshape(B, nb * n)  # [B, Q]
        x = self._blocks(tokens.gather(1, anchors), n).reshape(B, nb * n, -1)
        cos, sin = self._rope(pos, x.dtype)
        blk = torch.arange(nb, device=dev).repeat_interleave(n)  # block id of each query
        ctx_mask = ctx_pos[:, None, :] < anchors.repeat_interleave(n, 1)[:, :, None]  # [B,Q,T]
        blk_mask = (blk[:, None] == blk[None, :]).expand(B, -1, -1)  # [B, Q, Q]
        if block_lens is not None:  # a key past its block's length is no key
            blk_mask = blk_mask & (offs.repeat(nb)[None, None, :] < block_lens[:, None, None])
        mask = torch.cat([ctx_mask, blk_mask], -1)[:, None]
        return self.run_layers(x, cos, sin, ctx_kv, mask).view(B, nb, n, -1)[:, :, 1:]

    def training_loss(self, tokens, labels, hidden, anchors, block_lens=None, **_):
        """tokens, labels [B, T]; hidden, anchors, block_lens as in `block_logits` (block_lens
        only for the engine block: the training loop draws it, 2..block_size per sequence).
        Returns (loss, per-position loss [n-1]); drafts past a block's length are no labels."""
        B, n, nb, dev = tokens.shape[0], self.block_size, anchors.shape[1], tokens.device
        logits = self.block_logits(tokens, hidden, anchors, block_lens)  # [B, nb, n-1, V]
        offs = torch.arange(n, device=dev)
        # Draft j (1..n-1) of a block at anchor a is the token at a+j: label index a+j-1.
        tgt = labels.gather(1, (anchors[:, :, None] + offs[:-1]).reshape(B, -1)).view(B, nb, n - 1)
        if block_lens is not None:
            tgt = tgt.masked_fill(offs[1:][None, None, :] >= block_lens[:, None, None], -100)
        ce = F.cross_entropy(logits.flatten(0, 2).float(), tgt.flatten(), ignore_index=-100,
                             reduction="none").view(B, nb, n - 1)
        valid = (tgt != -100).float()
        w = self.cfg.loss_decay ** torch.arange(n - 1, device=dev, dtype=torch.float32)
        per_pos = (ce * valid).sum((0, 1)) / valid.sum((0, 1)).clamp_min(1)
        return (per_pos * w).sum() / w.sum(), per_pos.detach()

    # -- Proposer --------------------------------------------------------------
    def allocate(self, num_slots, max_len, device=None, dtype=torch.float32):
        """Context keys and values of every layer in one tensor each, [L, slots, KV,
        max_len + block_size, hd]: one gather reads every layer's context (propose) and one
        scatter writes it (observe). The last block_size positions of a row are never
        context: a gathered copy holds the block's own keys there. `ctx_cache` lists each
        layer's context part, [slots, KV, max_len, hd] views."""
        self._cache_dtype = dtype
        shape = (len(self.layers), num_slots, self.layer_cfg.num_key_value_heads,
                 max_len + self.block_size, self.layer_cfg.head_dim)
        self.ctx_k = torch.zeros(shape, device=device, dtype=dtype)
        self.ctx_v = torch.zeros(shape, device=device, dtype=dtype)
        self.ctx_len = max_len
        self.ctx_cache = [(self.ctx_k[i, :, :, :max_len], self.ctx_v[i, :, :, :max_len])
                          for i in range(len(self.layers))]

    def kv_bytes_per_token(self):
        # one context K/V cache per layer run, the trunk's included (allocate)
        return replace(self.layer_cfg, num_hidden_layers=len(self.layers)).kv_bytes_per_token(
            self._cache_dtype)

    @torch.no_grad()
    def finalize(self, fuse: bool = True) -> None:
        """Every layer's context key and value projections as one weight [L*2*KV*hd, D]
        (and the key norms' weights stacked [L, hd]): the context features are the same
        input to all layers, so `observe` runs one GEMM instead of 2L, and one norm, one
        rotation and one scatter for all layers. Kept in the layout of the weights it joins
        (K-major stays K-major). Not for fake-quantized layers, each with its own scales:
        those keep the per-layer path. A weight that has not changed is not joined again
        (a CUDA graph captured earlier keeps reading the same tensor)."""
        attn = [layer.self_attn for layer in self.layers]
        lins = [m for a in attn for m in (a.k_proj, a.v_proj)]
        if not fuse or not all(type(m) is nn.Linear for m in lins):
            self._ctx_proj = self._k_norm_w = self._ctx_proj_key = None
            return
        # storage and in-place version of each source (inference tensors keep no version)
        key = tuple((t.data_ptr(), None if t.is_inference() else t._version) for a in attn
                    for t in (a.k_proj.weight, a.v_proj.weight, a.k_norm.weight))
        if self._ctx_proj_key == key:
            return
        ws = [m.weight for m in lins]  # each [KV*hd, D]
        if all(w.t().is_contiguous() for w in ws):  # K-major: join the [D, KV*hd] transposes
            self._ctx_proj = torch.cat([w.t() for w in ws], 1).t()
        else:
            self._ctx_proj = torch.cat([w.contiguous() for w in ws], 0)
        self._k_norm_w = torch.stack([a.k_norm.weight for a in attn])  # [L, hd]
        self._ctx_proj_key = key

    @torch.no_grad()
    def observe(self, slots, tokens, positions, hidden):
        ctx = self.context([h.to(self.fc.weight.dtype) for h in hidden])  # [B, S, D]
        cos, sin = self._rope(positions, ctx.dtype)  # [B, S, 1, hd]
        rows = slots[:, None].expand_as(positions)  # [B, S]
        if self._ctx_proj is None:  # per layer (quantized, not finalized)
            for layer, (ck, cv) in zip(self.layers, self.ctx_cache):
                k, v = layer.self_attn.kv(ctx, cos, sin)  # [B, KV, S, hd]
                ck[rows, :, positions] = k.transpose(1, 2).to(ck.dtype)
                cv[rows, :, positions] = v.transpose(1, 2).to(cv.dtype)
            return
        a = self.layers[0].self_attn
        B, S, _ = ctx.shape
        kv = F.linear(ctx, self._ctx_proj).view(B, S, len(self.layers), 2, a.n_kv, a.head_dim)
        k = rms_norm(kv[:, :, :, 0], self._k_norm_w[:, None], a.k_norm.eps)  # [B, S, L, KV, hd]
        k = apply_rope(k, cos[:, :, None], sin[:, :, None])  # cos [B, S, 1, 1, hd]
        # the two advanced indices are apart, so the indexed view is [B, S, L, KV, hd]
        self.ctx_k[:, rows, :, positions] = k.to(self.ctx_k.dtype)
        self.ctx_v[:, rows, :, positions] = kv[:, :, :, 1].to(self.ctx_v.dtype)

    @torch.no_grad()
    def propose(self, slots, context_len, last_token, k, sample=None):
        # the block: 1 + k positions (the engines'), or the trained block truncated to k
        # drafts below it and extended above (today's); fixed per k either way
        n = k + 1 if self.engine_block else max(k + 1, self.block_size)
        dev = last_token.device
        # context span: the whole row when static (the mask hides positions >= context_len)
        C = self.ctx_len if self.static_bound else int(context_len.max())
        x = self._blocks(last_token[:, None], n)[:, 0]  # [B, n, D]
        pos = context_len[:, None] + torch.arange(n, device=dev)
        cos, sin = self._rope(pos, x.dtype)
        ctx_mask = torch.arange(C, device=dev)[None, :] < context_len[:, None]  # [B, C]
        mask = torch.cat([ctx_mask, ctx_mask.new_ones(len(slots), n)], -1)[:, None, None]
        if n <= self.block_size:
            # one gather of every layer's context, [L, B, KV, C+n, hd], its last n positions
            # free for each layer's block keys (allocate)
            keys, vals = self.ctx_k[:, slots, :, :C + n], self.ctx_v[:, slots, :, :C + n]
            for i, layer in enumerate(self.layers):
                x = layer.forward_into(x, cos, sin, keys[i], vals[i], C, mask)
            logits = self.shared.lm_head(self.norm(x[:, 1:k + 1]))  # [B, k, V]
        else:  # a block past its training: longer than the cache's free positions
            ctx_kv = [(ck[slots, :, :C], cv[slots, :, :C]) for ck, cv in self.ctx_cache]
            logits = self.run_layers(x, cos, sin, ctx_kv, mask, slice(1, k + 1))
        if sample is None:  # one argmax for the block rather than one per position
            return logits.argmax(-1), logits
        tokens = torch.stack([sample(logits[:, j]) for j in range(k)], 1)
        return tokens, logits

