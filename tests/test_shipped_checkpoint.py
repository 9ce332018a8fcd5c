"""The committed checkpoint (models/embedded): size, loading, transformers parity, targets.

Issue 3's "Done means", checked on the files in git rather than on a smoke build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specrepro.embedded.checkpoint import list_drafters, load_proposer, load_target

MODEL = Path(__file__).resolve().parents[1] / "models" / "embedded"


def test_all_parts_together_fit_in_40_mb():
    total = sum(p.stat().st_size for p in MODEL.rglob("*") if p.is_file())
    assert total <= 40e6, f"{MODEL}: {total / 1e6:.2f} MB"


def test_target_and_every_drafter_load_on_the_cpu():
    target, tok = load_target(MODEL)
    assert 5e6 <= target.config.num_parameters() <= 12e6
    assert target.config.max_position_embeddings >= 4096
    assert tok.eos_token_id == 0 and tok.decode(tok.encode("x = 1\n")) == "x = 1\n"
    drafters = list_drafters(MODEL)
    assert {"mtp", "dflash", "draft_model"} <= set(drafters.values())
    for name, method in drafters.items():
        assert load_proposer(MODEL, method, target, name=name).method == method


def test_transformers_loads_the_target_with_matching_logits():
    transformers = pytest.importorskip("transformers")
    target, tok = load_target(MODEL)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(MODEL), dtype=torch.float32).eval()
    ids = torch.tensor([tok.encode("Question: Tom has 3 apples and buys 4 more. How many?\n"
                                   "Answer: 3 + 4 = <<3+4=7>>7\n#### 7")])
    with torch.no_grad():
        diff = (target(ids).logits - hf(ids).logits).abs().max().item()
    assert diff <= 1e-4, diff
    assistant = transformers.AutoModelForCausalLM.from_pretrained(str(MODEL / "draft_model"))
    assert assistant.config.vocab_size == target.config.vocab_size


def test_the_committed_quality_report_meets_the_acceptance_targets():
    head = json.loads((MODEL / "quality.json").read_text())["headline"]
    assert head["block_k7_tokens_per_step"] >= 3.5, head
    assert head["ratio"] >= 1.3, head
    assert "block drafter at 7 drafts" in (MODEL / "MODEL_CARD.md").read_text()
