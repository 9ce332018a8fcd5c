"""Load and save the embedded checkpoint: the target, its tokenizer and its drafters.

Layout of a checkpoint directory (the target is a Hugging Face Qwen3 checkpoint):

    config.json  model.safetensors  generation_config.json
    tokenizer.json  tokenizer_config.json  special_tokens_map.json
    drafters.json            {name: method} of the drafters below
    <name>/config.json       {"specrepro_drafter": DrafterConfig, ...}; for the draft
    <name>/model.safetensors model also a Hugging Face config (an assistant model)
    MODEL_CARD.md

Design:
- Weights are stored in bf16 (the size budget) and loaded in the dtype asked for.
  Tied embeddings are stored once (`model.embed_tokens.weight`), as transformers does.
- The MTP head and block drafter borrow the target's embedding and output head, so
  `load_proposer` takes the loaded target. A light block drafter on a trunk (proposers/dflash.py)
  stores only its own tensors; the trunk's come from the trunk drafter's folder.
- `build_random_checkpoint` writes a tiny, randomly initialised, complete
  checkpoint in about a second, for other modules' tests; its tokenizer is trained on fixed
  standard-library files, so the checkpoint does not change when this package's code does.
- `load_target` builds the model on the meta device and assigns the file's tensors, read
  onto the target device: a 21-GiB stand-in costs its bytes once, with no random init.
- Imports torch, safetensors, tokenizers, jinja2 only.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specrepro.embedded.model import ModelConfig, Qwen3Model
from specrepro.embedded.proposers import PROPOSERS, DrafterConfig, Proposer, build_proposer
from specrepro.embedded.tokenizer import Tokenizer, train_bpe
from specrepro.speculative import MODEL_METHODS

DRAFTER_KEY = "specrepro_drafter"


def _tensors(module: torch.nn.Module, dtype: torch.dtype, skip: tuple[str, ...] = ()) -> dict:
    return {k: v.detach().to(dtype).contiguous().cpu() for k, v in module.state_dict().items()
            if k not in skip}


def _load_into(module: torch.nn.Module, path: Path, allow_missing: tuple[str, ...] = (),
               borrowed: dict[str, torch.Tensor] | None = None) -> None:
    """Load `path` (plus `borrowed` tensors read elsewhere: a light drafter's trunk) strictly."""
    state = {**(borrowed or {}), **load_file(str(path))}
    missing, unexpected = module.load_state_dict(state, strict=False)
    missing = [k for k in missing if k not in allow_missing]
    if missing or unexpected:
        what = f"{path} with its trunk" if borrowed else f"{path}"
        raise ValueError(f"{what}: missing tensors {missing}, unexpected {unexpected}")


def _tied_skip(cfg: ModelConfig) -> tuple[str, ...]:
    return ("lm_head.weight",) if cfg.tie_word_embeddings else ()


def save_hf_model(directory: Path, model: Qwen3Model, tokenizer: Tokenizer,
                  dtype: torch.dtype = torch.bfloat16, extra_config: dict | None = None) -> None:
    """A Hugging Face Qwen3ForCausalLM folder (config, weights, tokenizer, generation)."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg = {**model.config.to_hf_config(), "torch_dtype": str(dtype).removeprefix("torch."),
           "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.eos_token_id,
           **(extra_config or {})}
    (directory / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(_tensors(model, dtype, _tied_skip(model.config)),
              str(directory / "model.safetensors"), metadata={"format": "pt"})
    gen = {"bos_token_id": None, "eos_token_id": tokenizer.stop_token_ids(),
           "pad_token_id": tokenizer.eos_token_id, "do_sample": False}
    (directory / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    tokenizer.save(directory)


def save_checkpoint(directory: str | Path, target: Qwen3Model, tokenizer: Tokenizer,
                    proposers: dict[str, Proposer], card: str | None = None,
                    dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the target, tokenizer and each drafter (in subfolder `name`)."""
    d = Path(directory)
    save_hf_model(d, target, tokenizer, dtype)
    save_drafters(d, target, tokenizer, proposers, dtype)
    if card is not None:
        (d / "MODEL_CARD.md").write_text(card)
    return d


def save_drafters(directory: str | Path, target: Qwen3Model, tokenizer: Tokenizer,
                  proposers: dict[str, Proposer], dtype: torch.dtype = torch.bfloat16,
                  add: bool = False) -> None:
    """Write each drafter in subfolder `name` and the index; `add` keeps the drafters the
    index already lists (a drafter added to a trained checkpoint)."""
    d = Path(directory)
    index = list_drafters(d) if add else {}
    for name, prop in proposers.items():
        sub = d / name
        sub.mkdir(parents=True, exist_ok=True)
        meta = {DRAFTER_KEY: prop.cfg.to_dict()}
        if prop.method == "draft_model":
            save_hf_model(sub, prop.model, tokenizer, dtype, extra_config=meta)
        else:
            meta["target_hidden_size"] = target.config.hidden_size
            (sub / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
            skip = tuple(prop.trunk_names()) if hasattr(prop, "trunk_names") else ()
            save_file(_tensors(prop, dtype, skip), str(sub / "model.safetensors"),
                      metadata={"format": "pt"})
        index[name] = prop.method
    (d / "drafters.json").write_text(json.dumps(index, indent=2) + "\n")


@contextlib.contextmanager
def _no_init_fills():
    """torch.nn.init's fills as no-ops while a model is built on the meta device, whose
    values the checkpoint's tensors replace anyway: a meta tensor's `normal_` (nn.Embedding's
    init) goes through torch._refs, whose first call imports torch._dynamo, about 3 s of an
    engine's start on a CPU, and nothing else the engine does imports it."""
    names = ("normal_", "uniform_", "kaiming_uniform_", "trunc_normal_", "xavier_uniform_")
    saved = {name: getattr(torch.nn.init, name) for name in names}
    try:
        for name in names:
            setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


def load_target(directory: str | Path, device="cpu",
                dtype: torch.dtype = torch.float32) -> tuple[Qwen3Model, Tokenizer]:
    d = Path(directory)
    if not (d / "config.json").is_file():
        raise FileNotFoundError(f"no config.json in {d}: not an embedded checkpoint")
    cfg = ModelConfig.from_dict(json.loads((d / "config.json").read_text()))
    # Built on the meta device and given the file's tensors, read straight onto `device`: no
    # random init and no second copy, so a 21-GiB stand-in (tools/export/standin.py) costs its
    # bytes once on the GPU and nothing on the host; converted tensor by tensor (a CPU fp32
    # load peaks at the fp32 model plus one bf16 tensor).
    with torch.device("meta"), _no_init_fills():
        model = Qwen3Model(cfg)
    state = load_file(str(d / "model.safetensors"), device=str(torch.device(device)))
    for key in list(state):
        state[key] = state[key].to(dtype)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if k not in _tied_skip(cfg)]
    if missing or unexpected:
        raise ValueError(f"{d / 'model.safetensors'}: missing tensors {missing}, unexpected "
                         f"{unexpected}")
    if cfg.tie_word_embeddings:  # assign replaced the embedding: tie the head to it again
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval(), Tokenizer.load(d)


def list_drafters(directory: str | Path) -> dict[str, str]:
    """{name: method} of the drafters stored in a checkpoint."""
    path = Path(directory) / "drafters.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def read_drafter_config(cfg_path: Path) -> DrafterConfig:
    """The DrafterConfig a drafter folder's config.json stores (its weights are not read)."""
    raw = json.loads(Path(cfg_path).read_text())
    if DRAFTER_KEY not in raw:
        raise ValueError(f"{cfg_path}: no {DRAFTER_KEY!r} key")
    return DrafterConfig.from_dict(raw[DRAFTER_KEY])


def load_proposer(directory: str | Path, method: str, target: Qwen3Model, device=None,
                  dtype: torch.dtype | None = None, name: str | None = None) -> Proposer:
    """The drafter stored in subfolder `name` (default: the method's name) of `directory`.
    Device and dtype default to the target's. In a checkpoint (a directory with drafters.json)
    the drafter must be listed there: a folder a rebuild left behind sat on the old weights."""
    if method not in MODEL_METHODS:  # the methods with stored weights
        raise ValueError(f"unknown drafter method {method!r}; expected one of "
                         f"{sorted(MODEL_METHODS)}")
    sub = Path(directory) / (name or method)
    cfg_path = sub / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"no drafter {name or method!r} in {directory} ({cfg_path} missing;"
                                f" stored: {list_drafters(directory)})")
    index = Path(directory) / "drafters.json"
    if index.is_file() and (name or method) not in list_drafters(directory):
        raise ValueError(f"drafter folder {sub} is not listed in {index} (stored:"
                         f" {list_drafters(directory)}): a leftover of an earlier build, trained"
                         " on other weights; rebuild it (`make models`) or remove it")
    cfg = read_drafter_config(cfg_path)
    if cfg.method != method:
        raise ValueError(f"{cfg_path}: drafter is {cfg.method!r}, asked for {method!r}")
    prop = PROPOSERS[method](cfg, target.config, target)
    if method == "draft_model":
        _load_into(prop.model, sub / "model.safetensors", _tied_skip(prop.model_cfg))
    else:
        borrowed = _trunk_state(directory, cfg, cfg_path, prop.trunk_names()) if cfg.trunk else None
        _load_into(prop, sub / "model.safetensors", borrowed=borrowed)
    ref = next(target.parameters())
    return prop.to(device=device or ref.device, dtype=dtype or ref.dtype).eval()


