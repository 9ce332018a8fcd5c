"""NVFP4 and FP8 fake quantization with static scales, and the `QuantLinear` that uses them.

Design:
- Fake quantization: values are rounded onto the low-precision grid and scaled back, and
  the matmul runs on the dequantized values in the model dtype. This reproduces the
  numbers a W4A4 / W8A8 kernel computes (exact products of grid values, accumulated and
  scaled), not its speed or memory.
- NVFP4 is NVIDIA's two-level scheme: a per-tensor FP32 global scale g = amax / (6 * 448),
  one FP8-E4M3 scale per block of 16 contiguous elements along the input dimension,
  s = e4m3(block_amax / 6 / g), and E2M1 values (±{0, .5, 1, 1.5, 2, 3, 4, 6}) by
  round-to-nearest-even of x / (s * g), saturating at ±6. Dequantized: value * s * g.
- FP8 per tensor: E4M3 with one static scale amax / 448.
- Static scales: weights from the weights (once, at swap time: the dequantized weight is
  stored in the model dtype, so only the activations are quantized per forward);
  activation global scales from a calibration pass over a fixed text (`CALIBRATION_TEXT`,
  the engine's calibration input for the NVFP4 target and the FP8 drafter). NVFP4 activation block scales are
  computed at run time per 16 elements of each row, as the hardware does: they are local
  to a token, so a request's output never depends on what else is in its batch.
- Only torch here (`torch.float8_e4m3fn` does the E4M3 rounding); E2M1 has no torch cast
  (`float4_e2m1fn_x2` is storage only), so its round-to-nearest-even is written out in
  `round_to_e2m1`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

E2M1_MAX = 6.0
E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
NVFP4_BLOCK = 16
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitudes; sign is separate

TARGET_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class QuantScheme:
    """A quantization recipe as data: the formats of weights and activations."""

    name: str
    weights: str  # "nvfp4" | "fp8"
    activations: str | None  # "nvfp4" | "fp8" | None (weight-only)
    bits_per_weight: float  # as stored, scales included


SCHEMES = {
    "nvfp4": QuantScheme("nvfp4", "nvfp4", "nvfp4", 4.0 + 8.0 / NVFP4_BLOCK),  # W4A4
    "fp8_per_tensor": QuantScheme("fp8_per_tensor", "fp8", "fp8", 8.0),  # W8A8, static
    "fp8_weight_only": QuantScheme("fp8_weight_only", "fp8", None, 8.0),
}


def get_scheme(name: str) -> QuantScheme:
    if name not in SCHEMES:
        raise ValueError(f"unknown quantization scheme {name!r}; expected one of {sorted(SCHEMES)}")
    return SCHEMES[name]


# ---------------------------------------------------------------------------- element formats

def round_to_e2m1(v: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest-even onto the E2M1 grid, saturating at ±6 (float32 in, float32 out).

    The grid has spacing 0.5 on [0, 2), 1 on [2, 4), 2 on [4, 6]; rounding v/step half to
    even is round-half-to-even on the mantissa bit: a tie goes to the even code (0.25 -> 0,
    0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4). Elementwise arithmetic
    (no lookup) keeps it cheap on a CPU and fusable by torch.compile.
    """
    a = v.abs().clamp(max=E2M1_MAX)
    step = torch.where(a < 2.0, 0.5, torch.where(a < 4.0, 1.0, 2.0))
    return torch.copysign(torch.round(a / step) * step, v)


def round_to_e4m3(v: torch.Tensor) -> torch.Tensor:
    """Round float32 onto FP8-E4M3 (fn: no inf), saturating at ±448; float32 out."""
    return v.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)


# ---------------------------------------------------------------------------- NVFP4

