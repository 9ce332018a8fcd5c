"""The stand-in's construction: a trained Qwen3 stack inflated to more bytes, same function.

A stand-in lets the small trained target and its drafters be served where the articles'
27B-class model is: a decode step that reads tens of GB of weights. It must cost what real
weights cost (every GEMM operand random-looking, no all-zero blocks the GPU could skip or
draw less power on) and compute what the original computes. Three moves, each exact in real
arithmetic and exactly representable in bf16, so only the order of floating-point sums
separates the stand-in's outputs from the original's:

- **Hidden copies.** The residual stream of width D becomes m copies of itself, D' = m * D:
  every matrix that writes the residual (`o_proj`, `down_proj`) has its rows tiled m times,
  the embedding its columns, every norm weight is tiled; so every copy carries the same
  values and an RMS norm over D' equals the one over D (m equal partial sums, same mean).
  Every matrix that reads the residual (`q/k/v_proj`, `gate/up_proj`, `lm_head`, a drafter's
  `fc`) is split over the copies: [W, R1, -R1, R2, -R2, ...] for odd m, [W/2, W/2, R1, -R1,
  ...] for even m, R random; read against m equal copies of x the parts sum to W x.
  The embedding and the head are untied (the lookup must tile, the head must split).
- **Twin units.** New MLP neurons come in pairs with identical `gate`/`up` rows (so equal
  activations) and `down` columns c and -c, adjacent; new attention heads come in pairs with
  identical query rows over identical key/value heads (within one KV group when the group
  size is even, else over twin KV heads) and `o_proj` columns c and -c. A pair's
  contributions cancel; everything it computes on the way is real work on random values.
- **Twin layers.** Whole layers made only of twin units are appended after the original
  layers: the residual passes through them unchanged, each adds its KV cache and weight read.

The original layers keep their indices (a block drafter's target layer ids stay valid), and
the last layer's output still feeds the final norm. Shapes: q [H*hd, D'], k/v [KV*hd, D'],
o [D', H*hd], gate/up [I', D'], down [D', I'], embed [V, D'], lm_head [V, D'].

Everything here works on state dicts (name -> tensor) and a `Stack` (the shapes of one
Qwen3-style stack); the files, the budget and the command are in standin.py.
Imports torch only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPE = torch.bfloat16
ATTN_NORMS = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")


@dataclass(frozen=True)
class Stack:
    """The shapes of one decoder stack (a target, a drafter's layers, a draft model)."""

    hidden: int  # D of the source
    copies: int  # m: D' = m * D
    heads: int  # H (query heads) after inflation
    kv_heads: int  # KV heads after inflation
    head_dim: int
    intermediate: int  # I' after inflation

    @property
    def width(self) -> int:
        return self.hidden * self.copies

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


def head_pairs(first_kv: int, heads: int, kv_heads: int) -> tuple[list, list]:
    """Twin pairs for the heads from KV head `first_kv` on: ([(q_a, q_b)], [(kv_a, kv_b)]).
    Query head q reads KV head q // G. With G even the pairs sit inside a KV group; with G
    odd they span two twin KV heads, so the new KV heads must come in pairs."""
    g = heads // kv_heads
    new_kv = list(range(first_kv, kv_heads))
    if g % 2 == 0:
        return [(q, q + 1) for kv in new_kv for q in range(kv * g, kv * g + g, 2)], []
    if len(new_kv) % 2:
        raise ValueError(f"{len(new_kv)} new KV heads with a group of {g} query heads (odd): "
                         "twin heads need the new KV heads in pairs")
    kv_pairs = [(new_kv[i], new_kv[i + 1]) for i in range(0, len(new_kv), 2)]
    return [(a * g + t, b * g + t) for a, b in kv_pairs for t in range(g)], kv_pairs


class Inflater:
    """Draws the random parts (seeded, on `device`) and assembles inflated tensors in bf16.
    `std` per tensor kind: the random parts have the spread of the source's weights of that
    kind, so their bytes look like trained weights' (exponents and mantissas alike)."""

    def __init__(self, copies: int, seed: int, device: str | torch.device = "cpu"):
        self.m = copies
        self.device = torch.device(device)
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(seed)

    def rand(self, *shape: int, std: float) -> torch.Tensor:
        x = torch.randn(*shape, generator=self.gen, device=self.device, dtype=torch.float32)
        return (x * std).to(DTYPE)

    def positive(self, n: int, std: float) -> torch.Tensor:
        """A norm weight for a twin layer: around 1, as trained norms are."""
        return (1 + self.rand(n, std=std).float()).abs().to(DTYPE)

    # -------------------------------------------------------------- the residual's copies
    def split(self, w: torch.Tensor, std: float) -> torch.Tensor:
        """A reader [out, D] -> [out, m*D] whose parts sum to w over m equal copies."""
        w = w.to(self.device, DTYPE)
        parts = [w] if self.m % 2 else [w / 2, w / 2]  # w/2 is exact in bf16
        while len(parts) < self.m:
            r = self.rand(*w.shape, std=std)
            parts += [r, -r]
        return torch.cat(parts, 1)

    def tile_rows(self, w: torch.Tensor) -> torch.Tensor:
        """A writer [D, in] -> [m*D, in]: every copy of the residual gets the same rows."""
        return w.to(self.device, DTYPE).repeat(self.m, 1)

    def tile(self, v: torch.Tensor) -> torch.Tensor:
        """A norm weight [D] -> [m*D]; an embedding [V, D] -> [V, m*D]."""
        v = v.to(self.device, DTYPE)
        return v.repeat(self.m) if v.dim() == 1 else v.repeat(1, self.m)

    # -------------------------------------------------------------- twin units
    def twin_rows(self, n_pairs: int, width: int, std: float) -> torch.Tensor:
        """[2n, width]: n random rows, each twice in a row (equal activations)."""
        return self.rand(n_pairs, width, std=std).repeat_interleave(2, 0)

    def twin_cols(self, n_pairs: int, std: float, hidden: int) -> torch.Tensor:
        """[m*hidden, 2n]: per pair a random column c then -c (their outputs cancel), rows
        tiled over the copies."""
        c = self.rand(hidden, n_pairs, std=std)
        return self.tile_rows(torch.stack([c, -c], 2).flatten(1))


def _std(t: torch.Tensor) -> float:
    return float(t.float().std()) if t.numel() > 1 else 0.02


def layer_stds(layers: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """The mean spread of each tensor kind over the source layers (twin layers' scale)."""
    kinds = {k for sd in layers for k in sd}
    return {k: sum(_std(sd[k]) for sd in layers if k in sd)
            / sum(1 for sd in layers if k in sd) for k in kinds}


def inflate_layer(src: dict[str, torch.Tensor], shape: Stack, inf: Inflater,
                  src_heads: int, src_kv: int) -> dict[str, torch.Tensor]:
    """One trained layer (keys relative to the layer: `self_attn.q_proj.weight`, ...) widened
    to `shape`: hidden copies, twin heads from KV head `src_kv` on, twin neurons after the
    trained ones. A layer without `input_layernorm` (EAGLE's first) or QK-norm (Llama) keeps
    its absence."""
    hd, D = shape.head_dim, shape.hidden
    out: dict[str, torch.Tensor] = {}
    q_pairs, kv_pairs = head_pairs(src_kv, shape.heads, shape.kv_heads)
    for name, n_src, n_new, pairs in (("q_proj", src_heads, shape.heads, q_pairs),
                                      ("k_proj", src_kv, shape.kv_heads, kv_pairs),
                                      ("v_proj", src_kv, shape.kv_heads, kv_pairs)):
        w = src[f"self_attn.{name}.weight"]
        heads = list(inf.split(w, _std(w)).view(n_src, hd, shape.width).unbind(0))
        heads += _twin_heads(n_src, n_new, pairs, inf, hd, shape.width, _std(w))
        out[f"self_attn.{name}.weight"] = torch.cat(heads, 0)
    o = src["self_attn.o_proj.weight"]  # [D, H*hd]
    cols = [inf.tile_rows(o)] + _twin_o(q_pairs, src_heads, shape.heads, inf, hd, D, _std(o))
    out["self_attn.o_proj.weight"] = torch.cat(cols, 1)
    for key in ATTN_NORMS:
        if key in src:
            out[key] = src[key].to(inf.device, DTYPE)
    out.update(_mlp(src, shape, inf))
    for key in ("input_layernorm.weight", "post_attention_layernorm.weight"):
        if key in src:
            out[key] = inf.tile(src[key])
    return out


def _twin_heads(first: int, total: int, pairs: list, inf: Inflater, hd: int, width: int,
                std: float) -> list[torch.Tensor]:
    """Rows [hd, D'] for heads first..total-1: random, the second of each pair a copy."""
    partner = {b: a for a, b in pairs}
    rows: dict[int, torch.Tensor] = {}
    for h in range(first, total):
        rows[h] = rows[partner[h]] if h in partner else inf.rand(hd, width, std=std)
    return [rows[h] for h in range(first, total)]


def _twin_o(q_pairs: list, first: int, total: int, inf: Inflater, hd: int, hidden: int,
            std: float) -> list[torch.Tensor]:
    """o_proj columns [D', hd] for query heads first..total-1: c for a pair's first, -c for
    its second (equal head outputs cancel)."""
    partner = {b: a for a, b in q_pairs}
    cols: dict[int, torch.Tensor] = {}
    for h in range(first, total):
        cols[h] = -cols[partner[h]] if h in partner else inf.tile_rows(inf.rand(hidden, hd, std=std))
    return [cols[h] for h in range(first, total)]


def _mlp(src: dict[str, torch.Tensor], shape: Stack, inf: Inflater) -> dict[str, torch.Tensor]:
    gate, up, down = (src[f"mlp.{k}_proj.weight"] for k in ("gate", "up", "down"))
    extra = shape.intermediate - gate.shape[0]
    if extra < 0 or extra % 2:
        raise ValueError(f"intermediate {shape.intermediate} must be the source's {gate.shape[0]}"
                         " plus an even number of twin neurons")
    pairs = extra // 2
    return {
        "mlp.gate_proj.weight": torch.cat([inf.split(gate, _std(gate)),
                                           inf.twin_rows(pairs, shape.width, _std(gate))], 0),
        "mlp.up_proj.weight": torch.cat([inf.split(up, _std(up)),
                                         inf.twin_rows(pairs, shape.width, _std(up))], 0),
        "mlp.down_proj.weight": torch.cat([inf.tile_rows(down),
                                           inf.twin_cols(pairs, _std(down), shape.hidden)], 1),
    }


def twin_layer(stds: dict[str, float], shape: Stack, inf: Inflater,
               qk_norm: bool = True) -> dict[str, torch.Tensor]:
    """A layer of twin units only: its attention and MLP add nothing to the residual."""
    hd, W = shape.head_dim, shape.width
    q_pairs, kv_pairs = head_pairs(0, shape.heads, shape.kv_heads)
    out = {f"self_attn.{n}.weight": torch.cat(_twin_heads(0, count, pairs, inf, hd, W,
                                                          stds[f"self_attn.{n}.weight"]), 0)
           for n, count, pairs in (("q_proj", shape.heads, q_pairs),
                                   ("k_proj", shape.kv_heads, kv_pairs),
                                   ("v_proj", shape.kv_heads, kv_pairs))}
    out["self_attn.o_proj.weight"] = torch.cat(_twin_o(
        q_pairs, 0, shape.heads, inf, hd, shape.hidden, stds["self_attn.o_proj.weight"]), 1)
    if qk_norm:
        for key in ATTN_NORMS:
            out[key] = inf.positive(hd, stds.get(key, 0.1))
    pairs = shape.intermediate // 2
    out["mlp.gate_proj.weight"] = inf.twin_rows(pairs, W, stds["mlp.gate_proj.weight"])
    out["mlp.up_proj.weight"] = inf.twin_rows(pairs, W, stds["mlp.up_proj.weight"])
    out["mlp.down_proj.weight"] = inf.twin_cols(pairs, stds["mlp.down_proj.weight"], shape.hidden)
    for key in ("input_layernorm.weight", "post_attention_layernorm.weight"):
        out[key] = inf.tile(inf.positive(shape.hidden, stds.get(key, 0.1)))
    return out


def layers_of(sd: dict[str, torch.Tensor], prefix: str) -> list[dict[str, torch.Tensor]]:
    """The per-layer dicts of `prefix{i}.` keys, in layer order."""
    found: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in sd.items():
        if key.startswith(prefix):
            i, rest = key[len(prefix):].split(".", 1)
            found.setdefault(int(i), {})[rest] = t
    return [found[i] for i in sorted(found)]


def inflate_stack(sd: dict[str, torch.Tensor], shape: Stack, num_layers: int, inf: Inflater,
                  src_heads: int, src_kv: int, prefix: str = "model.layers.",
                  first_layer: int = 0, qk_norm: bool = True) -> dict[str, torch.Tensor]:
    """The layers `prefix{first_layer}..` of `sd` inflated, then twin layers up to
    `num_layers` in all; moved to the CPU one by one (the GPU draws, the host keeps)."""
    src_layers = layers_of(sd, prefix)
    stds = layer_stds(src_layers)
    out = {}
    for i in range(num_layers):
        layer = (inflate_layer(src_layers[i], shape, inf, src_heads, src_kv)
                 if i < len(src_layers) else twin_layer(stds, shape, inf, qk_norm))
        out.update({f"{prefix}{first_layer + i}.{k}": v.cpu() for k, v in layer.items()})
    return out


def inflate_model(sd: dict[str, torch.Tensor], shape: Stack, num_layers: int, inf: Inflater,
                  src_heads: int, src_kv: int) -> dict[str, torch.Tensor]:
    """A whole Qwen3ForCausalLM state dict (tied or not) inflated: embedding tiled, head
    split (untied), final norm tiled, layers as `inflate_stack`."""
    emb = sd["model.embed_tokens.weight"]
    head = sd.get("lm_head.weight", emb)
    out = inflate_stack(sd, shape, num_layers, inf, src_heads, src_kv)
    out["model.embed_tokens.weight"] = inf.tile(emb).cpu()
    out["lm_head.weight"] = inf.split(head, _std(head)).cpu()
    out["model.norm.weight"] = inf.tile(sd["model.norm.weight"]).cpu()
    return out


def inflate_readers(w: torch.Tensor, blocks: int, inf: Inflater) -> torch.Tensor:
    """A reader of `blocks` concatenated residuals [out, blocks*D] (a block drafter's `fc`
    over several target layers, EAGLE's `fc` over [embedding; hidden]) split block by block
    [out', blocks*D'], rows tiled (it writes the drafter's residual)."""
    parts = w.chunk(blocks, 1)
    return inf.tile_rows(torch.cat([inf.split(p, _std(w)) for p in parts], 1)).cpu()


def nbytes(sd: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in sd.values())
