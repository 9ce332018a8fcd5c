"""The exporter (tools/export/drafters.py): the checkpoint's drafters in the folders vLLM 0.26.0 and
SGLang 0.5.14 load. The key and tensor lists below are docs/engine-layouts.md's (read from the
engines' wheels), written out here independently of the module. On a tiny checkpoint with
engine-layout drafters: tensors equal to the source's, exactly the engines' names and config keys,
a padded light drafter computing the same logits, the EAGLE head held to transformers' Llama
layer, the refusals, staleness and the command line."""

import json
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from torch import nn
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from specrepro import cli
from specrepro.embedded.checkpoint import (
    build_random_checkpoint,
    load_proposer,
    load_target,
    save_drafters,
)
from specrepro.embedded.proposers import DrafterConfig, build_proposer
from specrepro.tools.export import drafters

pytestmark = pytest.mark.usefixtures("one_torch_thread")

L = 4  # TINY_TARGET's layers: engine ids <= L-2 = 2
ENGINE = {"mask_token_id": 1, "block": "engine"}  # <|im_start|>, blocks of 1 + k
GOOD = {
    "dflash_engine": DrafterConfig("dflash", 2, 128, target_layers=(0, 1, 2), **ENGINE),
    # the trunk's layer 0 (128 wide), then one own layer 64 wide: exported padded to 128
    "light_engine": DrafterConfig("dflash", 1, 64, target_layers=(0, 1, 2), **ENGINE,
                                  trunk={"drafter": "dflash_engine", "layers": 1,
                                         "intermediate_size": 128}),
    "eagle": DrafterConfig("mtp", 1, 128, layout="eagle"),
}
BAD = {  # one defect each, besides the stock `dflash` and `mtp` (today's layouts)
    "bad_last_layer": (DrafterConfig("dflash", 1, 64, target_layers=(0, 1, 3), **ENGINE),
                       r"'target_layers' \[0, 1, 3\] must lie in 0\.\.2"),
    "bad_fixed": (DrafterConfig("dflash", 1, 64, target_layers=(0, 1, 2), mask_token_id=1),
                  "'block' is 'fixed'"),
    "bad_mask": (DrafterConfig("dflash", 1, 64, target_layers=(0, 1, 2), block="engine"),
                 "'mask_token_id' is null"),
    "bad_order": (DrafterConfig("dflash", 1, 64, target_layers=(2, 0, 1), **ENGINE),
                  "must be strictly ascending"),
    "mtp": (None, "'layout' is 'deepseek'"),
}

# --- docs/engine-layouts.md: tensor names (no `model.` prefix, no embed_tokens / lm_head /
# mask_embedding; the same set for both engines' DFlash loaders, §1 and §2 "Tensor names")
DFLASH_LAYER = ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj",
                "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm",
                "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def dflash_names(n: int) -> set[str]:
    return {"fc.weight", "hidden_norm.weight", "norm.weight"} | {
        f"layers.{i}.{t}.weight" for i in range(n) for t in DFLASH_LAYER}


# §3 (vLLM llama_eagle.py): fc without bias, layer 0 without input_layernorm, no final norm
VLLM_EAGLE_NAMES = {"fc.weight"} | {f"layers.0.{t}.weight" for t in (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "post_attention_layernorm")}
SGLANG_EAGLE_NAMES = VLLM_EAGLE_NAMES | {"fc.bias"}  # §4: SGLang's fc has a bias: zeros

# --- docs/engine-layouts.md: config keys each loader reads (plus the checklist's)
# §1 vLLM DFlash "config.json keys read"
VLLM_DFLASH_KEYS = {"architectures", "model_type", "dflash_config", "hidden_size",
                    "num_attention_heads", "num_key_value_heads", "head_dim",
                    "max_position_embeddings", "rms_norm_eps", "attention_bias",
                    "intermediate_size", "hidden_act", "rope_parameters", "num_hidden_layers",
                    "vocab_size"}
VLLM_DFLASH_CONFIG_KEYS = {"target_layer_ids", "mask_token_id"}
# §2 SGLang DFlash "config.json keys read"
SGLANG_DFLASH_KEYS = {"architectures", "dflash_config", "num_hidden_layers", "hidden_size",
                      "num_attention_heads", "num_key_value_heads", "head_dim", "attention_bias",
                      "rms_norm_eps", "intermediate_size", "hidden_act", "rope_parameters",
                      "rope_theta", "max_position_embeddings"}
