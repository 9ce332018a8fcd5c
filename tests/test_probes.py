"""A study's probes (params `probes:`, harness/probe_command.py, specrepro/probes.py): declared
and validated with the study, asked by `specrepro probe` against the embedded server on the
CPU (one that serves, one that does not start), stored in the study's manifest, and read
back for the report, including the answer a run's failed engine start already gave."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import polars as pl
import pytest
import yaml

from specrepro import probes
from specrepro.harness import probe_command
from specrepro.params import ParamsError, load_suite, resolve_study
from specrepro.store import ResultStore

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_study(tmp_path: Path, checkpoint: Path, probes_: list[dict],
                **extra) -> Path:
    params = tmp_path / "params"
    (params / "profiles").mkdir(parents=True)
    (params / "studies").mkdir()
    base = {"engine": "embedded", "command": ["{python}", "-m", "specrepro.embedded.serve"],
            "host": "127.0.0.1", "port": free_port(),
            "model": {"id": str(checkpoint), "revision": None, "served_name": "tiny"},
            "flags": {"max-model-len": 512, "max-num-seqs": 4},
            "speculative": {"method": "mtp", "num_speculative_tokens": 3},
            "env": {"OMP_NUM_THREADS": "1"}, "ready_timeout_s": 120}
    (params / "profiles" / "tiny.yaml").write_text(yaml.safe_dump(base))
    # a checkpoint folder with no weights: the server exits before it is ready
    broken = {**base, "port": free_port(),
              "model": {**base["model"], "id": str(tmp_path / "no-such-checkpoint")}}
    (params / "profiles" / "broken.yaml").write_text(yaml.safe_dump(broken))
    study = params / "studies" / "probe_tiny.yaml"
    study.write_text(yaml.safe_dump({
        "name": "probe_tiny", "notebook": "probe_tiny", "arms": [{"name": "mtp",
                                                                  "profile": "tiny"}],
        "workloads": [{"name": "essays", "n": 2, "form": "completion", "max_tokens": 8}],
        "concurrency": [1], "probes": probes_, **extra}))
    return study


PROBES = [
    {"name": "starts", "profile": "tiny", "question": "Does the tiny engine serve?"},
    {"name": "broken", "profile": "broken", "label": "a checkpoint that is not there",
     "question": "Does an engine with no checkpoint start?"},
]


def test_specrepro_probe_asks_once_stores_the_answers_and_the_report_reads_them(
        tiny_checkpoint, tmp_path, capsys):
    study = write_study(tmp_path, tiny_checkpoint, PROBES)
    results = tmp_path / "results"
    argv = [str(study), "--study", "probe_tiny", "--results-dir", str(results)]
    assert probe_command.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "starts (tiny): serves"
    assert out[1].startswith("broken (broken): does not start: profile 'broken': the engine "
                             "exited with code")
    store = ResultStore(results, "probe_tiny", "standalone")
    (session,) = store.manifest()["sessions"]
    assert session["probes_asked"] == ["starts", "broken"] and session["status"] == "ok"
    serves, broken = session["probes"]
    assert serves["answer"] == "serves" and serves["tokens"] > 0
    assert serves["engine"]["engine"] == "embedded" and serves["error"] is None
    assert broken["answer"] == "does not start" and "exited" in broken["error"]
    for rec in (serves, broken):  # each engine's whole log stays, gzipped
        assert rec["log"].endswith(".log.gz") and Path(rec["log"]).is_file()
    # asked once: the stored answers are shown, no engine starts, no session is added
    assert probe_command.main(argv) == 0
    assert "(stored earlier; --again asks anew)" in capsys.readouterr().out
    assert len(store.manifest()["sessions"]) == 1
    # the report's table: the latest answer per probe and where it comes from
    from specrepro.params import standalone_suite
    resolved = resolve_study(standalone_suite(study, "probe_tiny", study.parents[1] / "profiles"),
                             "probe_tiny")
    table = probes.answers(resolved, store.manifest())
    assert table["answer"].to_list() == ["serves", "does not start"]
    assert table["probe"].to_list() == ["starts", "a checkpoint that is not there"]
    assert table["source"].str.starts_with("specrepro probe, session ").all()
    assert table["log"].to_list() == ["logs/starts--tiny.log.gz", "logs/broken--broken.log.gz"]
    assert "; log /" not in table["why"][1] and "exited with code" in table["why"][1]
    # --again asks anew and keeps the earlier answers
    assert probe_command.main([*argv, "--again", "--probe", "broken"]) == 0
    capsys.readouterr()
    sessions = store.manifest()["sessions"]
    assert len(sessions) == 2 and sessions[1]["probes_asked"] == ["broken"]


def test_a_probe_the_study_does_not_declare_is_named(tiny_checkpoint, tmp_path, capsys):
    study = write_study(tmp_path, tiny_checkpoint, PROBES)
    assert probe_command.main([str(study), "--study", "probe_tiny", "--probe", "nope",
                               "--results-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "--probe 'nope': study 'probe_tiny' declares the probes ['starts', 'broken']" in err
    bare = write_study(tmp_path / "bare", tiny_checkpoint, [])
    assert probe_command.main([str(bare), "--study", "probe_tiny"]) == 2
    assert "study 'probe_tiny' declares no probes" in capsys.readouterr().err


def test_probes_are_validated_with_the_study(tiny_checkpoint, tmp_path):
    twice = write_study(tmp_path / "a", tiny_checkpoint, [PROBES[0], PROBES[0]])
    with pytest.raises(ParamsError, match=r"probes\[1\]\.name.*unique name, found 'starts' again"):
        probe_command.resolve(twice, ["probe_tiny"])
    missing = write_study(tmp_path / "b", tiny_checkpoint,
                          [{"name": "x", "profile": "nope", "question": "?"}])
    with pytest.raises(ParamsError, match=r"probes\[0\]\.profile.*found 'nope'"):
        probe_command.resolve(missing, ["probe_tiny"])
    no_question = write_study(tmp_path / "c", tiny_checkpoint, [{"name": "x", "profile": "tiny"}])
    with pytest.raises(ParamsError, match=r"probes\[0\]\.question"):
        probe_command.resolve(no_question, ["probe_tiny"])


def test_a_runs_failed_engine_start_answers_the_probe_of_its_profile():
    """The H200 suite's notebook 05: vLLM 0.26.0's online-FP8 drafter failed to start in a
    run (2026-12-02) before probes existed; that stored attempt is the probe's answer,
    matched through the session's own resolved params (the entry has no profile hash)."""
    suite = load_suite(ROOT / "params" / "h200-engines.yaml")
    study = resolve_study(suite, "05_fp8_drafter_gates")
    fp8 = next(p for p in study.probes if p.name == "vllm-online-fp8")
    error = ("profile 'vllm-0.26-dflash-k7-fp8-drafter': the engine exited with code 1 before "
             "it was ready (ValueError: hf_overrides must be a dict for get_quant_config to get "
             "the quantization config from it.); log /var/tmp/x/logs/drafter-fp8--vllm-0.26-"
             "dflash-k7-fp8-drafter.log, last lines:\n(APIServer pid=1059) RuntimeError: ...")
    arm = {"name": "drafter-fp8", "profile": fp8.profile,
           "resolved": fp8.resolved.model_dump(mode="json")}
    other = {**arm, "resolved": {**arm["resolved"], "flags": {**fp8.resolved.flags,
                                                               "max-num-seqs": 8}}}
    manifest = {"sessions": [
        {"session_id": "s1", "started_at": "2026-12-02T03:12:12+00:00",
         "params": {"arms": [arm]},
         "engines": [{"arm": "drafter-fp8", "profile": fp8.profile, "error": error}]},
        # the same profile name resolved otherwise answers another question
        {"session_id": "s2", "started_at": "2026-12-03T00:00:00+00:00",
         "params": {"arms": [other]},
         "engines": [{"arm": "drafter-fp8", "profile": fp8.profile, "version": "0.26.0"}]},
    ]}
    table = probes.answers(study, manifest, "params/h200-engines.yaml")
    row = table.row(by_predicate=pl.col("profile") == fp8.profile, named=True)
    assert row["answer"] == "does not start"
    assert row["why"] == ("profile 'vllm-0.26-dflash-k7-fp8-drafter': the engine exited with "
                          "code 1 before it was ready (ValueError: hf_overrides must be a dict "
                          "for get_quant_config to get the quantization config from it.)")
    assert row["source"] == "specrepro run (arm 'drafter-fp8'), session s1"
    assert row["log"] == "logs/drafter-fp8--vllm-0.26-dflash-k7-fp8-drafter.log.gz"
    # `specrepro probe` reads the same answer, so it does not start that engine again
    again = probe_command.answered(manifest, fp8)
    assert again["answer"] == "does not start" and again["probe"] == "vllm-online-fp8"
    assert again["why"] == row["why"] and again["source"] == row["source"]
    unasked = table.row(by_predicate=pl.col("profile") == "vllm-0.26-dflash-k7-fp8_per_tensor-drafter",
                        named=True)
    assert unasked["answer"] == "not asked yet"
    assert probe_command.answered(manifest, next(p for p in study.probes
                                                 if p.name == "vllm-online-fp8-per-tensor")) is None
    assert unasked["why"] == ("specrepro probe params/h200-engines.yaml --study "
                              "05_fp8_drafter_gates --probe vllm-online-fp8-per-tensor")


