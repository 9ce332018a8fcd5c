"""The target model: transformers parity and cached == uncached forward."""

import json

import pytest
import torch

from specrepro.embedded.model import ModelConfig, Qwen3Model

TINY = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   max_position_embeddings=256)


def tiny_model(seed=0):
    torch.manual_seed(seed)
    m = Qwen3Model(TINY)
    m.init_weights(std=0.2)
    # Norm weights away from 1 so a wrong norm placement shows.
    for n, p in m.named_parameters():
        if "norm" in n:
            p.data.uniform_(0.5, 1.5)
    return m.eval()


def test_matches_transformers_qwen3_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import save_model

    m = tiny_model()
    (tmp_path / "config.json").write_text(json.dumps(TINY.to_hf_config()))
    save_model(m, str(tmp_path / "model.safetensors"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    hf.eval()
    ids = torch.randint(0, TINY.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = m(ids).logits
        theirs = hf(ids).logits
    assert (ours - theirs).abs().max().item() <= 1e-4


def test_cached_forward_equals_plain_forward():
    m = tiny_model()
    ids = torch.randint(0, TINY.vocab_size, (2, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = m(ids, hidden_layers=(0, 2)).logits
        cache = m.new_cache(num_slots=4, max_len=64)
        slots = torch.tensor([3, 1])
        # Prefill 20 tokens, then 1 token, then a 9-token "verify" chunk.
        pieces, start = [], 0
        for n in (20, 1, 9):
            pos = torch.arange(start, start + n).expand(2, n)
            pieces.append(m(ids[:, start:start + n], positions=pos, cache=cache, slots=slots,
                            kv_len=start + n).logits)
            start += n
    got = torch.cat(pieces, dim=1)
    assert (got - ref).abs().max().item() < 1e-5


def test_rollback_by_length_overwrites_rejected_entries():
    m = tiny_model()
    ids = torch.randint(0, TINY.vocab_size, (1, 12), generator=torch.Generator().manual_seed(3))
    wrong = torch.randint(0, TINY.vocab_size, (1, 4), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = m(ids).logits[:, -4:]
        cache = m.new_cache(num_slots=1, max_len=32)
        slot = torch.tensor([0])
        m(ids[:, :8], positions=torch.arange(8)[None], cache=cache, slots=slot, kv_len=8)
        # A rejected draft block writes positions 8..11, then the accepted tokens overwrite them.
        m(wrong, positions=torch.arange(8, 12)[None], cache=cache, slots=slot, kv_len=12)
        got = m(ids[:, 8:], positions=torch.arange(8, 12)[None], cache=cache, slots=slot,
                kv_len=12).logits
    assert (got - ref).abs().max().item() < 1e-5


def test_hidden_layers_and_parameter_count():
    m = tiny_model()
    out = m(torch.zeros(1, 5, dtype=torch.long), hidden_layers=(0, -1), logits="last")
    assert out.logits.shape == (1, 1, TINY.vocab_size)
    assert torch.equal(out.hidden[1], out.last_hidden)
    assert TINY.num_parameters() == sum(p.numel() for p in m.parameters())
