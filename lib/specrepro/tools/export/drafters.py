"""Write the embedded checkpoint's drafters in the folders vLLM 0.26.0 and SGLang 0.5.14 load.

Every key and tensor name below is from docs/engine-layouts.md (read from the engines' wheels),
its checklist "What the exporter must write".

Design:
- One folder per (engine, drafter): `<out_root>/<engine>/<name>/` holding `config.json`,
  `model.safetensors` and `export.json` (the source checkpoint folder, the drafter's name and
  the sha256 of every source file the export read: `is_current` compares them, so a stale
  export is found after a retrain). `export_drafters` leaves a current folder alone (an engine
  may be reading it) and writes any other into a temporary sibling, then renames it into
  place, so a half-written folder never stands under the real name.
- Block drafters (`method: dflash`) in the engines' layout only: a frozen mask token row
  (`mask_token_id`), blocks of 1 + k (`block: "engine"`), ascending target layer ids <= L-2
  (SGLang captures the input of layer id+1, so the last layer's output is never captured).
  Anything else the engines would run differently, so it is refused naming the config field.
  One folder serves both engines (the same tensor set; vLLM raises on unknown names, SGLang
  drops them); it is written under each engine's folder anyway. A light drafter has its
  trunk's tensors (`fc`, `hidden_norm`, `layers.0..T-1`) copied in, since neither engine has a
  trunk, and, since both read one `intermediate_size`, the narrower MLPs zero-padded to the
  widest: zero rows in gate/up [m, D] -> [W, D] and zero columns in down [D, m] -> [D, W], so
  the extra units give silu(0) * 0 = 0 and the outputs are unchanged.
- MTP heads in the EAGLE-1 layout (`layout: "eagle"`) only: its tensor names are already the
  engines' (`fc`, `layers.0.*`, proposers/mtp.py). vLLM (`LlamaForCausalLM`, prefixed to
  `EagleLlamaForCausalLM`) has an `fc` without bias and fails on an `fc.bias`; SGLang
  (`LlamaForCausalLMEagle`) has an `fc` with a bias that keeps its random init unless one is
  shipped, so its folder adds `fc.bias` = zeros [D]. The DeepSeek layout is refused: neither
  engine runs it for a Qwen3 target.
- `draft_model` drafters are already Hugging Face Qwen3 checkpoints (the checkpoint's
  `<name>/` folder loads as is), so they are not exported; n-gram has no weights.
- Tensors are the source's values, in bf16 (the checkpoint's dtype); the target's embedding
  and head are never shipped, so both engines share the target's.
- Imports torch, safetensors and specrepro.embedded only: it runs on the GPU image.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import save_file

from specrepro.embedded.checkpoint import (
    list_drafters,
    load_proposer,
    load_target,
    read_drafter_config,
)
from specrepro.embedded.proposers import DrafterConfig

ENGINES = ("vllm", "sglang")
EXPORTED_METHODS = ("dflash", "mtp")
# bump when the exported layout changes: an export of another format is stale
FORMAT = 1
DTYPE = torch.bfloat16

_LAYER_TENSORS = ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj",
                  "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                  "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj",
                  "mlp.down_proj")
# EAGLE-1 layer 0: a Llama layer (no QK-norm) whose input norm is the identity; no final norm
EAGLE_TENSORS = frozenset(["fc.weight"] + [f"layers.0.{t}.weight" for t in (
    "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
    "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")])


def dflash_tensors(num_layers: int) -> frozenset[str]:
    """The tensor names both engines' DFlash loaders read, for `num_layers` layers."""
    return frozenset(["fc.weight", "hidden_norm.weight", "norm.weight"]
                     + [f"layers.{i}.{t}.weight" for i in range(num_layers)
                        for t in _LAYER_TENSORS])


class _Source:
    """A checkpoint's target config, tokenizer and drafter index, read once per export run."""

    def __init__(self, checkpoint: str | Path):
        self.dir = Path(checkpoint)
        if not (self.dir / "config.json").is_file() or not (self.dir / "drafters.json").is_file():
            raise FileNotFoundError(f"{self.dir} is not an embedded checkpoint (config.json or "
                                    "drafters.json missing)")
        self.index = list_drafters(self.dir)
        self.target, self.tok = load_target(self.dir, dtype=DTYPE)
        self.tcfg = self.target.config

    def drafter(self, name: str) -> tuple[DrafterConfig, Path]:
        """The stored drafter's config and its config file; unknown names list the stored ones."""
        path = self.dir / name / "config.json"
        if name not in self.index or not path.is_file():
            raise ValueError(f"no drafter {name!r} in {self.dir} (stored: {self.index})")
        return read_drafter_config(path), path


