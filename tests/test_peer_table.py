"""analysis/finding/peer_table.py and scripts/peer.py: the peer table from constructed stores where the
answer is known (the best arm per level, ratios, a missed and a met target, a level one
engine lacks)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from conftest import load_script
from specrepro.analysis.finding import parity, peer_table
from specrepro.store import ResultStore, now

ARMS = ("none", "mtp-k3", "dflash-k7")


def store(root: Path, engine: str, rates: dict[tuple[str, int], list[float]],
          engine_side: dict | None = None) -> Path:
    """One engine's peer study: tok/s per (arm, streams), one cell per repeat, with the
    engine's own histogram means (engine_side) where given."""
    s = ResultStore(root / engine, "peer", "run")
    s.begin_session({"params": {"arms": [{"name": a} for a in ARMS]}})
    i = 0
    for (arm, conc), vals in rates.items():
        for rep, v in enumerate(vals):
            i += 1
            cid = hashlib.sha256(f"{engine}/{i}".encode()).hexdigest()[:16]
            s.append_cell({"cell_id": cid, "status": "ok", "engine": engine, "arm": arm,
                           "workload": "gsm8k", "temperature": 0.0, "concurrency": conc,
                           "repeat": rep, "n_prompts": 1, "ended_at": now(),
                           "agg_tok_s": v, "ttft_p50_ms": 2.0, "ttft_p95_ms": 3.0,
                           "acceptance_length": None if arm == "none" else 3.0,
                           "itl_p50_ms": 1.0, "e2e_p50_s": 0.25, **(engine_side or {})},
                          [{"request_idx": 0, "prompt_id": "p", "token_ids": [1]}])
    s.end_session()
    return s.root


def test_best_arm_per_level_ratios_and_targets(tmp_path):
    emb = store(tmp_path, "emb", {("none", 1): [1500, 1600], ("mtp-k3", 1): [1900],
                                  ("dflash-k7", 1): [2100], ("none", 8): [5000],
                                  ("mtp-k3", 8): [7000], ("dflash-k7", 8): [6000]})
    vll = store(tmp_path, "vllm", {("none", 1): [600], ("mtp-k3", 1): [800],
                                   ("dflash-k7", 1): [700], ("none", 8): [5500],
                                   ("dflash-k7", 8): [5200]})
    stores = [parity.load_store("embedded", emb), parity.load_store("vLLM", vll)]
    rows = {(r["engine"], r["concurrency"]): r for r in peer_table.rows(stores, "embedded")}
    assert rows[("embedded", 1)]["best speculative arm"] == "dflash-k7"
    assert rows[("embedded", 8)]["best speculative arm"] == "mtp-k3"  # the best moves with load
    assert rows[("vLLM", 1)]["best speculative arm"] == "mtp-k3"
    assert rows[("vLLM", 1)]["embedded's autoregressive over this (ratio)"] == 1550 / 600
    assert rows[("vLLM", 1)]["embedded's best over this (ratio)"] == 2100 / 800
    assert rows[("embedded", 1)]["autoregressive tok/s"]["mean"] == 1550
    lines = peer_table.targets(stores, "embedded")
    assert lines[0].endswith("2.58x (target >= 1.5x) met")
    assert lines[1].endswith("0.91x (target >= 1x) missed")
    assert "32 streams" not in "".join(lines)  # no level at 32 in either store: no line


def test_a_level_one_engine_lacks_is_said_not_zeroed(tmp_path):
    emb = store(tmp_path, "emb", {("none", 1): [1500], ("none", 32): [9000]})
    vll = store(tmp_path, "vllm", {("none", 1): [600]})
    stores = [parity.load_store("embedded", emb), parity.load_store("vLLM", vll)]
    r = {(x["engine"], x["concurrency"]): x for x in peer_table.rows(stores, "embedded")}
    assert r[("vLLM", 32)]["autoregressive tok/s"] is None
    assert r[("vLLM", 32)]["note"] == "no autoregressive cell at this level"
    assert any("32 streams: embedded against vLLM: not measured (vLLM has no" in line
               for line in peer_table.targets(stores, "embedded"))


def test_the_script_prints_the_table_and_the_targets(tmp_path, capsys):
    emb = store(tmp_path, "emb", {("none", 1): [1500]})
    vll = store(tmp_path, "vllm", {("none", 1): [600]})
    out = load_script("peer").main(["--store", f"embedded={emb}", "--store", f"vLLM={vll}"])
    text = capsys.readouterr().out
    assert "best speculative arm" in text and "2.50x (target >= 1.5x) met" in text
    assert out["targets"] and "Where the autoregressive arm's time goes" in text


def test_where_the_time_goes_sets_the_engines_histograms_beside_the_clients(tmp_path):
    emb = store(tmp_path, "emb", {("none", 1): [1500, 1600]},
                {"engine_ttft_ms": 1.5, "engine_itl_ms": 0.8, "engine_e2e_ms": 200.0})
    sgl = store(tmp_path, "sgl", {("none", 1): [700], ("dflash-k7", 1): [900]},
                {"engine_ttft_ms": 1.2, "engine_queue_ms": 0.1, "engine_itl_ms": 1.1,
                 "engine_e2e_ms": 230.0, "engine_busy_share": 0.4})
    old = store(tmp_path, "old", {("mtp-k3", 1): [800]})  # before the histograms were kept
    stores = [parity.load_store(n, p) for n, p in
              (("embedded", emb), ("SGLang", sgl), ("vLLM", old))]
    rows = {r["engine"]: r for r in peer_table.time_rows(stores)}
    assert rows["embedded"]["engine TTFT (ms)"] == 1.5
    assert rows["embedded"]["client end to end p50 (ms)"] == 250.0  # stored in seconds
    assert rows["embedded"]["engine queue (ms)"] is None  # no such histogram: empty, not 0
    assert rows["SGLang"]["GPU busy in forward passes (share of the cell)"] == 0.4
    assert rows["vLLM"]["note"] == "no autoregressive cell at this level"
    assert rows["vLLM"]["engine TTFT (ms)"] is None
    table = peer_table.time_table(stores)
    assert table.frame.height == 3 and table.caption.startswith("Where the autoregressive")


def test_targets_are_held_only_against_the_engines_named(tmp_path, capsys):
    """A store of the subject in another configuration sits in the table but is no peer to
    beat; naming the subject itself, or a name no store has, is an error naming it."""
    new = store(tmp_path, "new", {("none", 1): [1600]})
    old = store(tmp_path, "old", {("none", 1): [1500]})
    vll = store(tmp_path, "vllm", {("none", 1): [600]})
    stores = [parity.load_store(n, p) for n, p in
              (("embedded batched", new), ("embedded", old), ("vLLM", vll))]
    assert len(peer_table.targets(stores, "embedded batched")) == 2
    lines = peer_table.targets(stores, "embedded batched", against=["vLLM"])
    assert lines == [("gsm8k, 1 stream: embedded batched 1,600.0 tok/s against vLLM 600.0: "
                      "2.67x (target >= 1.5x) met")]
    with pytest.raises(parity.ParityError, match="against itself"):
        peer_table.targets(stores, "embedded batched", against=["embedded batched"])
    script = load_script("peer")
    with pytest.raises(SystemExit):
        script.main(["--store", f"a={new}", "--store", f"b={vll}", "--against", "c"])
    assert "--against: reference 'c' is not among the stores' names" in capsys.readouterr().err
