"""NVFP4 and FP8 fake quantization: formats, scales, error bounds, batch invariance, model swap."""

import pytest
import torch
from torch import nn

from specrepro.embedded.quant import (
    E2M1_GRID,
    NVFP4_BLOCK,
    QuantLinear,
    describe_quantization,
    fake_quant_fp8,
    fake_quant_nvfp4,
    fp8_scale,
    nvfp4_global_scale,
    quantize_model,
    quantize_nvfp4,
    round_to_e2m1,
)

GRID = torch.tensor(E2M1_GRID)


def _randn(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def _on_grid(v: torch.Tensor) -> bool:
    return bool(torch.isin(v.abs(), GRID).all())


# ------------------------------------------------------------------------------ element formats

def test_e2m1_rounding_is_nearest_with_ties_to_even_code():
    # reference: nearest grid magnitude, ties to the even code (grid index = code)
    v = torch.cat([_randn(5000, scale=3.0), torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5,
                                                          5.0, -5.0, -0.25, 6.0, 7.0, -100.0])])
    a = v.abs().clamp(max=6.0)
    dist = (a.unsqueeze(1) - GRID).abs()  # [N, 8]
    best = dist.min(dim=1, keepdim=True).values
    ties = dist == best
    even = ties & (torch.arange(8) % 2 == 0)
    idx = torch.where(ties.sum(1) > 1, even.float().argmax(1), dist.argmin(1))
    want = torch.copysign(GRID[idx], v)
    torch.testing.assert_close(round_to_e2m1(v), want, rtol=0, atol=0)
    assert round_to_e2m1(torch.tensor([0.25, 0.75, 2.5, 5.0])).tolist() == [0.0, 1.0, 2.0, 4.0]


# ------------------------------------------------------------------------------ NVFP4

