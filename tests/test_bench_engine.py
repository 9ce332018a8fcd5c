"""scripts/bench_engine.py runs end to end on the tiny checkpoint (figures are not checked:
a benchmark prints them; this keeps the script from rotting and checks what it reports)."""

from __future__ import annotations

import os

import pytest

from conftest import load_script

pytestmark = pytest.mark.usefixtures("one_torch_thread")

@pytest.fixture(scope="module")
def bench():
    return load_script("bench_engine")


def test_bf16_run_against_an_fp32_baseline_reports_pairings_and_near_ties(
        bench, tiny_checkpoint, capsys):
    if not os.environ.get("SPECREPRO_DATA_DIR"):
        pytest.skip("needs SPECREPRO_DATA_DIR (GSM8K test prompts)")
    res = bench.main(["--model", str(tiny_checkpoint), "--prompts", "2", "--max-tokens", "12",
                      "--methods", "dflash,ngram", "--ks", "2", "--streams", "1,2",
                      "--no-transformers", "--dtype", "bfloat16", "--baseline-dtype", "float32"])
    out = capsys.readouterr().out
    assert res["baseline_dtype"] == "float32" and res["dtype"] == "bfloat16"
    assert "# baseline: autoregressive in float32; speculative rows in bfloat16" in out
    assert [(r["method"], r["k"]) for r in res["methods"]] == [("dflash", 2), ("ngram", 2)]
    for r in res["methods"]:
        assert r["speedup"] > 0 and r["baseline_tok_s"] > 0 and 0 <= r["same_as_ar"] <= 1
        assert "outputs" not in r
        # every output that differs from the fp32 reference has its margin, and only those
        assert len(r.get("divergence_margins", [])) == round((1 - r["same_as_ar"]) * 2)
        assert all(m >= 0 for m in r.get("divergence_margins", []))
    assert set(res["aggregate_tok_s"]["none"]) == {1, 2}


def test_fp32_default_needs_no_second_model(bench, tiny_checkpoint):
    if not os.environ.get("SPECREPRO_DATA_DIR"):
        pytest.skip("needs SPECREPRO_DATA_DIR (GSM8K test prompts)")
    b = bench.Bench(bench.parse_args(["--model", str(tiny_checkpoint), "--prompts", "1"]))
    assert b.base_model is b.model and b.base_dtype == "float32"


def test_repeats_and_the_compiled_whole_step_pairing_on_the_cpu(bench, tiny_checkpoint, capsys):
    if not os.environ.get("SPECREPRO_DATA_DIR"):
        pytest.skip("needs SPECREPRO_DATA_DIR (GSM8K test prompts)")
    res = bench.main(["--model", str(tiny_checkpoint), "--prompts", "2", "--max-tokens", "10",
                      "--methods", "dflash", "--ks", "2", "--streams", "1", "--repeats", "2",
                      "--no-transformers", "--compile-best"])
    out = capsys.readouterr().out
    assert res["repeats"] == 2 and "best of 2" in out
    (row,) = res["methods"]
    assert row["tokens"] == 2 * 10  # the kept outputs: one per prompt, not one per repeat
    # tokens per step over every repeat's steps: at least 1, at most k + 1
    assert 1 <= row["tokens_per_step"] <= 3 and row["acceptance_length"] <= 3
    cb = res["compiled_best"]
    assert "error" not in cb, cb
    assert (cb["method"], cb["k"]) == ("dflash", 2) and cb["speedup"] > 0
    assert 0 <= cb["same_as_ar"] <= 1
    with pytest.raises(SystemExit):
        bench.parse_args(["--repeats", "0"])


def test_weight_layout_bench_runs_both_layouts(tiny_checkpoint, capsys):
    mod = load_script("bench_weight_layout")
    res = mod.main(["--model", str(tiny_checkpoint), "--rounds", "1", "--calls", "1",
                    "--no-compile"])
    n = 4 * 7 + 1  # the tiny target's linear layers: 7 in each of 4, and the output head
    assert [(r["layout"], r["mode"]) for r in res["rows"]] == [
        ("row_major", "eager"), ("k_major", "eager"),
        ("row_major", f"{n} GEMMs"), ("k_major", f"{n} GEMMs")]
    for r in res["rows"]:
        assert set(r["ms"]) == {1, 4, 8} and all(v > 0 for v in r["ms"].values())
        assert set(r["verify_over_decode"]) == {4, 8}
    assert "8/1" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        mod.parse_args(["--rounds", "0"])