@dataclass
class NVFP4Tensor:
    """A tensor in NVFP4: E2M1 values, E4M3 block scales, FP32 global scale."""

    values: torch.Tensor  # [..., n] float32, every entry on ±E2M1_GRID (n padded to 16s)
    block_scales: torch.Tensor  # [..., n/16] torch.float8_e4m3fn
    global_scale: torch.Tensor  # [] float32
    in_features: int  # the unpadded length of the last dimension

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[..., in_features] values * block scale * global scale."""
        blocks = self.values.unflatten(-1, (-1, NVFP4_BLOCK))  # [..., n/16, 16]
        unit = self.block_scales.to(torch.float32).unsqueeze(-1) * self.global_scale
        return (blocks * unit).flatten(-2)[..., : self.in_features].to(dtype)


def nvfp4_global_scale(amax: torch.Tensor | float) -> torch.Tensor:
    """The per-tensor FP32 scale amax / (6 * 448), so every block scale fits E4M3."""
    amax = torch.as_tensor(amax, dtype=torch.float32)
    # an all-zero tensor still gets a usable scale (its values are all zero anyway)
    return (amax / (E2M1_MAX * E4M3_MAX)).clamp(min=torch.finfo(torch.float32).tiny)


def _nvfp4_blocks(x: torch.Tensor, global_scale: torch.Tensor | float | None):
    """The NVFP4 arithmetic, shared by `quantize_nvfp4` and `fake_quant_nvfp4`.

    x: [..., n]. Returns (values [..., n/16, 16] on the E2M1 grid, block scales [..., n/16, 1]
    float32 on the E4M3 grid, unit = scale * global [..., n/16, 1], global scale []).
    """
    xf = x.float()
    pad = (-xf.shape[-1]) % NVFP4_BLOCK
    if pad:
        xf = F.pad(xf, (0, pad))
    g = nvfp4_global_scale(xf.abs().amax()) if global_scale is None else \
        torch.as_tensor(global_scale, dtype=torch.float32, device=xf.device)
    blocks = xf.unflatten(-1, (-1, NVFP4_BLOCK))  # [..., n/16, 16]
    scale = round_to_e4m3(blocks.abs().amax(dim=-1, keepdim=True) / E2M1_MAX / g)
    unit = scale * g  # [..., n/16, 1]
    # a block whose scale underflows E4M3 has unit 0: its values saturate and dequantize to 0
    values = round_to_e2m1(blocks / unit.clamp(min=torch.finfo(torch.float32).tiny))
    return values, scale, unit, g


def quantize_nvfp4(x: torch.Tensor, global_scale: torch.Tensor | float | None = None
                   ) -> NVFP4Tensor:
    """Quantize x [..., n] to NVFP4 along its last dimension in blocks of 16.

    global_scale: a static per-tensor scale (activations, from calibration), or None to take
    it from x's own amax (weights). Inputs beyond the calibrated range saturate (block scale
    at 448, values at ±6), as on the hardware.
    """
    values, scale, unit, g = _nvfp4_blocks(x, global_scale)
    values = torch.where(unit > 0, values, 0.0)  # blocks that underflowed encode as zeros
    return NVFP4Tensor(values.flatten(-2), scale.squeeze(-1).to(torch.float8_e4m3fn), g,
                       x.shape[-1])


def fake_quant_nvfp4(x: torch.Tensor, global_scale: torch.Tensor | float | None = None
                     ) -> torch.Tensor:
    """x -> NVFP4 -> back, in x's dtype and shape (the same numbers as `quantize_nvfp4`
    then `dequantize`, without building the encoded tensor)."""
    values, _, unit, _ = _nvfp4_blocks(x, global_scale)
    return (values * unit).flatten(-2)[..., : x.shape[-1]].to(x.dtype)


# ---------------------------------------------------------------------------- FP8

def fp8_scale(amax: torch.Tensor | float) -> torch.Tensor:
    """The static per-tensor FP8-E4M3 scale amax / 448 (FP32)."""
    amax = torch.as_tensor(amax, dtype=torch.float32)
    return (amax / E4M3_MAX).clamp(min=torch.finfo(torch.float32).tiny)


def fake_quant_fp8(x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """x -> E4M3(x / scale) * scale, saturating at ±448 * scale, in x's dtype."""
    s = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    return (round_to_e4m3(x.float() / s) * s).to(x.dtype)


# ---------------------------------------------------------------------------- layers

