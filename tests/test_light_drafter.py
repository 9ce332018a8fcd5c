"""A light block drafter on a trunk (proposers/dflash.py): it borrows the stored block drafter's first
layers (no bytes of its own for them), starts from the trunk's next layer, stores only its own
tensors, and refuses a trunk that does not fit, naming the file and the key."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from specrepro.embedded.checkpoint import list_drafters, load_proposer, load_target, save_drafters
from specrepro.embedded.proposers import DrafterConfig, build_proposer
from specrepro.tools.training import cli
from specrepro.tools.training.card import replace_section

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def light_config(layers=1, width=64, **trunk):
    return DrafterConfig("dflash", 1, width, target_layers=(0, 2, 3),
                         trunk={"drafter": "dflash", "layers": layers, "intermediate_size": 128,
                                **trunk})


def propose_logits(target, prop, prompt):
    """Prefill prompt [1, P] through the target, let `prop` observe, draft k=3: logits [1, 3, V]."""
    cache = target.new_cache(2, 64)
    prop.allocate(2, 64)
    slots, pos = torch.tensor([0]), torch.arange(prompt.shape[1])[None]
    with torch.no_grad():
        out = target(prompt, positions=pos, cache=cache, slots=slots,
                     hidden_layers=prop.target_layers)
        prop.observe(slots, prompt, pos, out.hidden)
        last = out.logits[:, -1].argmax(-1)
        return prop.propose(slots, torch.tensor([prompt.shape[1]]), last, 3)[1]


PROMPT = torch.randint(3, 200, (1, 12), generator=torch.Generator().manual_seed(3))


def test_the_trunk_plus_a_copy_of_its_next_layer_is_the_trunk_drafter(tiny_checkpoint):
    """Own layer as wide as the trunk's, started from the trunk's layer 1 (of 2) with the trunk's
    final norm: the light drafter computes exactly what the trunk drafter does."""
    target, _ = load_target(tiny_checkpoint)
    heavy = load_proposer(tiny_checkpoint, "dflash", target)
    light = build_proposer(light_config(width=128), target)
    light.init_from_trunk(heavy.state_dict())
    torch.testing.assert_close(propose_logits(target, light, PROMPT),
                               propose_logits(target, heavy, PROMPT), rtol=0, atol=1e-6)


def test_narrower_own_layer_starts_from_the_trunk_s_first_units_and_only_it_trains(tiny_checkpoint):
    target, _ = load_target(tiny_checkpoint)
    heavy = load_proposer(tiny_checkpoint, "dflash", target)
    light = build_proposer(light_config(width=64), target)
    light.init_from_trunk(heavy.state_dict())
    own, src = light.layers[1].mlp, heavy.layers[1].mlp
    assert torch.equal(own.gate_proj.weight, src.gate_proj.weight[:64])
    assert torch.equal(own.down_proj.weight, src.down_proj.weight[:, :64])
    assert torch.equal(light.layers[0].self_attn.q_proj.weight, heavy.layers[0].self_attn.q_proj.weight)
    frozen = {n for n, p in light.named_parameters() if not p.requires_grad}
    assert frozen == set(light.trunk_names()) and "fc.weight" in frozen
    assert all(n.startswith(("layers.1.", "norm.")) for n, p in light.named_parameters()
               if p.requires_grad)
    # a training step moves the own layer only
    before = {n: p.detach().clone() for n, p in light.named_parameters()}
    light.train()
    tokens = torch.randint(3, 200, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = target(tokens, hidden_layers=light.target_layers)
    labels = out.logits.argmax(-1)
    loss, _ = light.training_loss(tokens, labels, out.hidden, anchors=torch.tensor([[4, 9]] * 2))
    opt = torch.optim.SGD([p for p in light.parameters() if p.requires_grad], lr=0.1)
    loss.backward()
    opt.step()
    moved = {n for n, p in light.named_parameters() if not torch.equal(p, before[n])}
    assert moved and not moved & frozen


def test_stored_light_drafter_holds_only_its_own_tensors_and_loads_with_its_trunk(
        tiny_checkpoint, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, ckpt)
    target, tok = load_target(ckpt)
    light = build_proposer(light_config(), target)
    light.init_from_trunk(load_proposer(ckpt, "dflash", target).state_dict())
    with torch.no_grad():
        light.layers[1].mlp.up_proj.weight.mul_(1.5)  # not a copy of anything stored
    light.to(torch.bfloat16).float()  # what bf16 storage keeps
    save_drafters(ckpt, target, tok, {"dflash_tiny_light": light}, add=True)
    assert list_drafters(ckpt)["dflash_tiny_light"] == "dflash"
    assert set(list_drafters(tiny_checkpoint)) < set(list_drafters(ckpt))  # others kept
    stored = load_file(str(ckpt / "dflash_tiny_light" / "model.safetensors"))
    assert all(k.startswith(("layers.1.", "norm.")) for k in stored), sorted(stored)
    again = load_proposer(ckpt, "dflash", target, name="dflash_tiny_light")
    assert len(again.layers) == 2
    torch.testing.assert_close(propose_logits(target, again, PROMPT),
                               propose_logits(target, light, PROMPT), rtol=0, atol=1e-6)


def _write_light(ckpt, target, tok, cfg, name="bad_light"):
    prop = build_proposer(light_config(), target)
    prop.cfg = cfg
    save_drafters(ckpt, target, tok, {name: prop}, add=True)
    return ckpt / name / "config.json"


@pytest.mark.parametrize("trunk, match", [
    ({"drafter": "nope"}, r"trunk.drafter 'nope' is not stored in .*nope/config.json missing"),
    ({"drafter": "mtp"}, r"trunk drafter 'mtp' .* does not fit: method 'dflash' != 'mtp'"),
    ({"layers": 3}, r"does not fit: .*trunk.layers 3 > its 2 layers"),
    ({"intermediate_size": 96}, r"does not fit: trunk.intermediate_size 96 != 128"),
])
def test_a_trunk_that_does_not_fit_is_refused_naming_file_and_key(tiny_checkpoint, tmp_path,
                                                                 trunk, match):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, ckpt)
    target, tok = load_target(ckpt)
    path = _write_light(ckpt, target, tok, light_config(**trunk))
    with pytest.raises((ValueError, FileNotFoundError), match=match) as e:
        load_proposer(ckpt, "dflash", target, name="bad_light")
    assert str(path) in str(e.value)


def test_context_layers_must_match_the_trunk_s(tiny_checkpoint, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, ckpt)
    target, tok = load_target(ckpt)
    cfg = DrafterConfig("dflash", 1, 64, target_layers=(0, 2, 3),
                        trunk={"drafter": "dflash", "layers": 1, "intermediate_size": 128})
    path = _write_light(ckpt, target, tok, cfg)
    raw = json.loads(path.read_text())
    raw["specrepro_drafter"]["target_layers"] = [1, 2, 3]
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"target_layers \(1, 2, 3\) != \(0, 2, 3\)"):
        load_proposer(ckpt, "dflash", target, name="bad_light")


@pytest.mark.parametrize("d, match", [
    (dict(method="mtp", trunk={"drafter": "dflash", "layers": 1, "intermediate_size": 8}),
     "only a dflash drafter has one, not 'mtp'"),
    (dict(method="dflash", trunk={"drafter": "dflash", "layers": 1}),
     r"'trunk' .*expected exactly the keys \['drafter', 'layers', 'intermediate_size'\]"),
    (dict(method="dflash", trunk={"drafter": "dflash", "layers": 0, "intermediate_size": 8}),
     r"'trunk.layers' must be an integer >= 1, got 0"),
    (dict(method="dflash", trunk={"drafter": "", "layers": 1, "intermediate_size": 8}),
     r"'trunk.drafter' must name a stored drafter"),
])
def test_bad_trunk_configs_are_refused(d, match):
    with pytest.raises(ValueError, match=match):
        DrafterConfig.from_dict(d)


def test_train_from_adds_a_light_drafter_to_a_trained_checkpoint(tmp_path):
    """`specrepro train --from`: the smoke-sized light recipe on a smoke checkpoint, end to end."""
    base, out, corpus = tmp_path / "base", tmp_path / "out", tmp_path / "c.jsonl"
    assert cli.main(["--smoke", "--recipe", "v3", "--out", str(base), "--corpus", str(corpus)]) == 0
    argv = ["--smoke", "--recipe", "light", "--from", str(base), "--out", str(out),
            "--corpus", str(corpus)]
    assert cli.main(argv) == 0
    assert list_drafters(out) == {**list_drafters(base), "dflash_light": "dflash"}
    target, _ = load_target(out)
    base_target, _ = load_target(base)
    assert all(torch.equal(a, b) for a, b in zip(target.state_dict().values(),
                                                 base_target.state_dict().values()))
    light = load_proposer(out, "dflash", target, name="dflash_light")
    heavy = load_proposer(out, "dflash", target)
    assert torch.equal(light.layers[0].mlp.up_proj.weight, heavy.layers[0].mlp.up_proj.weight)
    report = json.loads((out / "quality-smoke-light.json").read_text())
    assert {r["drafter"] for r in report["quality"]["acceptance"]} == {"dflash_light"}
    card = (out / "MODEL_CARD.md").read_text()
    assert card.count("## Added drafters: recipe `smoke-light`") == 1
    assert card.startswith((base / "MODEL_CARD.md").read_text().rstrip("\n"))
    # adding it again is refused (it would overwrite); a directory without a target too
    with pytest.raises(SystemExit, match=r"drafters \['dflash_light'\] are stored there already"):
        cli.main(argv[:4] + [str(out)] + argv[5:])
    with pytest.raises(SystemExit, match="no config.json there"):
        cli.main(argv[:4] + [str(tmp_path)] + argv[5:])
    # a recipe with a trunk drafter cannot train from scratch
    with pytest.raises(SystemExit, match=r"drafters \[.dflash_light.\] sit on .*--from CHECKPOINT"):
        cli.main(["--smoke", "--recipe", "light", "--out", str(tmp_path / "x"),
                    "--corpus", str(corpus)])


def test_replace_section_updates_in_place():
    card = "# Card\n\ntext\n\n## Added drafters: recipe `x`\n\nold\n\n## Notes\n\nkept\n"
    new = replace_section(card, "## Added drafters: recipe `x`\n\nnew\n")
    assert new == "# Card\n\ntext\n\n## Added drafters: recipe `x`\n\nnew\n\n## Notes\n\nkept\n"
    assert replace_section("# Card\n", "## S\n\nbody\n") == "# Card\n\n## S\n\nbody\n"


def test_kv_budget_counts_a_cache_for_every_layer_run(tiny_checkpoint):
    """The light drafter keeps a context K/V cache in each of its layers, the trunk's too: the
    engine's KV budget must be charged for all of them."""
    target, _ = load_target(tiny_checkpoint)
    heavy = load_proposer(tiny_checkpoint, "dflash", target)
    light = load_proposer(tiny_checkpoint, "dflash", target, name="dflash_light")
    for prop in (heavy, light):
        prop.allocate(2, 16)
        cache_bytes = sum(t.numel() * t.element_size() for kv in prop.ctx_cache for t in kv)
        assert prop.kv_bytes_per_token() * 2 * 16 == cache_bytes
    assert light.kv_bytes_per_token() == heavy.kv_bytes_per_token()  # 1 + 1 layers, as 2
