"""specrepro.speculative: vLLM's speculative config and per-batch-size schedule as the embedded
engine reads them; proposers/ngram.py: n-gram prompt lookup."""

import pytest
import torch

from specrepro.embedded.proposers import NgramProposer
from specrepro.speculative import SpecConfig, SpecConfigError, check_schedule


def test_schedule_semantics_follow_vllm():
    cfg = SpecConfig.from_dict({"method": "dflash", "num_speculative_tokens": 5,
                                "num_speculative_tokens_per_batch_size":
                                    [[1, 4, 7], [5, 6, 3], [9, 16, 2]]})
    # inclusive ends; k=7 capped at num_speculative_tokens=5; 7..8 is a gap (previous k=3);
    # past the last range the last k holds
    got = {b: cfg.k_for_batch(b) for b in (1, 4, 5, 6, 7, 8, 9, 16, 17, 1000)}
    assert got == {1: 5, 4: 5, 5: 3, 6: 3, 7: 3, 8: 3, 9: 2, 16: 2, 17: 2, 1000: 2}
    assert SpecConfig.from_dict({"method": "mtp", "num_speculative_tokens": 3}).k_for_batch(64) == 3


@pytest.mark.parametrize("sched, words", [
    ([[2, 4, 3]], "start at 1"),
    ([[1, 4, 3], [4, 8, 2]], "overlap"),
    ([[1, 4, -1]], "k >= 0"),
    ([[1, 0, 2]], "start <= end"),
    ([[1, 2]], "triples"),
    ([[1, 4, 7], [9, 16, 2], [5, 6, 3]], "ascending"),
])
def test_schedule_validation_names_the_problem(sched, words):
    with pytest.raises(ValueError, match=words):
        check_schedule(sched)
    with pytest.raises(SpecConfigError, match=f"num_speculative_tokens_per_batch_size: .*{words}"):
        SpecConfig.from_dict({"method": "mtp", "num_speculative_tokens": 3,
                              "num_speculative_tokens_per_batch_size": sched})


def test_config_errors_name_the_key():
    with pytest.raises(SpecConfigError, match="unknown key"):
        SpecConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3, "bogus": 1})
    with pytest.raises(SpecConfigError, match="method"):
        SpecConfig.from_dict({"method": "eagle9", "num_speculative_tokens": 3})
    with pytest.raises(SpecConfigError, match="needs num_speculative_tokens"):
        SpecConfig.from_dict({"method": "mtp"})
    with pytest.raises(SpecConfigError, match="quantization"):
        SpecConfig.from_dict({"method": "mtp", "num_speculative_tokens": 2, "quantization": "int3"})
    cfg = SpecConfig.from_dict({"method": "ngram", "num-speculative-tokens": 4,
                                "prompt_lookup_max": 3})
    assert (cfg.num_speculative_tokens, cfg.prompt_lookup_min, cfg.prompt_lookup_max) == (4, 3, 3)
    assert SpecConfig.from_dict(None).method == "none"


def _ngram(histories, lookup=(1, 3), k=4):
    prop = NgramProposer(*lookup)
    prop.allocate(len(histories), 64, "cpu")
    for slot, h in enumerate(histories):
        ctx = torch.tensor([h[:-1]])
        prop.observe(torch.tensor([slot]), ctx, torch.arange(len(h) - 1)[None], [])
    slots = torch.arange(len(histories))
    ctx_len = torch.tensor([len(h) - 1 for h in histories])
    last = torch.tensor([h[-1] for h in histories])
    return prop.propose_ragged(slots, ctx_len, last, k)


def test_ngram_proposes_what_followed_the_latest_longest_match():
    histories = [
        [5, 6, 7, 8, 9, 1, 2, 5, 6, 7, 3, 4, 5, 6, 7],  # 5 6 7 seen twice: latest is followed by 3 4
        [1, 2, 3, 9, 9, 1, 2, 3],  # followed by 9 9 1 2 (k=4 caps it)
        [4, 5, 6, 7],  # no earlier occurrence of anything: no drafts
        [8, 1, 2, 8],  # 1-gram match, only 3 tokens follow it
    ]
    drafts, num = _ngram(histories)
    assert num.tolist() == [4, 4, 0, 3]
    assert drafts[0].tolist() == [3, 4, 5, 6]
    assert drafts[1].tolist() == [9, 9, 1, 2]
    assert drafts[3, :3].tolist() == [1, 2, 8]


def test_ngram_prefers_the_longest_n():
    # the 1-gram "3" last occurred right before 0; the 2-gram "2 3" before 7
    drafts, num = _ngram([[2, 3, 7, 1, 3, 0, 2, 3]], lookup=(1, 2), k=1)
    assert drafts.tolist() == [[7]] and num.tolist() == [1]
