"""Metric formulas, checked against the articles' own arithmetic."""

import pytest

from specrepro import metrics as m


def test_step_ms_reproduces_article_a():
    # Article A: 3.16 tokens per step at 26.0 tok/s is a 122 ms step; MTP 2.55 at 20.8 is 123 ms.
    assert m.step_ms(3.16, 26.0) == pytest.approx(121.5, abs=0.1)
    assert round(m.step_ms(2.55, 20.8)) == 123


def test_acceptance_length_and_rates_from_counter_deltas():
    # 100 steps that drafted 3 tokens each and kept 155 of the 300.
    assert m.acceptance_length(155, 100) == pytest.approx(2.55)
    assert m.draft_acceptance_rate(155, 300) == pytest.approx(155 / 300)
    per_pos = m.per_position_acceptance([75, 52, 28], 100)
    assert per_pos == pytest.approx([0.75, 0.52, 0.28])
    assert sum(per_pos) == pytest.approx(m.acceptance_length(155, 100) - 1)


def test_missing_inputs_give_none_not_zero():
    assert m.acceptance_length(None, 10) is None
    assert m.acceptance_length(5, 0) is None
    assert m.per_position_acceptance(None, 3) is None
    assert m.tokens_per_joule(100, None) is None
    assert m.percentile([], 50) is None


def test_repeated_ngram_share():
    assert m.repeated_ngram_share([1, 2, 3]) is None
    assert m.repeated_ngram_share([1, 2, 3, 4, 5, 6]) == 0.0
    # "a b c d a b c d": grams abcd bcda cdab dabc abcd -> 1 of 5 repeated.
    assert m.repeated_ngram_share(list("abcdabcd")) == pytest.approx(1 / 5)
    pooled = m.pooled_repeated_ngram_share([list("abcdabcd"), [1, 2, 3, 4, 5]])
    assert pooled == pytest.approx(1 / 7)


def test_throughput_energy_and_percentiles():
    assert m.agg_tok_s(1617.5 * 40, 40) == pytest.approx(1617.5)
    assert m.per_stream_tok_s(1617.5, 32) == pytest.approx(50.55, abs=0.01)
    # Article B: 0.50 tokens per joule at 298.8 W is about 149 tok/s.
    assert m.tokens_per_joule(149.4 * 10, 298.8 * 10) == pytest.approx(0.5, abs=0.001)
    assert m.percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert m.relative_change_pct(162.6, 153.4) == pytest.approx(6.0, abs=0.05)
    assert m.roofline_tok_s(1.0, 1.8e12, 21 * 2**30) == pytest.approx(79.8, abs=0.1)


def test_chunk_gaps_give_the_per_token_gaps_and_back():
    """A stream of chunks (3 tokens at 30 ms, then 1 after 10 ms, 2 after 8 ms): the
    per-token gaps the load generator splits them into, and back to the chunks."""
    from specrepro.metrics import chunks_from_gaps, token_gaps_s

    gaps = token_gaps_s([30_000, 10_000, 8_000], [3, 1, 2])
    assert gaps == pytest.approx([0.0, 0.0, 0.010, 0.004, 0.004])
    assert chunks_from_gaps(0.030, gaps) == ([30_000, 10_000, 8_000], [3, 1, 2])
    assert chunks_from_gaps(None, []) == ([], []) and token_gaps_s([], []) == []
    # arrivals are rounded before they are differenced: the gaps add up to the last one
    got, tokens = chunks_from_gaps(0.0000004, [0.0000007, 0.0000007, 0.0000009])
    assert sum(got) == round((0.0000004 + 0.0000014 + 0.0000009) * 1e6) and tokens == [1, 2, 1]
    with pytest.raises(ValueError):  # lengths that do not pair are a bug, not a guess
        token_gaps_s([1, 2], [1])