SGLANG_DFLASH_CONFIG_KEYS = {"target_layer_ids", "num_target_layers", "block_size",
                             "mask_token_id", "mask_token"}
# "What the exporter must write", DFlash
CHECKLIST_DFLASH_KEYS = {"tie_word_embeddings", "num_target_layers", "block_size",
                         "rope_theta", "torch_dtype"}
# §3 vLLM EAGLE "Config keys" (Llama layer and model) and the checklist
VLLM_EAGLE_KEYS = {"architectures", "model_type", "hidden_size", "num_attention_heads",
                   "num_key_value_heads", "head_dim", "max_position_embeddings",
                   "attention_bias", "rope_parameters", "rope_theta", "intermediate_size",
                   "hidden_act", "mlp_bias", "rms_norm_eps", "num_hidden_layers", "vocab_size",
                   "tie_word_embeddings"}
# §4 SGLang EAGLE (LlamaForCausalLMEagle: the Llama layer's keys; tie_word_embeddings false)
SGLANG_EAGLE_KEYS = VLLM_EAGLE_KEYS
KEYS = {("vllm", "dflash"): VLLM_DFLASH_KEYS | CHECKLIST_DFLASH_KEYS,
        ("sglang", "dflash"): SGLANG_DFLASH_KEYS | CHECKLIST_DFLASH_KEYS,
        ("vllm", "mtp"): VLLM_EAGLE_KEYS, ("sglang", "mtp"): SGLANG_EAGLE_KEYS}
FORBIDDEN_KEYS = {"eagle_aux_hidden_state_layer_ids", "layer_types"}  # §1: override / causal


