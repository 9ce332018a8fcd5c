"""Where an engine's time goes (harness/profiling.py, harness/profile_command.py): a trace's
summary, each engine's way of turning its profiler on, and `specrepro profile` end to end on
the embedded server on the CPU, whose trace is torch.profiler's own."""

from __future__ import annotations

import gzip
import json
import socket
from pathlib import Path

import pytest
import yaml

from specrepro.harness import engines, profile_command, profiling
from specrepro.harness.engines import render_argv
from specrepro.harness.engines.base import EngineError
from specrepro.params import load_profile

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "params" / "profiles"


def event(cat: str, name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


def test_a_gpu_trace_sums_busy_time_once_where_streams_overlap(tmp_path):
    """Kernels 0-10 and 5-20 µs overlap (20 µs busy, not 25), then a copy at 50-60; the
    span is 0-100 µs (the last CPU op ends there): busy 30 µs, idle 70 %."""
    events = [event("kernel", "gemm", 0, 10), event("kernel", "attn", 5, 15),
              event("gpu_memcpy", "Memcpy HtoD", 50, 10),
              event("cuda_runtime", "cudaLaunchKernel", 0, 2),
              event("cuda_runtime", "cudaLaunchKernel", 4, 2),
              event("cuda_runtime", "cudaGraphLaunch", 40, 3),
              event("cpu_op", "aten::mm", 0, 30), event("cpu_op", "aten::mm", 60, 40),
              {"ph": "i", "name": "an instant event, not counted", "ts": 500}]
    path = tmp_path / "w.pt.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    s = profiling.summarize(path)
    assert s.span_us == 100 and s.gpu_busy_us == 30 and s.gpu_idle_share == pytest.approx(0.7)
    assert [(r.name, r.total_us, r.count) for r in s.kernels] == [
        ("attn", 15, 1), ("gemm", 10, 1), ("Memcpy HtoD", 10, 1)]
    assert s.cpu_ops[0].name == "aten::mm" and s.cpu_ops[0].mean_us == 35
    text = profiling.render(s)
    assert "GPU busy 0.03 ms, idle 70.0% of the span; 3 GPU operations" in text
    assert "kernel launches 2, CUDA graph launches 1" in text
    assert profiling.traces_in(tmp_path) == [path]


def test_a_bad_trace_is_named(tmp_path):
    bad = tmp_path / "x.pt.trace.json"
    bad.write_text("{not json")
    with pytest.raises(profiling.TraceError, match="x.pt.trace.json: not a readable trace"):
        profiling.summarize(bad)
    bad.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(profiling.TraceError, match="no complete events"):
        profiling.summarize(bad)


def test_each_engine_turns_its_profiler_on_its_own_way(tmp_path):
    """vLLM: --profiler-config with an absolute folder; SGLang: its environment variable;
    the embedded server: --profile-dir; an attached engine cannot be asked."""
    out = tmp_path / "traces"
    vllm = load_profile(PROFILES / "vllm-0.26-none.yaml")
    argv = render_argv(engines.adapter_for(vllm).profiled(vllm, out))
    config = json.loads(argv[argv.index("--profiler-config") + 1])
    assert config == {"profiler": "torch", "torch_profiler_dir": str(out.resolve())}
    sglang = load_profile(PROFILES / "sglang-0.5.14-none.yaml")
    traced = engines.adapter_for(sglang).profiled(sglang, out)
    assert traced.env["SGLANG_TORCH_PROFILER_DIR"] == str(out.resolve())
    assert render_argv(traced) == render_argv(sglang)  # the same command
    embedded = load_profile(PROFILES / "embedded-none.yaml")
    argv = render_argv(engines.adapter_for(embedded).profiled(embedded, out))
    assert argv[argv.index("--profile-dir") + 1] == str(out.resolve())
    attach = load_profile(PROFILES / "attach-local.yaml")
    with pytest.raises(EngineError, match="no profiler this harness can turn on"):
        engines.adapter_for(attach).profiled(attach, out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_study(tmp_path: Path, checkpoint: Path, arm: str, n: int, max_tokens: int,
               **profile) -> Path:
    """A study of one arm on the embedded server at 1 and 2 streams (profile: more keys)."""
    params = tmp_path / "params"
    (params / "profiles").mkdir(parents=True)
    (params / "studies").mkdir()
    (params / "profiles" / "tiny.yaml").write_text(yaml.safe_dump({
        "engine": "embedded", "command": ["{python}", "-m", "specrepro.embedded.serve"],
        "host": "127.0.0.1", "port": free_port(),
        "model": {"id": str(checkpoint), "revision": None, "served_name": "tiny"},
        "env": {"OMP_NUM_THREADS": "1"}, "ready_timeout_s": 120, **profile}))
    study = params / "studies" / "peer_tiny.yaml"
    study.write_text(yaml.safe_dump({
        "name": "peer_tiny", "notebook": "peer", "arms": [{"name": arm, "profile": "tiny"}],
        "workloads": [{"name": "essays", "n": n, "form": "completion", "max_tokens": max_tokens}],
        "concurrency": [1, 2], "sampling": [{"temperature": 0.0}], "seed": 7}))
    return study


def test_specrepro_profile_traces_the_embedded_engine_on_the_cpu(tiny_checkpoint, tmp_path,
                                                                 capsys, monkeypatch):
    study = tiny_study(tmp_path, tiny_checkpoint, "mtp", 4, 16,
                       flags={"max-model-len": 512, "max-num-seqs": 4},
                       speculative={"method": "mtp", "num_speculative_tokens": 3})
    out = tmp_path / "trace"
    sent = []  # the prompts of each load (the untraced one, then the traced one)

    class Counted(profile_command.LoadGenerator):
        def run(self, prompts, *args, **kwargs):
            sent.append(len(prompts))
            return super().run(prompts, *args, **kwargs)

    monkeypatch.setattr(profile_command, "LoadGenerator", Counted)
    # no --prompts: at least 8, so all 4 of the workload's prompts
    assert profile_command.main([str(study), "--study", "peer_tiny", "--arm", "mtp",
                                 "--concurrency", "2", "--out", str(out)]) == 0
    assert sent == [4, 4]
    text = capsys.readouterr().out
    assert "no GPU events (a CPU trace)" in text and "CPU operators (inclusive)" in text
    (trace,) = profiling.traces_in(out)
    assert trace.name.startswith("embedded-") and Path(f"{trace}.summary.txt").is_file()
    summary = profiling.summarize(trace)
    # the engine thread's operators: the model's matmuls were traced, not only HTTP
    assert any(r.name in ("aten::mm", "aten::addmm", "aten::linear") for r in summary.cpu_ops)
    log = (out / "mtp--tiny--profiled.log").read_text()
    assert "profiler started" in log and "profiler stopped" in log
    # an arm or a level the study does not have is named
    assert profile_command.main([str(study), "--study", "peer_tiny", "--arm", "nope",
                                 "--out", str(out)]) == 2
    assert "--arm: expected an arm of study peer_tiny (mtp), found 'nope'" in \
        capsys.readouterr().err
    assert profile_command.main([str(study), "--study", "peer_tiny", "--arm", "mtp",
                                 "--concurrency", "8", "--out", str(out)]) == 2
    assert "measures arm mtp at [1, 2] streams, not 8" in capsys.readouterr().err
    # fewer prompts than streams would trace a lower level than the one asked for
    assert profile_command.main([str(study), "--study", "peer_tiny", "--arm", "mtp",
                                 "--concurrency", "2", "--prompts", "1", "--out", str(out)]) == 2
    assert ("--concurrency 2: --prompts 1 sends 1 of the 4 prompts of workload essays, so at most "
            "1 of the 2 streams would be busy; give --prompts 2 or more"
            in capsys.readouterr().err)


def test_the_gpu_profiling_script_keeps_every_summary_and_goes_on_past_a_failure(
        tiny_checkpoint, tmp_path):
    """scripts/gpu_profile.sh, as the H200 runs it, on the embedded server on the CPU: one
    profile per STUDY:ARM[:STREAMS], a bad one reported while the next still runs, and an
    archive of summaries, logs and output with no trace in it."""
    import os
    import subprocess
    import sys
    import tarfile

    study = tiny_study(tmp_path, tiny_checkpoint, "none", 2, 8,
                       flags={"max-model-len": 512, "max-num-seqs": 2})
    env_sh = tmp_path / "env.sh"  # what the bundle's env.sh does: its python first on PATH
    env_sh.write_text(f'export PATH="{Path(sys.executable).parent}:$PATH"\n'
                      f'export PYTHONPATH="{ROOT / "lib"}"\n')
    archive = tmp_path / "profiles.tar.gz"
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_profile.sh"), str(study), str(archive),
         "peer_tiny:nope", "peer_tiny:none:2", "bad"],
        capture_output=True, text=True, check=False, cwd=tmp_path, timeout=300,
        env={**os.environ, "SPECREPRO_GPU_ENV": str(env_sh), "SPECREPRO_NO_EXPORT": "1",
             "SPECREPRO_GPU_PROFILES": str(tmp_path / "machine")})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "'bad' is not STUDY:ARM[:STREAMS]" in done.stderr
    assert "== peer_tiny:nope: exit 2" in done.stdout
    assert "== peer_tiny:none:2: exit 0" in done.stdout
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "./peer_tiny--none--c2/none--tiny--profiled.log" in names
    assert "./peer_tiny--nope/profile.out" in names
    (summary,) = [n for n in names if n.endswith(".summary.txt")]
    assert summary.startswith("./peer_tiny--none--c2/embedded-")
    assert not [n for n in names if n.endswith((".json", ".json.gz"))]
