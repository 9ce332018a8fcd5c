"""`specrepro export-fp8-drafter` (tools/export/fp8_drafter.py): a block drafter as the FP8
checkpoint vLLM 0.26.0 loads as FP8 (`quant_method: fp8`, per-tensor weight scales, q/k/v in
BF16), checked against an independent E4M3 rounding and on a real exported drafter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specrepro import identity
from specrepro.tools.export import drafters
from specrepro.tools.export import fp8_drafter as ex


@pytest.fixture(scope="module")
def bf16_drafter(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("drafters") / "engine-drafters"
    assert drafters.main(["--engine", "vllm", "--out", str(out)]) == 0
    return out / "vllm" / "dflash"


@pytest.fixture(scope="module")
def exported(bf16_drafter, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fp8") / "dflash-fp8"
    ex.export_fp8_drafter(bf16_drafter, out)
    return out


def _e4m3_grid() -> torch.Tensor:
    """Every finite float8_e4m3fn value, from its 256 bit patterns."""
    vals = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    return torch.unique(vals[torch.isfinite(vals)])


def test_per_tensor_rounding_is_the_nearest_e4m3_value_of_w_over_amax_448():
    torch.manual_seed(0)
    w = (torch.randn(64, 96) * 0.03).to(torch.bfloat16)
    q, scale = ex.quantize_fp8_per_tensor(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape
    assert scale.dtype == torch.float32 and scale.shape == ()
    assert scale.item() == pytest.approx(w.float().abs().max().item() / 448.0, rel=1e-6)
    x = (w.float() / scale).flatten()
    grid = _e4m3_grid()
    dist = (x[:, None] - grid[None, :]).abs()
    best = dist.min(dim=1).values
    got = q.float().flatten()
    # the stored value is a nearest grid point (ties may go either way)
    assert torch.allclose((x - got).abs(), best, atol=0, rtol=0)
    assert got.abs().max().item() == 448.0  # the largest magnitude maps to E4M3's max
    deq = ex.dequantize(q, scale, torch.float32)
    assert ((deq - w.float()).abs() <= w.float().abs() / 16 + scale * 2.0 ** -10).all()


def test_an_all_zero_weight_keeps_scale_one_and_zeros():
    q, scale = ex.quantize_fp8_per_tensor(torch.zeros(16, 16, dtype=torch.bfloat16))
    assert scale.item() == 1.0 and (q.float() == 0).all()


def test_the_checkpoint_quantizes_o_mlp_and_fc_keeps_qkv_and_norms_bitwise(bf16_drafter,
                                                                           exported):
    src = load_file(str(bf16_drafter / "model.safetensors"))
    out = load_file(str(exported / "model.safetensors"))
    quantized = [k for k in src if ex.QUANTIZED.match(k)]
    kept = [k for k in src if not ex.QUANTIZED.match(k)]
    cfg = json.loads((bf16_drafter / "config.json").read_text())
    n = cfg["num_hidden_layers"]
    assert len(quantized) == 4 * n + 1  # o, gate, up, down per layer, and fc
    assert sum(1 for k in src if ex.KEPT_BF16.match(k)) == 3 * n
    for k in quantized:
        scale = out[k[: -len("weight")] + "weight_scale"]
        assert out[k].dtype == torch.float8_e4m3fn and scale.shape == ()
        err = (ex.dequantize(out[k], scale, torch.float32) - src[k].float()).abs()
        assert (err <= src[k].float().abs() / 16 + scale * 2.0 ** -10).all(), k
    for k in kept:
        assert out[k].dtype == src[k].dtype and torch.equal(out[k], src[k]), k
    assert set(out) == set(src) | {k[: -len("weight")] + "weight_scale" for k in quantized}


def test_config_names_every_layers_qkv_in_vllm_numbering_after_the_targets(bf16_drafter,
                                                                          exported):
    src = json.loads((bf16_drafter / "config.json").read_text())
    cfg = json.loads((exported / "config.json").read_text())
    assert {k: v for k, v in cfg.items() if k != "quantization_config"} == src
    q = cfg["quantization_config"]
    assert q["quant_method"] == "fp8" and q["activation_scheme"] == "dynamic"
    t, n = src["num_target_layers"], src["num_hidden_layers"]
    want = {f"model.layers.{t + i}.self_attn.{p}" for i in range(n)
            for p in ("qkv_proj", "q_proj", "k_proj", "v_proj")}
    assert set(q["ignored_layers"]) == want
    assert not any(".mlp." in x or "o_proj" in x or "fc" in x for x in q["ignored_layers"])


def test_the_fp8_checkpoint_is_about_half_the_bytes(bf16_drafter, exported):
    a = (bf16_drafter / "model.safetensors").stat().st_size
    b = (exported / "model.safetensors").stat().st_size
    assert 0.5 < b / a < 0.75  # q/k/v stay BF16; the small drafter's attention is a large share


def test_a_standin_part_is_keyed_by_recipe_and_the_same_each_time(bf16_drafter, tmp_path):
    root = tmp_path / "standin"
    part = root / "vllm" / "dflash"
    shutil.copytree(bf16_drafter, part)
    (part / "export.json").unlink()
    files = {p.name: p.stat().st_size for p in part.iterdir()}
    (part / "standin.json").write_text(json.dumps(
        {"recipe": {"budget": "test", "seed": 1}, "part": "vllm/dflash", "files": files}))
    assert identity.standin_recipe(part) is not None
    out = root / "vllm" / "dflash-fp8"
    s = ex.export_fp8_drafter(part, out)
    assert s["standin"] and not (out / "export.json").exists()
    meta = json.loads((out / "standin.json").read_text())
    assert meta["part"] == "vllm/dflash-fp8"
    assert meta["recipe"]["source"] == {"budget": "test", "seed": 1}
    assert meta["recipe"]["fp8"]["exporter_format"] == ex.EXPORTER_FORMAT
    rec = identity.standin_recipe(out)
    assert rec is not None
    fp = identity.local_model_fingerprint(str(out))
    assert fp != identity.local_model_fingerprint(str(part))
    ex.export_fp8_drafter(part, out)  # written again: replaced whole, same identity
    assert identity.local_model_fingerprint(str(out)) == fp
    elsewhere = ex.export_fp8_drafter(part, tmp_path / "other" / "fp8")
    # a part changed since its export is no stand-in part: its copy is hashed, not keyed
    (part / "extra.txt").write_text("changed")
    changed = ex.export_fp8_drafter(part, tmp_path / "changed")
    assert not changed["standin"] and (tmp_path / "changed" / "export.json").is_file()
    (part / "extra.txt").unlink()
    assert json.loads((Path(elsewhere["out"]) / "standin.json").read_text())["part"] == \
        "vllm/dflash-fp8"


def test_bad_inputs_name_what_is_wrong(bf16_drafter, exported, tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        ex.export_fp8_drafter(tmp_path / "nowhere", tmp_path / "o1")
    with pytest.raises(ValueError, match="already has a quantization_config"):
        ex.export_fp8_drafter(exported, tmp_path / "o2")
    with pytest.raises(ValueError, match="is the drafter itself"):
        ex.export_fp8_drafter(bf16_drafter, bf16_drafter)
    eagle = bf16_drafter.parent / "mtp"
    with pytest.raises(ValueError, match=r"expected \['DFlashDraftModel'\]"):
        ex.export_fp8_drafter(eagle, tmp_path / "o3")
    assert ex.main(["--drafter", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o4")]) == 2
    assert "specrepro export-fp8-drafter:" in capsys.readouterr().err
    assert not (tmp_path / "o4").exists()