def _randomize(prop, seed: int) -> None:
    """Distinct values in every trainable parameter (norms near 1), so a swapped name shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in prop.named_parameters():
            if p.requires_grad:  # a light drafter's borrowed trunk stays the trunk's
                p.copy_(torch.randn(p.shape, generator=g) * 0.1
                        + (1.0 if name.endswith("norm.weight") else 0.0))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = build_random_checkpoint(tmp_path_factory.mktemp("export_ckpt"), seed=3)
    target, tok = load_target(d)
    props = {}
    for i, (name, cfg) in enumerate({**GOOD, **{n: c for n, (c, _) in BAD.items() if c}}.items()):
        props[name] = build_proposer(cfg, target)
        if cfg.trunk:
            props[name].init_from_trunk(props[cfg.trunk["drafter"]].state_dict())
        _randomize(props[name], i)
    save_drafters(d, target, tok, {n: p.eval() for n, p in props.items()}, add=True)
    return d


@pytest.fixture(scope="module")
def out(ckpt, tmp_path_factory):
    root = tmp_path_factory.mktemp("export_out")
    folders = drafters.export_drafters(ckpt, root, names=list(GOOD))
    assert set(folders) == {(e, n) for e in ("vllm", "sglang") for n in GOOD}
    return root


def _files(folder):
    return json.loads((folder / "config.json").read_text()), load_file(
        str(folder / "model.safetensors"))


# --------------------------------------------------------------------------- tensors
def test_tensor_names_are_exactly_each_engine_s_set_in_bf16(out):
    expected = {("vllm", "dflash_engine"): dflash_names(2),
                ("vllm", "light_engine"): dflash_names(2),  # trunk layer 0 + own layer 1
                ("vllm", "eagle"): VLLM_EAGLE_NAMES, ("sglang", "eagle"): SGLANG_EAGLE_NAMES}
    for engine in ("vllm", "sglang"):
        for name in GOOD:
            _, t = _files(out / engine / name)
            assert set(t) == expected.get((engine, name), expected["vllm", name]), (engine, name)
            assert {v.dtype for v in t.values()} == {torch.bfloat16}


def test_exported_tensors_equal_the_source_s(ckpt, out):
    src = load_file(str(ckpt / "dflash_engine" / "model.safetensors"))
    for engine in ("vllm", "sglang"):
        _, t = _files(out / engine / "dflash_engine")
        assert all(torch.equal(t[k], src[k]) for k in src if k in t)
        assert set(src) - set(t) == set()  # no mask tensor in this layout, nothing left out
    # the light drafter: the trunk's fc, hidden_norm and layer 0, its own layer 1 and norm with
    # the MLP zero-padded from 64 to 128 units
    own = load_file(str(ckpt / "light_engine" / "model.safetensors"))
    assert set(own) == {k for k in dflash_names(2) if k.startswith(("layers.1.", "norm."))}
    _, t = _files(out / "sglang" / "light_engine")
    for k in dflash_names(2):
        if k.startswith(("fc.", "hidden_norm.", "layers.0.")):
            assert torch.equal(t[k], src[k]), k
        elif k.endswith(("gate_proj.weight", "up_proj.weight")):
            assert own[k].shape == (64, 64) and t[k].shape == (128, 64)
            assert torch.equal(t[k][:64], own[k]) and not t[k][64:].any(), k
        elif k.endswith("down_proj.weight"):
            assert own[k].shape == (64, 64) and t[k].shape == (64, 128)
            assert torch.equal(t[k][:, :64], own[k]) and not t[k][:, 64:].any(), k
        else:
            assert torch.equal(t[k], own[k]), k
    head = load_file(str(ckpt / "eagle" / "model.safetensors"))
    for engine in ("vllm", "sglang"):
        _, t = _files(out / engine / "eagle")
        assert all(torch.equal(t[k], head[k]) for k in head) and set(head) == VLLM_EAGLE_NAMES
    assert torch.equal(t["fc.bias"], torch.zeros(64, dtype=torch.bfloat16))


# --------------------------------------------------------------------------- configs
def test_configs_carry_every_key_each_engine_s_loader_reads(ckpt, out):
    tcfg = json.loads((ckpt / "config.json").read_text())
    for engine in ("vllm", "sglang"):
        for name, cfg in GOOD.items():
            c, _ = _files(out / engine / name)
            missing = KEYS[engine, cfg.method] - set(c)
            assert not missing, (engine, name, missing)
            assert not FORBIDDEN_KEYS & set(c)
            for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                        "rms_norm_eps", "vocab_size", "max_position_embeddings"):
                assert c[key] == tcfg[key], key
            assert (c["hidden_act"], c["attention_bias"], c["tie_word_embeddings"],
                    c["torch_dtype"]) == ("silu", False, False, "bfloat16")
            assert c["rope_theta"] == c["rope_parameters"]["rope_theta"] == tcfg["rope_theta"]
            assert c["rope_parameters"]["rope_type"] == "default"
            if cfg.method == "dflash":
                dc = c["dflash_config"]
                assert VLLM_DFLASH_CONFIG_KEYS | SGLANG_DFLASH_CONFIG_KEYS <= set(dc)
                assert "causal" not in dc
                assert (c["architectures"], c["model_type"]) == (["DFlashDraftModel"], "qwen3")
                assert dc == {"target_layer_ids": [0, 1, 2], "mask_token_id": 1,
                              "mask_token": "<|im_start|>", "block_size": 8,
                              "num_target_layers": L}
                assert (c["num_hidden_layers"], c["intermediate_size"], c["num_target_layers"],
                        c["block_size"]) == (2, 128, L, 8)
                # vLLM reads it with AutoConfig (model_type qwen3), keeping the extra keys
                hf = transformers.AutoConfig.from_pretrained(out / engine / name)
                assert hf.dflash_config["target_layer_ids"] == [0, 1, 2]
            else:
                arch = "LlamaForCausalLM" if engine == "vllm" else "LlamaForCausalLMEagle"
                assert (c["architectures"], c["model_type"]) == ([arch], "llama")
                assert (c["num_hidden_layers"], c["intermediate_size"], c["mlp_bias"]) == (
                    1, 128, False)


def test_draft_model_is_not_exported_and_every_drafter_is_checked_before_writing(ckpt,
                                                                                  tmp_path):
    assert "draft_model" not in drafters.exportable(ckpt)
    with pytest.raises(ValueError, match="'draft_model' .* not exported"):
        drafters.export_drafters(ckpt, tmp_path / "o", names=["draft_model"])
    # names=None: every stored dflash/mtp drafter, and the stock ones are today's layouts
    with pytest.raises(ValueError, match="drafter 'mtp'"):
        drafters.export_drafters(ckpt, tmp_path / "o")
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- semantics
def test_the_padded_light_drafter_computes_the_source_s_logits(ckpt, out):
    """The exported folder loaded into a one-width BlockDrafter of its config gives the light
    drafter's block logits (the padded units are silu(0) * 0 = 0)."""
    target, _ = load_target(ckpt)
    light = load_proposer(ckpt, "dflash", target, name="light_engine")
    c, t = _files(out / "vllm" / "light_engine")
    one = build_proposer(DrafterConfig(
        "dflash", c["num_hidden_layers"], c["intermediate_size"],
        target_layers=c["dflash_config"]["target_layer_ids"], block_size=c["block_size"],
        mask_token_id=c["dflash_config"]["mask_token_id"], block="engine"), target).eval()
    one.load_state_dict({k: v.float() for k, v in t.items()}, strict=True)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, target.config.vocab_size, (2, 16), generator=g)
    with torch.no_grad():
        hidden = target(tokens, hidden_layers=(0, 1, 2), logits="none").hidden
        anchors = torch.tensor([[1, 4], [2, 9]])
        lens = torch.tensor([3, 8])
        ref = light.block_logits(tokens, hidden, anchors, lens)
        got = one.block_logits(tokens, hidden, anchors, lens)
    assert ref.shape == (2, 2, 7, target.config.vocab_size)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_eagle_head_is_transformers_llama_layer_on_fc_of_embedding_then_normed_hidden(
        ckpt, out, engine):
    """lm_head(layer(fc(cat(emb(x_{p+1}), norm(h_p))))) with transformers' LlamaDecoderLayer
    (input norm replaced by the identity, as both engines' layer 0) built from the exported
    config equals the embedded head's logits(step(...)): the order of fc's input, the normed
    hidden, no QK-norm, no final norm. SGLang's fc carries the exported zero bias."""
    target, _ = load_target(ckpt)
    head = load_proposer(ckpt, "mtp", target, name="eagle")
    folder = out / engine / "eagle"
    config = transformers.LlamaConfig.from_pretrained(folder)
    config._attn_implementation = "eager"  # takes the additive mask below
    _, t = _files(folder)
    layer = LlamaDecoderLayer(config, layer_idx=0)
    layer.input_layernorm = nn.Identity()
    layer.load_state_dict({k.removeprefix("layers.0."): v.float() for k, v in t.items()
                           if k.startswith("layers.0.")}, strict=True)
    D = config.hidden_size
    fc = nn.Linear(2 * D, D, bias="fc.bias" in t)
    fc.load_state_dict({k.removeprefix("fc."): v.float() for k, v in t.items()
                        if k.startswith("fc.")}, strict=True)
    S = 10
    tokens = torch.randint(3, target.config.vocab_size, (1, S + 1),
                           generator=torch.Generator().manual_seed(1))
    pos = torch.arange(S)[None]
    with torch.no_grad():
        h = target(tokens[:, :S], hidden_layers=(L - 1,), logits="none").hidden[0]  # pre-norm
        x = fc(torch.cat([target.model.embed_tokens(tokens[:, 1:]), target.model.norm(h)], -1))
        cos, sin = LlamaRotaryEmbedding(config)(x, pos)
        causal = torch.full((S, S), torch.finfo(x.dtype).min).triu(1)[None, None]
        ref = target.lm_head(layer(x, attention_mask=causal, position_ids=pos,
                                   position_embeddings=(cos, sin)))
        got = head.logits(head.step(head.head_input(h), tokens[:, 1:], pos))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("name", list(BAD))
