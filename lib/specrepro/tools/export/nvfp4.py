"""Write the embedded target as an NVFP4 checkpoint vLLM 0.26.0 loads (compressed-tensors layout).

Layout: compressed-tensors' `nvfp4-pack-quantized` format, as llm-compressor writes it. Every
fact below was read from the released wheels: `vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl`
(`vllm/_version.py`: 0.26.0, commit ffd46bfab) and `compressed_tensors-0.17.0-py3-none-any.whl`
(the version vLLM 0.26.0's lock pins, shared/gpu/vllm-0.26.0.lock). Paths are the wheels'.

- Folder: `config.json` (the source's, plus `quantization_config`), `model.safetensors`,
  the tokenizer files and `generation_config.json` copied, `export.json` (sources' sha256).
- Each Linear of the decoder layers (`q/k/v/o_proj`, `gate/up/down_proj`) becomes
  `<name>.weight_packed` uint8 [out, in/2], `<name>.weight_scale` float8_e4m3fn [out, in/16],
  `<name>.weight_global_scale` float32 [1] and, for W4A4, `<name>.input_global_scale` float32
  [1] (vllm/.../compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4.py:52-91; the names
  are compressed_tensors/compressors/nvfp4/base.py:37-50). Embeddings, norms stay bf16; the
  head is tied to the embedding (no `lm_head` tensor), and `lm_head` is in `ignore`.
- Encoding, as compressed-tensors computes it: global scale G = 448 * 6 / amax, a multiplier
  (quantization/utils/helpers.py:309-338, `generate_gparam`); block scale
  s = e4m3(G * block_amax / 6), 0 replaced by 0.125 (helpers.py:50-137, `calculate_qparams`,
  eps at :364-372); values e2m1(x / (s / G)), round half to even, clamped to +-6
  (lifecycle/forward_helpers.py:214-240, quant_args.py:48-68 `cast_to_fp4`); two codes per byte,
  the even column in the low nibble, code = grid index | sign << 3
  (compressors/nvfp4/helpers.py:34-74). Decoded: e2m1 * s / G (compressors/nvfp4/base.py:98-132,
  lifecycle/forward_helpers.py `_dequantize`): `dequantize_nvfp4` below is that definition.
- The engine's fake quantization (embedded/quant.py) keeps g = amax / (6 * 448) and multiplies;
  G = 1/g mathematically, and the block scales and values are the same arithmetic. The one
  real difference: vLLM fuses q/k/v into qkv_proj and gate/up into gate_up_proj and keeps ONE
  global scale per fused layer, the max of the stored G's (compressed_tensors_w4a4_nvfp4.py:
  100-114, warning of lost accuracy when they differ). So the exporter gives the shards of a
  fused layer one shared global scale from their joint amax (what llm-compressor does), while
  the engine quantizes each shard with its own amax: shards whose amax is not the group's
  largest get other block scales (tests/test_export_nvfp4.py measures it).
- Config keys vLLM's scheme selection reads (compressed_tensors.py:249-258 `from_config`,
  :300-360 the config groups, :404-421 `_is_nvfp4_format`: strategy tensor_group, float, 4 bits,
  group 16, symmetric; :734-743: no input_activations -> W4A16, NVFP4 inputs -> W4A4). On Hopper
  both run on Marlin: W4A16 is forced to it (kernels/linear/__init__.py:922-924), W4A4 gets it
  as the first supported NVFP4 kernel below the sm100 ones (:446-458, nvfp4/marlin.py:18-40,
  which logs "...Weight-only FP4 compression will be used leveraging the Marlin kernel...").
- W4A4 activation global scales come from the engine's own calibration (quant.py
  `calibrate_activation_amax` over `CALIBRATION_TEXT`), run on the target in float64 on the
  CPU and rounded to float32; G_in = 448 * 6 / input_amax, shared by a fused layer's shards
  (one input). Not in bf16: a bf16 CPU matmul's result depends on the CPU's instruction set
  (AVX-512 BF16, AVX2 and SSE gave three different sets of amax on one machine), so the
  checkpoint's bytes, and with them the fingerprint that keys every stored cell of the arm
  serving it, would change with the machine that exported it. In float64 the instruction
  set moves the last bits, which the rounding to float32 removes.
- Imports torch, safetensors, specrepro.embedded and drafters.py (its folder helpers) only:
  it runs on the GPU image.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from specrepro.embedded.quant import (
    E2M1_MAX,
    E4M3_MAX,
    NVFP4_BLOCK,
    TARGET_LINEARS,
    round_to_e2m1,
    round_to_e4m3,
)
from specrepro.tools.export.drafters import (
    file_sha256,
    new_folder,
    readable_by_all,
    write_checkpoint,
)

FORMAT = "nvfp4-pack-quantized"
SCHEMES = ("nvfp4", "nvfp4a16")  # W4A4 (compressed-tensors preset NVFP4) and weight-only
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
          "generation_config.json")
E4M3_EPS = 0.125  # compressed-tensors' stand-in for a block scale of 0 (helpers.py:364-366)
EXPORTER_FORMAT = 2  # bump when what is written changes (2: input amax calibrated in float64)


# --------------------------------------------------------------------------- the format
def global_scale(amax: torch.Tensor | float) -> torch.Tensor:
    """compressed-tensors' per-tensor global scale 448 * 6 / amax, float32 [1]."""
    a = torch.as_tensor(amax, dtype=torch.float32).clamp(min=torch.finfo(torch.float32).tiny)
    # `2688.0 / tensor` as generate_gparam writes it is torch's __rtruediv__: reciprocal, then
    # multiply (two roundings); written out so the float32 bits are the same
    g = torch.nan_to_num(a.reciprocal() * (E4M3_MAX * E2M1_MAX), nan=1.0, posinf=1.0,
                         neginf=1.0)
    return g.reshape(1)


