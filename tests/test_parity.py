"""analysis/finding/parity.py and scripts/parity.py: engines' stores of one study matched cell for cell.

Constructed stores (written through ResultStore, cell ids that differ per engine as
real ones do) where the answer is known: identical outputs, a divergence at known positions,
a 6 % gap flagged and a 4 % one not, a missing arm and level, batch and repeat variance;
then the script on the committed H200 stores (vLLM 0.26.0 and the embedded engine).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import polars as pl
import pytest

from conftest import load_script
from specrepro.analysis.finding import parity, tables
from specrepro.store import ResultStore, now

ROOT = Path(__file__).resolve().parents[1]
VLLM = ROOT / "results/h200-engines/01_drafter_block_sweep/h200-engines"
EMBEDDED = ROOT / "results/h200-embedded/01_drafter_block_sweep/h200-embedded"
STUDY = "01_drafter_block_sweep"
TPS = tables.name("acceptance_length")
BASE = [list(range(100 + i, 180 + i)) for i in range(4)]  # 4 prompts x 80 tokens


def changed(tokens: list[int], at: int) -> list[int]:
    return [*tokens[:at], -1, *tokens[at + 1:]]


def cell(arm, concurrency, repeat, tps, outputs=None, **extra) -> dict:
    return {"arm": arm, "concurrency": concurrency, "repeat": repeat, "acceptance_length": tps,
            "outputs": BASE if outputs is None else outputs, **extra}


def write_store(root: Path, engine: str, cells: list[dict], arms=("mtp-k3", "dflash-k5")
                ) -> Path:
    """One engine's run of the study: its cells (CELL_SCHEMA figures plus `outputs`, token
    ids per prompt) as ok attempts, the study's arm order in the manifest."""
    store = ResultStore(root / engine, STUDY, "run")
    store.begin_session({"params": {"arms": [{"name": a} for a in arms]}})
    for i, c in enumerate(cells):
        c = dict(c)
        outputs = c.pop("outputs")
        cid = hashlib.sha256(f"{engine}/{i}".encode()).hexdigest()[:16]  # ids differ per engine
        row = {"cell_id": cid, "status": "ok", "engine": engine, "engine_version": "test",
               "workload": "humaneval", "temperature": 0.0, "n_prompts": len(outputs),
               "ended_at": now(), "agg_tok_s": 100.0, "ttft_p50_ms": 10.0,
               "itl_p50_ms": 1.0, "itl_request_mean_ms": 1.5, **c}
        store.append_cell(row, [{"request_idx": j, "prompt_id": f"humaneval-{j:04d}",
                                 "token_ids": t, "completion_tokens": len(t)}
                                for j, t in enumerate(outputs)])
    store.end_session()
    return store.root


def grid(tps=2.5, outputs=None, arms=("mtp-k3", "dflash-k5")) -> list[dict]:
    return [cell(a, c, r, tps, outputs) for a in arms for c in (1, 8) for r in (0, 1)]


def build(tmp_path, a_cells, b_cells, reference=None, **kw):
    stores = [parity.load_store("A", write_store(tmp_path, "a", a_cells)),
              parity.load_store("B", write_store(tmp_path, "b", b_cells))]
    return parity.tables_for(stores, reference, **kw)


def rows(table, **where) -> list[dict]:
    return [r for r in table.frame.to_dicts() if all(r.get(k) == v for k, v in where.items())]


# ------------------------------------------------------------------- outputs


def test_first_difference_counts_from_zero_and_a_prefix_differs_at_its_end():
    assert parity.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert parity.first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert parity.first_difference([5, 2], [1, 2]) == 0
    assert parity.first_difference([1, 2, 3], [1, 2]) == 2


def test_identical_engines_are_identical_everywhere(tmp_path):
    out = build(tmp_path, grid(), grid())
    ident = out["identity"].frame
    assert ident.height == 4  # 2 arms x 2 levels, B against A
    assert ident["prompts compared"].to_list() == [4] * 4
    assert ident["token-identical"].to_list() == [4] * 4
    assert ident["first difference, median (token position)"].null_count() == 4
    assert ident["differing before token 32"].to_list() == [0] * 4
    inv = out["invariance"].frame
    assert inv["token-identical"].to_list() == [4] * inv.height
    assert out["acceptance"].frame["gap against A (%)"].drop_nulls().to_list() == [0.0] * 4


