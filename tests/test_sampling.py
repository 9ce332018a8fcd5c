"""Sampling: warping masks, seeds, greedy verification, and that rejection sampling is lossless."""

import numpy as np
import pytest
import torch
from scipy import stats

from specrepro.embedded.sampling import (
    SamplingParams,
    SamplingTensors,
    accepted_per_position,
    emitted_tokens,
    make_generator,
    sample,
    verify_greedy,
    verify_sampled,
    warp,
)

P_MIN = 1e-3  # chi-square p-value a correct sampler passes (fixed seeds: deterministic)


# ------------------------------------------------------------------------------ params, seeds

def test_params_validation_names_the_field():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-0.1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=1.5)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-2)
    assert SamplingParams(temperature=0.0).is_greedy and not SamplingParams().is_greedy


def test_seed_reproduces_samples_and_different_seeds_differ():
    probs = torch.full((1, 64, 100), 0.01)  # [B=1, 64 positions, V]
    a = sample(probs, [make_generator(1234)])
    b = sample(probs, [make_generator(1234)])
    c = sample(probs, [make_generator(1235)])
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_sample_ignores_zero_probability_tokens():
    probs = torch.zeros(4, 50)
    probs[:, [3, 7]] = torch.tensor([0.5, 0.5])
    gens = [make_generator(s) for s in range(4)]
    for _ in range(50):
        assert set(sample(probs, gens).tolist()) <= {3, 7}


# ------------------------------------------------------------------------------ warping

def _reference_nucleus(probs: np.ndarray, top_p: float) -> set[int]:
    """The smallest set of most likely tokens whose mass reaches top_p."""
    order = np.argsort(-probs)
    cum = np.cumsum(probs[order])
    n = int(np.searchsorted(cum, top_p - 1e-12)) + 1
    return set(order[:n].tolist())


def test_top_k_keeps_the_k_largest():
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    probs = warp(logits, [SamplingParams(top_k=5), SamplingParams(top_k=1), SamplingParams()])
    top5 = set(logits[0].topk(5).indices.tolist())
    assert set(probs[0].nonzero().flatten().tolist()) == top5
    assert probs[1].nonzero().flatten().tolist() == [int(logits[1].argmax())]
    assert (probs[2] > 0).all()  # top_k -1 is off
    torch.testing.assert_close(probs.sum(-1), torch.ones(3))


def test_top_p_keeps_the_nucleus():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 30, generator=g) * 2
    ps = [0.1, 0.3, 0.5, 0.8, 0.95, 1.0]
    probs = warp(logits, [SamplingParams(top_p=p) for p in ps])
    full = logits.softmax(-1).numpy()
    for row, p in enumerate(ps):
        assert set(probs[row].nonzero().flatten().tolist()) == _reference_nucleus(full[row], p)
        kept = probs[row] > 0
        # the survivors keep their relative probabilities
        torch.testing.assert_close(probs[row][kept], logits[row][kept].softmax(-1))


def test_order_is_temperature_then_top_k_then_top_p():
    # temperature first: at T=1 the 0.7-nucleus of [2, 1, 0] has 2 tokens, at T=0.5 only 1
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    assert (warp(logits, [SamplingParams(temperature=1.0, top_p=0.7)]) > 0).sum() == 2
    assert (warp(logits, [SamplingParams(temperature=0.5, top_p=0.7)]) > 0).sum() == 1
    # top-k before top-p: [.4, .35, .25] -> top-2 renormalised [.53, .47] -> 0.5-nucleus is 1
    # token (top-p first would keep 2)
    logits = torch.tensor([[0.40, 0.35, 0.25]]).log()
    probs = warp(logits, [SamplingParams(top_k=2, top_p=0.5)])
    assert probs[0].nonzero().flatten().tolist() == [0]


def test_temperature_scales_logits_and_zero_is_greedy():
    logits = torch.tensor([[1.0, 2.0, 0.5], [1.0, 2.0, 0.5]])
    probs = warp(logits, [SamplingParams(temperature=0.5), SamplingParams(temperature=0.0)])
    torch.testing.assert_close(probs[0], (logits[0] / 0.5).softmax(-1))
    assert probs[1].tolist() == [0.0, 1.0, 0.0]


def test_warp_rows_are_independent_and_positions_share_the_row_params():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 4, 20, generator=g)  # [B, k+1, V]
    params = [SamplingParams(0.7, 0.9, 5), SamplingParams(1.3, 0.5, -1),
              SamplingParams(0.0, 1.0, 0)]
    batched = warp(logits, params)
    for row, sp in enumerate(params):
        torch.testing.assert_close(batched[row], warp(logits[row : row + 1], [sp])[0])
        for pos in range(4):
            alone = warp(logits[row, pos][None], [sp])[0]
            torch.testing.assert_close(batched[row, pos], alone)
    # the tensor form gives the same result
    st = SamplingTensors.from_params(params, vocab_size=20)
    torch.testing.assert_close(warp(logits, st), batched)


