"""`specrepro train --smoke` builds a complete, loadable checkpoint on the CPU."""

import json

import pytest
import torch

from specrepro.embedded.checkpoint import list_drafters, load_proposer, load_target
from specrepro.tools.training import cli, loops, recipes


def test_smoke_builds_a_loadable_checkpoint(tmp_path):
    out = tmp_path / "embedded"
    assert cli.main(["--smoke", "--out", str(out), "--corpus", str(tmp_path / "c.jsonl")]) == 0
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
    args = cli.parse_args(["--smoke", "--set", "target_steps=3", "--seed", "7"])
    r = cli.resolve_recipe(args)
    assert (r.name, r.target_steps, r.seed) == ("smoke", 3, 7)
    with pytest.raises(SystemExit, match="unknown recipe field 'nope'"):
        cli.resolve_recipe(cli.parse_args(["--set", "nope=1"]))


def test_cosine_schedule_warms_up_and_decays_to_floor():
    lrs = [loops.cosine_lr(s, 100, 1.0, 10) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[-1] == pytest.approx(0.1, abs=1e-3) and lrs[50] < lrs[20]


def test_v2_smoke_builds_a_loadable_checkpoint_with_sampled_figures(tmp_path):
    """The smoke-sized v2: paragraph prose, greedy + sampled distillation, no dflash_light,
    sampled (T = 0.7) acceptance beside the greedy figures."""
    from specrepro.tools.training import quality
    from specrepro.tools.training.corpus import read_corpus

    out, corpus_file = tmp_path / "v2", tmp_path / "c.jsonl"
    assert cli.main(["--smoke", "--recipe", "v2", "--out", str(out),
                       "--corpus", str(corpus_file)]) == 0
    target, tok = load_target(out)
    assert set(list_drafters(out)) == {"mtp", "dflash", "draft_model"}
    props = {n: load_proposer(out, m, target, name=n) for n, m in list_drafters(out).items()}
    assert len(props["dflash"].layers) == 3  # smoke's 2 + 1, as v2 deepens 3 -> 4
    docs, manifest = read_corpus(corpus_file)
    assert manifest["prose_docs"] == "paragraphs"
    report = json.loads((out / "quality.json").read_text())
    assert report["recipe"]["distill_mix"] == [[0.0, 0.5], [0.7, 0.25], [1.0, 0.25]]
    rows = report["quality"]["acceptance"]
    sampled = [r for r in rows if r.get("temperature") == 0.7]
    assert {r["drafter"] for r in sampled} == {"mtp", "dflash", "draft_model"}
    assert all(1.0 <= r["tokens_per_step"] <= r["k"] + 1 for r in sampled)
    assert "sampled at T = 0.7" in (out / "MODEL_CARD.md").read_text()
    # sampled verification at a near-zero temperature is greedy verification, and a seed
    # fixes the sampled figures
    prompts = quality.heldout_prompts(docs, "math", 2, tok, 32)
    run = lambda t: quality.simulate(target, props["mtp"], prompts, 3, 12, tok.eos_token_id,
                                     temperature=t, seed=0)
    assert run(1e-3)["outputs"] == run(0.0)["outputs"]
    assert run(0.7)["outputs"] == run(0.7)["outputs"]
    # a corpus built with another prose unit is refused, naming the fix
    with pytest.raises(SystemExit, match="--prose-docs paragraphs"):
        cli.check_corpus({"sha256": "x"}, corpus_file, recipes.RECIPES["v2"])


@pytest.mark.parametrize("name", ["v2", "v2-deep", "v3"])
def test_default_recipe_is_unchanged_and_v2_fits_the_size_limit(name):
    d, v2 = recipes.RECIPES["default"], recipes.RECIPES[name]
    assert (d.prose_docs, d.distill_mix, d.drafter_steps) == ("articles", ((0.0, 1.0),), 8000)
    assert set(d.drafters) == {"mtp", "dflash", "dflash_light", "draft_model"}
    assert set(v2.drafters) == {"mtp", "dflash", "draft_model"}
    assert v2.drafters["dflash"]["num_hidden_layers"] == {"v2": 4, "v2-deep": 6, "v3": 6}[name]
    assert v2.prose_docs == "paragraphs" and v2.distill_mix == recipes.RECIPES["v2"].distill_mix
    # bf16 bytes of the full-size v2 checkpoint's weights: at most 40 MB
    from specrepro.embedded.model import ModelConfig, Qwen3Model
    from specrepro.embedded.proposers import DrafterConfig, build_proposer
    tgt = Qwen3Model(ModelConfig.from_dict(v2.target))
    n = sum(p.numel() for p in tgt.parameters())
    for cfg in v2.drafters.values():
        prop = build_proposer(DrafterConfig.from_dict(cfg), tgt)
        shared = {id(p) for p in tgt.parameters()}
        n += sum(p.numel() for p in prop.state_dict(keep_vars=True).values() if id(p) not in shared)
    assert 2 * n <= 40e6, 2 * n


def test_quality_only_measures_the_named_drafters_on_both_splits_and_merges(tmp_path,
                                                                            tiny_checkpoint):
    """`--quality-only --drafter NAME`: that drafter's figures on the validation and the test
    split, merged into the recipe's quality file beside the figures of the drafters measured
    before (and where each was measured); the card gets one section, rewritten each run."""
    import shutil

    ck = tmp_path / "ck"
    shutil.copytree(tiny_checkpoint, ck)
    args = ["--recipe", "smoke-engine-layout", "--smoke", "--from", str(ck), "--quality-only",
            "--corpus", str(tmp_path / "c.jsonl")]
    path = ck / "quality-smoke-engine-layout.json"
    assert cli.main([*args, "--drafter", "mtp"]) == 0
    first = json.loads(path.read_text())
    for split in ("validation", "test"):
        rows = first["quality"][split]["acceptance"]
        assert rows and {r["drafter"] for r in rows} == {"mtp"}
        assert first["quality"][split]["split"] == split
    assert cli.main([*args, "--drafter", "dflash"]) == 0
    both = json.loads(path.read_text())
    rows = both["quality"]["test"]["acceptance"]
    assert {r["drafter"] for r in rows} == {"mtp", "dflash"}
    assert [r for r in rows if r["drafter"] == "mtp"] == first["quality"]["test"]["acceptance"]
    assert set(both["info"]["measured_on"]) == {"mtp", "dflash"}
    card = (ck / "MODEL_CARD.md").read_text()
    assert card.count("## Drafters and quality: recipe `smoke-engine-layout`") == 1
    assert "### Test split (reported)" in card and "### Validation split" in card
    with pytest.raises(SystemExit, match="not stored"):
        cli.main([*args, "--drafter", "nope"])