def test_a_divergence_is_located_where_it_happens(tmp_path):
    # B: prompt 0 differs at 32, prompt 1 at 10, prompt 2 stops at 20 (a prefix), 3 the same
    diverged = [changed(BASE[0], 32), changed(BASE[1], 10), BASE[2][:20], BASE[3]]
    b = [cell(c["arm"], c["concurrency"], c["repeat"], 2.5,
              diverged if (c["arm"], c["concurrency"]) == ("mtp-k3", 1) else None)
         for c in grid()]
    ident = build(tmp_path, grid(), b)["identity"]
    (r,) = rows(ident, arm="mtp-k3", streams=1)
    assert r["token-identical"] == 1 and r["prompts compared"] == 4
    assert r["first difference, median (token position)"] == 20
    assert r["first difference, earliest (token position)"] == 10
    assert (r["differing before token 32"], r["differing before token 64"]) == (2, 3)
    assert [x["token-identical"] for x in rows(ident, arm="mtp-k3", streams=8)] == [4]


# ----------------------------------------------------------------- acceptance


def test_a_6_percent_gap_is_flagged_and_a_4_percent_one_is_not(tmp_path):
    tps = {("mtp-k3", 1): 2.65, ("mtp-k3", 8): 2.6, ("dflash-k5", 1): 2.35,
           ("dflash-k5", 8): 2.4}  # +6, +4, -6, -4 % against A's 2.5
    b = [{**c, "acceptance_length": tps[c["arm"], c["concurrency"]]} for c in grid()]
    acc = build(tmp_path, grid(), b)["acceptance"]
    gap, flag = "gap against A (%)", "gap above 5 %"
    got = {(r["arm"], r["streams"]): (round(r[gap], 6), r[flag])
           for r in rows(acc, engine="B")}
    assert got == {("mtp-k3", 1): (6.0, True), ("mtp-k3", 8): (4.0, False),
                   ("dflash-k5", 1): (-6.0, True), ("dflash-k5", 8): (-4.0, False)}
    (ref,) = rows(acc, arm="mtp-k3", streams=1, engine="A")
    assert ref[gap] is None and ref["note"] == "reference"


def test_a_named_reference_turns_the_gap_and_the_threshold_is_a_parameter(tmp_path):
    b = [{**c, "acceptance_length": 2.65} for c in grid()]
    acc = build(tmp_path, grid(), b, reference="B", threshold_pct=6.5)["acceptance"]
    (r,) = rows(acc, arm="mtp-k3", streams=1, engine="A")
    assert r["gap against B (%)"] == pytest.approx((2.5 / 2.65 - 1) * 100)
    assert r["gap above 6.5 %"] is False


def test_repeats_agree_exactly_only_when_every_repeat_has_the_same_figure(tmp_path):
    a = [{**c, "acceptance_length": 2.5 + 0.01 * c["repeat"] * (c["concurrency"] == 8),
          "per_position_acceptance": [0.6, 0.2 + 0.1 * c["repeat"]]} for c in grid()]
    acc = build(tmp_path, a, grid())["acceptance"]
    (one,) = rows(acc, arm="mtp-k3", streams=1, engine="A")
    (eight,) = rows(acc, arm="mtp-k3", streams=8, engine="A")
    assert one["repeats agree exactly"] is True and eight["repeats agree exactly"] is False
    assert one[TPS] == 2.5 and eight[TPS] == pytest.approx(2.505) and one["repeats"] == 2
    assert one[tables.name("acceptance_rate_pos")] == pytest.approx([60.0, 25.0])