# ------------------------------------------------------------------------------ greedy verify

def _logits_with_argmax(argmax: list[list[int]], v: int = 10) -> torch.Tensor:
    """[B, k+1, V] logits whose argmax at each position is the given token."""
    t = torch.tensor(argmax)
    return torch.zeros(*t.shape, v).scatter_(-1, t.unsqueeze(-1), 5.0)


def test_verify_greedy_accept_all_gives_bonus_and_mismatch_gives_correction():
    target = _logits_with_argmax([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4], [5, 6, 7, 8]])
    drafts = torch.tensor([[1, 2, 3], [1, 9, 3], [0, 2, 3], [5, 6, 7]])
    n_acc, nxt = verify_greedy(drafts, target)
    assert n_acc.tolist() == [3, 1, 0, 3]
    assert nxt.tolist() == [4, 2, 1, 8]  # bonus, correction, correction, bonus


def test_verify_greedy_ragged_num_drafts():
    target = _logits_with_argmax([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    drafts = torch.tensor([[1, 2, 3], [1, 2, 0], [0, 0, 0]])  # padding after num_drafts
    n_acc, nxt = verify_greedy(drafts, target, num_drafts=torch.tensor([2, 2, 0]))
    assert n_acc.tolist() == [2, 2, 0]
    assert nxt.tolist() == [3, 3, 1]  # bonus at position num_drafts; k=0 is plain decode
    with pytest.raises(ValueError, match="num_drafts"):
        verify_greedy(drafts, target, num_drafts=torch.tensor([4, 0, 0]))


def test_verify_sampled_with_greedy_rows_equals_verify_greedy():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(16, 5, 12, generator=g)  # [B, k+1, V]
    drafts = torch.where(torch.rand(16, 4, generator=g) < 0.7, logits[:, :4].argmax(-1),
                         torch.randint(0, 12, (16, 4), generator=g))
    p = warp(logits, [SamplingParams(temperature=0.0)] * 16)
    gens = [make_generator(i) for i in range(16)]
    want = verify_greedy(drafts, logits)
    got = verify_sampled(drafts, None, p, gens)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


def test_accepted_per_position_and_emitted_tokens():
    n_acc = torch.tensor([3, 0, 1, 3])
    assert accepted_per_position(n_acc, 3).tolist() == [3, 2, 2]
    drafts = torch.tensor([[5, 6, 7], [5, 6, 7]])
    out = emitted_tokens(drafts, torch.tensor([1, 3]), torch.tensor([9, 8]))
    assert out.tolist() == [[5, 9, -1, -1], [5, 6, 7, 8]]


# ------------------------------------------------------------------------------ lossless rule

N_TRIALS = 30_000
V = 6


def _toy(seed: int, k: int):
    """Target p [k+1, V] and draft q [k, V] that differ, each position its own."""
    g = torch.Generator().manual_seed(seed)
    p = (torch.randn(k + 1, V, generator=g) * 1.2).softmax(-1)
    q = (torch.randn(k, V, generator=g) * 1.2).softmax(-1)
    return p, q


def _chi2_pvalue(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=probs.numel()).numpy()
    expected = probs.double().numpy() * counts.sum()
    return stats.chisquare(counts, expected / expected.sum() * counts.sum()).pvalue


def _run_rule(p, q, drafts, q_arg, num_drafts=None, seed0=0):
    b = drafts.shape[0]
    gens = [make_generator(seed0 + i) for i in range(b)]
    target = p.expand(b, *p.shape)
    return verify_sampled(drafts, q_arg, target, gens, num_drafts)


def _emitted_at(position: int, drafts, n_acc, nxt) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens emitted at this position, over rows that emitted one there."""
    tokens = emitted_tokens(drafts, n_acc, nxt)[:, position]
    return tokens[tokens >= 0], tokens >= 0


@pytest.mark.parametrize("k", [1, 3])
def test_rejection_sampling_preserves_target_with_sampled_drafts(k):
    p, q = _toy(10 + k, k)
    gd = make_generator(99)
    drafts = torch.stack([torch.multinomial(q[i], N_TRIALS, replacement=True, generator=gd)
                          for i in range(k)], dim=1)  # [N, k], x_i ~ q_i
    q_b = q.expand(N_TRIALS, k, V)
    n_acc, nxt = _run_rule(p, q, drafts, q_b)
    # the token at every position is distributed as p at that position (p is context-free)
    for pos in range(k + 1):
        tokens, _ = _emitted_at(pos, drafts, n_acc, nxt)
        assert _chi2_pvalue(tokens, p[pos]) > P_MIN, f"position {pos}"
    # and the first draft is accepted with probability sum_x min(p, q)
    rate = float((n_acc >= 1).float().mean())
    expected = float(torch.minimum(p[0], q[0]).sum())
    assert abs(rate - expected) < 4 * (expected * (1 - expected) / N_TRIALS) ** 0.5 + 1e-9


@pytest.mark.parametrize("explicit_one_hot", [False, True])
def test_rejection_sampling_preserves_target_with_deterministic_drafts(explicit_one_hot):
    k = 2
    p, _ = _toy(7, k)
    # a greedy drafter proposes a fixed token: the likeliest under p at position 0 (often
    # accepted) and an unlikely one at position 1 (often rejected)
    drafts = torch.tensor([[int(p[0].argmax()), int(p[1].argmin())]]).expand(N_TRIALS, k)
    q_arg = None
    if explicit_one_hot:
        q_arg = torch.zeros(N_TRIALS, k, V).scatter_(-1, drafts.unsqueeze(-1), 1.0)
    n_acc, nxt = _run_rule(p, None, drafts, q_arg)
    for pos in range(k + 1):
        tokens, _ = _emitted_at(pos, drafts, n_acc, nxt)
        assert _chi2_pvalue(tokens, p[pos]) > P_MIN, f"position {pos}"
    rate = float((n_acc >= 1).float().mean())  # one-hot q: accept with probability p(x)
    expected = float(p[0].max())
    assert abs(rate - expected) < 4 * (expected * (1 - expected) / N_TRIALS) ** 0.5


def test_one_hot_q_given_or_implied_draws_the_same():
    k = 3
    p, _ = _toy(5, k)
    drafts = torch.randint(0, V, (64, k), generator=torch.Generator().manual_seed(5))
    one_hot = torch.zeros(64, k, V).scatter_(-1, drafts.unsqueeze(-1), 1.0)
    a = _run_rule(p, None, drafts, None)
    b = _run_rule(p, None, drafts, one_hot)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_ragged_rows_follow_the_target_and_the_bonus_position():
    k = 3
    p, q = _toy(21, k)
    num_drafts = torch.arange(N_TRIALS) % (k + 1)  # rows with 0, 1, 2 and 3 drafts
    gd = make_generator(7)
    drafts = torch.stack([torch.multinomial(q[i], N_TRIALS, replacement=True, generator=gd)
                          for i in range(k)], dim=1)
    n_acc, nxt = _run_rule(p, q, drafts, q.expand(N_TRIALS, k, V), num_drafts)
    assert (n_acc <= num_drafts).all()
    for n in range(k + 1):
        rows = num_drafts == n
        # rows that drafted n tokens and accepted all of them take the bonus from p[n]
        full = rows & (n_acc == n)
        assert _chi2_pvalue(nxt[full], p[n]) > P_MIN
        # the first emitted token of any row is distributed as p[0]
        first, _ = _emitted_at(0, drafts[rows], n_acc[rows], nxt[rows])
        assert _chi2_pvalue(first, p[0]) > P_MIN


def test_a_row_verifies_the_same_alone_and_in_a_batch():
    k = 4
    p, q = _toy(3, k)
    g = torch.Generator().manual_seed(8)
    drafts = torch.randint(0, V, (10, k), generator=g)
    num_drafts = torch.tensor([4, 2, 0, 3, 4, 1, 4, 4, 2, 3])
    q_b, p_b = q.expand(10, k, V), p.expand(10, k + 1, V)
    batch = verify_sampled(drafts, q_b, p_b, [make_generator(s) for s in range(10)], num_drafts)
    for i in range(10):
        alone = verify_sampled(drafts[i : i + 1], q_b[i : i + 1], p_b[i : i + 1],
                               [make_generator(i)], num_drafts[i : i + 1])
        assert (int(alone[0]), int(alone[1])) == (int(batch[0][i]), int(batch[1][i]))


def test_chi_square_check_can_fail():
    # the check used above rejects a sampler that ignores the rule (drafts accepted blindly)
    p, q = _toy(10, 1)
    drafts = torch.multinomial(q[0], N_TRIALS, replacement=True, generator=make_generator(1))
    assert _chi2_pvalue(drafts, p[0]) < P_MIN
