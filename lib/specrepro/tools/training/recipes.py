"""Training recipes as data: every size, step count, mix and budget of a training run.

Design:
- A `Recipe` is a plain dataclass; `RECIPES` names them. The shipped checkpoint is recipe
  `v3` (target, MTP head, a 6-layer block drafter and a draft model) plus recipe `light`
  (a light block drafter added with `--from`, on the stored block drafter's first layers,
  see `specrepro.embedded.proposers`). Each recipe's comment gives the measurement that
  chose it; `default` and `v2` stay as the recipes the comparison started from.
- `smoke*` recipes are the same pipeline at toy sizes (CPU, seconds); `SMOKE_OF` maps a
  recipe to its smoke-sized variant for `--smoke --recipe NAME`.
- Field values are JSON-able (`--set FIELD=JSON` overrides any of them), and a recipe is
  recorded whole in `quality.json`.
- The recipe fields `target` (ModelConfig fields), `drafters` (name -> DrafterConfig
  fields) and `quality` (QualitySpec fields) are dictionaries, checked where they are used.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from specrepro.embedded.tokenizer import IM_START, SPECIAL_TOKENS


@dataclass
class Recipe:
    name: str
    seed: int = 0
    vocab_size: int = 4096
    target: dict = field(default_factory=dict)  # ModelConfig fields
    drafters: dict = field(default_factory=dict)  # name -> DrafterConfig fields
    # target training
    target_steps: int = 1300
    batch_size: int = 32
    seq_len: int = 1024
    long_seq_len: int = 2048  # the last `long_frac` of steps, batch halved (same tokens)
    long_frac: float = 0.2
    lr: float = 2e-3
    warmup: int = 60
    weight_decay: float = 0.1
    # self-distillation
    n_continuations: int = 49152
    prompt_len: int = 256
    gen_len: int = 128
    gen_batch: int = 4096
    cont_mix: dict = field(default_factory=lambda: {"math": 0.5, "code": 0.3, "prose": 0.2})
    # (temperature, share) pairs: how the continuations are decoded; 0.0 = greedy. The
    # drafters' labels are the target's argmax after every position whatever the mix.
    distill_mix: tuple = ((0.0, 1.0),)
    drafter_steps: int = 8000  # at most; fewer when `time_budget_s` would be exceeded
    drafter_batch: int = 64
    drafter_lr: float = 2e-3
    anchors: int = 24  # blocks per training sequence
    # block drafters with the engines' block (`block: "engine"`): the share of training
    # sequences whose block has the full length (the rest uniform over 2..block_size)
    full_block_share: float = 0.0
    # Wall-clock budget of the whole run (None: none). Drafter training stops early
    # enough to leave `quality_reserve_s` for the quality figures and saving.
    time_budget_s: float | None = None
    quality_reserve_s: float = 150.0
    # corpus (when built here) and quality figures
    code_chars: int = 6_000_000
    corpus_limit: int | None = None
    prose_docs: str = "articles"  # corpus.PROSE_DOCS: the prose document unit
    quality: dict = field(default_factory=dict)  # QualitySpec fields


TARGET = dict(vocab_size=4096, hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
              num_attention_heads=6, num_key_value_heads=2, head_dim=64,
              max_position_embeddings=4096, rope_theta=10000.0)
DRAFTERS = {
    "mtp": dict(method="mtp", num_hidden_layers=1, intermediate_size=768),
    "dflash": dict(method="dflash", num_hidden_layers=3, intermediate_size=768,
                   target_layers=[1, 3, 5]),
    "dflash_light": dict(method="dflash", num_hidden_layers=1, intermediate_size=768,
                         target_layers=[1, 3, 5]),
    "draft_model": dict(method="draft_model", draft=dict(
        hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64)),
}
# Recipe v2 (not yet trained), the answer to the shipped `default` run's misses (model card):
# - prose_docs "paragraphs": WikiText split into paragraph documents (~130 tokens each,
#   a heading joined to the paragraph after it) each ended by end-of-text. The default
#   corpus joins whole articles (~3,400 tokens), so the target never learnt to end prose:
#   greedy prose ran to 128 tokens with 77 % repeated 4-grams and "accepted" more than
#   math (repeated text is easy to draft). Build it with
#   `python -m specrepro.tools.training.corpus --prose-docs paragraphs --out FILE`.
# - distill_mix: half greedy, a quarter each sampled at T = 0.7 and T = 1.0. Drafters
#   distilled on greedy continuations only never see sampled contexts and fell to
#   1.3-1.6 tokens per step at T = 0.7; the labels stay the target's argmax (the draft a
#   deterministic drafter should propose), the contexts now cover what sampling produces.
#   The greedy half keeps block positions >= 2 on consistent greedy chains.
# - drafters: `dflash_light` (1 layer: 2.08 tokens per step at k = 7, not worth shipping)
#   dropped, the block drafter deepened from 3 to 4 layers. Same number of drafter layers per
#   step as default (3 + 1), so a drafter step should still cost ~16.7 ms on the H200.
#   Sizes in bf16: 4-layer dflash 5.56M parameters = 11.12 MB (3 layers: 8.56 MB, each layer
#   2.56 MB); checkpoint 39.56 - 3.45 - 8.56 + 11.12 = 38.67 MB (limit 40 MB).
# - drafter_steps 12,000 (default 8,000; its loss was still falling at the end). Budget on the
#   H200 (540 s): target 70 s + distillation ~50 s (sampling adds a little) + drafters ~290 s
#   (12,000 x 16.7 ms = 200 s of steps + ~90 s compile and warm-up, as in default's 224 s for
#   8,000) + quality ~120 s + ~15 s start-up = ~545 s; `time_budget_s=540` trims the drafter
#   steps to fit (the step rate is timed at steps 10-40), `quality_reserve_s` 180 leaves room
#   for the greedy figures plus the new sampled ones.
# - quality: sampled acceptance at T = 0.7 (probabilistic verification, seeded) for the block
#   drafter at k = 3 and 7, the MTP head and the draft model at k = 3, beside the greedy ones.
DRAFTERS_V2 = {
    "mtp": DRAFTERS["mtp"],
    "dflash": dict(DRAFTERS["dflash"], num_hidden_layers=4),
    "draft_model": DRAFTERS["draft_model"],
}
# Recipe v2-deep: v2 with the block drafter's parameters spent on depth instead of width
# (6 layers, MLP 384 wide: 5.46M parameters, 10.93 MB bf16, checkpoint ~38.3 MB). The one
# change against v2: default's 1-layer block drafter reached 2.08 tokens per step at k = 7
# and its 3-layer one 3.20, so depth, not width, looked like the lever; trained beside v2 on a
# second GPU (`scripts/train_candidates.sh`) and shipped if better on held-out math.
DRAFTERS_V2_DEEP = {**DRAFTERS_V2,
                    "dflash": dict(DRAFTERS["dflash"], num_hidden_layers=6, intermediate_size=384)}
V2 = dict(prose_docs="paragraphs", distill_mix=((0.0, 0.5), (0.7, 0.25), (1.0, 0.25)))
SAMPLED_QUALITY = dict(sampled_temperature=0.7, sampled_seed=0, sampled_block_ks=(3, 7),
                       sampled_mtp_ks=(3,), sampled_draft_model_ks=(3,))
RECIPES = {
    "default": Recipe("default", target=TARGET, drafters=DRAFTERS),
    "v2": Recipe("v2", target=TARGET, drafters=DRAFTERS_V2, drafter_steps=12000,
                 time_budget_s=540.0, quality_reserve_s=180.0, quality=SAMPLED_QUALITY, **V2),
    "smoke": Recipe(
        "smoke", vocab_size=512,
        target=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    max_position_embeddings=4096),
        drafters={
            "mtp": dict(method="mtp", num_hidden_layers=1, intermediate_size=128),
            "dflash": dict(method="dflash", num_hidden_layers=2, intermediate_size=128,
                           target_layers=[0, 2, 3]),
            "draft_model": dict(method="draft_model", draft=dict(
                hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=16)),
        },
        target_steps=8, batch_size=8, seq_len=64, long_seq_len=128, warmup=3,
        n_continuations=32, prompt_len=32, gen_len=16, gen_batch=32,
        drafter_steps=8, drafter_batch=8, anchors=2, code_chars=60_000, corpus_limit=6,
        quality=dict(prompts=2, validation_prompts=2, prompt_tokens=32, max_new=(("math", 24), ("code", 16),
                                                           ("prose", 16)),
                     ppl_tokens=1024, ppl_window=256, block_ks=(1, 7, 9), mtp_ks=(3,),
                     draft_model_ks=(3,))),
}
# The smoke-sized v2 (`--smoke --recipe v2`): the smoke sizes with v2's corpus, mix, drafter
# set (block drafter one layer deeper than smoke's) and sampled quality figures.
RECIPES["smoke-v2"] = replace(
    RECIPES["smoke"], name="smoke-v2", **V2,
    drafters={**RECIPES["smoke"].drafters,
              "dflash": dict(RECIPES["smoke"].drafters["dflash"], num_hidden_layers=3)},
    quality={**RECIPES["smoke"].quality, **SAMPLED_QUALITY, "block_ks": (7,),
             "sampled_block_ks": (7,)})
RECIPES["v2-deep"] = replace(RECIPES["v2"], name="v2-deep", drafters=DRAFTERS_V2_DEEP)
# Recipe v3, the shipped checkpoint: v2-deep with 128 sequences a drafter step (v2-deep: 64).
# Measured side by side on two H200s (scripts/train_candidates.sh, one recipe per GPU), block
# drafter at k = 7 on held-out GSM8K, tokens per step (ratio to MTP k = 3):
#   v2 (4 x 768, batch 64, 10,348 steps)        3.50 (1.24)
#   v2-deep (6 x 384, batch 64, 7,716 steps)    3.58 (1.27)
#   v2-deep, 48 blocks a sequence (anchors=48)  3.69 (1.32)  7,239 steps
#   v2-deep, batch 128 = v3                     3.79 (1.34)  6,507 steps
# More drafter data per step, not more steps, moved the figure; GPU training is not bitwise
# deterministic, so the four targets differ slightly (math perplexity 8.11-8.14) and a rebuild
# lands near, not on, the shipped figures. The budget leaves quality 170 s (it took 126 s).
RECIPES["v3"] = replace(RECIPES["v2-deep"], name="v3", drafter_batch=128, time_budget_s=545.0,
                        quality_reserve_s=170.0)
# Light block drafters on the shipped v3 block drafter (`--from models/embedded`): the trunk's
# first L layers (frozen, borrowed: no bytes) plus one own layer with a 256-wide MLP (0.69M
# parameters, 1.38 MB; a 384-wide one would take the checkpoint past 40 MB) and its own norm.
# The sweep trained L = 1, 2, 3 side by side on the same batches (H200, 8,817 steps x 128 in
# 237 s; lr 7e-4 on a second GPU was 0.02-0.10 worse everywhere). Held-out GSM8K, block k = 7
# tokens per step, and the engine's speedup at one stream on 8 GSM8K test prompts:
#   L   layers run   k=7 (math)   H200 bf16 graphs   2-core CPU fp32
#   1   2            2.58         1.53x              -
#   2   3            2.90         1.49x              1.35x
#   3   4            3.31         1.51x              1.46x
#   heavy (v3) 6     3.79         1.28x              1.29x
# `light` (shipped as dflash_light) is L = 3: the best on the CPU, within noise of the best on
# the H200, and the most acceptance of the three.
LIGHT_QUALITY = dict(block_ks=(3, 5, 7), mtp_ks=(), draft_model_ks=(), **SAMPLED_QUALITY)


def light_drafter(layers: int, width: int = 256, trunk_width: int = 384, **layout) -> dict:
    """A light block drafter on the first `layers` of the stored `dflash` (trunk_width wide),
    plus one own layer `width` wide; `width=trunk_width` gives every layer one
    intermediate_size (the engines' layout); `layout`: other DrafterConfig fields."""
    return dict(dict(method="dflash", num_hidden_layers=1, intermediate_size=width,
                     target_layers=[1, 3, 5],
                     trunk={"drafter": "dflash", "layers": layers,
                            "intermediate_size": trunk_width}), **layout)


RECIPES["light-sweep"] = replace(
    RECIPES["v3"], name="light-sweep", drafters={f"dflash_t{n}": light_drafter(n) for n in (1, 2, 3)},
    time_budget_s=430.0, quality_reserve_s=120.0, quality={**LIGHT_QUALITY, "block_ks": (7,)})
RECIPES["light"] = replace(RECIPES["v3"], name="light", drafters={"dflash_light": light_drafter(3)},
                           time_budget_s=370.0, quality_reserve_s=120.0,
                           quality={**LIGHT_QUALITY, "block_ks": (1, 2, 3, 4, 5, 6, 7, 9)})
RECIPES["smoke-light"] = replace(
    RECIPES["smoke-v2"], name="smoke-light",
    drafters={"dflash_light": dict(light_drafter(1), intermediate_size=64, target_layers=[0, 2, 3],
                                   trunk={"drafter": "dflash", "layers": 1,
                                          "intermediate_size": 128})},
    quality={**RECIPES["smoke-v2"].quality, "mtp_ks": (), "draft_model_ks": (),
             "sampled_mtp_ks": (), "sampled_draft_model_ks": ()})
# The engines' layout (docs/engine-layouts.md §5): block drafters vLLM 0.26.0 and
# SGLang 0.5.14 load and run as the embedded engine does. The mask is the frozen target
# embedding row of `<|im_start|>` (id 1: train_bpe gives SPECIAL_TOKENS the first ids in order,
# and models/embedded/tokenizer.json agrees), k drafts are a block of 1 + k (trained over
# random lengths 2..8), the target layer ids are ones SGLang can capture (<= L-2: the last
# block's output is never captured), and every layer has one intermediate_size.
MASK_TOKEN_ID = SPECIAL_TOKENS.index(IM_START)
ENGINE_LAYOUT = dict(mask_token_id=MASK_TOKEN_ID, block="engine")
# The shipped block drafters and MTP head (the engine-layout retrain), on v3's target, kept: `--from` a
# copy of the checkpoint that stores only the draft model (scripts/retrain_engine_layout.sh).
# - `dflash`: v3's block drafter (6 x 384) in the engines' layout on target layers 1, 2, 4 of 6
#   (0, 2, 4 was not trained: the device time of one session held one candidate).
# - `mtp`: the EAGLE-1 head (proposers/mtp.py, `layout: "eagle"`), the layout vLLM 0.26.0 and
#   SGLang 0.5.14 run for a Qwen3 target, unrolled in training to the 3 steps it runs at k = 3.
# - half the training sequences have the full block of 8 (7 drafts, article A's headline k; a
#   uniform draw over 2..8 would train draft position 7 on 1/7 of them), the rest 2..7.
# - trained alone on one H200 for the 10-minute command limit, quality figures left to a
#   `--quality-only` run (both splits, quality.SPLITS: picked on validation, reported on test).
EAGLE_HEAD = dict(method="mtp", num_hidden_layers=1, intermediate_size=768, layout="eagle",
                  mtp_train_depth=3)
ENGINE_TARGET_LAYERS = [1, 2, 4]
ENGINE_QUALITY = dict(SAMPLED_QUALITY, prompts=40, validation_prompts=32,
                      block_ks=(1, 2, 3, 4, 5, 6, 7, 9), mtp_ks=(3, 5, 7),
                      draft_model_ks=(3, 5, 7))
RECIPES["engine-layout"] = replace(
    RECIPES["v3"], name="engine-layout",
    drafters={"dflash": dict(DRAFTERS_V2_DEEP["dflash"], target_layers=ENGINE_TARGET_LAYERS,
                             **ENGINE_LAYOUT),
              "mtp": EAGLE_HEAD},
    full_block_share=0.5, drafter_steps=40000, time_budget_s=560.0, quality_reserve_s=20.0,
    quality=ENGINE_QUALITY)
# Its light drafter: the first 3 layers of that `dflash` (borrowed) plus one own layer at the
# trunk's width (one intermediate_size, as the engines build every layer: 384 wide, 0.98M
# parameters, 1.97 MB bf16; the 256-wide one was 1.38 MB).
RECIPES["light-engine-layout"] = replace(
    RECIPES["light"], name="light-engine-layout",
    drafters={"dflash_light": light_drafter(3, width=384, target_layers=ENGINE_TARGET_LAYERS,
                                            **ENGINE_LAYOUT)},
    full_block_share=0.5, drafter_steps=40000, time_budget_s=330.0, quality_reserve_s=20.0,
    quality=ENGINE_QUALITY)
# The smoke-sized engine layout (CPU, ~20 s on 2 cores): a 6-layer smoke target so the ids
# are the full-size ones' shape (0, 2, 4: <= L-2), the block drafter in the engines' layout
# beside the MTP head (the headline's ratio), acceptance at k = 1, 3, 5, 7 and 9 (past
# training); more steps than `smoke` so the drafter gets past its start (whose residual stream
# is the mask token's own embedding, which the target's tied head maps back to that token).
RECIPES["smoke-engine-layout"] = replace(
    RECIPES["smoke"], name="smoke-engine-layout", target_steps=120, warmup=10,
    n_continuations=128, drafter_steps=200,
    target={**RECIPES["smoke"].target, "num_hidden_layers": 6},
    drafters={"mtp": dict(RECIPES["smoke"].drafters["mtp"], layout="eagle", mtp_train_depth=3),
              "dflash": dict(RECIPES["smoke"].drafters["dflash"], target_layers=[0, 2, 4],
                             **ENGINE_LAYOUT)},
    full_block_share=0.5,
    quality={**RECIPES["smoke"].quality, "block_ks": (1, 3, 5, 7, 9), "draft_model_ks": ()})
# --smoke with --recipe NAME: its smoke-sized variant
SMOKE_OF = {"v2": "smoke-v2", "v2-deep": "smoke-v2", "v3": "smoke-v2", "light": "smoke-light",
            "light-sweep": "smoke-light", "engine-layout": "smoke-engine-layout"}


def greedy_only(r: Recipe) -> bool:
    return len(r.distill_mix) == 1 and float(r.distill_mix[0][0]) == 0.0


def mix_label(distill_mix) -> str:
    return ", ".join(f"{share:.0%} " + ("greedy" if float(t) == 0 else f"T={float(t):g}")
                     for t, share in distill_mix)
