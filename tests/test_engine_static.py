"""The static (CUDA-graph-shaped) decode path, run eagerly on the CPU: `static_shapes=True`
pads batches to power-of-two buckets with the scratch slot and attends over whole cache rows,
exactly the program the engine captures on CUDA. Greedy output must equal plain greedy output
for every method, alone and batched; the program must read nothing back to the host; static
and dynamic attention spans must draft the same tokens."""

import pytest
import torch

from conftest import decode_program_without_host_reads, random_prompts
from specrepro.embedded import spec as spec_mod
from specrepro.embedded.checkpoint import load_proposer, load_target
from specrepro.embedded.config import EngineConfig
from specrepro.embedded.engine import EngineRequest, LLMEngine
from specrepro.embedded.graphs import DecodeStep
from specrepro.embedded.sampling import SamplingParams, verify_greedy

GREEDY = SamplingParams(temperature=0.0)
METHODS = ("none", "ngram", "mtp", "dflash", "dflash_light", "draft_model")
K, MAX_TOKENS = 3, 10


pytestmark = pytest.mark.usefixtures("one_torch_thread")


PROMPTS = random_prompts(12, seed=7)


def engine(ckpt, method, static, max_num_seqs, **kw):
    spec = None if method == "none" else {"method": method, "num_speculative_tokens": K,
                                          "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    if method == "dflash_light":  # the light block drafter on dflash's first layer, by name
        spec.update(method="dflash", model="dflash_light")
    return LLMEngine(EngineConfig(model_dir=str(ckpt), max_num_seqs=max_num_seqs,
                                  max_model_len=64, max_num_batched_tokens=64,
                                  speculative=spec, static_shapes=static, **kw))


@pytest.fixture(scope="module")
def reference(tiny_checkpoint):
    """Plain greedy decoding of the target, one request at a time, dynamic shapes."""
    return engine(tiny_checkpoint, "none", False, 1).generate(PROMPTS, GREEDY, MAX_TOKENS,
                                                              ignore_eos=True)


@pytest.mark.parametrize("max_num_seqs", [1, 6])  # 6: buckets of 8, 4, 2 with padding rows
@pytest.mark.parametrize("method", METHODS)
def test_static_greedy_output_equals_plain_greedy(tiny_checkpoint, reference, method,
                                                  max_num_seqs):
    eng = engine(tiny_checkpoint, method, True, max_num_seqs)
    got = eng.generate(PROMPTS, GREEDY, MAX_TOKENS, ignore_eos=True)
    bad = [i for i, (a, b) in enumerate(zip(reference, got)) if a != b]
    assert len(bad) <= 1, f"{method} static, {max_num_seqs} slots: prompts {bad} differ"
    if method != "none":
        assert eng.stats.num_draft_tokens > 0
    if method == "ngram":  # ragged rows ran through the in-program greedy acceptance
        assert eng.stats.num_accepted_tokens > 0


@pytest.mark.parametrize("method", ["ngram", "mtp"])
def test_static_sampled_rows_match_dynamic_ones(tiny_checkpoint, method):
    """Sampled rows verify eagerly after the program; a seed gives the same tokens either way
    (greedy drafts, the same per-request generators)."""
    sp = SamplingParams(temperature=0.8, top_k=50, seed=3)
    outs = [engine(tiny_checkpoint, method, static, 4).generate(PROMPTS[:4], sp, MAX_TOKENS,
                                                                ignore_eos=True)
            for static in (False, True)]
    assert outs[0] == outs[1]


@pytest.mark.parametrize("method", METHODS)
def test_decode_program_reads_nothing_back_to_the_host(tiny_checkpoint, method, monkeypatch):
    """A CUDA graph cannot hold a host read: the program must not call one."""
    eng = engine(tiny_checkpoint, method, True, 4)
    eng.generate(PROMPTS[:3], GREEDY, 4, ignore_eos=True)  # caches hold real contexts
    k = 0 if method == "none" else K
    out = decode_program_without_host_reads(eng, k, monkeypatch)
    assert out["rows"].shape == (4, k + 3)
    assert out["logits"].shape[:2] == (4, k + 1)


def test_one_host_read_per_greedy_decode_step(tiny_checkpoint, monkeypatch):
    eng = engine(tiny_checkpoint, "mtp", True, 4)
    for i, p in enumerate(PROMPTS[:2]):
        eng.add_request(EngineRequest(f"r{i}", p, GREEDY, max_tokens=20, ignore_eos=True))
    eng.step()  # admits and prefills both prompts (they fit the token budget)
    assert len(eng.running) == 2 and all(s.prefilled for s in eng.running.values())
    reads = []

    def counted(name):
        orig = getattr(torch.Tensor, name)

        def read(*a, **kw):
            reads.append(name)
            return orig(*a, **kw)
        return read
    for name in ("item", "tolist", "__int__", "__float__", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, counted(name))
    eng.step()
    monkeypatch.undo()
    assert reads == ["tolist"]
    assert eng.stats.num_spec_steps == 1


def test_decode_shapes_cover_buckets_and_schedule(tiny_checkpoint):
    eng = LLMEngine(EngineConfig(
        model_dir=str(tiny_checkpoint), max_num_seqs=6, max_model_len=64,
        speculative={"method": "ngram", "num_speculative_tokens": 5,
                     "num_speculative_tokens_per_batch_size": [[1, 2, 5], [3, 6, 2]]}))
    assert eng.decode_shapes() == [(1, 5), (2, 5), (4, 2), (8, 2)]
    assert [DecodeStep.bucket(b) for b in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, 16]


@pytest.mark.parametrize("method", ["mtp", "dflash", "draft_model"])
def test_static_span_drafts_like_the_dynamic_one(tiny_checkpoint, method):
    """Attending over the whole cache row under the mask is the same attention."""
    target, _ = load_target(tiny_checkpoint)
    prop = load_proposer(tiny_checkpoint, method, target).eval()
    prop.allocate(3, 48)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 500, (2, 12), generator=g)
    pos = torch.arange(12).expand(2, 12)
    slots = torch.tensor([0, 1])
    with torch.inference_mode():
        cache = target.new_cache(3, 48)
        out = target(ids, positions=pos, cache=cache, slots=slots, kv_len=12,
                     hidden_layers=prop.target_layers, logits="none")
        prop.observe(slots, ids, pos, out.hidden)
        args = (slots, torch.tensor([12, 9]), torch.tensor([5, 6]), 4)
        dyn_t, dyn_l = prop.propose(*args)
        prop.static_bound = True
        sta_t, sta_l = prop.propose(*args)
    assert torch.equal(dyn_t, sta_t)
    assert torch.allclose(dyn_l, sta_l, atol=1e-4)


def test_greedy_acceptance_masks_ragged_rows_like_verify_greedy():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 5, 11, generator=g)  # [B, k+1, V]
    target = logits.argmax(-1)
    tokens = target[:, :4].clone()
    tokens[1, 2] = (tokens[1, 2] + 1) % 11  # a mismatch inside row 1's drafts
    num = torch.tensor([4, 3, 0, 2, 1])
    drafts = spec_mod.Drafts(tokens, None, num)
    verified = spec_mod.Verified(logits, None, None, [])
    got = spec_mod.accept_greedy(drafts, verified)
    want = verify_greedy(tokens, logits, num)
    assert torch.equal(got.num_accepted, want[0]) and torch.equal(got.next_token, want[1])
    assert got.num_accepted.tolist() == [4, 2, 0, 2, 1]
