"""`specrepro export-standin`: the embedded target and its drafters at a declared byte budget.

Design:
- The budget is data (`params/standin/*.yaml`, `load_budget` validates it and names the file
  and key of anything wrong): the target's bytes, its hidden copies, the KV heads it adds and
  the KV bytes per token it should keep (which sets the layer count), and each drafter's
  bytes as the articles price them (a share of the target, or target layers per re-run).
  `--target-gib` overrides the target's bytes; below the budget's, hidden copies and layers
  shrink by the cube root of the ratio (every dimension alike), then the copies fall until
  the MLP is at least the source's. `plan` turns it into shapes (`Stack`s), the MLP width of
  each stack solved from its bytes and rounded down to a multiple of 128; a drafter that
  cannot reach its share with its source width says what it reached.
- The construction is inflate.py's (exact in real arithmetic, bf16-exact parts). Written:
  `DIR/target/` a Hugging Face Qwen3 checkpoint (untied head) with the embedded engine's
  drafters under it (`drafters.json`, `<name>/`, the layout `load_proposer` reads), and each
  block drafter and EAGLE head in the folder vLLM 0.26.0 and SGLang 0.5.14 load,
  `DIR/<engine>/<name>/` (drafters.py's configs; a light drafter with its trunk copied in).
  The draft model is `DIR/target/draft_model/`, a Hugging Face checkpoint every engine loads.
- `standin.json` in every written folder is its recipe: exporter format, budget, seed, the
  device that drew the random parts, the sha256 of every source file, the plan, and each
  file's size. identity.py keys a cell's model by it instead of hashing tens of GB; a folder
  whose sizes differ from its recipe is hashed as any other folder.
- The whole of DIR is written in a temporary sibling and renamed into place; a DIR whose
  recipe equals the one asked for is left alone.
- Imports torch, safetensors, pyyaml, specrepro.embedded and this package only: it runs on
  the GPU image, where `--device cuda` draws the random parts (a 21-GiB target in well under
  a minute).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file, save_file

from specrepro.embedded.checkpoint import list_drafters, read_drafter_config
from specrepro.embedded.model import ModelConfig
from specrepro.embedded.tokenizer import Tokenizer
from specrepro.tools.export.drafters import dflash_config, eagle_config, file_sha256, new_folder
from specrepro.tools.export.inflate import (
    Inflater,
    Stack,
    head_pairs,
    inflate_model,
    inflate_readers,
    inflate_stack,
    nbytes,
)

FORMAT = 1
RECIPE = "standin.json"
DEFAULT_BUDGET = "params/standin/qwen3.8-27b-class.yaml"
GIB = 2**30
ROUND = 128  # MLP widths are multiples of this (GEMM tiles)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")


# --------------------------------------------------------------------------- the budget
@dataclass(frozen=True)
class Budget:
    name: str
    matches: str
    seed: int
    target_gib: float
    hidden_copies: int
    extra_kv_heads: int
    kv_bytes_per_token: int
    dflash_share: float
    mtp_target_layers: float
    draft_share: float
    draft_hidden_copies: int
    draft_layers: int


_SCHEMA = {  # key path -> (type, minimum)
    "name": (str, None), "matches": (str, None), "seed": (int, 0),
    "target.gib": (float, 1e-4), "target.hidden_copies": (int, 1),
    "target.extra_kv_heads": (int, 0), "target.kv_bytes_per_token": (int, 1),
    "drafters.dflash.share_of_target": (float, 0.0),
    "drafters.mtp.target_layers": (float, 0.0),
    "drafters.draft_model.share_of_target": (float, 0.0),
    "drafters.draft_model.hidden_copies": (int, 1), "drafters.draft_model.layers": (int, 1),
}


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(_flatten(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


def load_budget(path: str | Path) -> Budget:
    """A budget file, validated: every key of `_SCHEMA`, nothing else, each of its type."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ValueError(f"budget file {path}: cannot read it ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise ValueError(f"budget file {path}: not YAML ({e})") from None
    if not isinstance(raw, dict):  # a ValueError, as every other fault of the file
        raise ValueError(f"budget file {path}: expected a mapping, found "  # noqa: TRY004
                         f"{type(raw).__name__}")
    flat = _flatten(raw)
    unknown = sorted(set(flat) - set(_SCHEMA))
    missing = sorted(set(_SCHEMA) - set(flat))
    if unknown or missing:
        raise ValueError(f"budget file {path}: unknown keys {unknown}, missing keys {missing}")
    for key, (kind, low) in _SCHEMA.items():
        v = flat[key]
        ok = (isinstance(v, (int, float)) and not isinstance(v, bool) if kind is float
              else isinstance(v, kind) and not isinstance(v, bool))
        if not ok or (kind is not str and (not math.isfinite(v) or (low is not None and v < low))):
            want = kind.__name__ + (f" >= {low}" if low is not None else "")
            raise ValueError(f"budget file {path}: key {key!r} must be {want}, found {v!r}")
    f = flat
    return Budget(f["name"], f["matches"], f["seed"], float(f["target.gib"]),
                  f["target.hidden_copies"], f["target.extra_kv_heads"],
                  f["target.kv_bytes_per_token"], float(f["drafters.dflash.share_of_target"]),
                  float(f["drafters.mtp.target_layers"]),
                  float(f["drafters.draft_model.share_of_target"]),
                  f["drafters.draft_model.hidden_copies"], f["drafters.draft_model.layers"])


