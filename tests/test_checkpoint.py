"""Checkpoint save/load: transformers parity of the target and the draft model, drafter
lookup by name, clear errors."""

import json

import pytest
import torch

from specrepro.embedded.checkpoint import list_drafters, load_proposer, load_target, save_checkpoint


def test_transformers_loads_target_and_draft_model_with_matching_logits(tiny_checkpoint):
    transformers = pytest.importorskip("transformers")
    target, tok = load_target(tiny_checkpoint)
    ids = torch.tensor([tok.encode("def main():\n    return 0\n")])
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_checkpoint),
                                                           dtype=torch.float32).eval()
    with torch.no_grad():
        assert (target(ids).logits - hf(ids).logits).abs().max().item() <= 1e-4
    draft = load_proposer(tiny_checkpoint, "draft_model", target)
    hf_draft = transformers.AutoModelForCausalLM.from_pretrained(
        str(tiny_checkpoint / "draft_model"), dtype=torch.float32).eval()
    with torch.no_grad():
        assert (draft.model(ids).logits - hf_draft(ids).logits).abs().max().item() <= 1e-4


def test_save_load_round_trip(tiny_checkpoint, tmp_path):
    target, tok = load_target(tiny_checkpoint)
    props = {n: load_proposer(tiny_checkpoint, m, target, name=n)
             for n, m in list_drafters(tiny_checkpoint).items()}
    save_checkpoint(tmp_path, target, tok, props)
    again, _ = load_target(tmp_path)
    for (k, a), b in zip(target.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k
    for n, m in list_drafters(tmp_path).items():
        p = load_proposer(tmp_path, m, again, name=n)
        for a, b in zip(props[n].state_dict().values(), p.state_dict().values()):
            assert torch.equal(a, b)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["eos_token_id"] == 0
    assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == [0, 2]


def test_loads_in_bf16_on_request(tiny_checkpoint):
    target, _ = load_target(tiny_checkpoint, dtype=torch.bfloat16)
    prop = load_proposer(tiny_checkpoint, "dflash", target)
    assert next(prop.parameters()).dtype == torch.bfloat16


def test_errors_name_what_is_wrong(tiny_checkpoint, tmp_path):
    target, _ = load_target(tiny_checkpoint)
    with pytest.raises(ValueError, match="unknown drafter method"):
        load_proposer(tiny_checkpoint, "eagle", target)
    with pytest.raises(ValueError, match="is 'mtp', asked for 'dflash'"):
        load_proposer(tiny_checkpoint, "dflash", target, name="mtp")
    with pytest.raises(FileNotFoundError, match="no drafter 'dflash_heavy'"):
        load_proposer(tiny_checkpoint, "dflash", target, name="dflash_heavy")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_target(tmp_path)


def test_a_drafter_folder_the_index_does_not_list_is_refused(tiny_checkpoint, tmp_path):
    """A full rebuild rewrites drafters.json; a drafter folder it left behind (e.g. a light
    drafter on the old block drafter) must not load silently."""
    import shutil
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, ckpt)
    target, _ = load_target(ckpt)
    index = json.loads((ckpt / "drafters.json").read_text())
    del index["dflash_light"]
    (ckpt / "drafters.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"dflash_light is not listed in .*drafters.json .*leftover"):
        load_proposer(ckpt, "dflash", target, name="dflash_light")
    assert load_proposer(ckpt, "dflash", target).method == "dflash"  # listed ones still load
