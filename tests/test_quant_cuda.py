"""Fake quantization on CUDA gives the CPU's numbers bit for bit (skipped without a GPU)."""

import pytest
import torch

from specrepro.embedded.quant import QuantLinear, fake_quant_fp8, fake_quant_nvfp4, quantize_nvfp4

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_nvfp4_and_fp8_match_cpu_bit_for_bit():
    x = torch.randn(64, 384, generator=torch.Generator().manual_seed(0))
    q_cpu, q_gpu = quantize_nvfp4(x), quantize_nvfp4(x.cuda())
    assert torch.equal(q_cpu.values, q_gpu.values.cpu())
    assert torch.equal(q_cpu.block_scales.float(), q_gpu.block_scales.float().cpu())
    assert torch.equal(fake_quant_nvfp4(x), fake_quant_nvfp4(x.cuda()).cpu())
    assert torch.equal(fake_quant_fp8(x, 0.01), fake_quant_fp8(x.cuda(), 0.01).cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantlinear_runs_on_cuda_and_is_row_local(dtype):
    lin = torch.nn.Linear(256, 128, bias=False).to("cuda", dtype)
    ql = QuantLinear(lin, "nvfp4", act_amax=4.0)
    assert ql.weight.dtype == dtype and ql.weight.is_cuda
    g = torch.Generator().manual_seed(1)
    row = torch.randn(1, 256, generator=g)
    a = torch.cat([row, torch.randn(7, 256, generator=g)]).to("cuda", dtype)
    b = torch.cat([row, 30 * torch.randn(7, 256, generator=g)]).to("cuda", dtype)
    assert torch.equal(ql.quantize_input(a)[0], ql.quantize_input(b)[0])
    assert torch.equal(ql(a)[0], ql(b)[0])