def _fake_quant_weight(fmt: str, w: torch.Tensor) -> torch.Tensor:
    """A weight fake-quantized with scales from itself, in its dtype."""
    if fmt == "nvfp4":
        return fake_quant_nvfp4(w)
    if fmt == "fp8":
        return fake_quant_fp8(w, fp8_scale(w.abs().amax()))
    raise ValueError(f"unknown element format {fmt!r}")


class QuantLinear(nn.Module):
    """A drop-in `nn.Linear` with fake-quantized weights (static) and activations (static
    per-tensor scale; NVFP4 block scales per 16 elements of each row at run time)."""

    def __init__(self, linear: nn.Linear, scheme: str | QuantScheme,
                 act_amax: torch.Tensor | float | None = None):
        super().__init__()
        self.scheme = get_scheme(scheme) if isinstance(scheme, str) else scheme
        self.in_features, self.out_features = linear.in_features, linear.out_features
        if self.scheme.activations is not None and act_amax is None:
            raise ValueError(f"QuantLinear: scheme {self.scheme.name!r} quantizes activations "
                             "and needs a calibrated act_amax")
        w = linear.weight.detach()
        # weights quantized once; stored dequantized in the model dtype
        self.register_buffer("weight", _fake_quant_weight(self.scheme.weights, w))
        self.bias = linear.bias
        # the static activation scale, computed once
        amax = None if act_amax is None else \
            torch.as_tensor(act_amax, dtype=torch.float32, device=w.device).detach().clone()
        self.register_buffer("act_amax", amax)
        act_scale = None
        if self.scheme.activations == "nvfp4":
            act_scale = nvfp4_global_scale(amax)
        elif self.scheme.activations == "fp8":
            act_scale = fp8_scale(amax)
        self.register_buffer("act_scale", act_scale)

    def quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> its fake-quantized value, row-local (batch-invariant)."""
        if self.scheme.activations == "nvfp4":
            return fake_quant_nvfp4(x, self.act_scale)
        if self.scheme.activations == "fp8":
            return fake_quant_fp8(x, self.act_scale)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in] -> [..., out]
        return F.linear(self.quantize_input(x), self.weight, self.bias)

    def stored_weight_bytes(self) -> int:
        """Bytes of this layer's weight as a W4/W8 kernel stores it, scales included."""
        n = self.in_features * self.out_features
        scales = 4 + (4 if self.act_amax is not None else 0)  # FP32 weight/activation scales
        if self.scheme.weights == "nvfp4":
            n_pad = self.out_features * (-(-self.in_features // NVFP4_BLOCK) * NVFP4_BLOCK)
            return n_pad // 2 + n_pad // NVFP4_BLOCK + scales  # 4-bit values + E4M3 scales
        return n + scales

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"scheme={self.scheme.name}"


def _selected(name: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    """A module name matches a pattern when the pattern matches its last part or whole name."""
    def hit(patterns):
        last = name.rsplit(".", 1)[-1]
        return any(fnmatch.fnmatchcase(last, p) or fnmatch.fnmatchcase(name, p) for p in patterns)
    return hit(include) and not hit(exclude)


@torch.no_grad()
def calibrate_activation_amax(
    model: nn.Module, names: Sequence[str], calibration_batches: Sequence[torch.Tensor],
    run_forward: Callable[[torch.Tensor], Any],
) -> dict[str, torch.Tensor]:
    """Run the forward over the calibration batches; return each named layer's input amax."""
    amax: dict[str, torch.Tensor] = {}
    modules = dict(model.named_modules())

    def hook(name):
        def record(_module, args):
            a = args[0].detach().abs().amax().float()
            amax[name] = torch.maximum(amax[name], a) if name in amax else a
        return record

    handles = [modules[n].register_forward_pre_hook(hook(n)) for n in names]
    try:
        for ids in calibration_batches:
            run_forward(ids)
    finally:
        for h in handles:
            h.remove()
    missing = [n for n in names if n not in amax]
    if missing:
        raise ValueError(f"calibration never reached layers {missing}: check run_forward")
    return amax


def quantize_model(model: nn.Module, scheme: str,
                   calibration_batches: Sequence[torch.Tensor] = (),
                   run_forward: Callable[[torch.Tensor], Any] | None = None,
                   include: Sequence[str] = TARGET_LINEARS,
                   exclude: Sequence[str] = ("lm_head",)) -> nn.Module:
    """Swap the selected `nn.Linear` layers of model for `QuantLinear`, in place.

    calibration_batches: input_ids tensors; run_forward(input_ids) runs the model on one
    (default `model(input_ids)`). Activation scales are calibrated on the unquantized model.
    include/exclude: fnmatch patterns on the layer's name or its last part.
    """
    sch = get_scheme(scheme)
    names = [n for n, m in model.named_modules()
             if isinstance(m, nn.Linear) and _selected(n, include, exclude)]
    if not names:
        raise ValueError(f"quantize_model: no nn.Linear matches include={tuple(include)} "
                         f"exclude={tuple(exclude)}")
    amax: dict[str, torch.Tensor] = {}
    if sch.activations is not None:
        if not calibration_batches:
            raise ValueError(f"quantize_model: scheme {scheme!r} needs calibration_batches")
        amax = calibrate_activation_amax(model, names, calibration_batches,
                                         run_forward or (lambda ids: model(ids)))
    for name in names:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, QuantLinear(getattr(parent, attr), sch, amax.get(name)))
    return model


def describe_quantization(model: nn.Module) -> dict:
    """The manifest's view: scheme, quantized layers and weight bytes as they would be stored."""
    layers = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    schemes = sorted({m.scheme.name for m in layers.values()})
    quant_bytes = sum(m.stored_weight_bytes() for m in layers.values())
    quant_params = sum(m.in_features * m.out_features for m in layers.values())
    # parameters() lists a tied tensor once; QuantLinear weights are buffers, not in it
    other_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return {
        "scheme": schemes[0] if len(schemes) == 1 else (schemes or None),
        "layers": sorted(layers),
        "num_layers": len(layers),
        "quantized_params": quant_params,
        "quantized_weight_bytes": quant_bytes,
        "bits_per_weight": 8.0 * quant_bytes / quant_params if quant_params else None,
        "other_weight_bytes": other_bytes,
        "total_weight_bytes": quant_bytes + other_bytes,
        "activation_amax": {n: float(m.act_amax) for n, m in layers.items()
                            if m.act_amax is not None},
    }

# --------------------------------------------------------------------------- calibration input
# A fixed text for the activation-scale calibration of quantized layers (NVFP4 target, FP8
# drafter): some arithmetic, some code and some prose, like the model's training mix.
CALIBRATION_TEXT = (
    "Question: A baker makes 24 muffins in the morning and 18 in the afternoon. She sells 35 "
    "of them and gives 2 to a neighbour. How many muffins are left?\nAnswer: She made 24 + 18 "
    "= <<24+18=42>>42 muffins. She sold or gave away 35 + 2 = <<35+2=37>>37. So 42 - 37 = "
    "<<42-37=5>>5 muffins are left.\n#### 5\n\n"
    "def moving_average(values, window):\n    \"\"\"Return the mean of each window of values.\"\"\"\n"
    "    if window <= 0:\n        raise ValueError('window must be positive')\n    out = []\n"
    "    for i in range(len(values) - window + 1):\n        out.append(sum(values[i:i + window])"
    " / window)\n    return out\n\n"
    "The river rises in the hills to the north of the town and flows south through a wide "
    "valley of farms and orchards . In the nineteenth century a canal was cut beside it , and "
    "the mills that grew along its banks employed most of the people of the district .\n"
)


def calibration_batches(tokenizer, vocab: int, device) -> list[torch.Tensor]:
    """The activation-scale calibration input: CALIBRATION_TEXT's token ids below `vocab`, as
    one [1, n] int64 batch."""
    if tokenizer is not None:
        ids = [i for i in tokenizer.encode(CALIBRATION_TEXT) if i < vocab]
    else:  # a bare model in tests: a fixed pseudo-random sequence stands in for text
        g = torch.Generator().manual_seed(1234)
        ids = torch.randint(0, vocab, (256,), generator=g).tolist()
    return [torch.tensor([ids], dtype=torch.int64, device=device)]
