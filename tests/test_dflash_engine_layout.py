"""The block drafter in the layout vLLM and SGLang run (proposers/dflash.py, docs/engine-layouts.md):
the mask is a frozen row of the target's embedding, k drafts are a block of 1 + k (trained over
random block lengths), target layer ids the engines capture. The default config still builds
exactly today's module (the shipped checkpoint's tensors); the engine serves the new layout
losslessly at k = 1..9, alone and batched, static shapes on and off."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from conftest import decode_program_without_host_reads, random_prompts, self_distilled
from specrepro.embedded.checkpoint import load_proposer, load_target, save_drafters
from specrepro.embedded.config import EngineConfig
from specrepro.embedded.engine import LLMEngine
from specrepro.embedded.proposers import DrafterConfig, build_proposer
from specrepro.embedded.sampling import SamplingParams
from specrepro.embedded.tokenizer import Tokenizer, train_bpe
from specrepro.tools.training import cli, recipes
from specrepro.tools.training.recipes import ENGINE_LAYOUT, MASK_TOKEN_ID, RECIPES

MODEL = Path(__file__).resolve().parents[1] / "models" / "embedded"
GREEDY = SamplingParams(temperature=0.0)
PROMPTS = random_prompts(6, seed=11)
MAX_TOKENS = 10
# the tiny target has 4 layers: ids <= L-2 = 2, ascending, as SGLang can capture them
ENGINE_CFG = DrafterConfig("dflash", 2, 128, target_layers=(0, 1, 2), **ENGINE_LAYOUT)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --------------------------------------------------------------------------- the shipped drafters
@pytest.mark.parametrize("name", ["dflash", "dflash_light"])
def test_the_stored_config_builds_exactly_the_shipped_module_in_the_engines_layout(name):
    """Parameter names and shapes of the stored config's module are the shipped file's (plus a
    light drafter's borrowed trunk); the shipped block drafters are the engines' layout (no mask
    tensor, blocks of 1 + k, capturable layers), and a config without the layout keys is stored
    as before the keys existed."""
    raw = json.loads((MODEL / name / "config.json").read_text())["specrepro_drafter"]
    cfg = DrafterConfig.from_dict(raw)
    assert (cfg.mask_token_id, cfg.block) == (MASK_TOKEN_ID, "engine") and cfg.to_dict() == raw
    target, _ = load_target(MODEL)
    assert max(cfg.target_layers) <= target.config.num_hidden_layers - 2
    prop = build_proposer(cfg, target)
    with safe_open(str(MODEL / name / "model.safetensors"), "pt") as f:
        stored = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (not a dict)
    if cfg.trunk:
        with safe_open(str(MODEL / cfg.trunk["drafter"] / "model.safetensors"), "pt") as f:
            stored |= {k: tuple(f.get_slice(k).get_shape()) for k in prop.trunk_names()}
    assert {k: tuple(v.shape) for k, v in prop.state_dict().items()} == stored
    assert "mask_embedding" not in stored and prop.engine_block
    plain = DrafterConfig("dflash", 2, 128, target_layers=(0, 1))
    assert "mask_token_id" not in plain.to_dict() and "block" not in plain.to_dict()


def test_engine_layout_has_no_mask_parameter_and_reads_the_target_embedding_row(tiny_checkpoint):
    target, _ = load_target(tiny_checkpoint)
    today = load_proposer(tiny_checkpoint, "dflash", target)
    prop = build_proposer(ENGINE_CFG, target)
    names = set(prop.state_dict())
    assert names == set(today.state_dict()) - {"mask_embedding"}
    blocks = prop._blocks(torch.tensor([[7, 9]]), 4)  # [1, 2, 4, D]
    emb = target.model.embed_tokens.weight
    assert torch.equal(blocks[0, 1, 0], emb[9])
    assert all(torch.equal(blocks[0, b, j], emb[MASK_TOKEN_ID]) for b in (0, 1) for j in (1, 2, 3))
    with pytest.raises(ValueError, match="outside the target's vocabulary"):
        build_proposer(DrafterConfig("dflash", 1, 64, target_layers=(0,), mask_token_id=10**6,
                                     block="engine"), target)
    with pytest.raises(ValueError, match="'block' must be one of"):
        DrafterConfig("dflash", block="truncated")
    with pytest.raises(ValueError, match="only a dflash drafter"):
        DrafterConfig("mtp", mask_token_id=1)


def test_the_mask_token_is_im_start_in_every_tokenizer():
    assert MASK_TOKEN_ID == Tokenizer.load(MODEL).im_start_id == 1
    assert train_bpe(["a b c"] * 3, vocab_size=300).im_start_id == MASK_TOKEN_ID


# --------------------------------------------------------------------------- block semantics
def _observed(target, prop, prompt):
    """prop allocated and observing prompt [1, P] in slot 0."""
    prop.allocate(2, 48)
    pos = torch.arange(prompt.shape[1])[None]
    out = target(prompt, positions=pos, hidden_layers=prop.target_layers)
    prop.observe(torch.tensor([0]), prompt, pos, out.hidden)


def test_training_a_block_of_length_n_is_the_engine_s_pass_at_n_minus_1_drafts(tiny_checkpoint):
    """The training forward of a block of length n (keys past it masked) gives the logits
    `propose` gives at k = n-1 (a block of 1 + k); today's layout at k < 7 does not."""
    target, _ = load_target(tiny_checkpoint)
    torch.manual_seed(0)
    prop = build_proposer(ENGINE_CFG, target).eval()
    tokens = torch.randint(3, 400, (1, 30), generator=torch.Generator().manual_seed(1))
    a = 17
    with torch.inference_mode():
        hid = target(tokens, hidden_layers=prop.target_layers).hidden
        _observed(target, prop, tokens[:, :a])
        for n in (2, 4, 8):
            train = prop.block_logits(tokens, hid, torch.tensor([[a]]), torch.tensor([n]))
            _, got = prop.propose(torch.tensor([0]), torch.tensor([a]), tokens[:, a], n - 1)
            torch.testing.assert_close(got[0], train[0, 0, :n - 1], rtol=1e-4, atol=1e-5)
        full = prop.block_logits(tokens, hid, torch.tensor([[a]]))  # block of 8
        assert not torch.allclose(full[0, 0, :3], prop.propose(
            torch.tensor([0]), torch.tensor([a]), tokens[:, a], 3)[1][0], atol=1e-4)


def test_engine_block_loss_ignores_drafts_past_each_sequence_s_length(tiny_checkpoint):
    target, _ = load_target(tiny_checkpoint)
    prop = build_proposer(ENGINE_CFG, target).train()
    tokens = torch.randint(3, 400, (2, 32), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = target(tokens, hidden_layers=prop.target_layers)
    labels = out.logits.argmax(-1)
    _, per_pos = prop.training_loss(tokens, labels, out.hidden, torch.tensor([[4, 20]] * 2),
                                    block_lens=torch.tensor([3, 5]))
    assert per_pos.shape == (7,) and torch.all(per_pos[4:] == 0) and torch.all(per_pos[:4] > 0)
    # the mask row is the target's: no parameter of the drafter, so no optimizer moves it
    assert all(p is not target.model.embed_tokens.weight for p in prop.parameters())


# --------------------------------------------------------------------------- the engine
@pytest.fixture(scope="module")
def engine_checkpoint(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint plus `dflash_engine` (the engines' layout), briefly trained on the
    target's own greedy continuations so that drafts are accepted."""
    d = tmp_path_factory.mktemp("engine_layout") / "ckpt"
    shutil.copytree(tiny_checkpoint, d)
    return self_distilled(d, "dflash_engine", ENGINE_CFG, lambda g: {
        "anchors": torch.randint(3, 32 - 8 + 2, (16, 4), generator=g),
        "block_lens": torch.randint(2, 9, (16,), generator=g)})


def _generate(ckpt, k, static, max_num_seqs):
    spec = None if k is None else {"method": "dflash", "model": "dflash_engine",
                                   "num_speculative_tokens": k}
    eng = LLMEngine(EngineConfig(model_dir=str(ckpt), max_num_seqs=max_num_seqs,
                                 max_model_len=64, max_num_batched_tokens=64, speculative=spec,
                                 static_shapes=static))
    return eng.generate(PROMPTS, GREEDY, MAX_TOKENS, ignore_eos=True), eng


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("max_num_seqs", [1, 6])
def test_the_engine_serves_the_engine_layout_losslessly_at_every_k(engine_checkpoint, static,
                                                                   max_num_seqs):
    ref, _ = _generate(engine_checkpoint, None, False, 1)
    accepted = 0
    for k in (1, 3, 5, 7, 9):  # 9: a block of 10, past training
        got, eng = _generate(engine_checkpoint, k, static, max_num_seqs)
        assert eng.proposer.engine_block and eng.proposer.target_layers == (0, 1, 2)
        bad = [i for i, (a, b) in enumerate(zip(ref, got)) if a != b]
        assert len(bad) <= 1, f"k={k} static={static} seqs={max_num_seqs}: prompts {bad} differ"
        assert eng.stats.num_draft_tokens > 0
        accepted += eng.stats.num_accepted_tokens
    assert accepted > 0


@pytest.mark.parametrize("k", [1, 7, 9])
def test_the_static_decode_program_reads_nothing_back_to_the_host(engine_checkpoint, k,
                                                                  monkeypatch):
    """graphs.py's decode program (`spec.draft_verify_observe`) with the engine block: fixed
    shapes per (bucket, k), no host read (a CUDA graph cannot hold one), k = 9 included."""
    _, eng = _generate(engine_checkpoint, k, True, 4)  # caches hold real contexts
    out = decode_program_without_host_reads(eng, k, monkeypatch)
    assert out["rows"].shape == (4, k + 3) and out["logits"].shape[:2] == (4, k + 1)


# --------------------------------------------------------------------------- recipes
def test_the_engine_layout_recipes_set_capturable_layers_and_one_width():
    for name in ("smoke-engine-layout", "engine-layout", "light-engine-layout"):
        r = RECIPES[name]
        L = r.target.get("num_hidden_layers")
        for d in r.drafters.values():
            cfg = DrafterConfig.from_dict(d)
            if cfg.method != "dflash":
                continue
            assert (cfg.mask_token_id, cfg.block) == (MASK_TOKEN_ID, "engine")
            assert list(cfg.target_layers) == sorted(cfg.target_layers)
            assert max(cfg.target_layers) <= L - 2, (name, cfg.target_layers)
            if cfg.trunk:
                assert cfg.trunk["intermediate_size"] == cfg.intermediate_size
    assert cli.resolve_recipe(cli.parse_args(["--smoke", "--recipe", "engine-layout"])).name \
        == "smoke-engine-layout"
    assert cli.resolve_recipe(cli.parse_args(["--smoke", "--recipe", "smoke-engine-layout"])
                              ).name == "smoke-engine-layout"
    assert recipes.SMOKE_OF["engine-layout"] == "smoke-engine-layout"


def test_the_smoke_recipe_trains_and_the_engine_serves_it_losslessly(tmp_path):
    """`--recipe smoke-engine-layout --smoke` end to end (steps cut to seconds): a 6-layer
    target and the engine-layout drafter on its layers 0, 2, 4, served at k = 3 and 9."""
    out = tmp_path / "el"
    assert cli.main(["--recipe", "smoke-engine-layout", "--smoke", "--out", str(out),
                     "--corpus", str(tmp_path / "c.jsonl"), "--set", "target_steps=8",
                     "--set", "drafter_steps=8", "--set", "n_continuations=32"]) == 0
    stored = json.loads((out / "dflash" / "config.json").read_text())["specrepro_drafter"]
    assert (stored["mask_token_id"], stored["block"], stored["target_layers"]) == (1, "engine",
                                                                                  [0, 2, 4])
    q = json.loads((out / "quality.json").read_text())["quality"]["acceptance"]
    assert sorted({r["k"] for r in q if r["drafter"] == "dflash"}) == [1, 3, 5, 7, 9]

    def gen(k):
        spec = None if k is None else {"method": "dflash", "num_speculative_tokens": k}
        eng = LLMEngine(EngineConfig(model_dir=str(out), max_num_seqs=4, max_model_len=64,
                                     speculative=spec))
        return eng.generate(PROMPTS, GREEDY, MAX_TOKENS, ignore_eos=True)
    ref = gen(None)
    assert gen(3) == ref and gen(9) == ref


def test_a_light_drafter_in_the_engine_layout_sits_on_an_engine_layout_trunk_only(
        engine_checkpoint, tmp_path):
    """Own layer at the trunk's width (one intermediate_size, recipes.light_drafter(width=)),
    borrowing fc, hidden_norm and layer 0 (no mask tensor); a trunk of the other layout is
    refused, naming the keys."""
    d = tmp_path / "ckpt"
    shutil.copytree(engine_checkpoint, d)
    target, tok = load_target(d)
    good = DrafterConfig.from_dict(recipes.light_drafter(
        1, width=128, trunk_width=128, target_layers=[0, 1, 2], **ENGINE_LAYOUT)
        | {"trunk": {"drafter": "dflash_engine", "layers": 1, "intermediate_size": 128}})
    bad = DrafterConfig.from_dict(recipes.light_drafter(
        1, width=128, trunk_width=128, target_layers=[0, 2, 3], **ENGINE_LAYOUT)
        | {"trunk": {"drafter": "dflash", "layers": 1, "intermediate_size": 128}})
    trunk = load_proposer(d, "dflash", target, name="dflash_engine")
    props = {}
    for name, cfg in (("light_engine", good), ("light_bad", bad)):
        props[name] = build_proposer(cfg, target)
        if name == "light_engine":
            props[name].init_from_trunk(trunk.state_dict())
    assert set(props["light_engine"].trunk_names()) == {
        k for k in trunk.state_dict() if k.startswith(("fc.", "hidden_norm.", "layers.0."))}
    save_drafters(d, target, tok, props, add=True)
    light = load_proposer(d, "dflash", target, name="light_engine")
    assert {m.mlp.gate_proj.out_features for m in light.layers} == {128}
    with pytest.raises(ValueError, match="block 'engine' != 'fixed'; mask_token_id 1 != None"):
        load_proposer(d, "dflash", target, name="light_bad")
