"""The MTP head in the EAGLE-1 layout vLLM 0.26.0 and SGLang 0.5.14 run for a Qwen3 target
(proposers/mtp.py, `layout: "eagle"`; docs/engine-layouts.md §3-4): the engines' tensor names,
fed the target's final-normed hidden state, trained unrolled exactly as `propose` runs it, and
served losslessly by the embedded engine at every k, alone and batched, static shapes on and
off. The default layout still builds the DeepSeek-style head."""

import shutil

import pytest
import torch

from conftest import random_prompts, self_distilled
from specrepro.embedded.checkpoint import load_proposer, load_target
from specrepro.embedded.config import EngineConfig
from specrepro.embedded.engine import LLMEngine
from specrepro.embedded.proposers import DrafterConfig, build_proposer
from specrepro.embedded.sampling import SamplingParams
from specrepro.tools.training.recipes import EAGLE_HEAD, RECIPES

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = random_prompts(6, seed=13)
EAGLE_CFG = DrafterConfig("mtp", 1, 128, layout="eagle", mtp_train_depth=3)
# vLLM's llama_eagle.py / SGLang's LlamaForCausalLMEagle layer 0 (docs/engine-layouts.md §3)
EAGLE_NAMES = {"fc.weight", "layers.0.post_attention_layernorm.weight",
               *(f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"),
               *(f"layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down"))}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_eagle_head_has_exactly_the_engines_tensors_and_the_default_is_deepseek(
        tiny_checkpoint):
    target, _ = load_target(tiny_checkpoint)
    assert set(build_proposer(EAGLE_CFG, target).state_dict()) == EAGLE_NAMES
    deepseek = build_proposer(DrafterConfig("mtp", 1, 128), target).state_dict()
    assert {"eh_proj.weight", "hnorm.weight", "enorm.weight", "norm.weight",
            "layer.self_attn.q_norm.weight"} <= set(deepseek)
    assert DrafterConfig("mtp").to_dict().get("layout") is None  # stored as before
    assert DrafterConfig.from_dict(EAGLE_CFG.to_dict()) == EAGLE_CFG
    with pytest.raises(ValueError, match="'layout' must be one of"):
        DrafterConfig("mtp", layout="medusa")
    with pytest.raises(ValueError, match="only an mtp head has one"):
        DrafterConfig("dflash", layout="eagle")
    assert EAGLE_HEAD["layout"] == "eagle" and RECIPES["engine-layout"].drafters["mtp"] == EAGLE_HEAD


def test_the_head_reads_the_target_s_final_normed_hidden_and_its_raw_output(tiny_checkpoint):
    """fc([emb(x_{p+1}); norm(h_p)]), a Llama layer without input norm, the target's head on
    the raw output: the engines' rule, written out here by hand."""
    target, _ = load_target(tiny_checkpoint)
    torch.manual_seed(0)
    head = build_proposer(EAGLE_CFG, target).eval()
    tokens = torch.randint(3, 400, (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = target(tokens, hidden_layers=head.target_layers)
        h = target.model.norm(out.hidden[0])  # final-normed
        z = head.fc(torch.cat([target.model.embed_tokens(tokens[:, 1:]), h[:, :-1]], -1))
        layer = head.layers[0]
        pos = torch.arange(8)[None]
        from specrepro.embedded.model import rope_cos_sin
        cos, sin = rope_cos_sin(pos, target.config.head_dim, target.config.rope_theta, z.dtype)
        x = z + layer.self_attn(z, cos, sin)  # no input norm
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        want = target.lm_head(x)  # no final norm
        got = head.unrolled_logits(tokens, out.hidden)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not hasattr(layer.self_attn, "q_norm") and isinstance(layer.input_layernorm,
                                                                 torch.nn.Identity)


def test_training_unrolls_each_step_as_propose_runs_it(tiny_checkpoint):
    """Step j of the training forward for the chain after position i equals the j-th draft's
    logits of a propose at context length i + 1 (same position, same keys): the head is
    trained on what it is run on."""
    target, _ = load_target(tiny_checkpoint)
    torch.manual_seed(1)
    head = build_proposer(EAGLE_CFG, target).eval()
    with torch.no_grad():  # weights large enough that positions and keys show in the logits
        for name, p in head.named_parameters():
            if not name.endswith("norm.weight"):
                p.normal_(std=0.15)
    tokens = torch.randint(3, 400, (1, 24), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        out = target(tokens, hidden_layers=head.target_layers)
        train = head.unrolled_logits(tokens, out.hidden)  # 3 x [1, 24-j, V]
        head.allocate(1, 48)
        for i in (5, 12, 19):
            pos = torch.arange(i + 1)[None]
            head.observe(torch.tensor([0]), tokens[:, :i + 1], pos,
                         [h[:, :i + 1] for h in out.hidden])
            # the drafts fed back are the chain's true tokens, as in training
            steps = []
            state = {"h": head.hbuf[0, i][None, None]}
            for j in range(3):
                state["h"] = head.step(state["h"], tokens[:, i + 1 + j][:, None],
                                       torch.tensor([[i + j]]), torch.tensor([0]))
                steps.append(head.logits(state["h"])[0, 0])
            for j in range(3):
                torch.testing.assert_close(steps[j], train[j][0, i], rtol=1e-3, atol=5e-4)
    _, per_step = head.training_loss(tokens, out.logits.argmax(-1), out.hidden)
    assert per_step.shape == (3,)


# --------------------------------------------------------------------------- the engine
@pytest.fixture(scope="module")
def eagle_checkpoint(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint plus `eagle` (the EAGLE-1 layout), briefly trained on the target's
    own greedy continuations so that drafts are accepted."""
    d = tmp_path_factory.mktemp("eagle") / "ckpt"
    shutil.copytree(tiny_checkpoint, d)
    return self_distilled(d, "eagle", EAGLE_CFG)


def _generate(ckpt, k, static, max_num_seqs):
    spec = None if k is None else {"method": "mtp", "model": "eagle", "num_speculative_tokens": k}
    eng = LLMEngine(EngineConfig(model_dir=str(ckpt), max_num_seqs=max_num_seqs,
                                 max_model_len=64, max_num_batched_tokens=64, speculative=spec,
                                 static_shapes=static))
    return eng.generate(PROMPTS, GREEDY, 10, ignore_eos=True), eng


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("max_num_seqs", [1, 6])
def test_the_engine_serves_the_eagle_head_losslessly_at_every_k(eagle_checkpoint, static,
                                                                 max_num_seqs):
    ref, _ = _generate(eagle_checkpoint, None, False, 1)
    accepted = 0
    for k in (1, 3, 5):
        got, eng = _generate(eagle_checkpoint, k, static, max_num_seqs)
        assert eng.proposer.eagle
        bad = [i for i, (a, b) in enumerate(zip(ref, got)) if a != b]
        assert len(bad) <= 1, f"k={k} static={static} seqs={max_num_seqs}: prompts {bad} differ"
        accepted += eng.stats.num_accepted_tokens
    assert accepted > 0


def test_a_stored_eagle_head_loads_as_stored(eagle_checkpoint):
    target, _ = load_target(eagle_checkpoint)
    head = load_proposer(eagle_checkpoint, "mtp", target, name="eagle")
    assert head.eagle and head.cfg == EAGLE_CFG and set(head.state_dict()) == EAGLE_NAMES