# --------------------------------------------------------------------------- checks
def _check(src: _Source, name: str) -> tuple[DrafterConfig, Path]:
    """The drafter's config after refusing what the engines would run differently."""
    cfg, path = src.drafter(name)
    where = f"drafter {name!r} ({path})"
    if cfg.method not in EXPORTED_METHODS:
        raise ValueError(f"{where}: method {cfg.method!r} is not exported (only "
                         f"{EXPORTED_METHODS}; a draft_model folder is already a Hugging Face "
                         "checkpoint the engines load as is)")
    if cfg.method == "mtp":
        if cfg.layout != "eagle":
            raise ValueError(f"{where}: 'layout' is {cfg.layout!r}; the engines load an MTP head"
                             " for a Qwen3 target only as EAGLE-1 (layout \"eagle\"); retrain it")
        return cfg, path
    L = src.tcfg.num_hidden_layers
    ids = list(cfg.target_layers)
    if cfg.mask_token_id is None:
        raise ValueError(f"{where}: 'mask_token_id' is null (a learned mask_embedding); SGLang "
                         "has no mask tensor, the mask must be a target embedding row")
    if cfg.block != "engine":
        raise ValueError(f"{where}: 'block' is {cfg.block!r}; the engines run k drafts as a "
                         "block of 1 + k (block \"engine\")")
    if any(i < 0 or i > L - 2 for i in ids):
        raise ValueError(f"{where}: 'target_layers' {ids} must lie in 0..{L - 2} (L-2, L = "
                         f"{L} target layers): SGLang cannot capture the last layer's output")
    if ids != sorted(set(ids)):
        raise ValueError(f"{where}: 'target_layers' {ids} must be strictly ascending (the "
                         "engines concatenate the captured features in layer order)")
    _mask_token(src, cfg.mask_token_id, where)
    return cfg, path


def _mask_token(src: _Source, mask_id: int, where: str) -> str:
    """The token string at mask_id, which SGLang checks against the target tokenizer."""
    token = src.tok.tok.id_to_token(mask_id)
    if token is None or src.tok.tok.token_to_id(token) != mask_id:
        raise ValueError(f"{where}: 'mask_token_id' {mask_id} has no token in "
                         f"{src.dir / 'tokenizer.json'} that maps back to it (got {token!r})")
    return token


# --------------------------------------------------------------------------- layouts
def _common_config(tcfg, num_layers: int, width: int) -> dict:
    """The keys both engines read for the layers' shapes, RoPE and vocabulary."""
    return {
        "hidden_size": tcfg.hidden_size, "num_hidden_layers": num_layers,
        "num_attention_heads": tcfg.num_attention_heads,
        "num_key_value_heads": tcfg.num_key_value_heads, "head_dim": tcfg.head_dim,
        "intermediate_size": width, "hidden_act": "silu", "rms_norm_eps": tcfg.rms_norm_eps,
        "attention_bias": False, "vocab_size": tcfg.vocab_size,
        "max_position_embeddings": tcfg.max_position_embeddings,
        "tie_word_embeddings": False,
        # both: vLLM fills 1e6 when rope_parameters lacks rope_theta, SGLang falls back to 1e4
        "rope_theta": tcfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": tcfg.rope_theta},
        "torch_dtype": "bfloat16",
    }


def _pad_mlp(key: str, t: torch.Tensor, width: int) -> torch.Tensor:
    """An MLP weight zero-padded to `width` units: gate/up [m, D] -> [width, D] (zero rows),
    down [D, m] -> [D, width] (zero columns); other tensors unchanged."""
    if key.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")) and t.shape[0] < width:
        return torch.cat([t, t.new_zeros(width - t.shape[0], t.shape[1])], 0)
    if key.endswith("mlp.down_proj.weight") and t.shape[1] < width:
        return torch.cat([t, t.new_zeros(t.shape[0], width - t.shape[1])], 1)
    return t


def _dflash(src: _Source, name: str, cfg: DrafterConfig) -> tuple[dict, dict]:
    # load_proposer reads the trunk's tensors too (and checks the trunk fits)
    prop = load_proposer(src.dir, "dflash", src.target, device="cpu", dtype=DTYPE, name=name)
    width = max(layer.mlp.gate_proj.out_features for layer in prop.layers)
    tensors = {k: _pad_mlp(k, v, width) for k, v in prop.state_dict().items()}
    n, tcfg = len(prop.layers), src.tcfg
    ids = list(cfg.target_layers)
    config = dflash_config(tcfg, cfg, n, width,
                           _mask_token(src, cfg.mask_token_id, f"drafter {name!r}"))
    _expect(name, tensors, dflash_tensors(n))
    D = tcfg.hidden_size
    if tuple(tensors["fc.weight"].shape) != (D, len(ids) * D):  # both engines check the width
        raise ValueError(f"drafter {name!r}: fc.weight {tuple(tensors['fc.weight'].shape)} is "
                         f"not [{D}, {len(ids)} * {D}]")
    return config, tensors