def test_a_drafter_the_engines_would_run_differently_is_refused_naming_the_field(
        ckpt, tmp_path, name):
    with pytest.raises(ValueError, match=BAD[name][1]) as e:
        drafters.export_drafter(ckpt, name, "vllm", tmp_path / name)
    assert repr(name) in str(e.value) and str(ckpt / name / "config.json") in str(e.value)
    assert not (tmp_path / name).exists()


def test_an_unknown_drafter_or_engine_is_refused_listing_what_exists(ckpt, tmp_path):
    with pytest.raises(ValueError, match="no drafter 'nope'.*'dflash_engine': 'dflash'"):
        drafters.export_drafters(ckpt, tmp_path, names=["nope"])
    with pytest.raises(ValueError, match="unknown engine"):
        drafters.export_drafters(ckpt, tmp_path, engines=("trtllm",), names=["eagle"])
    with pytest.raises(ValueError, match="no drafter 'nope'.*stored"):
        drafters.export_drafter(ckpt, "nope", "sglang", tmp_path / "x")
    with pytest.raises(FileNotFoundError, match="not an embedded checkpoint"):
        drafters.export_drafter(tmp_path / "missing", "eagle", "vllm", tmp_path / "x")


# --------------------------------------------------------------------------- staleness
def test_a_current_export_is_kept_and_a_changed_source_makes_it_stale(ckpt, tmp_path):
    d = tmp_path / "ckpt"
    shutil.copytree(ckpt, d)
    names = ["light_engine", "eagle"]
    folders = drafters.export_drafters(d, tmp_path / "o", engines=("sglang",), names=names)
    light = folders["sglang", "light_engine"]
    assert drafters.is_current(light, d, "light_engine")
    meta = json.loads((light / "export.json").read_text())
    assert meta["checkpoint"] == str(d.resolve()) and meta["drafter"] == "light_engine"
    assert set(meta["sources"]) >= {"light_engine/model.safetensors",
                                    "dflash_engine/model.safetensors"}
    stamp = (light / "model.safetensors").stat().st_mtime_ns
    drafters.export_drafters(d, tmp_path / "o", engines=("sglang",), names=names)
    assert (light / "model.safetensors").stat().st_mtime_ns == stamp  # current: left alone
    assert not drafters.is_current(light, d, "eagle")  # another drafter's export
    # a retrained trunk: its light drafter's export is stale, then rewritten in place
    path = d / "dflash_engine" / "model.safetensors"
    trunk = load_file(str(path))
    trunk["fc.weight"] = trunk["fc.weight"] * 2
    save_file(trunk, str(path), metadata={"format": "pt"})
    assert not drafters.is_current(light, d, "light_engine")
    assert drafters.is_current(folders["sglang", "eagle"], d, "eagle")
    drafters.export_drafters(d, tmp_path / "o", engines=("sglang",), names=names)
    assert drafters.is_current(light, d, "light_engine")
    assert torch.equal(_files(light)[1]["fc.weight"], trunk["fc.weight"])
    assert sorted(p.name for p in (tmp_path / "o" / "sglang").iterdir()) == sorted(names)