def test_the_committed_store_holds_the_vllm_probes_answer():
    """What the report shows for notebook 05 on the H200 suite, from the committed store."""
    suite = load_suite(ROOT / "params" / "h200-engines.yaml")
    study = resolve_study(suite, "05_fp8_drafter_gates")
    store = ResultStore(ROOT / "results" / "h200-engines", study.name, suite.run_id)
    table = probes.answers(study, store.manifest())
    row = table.row(0, named=True)
    assert row["answer"] == "does not start"
    assert "ValueError: hf_overrides must be a dict for get_quant_config" in row["why"]
    assert (store.root / row["log"]).is_file()
    log = json.dumps(row)
    assert "/var/tmp" not in log


def test_a_gpu_probe_is_never_answered_on_a_machine_without_one(tmp_path, capsys, monkeypatch):
    """vLLM not starting on a CPU machine says nothing of vLLM: refused, nothing stored."""
    from specrepro import provenance

    monkeypatch.setattr(provenance, "gpu_info", lambda: {"gpus": [], "note": "no NVML"})
    assert probe_command.main([str(ROOT / "params" / "h200-engines.yaml"), "--study",
                               "05_fp8_drafter_gates", "--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert ("probes vllm-online-fp8, vllm-online-fp8-per-tensor start their engine on a GPU"
            in err and "this machine has no NVIDIA GPU" in err)
    assert not any(tmp_path.iterdir())


def test_a_study_with_no_cells_says_what_its_probes_answered(tmp_path):
    """05 on the H200 suite before its SGLang arms ran (the committed store's manifest and
    logs, without its cells): the replay's error carries the probes' stored answers, so the
    reader learns why."""
    import shutil

    from specrepro import pipeline
    from specrepro.analysis.finding.finding import FindingError

    src = ROOT / "results" / "h200-engines" / "05_fp8_drafter_gates" / "h200-engines"
    dst = tmp_path / "05_fp8_drafter_gates" / "h200-engines"
    dst.mkdir(parents=True)
    shutil.copy(src / "manifest.json", dst)
    shutil.copytree(src / "logs", dst / "logs")
    with pytest.raises(FindingError) as err:
        pipeline.load_finding(str(ROOT / "params" / "h200-engines.yaml"),
                              "05_fp8_drafter_gates", "replay", results_dir=tmp_path)
    text = str(err.value)
    assert ("its probes, from the store: vLLM 0.26.0, drafter quantization fp8 "
            "(vllm-0.26-dflash-k7-fp8-drafter): does not start (profile") in text
    assert "ValueError: hf_overrides must be a dict for get_quant_config" in text


def test_a_probe_sends_one_request_where_the_study_windows_its_one_stream_cells(
        tiny_checkpoint, tmp_path, capsys):
    """The stand-in suites time one-stream cells in a counter window: a probe still sends
    one request (it asked several, and failed unpacking them, on the H100 on 2026-12-07),
    and records its engine's start to ready."""
    study = write_study(tmp_path, tiny_checkpoint, PROBES[:1],
                        window={"skip_s": 0.0, "window_s": 0.5, "turnovers": 1,
                                "max_window_s": 2.0, "min_concurrency": 1})
    results = tmp_path / "results"
    argv = [str(study), "--study", "probe_tiny", "--results-dir", str(results)]
    assert probe_command.main(argv) == 0
    assert capsys.readouterr().out.splitlines()[0] == "starts (tiny): serves"
    (session,) = ResultStore(results, "probe_tiny", "standalone").manifest()["sessions"]
    (rec,) = session["probes"]
    assert rec["answer"] == "serves" and rec["ready_s"] > 0