def quantize_weight(w: torch.Tensor, gscale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] (in % 16 == 0), G [1] -> (weight_packed uint8 [out, in/2],
    weight_scale float8_e4m3fn [out, in/16])."""
    blocks = w.float().unflatten(-1, (-1, NVFP4_BLOCK))  # [out, in/16, 16]
    scale = round_to_e4m3(gscale * (blocks.abs().amax(-1, keepdim=True) / E2M1_MAX))
    scale = torch.where(scale == 0, torch.tensor(E4M3_EPS), scale)
    values = round_to_e2m1(blocks / (scale / gscale)).flatten(-2)
    return pack_e2m1(values), scale.squeeze(-1).to(torch.float8_e4m3fn)


def pack_e2m1(values: torch.Tensor) -> torch.Tensor:
    """[m, n] values on the E2M1 grid -> uint8 [m, n/2]: code = grid index | sign << 3, the
    even column in the low nibble."""
    a = values.abs()
    idx = torch.where(a < 2, a * 2, torch.where(a < 4, a + 2, a / 2 + 4)).to(torch.uint8)
    codes = idx | (torch.signbit(values).to(torch.uint8) << 3)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [m, n/2] -> float32 [m, n] E2M1 values."""
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    codes = torch.stack([packed & 0x0F, packed >> 4], -1).flatten(-2).long()
    return torch.where(codes & 8 > 0, -1.0, 1.0) * grid[codes & 7]


def dequantize_nvfp4(packed: torch.Tensor, scale: torch.Tensor, gscale: torch.Tensor,
                     dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The format's decoder: e2m1 * weight_scale / weight_global_scale, per block of 16."""
    vals = unpack_e2m1(packed).unflatten(-1, (-1, NVFP4_BLOCK))
    unit = scale.to(torch.float32).unsqueeze(-1) / gscale.to(torch.float32)
    return (vals * unit).flatten(-2).to(dtype)


def _args(dynamic, observer: str) -> dict:
    return {"num_bits": 4, "type": "float", "symmetric": True, "group_size": NVFP4_BLOCK,
            "strategy": "tensor_group", "block_structure": None, "dynamic": dynamic,
            "actorder": None, "scale_dtype": "torch.float8_e4m3fn", "zp_dtype": None,
            "observer": observer, "observer_kwargs": {}}


def quantization_config(scheme: str = "nvfp4") -> dict:
    """config.json's `quantization_config`: compressed-tensors 0.17.0's preset NVFP4 (W4A4) or
    NVFP4A16 on every Linear (quantization/quant_scheme.py:145-180), as its
    `QuantizationConfig.model_dump(mode="json")` writes it."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; expected one of {SCHEMES}")
    group = {"targets": ["Linear"], "weights": _args(False, "memoryless_minmax"),
             "input_activations": _args("local", "static_minmax") if scheme == "nvfp4" else None,
             "output_activations": None, "format": None}
    return {"config_groups": {"group_0": group}, "quant_method": "compressed-tensors",
            "kv_cache_scheme": None, "format": FORMAT, "quantization_status": "compressed",
            "global_compression_ratio": None, "ignore": ["lm_head"]}


# --------------------------------------------------------------------------- the checkpoint
def _linear_names(tensors: dict) -> list[str]:
    """Module names of the decoder layers' Linears (`model.layers.N.<block>.<proj>`)."""
    return sorted(k[: -len(".weight")] for k in tensors
                  if k.startswith("model.layers.") and k.endswith(".weight")
                  and k.split(".")[-2] in TARGET_LINEARS)


def _fused_key(name: str) -> str:
    """The fused layer vLLM builds a shard into (q/k/v -> qkv_proj, gate/up -> gate_up_proj)."""
    prefix, proj = name.rsplit(".", 1)
    return next((f"{prefix}.{f}" for f, parts in FUSED.items() if proj in parts), name)


def _read(checkpoint: Path) -> tuple[dict, dict, Path]:
    cfg_path, st_path = checkpoint / "config.json", checkpoint / "model.safetensors"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path} not found: {checkpoint} is not a Hugging Face "
                                "checkpoint folder")
    if not st_path.is_file():
        raise FileNotFoundError(f"{st_path} not found")
    config = json.loads(cfg_path.read_text())
    if "quantization_config" in config:
        raise ValueError(f"{cfg_path}: already has a quantization_config (quantized input)")
    if config.get("architectures") != ["Qwen3ForCausalLM"]:
        raise ValueError(f"{cfg_path}: architectures {config.get('architectures')!r}, expected "
                         "['Qwen3ForCausalLM']")
    tensors = load_file(str(st_path))
    for name in _linear_names(tensors):
        shape = tuple(tensors[f"{name}.weight"].shape)
        if len(shape) != 2 or shape[1] % NVFP4_BLOCK:
            raise ValueError(f"{st_path}: tensor {name}.weight has shape {shape}; NVFP4 needs "
                             f"a 2-D weight whose input dimension is a multiple of "
                             f"{NVFP4_BLOCK}")
    if not _linear_names(tensors):
        raise ValueError(f"{st_path}: no decoder-layer Linear weights "
                         f"(model.layers.N.*.{{{','.join(TARGET_LINEARS)}}}.weight)")
    return config, tensors, st_path


