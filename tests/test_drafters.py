"""The drafters honour the engine's Proposer API: shapes, ragged rollback by length,
block truncation/extension, and training losses that decrease."""

import pytest
import torch

from specrepro.embedded.checkpoint import load_proposer, load_target
from specrepro.speculative import MODEL_METHODS


@pytest.fixture(scope="module")
def ckpt(tiny_checkpoint):  # conftest: build_random_checkpoint, once per session
    return tiny_checkpoint


def target_pass(target, cache, slots, tokens, positions, layers):
    out = target(tokens, positions=positions, cache=cache, slots=slots,
                 kv_len=int(positions.max()) + 1, hidden_layers=layers)
    return out.logits, out.hidden


def prefill(target, prop, slots, prompt):
    """Target prefill of prompt [B, P] (then the proposer observes), on fresh caches."""
    B, P = prompt.shape
    cache = target.new_cache(8, 96)
    prop.allocate(8, 96)
    pos = torch.arange(P).expand(B, P)
    logits, hidden = target_pass(target, cache, slots, prompt, pos, prop.target_layers)
    prop.observe(slots, prompt, pos, hidden)
    return cache, logits[:, -1].argmax(-1)


@pytest.mark.parametrize("method", MODEL_METHODS)
def test_propose_shapes_and_sizes(ckpt, method):
    target, _ = load_target(ckpt)
    prop = load_proposer(ckpt, method, target)
    V = target.config.vocab_size
    slots = torch.tensor([5, 1])
    prompt = torch.randint(3, V, (2, 11), generator=torch.Generator().manual_seed(0))
    _, last = prefill(target, prop, slots, prompt)
    toks, logits = prop.propose(slots, torch.tensor([11, 11]), last, 4)
    assert toks.shape == (2, 4) and logits.shape == (2, 4, V)
    assert torch.equal(toks, logits.argmax(-1))
    assert prop.kv_bytes_per_token() > 0 and prop.weight_bytes() > 0
    assert prop.method == method
    prop.release(5)


@pytest.mark.parametrize("method", MODEL_METHODS)
def test_ragged_rollback_equals_fresh_replay(ckpt, method):
    """Propose, verify k+1 tokens, accept a different number per slot: the next drafts
    equal those of a proposer that only ever saw the accepted tokens."""
    target, _ = load_target(ckpt)
    prop = load_proposer(ckpt, method, target)
    V, P, k = target.config.vocab_size, 9, 5
    slots = torch.tensor([3, 0])
    prompt = torch.randint(3, V, (2, P), generator=torch.Generator().manual_seed(1))
    cache, last = prefill(target, prop, slots, prompt)
    drafts, _ = prop.propose(slots, torch.tensor([P, P]), last, k)
    chunk = torch.cat([last[:, None], drafts], 1)  # verify [B, k+1] at P..P+k
    pos = P + torch.arange(k + 1).expand(2, -1)
    _, hidden = target_pass(target, cache, slots, chunk, pos, prop.target_layers)
    prop.observe(slots, chunk, pos, hidden)
    accepted = [1, 4]  # drafts accepted per slot: ragged
    context_len = torch.tensor([P + 1 + n for n in accepted])
    nxt = torch.tensor([7, 11])  # the target's next token after the accepted ones
    got_t, got_l = prop.propose(slots, context_len, nxt, k)

    for b, n in enumerate(accepted):  # fresh replay of each slot's accepted sequence
        fresh = load_proposer(ckpt, method, target)
        seq = torch.cat([prompt[b], chunk[b, :n + 1]])[None]
        prefill(target, fresh, torch.tensor([2]), seq)
        ref_t, ref_l = fresh.propose(torch.tensor([2]), context_len[b:b + 1], nxt[b:b + 1], k)
        assert torch.equal(got_t[b], ref_t[0])
        assert (got_l[b] - ref_l[0]).abs().max().item() < 1e-4


def test_block_drafter_truncates_and_extends(ckpt):
    target, _ = load_target(ckpt)
    prop = load_proposer(ckpt, "dflash", target)
    slots, P = torch.tensor([0]), 12
    prompt = torch.randint(3, target.config.vocab_size, (1, P),
                           generator=torch.Generator().manual_seed(2))
    _, last = prefill(target, prop, slots, prompt)
    cl = torch.tensor([P])
    t7, l7 = prop.propose(slots, cl, last, 7)
    t3, l3 = prop.propose(slots, cl, last, 3)
    t9, _ = prop.propose(slots, cl, last, 9)
    # the same logits up to float32 rounding: a block of 3 and one of 7 are matmuls of other
    # shapes, whose CPU kernels sum in another order (4.8e-7 at most on an AVX-512 host)
    assert torch.equal(t3[0], t7[0, :3]) and (l3 - l7[:, :3]).abs().max().item() < 1e-4
    assert t9.shape == (1, 9)


def test_propose_uses_the_sampler(ckpt):
    target, _ = load_target(ckpt)
    prop = load_proposer(ckpt, "mtp", target)
    slots = torch.tensor([0])
    prompt = torch.randint(3, target.config.vocab_size, (1, 6),
                           generator=torch.Generator().manual_seed(3))
    _, last = prefill(target, prop, slots, prompt)
    toks, _ = prop.propose(slots, torch.tensor([6]), last, 3,
                           sample=lambda lg: torch.full(lg.shape[:1], 42))
    assert toks.tolist() == [[42, 42, 42]]


@pytest.mark.parametrize("method", MODEL_METHODS)
def test_training_loss_decreases(ckpt, method):
    target, _ = load_target(ckpt)
    target.requires_grad_(False)
    prop = load_proposer(ckpt, method, target).train()
    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(3, target.config.vocab_size, (4, 40), generator=g)
    with torch.no_grad():
        out = target(tokens, hidden_layers=prop.target_layers or (-1,))
    labels = out.logits.argmax(-1)
    anchors = torch.randint(1, 40 - 8 + 2, (4, 3), generator=g)
    opt = torch.optim.Adam(prop.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss, _ = prop.training_loss(tokens, labels, hidden=out.hidden, anchors=anchors)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