def test_a_later_cell_at_the_same_key_replaces_the_earlier_and_is_noted(tmp_path):
    a = [*grid(), cell("mtp-k3", 1, 0, 3.0)]  # measured again, later: this one counts
    acc = build(tmp_path, a, grid())["acceptance"]
    (r,) = rows(acc, arm="mtp-k3", streams=1, engine="A")
    assert r[TPS] == pytest.approx(2.75) and r["repeats"] == 2
    assert acc.notes == ("A: 1 older ok cell(s) at a key measured again left out",)


# ------------------------------------------------------------- missing cells


def test_a_folder_above_one_run_is_refused(tmp_path):
    write_store(tmp_path, "a", grid())
    ResultStore(tmp_path / "a", STUDY, "other").append_cell(
        {"cell_id": "0" * 16, "status": "ok", "arm": "mtp-k3"})
    with pytest.raises(parity.ParityError, match=r"holds 2 runs .*give one"):
        parity.load_store("A", tmp_path / "a")


def test_a_missing_arm_and_level_give_rows_saying_so_never_zeros(tmp_path):
    b = [c for c in grid() if c["arm"] == "mtp-k3" and c["concurrency"] == 1]
    out = build(tmp_path, grid(), b)
    acc, speed, ident = out["acceptance"], out["speed"], out["identity"]
    assert acc.frame.height == speed.frame.height == 8  # every arm x level x engine
    (arm,) = rows(acc, arm="dflash-k5", streams=1, engine="B")
    (level,) = rows(acc, arm="mtp-k3", streams=8, engine="B")
    for r in (arm, level):
        assert r[TPS] is None and r["repeats"] is None and r["gap against A (%)"] is None
    assert arm["note"] == "not measured: no arm dflash-k5 in this store"
    assert level["note"] == "not measured: arm mtp-k3 has no cells at this level in this store"
    (s,) = rows(speed, arm="dflash-k5", streams=8, engine="B")
    assert s[tables.name("agg_tok_s")] is None and s["note"].startswith("not measured: no arm")
    (i,) = rows(ident, arm="dflash-k5", streams=1)
    assert i["token-identical"] is None and i["prompts compared"] is None
    assert i["note"] == "not measured: no arm dflash-k5 in this store"
    inv = rows(out["invariance"], engine="B", arm="dflash-k5")
    assert inv and all(r["token-identical"] is None and r["note"] for r in inv)


# ----------------------------------------------------------------- invariance


def test_batch_repeat_and_arm_variance_are_detected(tmp_path):
    def outputs(c):
        if c["concurrency"] == 8 and c["arm"] == "mtp-k3":
            return [changed(BASE[0], 5), *BASE[1:]]  # batch variant at 8 streams
        if c["arm"] == "dflash-k5" and c["concurrency"] == 1 and c["repeat"] == 1:
            return [BASE[0], changed(BASE[1], 50), BASE[2], changed(BASE[3], 70)]  # and at 50
        if c["arm"] == "dflash-k5" and c["concurrency"] == 1:
            return [*BASE[:3], changed(BASE[3], 70)]  # the arm differs from mtp-k3
        return BASE
    b = [{**c, "outputs": outputs(c)} for c in grid()]
    inv = build(tmp_path, grid(), b)["invariance"]
    assert inv.frame.height == 2 * (2 * 2 + 2 + 1)  # per engine: repeats x levels, batch, arm
    assert all(r["token-identical"] == 4 for r in rows(inv, engine="A"))

    def one(comparison, arm):
        (r,) = rows(inv, engine="B", arm=arm, comparison=comparison)
        return r["token-identical"], r["first difference, earliest (token position)"]
    assert one("8 streams against 1 stream, repeat 0", "mtp-k3") == (3, 5)
    assert one("repeat 1 against repeat 0 at 8 streams", "mtp-k3") == (4, None)
    assert one("repeat 1 against repeat 0 at 1 stream", "dflash-k5") == (3, 50)
    assert one("against mtp-k3 at 1 stream, repeat 0", "dflash-k5") == (3, 70)
    assert not rows(inv, engine="B", arm="mtp-k3", comparison="against mtp-k3 at 1 stream, "
                                                              "repeat 0")


# --------------------------------------------------------------- speed, render


