"""Sampling and verification on CUDA with per-request CUDA generators (skipped without a GPU)."""

import pytest
import torch
from scipy import stats

from specrepro.embedded.sampling import (
    SamplingParams,
    make_generator,
    sample,
    verify_greedy,
    verify_sampled,
    warp,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_warp_matches_cpu_and_seed_reproduces_on_cuda():
    logits = torch.randn(4, 3, 100, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(0.7, 0.9, 20), SamplingParams(1.0, 0.5, -1),
              SamplingParams(0.0), SamplingParams(1.3, 1.0, 5, seed=3)]
    p_gpu = warp(logits.cuda(), params)
    torch.testing.assert_close(p_gpu.cpu(), warp(logits, params))
    a = sample(p_gpu, [make_generator(i, "cuda") for i in range(4)])
    b = sample(p_gpu, [make_generator(i, "cuda") for i in range(4)])
    assert a.is_cuda and torch.equal(a, b)


def test_verification_on_cuda_is_lossless_and_row_local():
    n, k, v = 20_000, 3, 6
    g = torch.Generator().manual_seed(4)
    p = (torch.randn(k + 1, v, generator=g) * 1.2).softmax(-1).cuda()
    q = (torch.randn(k, v, generator=g) * 1.2).softmax(-1).cuda()
    gd = make_generator(5, "cuda")
    drafts = torch.stack([torch.multinomial(q[i], n, True, generator=gd) for i in range(k)], 1)
    gens = [make_generator(i, "cuda") for i in range(n)]
    n_acc, nxt = verify_sampled(drafts, q.expand(n, k, v), p.expand(n, k + 1, v), gens)
    first = torch.where(n_acc >= 1, drafts[:, 0], nxt).cpu()
    counts = torch.bincount(first, minlength=v).numpy()
    assert stats.chisquare(counts, p[0].double().cpu().numpy() * n).pvalue > 1e-3
    alone = verify_sampled(drafts[7:8], q.expand(1, k, v), p.expand(1, k + 1, v),
                           [make_generator(7, "cuda")])
    assert (int(alone[0]), int(alone[1])) == (int(n_acc[7]), int(nxt[7]))
    logits = torch.randn(8, k + 1, 50, device="cuda")
    acc, tok = verify_greedy(logits[:, :k].argmax(-1), logits)
    assert acc.tolist() == [k] * 8 and torch.equal(tok, logits[:, k].argmax(-1))