def calibrate_input_amax(checkpoint: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """Each Linear's input amax (float32 scalars) from the engine's own calibration, run in
    float64 on the CPU: the same on every machine (the module docstring says why not bf16)."""
    from specrepro.embedded.checkpoint import load_target
    from specrepro.embedded.quant import calibrate_activation_amax, calibration_batches
    model, tok = load_target(checkpoint, dtype=torch.float64)
    batches = calibration_batches(tok, model.config.vocab_size, "cpu")
    with torch.no_grad():
        amax = calibrate_activation_amax(model, names, batches, lambda ids: model(ids))
    return {n: a.to(torch.float32) for n, a in amax.items()}


def quantize_tensors(tensors: dict, input_amax: dict | None = None) -> dict:
    """The checkpoint's tensors with every decoder Linear in the format; the shards of a fused
    layer share their weight (and input) global scale. input_amax None: W4A16."""
    names = _linear_names(tensors)
    w_amax: dict[str, torch.Tensor] = {}
    a_amax: dict[str, torch.Tensor] = {}
    for n in names:
        key = _fused_key(n)
        a = tensors[f"{n}.weight"].float().abs().amax()
        w_amax[key] = torch.maximum(w_amax[key], a) if key in w_amax else a
        if input_amax is not None:
            b = input_amax[n].float()
            a_amax[key] = torch.maximum(a_amax[key], b) if key in a_amax else b
    replaced = {f"{n}.weight" for n in names}
    out = {k: v for k, v in tensors.items() if k not in replaced}  # embeddings, norms, head
    for n in names:
        g = global_scale(w_amax[_fused_key(n)])
        out[f"{n}.weight_packed"], out[f"{n}.weight_scale"] = \
            quantize_weight(tensors[f"{n}.weight"], g)
        out[f"{n}.weight_global_scale"] = g
        if input_amax is not None:
            out[f"{n}.input_global_scale"] = global_scale(a_amax[_fused_key(n)])
    return out


def export_nvfp4(checkpoint: str | Path, out: str | Path, scheme: str = "nvfp4") -> Path:
    """Write the NVFP4 checkpoint of `checkpoint`'s target into `out` (replaced whole: written
    into a temporary sibling, then renamed into place). Returns `out`."""
    checkpoint, out = Path(checkpoint), Path(out)
    qcfg = quantization_config(scheme)
    config, tensors, _ = _read(checkpoint)
    names = _linear_names(tensors)
    amax = calibrate_input_amax(checkpoint, names) if scheme == "nvfp4" else None
    quantized = quantize_tensors(tensors, amax)
    with new_folder(out) as tmp:
        copied = write_checkpoint(tmp, {**config, "quantization_config": qcfg}, quantized,
                                  checkpoint, COPIED)
        sources = {f: file_sha256(checkpoint / f) for f in ("config.json", "model.safetensors",
                                                         *copied)}
        meta = {"exporter_format": EXPORTER_FORMAT, "format": FORMAT, "scheme": scheme,
                "checkpoint": str(checkpoint.resolve()), "quantized_layers": len(names),
                "sources": sources}
        (tmp / "export.json").write_text(json.dumps(meta, indent=2) + "\n")
        readable_by_all(tmp)
    return out


# --------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="specrepro export-nvfp4",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", default="models/embedded", help="embedded checkpoint folder")
    ap.add_argument("--out", default="build/nvfp4-target", help="output folder (replaced)")
    ap.add_argument("--scheme", choices=SCHEMES, default="nvfp4",
                    help="nvfp4: W4A4 with calibrated input scales (Marlin W4A16 on Hopper); "
                         "nvfp4a16: weights only")
    args = ap.parse_args(argv)
    try:
        out = export_nvfp4(args.checkpoint, args.out, args.scheme)
    except (FileNotFoundError, ValueError) as e:
        print(f"specrepro export-nvfp4: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({args.scheme}, {FORMAT})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