def test_speed_gives_spreads_and_ratios_to_the_reference(tmp_path):
    b = [{**c, "agg_tok_s": 150.0 + 10 * c["repeat"], "ttft_p50_ms": 5.0} for c in grid()]
    speed = build(tmp_path, grid(), b)["speed"]
    (r,) = rows(speed, arm="mtp-k3", streams=8, engine="B")
    assert r[tables.name("agg_tok_s")] == {"mean": 155.0, "min": 150.0, "max": 160.0}
    assert r["aggregate decode throughput over A's (ratio)"] == pytest.approx(1.55)
    assert r["median time to first token over A's (ratio)"] == pytest.approx(0.5)
    (a,) = rows(speed, arm="mtp-k3", streams=8, engine="A")
    assert a["aggregate decode throughput over A's (ratio)"] is None and a["note"] == "reference"


def test_render_writes_numbers_once_and_nulls_as_n_a():
    t = tables.Table(pl.DataFrame({"arm": ["x"], "n": [1234], "ok": [True], "pos": [[60.0, 0.5]],
                                   "s": [{"mean": 2.0, "min": 1.0, "max": 3.0}], "g": [None]}),
                     "what it shows", ("a note",))
    assert parity.render(t, markdown=True).splitlines() == [
        "what it shows", "", "| arm | n | ok | pos | s | g |",
        "| --- | ---: | --- | --- | ---: | --- |", "| x | 1,234 | yes | 60, 0.5 | 2 (1–3) | n/a |",
        "", "Note: a note"]
    plain = parity.render(t).splitlines()
    assert plain[2].split() == ["arm", "n", "ok", "pos", "s", "g"]
    assert plain[4] == "x    1,234  yes  60, 0.5  2 (1–3)  n/a"


# ------------------------------------------------------------------- the script


@pytest.fixture(scope="module")
def script():
    return load_script("parity")


def test_bad_arguments_are_named(tmp_path, script, capsys):
    good = f"A={write_store(tmp_path, 'a', grid())}"
    empty = tmp_path / "empty" / STUDY / "run"
    empty.mkdir(parents=True)
    for argv, message in [
            ([good, f"B={tmp_path / 'nope'}"], r"--store 'B=.*nope': .*no such directory"),
            ([good, f"B={empty}"], r"--store 'B=.*empty.*': .*holds no ok cells"),
            ([good, "B"], r"--store 'B': expected NAME=PATH"),
            ([good], r"--store: two or more"),
            ([good, good], r"--store: names must differ")]:
        with pytest.raises(SystemExit):
            script.main([a for s in argv for a in ("--store", s)])
        assert re.search(message, capsys.readouterr().err), message
    with pytest.raises(SystemExit):
        script.main(["--store", good, "--store", good.replace("A=", "B=", 1),
                     "--reference", "C"])
    assert "--reference: reference 'C' is not among the stores' names: 'A', 'B'" in \
        capsys.readouterr().err


