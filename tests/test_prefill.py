"""The prefill stage (embedded/prefill.py): the chunks a step's budget allows, one pass per
request by default, and `batched_prefill`'s padded pass giving the same greedy outputs for
every drafter, chunked prompts and rows whose pads would leave their cache row included."""

from types import SimpleNamespace

import pytest
import torch

from conftest import random_prompts
from specrepro.embedded import prefill
from specrepro.embedded.config import EngineConfig
from specrepro.embedded.engine import LLMEngine
from specrepro.embedded.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = random_prompts(24, seed=3)  # 4-16 tokens
GREEDY = SamplingParams(temperature=0.0)


def seq(prompt_len: int, computed: int = 0):
    return SimpleNamespace(req=SimpleNamespace(prompt_token_ids=list(range(prompt_len))),
                           num_computed=computed)


def test_chunks_take_each_request_in_turn_until_the_budget_is_spent():
    a, b, c = seq(10), seq(30, computed=5), seq(8)
    assert [(s, st, e) for s, st, e in prefill.chunks([a, b, c], 20)] == [(a, 0, 10), (b, 5, 15)]
    assert prefill.chunks([a], 0) == []


def test_a_row_whose_pads_would_leave_its_cache_row_prefills_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(prefill, "_one", lambda eng, s, st, e, out: calls.append(("one", st, e)))
    monkeypatch.setattr(prefill, "_padded",
                        lambda eng, batch, w, out: calls.append(("padded", len(batch), w)))
    eng = SimpleNamespace(config=SimpleNamespace(batched_prefill=True), cache_len=40)
    near_end = seq(40, computed=36)  # 4 tokens left at positions 36-39: pads to 12 would not fit
    prefill.run(eng, [seq(12), seq(10), near_end], 64, [])
    assert calls == [("one", 36, 40), ("padded", 2, 12)]
    calls.clear()
    eng.config.batched_prefill = False
    prefill.run(eng, [seq(12), seq(10)], 64, [])
    assert calls == [("one", 0, 12), ("one", 0, 10)]


def generate(ckpt, method: str, batched: bool, budget: int):
    spec = None if method == "none" else {"method": method, "num_speculative_tokens": 3,
                                          "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    eng = LLMEngine(EngineConfig(model_dir=str(ckpt), max_num_seqs=8, max_model_len=64,
                                 max_num_batched_tokens=budget, batched_prefill=batched,
                                 speculative=spec))
    return eng.generate(PROMPTS, GREEDY, 8, ignore_eos=True), eng


@pytest.mark.parametrize("method", ["none", "ngram", "mtp", "dflash", "draft_model"])
def test_batched_prefill_gives_the_one_pass_outputs(tiny_checkpoint, method, monkeypatch):
    # a budget of 24 chunks some prompts across steps, so partial chunks are padded too
    ref, ref_eng = generate(tiny_checkpoint, method, batched=False, budget=24)
    padded = []
    real = prefill._padded
    monkeypatch.setattr(prefill, "_padded",
                        lambda eng, batch, w, out: (padded.append(len(batch)),
                                                    real(eng, batch, w, out)))
    got, eng = generate(tiny_checkpoint, method, batched=True, budget=24)
    assert padded and max(padded) > 2  # several requests did share a pass
    bad = [i for i, (a, b) in enumerate(zip(ref, got)) if a != b]
    gaps = []
    for i in bad:  # a difference is acceptable only at a near-tie of the target's top two
        j = next(t for t, (x, y) in enumerate(zip(ref[i], got[i])) if x != y)
        with torch.inference_mode():
            top = ref_eng.model(torch.tensor([PROMPTS[i] + ref[i][:j]])).logits[0, -1].topk(2)
        gaps.append(float(top.values[0] - top.values[1]))
    assert all(g < 1e-4 for g in gaps) and len(bad) <= 1, f"{method}: {bad} differ, gaps {gaps}"
    assert eng.stats.prompt_tokens == ref_eng.stats.prompt_tokens == sum(map(len, PROMPTS))
    if method != "none":
        assert eng.stats.num_draft_tokens > 0


def test_sampled_first_tokens_use_each_requests_generator(tiny_checkpoint):
    """A sampled request draws its first token with its own seeded generator in the padded
    pass too: the same seeds give the same tokens as one pass per request (on this fp32 CPU
    the padded pass's probabilities differ at most in the last bits)."""
    params = [SamplingParams(temperature=1.0, seed=100 + i) for i in range(len(PROMPTS))]
    outs = [LLMEngine(EngineConfig(model_dir=str(tiny_checkpoint), max_num_seqs=8,
                                   max_model_len=64, batched_prefill=batched))
            .generate(PROMPTS, params, 4, ignore_eos=True) for batched in (False, True)]
    assert outs[0] == outs[1]