def test_nvfp4_values_on_grid_scales_e4m3_and_global_fp32():
    x = _randn(64, 256, seed=1, scale=0.05)
    q = quantize_nvfp4(x)
    assert _on_grid(q.values)
    assert q.block_scales.dtype == torch.float8_e4m3fn
    assert q.block_scales.shape == (64, 256 // NVFP4_BLOCK)
    assert q.global_scale.dtype == torch.float32 and q.global_scale.ndim == 0
    torch.testing.assert_close(q.global_scale, x.abs().amax() / (6 * 448))
    # the dequantized tensor really is grid value x E4M3 block scale x global scale:
    # recover each block's scale from it and round-trip it through E4M3 unchanged
    deq = q.dequantize().reshape(64, -1, NVFP4_BLOCK)
    vals = q.values.reshape(64, -1, NVFP4_BLOCK)
    nz = vals != 0
    recovered = deq[nz] / vals[nz] / q.global_scale
    roundtrip = recovered.to(torch.float8_e4m3fn).float()
    torch.testing.assert_close(recovered, roundtrip, rtol=1e-6, atol=0)
    # the values are x rounded on the grid of that very (E4M3-rounded) scale
    unit = q.block_scales.float().unsqueeze(-1) * q.global_scale  # [64, 16, 1]
    blocks = x.reshape(64, -1, NVFP4_BLOCK)
    assert torch.equal(q.values, round_to_e2m1(blocks / unit).reshape(64, -1))
    # fake quantization is the encoded tensor, decoded
    assert torch.equal(fake_quant_nvfp4(x), q.dequantize())
    # the block with the tensor's amax uses the largest E4M3 scale and the largest grid value
    assert float(q.block_scales.float().max()) == 448.0


def test_nvfp4_error_is_bounded_per_element_and_small_on_average():
    x = _randn(128, 512, seed=2, scale=0.02)
    x[3, 17] = 0.9  # an outlier: its own block absorbs it, other blocks keep their precision
    deq = fake_quant_nvfp4(x)
    err = (deq - x).abs().reshape(128, -1, NVFP4_BLOCK)
    block_amax = x.abs().reshape(128, -1, NVFP4_BLOCK).amax(-1, keepdim=True)
    # at most half the widest grid gap (1 unit of scale = block_amax / 6), the unit grown by
    # the E4M3 rounding of the scale (<= 2^-4)
    assert bool((err <= block_amax / 6 * (1 + 2**-4) * (1 + 1e-6)).all())
    rel_rms = float((deq - x).norm() / x.norm())
    assert rel_rms < 0.12, rel_rms
    assert float(fake_quant_nvfp4(torch.zeros(2, 32)).abs().max()) == 0.0


def test_nvfp4_is_idempotent_and_pads_ragged_rows():
    x = _randn(8, 40, seed=3)  # 40 is not a multiple of 16
    once = fake_quant_nvfp4(x)
    assert once.shape == x.shape
    torch.testing.assert_close(fake_quant_nvfp4(once), once, rtol=1e-6, atol=0)


def test_nvfp4_static_global_scale_saturates_out_of_range_inputs():
    g = nvfp4_global_scale(1.0)  # calibrated amax 1
    y = fake_quant_nvfp4(torch.tensor([[4.0] + [0.1] * 15]), g)
    assert float(y[0, 0]) == pytest.approx(1.0)  # clipped at the calibrated range


# ------------------------------------------------------------------------------ FP8

def test_fp8_round_trip():
    x = _randn(1000, seed=4)
    s = fp8_scale(x.abs().amax())
    assert s.dtype == torch.float32
    y = fake_quant_fp8(x, s)
    assert torch.equal((y / s).to(torch.float8_e4m3fn).float() * s, y)  # on the E4M3 grid
    assert torch.equal(fake_quant_fp8(y, s), y)
    normal = (x / s).abs() >= 2**-6  # E4M3 normals: 3 mantissa bits
    assert bool(((y - x).abs()[normal] <= x.abs()[normal] * 2**-4).all())
    assert float(fake_quant_fp8(torch.tensor([10.0]), fp8_scale(1.0))) == pytest.approx(1.0)


# ------------------------------------------------------------------------------ QuantLinear

def _layer(in_f=64, out_f=48, seed=5):
    lin = nn.Linear(in_f, out_f, bias=False)
    with torch.no_grad():
        lin.weight.copy_(_randn(out_f, in_f, seed=seed, scale=0.1))
    return lin


def test_quantlinear_weights_are_static_and_on_grid():
    lin = _layer()
    ql = QuantLinear(lin, "nvfp4", act_amax=3.0)
    torch.testing.assert_close(ql.weight, fake_quant_nvfp4(lin.weight.detach()))
    q = quantize_nvfp4(lin.weight.detach())
    assert _on_grid(q.values)
    ql8 = QuantLinear(lin, "fp8_weight_only")
    x = _randn(4, 64, seed=6)
    w = lin.weight.detach()
    torch.testing.assert_close(ql8(x), x @ fake_quant_fp8(w, fp8_scale(w.abs().amax())).T)
    with pytest.raises(ValueError, match="act_amax"):
        QuantLinear(lin, "nvfp4")
    with pytest.raises(ValueError, match="unknown quantization scheme"):
        QuantLinear(lin, "int3")


@pytest.mark.parametrize("scheme", ["nvfp4", "fp8_per_tensor"])
def test_quantlinear_row_output_does_not_depend_on_the_batch(scheme):
    ql = QuantLinear(_layer(), scheme, act_amax=4.0)
    row = _randn(1, 64, seed=7)
    batch_a = torch.cat([row, _randn(5, 64, seed=8)])
    batch_b = torch.cat([row, _randn(5, 64, seed=9, scale=30.0)])  # other rows far louder
    # the quantized activation is row-local: bit-identical alone and in any batch
    assert torch.equal(ql.quantize_input(row)[0], ql.quantize_input(batch_a)[0])
    assert torch.equal(ql.quantize_input(row)[0], ql.quantize_input(batch_b)[0])
    # so with the same matmul shape the output row is bit-identical whatever the other rows
    assert torch.equal(ql(batch_a)[0], ql(batch_b)[0])
    # alone, the BLAS kernel differs (gemv vs gemm) by float rounding only
    torch.testing.assert_close(ql(row)[0], ql(batch_a)[0], rtol=1e-5, atol=1e-6)
    # control: a dynamic per-tensor scale would have made the row depend on its batch
    dyn_a, dyn_b = fake_quant_nvfp4(batch_a)[0], fake_quant_nvfp4(batch_b)[0]
    assert not torch.equal(dyn_a, dyn_b)


@torch.no_grad()
def test_quantlinear_error_is_small():
    lin = _layer(256, 128)
    x = _randn(32, 256, seed=10)
    ref = lin(x)
    for scheme, bound in [("nvfp4", 0.2), ("fp8_per_tensor", 0.05)]:
        ql = QuantLinear(lin, scheme, act_amax=x.abs().amax())
        rel = float((ql(x) - ref).norm() / ref.norm())
        assert 0 < rel < bound, (scheme, rel)


# ------------------------------------------------------------------------------ whole model

class _Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.q_proj, self.o_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.gate_proj, self.down_proj = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        x = x + self.o_proj(self.q_proj(x).tanh())
        return x + self.down_proj(torch.relu(self.gate_proj(x)))


class _Toy(nn.Module):
    """Qwen3-named linears, a tied lm_head."""

    def __init__(self, vocab=50, d=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([_Block(d), _Block(d)])
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(x)


@torch.no_grad()
def test_quantize_model_swaps_calibrates_and_describes():
    torch.manual_seed(0)
    model = _Toy()
    ids = [torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(i))
           for i in range(3)]
    seen = []
    ref = model(ids[0])
    quantize_model(model, "nvfp4", ids, run_forward=lambda t: seen.append(t) or model(t))
    assert len(seen) == 3
    names = [n for n, m in model.named_modules() if isinstance(m, QuantLinear)]
    assert names == [f"layers.{i}.{p}" for i in range(2)
                     for p in ("q_proj", "o_proj", "gate_proj", "down_proj")]
    assert isinstance(model.lm_head, nn.Linear) and model.lm_head.weight is model.embed.weight
    assert all(float(model.get_submodule(n).act_amax) > 0 for n in names)
    out = model(ids[0])
    assert out.shape == ref.shape and not torch.equal(out, ref)
    assert float((out - ref).norm() / ref.norm()) < 0.3

    info = describe_quantization(model)
    assert info["scheme"] == "nvfp4" and info["layers"] == sorted(names)
    n = 2 * (32 * 32 * 2 + 32 * 64 * 2)
    assert info["quantized_params"] == n
    assert info["quantized_weight_bytes"] == n // 2 + n // 16 + 8 * len(names)
    assert 4.5 <= info["bits_per_weight"] < 4.6
    # embedding (tied head counted once), norms none, biases of gate/down
    assert info["other_weight_bytes"] == 4 * (50 * 32 + 2 * (64 + 32))


def test_quantize_model_fp8_weight_only_needs_no_calibration_and_rejects_bad_input():
    model = _Toy()
    quantize_model(model, "fp8_weight_only", include=("q_proj",))
    assert describe_quantization(model)["num_layers"] == 2
    assert describe_quantization(model)["bits_per_weight"] == pytest.approx(8.0, abs=0.1)
    with pytest.raises(ValueError, match="calibration_batches"):
        quantize_model(_Toy(), "nvfp4")
    with pytest.raises(ValueError, match="no nn.Linear matches"):
        quantize_model(_Toy(), "fp8_weight_only", include=("nothing",))
    with pytest.raises(ValueError, match="never reached"):
        quantize_model(_Toy(), "nvfp4", [torch.zeros(1, 2, dtype=torch.long)],
                       run_forward=lambda ids: None)


@torch.no_grad()
def test_quantize_model_on_the_target_architecture():
    model_mod = pytest.importorskip("specrepro.embedded.model")
    cfg = model_mod.ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                num_hidden_layers=2, num_attention_heads=2,
                                num_key_value_heads=1, head_dim=16)
    torch.manual_seed(0)
    model = model_mod.Qwen3Model(cfg)
    model.init_weights(std=0.1)
    ids = torch.randint(0, 64, (2, 12))
    ref = model(ids).logits
    quantize_model(model, "nvfp4", [ids], run_forward=lambda t: model(t, logits="none"))
    info = describe_quantization(model)
    assert info["num_layers"] == 2 * 7 and "lm_head" not in " ".join(info["layers"])
    out = model(ids).logits
    # W4A4 on every linear of a random two-block model: ~0.1 per layer, compounding
    assert 0 < float((out - ref).norm() / ref.norm()) < 0.5