def test_the_committed_h200_stores(script, capsys):
    out = script.main(["--store", f"vLLM 0.26.0={VLLM}", "--store", f"embedded={EMBEDDED}",
                       "--markdown"])
    text = capsys.readouterr().out
    for title in ("## Acceptance", "## Identity across engines", "## Invariance", "## Speed"):
        assert title in text
    assert text.count("| arm | streams | engine |") == 3
    stores = [parity.load_store("v", VLLM), parity.load_store("e", EMBEDDED)]
    assert stores[1].cells.height == 24  # 4 arms x 1 and 8 streams x 3 repeats
    pairs = {(a, c) for st in stores for a, c in st.cells.select("arm", "concurrency").rows()}
    acc, ident, inv, speed = (out[k] for k in ("acceptance", "identity", "invariance", "speed"))
    # a row per arm, level and engine where either engine measured the level
    assert acc.frame.height == speed.frame.height == 2 * len(pairs)
    assert ident.frame.height == len(pairs)
    assert set(inv.frame["engine"]) == {"vLLM 0.26.0", "embedded"}
    assert acc.caption.endswith("all at humaneval, T=0")
    (k7,) = rows(acc, arm="dflash-k7", streams=1, engine="vLLM 0.26.0")
    assert round(k7[TPS], 2) == 2.78 and k7["repeats"] == 3 and k7["repeats agree exactly"]
    assert len(k7[tables.name("acceptance_rate_pos")]) == 7
    (mtp,) = rows(ident, arm="mtp-k3", streams=1)
    assert (mtp["token-identical"], mtp["prompts compared"]) == (7, 32)
    # the embedded engine is batch-, repeat- and arm-invariant; vLLM is not at 8 streams
    assert set(inv.frame.filter(pl.col("engine") == "embedded")["token-identical"]
               .drop_nulls()) == {32}
    # each engine's own highest level against its lowest: 16 streams on vLLM, 8 embedded
    (batch,) = rows(inv, engine="vLLM 0.26.0", arm="dflash-k7",
                    comparison="16 streams against 1 stream, repeat 0")
    assert batch["token-identical"] == 14
    (batch,) = rows(inv, engine="vLLM 0.26.0", arm="dflash-k4",
                    comparison="16 streams against 1 stream, repeat 0")
    assert batch["token-identical"] == 22
    assert len(rows(inv, engine="embedded", comparison="8 streams against 1 stream, repeat 0")) == 4
    assert not any(r["gap above 5 %"] for r in acc.frame.to_dicts())


# ------------------------------------------------------------- end of text, near-ties

def test_outputs_are_compared_up_to_the_end_of_text_and_the_rest_is_noted(tmp_path):
    """SGLang 0.5.14 under speculation returns accepted tokens past the end of text."""
    assert parity.until_eos([5, 6, 0, 9, 9], frozenset({0, 2})) == ([5, 6, 0], True)
    assert parity.until_eos([5, 6, 2], frozenset({0, 2})) == ([5, 6, 2], False)
    assert parity.until_eos([5, 6], frozenset()) == ([5, 6], False)
    ended = [[*t[:40], 0] for t in BASE]
    ref = write_store(tmp_path, "ref", [cell("mtp-k3", 1, 0, 2.5, ended)], arms=("mtp-k3",))
    other = write_store(tmp_path, "other", [cell("mtp-k3", 1, 0, 2.5,
                                                 [[*t, 7, 7] for t in ended])], arms=("mtp-k3",))
    stores = [parity.load_store("ref", ref, eos=(0,)), parity.load_store("other", other, eos=(0,))]
    assert stores[1].past_eos == 4
    table = parity.identity_table(stores)
    assert table.frame["token-identical"].to_list() == [4]
    note = "other: 4 output(s) carried tokens after the end-of-text token; compared up to it"
    assert table.notes == (note,)
    whole = parity.load_store("other", other)  # no end-of-text ids: compared whole
    assert parity.identity_table([stores[0], whole]).frame["token-identical"].to_list() == [0]