# --------------------------------------------------------------------------- command line
def test_the_command_writes_both_engines_folders(ckpt, tmp_path, capsys):
    d = tmp_path / "ckpt"
    shutil.copytree(ckpt, d)
    # only the engine-layout drafters (and the draft model, which is skipped) in the index
    (d / "drafters.json").write_text(json.dumps(
        {n: c.method for n, c in GOOD.items()} | {"draft_model": "draft_model"}))
    o = tmp_path / "o"
    assert cli.main(["export-drafters", "--checkpoint", str(d), "--out", str(o)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sorted(lines) == sorted(f"wrote {o / e / n}" for e in ("vllm", "sglang") for n in GOOD)
    for e in ("vllm", "sglang"):
        assert sorted(p.name for p in (o / e).iterdir()) == sorted(GOOD)
    assert cli.main(["export-drafters", "--checkpoint", str(d), "--out", str(o),
                     "--engine", "vllm", "--drafter", "eagle"]) == 0
    assert capsys.readouterr().out == f"current {o / 'vllm' / 'eagle'}\n"
    assert cli.main(["export-drafters", "--checkpoint", str(tmp_path / "none"),
                     "--out", str(o)]) == 2
    assert str(tmp_path / "none") in capsys.readouterr().err
    assert cli.main(["export-drafters", "--checkpoint", str(d), "--out", str(o),
                     "--drafter", "nope"]) == 2
    assert "no drafter 'nope'" in (err := capsys.readouterr().err) and "'eagle'" in err
