"""A substitute gate (a suite's own, standing in for one of the article's) shows its own rule
and value, and beside it the article's figure of the same metric at the same workload and
level, or that the article prints none there; a share reads as a percentage.

On the committed stores: the default suite (embedded engine, CPU) and the H200 suites."""

from __future__ import annotations

import re

import pytest

from specrepro import pipeline
from specrepro.analysis.verdict import substitute_gates, verdicts
from specrepro.analysis.verdict.claims import claims_for
from specrepro.params import Gate

NB = "05_fp8_drafter_gates"


@pytest.fixture(scope="module", params=["params/default.yaml", "params/h200-embedded.yaml",
                                        "params/h200-engines.yaml"])
def substitutes(request):
    f = pipeline.load_finding(request.param, NB, mode="replay")
    subs = [c for c in verdicts.verdict(f).checks if c.substitute]
    by_name = {g.name: g for g in f.study.gates}
    out = []
    for c in subs:
        name = re.match(r"substitute \(this suite's gate “(.+?)”\)", c.claim).group(1)
        out.append((by_name[name], c))
    assert out, request.param
    return request.param, out


def test_its_own_rule_and_value_not_the_articles(substitutes):
    _, subs = substitutes
    for gate, c in subs:
        own = substitute_gates.rule_words(gate)
        assert own in c.claim and own in c.rule  # visible in the check, not only the rule
        if gate.published:  # the article's gate is named as what it stands in for
            assert f"in place of the article's gate “{gate.published}”" in c.claim
            assert gate.published not in c.article
        assert "share of" not in c.measured and "share of" not in c.claim


def test_the_article_cell_is_at_the_gates_level_and_unit(substitutes):
    _, subs = substitutes
    for gate, c in subs:
        level = substitute_gates.where(gate)
        assert level in c.measured
        if c.article.startswith("not printed"):
            assert c.article.endswith(f"at {level}")
        elif gate.kind == "relative_pct":  # a change beside a change, at the same level
            assert re.match(r"[+-]\d+\.\d%", c.article) and re.match(r"[+-]\d+\.\d%", c.measured)
            assert c.article.endswith(f"; {level})"), c.article
        else:  # an arm-level figure in the gate's unit, said to have no level
            unit = substitute_gates.scale(gate)[1]
            assert unit in c.article and "no level" in c.article
        assert not re.search(r"\b(\d+) streams?\b", c.article.replace(level, "")), c.article


def test_default_suite_rows_as_a_reader_sees_them():
    f = pipeline.load_finding("params/default.yaml", NB, mode="replay")
    subs = {c.claim.split("”")[0].split("“")[1]: c for c in verdicts.verdict(f).checks
            if c.substitute}
    one = subs["one-stream acceptance"]
    # the article's own FP8-against-BF16 tokens per step at one stream: 3.04 against 3.31
    assert one.article == "-8.2% (3.04 tokens/step against 3.31 tokens/step; essays, 1 stream)"
    assert "tokens per step of drafter-fp8 at least -5% against drafter-bf16" in one.claim
    eight = subs["8-stream acceptance"]  # the article prints no 8-stream essays acceptance
    assert "32 streams" not in eight.article and "8 streams" in eight.article
    ident = subs["token identity with the unquantized drafter"]
    assert ident.measured == "100% (gsm8k, 1 stream)"
    assert "at least 90% (gsm8k, 1 stream)" in ident.claim


def test_a_share_reads_as_a_percentage_and_units_as_declared():
    share = Gate(name="g", metric="identical_to_baseline", workload="gsm8k", concurrency=8,
                 arm="drafter-fp8", op=">=", threshold=0.9, unit="share of requests")
    assert substitute_gates.rule_words(share) == (
        "outputs token-identical to the baseline arm of drafter-fp8 at least 90% "
        "(gsm8k, 8 streams)")
    row = {"value": 0.875, "measured": 0.875, "reference": None}
    assert substitute_gates.measured_words(share, row) == "87.5% (gsm8k, 8 streams)"
    correct = Gate(name="g", metric="gsm8k_strict_correct", workload="gsm8k", concurrency=8,
                   arm="drafter-fp8", op=">=", threshold=194, unit="of 200")
    assert substitute_gates.rule_words(correct).endswith("at least 194 of 200 (gsm8k, 8 streams)")
    memory = Gate(name="g", metric="peak_mem_mib", workload="essays", concurrency=8,
                  arm="drafter-fp8", op="<=", threshold=4096, unit="MiB")
    # the article's peak card memory of the FP8 drafter, over its runs (no level printed)
    assert substitute_gates.article_words(claims_for(NB), memory, 0.0) == (
        "80,814 MiB (over the article's runs, no level)")