def _trunk_state(directory, cfg: DrafterConfig, cfg_path: Path,
                 keys: list[str]) -> dict[str, torch.Tensor]:
    """The tensors a light block drafter borrows from its trunk drafter's file, after checking
    that the trunk is a block drafter of the same shape and layout (context layers, block,
    mask, width)."""
    name = cfg.trunk["drafter"]
    tpath = Path(directory) / name / "config.json"
    if not tpath.is_file():
        raise FileNotFoundError(f"{cfg_path}: trunk.drafter {name!r} is not stored in "
                                f"{directory} ({tpath} missing)")
    tcfg = DrafterConfig.from_dict(json.loads(tpath.read_text())[DRAFTER_KEY])
    wrong = [f"{key} {mine!r} != {theirs!r}" for key, mine, theirs in (
        ("method", "dflash", tcfg.method),
        ("target_layers", cfg.target_layers, tcfg.target_layers),
        ("block_size", cfg.block_size, tcfg.block_size),
        ("block", cfg.block, tcfg.block),
        ("mask_token_id", cfg.mask_token_id, tcfg.mask_token_id),
        ("trunk.intermediate_size", cfg.trunk["intermediate_size"], tcfg.intermediate_size))
        if mine != theirs]
    if cfg.trunk["layers"] > tcfg.num_hidden_layers:
        wrong.append(f"trunk.layers {cfg.trunk['layers']} > its {tcfg.num_hidden_layers} layers")
    if tcfg.trunk:
        wrong.append("the trunk has a trunk itself")
    if wrong:
        raise ValueError(f"{cfg_path}: trunk drafter {name!r} ({tpath}) does not fit: "
                         + "; ".join(wrong))
    return {k: v for k, v in load_file(str(Path(directory) / name / "model.safetensors")).items()
            if k in keys}