def _eagle(src: _Source, name: str, cfg: DrafterConfig, engine: str) -> tuple[dict, dict]:
    prop = load_proposer(src.dir, "mtp", src.target, device="cpu", dtype=DTYPE, name=name)
    tensors = dict(prop.state_dict())
    _expect(name, tensors, EAGLE_TENSORS)
    config = eagle_config(src.tcfg, cfg.intermediate_size, engine)
    if engine == "sglang":  # nn.Linear(2D, D) with a bias: zeros [D] keep fc's output as trained
        tensors["fc.bias"] = torch.zeros(src.tcfg.hidden_size, dtype=DTYPE)
    return config, tensors


def dflash_config(tcfg, cfg: DrafterConfig, num_layers: int, width: int,
                  mask_token: str) -> dict:
    """config.json of a block drafter with `num_layers` layers of MLP `width` for target
    config `tcfg` (both engines' keys)."""
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        **_common_config(tcfg, num_layers, width),
        # SGLang reads these (dflash_config first, then top level); vLLM ignores them
        "num_target_layers": tcfg.num_hidden_layers, "block_size": cfg.block_size,
        "dflash_config": {
            "target_layer_ids": list(cfg.target_layers), "mask_token_id": cfg.mask_token_id,
            "mask_token": mask_token, "block_size": cfg.block_size,
            "num_target_layers": tcfg.num_hidden_layers},
    }


def eagle_config(tcfg, width: int, engine: str) -> dict:
    """config.json of an EAGLE-1 head with MLP `width` for target config `tcfg`, as `engine`
    loads it (vLLM `LlamaForCausalLM`, SGLang `LlamaForCausalLMEagle`)."""
    arch = "LlamaForCausalLM" if engine == "vllm" else "LlamaForCausalLMEagle"
    return {"architectures": [arch], "model_type": "llama",
            **_common_config(tcfg, 1, width), "mlp_bias": False}


def _expect(name: str, tensors: dict, names: frozenset[str]) -> None:
    """The drafter's tensors must be exactly the engines' set (vLLM raises on any other)."""
    if set(tensors) != names:
        raise ValueError(f"drafter {name!r}: tensors differ from the engines' set: missing "
                         f"{sorted(names - set(tensors))}, unexpected "
                         f"{sorted(set(tensors) - names)}")


