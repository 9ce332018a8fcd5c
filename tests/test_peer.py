"""The in-process transformers peer on the tiny checkpoint: plain and assisted generation,
the lossless check between them, and its derived acceptance counts."""

from __future__ import annotations

import pytest

from specrepro.harness.loadgen import LoadConfig, request_seed
from specrepro.harness.transformers_peer import (
    PeerError,
    TransformersPeer,
    draft_model_dir,
    peer_counts,
)
from specrepro.params import Profile
from specrepro.workloads import Prompt

PROMPTS = [Prompt(id=f"p{i}", workload="essays", max_tokens=16,
                  messages=[{"role": "user", "content": f"Tell me about {w}."}])
           for i, w in enumerate(("rivers", "stone"))]


def profile(ckpt, k=None):
    data = {"name": "peer", "engine": "transformers", "model": {"id": str(ckpt)},
            "flags": {"device": "cpu", "dtype": "float32"}}
    if k is not None:
        data |= {"drafter": {"id": str(ckpt)},
                 "speculative": {"method": "draft_model", "num_speculative_tokens": k}}
    return Profile.model_validate(data, strict=False)


@pytest.fixture(scope="module")
def plain_and_assisted(tiny_checkpoint):
    cfg = LoadConfig(url="inprocess", model="tiny", seed=5, warmup=1)
    plain = TransformersPeer(profile(tiny_checkpoint)).load().run(PROMPTS, cfg)
    assisted = TransformersPeer(profile(tiny_checkpoint, k=3)).load().run(PROMPTS, cfg)
    return plain, assisted


def test_records_have_timing_tokens_and_seeds(plain_and_assisted):
    for res in plain_and_assisted:
        assert [r.request_idx for r in res.records] == [0, 1] and res.wall_s > 0
        for r in res.records:
            assert r.error is None, r.error
            assert r.completion_tokens == len(r.token_ids) == len(r.itl_s) + 1
            assert r.ttft_s > 0 and r.e2e_s >= r.ttft_s and r.prompt_tokens > 0
            assert r.finish_reason in ("stop", "length")
            assert r.seed == request_seed(5, r.request_idx)


def test_greedy_assisted_generation_is_lossless(plain_and_assisted):
    plain, assisted = plain_and_assisted
    for a, b in zip(plain.records, assisted.records):
        assert a.token_ids == b.token_ids and a.text == b.text


def test_derived_counts_add_up(plain_and_assisted):
    plain, assisted = plain_and_assisted
    assert peer_counts(plain.records) is None  # plain generate drafts nothing
    c = peer_counts(assisted.records)
    tokens = sum(r.completion_tokens for r in assisted.records)
    # every step yields its accepted drafts plus one token from the target
    assert c["num_drafts"] + c["num_accepted_tokens"] == tokens
    assert sum(c["accepted_per_pos"]) == c["num_accepted_tokens"] and len(c["accepted_per_pos"]) == 3
    assert c["num_accepted_tokens"] <= c["num_draft_tokens"] <= 3 * c["num_drafts"]


def test_draft_model_found_in_the_checkpoint(tiny_checkpoint, tmp_path):
    assert draft_model_dir(tiny_checkpoint, tmp_path) == tiny_checkpoint / "draft_model"
    with pytest.raises(PeerError, match="Hugging Face causal LM"):
        draft_model_dir(tmp_path, tmp_path)


def test_stop_strings_work_in_plain_and_assisted_generation(tiny_checkpoint):
    # GSM8K prompts carry lm-eval's stop strings; assisted generation used to reject them.
    prompts = [Prompt(id="s0", workload="gsm8k", max_tokens=24, text="Question: 2+2?\nAnswer:",
                      stop=["Question:", "\n\n"])]
    cfg = LoadConfig(url="inprocess", model="tiny", seed=1, warmup=0)
    for k in (None, 3):
        res = TransformersPeer(profile(tiny_checkpoint, k=k)).load().run(prompts, cfg)
        r = res.records[0]
        assert r.error is None, r.error
        assert "Question:" not in r.text and "\n\n" not in r.text


def test_threads_flag_sets_torch_threads_like_the_server(tiny_checkpoint):
    import torch

    before = torch.get_num_threads()
    prof = profile(tiny_checkpoint)
    prof = prof.model_copy(update={"flags": {**prof.flags, "threads": 1}})
    try:
        torch.set_num_threads(2)
        TransformersPeer(prof).load()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