# --------------------------------------------------------------------------- tiny checkpoint
TINY_TARGET = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   max_position_embeddings=4096)
TINY_DRAFTERS = {
    "mtp": DrafterConfig("mtp", 1, 128),
    "dflash": DrafterConfig("dflash", 2, 128, target_layers=(0, 2, 3)),
    # a light block drafter on the one above: its first layer, then one narrower own layer
    "dflash_light": DrafterConfig("dflash", 1, 64, target_layers=(0, 2, 3),
                                  trunk={"drafter": "dflash", "layers": 1,
                                         "intermediate_size": 128}),
    "draft_model": DrafterConfig("draft_model", draft=dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16)),
}


# Fixed standard-library sources (about 260 KB): the tiny tokenizer, and with it every test's
# random checkpoint, must not change when this package's own files do (it was trained on them,
# so adding a module reshuffled the vocabulary and moved NVFP4 near-ties in the lossless test).
TINY_TOKENIZER_SOURCES = ("textwrap.py", "string.py", "json/decoder.py", "json/encoder.py",
                          "argparse.py", "dataclasses.py", "functools.py")


def tiny_tokenizer_texts() -> list[str]:
    """Deterministic text for a tiny tokenizer: fixed files of the standard library."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [(stdlib / name).read_text() for name in TINY_TOKENIZER_SOURCES]


def build_random_checkpoint(directory: str | Path, seed: int = 0,
                            target: dict | None = None) -> Path:
    """A complete, randomly initialised tiny checkpoint (CPU, about a second)."""
    torch.manual_seed(seed)
    tok = train_bpe(tiny_tokenizer_texts(), vocab_size=(target or TINY_TARGET)["vocab_size"])
    cfg = ModelConfig(**{**TINY_TARGET, **(target or {}), "vocab_size": tok.vocab_size,
                         "eos_token_id": tok.eos_token_id})
    model = Qwen3Model(cfg)
    model.init_weights(std=0.1)
    props = {name: build_proposer(c, model) for name, c in TINY_DRAFTERS.items()}
    for c, prop in zip(TINY_DRAFTERS.values(), props.values()):
        if c.trunk:
            prop.init_from_trunk(props[c.trunk["drafter"]].state_dict())
    card = "# Random tiny checkpoint\n\nBuilt by `build_random_checkpoint` for tests.\n"
    return save_checkpoint(directory, model, tok, props, card)
