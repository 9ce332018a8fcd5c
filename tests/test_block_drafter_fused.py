"""The block drafter's inference passes over its stacked context cache (proposers/dflash.py,
`BlockDrafter.allocate` / `finalize`): every layer's context projected by one GEMM in
`observe`, one gather of every layer's context in `propose`. They must reproduce the
per-layer passes the drafter is trained with, whatever the weights' layout, the attention
span, the batch or the block length, and fall back where fusing would be wrong."""

import pytest
import torch

from specrepro.embedded.checkpoint import load_proposer, load_target
from specrepro.embedded.config import EngineConfig
from specrepro.embedded.engine import LLMEngine
from specrepro.embedded.model import relayout_linear_weights

SLOTS = torch.tensor([2, 0])
LENS = torch.tensor([13, 7])  # ragged: the second row's context is shorter


def _setup(ckpt, k_major=False, static=False, fused=True):
    target, _ = load_target(ckpt)
    prop = load_proposer(ckpt, "dflash", target)
    if k_major:
        relayout_linear_weights(target, True)
        relayout_linear_weights(prop, True)
    prop.static_bound = static
    prop.allocate(4, 40)
    if fused:
        prop.finalize()
    return target, prop


def _observe_prompts(target, prop, seed=0):
    g = torch.Generator().manual_seed(seed)
    V = target.config.vocab_size
    for slot, n in zip(SLOTS.tolist(), LENS.tolist()):
        ids = torch.randint(3, V, (1, n), generator=g)
        pos = torch.arange(n)[None]
        out = target(ids, positions=pos, hidden_layers=prop.target_layers)
        prop.observe(torch.tensor([slot]), ids, pos, out.hidden)


def _reference_logits(prop, k):
    """The per-layer pass (`run_layers`, as in training): each layer's context sliced from its
    own cache and concatenated with the block's keys."""
    n = max(k + 1, prop.block_size)
    last = torch.tensor([5, 9])
    C = int(LENS.max())
    x = prop._blocks(last[:, None], n)[:, 0]
    cos, sin = prop._rope(LENS[:, None] + torch.arange(n), x.dtype)
    ctx_kv = [(ck[SLOTS, :, :C], cv[SLOTS, :, :C]) for ck, cv in prop.ctx_cache]
    ctx_mask = torch.arange(C)[None, :] < LENS[:, None]
    mask = torch.cat([ctx_mask, ctx_mask.new_ones(2, n)], -1)[:, None, None]
    return prop.run_layers(x, cos, sin, ctx_kv, mask, slice(1, k + 1))


@pytest.mark.parametrize("k_major", [False, True])
def test_fused_observe_writes_what_the_per_layer_observe_writes(tiny_checkpoint, k_major):
    target, fused = _setup(tiny_checkpoint, k_major, fused=True)
    _, plain = _setup(tiny_checkpoint, k_major, fused=False)
    with torch.inference_mode():
        assert fused._ctx_proj is not None and plain._ctx_proj is None
        assert fused._ctx_proj.t().is_contiguous() == k_major  # the layout it joined
        _observe_prompts(target, fused)
        _observe_prompts(target, plain)
        for (fk, fv), (pk, pv) in zip(fused.ctx_cache, plain.ctx_cache):
            torch.testing.assert_close(fk, pk, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(fv, pv, rtol=1e-5, atol=1e-6)
        assert fk.abs().sum() > 0  # something was written


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("k", [3, 7, 9])
def test_propose_over_the_stacked_cache_equals_the_per_layer_pass(tiny_checkpoint, static, k):
    """k=9 extends the block past its training (more positions than a row keeps free): the
    concatenating path, which must agree too. The static span reads whole rows under the
    mask and must give the same drafts as the span cut at the longest context."""
    target, prop = _setup(tiny_checkpoint, static=static)
    with torch.inference_mode():
        _observe_prompts(target, prop)
        ref = _reference_logits(prop, k)
        toks, logits = prop.propose(SLOTS, LENS, torch.tensor([5, 9]), k)
        torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-5)
        assert torch.equal(toks, ref.argmax(-1))
        # a propose leaves the context untouched: the block's keys went to a gathered copy
        again = prop.propose(SLOTS, LENS, torch.tensor([5, 9]), k)[1]
        torch.testing.assert_close(again, logits, rtol=0, atol=0)


def test_finalize_keeps_an_unchanged_join_and_redoes_a_changed_one(tiny_checkpoint):
    _, prop = _setup(tiny_checkpoint)
    first = prop._ctx_proj
    prop.finalize()
    assert prop._ctx_proj is first  # a graph captured on it keeps valid storage
    with torch.no_grad():
        prop.layers[0].self_attn.v_proj.weight.mul_(2.0)
    prop.finalize()
    assert prop._ctx_proj is not first
    d = prop.layers[0].self_attn.v_proj.weight.shape[0]
    kv = prop.layers[0].self_attn.k_proj.weight.shape[0]
    torch.testing.assert_close(prop._ctx_proj[kv:kv + d], prop.layers[0].self_attn.v_proj.weight)
    prop.finalize(fuse=False)
    assert prop._ctx_proj is None


def test_engine_fuses_plain_drafters_and_not_fp8_ones_even_when_shared(tiny_checkpoint):
    """An FP8 drafter is calibrated layer by layer and keeps per-layer passes, also when the
    same drafter object was fused by an engine built before it."""
    from specrepro.embedded.quant import QuantLinear

    target, _ = load_target(tiny_checkpoint)
    prop = load_proposer(tiny_checkpoint, "dflash", target)
    base = {"model_dir": str(tiny_checkpoint), "max_num_seqs": 2, "max_model_len": 64}
    LLMEngine(EngineConfig(**base, speculative={"method": "dflash",
                                                "num_speculative_tokens": 3}),
              model=target, proposer=prop)
    assert prop._ctx_proj is not None
    LLMEngine(EngineConfig(**base, speculative={"method": "dflash", "num_speculative_tokens": 3,
                                                "quantization": "fp8_per_tensor"}),
              model=target, proposer=prop)
    quant = [m for m in prop.modules() if isinstance(m, QuantLinear)]
    assert quant and all(m.act_amax is not None for m in quant)  # k_proj/v_proj calibrated
    assert prop._ctx_proj is None