def test_a_parting_is_explained_only_by_a_near_tie_between_the_two_chosen_tokens(tmp_path):
    from specrepro.analysis.finding import near_ties

    # the target's view at each first differing position, by prompt: (token, logprob, logit)
    views = {"humaneval-0000": [(-1, -0.70, 10.0), (140, -0.72, 9.98), (9, -3.0, 7.7)],
             "humaneval-0001": [(141, -0.60, 10.0), (-1, -0.66, 9.94), (9, -3.0, 7.7)],
             "humaneval-0002": [(142, -0.50, 10.0), (-1, -0.80, 9.7), (9, -3.0, 7.7)],
             "humaneval-0003": [(143, -0.70, 10.0), (9, -0.71, 9.99), (-1, -3.0, 7.7)]}
    seen = []

    def top(prompt_id, prefix):
        seen.append((prompt_id, len(prefix)))
        return views[prompt_id]

    scorer = near_ties.Scorer(top, "a table")
    ref = write_store(tmp_path, "ref", [cell("none", 1, 0, None), cell("mtp-k3", 1, 0, 2.5)],
                      arms=("none", "mtp-k3"))
    other = write_store(tmp_path, "other", [
        cell("none", 1, 0, None),
        cell("mtp-k3", 1, 0, 2.6, [changed(t, 40) for t in BASE])], arms=("none", "mtp-k3"))
    stores = [parity.load_store("ref", ref), parity.load_store("other", other)]
    out = near_ties.tables(stores, scorer)
    s = out["summary"].frame
    row = s.filter((s["engine"] == "other") & (s["arm"] == "mtp-k3")).row(0, named=True)
    assert (row["prompts compared"], row["token-identical"], row["differing"]) == (4, 0, 4)
    # 0000: margin 0.02 between the two (explained); 0001: 0.06, within one bf16 step
    # (0.0625 at a logit of 10); 0002: 0.30; 0003: the engine's token is third
    assert (row["near-tie (explained)"], row["not a near-tie"],
            row["of those, within one bf16 step"]) == (1, 3, 1)
    d = out["details"].frame.filter(out["details"].frame["engine"] == "other")
    assert d["explained"].to_list() == [True, False, False, False]
    assert d["within one bf16 step"].to_list() == [True, True, False, False]
    assert d["position"].to_list() == [40] * 4 and set(seen) == {(p, 40) for p in views}
    assert d["engine token rank"].to_list() == [1, 2, 2, 3]
    others = s.filter(s["arm"] == "none")["token-identical"].to_list()
    assert others == [4]  # the other engine's autoregressive text is the reference's
    assert near_ties.bf16_step(10.0) == 0.0625 and near_ties.bf16_step(-3.0) == 2.0 ** -6
    with pytest.raises(parity.ParityError, match="reference arm 'auto' is not an arm of ref"):
        near_ties.tables(stores, scorer, reference_arm="auto")


PARITY_H200 = {name: ROOT / path for name, path in (
    ("embedded", "results/h200-embedded/parity-embedded/h200-embedded"),
    ("vLLM 0.26.0", "results/h200-engines/parity-vllm/h200-engines"),
    ("SGLang 0.5.14", "results/h200-engines/parity-sglang/h200-engines"))}


def test_the_committed_h200_parity_stores_with_near_ties(capsys, monkeypatch):
    """The script on the parity study's three H200 stores: every arm of each engine, the
    SGLang outputs cut at the end of text, every parting scored by the fp32 target."""
    data = Path(os.environ.get("SPECREPRO_DATA_DIR", ROOT.parent / "shared" / "data"))
    if not (data / "gsm8k" / "test.jsonl").exists():  # the prompts are rebuilt from it
        pytest.skip(f"GSM8K is not in {data}")
    monkeypatch.setenv("SPECREPRO_DATA_DIR", str(data))
    mod = load_script("parity")
    out = mod.main([a for n, p in PARITY_H200.items() for a in ("--store", f"{n}={p}")]
                   + ["--near-ties"])
    acc = out["acceptance"].frame
    assert acc.filter(acc["engine"] == "SGLang 0.5.14").height == 16  # 13 arms + vLLM's 3
    ties = out["near_ties"].frame
    assert set(ties["engine"].to_list()) == {"embedded", "vLLM 0.26.0", "SGLang 0.5.14"}
    assert (ties["near-tie (explained)"] + ties["not a near-tie"] == ties["differing"]).all()
    assert any("SGLang 0.5.14:" in n and "end-of-text" in n for n in out["identity"].notes)
    assert out["crossings"].frame["positions"].to_list()[0] > 1000  # 32 outputs of GSM8K
    assert "Where outputs part" in capsys.readouterr().out


def test_crossings_count_the_near_ties_along_each_output():
    from specrepro.analysis.finding import near_ties

    t = near_ties.crossings({"a": [0.01, 0.5, 0.04], "b": [0.2], "c": [1.0]}, (0.05, 0.3))
    rows = t.frame.to_dicts()
    assert [r["positions"] for r in rows] == [5, 5]
    assert [r["share of positions (%)"] for r in rows] == [40.0, 60.0]
    assert [r["per output, mean"] for r in rows] == [2 / 3, 1.0]
    assert [r["outputs crossing none"] for r in rows] == [2, 1]