# --------------------------------------------------------------------------- the plan
def attn_bytes(s: Stack, qk_norm: bool = True) -> int:
    return 2 * (s.width * s.head_dim * 2 * (s.heads + s.kv_heads)
                + (2 * s.head_dim if qk_norm else 0))


def layer_bytes(s: Stack, norms: int = 2, qk_norm: bool = True) -> int:
    return attn_bytes(s, qk_norm) + 2 * (3 * s.width * s.intermediate + norms * s.width)


def _width_for(budget_bytes: float, fixed: int, per_unit: int, floor: int) -> int:
    """The widest MLP (a multiple of ROUND, at least `floor`) whose bytes fit."""
    fit = int((budget_bytes - fixed) // per_unit) // ROUND * ROUND
    return max(fit, floor)


@dataclass(frozen=True)
class Plan:
    target: Stack
    layers: int
    dflash: Stack
    dflash_layers: int
    mtp: Stack
    draft: Stack
    draft_layers: int
    target_bytes: float  # what was asked
    scale: float  # cube root of asked / budget bytes (1 at the budget's size)

    def to_dict(self) -> dict:
        return {k: (asdict(v) if isinstance(v, Stack) else v) for k, v in self.__dict__.items()}


def plan(budget: Budget, src: ModelConfig, drafters: dict, target_gib: float | None = None) -> Plan:
    """Shapes for the target and every drafter. `drafters` {name: (DrafterConfig, ModelConfig
    of its layers)} as `_sources` reads them."""
    gib = budget.target_gib if target_gib is None else target_gib
    asked = gib * GIB
    s = min(1.0, (gib / budget.target_gib) ** (1 / 3))
    kv = src.num_key_value_heads + budget.extra_kv_heads
    heads = kv * (src.num_attention_heads // src.num_key_value_heads)
    head_pairs(src.num_key_value_heads, heads, kv)  # refuses an odd count where twins need pairs
    head_pairs(0, heads, kv)
    per_layer_kv = 2 * kv * src.head_dim * 2  # bytes of K and V per token per layer, bf16
    layers = max(src.num_hidden_layers, round(budget.kv_bytes_per_token / per_layer_kv * s))
    V = src.vocab_size
    for copies in range(max(1, round(budget.hidden_copies * s)), 0, -1):
        t = Stack(src.hidden_size, copies, heads, kv, src.head_dim, 0)
        fixed = 2 * 2 * V * t.width + 2 * t.width + layers * layer_bytes(t)
        width = _width_for(asked, fixed, 2 * 3 * t.width * layers, 0)
        if width >= src.intermediate_size:
            break
    else:
        need = (2 * 2 * V * src.hidden_size + layers * layer_bytes(
            replace(t, copies=1, intermediate=src.intermediate_size))) / GIB
        raise ValueError(f"a target of {gib:g} GiB (--target-gib, else the budget's target.gib)"
                         f" is below the smallest stand-in of this checkpoint ({need:.3f} GiB: "
                         f"{layers} layers, hidden copies 1)")
    target = replace(t, intermediate=width)
    tbytes = fixed + 2 * 3 * target.width * width * layers

    dcfg, _ = drafters["dflash"]
    n = dcfg.num_hidden_layers
    d0 = replace(target, intermediate=0)
    fc = 2 * len(dcfg.target_layers) * target.width * target.width  # [D', layers * D']
    fixed = fc + 2 * 2 * target.width + n * layer_bytes(d0)
    dflash = replace(target, intermediate=_width_for(budget.dflash_share * tbytes, fixed,
                                                     2 * 3 * target.width * n,
                                                     dcfg.intermediate_size))
    mcfg, _ = drafters["mtp"]
    one_layer = layer_bytes(target)
    fixed = 2 * 2 * target.width * target.width + layer_bytes(d0, norms=1, qk_norm=False)
    mtp = replace(target, intermediate=_width_for(budget.mtp_target_layers * one_layer, fixed,
                                                  2 * 3 * target.width, mcfg.intermediate_size))
    _, dm = drafters["draft_model"]
    draft_layers = max(dm.num_hidden_layers, round(budget.draft_layers * s))
    copies = max(1, round(budget.draft_hidden_copies * s))
    dm0 = Stack(dm.hidden_size, copies, dm.num_attention_heads, dm.num_key_value_heads,
                dm.head_dim, 0)
    head_pairs(0, dm0.heads, dm0.kv_heads)
    fixed = 2 * 2 * V * dm0.width + 2 * dm0.width + draft_layers * layer_bytes(dm0)
    draft = replace(dm0, intermediate=_width_for(budget.draft_share * tbytes, fixed,
                                                 2 * 3 * dm0.width * draft_layers,
                                                 dm.intermediate_size))
    return Plan(target, layers, dflash, n, mtp, draft, draft_layers, asked, s)


# --------------------------------------------------------------------------- the sources
def _sources(checkpoint: Path) -> tuple[ModelConfig, dict, dict[str, str]]:
    """The target config, {name: (DrafterConfig, layer ModelConfig)} of the drafters a
    stand-in needs, and the sha256 of every file it reads."""
    cfg = ModelConfig.from_dict(json.loads((checkpoint / "config.json").read_text()))
    index = list_drafters(checkpoint)
    for name, method in (("dflash", "dflash"), ("mtp", "mtp"), ("draft_model", "draft_model")):
        if index.get(name) != method:
            raise ValueError(f"{checkpoint}: a stand-in needs a {method} drafter named {name!r}"
                             f" (drafters.json lists {index})")
    drafters = {}
    for name in index:
        d = read_drafter_config(checkpoint / name / "config.json")
        if d.method == "draft_model":
            lc = ModelConfig.from_dict(d.draft)
        else:
            lc = d.layer_config(cfg)
        drafters[name] = (d, lc)
    files = sorted(["config.json", "drafters.json", "model.safetensors",
                    *[f for f in TOKENIZER_FILES if (checkpoint / f).is_file()],
                    *[f"{n}/{f}" for n in index for f in ("config.json", "model.safetensors")]])
    return cfg, drafters, {f: file_sha256(checkpoint / f) for f in files}


def recipe(budget: Budget, budget_path: str, the_plan: Plan, shas: dict, device: str) -> dict:
    """What makes a stand-in what it is (its cell identity): no path, no time."""
    return {"format": FORMAT, "budget": asdict(budget), "budget_file": Path(budget_path).name,
            "plan": the_plan.to_dict(), "source_sha256": shas,
            "rng_device": torch.device(device).type}


# --------------------------------------------------------------------------- writing
def _config(src_config: dict, s: Stack, layers: int) -> dict:
    """A source Hugging Face config with the stack's shapes (head untied)."""
    return {**src_config, "hidden_size": s.width, "intermediate_size": s.intermediate,
            "num_hidden_layers": layers, "max_window_layers": layers,
            "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads,
            "tie_word_embeddings": False}


def _save(folder: Path, tensors: dict, config: dict | None = None,
          like: Path | None = None) -> Path:
    """Write `folder/model.safetensors` (and config.json); `like`, a file already written with
    the same tensors, is hard-linked instead (the engines' folders share a drafter's bytes:
    a 21-GiB stand-in's drafters would otherwise be written three times)."""
    folder.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    path = folder / "model.safetensors"
    if like is not None:
        os.link(like, path)
    else:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(path),
                  metadata={"format": "pt"})
    return path


def _stamp(folder: Path, rec: dict, part: str) -> None:
    """The folder's recipe and its files' sizes (identity.py reads it); written last."""
    files = {p.relative_to(folder).as_posix(): p.stat().st_size
             for p in sorted(folder.rglob("*")) if p.is_file() and p.name != RECIPE}
    (folder / RECIPE).write_text(json.dumps({"recipe": rec, "part": part, "files": files},
                                            indent=2) + "\n")


class _Writer:
    """One stand-in written into `root` (a temporary folder), component by component."""

    def __init__(self, checkpoint: Path, root: Path, the_plan: Plan, seed: int, device: str):
        self.ck, self.root, self.p, self.seed, self.device = checkpoint, root, the_plan, seed, device
        self.src_cfg = json.loads((checkpoint / "config.json").read_text())
        self.cfg = ModelConfig.from_dict(self.src_cfg)
        self.tcfg = ModelConfig.from_dict(_config(self.src_cfg, the_plan.target, the_plan.layers))
        self.tok = Tokenizer.load(checkpoint)
        self.sizes: dict[str, int] = {}
        self._n = 0

    def inflater(self, copies: int) -> Inflater:
        self._n += 1  # each component its own seeded stream, in _write_all's fixed order
        return Inflater(copies, self.seed * 1000 + self._n, self.device)

    def target(self) -> None:
        p, c = self.p, self.cfg
        sd = load_file(str(self.ck / "model.safetensors"))
        out = inflate_model(sd, p.target, p.layers, self.inflater(p.target.copies),
                            c.num_attention_heads, c.num_key_value_heads)
        folder = self.root / "target"
        _save(folder, out, _config(self.src_cfg, p.target, p.layers))
        for f in TOKENIZER_FILES:
            if (self.ck / f).is_file():
                shutil.copy2(self.ck / f, folder / f)
        self.sizes["target"] = nbytes(out)

    def block_drafter(self, name: str, dcfg, lcfg: ModelConfig, trunk: dict | None) -> dict:
        """A block drafter's own tensors (the embedded layout) and, for the engines, all of
        them (a light drafter's trunk, the inflated trunk drafter's, copied in)."""
        p = self.p
        sd = load_file(str(self.ck / name / "model.safetensors"))
        inf = self.inflater(p.target.copies)
        first = dcfg.trunk["layers"] if dcfg.trunk else 0
        own = inflate_stack(sd, p.dflash, dcfg.num_hidden_layers, inf, lcfg.num_attention_heads,
                            lcfg.num_key_value_heads, prefix="layers.", first_layer=first)
        own["norm.weight"] = inf.tile(sd["norm.weight"]).cpu()
        if not dcfg.trunk:
            own["fc.weight"] = inflate_readers(sd["fc.weight"], len(dcfg.target_layers), inf)
            own["hidden_norm.weight"] = inf.tile(sd["hidden_norm.weight"]).cpu()
        cfg = replace(dcfg, intermediate_size=p.dflash.intermediate)
        if dcfg.trunk:
            cfg = replace(cfg, trunk={**dcfg.trunk, "intermediate_size": p.dflash.intermediate})
        self._embedded(name, cfg, own)
        full = dict(own)
        if trunk is not None:
            full.update({k: v for k, v in trunk.items()
                         if k.split(".")[0] in ("fc", "hidden_norm")
                         or (k.startswith("layers.") and int(k.split(".")[1]) < first)})
        n = first + dcfg.num_hidden_layers
        mask = self.tok.tok.id_to_token(dcfg.mask_token_id)
        like = None if dcfg.trunk else self.root / "target" / name / "model.safetensors"
        for engine in ("vllm", "sglang"):  # one tensor set for both engines
            like = self._engine(engine, name, dflash_config(
                self.tcfg, cfg, n, p.dflash.intermediate, mask), full, like)
        self.sizes[name] = nbytes(full)
        return own

    def eagle(self, name: str, dcfg, lcfg: ModelConfig) -> None:
        p = self.p
        sd = load_file(str(self.ck / name / "model.safetensors"))
        inf = self.inflater(p.target.copies)
        out = inflate_stack(sd, p.mtp, 1, inf, lcfg.num_attention_heads,
                            lcfg.num_key_value_heads, prefix="layers.", qk_norm=False)
        out["fc.weight"] = inflate_readers(sd["fc.weight"], 2, inf)  # [emb; hidden]
        self._embedded(name, replace(dcfg, intermediate_size=p.mtp.intermediate), out)
        for engine in ("vllm", "sglang"):
            tensors, like = dict(out), self.root / "target" / name / "model.safetensors"
            if engine == "sglang":  # its fc has a bias (drafters.py)
                tensors["fc.bias"] = torch.zeros(p.target.width, dtype=torch.bfloat16)
                like = None
            self._engine(engine, name, eagle_config(self.tcfg, p.mtp.intermediate, engine),
                         tensors, like)
        self.sizes[name] = nbytes(out)

    def draft_model(self, name: str, dcfg, lcfg: ModelConfig) -> None:
        p = self.p
        sd = load_file(str(self.ck / name / "model.safetensors"))
        out = inflate_model(sd, p.draft, p.draft_layers, self.inflater(p.draft.copies),
                            lcfg.num_attention_heads, lcfg.num_key_value_heads)
        src = json.loads((self.ck / name / "config.json").read_text())
        config = _config(src, p.draft, p.draft_layers)
        draft = {**dcfg.draft, "hidden_size": p.draft.width, "intermediate_size":
                 p.draft.intermediate, "num_hidden_layers": p.draft_layers,
                 "tie_word_embeddings": False}
        config["specrepro_drafter"] = replace(dcfg, draft=draft).to_dict()
        folder = self.root / "target" / name
        _save(folder, out, config)
        for f in TOKENIZER_FILES:
            if (self.ck / name / f).is_file():
                shutil.copy2(self.ck / name / f, folder / f)
        self.sizes[name] = nbytes(out)

    def _embedded(self, name: str, cfg, tensors: dict) -> None:
        """The embedded engine's layout: `target/<name>/` as checkpoint.save_drafters writes."""
        meta = {"specrepro_drafter": cfg.to_dict(), "target_hidden_size": self.p.target.width}
        _save(self.root / "target" / name, tensors, meta)

    def _engine(self, engine: str, name: str, config: dict, tensors: dict,
                like: Path | None = None) -> Path:
        return _save(self.root / engine / name, tensors, config, like)


def _write_all(checkpoint: Path, root: Path, the_plan: Plan, drafters: dict, seed: int,
               device: str) -> dict[str, int]:
    w = _Writer(checkpoint, root, the_plan, seed, device)
    w.target()
    trunks: dict[str, dict] = {}
    order = sorted(drafters, key=lambda n: bool(drafters[n][0].trunk))  # trunks first
    for name in order:
        dcfg, lcfg = drafters[name]
        if dcfg.method == "dflash":
            trunk = trunks.get(dcfg.trunk["drafter"]) if dcfg.trunk else None
            if dcfg.trunk and trunk is None:
                raise ValueError(f"drafter {name!r}: its trunk {dcfg.trunk['drafter']!r} is not"
                                 " a block drafter of this checkpoint")
            own = w.block_drafter(name, dcfg, lcfg, trunk)
            trunks[name] = own
        elif dcfg.method == "mtp":
            if dcfg.layout != "eagle":
                raise ValueError(f"drafter {name!r}: layout {dcfg.layout!r}; the stand-in "
                                 "exports MTP heads in the engines' EAGLE-1 layout only")
            w.eagle(name, dcfg, lcfg)
        else:
            w.draft_model(name, dcfg, lcfg)
    (root / "target" / "drafters.json").write_text(
        json.dumps({n: drafters[n][0].method for n in drafters}, indent=2) + "\n")
    return w.sizes


def is_current(out: Path, rec: dict) -> bool:
    """Whether `out` holds a complete stand-in of exactly this recipe (sizes as recorded)."""
    try:
        meta = json.loads((out / RECIPE).read_text())
        parts = [json.loads(p.read_text()) for p in out.glob(f"*/**/{RECIPE}")]
    except (OSError, ValueError):
        return False
    return meta.get("recipe") == rec and bool(parts) and all(
        (out / m["part"] / f).is_file() and (out / m["part"] / f).stat().st_size == n
        for m in parts for f, n in m["files"].items())


def export_standin(out: str | Path, target_gib: float | None = None,
                   budget_path: str | Path = DEFAULT_BUDGET,
                   checkpoint: str | Path = "models/embedded", device: str = "cpu",
                   seed: int | None = None, force: bool = False) -> dict:
    """Write the stand-in into `out` (see the module docstring); returns its summary (the
    recipe, the sizes, whether it was written). Everything is checked before anything is
    written; the folder appears whole or not at all."""
    out, checkpoint = Path(out), Path(checkpoint)
    budget = load_budget(budget_path)
    if seed is not None:
        budget = replace(budget, seed=seed)
    if not (checkpoint / "config.json").is_file():
        raise ValueError(f"{checkpoint}: not an embedded checkpoint (no config.json)")
    src, drafters, shas = _sources(checkpoint)
    the_plan = plan(budget, src, drafters, target_gib)
    rec = recipe(budget, str(budget_path), the_plan, shas, device)
    if not force and is_current(out, rec):
        meta = json.loads((out / RECIPE).read_text())
        return {**meta, "written": False}
    with new_folder(out) as tmp:
        t0 = time.monotonic()
        sizes = _write_all(checkpoint, tmp, the_plan, drafters, budget.seed, device)
        for part in sorted({p.parent for p in tmp.glob("*/*/model.safetensors")}
                           | {tmp / "target"}):
            _stamp(part, rec, part.relative_to(tmp).as_posix())
        meta = {"recipe": rec, "bytes": sizes, "seconds": round(time.monotonic() - t0, 1),
                "table": budget_table(budget, the_plan, sizes)}
        (tmp / RECIPE).write_text(json.dumps(meta, indent=2) + "\n")
    return {**meta, "written": True}


# --------------------------------------------------------------------------- the table
def budget_table(budget: Budget, p: Plan, sizes: dict[str, int]) -> list[dict]:
    """One row per component: its shape, bytes, share of the target and what it stands for."""
    t = sizes["target"]
    kv = 2 * p.layers * p.target.kv_heads * p.target.head_dim * 2
    rows = [{"component": "target", "shape": _shape(p.target, p.layers),
             "bytes": t, "share_of_target": 1.0,
             "priced_as": f"{budget.target_gib:g} GiB asked ({p.target_bytes / GIB:.3f} at this "
                          f"size); KV {kv:,} B/token against {budget.kv_bytes_per_token:,}"}]
    asked = {"dflash": f"{budget.dflash_share:.0%} of the target (article B: 3.6 of ~24 GiB)",
             "mtp": f"{budget.mtp_target_layers:g} target layer(s) per re-run",
             "draft_model": f"{budget.draft_share:.1%} of the target"}
    stacks = {"mtp": (p.mtp, 1), "draft_model": (p.draft, p.draft_layers),
              "dflash": (p.dflash, p.dflash_layers)}
    for name, n in sizes.items():
        if name == "target":
            continue
        stack, layers = stacks.get(name, (p.dflash, None))
        rows.append({"component": name, "shape": _shape(stack, layers), "bytes": n,
                     "share_of_target": n / t,
                     "priced_as": asked.get(name, "its trunk's block drafter's layers")})
    return rows


def _shape(s: Stack, layers: int | None) -> str:
    head = f"{layers} layers, " if layers else ""
    return (f"{head}hidden {s.hidden}x{s.copies}={s.width}, MLP {s.intermediate}, "
            f"heads {s.heads}/{s.kv_heads}x{s.head_dim}")


def format_table(rows: list[dict]) -> str:
    lines = ["| component | shape | bytes | GiB | share of target | priced as |",
             "| --- | --- | ---: | ---: | ---: | --- |"]
    lines += [f"| {r['component']} | {r['shape']} | {r['bytes']:,} | {r['bytes'] / GIB:.3f} | "
              f"{r['share_of_target']:.1%} | {r['priced_as']} |" for r in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="specrepro export-standin",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the stand-in's folder (target/, vllm/, sglang/)")
    ap.add_argument("--target-gib", type=float, default=None,
                    help="the target's bytes in GiB (default: the budget file's)")
    ap.add_argument("--budget", default=DEFAULT_BUDGET, help="the budget file (params/standin/)")
    ap.add_argument("--checkpoint", default="models/embedded", help="the source checkpoint")
    ap.add_argument("--device", default="cpu", help="where the random parts are drawn (cuda: "
                    "fast; the bytes differ from a CPU draw, the function does not)")
    ap.add_argument("--seed", type=int, default=None, help="override the budget's seed")
    ap.add_argument("--force", action="store_true", help="rewrite a current stand-in")
    args = ap.parse_args(argv)
    if args.target_gib is not None and not (args.target_gib > 0 and math.isfinite(args.target_gib)):
        print(f"specrepro export-standin: --target-gib must be a positive number, got "
              f"{args.target_gib}", file=sys.stderr)
        return 2
    try:
        meta = export_standin(args.out, args.target_gib, args.budget, args.checkpoint,
                              args.device, args.seed, args.force)
    except (FileNotFoundError, ValueError) as e:
        print(f"specrepro export-standin: {e}", file=sys.stderr)
        return 2
    what = f"wrote {args.out} in {meta['seconds']} s" if meta["written"] else f"{args.out} is current"
    print(f"{what}: a stand-in, not a trained 27B model (budget {meta['recipe']['budget_file']})")
    print(format_table(meta["table"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
