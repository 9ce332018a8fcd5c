"""`specrepro export-nvfp4` (tools/export/nvfp4.py): the NVFP4 target in compressed-tensors'
`nvfp4-pack-quantized` layout that vLLM 0.26.0 loads, checked on the CPU against
compressed-tensors 0.17.0's own code (the version vLLM 0.26.0 pins) and against the embedded
engine's fake quantization (embedded/quant.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specrepro.embedded.quant import (
    TARGET_LINEARS,
    fake_quant_nvfp4,
    nvfp4_global_scale,
    round_to_e4m3,
)
from specrepro.tools.export import nvfp4 as ex

ct = pytest.importorskip("compressed_tensors", reason="compressed-tensors==0.17.0 (dev extra)")
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.utils.helpers import (
    calculate_qparams,
    generate_gparam,
)

ROOT = Path(__file__).resolve().parents[1]
CKPT = ROOT / "models" / "embedded"


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    return ex.export_nvfp4(CKPT, tmp_path_factory.mktemp("nvfp4") / "nvfp4-target")


@pytest.fixture(scope="module")
def tensors(exported) -> dict[str, torch.Tensor]:
    return load_file(str(exported / "model.safetensors"))


@pytest.fixture(scope="module")
def source() -> dict[str, torch.Tensor]:
    return load_file(str(CKPT / "model.safetensors"))


def _linears(src) -> list[str]:
    return ex._linear_names(src)


def _scheme(preset: str = "NVFP4") -> QuantizationScheme:
    return preset_name_to_scheme(preset, ["Linear"])


# ------------------------------------------------------------------ bit for bit with the format
def test_every_linear_is_compressed_tensors_own_encoding(source, tensors):
    """Scales from compressed-tensors' observers' arithmetic (generate_gparam, calculate_qparams)
    on the fused layer's joint amax, packed by its NVFP4PackedCompressor: the exporter's bytes."""
    names = _linears(source)
    assert len(names) == 6 * len(TARGET_LINEARS)
    scheme = _scheme()
    for n in names:
        w = source[f"{n}.weight"].float()
        shards = [m for m in names if ex._fused_key(m) == ex._fused_key(n)]
        joint = torch.stack([source[f"{m}.weight"].float().abs().amax() for m in shards]).max()
        g = generate_gparam(-joint.reshape(1), joint.reshape(1))
        blocks = w.unflatten(-1, (-1, 16))
        scale, _ = calculate_qparams(blocks.amin(-1), blocks.amax(-1), scheme.weights,
                                     global_scale=g)
        ref = NVFP4PackedCompressor.compress(
            {"weight": w, "weight_scale": scale, "weight_global_scale": g}, scheme)
        assert torch.equal(tensors[f"{n}.weight_global_scale"], g), n
        assert torch.equal(tensors[f"{n}.weight_scale"].view(torch.uint8),
                           ref["weight_scale"].view(torch.uint8)), n
        assert torch.equal(tensors[f"{n}.weight_packed"], ref["weight_packed"]), n


def test_reference_decoder_is_compressed_tensors_decompressor(source, tensors):
    for n in _linears(source):
        packed, scale, g = (tensors[f"{n}.{k}"] for k in
                            ("weight_packed", "weight_scale", "weight_global_scale"))
        theirs = NVFP4PackedCompressor.decompress(
            {"weight_packed": packed, "weight_scale": scale, "weight_global_scale": g},
            _scheme())["weight"]
        assert theirs.dtype == torch.bfloat16
        assert torch.equal(ex.dequantize_nvfp4(packed, scale, g), theirs), n


# ------------------------------------------------------------------ against the engine's fake quant
def _decoded(tensors, n):
    return NVFP4PackedCompressor.decompress(
        {k: tensors[f"{n}.{k}"] for k in ("weight_packed", "weight_scale", "weight_global_scale")},
        _scheme())["weight"].float()


TIES = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])  # E2M1 rounding midpoints


def _compare(w: torch.Tensor, tensors: dict, n: str, g: torch.Tensor):
    """(engine fake quant at global scale g) - exported, and whether every difference is a
    rounding tie: a block whose E4M3 scale differs has its engine quotient amax / 6 / g within
    1e-5 (relative) of the midpoint of the two scales; elsewhere an element that differs has
    its engine quotient x / (s * g) within 1e-5 of an E2M1 midpoint, and moves one grid step."""
    engine = fake_quant_nvfp4(w, global_scale=g).float()
    d = (engine - _decoded(tensors, n)).abs()
    blocks = w.float().unflatten(-1, (-1, 16))
    quot = blocks.abs().amax(-1) / 6.0 / g
    s_eng, s_exp = round_to_e4m3(quot), tensors[f"{n}.weight_scale"].float()
    flip = s_eng != s_exp
    scale_ties = bool(((quot - (s_eng + s_exp) / 2).abs() <= 1e-5 * quot)[flip].all())
    unit = (s_eng * g).unsqueeze(-1).expand_as(blocks).flatten(-2)
    at = (d > 0) & ~flip.repeat_interleave(16, -1)
    r = (w.float() / unit).abs()[at]
    near = ((r.unsqueeze(-1) - TIES).abs() <= 1e-5 * TIES).any(-1)
    step = torch.where(r < 2, 0.5, torch.where(r < 4, 1.0, 2.0))
    one_step = torch.isclose(d[at], step * unit[at], rtol=0.05)  # both sides are bf16
    return d, int(flip.sum()), scale_ties and bool(near.all() and one_step.all())


def test_decoded_weights_equal_the_engines_fake_quant_at_the_shared_global_scale(source,
                                                                                tensors):
    """quant.fake_quant_nvfp4 given the fused layer's global scale g = 1 / G gives the same
    block scales and the same E2M1 values except at exact rounding ties: the engine divides by
    s * g, the format by s / G (G = 448 * 6 / amax, compressed-tensors' convention), and a
    quotient that is exactly a midpoint in one is an ulp off it in the other."""
    differ = total = 0
    worst = 0.0
    for n in _linears(source):
        w, G = source[f"{n}.weight"], tensors[f"{n}.weight_global_scale"]
        d, flips, ties_only = _compare(w, tensors, n, 1.0 / G.reshape(()))
        assert ties_only and flips == 0, n
        differ, total, worst = differ + int((d > 0).sum()), total + d.numel(), \
            max(worst, d.max().item())
    print(f"\nengine fake quant at the shared global scale vs export: {differ} of {total} "
          f"weights differ ({differ / total:.4%}), all at rounding ties, max |diff| {worst:.4g}")
    assert differ / total < 1e-3


def test_the_engines_per_shard_global_scale_differs_where_vllm_fuses(source, tensors):
    """The engine's own fake quant (each layer's own amax) against the exported weights: ties
    only where a layer's amax is its fused group's (and for o_proj, down_proj); more for the
    other shards of qkv_proj and gate_up_proj, since vLLM keeps one global scale per fused layer
    (compressed_tensors_w4a4_nvfp4.py:100-114). The numbers are printed for the report."""
    same, diff, tie_flips = [], {}, 0
    for n in _linears(source):
        w = source[f"{n}.weight"]
        own = nvfp4_global_scale(w.float().abs().amax())
        shared = 1.0 / tensors[f"{n}.weight_global_scale"].reshape(())
        d, flips, ties_only = _compare(w, tensors, n, own)
        if torch.isclose(own, shared, rtol=1e-6):
            assert ties_only, n
            same.append(n)
            tie_flips += flips
        else:
            diff[n] = (d.max().item(), (d > 0).float().mean().item(),
                       d.max().item() / w.float().abs().max().item())
    unfused = [n for n in _linears(source) if ex._fused_key(n) == n]
    assert set(unfused) <= set(same)
    assert all(ex._fused_key(n) != n for n in diff)
    if diff:
        worst = max(diff.items(), key=lambda kv: kv[1][0])
        print(f"\nengine per-shard fake quant vs export: {len(same)} layers agree up to ties "
              f"({tie_flips} block scales flipped at E4M3 ties, g = amax / 2688 vs "
              f"1 / (2688 * (1 / amax))), "
              f"{len(diff)} fused shards differ; worst {worst[0]}: max |diff| "
              f"{worst[1][0]:.4g} ({worst[1][2]:.3g} of the layer's amax), "
              f"{worst[1][1]:.2%} of its entries; mean share of entries differing "
              f"{sum(v[1] for v in diff.values()) / len(diff):.2%}")
    # each side errs by at most half a top E2M1 step, 1 unit <= (1 + 1/16) * amax / 6 of the
    # block (E4M3 rounds a scale up by less than 1/16): the two differ by < 0.36 amax
    for n, (_, _, rel) in diff.items():
        assert rel < 2 * (1 + 1 / 16) / 6, n


# ------------------------------------------------------------------ what vLLM 0.26.0 reads
def _vllm_is_nvfp4_format(args: QuantizationArgs | None) -> bool:
    """vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py:404-421
    (0.26.0): tensor_group, float, 4 bits, group 16, symmetric."""
    return (args is not None and args.strategy == "tensor_group" and args.type == "float"
            and args.num_bits == 4 and args.group_size == 16 and args.symmetric)


@pytest.mark.parametrize("scheme,preset", [("nvfp4", "NVFP4"), ("nvfp4a16", "NVFP4A16")])
def test_quantization_config_is_compressed_tensors_preset(scheme, preset):
    ours = ex.quantization_config(scheme)
    theirs = QuantizationConfig(config_groups={"group_0": _scheme(preset)},
                                format="nvfp4-pack-quantized", quantization_status="compressed",
                                ignore=["lm_head"]).model_dump(mode="json")
    assert ours == theirs
    assert QuantizationConfig.model_validate(ours).model_dump(mode="json") == ours
    # vLLM's from_config/_quantization_scheme_map_from_config (:249-258, :300-360) and
    # _get_scheme_from_parts (:734-743): Linear -> NVFP4 weights; inputs NVFP4 (W4A4) or None
    group = ours["config_groups"]["group_0"]
    assert ours["quant_method"] == "compressed-tensors" and ours["format"] == ex.FORMAT
    assert group["targets"] == ["Linear"] and "lm_head" in ours["ignore"]
    w = QuantizationArgs.model_validate(group["weights"])
    assert _vllm_is_nvfp4_format(w)
    a = group["input_activations"]
    assert (a is None) == (scheme == "nvfp4a16")
    if a is not None:
        assert _vllm_is_nvfp4_format(QuantizationArgs.model_validate(a))


def test_exported_folder_shapes_dtypes_and_files(exported, source, tensors):
    cfg = json.loads((exported / "config.json").read_text())
    src_cfg = json.loads((CKPT / "config.json").read_text())
    assert {k: v for k, v in cfg.items() if k != "quantization_config"} == src_cfg
    assert cfg["quantization_config"] == ex.quantization_config("nvfp4")
    for f in ex.COPIED:
        assert (exported / f).read_bytes() == (CKPT / f).read_bytes()
    names = _linears(source)
    expected = {k for k in source if k[: -len(".weight")] not in names}
    for n in names:
        out, inp = source[f"{n}.weight"].shape
        expected |= {f"{n}.{k}" for k in ("weight_packed", "weight_scale",
                                          "weight_global_scale", "input_global_scale")}
        assert tensors[f"{n}.weight_packed"].shape == (out, inp // 2)
        assert tensors[f"{n}.weight_packed"].dtype == torch.uint8
        assert tensors[f"{n}.weight_scale"].shape == (out, inp // 16)
        assert tensors[f"{n}.weight_scale"].dtype == torch.float8_e4m3fn
        for k in ("weight_global_scale", "input_global_scale"):
            assert tensors[f"{n}.{k}"].shape == (1,) and tensors[f"{n}.{k}"].dtype == torch.float32
    assert set(tensors) == expected
    assert "lm_head.weight" not in tensors and cfg["tie_word_embeddings"] is True
    for k in expected & set(source):  # embeddings and norms as they were
        assert tensors[k].dtype == torch.bfloat16 and torch.equal(tensors[k], source[k]), k
    # one global scale per fused layer (vLLM warns and loses accuracy otherwise)
    for n in names:
        for m in names:
            if ex._fused_key(n) == ex._fused_key(m):
                for k in ("weight_global_scale", "input_global_scale"):
                    assert torch.equal(tensors[f"{n}.{k}"], tensors[f"{m}.{k}"]), (n, m, k)
    meta = json.loads((exported / "export.json").read_text())
    assert meta["scheme"] == "nvfp4" and meta["quantized_layers"] == len(names)


def test_input_global_scales_are_the_engines_calibration(source, tensors):
    amax = ex.calibrate_input_amax(CKPT, _linears(source))
    for n, a in amax.items():
        assert torch.allclose(tensors[f"{n}.input_global_scale"], 448.0 * 6.0 / a.float()), n


# the amax as another machine would compute it: the same torch with its kernels held to SSE
# (ATen's vectorized ops, oneDNN and MKL), as on a CPU without AVX2, AVX-512 or AVX-512 BF16
OTHER_CPU = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
             "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
AMAX_HEX = ("import sys; from pathlib import Path; from specrepro.tools.export import nvfp4 "
            "as ex; from safetensors.torch import load_file; ck = Path(sys.argv[1]); "
            "names = ex._linear_names(load_file(str(ck / 'model.safetensors'))); "
            "a = ex.calibrate_input_amax(ck, names); "
            "print(' '.join(float(a[n]).hex() for n in names))")


def test_the_calibration_is_the_same_on_another_instruction_set(source):
    """The exported bytes key the stored cells of the arm that serves them (their folder's
    fingerprint), so they must not depend on the machine that exported them: in bf16 the
    calibration's amax moved with the CPU's instruction set (three sets on one machine)."""
    import os
    import subprocess
    import sys
    names = _linears(source)
    here = ex.calibrate_input_amax(CKPT, names)
    assert all(a.dtype == torch.float32 and a.ndim == 0 for a in here.values())
    env = {**os.environ, **OTHER_CPU,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "lib"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", AMAX_HEX, str(CKPT)], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    assert out == [float(here[n]).hex() for n in names]


def test_weight_only_scheme_has_no_input_scales(tmp_path):
    out = ex.export_nvfp4(CKPT, tmp_path / "a16", scheme="nvfp4a16")
    assert not [k for k in load_file(str(out / "model.safetensors"))
                if k.endswith("input_global_scale")]
    assert json.loads((out / "config.json").read_text())["quantization_config"][
        "config_groups"]["group_0"]["input_activations"] is None


# ------------------------------------------------------------------ bad inputs
def test_a_folder_without_config_json_is_refused_naming_it(tmp_path):
    (tmp_path / "ck").mkdir()
    with pytest.raises(FileNotFoundError, match=r"ck/config\.json"):
        ex.export_nvfp4(tmp_path / "ck", tmp_path / "out")
    assert ex.main(["--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "out").exists()


def test_an_input_dimension_not_divisible_by_16_is_refused_naming_the_tensor(tmp_path, capsys):
    ck = tmp_path / "ck"
    ck.mkdir()
    shutil.copy(CKPT / "config.json", ck / "config.json")
    save_file({"model.layers.0.self_attn.q_proj.weight": torch.zeros(32, 24,
                                                                     dtype=torch.bfloat16)},
              str(ck / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model\.safetensors: tensor "
                                         r"model\.layers\.0\.self_attn\.q_proj\.weight .*\(32, 24\)"):
        ex.export_nvfp4(ck, tmp_path / "out", scheme="nvfp4a16")
    assert ex.main(["--checkpoint", str(ck), "--out", str(tmp_path / "o")]) == 2
    assert "q_proj.weight" in capsys.readouterr().err


def test_pack_and_unpack_are_inverse_on_the_whole_grid():
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    v = torch.cat([grid, -grid]).repeat(2, 1)
    assert torch.equal(ex.unpack_e2m1(ex.pack_e2m1(v)), v)
    # the low nibble is the even column (compressed_tensors/compressors/nvfp4/helpers.py:72)
    assert ex.pack_e2m1(torch.tensor([[0.5, 6.0]])).item() == 0x71
