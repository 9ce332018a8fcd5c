"""Write a block drafter as an FP8 checkpoint vLLM 0.26.0 loads as FP8 (notebook 05's drafter).

Why a checkpoint: article B quantized its drafter while it loaded (`"quantization":
"fp8_per_tensor"` in vLLM 0.33.0's speculative config). vLLM 0.26.0 does not start that way:
a separate drafter gets a callable `hf_overrides`, and `get_quant_config`
(vllm/model_executor/model_loader/weight_utils.py:240-300) insists on a dict unless the
drafter's own config.json carries a `quantization_config`, which it then returns first
(:275-291). SGLang 0.5.14 cannot serve an FP8 block drafter at all: `sglang/srt/models/
dflash.py` builds `DFlashAttention`'s qkv/o projections and `DFlashMLP` without the quant
config and `fc` as a plain `nn.Linear` (:69-120, :229-360), so every weight loads in BF16.
Facts below are read from `vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl`; paths are its.

Layout: vLLM's own FP8 checkpoint format (`quant_method: fp8`, as AutoFP8 writes it):
- `config.json`: the source's plus `quantization_config` = {quant_method "fp8",
  activation_scheme "dynamic", ignored_layers}. `Fp8Config.from_config` reads exactly these
  (layers/quantization/fp8.py:156-173): "fp8" in quant_method means serialized FP8 weights,
  so `Fp8LinearMethod` takes every Linear not ignored (:175-199).
- Each quantized Linear `<name>.weight` becomes float8_e4m3fn [out, in] and
  `<name>.weight_scale` float32 [] (AutoFP8's scalar; parameter.py:291-309 accepts it), per
  tensor: scale = amax / 448, weight = e4m3(w / scale), round to nearest even, saturated at
  +-448. Activations are quantized per tensor at run time (dynamic: no input_scale).
- Quantized: every decoder layer's `o_proj`, `gate_proj`, `up_proj`, `down_proj` and the
  context projection `fc`: for the stand-in's drafter 97.7 % of its 3,377,768,448 bytes, so
  the FP8 copy is 1,727,293,540 bytes (1.61 GiB; step_cost/models.yaml standin-dflash-fp8).
- Kept in BF16, listed in `ignored_layers`: each layer's q/k/v projections. vLLM 0.26.0's
  DFlash model (models/qwen3_dflash.py:433-453, 496-516) copies `qkv_proj.weight`'s K/V
  rows into one fused buffer when it loads and multiplies the context states by it with
  `F.linear` in the activations' dtype: an FP8 weight there would meet BF16 states. The
  names are vLLM's module prefixes, `model.layers.{target layers + i}.self_attn.*`
  (:392 numbers a drafter's layers after the target's; :669-670), the fused `qkv_proj` and
  its shards both (quant_utils.py:510-571 `is_layer_skipped` matches either).
- Norms, and nothing else (the drafter has no embedding or head), stay as they are.
- `standin.json`, when the source is a stand-in part: the source's recipe and part plus this
  exporter's, so identity.py keys the folder by recipe (no 1.6-GB hash per cell) and a new
  exporter format is a new identity; otherwise `export.json` with the sources' sha256.
Imports torch, safetensors and drafters.py's folder helpers only: it runs on the GPU image.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from specrepro.tools.export.drafters import (
    file_sha256,
    new_folder,
    readable_by_all,
    write_checkpoint,
)

E4M3_MAX = 448.0
EXPORTER_FORMAT = 1  # bump when what is written changes
QUANTIZED = re.compile(r"^(layers\.\d+\.(self_attn\.o_proj|mlp\.(gate|up|down)_proj)|fc)\.weight$")
KEPT_BF16 = re.compile(r"^layers\.(\d+)\.self_attn\.([qkv])_proj\.weight$")
COPIED = ("mask_embedding.pt",)
RECIPE = "standin.json"


def quantize_fp8_per_tensor(w: torch.Tensor, device: str = "cpu"
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] -> (float8_e4m3fn [out, in], float32 [] scale), both on the CPU;
    w ~= q * scale. The same bits on any device: float32 division and torch's one
    round-to-nearest-even cast (c10's Float8_e4m3fn, host and device code alike)."""
    x = w.to(device).float()
    amax = x.abs().amax()
    scale = (amax / E4M3_MAX) if amax > 0 else torch.tensor(1.0, device=x.device)
    q = (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.cpu(), scale.to(torch.float32).reshape(()).cpu()


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    """What a per-tensor FP8 GEMM multiplies by: q * scale."""
    return (q.float() * scale.float()).to(dtype)


def ignored_layers(num_layers: int, target_layers: int) -> list[str]:
    """vLLM module names of the q/k/v projections kept in BF16 (fused name and shards)."""
    return [f"model.layers.{target_layers + i}.self_attn.{p}"
            for i in range(num_layers) for p in ("qkv_proj", "q_proj", "k_proj", "v_proj")]


def _read(drafter: Path) -> tuple[dict, dict]:
    cfg_path, st_path = drafter / "config.json", drafter / "model.safetensors"
    for p in (cfg_path, st_path):
        if not p.is_file():
            raise FileNotFoundError(f"{p} not found: {drafter} is not an exported block "
                                    "drafter folder (specrepro export-drafters/export-standin)")
    config = json.loads(cfg_path.read_text())
    if config.get("architectures") != ["DFlashDraftModel"]:
        raise ValueError(f"{cfg_path}: architectures {config.get('architectures')!r}, "
                         "expected ['DFlashDraftModel'] (a block drafter)")
    if "quantization_config" in config:
        raise ValueError(f"{cfg_path}: already has a quantization_config (quantized input)")
    if not isinstance(config.get("num_target_layers"), int):
        raise ValueError(f"{cfg_path}: no integer num_target_layers (vLLM numbers the "
                         "drafter's layers after the target's)")
    tensors = load_file(str(st_path))
    if not any(QUANTIZED.match(k) for k in tensors):
        raise ValueError(f"{st_path}: no o_proj/gate/up/down_proj/fc weights to quantize")
    bad = [k for k in tensors if QUANTIZED.match(k) and tensors[k].dim() != 2]
    if bad:
        raise ValueError(f"{st_path}: {bad[0]} is not a 2-D weight")
    return config, tensors


def quantize_tensors(tensors: dict, device: str = "cpu") -> dict:
    """The drafter's tensors with every quantized Linear as weight (e4m3) + weight_scale."""
    out = {}
    for k, v in tensors.items():
        if QUANTIZED.match(k):
            name = k[: -len(".weight")]
            out[f"{name}.weight"], out[f"{name}.weight_scale"] = \
                quantize_fp8_per_tensor(v, device)
        else:
            out[k] = v
    return out


def quantization_config(config: dict) -> dict:
    return {"quant_method": "fp8", "activation_scheme": "dynamic",
            "ignored_layers": ignored_layers(int(config["num_hidden_layers"]),
                                             int(config["num_target_layers"]))}


def export_fp8_drafter(drafter: str | Path, out: str | Path, device: str = "cpu") -> dict:
    """Write `drafter` (a block drafter folder vLLM loads) as FP8 into `out`, replaced whole
    (written into a temporary sibling, then renamed). Returns a summary."""
    drafter, out = Path(drafter), Path(out)
    if drafter.resolve() == out.resolve():
        raise ValueError(f"--out {out} is the drafter itself; write the FP8 copy beside it")
    config, tensors = _read(drafter)
    quantized = quantize_tensors(tensors, device)
    qcfg = quantization_config(config)
    with new_folder(out) as tmp:
        copied = write_checkpoint(tmp, {**config, "quantization_config": qcfg}, quantized,
                                  drafter, COPIED)
        ours = {"exporter": "fp8_drafter", "exporter_format": EXPORTER_FORMAT,
                "quantization_config": qcfg}
        source = _standin_meta(drafter)
        if source is not None:  # a stand-in part: keyed by recipe (identity.standin_recipe)
            files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
            meta = {"recipe": {"source": source["recipe"], "source_part": source["part"],
                               "fp8": ours},
                    "part": _part(drafter, source["part"], out), "files": files}
            (tmp / RECIPE).write_text(json.dumps(meta, indent=2) + "\n")
        else:
            sources = {f: file_sha256(drafter / f)
                       for f in ("config.json", "model.safetensors", *copied)}
            (tmp / "export.json").write_text(json.dumps({**ours, "source": str(drafter.resolve()),
                                                         "sources": sources}, indent=2) + "\n")
        readable_by_all(tmp)
    n_q = sum(1 for k in tensors if QUANTIZED.match(k))
    n_kept = sum(1 for k in tensors if KEPT_BF16.match(k))
    before = sum(v.numel() * v.element_size() for v in tensors.values())
    after = sum(v.numel() * v.element_size() for v in quantized.values())
    return {"out": str(out), "quantized": n_q, "kept_bf16": n_kept, "bytes_before": before,
            "bytes_after": after, "standin": source is not None}


def _part(drafter: Path, source_part: str, out: Path) -> str:
    """The FP8 folder's part: its path in the stand-in's folder when written inside it (so
    export-standin's check that a stand-in is whole finds it), else the source's + "-fp8"."""
    root = drafter.resolve().parents[len(Path(source_part).parts) - 1]
    try:
        return out.resolve().relative_to(root).as_posix()
    except ValueError:
        return f"{source_part}-fp8"


def _standin_meta(drafter: Path) -> dict | None:
    """The source folder's stand-in recipe and part, if it is a stand-in part whose files are
    the ones its recipe lists at the sizes it records (identity.standin_recipe's rule: a
    folder changed since its export is hashed, so its FP8 copy must not claim the recipe)."""
    try:
        meta = json.loads((drafter / RECIPE).read_text())
        files = meta["files"]
        on_disk = {p.relative_to(drafter).as_posix() for p in drafter.rglob("*")
                   if p.is_file() and p.name != RECIPE}
        if on_disk != set(files) or any((drafter / f).stat().st_size != n
                                        for f, n in files.items()):
            return None
        return {"recipe": meta["recipe"], "part": meta["part"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="specrepro export-fp8-drafter",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--drafter", default="build/standin/vllm/dflash",
                    help="the block drafter folder vLLM loads (BF16)")
    ap.add_argument("--out", default="build/standin/vllm/dflash-fp8",
                    help="output folder (replaced)")
    ap.add_argument("--device", default="cpu",
                    help="where to quantize (cuda on the GPU machine; the bits are the same)")
    args = ap.parse_args(argv)
    try:
        s = export_fp8_drafter(args.drafter, args.out, args.device)
    except (FileNotFoundError, ValueError) as e:
        print(f"specrepro export-fp8-drafter: {e}", file=sys.stderr)
        return 2
    print(f"wrote {s['out']}: {s['quantized']} Linears in FP8 per tensor, {s['kept_bf16']} "
          f"q/k/v projections in BF16; {s['bytes_before'] / 2**30:.2f} -> "
          f"{s['bytes_after'] / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