# --------------------------------------------------------------------------- provenance
def file_sha256(path: Path) -> str:
    """A file's sha256, read in 1 MiB chunks (export.json's record of its sources)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _sources(checkpoint: Path, name: str) -> dict[str, str]:
    """sha256 of every file an export of `name` reads, by path relative to the checkpoint: the
    drafter's config and weights, a light drafter's trunk's, the target config (the shapes) and
    the tokenizer (the mask token)."""
    files = ["config.json", "tokenizer.json", f"{name}/config.json", f"{name}/model.safetensors"]
    trunk = read_drafter_config(checkpoint / name / "config.json").trunk
    if trunk:
        files += [f"{trunk['drafter']}/config.json", f"{trunk['drafter']}/model.safetensors"]
    return {f: file_sha256(checkpoint / f) for f in files}


def is_current(folder: str | Path, checkpoint: str | Path, name: str) -> bool:
    """Whether `folder` is a complete export of drafter `name` of `checkpoint` as it is now
    (same exporter format, same source files by sha256; the checkpoint may have moved)."""
    folder, checkpoint = Path(folder), Path(checkpoint)
    try:
        meta = json.loads((folder / "export.json").read_text())
        sources = _sources(checkpoint, name)
    except (OSError, ValueError, KeyError):
        return False
    return (meta.get("format") == FORMAT and meta.get("drafter") == name
            and meta.get("sources") == sources
            and all((folder / f).is_file() for f in ("config.json", "model.safetensors")))


# --------------------------------------------------------------------------- writing
def _write(src: _Source, name: str, engine: str, out: Path) -> Path:
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; expected one of {ENGINES}")
    cfg, _ = _check(src, name)
    sources = _sources(src.dir, name)  # before the tensors: a file changed meanwhile is stale
    config, tensors = (_dflash(src, name, cfg) if cfg.method == "dflash"
                       else _eagle(src, name, cfg, engine))
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.to(DTYPE).contiguous() for k, v in tensors.items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    meta = {"format": FORMAT, "engine": engine, "checkpoint": str(src.dir.resolve()),
            "drafter": name, "method": cfg.method, "sources": sources}
    (out / "export.json").write_text(json.dumps(meta, indent=2) + "\n")  # last: marks complete
    return out


def export_drafter(checkpoint: str | Path, name: str, engine: str, out: str | Path) -> Path:
    """Write `out/config.json`, `out/model.safetensors` (and `out/export.json`) for stored
    drafter `name` in the layout `engine` loads; returns `out`. Writes in place: use
    `export_drafters` for the atomic folder replace."""
    return _write(_Source(checkpoint), name, engine, Path(out))


def exportable(checkpoint: str | Path) -> list[str]:
    """The stored drafters whose method is exported (dflash, mtp), in index order."""
    return [n for n, m in list_drafters(checkpoint).items() if m in EXPORTED_METHODS]


def export_drafters(checkpoint: str | Path, out_root: str | Path,
                    engines: tuple[str, ...] = ENGINES, names: list[str] | None = None,
                    force: bool = False) -> dict[tuple[str, str], Path]:
    """Export drafters `names` (None: every stored dflash and mtp drafter; draft_model ones are
    Hugging Face checkpoints already and are not exported) into `out_root/<engine>/<name>/` for
    each engine; returns {(engine, name): folder}. Every drafter is checked before any folder is
    written. A folder `is_current` for its source is kept unless `force`; any other is written
    into a temporary sibling and renamed into place."""
    src = _Source(checkpoint)
    names = exportable(src.dir) if names is None else list(names)
    bad = [e for e in engines if e not in ENGINES]
    if bad:
        raise ValueError(f"unknown engine(s) {bad}; expected some of {ENGINES}")
    for name in names:
        _check(src, name)
    folders = {}
    for engine in engines:
        parent = Path(out_root) / engine
        parent.mkdir(parents=True, exist_ok=True)
        for name in names:
            dest = folders[engine, name] = parent / name
            if not force and is_current(dest, src.dir, name):
                continue
            with new_folder(dest) as tmp:
                _write(src, name, engine, tmp)
    return folders


@contextmanager
def new_folder(dest: Path) -> Iterator[Path]:
    """A temporary sibling of `dest` to write a whole folder into: on a clean exit it takes
    dest's place (`replace_folder`); a failed write leaves no partial folder behind."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.new.", dir=dest.parent))
    try:
        yield tmp
        replace_folder(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing is left after the rename


def write_checkpoint(folder: Path, config: dict, tensors: dict, source: Path,
                     copy: Iterable[str]) -> list[str]:
    """A checkpoint's `config.json` and `model.safetensors` in `folder`, and those of the
    files `copy` names that `source` has, copied beside them; returns the copied names."""
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in tensors.items()},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    copied = [f for f in copy if (source / f).is_file()]
    for f in copied:
        shutil.copy2(source / f, folder / f)
    return copied


def readable_by_all(folder: Path) -> None:
    """mkdtemp's 0700 and safetensors' 0600 would hide an export from other users."""
    folder.chmod(0o755)
    for f in folder.iterdir():
        f.chmod(0o644)


def replace_folder(new: Path, dest: Path) -> None:
    """Put a finished folder in dest's place: a rename cannot replace a non-empty folder,
    so the old one is moved aside first and removed after (a reader finds the old folder
    or the new one, never a half-written one)."""
    if dest.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old.", dir=dest.parent))
        dest.rename(old / dest.name)
        new.rename(dest)
        shutil.rmtree(old)
    else:
        new.rename(dest)


# --------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="specrepro export-drafters",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", default="models/embedded", help="embedded checkpoint folder")
    ap.add_argument("--out", default="build/engine-drafters",
                    help="output root: <out>/<engine>/<drafter>/")
    ap.add_argument("--engine", choices=[*ENGINES, "all"], default="all")
    ap.add_argument("--drafter", action="append", metavar="NAME",
                    help="a stored drafter to export (repeatable; default: every dflash and mtp)")
    ap.add_argument("--force", action="store_true", help="rewrite folders that are current")
    args = ap.parse_args(argv)
    engines = ENGINES if args.engine == "all" else (args.engine,)
    try:
        before = {(e, n): is_current(Path(args.out) / e / n, args.checkpoint, n)
                  for e in engines for n in (args.drafter or exportable(args.checkpoint))}
        folders = export_drafters(args.checkpoint, args.out, engines, args.drafter, args.force)
    except (FileNotFoundError, ValueError) as e:
        print(f"specrepro export-drafters: {e}", file=sys.stderr)
        return 2
    for key, folder in folders.items():
        print(f"{'current' if before[key] and not args.force else 'wrote'} {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
