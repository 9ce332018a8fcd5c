"""`specrepro train --smoke` builds a complete, loadable checkpoint on the CPU."""

import json

import pytest
import torch

from specrepro.embedded import train
from specrepro.embedded.checkpoint import list_drafters, load_proposer, load_target


def test_smoke_builds_a_loadable_checkpoint(tmp_path):
    out = tmp_path / "embedded"
    assert train.main(["--smoke", "--out", str(out), "--corpus", str(tmp_path / "c.jsonl")]) == 0
    target, tok = load_target(out)
    assert set(list_drafters(out)) == {"mtp", "dflash", "draft_model"}
    for name, method in list_drafters(out).items():
        assert load_proposer(out, method, target, name=name).method == method
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    ids = torch.tensor([tok.encode("import os\nprint(os.sep)\n")])
    with torch.no_grad():
        assert (target(ids).logits - hf(ids).logits).abs().max().item() <= 1e-4
    report = json.loads((out / "quality.json").read_text())
    assert report["quality"]["acceptance"] and report["quality"]["perplexity"]
    assert "sha256" in (out / "MODEL_CARD.md").read_text()


def test_recipe_overrides_are_checked():
    args = train.parse_args(["--smoke", "--set", "target_steps=3", "--seed", "7"])
    r = train.resolve_recipe(args)
    assert (r.name, r.target_steps, r.seed) == ("smoke", 3, 7)
    with pytest.raises(SystemExit, match="unknown recipe field 'nope'"):
        train.resolve_recipe(train.parse_args(["--set", "nope=1"]))


def test_cosine_schedule_warms_up_and_decays_to_floor():
    lrs = [train.cosine_lr(s, 100, 1.0, 10) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[-1] == pytest.approx(0.1, abs=1e-3) and lrs[50] < lrs[20]
