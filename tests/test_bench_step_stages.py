"""scripts/bench_step_stages.py runs end to end on the tiny checkpoint; its derived columns
are what they say (figures themselves are not checked: a benchmark prints them)."""

from __future__ import annotations

import pytest

from conftest import load_script


@pytest.fixture(scope="module")
def stages():
    return load_script("bench_step_stages")


def test_every_drafter_and_k_gets_its_stages_and_derived_costs(stages, tiny_checkpoint, capsys):
    from specrepro.embedded.checkpoint import list_drafters

    res = stages.main(["--model", str(tiny_checkpoint), "--ks", "2,3", "--context", "12",
                       "--iters", "3", "--speedups", "1.5,3"])
    out = capsys.readouterr().out
    names = list_drafters(tiny_checkpoint)
    assert [(r["drafter"], r["k"]) for r in res["rows"]] == [(n, k) for n in names
                                                             for k in (2, 3)]
    assert res["decode_ms"] > 0 and "decode (one-token target pass)" in out
    for r in res["rows"]:
        parts = [r[s] for s in ("verify", "propose", "observe", "accept")]
        assert all(p > 0 for p in parts)
        assert r["step"] == pytest.approx(sum(parts))
        assert r["cost_decodes"] == pytest.approx(r["step"] / res["decode_ms"])
        assert r["tau_needed"] == pytest.approx({"1.5": 1.5 * r["cost_decodes"],
                                                 "3.0": 3 * r["cost_decodes"]})
        assert r["method"] == names[r["drafter"]]


def test_an_unknown_drafter_is_refused_naming_the_index(stages, tiny_checkpoint):
    with pytest.raises(SystemExit, match=r"--drafters: \['nope'\] not in .*drafters.json"):
        stages.main(["--model", str(tiny_checkpoint), "--drafters", "dflash,nope"])
