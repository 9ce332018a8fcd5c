"""How each arm's engine started (analysis/finding/engine_starts.py): the committed H200 stores' own
start-up records (vLLM 0.26.0's NVFP4 target on Marlin, its online FP8 on CUTLASS), and the
rules that pick an arm's records out of a manifest."""

from __future__ import annotations

from pathlib import Path

import pytest

from specrepro import identity
from specrepro.analysis.finding import engine_starts
from specrepro.params import load_suite, resolve_study
from specrepro.store import ResultStore

ROOT = Path(__file__).resolve().parents[1]
# the committed H200 stores are keyed by the exported folders' fingerprints
pytestmark = pytest.mark.usefixtures("engine_exports")


def h200_study(notebook: str):
    suite = load_suite(ROOT / "params" / "h200-engines.yaml")
    study = resolve_study(suite, notebook)
    return study, ResultStore(ROOT / "results" / "h200-engines", study.name,
                              suite.run_id).manifest()


def test_the_nvfp4_targets_marlin_line_and_the_fp8_targets_kernel_are_in_the_report():
    """Article B's "zero Marlin" check turned around: on Hopper vLLM says it runs NVFP4
    through Marlin, and the report shows that line beside the arm it belongs to. The NVFP4
    target started twice: at 2026-12-02 05:26 UTC from an export whose input scales were
    calibrated in bf16 (bytes that depended on the CPU; another profile hash), and at 16:36
    UTC from the float64-calibrated export this checkout writes. Only the second is this
    arm's, and it is counted once, with no "[started as profile …]" label."""
    study, manifest = h200_study("03_target_precision")
    table = engine_starts.starts(study, manifest)
    rows = list(table.iter_rows(named=True))
    assert [r["arm"] for r in rows] == [a.label for a in study.arms]
    assert [r["starts"] for r in rows] == [1, 1, 1]
    bf16, nvfp4, fp8 = rows
    assert "fp4_gemm: MarlinNvFp4LinearKernel" in nvfp4["kernels the engine chose"]
    assert ("fp4_marlin: Weight-only FP4 compression will be used leveraging the Marlin kernel"
            in nvfp4["kernels the engine chose"])
    assert "fp8_linear: CutlassFP8ScaledMMLinearKernel" in fp8["kernels the engine chose"]
    assert "fp4" not in bf16["kernels the engine chose"]
    assert "fp8" not in bf16["kernels the engine chose"]
    assert (bf16["KV pool (tokens)"], nvfp4["KV pool (tokens)"],
            fp8["KV pool (tokens)"]) == (7_264_720, 7_265_360, 7_259_696)
    assert {r["engine"] for r in rows} == {"vllm 0.26.0"}
    assert all(r["attention"] == "FLASH_ATTN" and r["failed starts"] == 0
               for r in rows)


def test_an_arms_records_are_its_own_profile_as_resolved_now():
    study, _ = h200_study("06_draft_schedule_under_load")
    arm = next(a for a in study.arms if a.name == "static-k3")
    k7 = next(a for a in study.arms if a.name == "static-k7")
    want = identity.profile_hash(arm.resolved)
    up = {"kv_pool_tokens": 100, "max_concurrency": 2.5, "max_running_requests": None,
          "attention_backend": "FLASH_ATTN", "kernels": {"b": "2", "a": "1"}}
    manifest = {"sessions": [
        {"engines": [
            {"arm": "static-k3", "profile": arm.resolved.name, "profile_hash": want,
             "ready_s": 106.2, "version": "0.26.0", "startup": up},
            # a failed start: counted, its facts not shown
            {"arm": "static-k3", "profile": arm.resolved.name, "profile_hash": want,
             "error": "exited"},
            # the same arm under a profile since changed: not this arm's record
            {"arm": "static-k3", "profile": arm.resolved.name, "profile_hash": "other",
             "ready_s": 1.0, "startup": {**up, "kv_pool_tokens": 1}},
        ]},
        {"engines": [
            # a record older than profile hashes, matched by the profile's name
            {"arm": "static-k3", "profile": arm.resolved.name, "ready_s": 79.2,
             "version": "0.26.0", "startup": {**up, "kv_pool_tokens": 200}},
            {"arm": "none", "profile": "vllm-0.26-none", "error": "exited"},
        ]},
        # an arm started only under another form of its profile (an export written anew):
        # its row stays, saying so
        {"engines": [{"arm": "static-k7", "profile": k7.resolved.name, "profile_hash": "old",
                      "ready_s": 90.0, "version": "0.26.0", "startup": up}]},
    ]}
    table = engine_starts.starts(study, manifest)
    rows = {r["arm"]: r for r in table.iter_rows(named=True)}
    k3 = rows[arm.label]
    assert (k3["starts"], k3["failed starts"], k3["ready (s)"]) == (2, 1, "79.2\u2013106")
    assert k3["KV pool (tokens)"] == 200  # the latest successful start
    assert k3["kernels the engine chose"] == "a: 1; b: 2"
    none = rows[next(a.label for a in study.arms if a.name == "none")]
    assert (none["starts"], none["failed starts"], none["ready (s)"]) == (0, 1, "")
    assert none["KV pool (tokens)"] is None
    older = rows[f"{k7.label} [started as profile old; resolved now it is "
                 f"{identity.profile_hash(k7.resolved)}: not this arm's cells]"]
    assert (older["starts"], older["KV pool (tokens)"]) == (1, 100)
    assert len(rows) == 3  # arms with no record are left out
    assert engine_starts.starts(study, {"sessions": []}).height == 0


def test_the_weights_each_arm_loaded_are_its_start_logs_figure():
    """vLLM's "Model loading took N GiB" (target and drafter) per arm: on the H100 stand-in,
    the BF16 target 24.3 GiB, FP8 13.85 and NVFP4 9.25, the drafter BF16 in all three (the
    figure that shows an FP8 drafter, notebook 05, falling by what FP8 saves)."""
    suite = load_suite(ROOT / "params" / "h100-standin.yaml")
    study = resolve_study(suite, "03_target_precision")
    manifest = ResultStore(ROOT / "results" / "h100-standin", study.name,
                           suite.run_id).manifest()
    rows = {r["arm"]: r["weights in memory (GiB)"]
            for r in engine_starts.starts(study, manifest).iter_rows(named=True)}
    by_name = {a.name: rows.get(a.label or a.name) for a in study.arms}
    assert (by_name["target-bf16"], by_name["target-fp8"], by_name["target-nvfp4"]) == (
        24.3, 13.85, 9.25)
    assert engine_starts._weights_gib({"phases": {}}) is None
    assert engine_starts._weights_gib({}) is None
