"""Engine adapters: profiles → argv the real engines accept; launch, readiness, stop.

The accepted-flag lists come from the real wheels (scripts/extract_engine_cli.py);
launching is tested against a small fake server that mimics each engine's ready
route, version route and startup log lines, replaying what vLLM 0.26.0 and SGLang 0.5.14
printed and answered on an H200 (tests/fixtures/engines, README.md there).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from specrepro.harness import engine_handle, engines
from specrepro.harness.engines import base, launch, render_argv
from specrepro.harness.engines.base import EngineError
from specrepro.harness.flags import FlagCheck, engine_cli, profile_file, render_flags
from specrepro.harness.startup_log import startup_error
from specrepro.params import ParamsError, Profile, load_profile
from specrepro.params.schema import SpeculativeConfig

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "engines"
VLLM_026, SGLANG_0514 = FIXTURES / "vllm-0.26.0", FIXTURES / "sglang-0.5.14"
PROFILES = sorted((ROOT / "params" / "profiles").glob("*.yaml"))
VLLM = [p for p in PROFILES if p.name.startswith("vllm-")]
SGLANG = [p for p in PROFILES if p.name.startswith("sglang-")]


def parse_vllm_log(text: str):
    return engines.engine("vllm").parse_log(text)


def parse_sglang_log(text: str):
    return engines.engine("sglang").parse_log(text)


def command_len(profile: Profile) -> int:
    return len(profile.command)


# ------------------------------------------------------------------------ generated lists


def test_generated_lists_come_from_the_wheels():
    for name in ("vllm-0.33.0", "sglang-0.5.23"):
        data = engine_cli(name)
        assert data["generated_by"] == "scripts/extract_engine_cli.py"
        assert len(data["wheel_sha256"]) == 64 and data["wheel"].endswith(".whl")
        assert len(data["flags"]) > 300


def test_engine_facts_hold_in_the_extracted_lists():
    vllm, sglang = engine_cli("vllm-0.33.0"), engine_cli("sglang-0.5.23")
    # no dflash2 method; mtp and dflash exist
    assert "dflash2" not in vllm["speculative_methods"]
    assert {"mtp", "dflash", "ngram", "draft_model", "eagle3"} <= set(vllm["speculative_methods"])
    # online FP8 shorthand and the batch-size schedule key
    assert "fp8_per_tensor" in vllm["quantization_methods"]
    assert "num_speculative_tokens_per_batch_size" in vllm["speculative_config_keys"]
    assert "block_size" not in vllm["speculative_config_keys"]  # no block-size key
    # prefix caching is a BooleanOptionalAction; cudagraph modes; metrics flag choices
    assert {"--enable-prefix-caching", "--no-enable-prefix-caching"} <= set(vllm["flags"])
    assert vllm["cudagraph_modes"] == ["FULL", "FULL_AND_PIECEWISE", "FULL_DECODE_ONLY",
                                       "NONE", "PIECEWISE"]
    assert vllm["flag_choices"]["--per-request-spec-decode-metrics"] == ["detailed", "none",
                                                                          "summary"]
    # SGLang algorithms, no DFLASH2, NEXTN alias; its flags
    assert "DFLASH2" not in sglang["speculative_algorithms"]
    assert {"DFLASH", "NEXTN", "EAGLE", "STANDALONE"} <= set(sglang["speculative_algorithms"])
    assert "--cuda-graph-max-bs" not in sglang["flags"]
    assert {"--enable-metrics", "--speculative-dflash-block-size", "--tp-size", "--dp-size",
            "--cuda-graph-max-bs-decode"} <= set(sglang["flags"])
    assert sglang["flag_choices"]["--speculative-draft-kv-cache-dtype"] == [
        "auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2"]
    assert "unquant" in sglang["flag_choices"]["--speculative-draft-model-quantization"]


@pytest.mark.skipif(not list((ROOT / ".cache" / "wheels").glob("sglang-0.5.23-*.whl")),
                    reason="the engine wheels are not cached in .cache/wheels")
def test_committed_lists_are_the_scripts_output(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "extract_engine_cli.py"),
                    "--out", str(tmp_path)], check=True, capture_output=True)
    for name in ("vllm-0.33.0", "sglang-0.5.23"):
        assert json.loads((tmp_path / f"{name}.json").read_text()) == engine_cli(name)


# --------------------------------------------------------------------------- rendering


def test_there_are_profiles_for_both_engines():
    assert len(VLLM) >= 10 and len(SGLANG) >= 1


@pytest.mark.parametrize("path", VLLM, ids=lambda p: p.stem)
def test_vllm_profile_renders_to_accepted_argv(path):
    profile = load_profile(path)
    accepted = engine_cli("vllm-0.33.0")
    argv = render_argv(profile)
    rest = argv[command_len(profile):]
    assert rest[0] == profile.model.id  # `vllm serve MODEL`
    flags = [a for a in rest if a.startswith("--")]
    assert flags and set(flags) <= set(accepted["flags"])
    if profile.speculative is not None:
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        assert set(spec) <= set(accepted["speculative_config_keys"])
        assert spec["method"] in accepted["speculative_methods"]
        if spec["method"] == "dflash":
            assert spec["model"] == profile.drafter.id
    if profile.model.revision:
        assert argv[argv.index("--revision") + 1] == profile.model.revision


@pytest.mark.parametrize("path", SGLANG, ids=lambda p: p.stem)
def test_sglang_profile_renders_to_accepted_argv(path):
    profile = load_profile(path)
    accepted = engine_cli("sglang-0.5.23")
    argv = render_argv(profile)
    flags = [a for a in argv[command_len(profile):] if a.startswith("--")]
    assert set(flags) <= set(accepted["flags"])
    assert "--enable-metrics" in flags
    assert engines.adapter_for(profile).request_extras(profile) == {
        "return_spec_tokens_details": True}
    if profile.method == "dflash":
        k = profile.speculative.num_speculative_tokens
        assert argv[argv.index("--speculative-algorithm") + 1] == "DFLASH"
        assert argv[argv.index("--speculative-dflash-block-size") + 1] == str(k + 1)


def make_profile(tmp_path: Path, **fields) -> tuple[Profile, Path]:
    data = {"engine": "vllm", "command": ["vllm", "serve"],
            "model": {"id": "unsloth/Qwen3.8-27B-NVFP4", "revision": "16b6615a"}} | fields
    path = tmp_path / f"{fields.pop('name', 'bad-profile')}.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_profile(path), path


def test_bad_flag_fails_naming_profile_and_flag(tmp_path):
    profile, path = make_profile(tmp_path, flags={"gpu-memory-utilisation": 0.85})
    with pytest.raises(ParamsError) as err:
        render_argv(profile, path)
    text = str(err.value)
    assert str(path) in text and "flags.gpu-memory-utilisation" in text
    assert "--gpu-memory-utilization" in text  # the suggestion


def test_flags_are_checked_against_the_profiles_engine_version(tmp_path):
    # --per-request-spec-decode-metrics is in vLLM 0.33.0's list, not in 0.26.0's
    flags = {"per-request-spec-decode-metrics": True}
    profile, path = make_profile(tmp_path, engine_version="0.33.0", flags=flags)
    assert "--per-request-spec-decode-metrics" in render_argv(profile, path)
    profile, path = make_profile(tmp_path, engine_version="0.26.0", flags=flags)
    with pytest.raises(ParamsError, match="vLLM 0.26.0"):
        render_argv(profile, path)
    # SGLang 0.5.14 has no --speculative-use-block-verification
    sg = {"engine": "sglang", "command": ["python", "-m", "sglang.launch_server"],
          "return_spec_details": True,
          "speculative": {"method": "dflash", "num_speculative_tokens": 7,
                          "rejection_sample_method": "block"},
          "drafter": {"id": "z-lab/drafter"}}
    profile, path = make_profile(tmp_path, engine_version="0.5.23", **sg)
    assert "--speculative-use-block-verification" in render_argv(profile, path)
    profile, path = make_profile(tmp_path, engine_version="0.5.14", **sg)
    with pytest.raises(ParamsError, match="SGLang 0.5.14"):
        render_argv(profile, path)
    # a version no list was generated for is checked against the adapter's default
    profile, path = make_profile(tmp_path, engine_version="0.28.0", flags=flags)
    assert "--per-request-spec-decode-metrics" in render_argv(profile, path)


def test_bad_choice_and_reserved_flag_fail(tmp_path):
    profile, path = make_profile(
        tmp_path, engine="sglang", command=["python", "-m", "sglang.launch_server"],
        return_spec_details=True, flags={"kv-cache-dtype": "fp8", "port": 1234})
    with pytest.raises(ParamsError) as err:
        render_argv(profile, path)
    assert "flags.kv-cache-dtype" in str(err.value) and "'fp8'" in str(err.value)
    assert "flags.port" in str(err.value)


def test_sglang_rejects_what_it_cannot_express(tmp_path):
    profile, path = make_profile(
        tmp_path, engine="sglang", command=["python", "-m", "sglang.launch_server"],
        return_spec_details=True, drafter={"id": "incoai/Qwen3.8-27B-DFlash2"},
        speculative={"method": "dflash", "num_speculative_tokens": 7, "quantization":
                     "fp8_per_tensor", "num_speculative_tokens_per_batch_size": [[1, 12, 7]]})
    with pytest.raises(ParamsError) as err:
        render_argv(profile, path)
    assert "speculative.quantization" in str(err.value)
    assert "speculative.num_speculative_tokens_per_batch_size" in str(err.value)


def test_sglang_mtp_and_parallel(tmp_path):
    profile, path = make_profile(
        tmp_path, engine="sglang", command=["python", "-m", "sglang.launch_server"],
        return_spec_details=True, speculative={"method": "mtp", "num_speculative_tokens": 3},
        parallel={"tensor_parallel_size": 2, "data_parallel_size": 4})
    argv = render_argv(profile, path)
    joined = " ".join(argv)
    assert ("--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 "
            "--speculative-num-draft-tokens 4") in joined
    assert "--tp-size 2" in joined and "--dp-size 4" in joined
    assert "--speculative-draft-model-path" not in joined  # MTP reads the target's own head


def test_vllm_flag_values_and_parallel(tmp_path):
    profile, path = make_profile(
        tmp_path, parallel={"tensor_parallel_size": 2},
        flags={"enable-prefix-caching": False, "enforce-eager": True, "cudagraph-capture-sizes":
               [1, 2, 4], "compilation-config": {"cudagraph_mode": "piecewise"}})
    argv = render_argv(profile, path)
    joined = " ".join(argv)
    assert "--no-enable-prefix-caching" in argv and "--enforce-eager" in argv
    assert "--cudagraph-capture-sizes 1 2 4" in joined
    assert "--tensor-parallel-size 2" in joined and "--data-parallel-size" not in joined
    bad, path = make_profile(tmp_path, flags={"compilation-config": {"cudagraph_mode": "partial"},
                                              "disable-log-stats": True})
    with pytest.raises(ParamsError) as err:
        render_argv(bad, path)
    assert "cudagraph_mode" in str(err.value) and "disable-log-stats" in str(err.value)


# ------------------------------------------------------------------------- log parsing


def test_startup_log_parsing():
    vllm = parse_vllm_log(
        "INFO 11-07 gpu_worker.py:773] Available KV cache memory: 41.2 GiB\n"
        "INFO 11-07 kv_cache_utils.py:1154] GPU KV cache size: 1,146,396 tokens, Maximum "
        "concurrency for 262,144 tokens per request: 4.37x\n")
    assert (vllm.kv_pool_tokens, vllm.max_concurrency, vllm.tokens_per_request) == (
        1146396, 4.37, 262144)
    sglang = parse_sglang_log(
        "[2026-11-01] Max running requests is reset to 48 for speculative decoding.\n"
        "[2026-11-01] max_total_num_tokens=412345, chunked_prefill_size=8192, "
        "max_running_requests=11, context_len=262144, available_gpu_mem=3.1 GB\n")
    assert (sglang.kv_pool_tokens, sglang.max_running_requests) == (412345, 11)
    assert parse_vllm_log("nothing here").kv_pool_tokens is None


def test_the_targets_precision_kernels_are_read_from_vllms_log():
    """Notebook 03: which FP8 and NVFP4 GEMMs vLLM chose, and the Marlin fallback Hopper
    takes for NVFP4 (lines as vLLM logs print them; the kernels record keeps them)."""
    text = (
        "(EngineCore pid=230) INFO [fp8.py:101] Selected CutlassFP8ScaledMMLinearKernel for "
        "Fp8LinearMethod\n"
        "(EngineCore pid=230) WARNING [marlin_utils_fp4.py:137] Your GPU does not have native "
        "support for FP4 computation but FP4 quantization is being used. Weight-only FP4 "
        "compression will be used leveraging the Marlin kernel. This may degrade performance "
        "for compute-heavy workloads.\n")
    kernels = parse_vllm_log(text).kernels
    assert kernels["fp8_linear"] == "CutlassFP8ScaledMMLinearKernel"
    assert kernels["fp4_marlin"].endswith("leveraging the Marlin kernel")
    native = parse_vllm_log("INFO Using FlashInferCutlassNvFp4LinearKernel for NVFP4 GEMM\n")
    assert native.kernels == {"fp4_gemm": "FlashInferCutlassNvFp4LinearKernel"}


def test_vllm_0_26_startup_log_fixture():
    """0.26.0 prints the KV pool and the concurrency on two lines (kv_cache_utils.py:2177,
    :2178), 0.33.0 on one; the backend and kernels are lines of their own."""
    plain = parse_vllm_log((VLLM_026 / "none.log").read_text())
    assert (plain.kv_pool_tokens, plain.max_concurrency, plain.tokens_per_request) == (
        7208224, 3519.64, 2048)
    assert plain.attention_backend == "FLASH_ATTN"
    assert plain.kernels == {
        "flash_attn_version": "3", "model_runner": "V2",
        "sampler": "FlashInfer top-p/top-k sampling disabled via VLLM_USE_FLASHINFER_SAMPLER=0",
        "cuda_graphs": "Cudagraph is disabled under eager mode"}
    spec = parse_vllm_log((VLLM_026 / "dflash.log").read_text())
    assert (spec.kv_pool_tokens, spec.max_concurrency) == (103312, 50.45)
    assert spec.record()["kernels"]["model_runner"] == "V2"


def test_sglang_0_5_14_startup_log_fixture():
    plain = parse_sglang_log((SGLANG_0514 / "none.log").read_text())
    assert (plain.kv_pool_tokens, plain.max_running_requests, plain.max_concurrency,
            plain.tokens_per_request) == (2425035, 8, 8.0, 2048)
    # from the server_args line: attention_backend='triton', not decode_/mm_/draft_ ones (None)
    assert plain.attention_backend == "triton"
    assert plain.kernels == {"sampling_backend": "pytorch", "cuda_graph_decode": "disabled",
                             "kv_cache_dtype": "torch.bfloat16"}
    spec = parse_sglang_log((SGLANG_0514 / "dflash_light.log").read_text())
    assert spec.kv_pool_tokens == 3057492 and spec.kernels["draft_attention_backend"] == "triton"


def test_startup_error_is_the_first_exception_line():
    log = (SGLANG_0514 / "mtp.log").read_text()
    assert startup_error(log).startswith(
        "ValueError: Loaded weights leave no GPU memory for the KV cache under "
        "--mem-fraction-static=0.12.")
    assert startup_error((VLLM_026 / "none.log").read_text()) is None  # a clean start
    # vLLM's engine core prefixes its lines; the root cause comes before the wrapper
    assert startup_error("(EngineCore pid=7) ValueError: bad draft\n(APIServer pid=6) "
                         "RuntimeError: Engine core initialization failed.") == "ValueError: bad draft"


# ------------------------------------------------------------------ launch and stop

FAKE_SERVER = r'''
"""A stand-in engine: the ready/version routes and startup lines of vLLM, SGLang 0.5.23,
SGLang 0.5.14 or a generic OpenAI-compatible server (guidellm's mock server has /health and
/v1/models only); FAKE_LOG, FAKE_METRICS, FAKE_SERVER_INFO and FAKE_VERSION_FILE replay
captured files (a capture is the status on its first line, the body after it)."""
import argparse, http.server, json, os, subprocess, sys, time
ap = argparse.ArgumentParser()
ap.add_argument("--host", default="127.0.0.1")
ap.add_argument("--port", type=int)
args, _ = ap.parse_known_args()
env = os.environ.get
flavour, mode = env("FAKE_FLAVOUR"), env("FAKE_MODE", "ok")
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"child pid {child.pid}", flush=True)
if env("FAKE_LOG"):
    print(open(env("FAKE_LOG")).read(), flush=True)
elif flavour == "vllm":
    print("INFO GPU KV cache size: 1,234,567 tokens, Maximum concurrency for 32,768 tokens "
          "per request: 37.68x", flush=True)
elif flavour == "sglang":
    print("max_total_num_tokens=412345, chunked_prefill_size=8192, max_running_requests=11, "
          "context_len=262144", flush=True)
if mode == "die":
    print("RuntimeError: CUDA error: out of memory", flush=True)
    sys.exit(3)
if mode == "exit":  # the replayed log was a start-up failure
    sys.exit(1)
METRICS = ('# TYPE vllm:spec_decode_num_drafts_total counter\n'
           'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 42.0\n')
if mode == "stubborn":
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
START = time.monotonic()

def captured(path):
    status, body = open(path).read().split("\n", 1)
    return int(status), body

class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        print("request", self.path, flush=True)
    def answer(self, code, body):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code); self.end_headers(); self.wfile.write(data)
    def do_GET(self):
        ready, path = mode != "never_ready", self.path
        warm = time.monotonic() - START >= float(env("FAKE_WARMUP_S", "0"))
        if flavour == "vllm" and path == "/health":
            return self.answer(200 if ready else 503, "")
        if flavour == "vllm" and path == "/version":
            if env("FAKE_VERSION_FILE"):
                return self.answer(*captured(env("FAKE_VERSION_FILE")))
            return self.answer(200, {"version": env("FAKE_VERSION", "0.33.0")})
        if flavour == "sglang" and path == "/ready":
            return self.answer(200 if ready else 503, "")
        if flavour == "sglang" and path == "/server_info":
            return self.answer(200, {"version": "0.5.23", "max_total_num_tokens": 412345})
        if flavour == "sglang-0.5.14":
            # /health as the H200 notes describe it: 200 before the model can generate
            if path == "/health":
                return self.answer(200, "")
            if path == "/health_generate":  # 503 until the warm-up generation returned
                return self.answer(200 if ready and warm else 503, "")
            if path == "/server_info":
                return self.answer(*captured(env("FAKE_SERVER_INFO")))
            if path == "/version":
                return self.answer(*captured(env("FAKE_VERSION_FILE")))
        if flavour == "generic":
            if path == "/health":
                return self.answer(200, {"status": "healthy", "timestamp": time.time()})
            if path == "/v1/models":
                return self.answer(200, {"object": "list", "data": [{"id": "fake/model"}]})
            return self.answer(404, {"detail": "Not Found"})
        if path == "/metrics" and env("FAKE_METRICS"):
            if not os.path.exists(env("FAKE_METRICS")):  # an engine without the route
                return self.answer(404, {"detail": "Not Found"})
            return self.answer(200, open(env("FAKE_METRICS")).read())
        if path == "/metrics":
            return self.answer(200, METRICS)
        return self.answer(404, {"detail": "Not Found"})

time.sleep(float(env("FAKE_DELAY", "0.3")))
http.server.ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
'''


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def running(pid: int) -> bool:
    """Alive and not a zombie (an unreaped orphan counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not running(pid)


def child_pid(log_path: Path) -> int:
    line = next(l for l in log_path.read_text().splitlines() if l.startswith("child pid"))
    return int(line.split()[-1])


@pytest.fixture
def fake(tmp_path):
    script = tmp_path / "fake_engine.py"
    script.write_text(FAKE_SERVER)

    def profile(flavour: str = "vllm", timeout: float = 20.0, engine: str | None = None,
                version: str | None = None, **env) -> Profile:
        engine = engine or flavour.split("-")[0]
        data = {"name": f"fake-{flavour}", "engine": engine, "command": ["{python}", str(script)],
                "port": free_port(), "model": {"id": "fake/model"}, "ready_timeout_s": timeout,
                "env": {"FAKE_FLAVOUR": flavour, **{k: str(v) for k, v in env.items()}}}
        if engine == "sglang":
            data["return_spec_details"] = True
        if version or engine == "vllm":
            data["engine_version"] = version or "0.33.0"
        return Profile.model_validate(data)

    return profile


def test_vllm_launch_ready_version_log_metrics_stop(fake, tmp_path):
    profile = fake("vllm", FAKE_VERSION="0.27.1")
    with launch(profile, tmp_path / "logs") as engine:
        assert engine.alive()
        assert engine.version == "0.27.1"
        assert engine.warnings and "expects vllm 0.33.0" in engine.warnings[0]
        assert engine.startup.kv_pool_tokens == 1234567
        assert engine.startup.max_concurrency == pytest.approx(37.68)
        assert engine.counters().num_drafts == 42
        assert engine.argv[2] == "fake/model"
        child = child_pid(engine.log_path)
        assert running(child)
    assert not engine.alive() and not running(child)  # the whole group is gone


def test_sglang_readiness_never_touches_health(fake, tmp_path):
    with launch(fake("sglang"), tmp_path) as engine:
        assert engine.version == "0.5.23"
        assert engine.startup.kv_pool_tokens == 412345 and engine.startup.max_running_requests == 11
        assert engine.request_extras() == {"return_spec_tokens_details": True}
        assert engine.served_by.kind == "sglang"
    requests = [l for l in engine.log_path.read_text().splitlines() if l.startswith("request")]
    assert "request /ready" in requests and not any("/health" in r for r in requests)


def test_process_death_fails_fast_with_log_tail(fake, tmp_path):
    started = time.monotonic()
    with pytest.raises(EngineError, match="out of memory") as err:
        launch(fake("vllm", FAKE_MODE="die", timeout=60), tmp_path)
    assert time.monotonic() - started < 10
    assert "exited with code 3" in str(err.value)
    assert not engine_handle.live_handles()


def test_ready_timeout_stops_the_group(fake, tmp_path):
    with pytest.raises(EngineError, match="not ready .* after 2 s") as err:
        launch(fake("vllm", FAKE_MODE="never_ready", timeout=2), tmp_path)
    assert "request /health" in str(err.value)  # the log tail
    assert not running(child_pid(tmp_path / "fake-vllm.log"))


def test_ctrl_c_while_waiting_leaves_no_orphan(fake, tmp_path, monkeypatch):
    log, real_sleep = tmp_path / "fake-vllm.log", time.sleep

    def interrupted(seconds):  # Ctrl-C arrives once the engine has started its child
        if log.exists() and "child pid" in log.read_text():
            raise KeyboardInterrupt
        real_sleep(seconds)

    monkeypatch.setattr(base.time, "sleep", interrupted)
    with pytest.raises(KeyboardInterrupt):
        launch(fake("vllm", FAKE_MODE="never_ready", FAKE_DELAY="0"), tmp_path)
    monkeypatch.undo()
    assert gone_within(child_pid(log), seconds=5)  # SIGKILL is delivered asynchronously
    assert not engine_handle.live_handles()


def test_sigterm_ignored_escalates_to_sigkill(fake, tmp_path, monkeypatch):
    monkeypatch.setattr(engine_handle, "STOP_GRACE_S", 1.0)
    engine = launch(fake("vllm", FAKE_MODE="stubborn"), tmp_path)
    child = child_pid(engine.log_path)
    engine.stop()
    assert not engine.alive() and not running(child)
    engine.stop()  # idempotent


def test_busy_port_is_refused(fake, tmp_path):
    profile = fake("vllm")
    with socket.socket() as sock:
        sock.bind((profile.host, profile.port))
        sock.listen()
        with pytest.raises(EngineError, match="already listens"):
            launch(profile, tmp_path)


def test_attach_detects_the_engine_behind_the_url(fake, tmp_path):
    with launch(fake("sglang"), tmp_path) as served:
        attached = Profile.model_validate({
            "name": "attach-test", "engine": "attach", "url": served.url + "/v1",
            "model": {"id": "fake/model"}, "return_spec_details": True})
        handle = launch(attached, tmp_path)
        assert handle.served_by.kind == "sglang" and handle.version == "0.5.23"
        assert handle.process is None
        handle.stop()  # nothing to stop; the served engine stays up
        assert served.alive()
    with pytest.raises(EngineError, match="no engine answers"):
        launch(attached, tmp_path)


# ------------------------------------------- the engines as they were seen on the H200


def requests_seen(log_path: Path) -> list[str]:
    return [l.split()[1] for l in log_path.read_text().splitlines() if l.startswith("request ")]


def test_vllm_0_26_launch_replaying_its_capture(fake, tmp_path):
    profile = fake("vllm", version="0.26.0", FAKE_LOG=VLLM_026 / "dflash.log",
                   FAKE_VERSION_FILE=VLLM_026 / "version.txt",
                   FAKE_METRICS=VLLM_026 / "dflash.metrics-after.txt")
    with launch(profile, tmp_path) as engine:
        assert engine.version == "0.26.0" and engine.warnings == []
        assert engine.startup.kv_pool_tokens == 103312 and engine.startup.max_concurrency == 50.45
        assert engine.startup.attention_backend == "FLASH_ATTN"
        counters = engine.counters()
        assert (counters.num_drafts, counters.num_accepted_tokens) == (63, 131)
        assert counters.kv_pool_tokens == engine.startup.kv_pool_tokens  # /metrics agrees


def test_unknown_version_and_missing_metrics_say_so(fake, tmp_path):
    """/version answering vLLM's 404 body (as /server_info does on 0.26.0) and /metrics
    absent: the engine runs, and its warnings name what is unknown and what is lost."""
    profile = fake("vllm", version="0.26.0", FAKE_VERSION_FILE=VLLM_026 / "server_info.txt",
                   FAKE_METRICS=tmp_path / "absent")  # the fake answers 404
    with launch(profile, tmp_path) as engine:
        assert engine.version is None
        text = "\n".join(engine.warnings)
    assert f"vllm version unknown ({engine.url}/version gave none)" in text
    assert "engine_version null, not the 0.26.0 the profile expects" in text
    assert f"{engine.url}/metrics answers 404: not measured: acceptance (num_drafts" in text


def test_sglang_0_5_14_waits_for_health_generate(fake, tmp_path):
    """0.5.14 has no /ready (404) and its /health says 200 before the model can generate:
    the adapter moves on to /health_generate and waits out the warm-up."""
    warmup = 1.5
    profile = fake("sglang-0.5.14", version="0.5.14", FAKE_WARMUP_S=warmup,
                   FAKE_LOG=SGLANG_0514 / "none.log",
                   FAKE_SERVER_INFO=SGLANG_0514 / "server_info.txt",
                   FAKE_VERSION_FILE=SGLANG_0514 / "version.txt",
                   FAKE_METRICS=SGLANG_0514 / "none.metrics-after.txt")
    started = time.monotonic()
    with launch(profile, tmp_path) as engine:
        assert time.monotonic() - started >= warmup
        assert engine.version == "0.5.14" and engine.warnings == []
        assert engine.startup.kv_pool_tokens == 2425035
        assert engine.startup.attention_backend == "triton"
        assert engine.counters().num_requests == 7
    seen = requests_seen(engine.log_path)
    assert seen.count("/ready") == 1 and "/health_generate" in seen and "/health" not in seen
    assert seen.index("/ready") < seen.index("/health_generate")


def test_start_up_failure_names_its_cause(fake, tmp_path):
    """SGLang 0.5.14's MTP start on the H200: the scheduler's ValueError, then the parent's
    "Received sigquit" and exit; the error's first line carries the cause."""
    profile = fake("sglang-0.5.14", FAKE_MODE="exit", FAKE_LOG=SGLANG_0514 / "mtp.log")
    with pytest.raises(EngineError) as err:
        launch(profile, tmp_path)
    first = str(err.value).splitlines()[0]
    assert "exited with code 1 before it was ready (ValueError: Loaded weights leave no GPU " \
           "memory for the KV cache under --mem-fraction-static=0.12." in first


def test_attach_generic_openai_server(fake, tmp_path):
    """guidellm 0.8.1's mock server answers /health and /v1/models only: attached as a
    generic engine with warnings, not refused."""
    served = launch(fake("generic", engine="vllm"), tmp_path)  # launched only to run it
    try:
        attached = Profile.model_validate({"name": "attach-mock", "engine": "attach",
                                           "url": served.url + "/v1",
                                           "model": {"id": "fake/model"}})
        handle = launch(attached, tmp_path)
        assert handle.attached == "generic" and handle.served_by.kind == "generic"
        assert handle.version is None
        text = "\n".join(handle.warnings)
        assert "neither vLLM, SGLang nor the embedded engine" in text
        assert "generic version unknown (it has no version route)" in text
        assert f"{handle.url}/metrics answers 404: not measured: the counter check" in text
        assert handle.counters().missing() == []  # no names are expected of it
    finally:
        served.stop()


def test_sglang_ngram_verifies_k_plus_one_tokens():
    # without --speculative-num-draft-tokens SGLang's NGRAM verifies its default 12 whatever
    # the profile's K: the three ngram-trie profiles would be one measurement three times
    argvs = {}
    for k in (3, 5, 7):
        path = ROOT / "params" / "profiles" / f"sglang-0.5.14-ngram-trie-k{k}.yaml"
        argv = render_argv(load_profile(path), path)
        argvs[k] = argv[argv.index("--speculative-num-draft-tokens") + 1]
        assert argv[argv.index("--speculative-algorithm") + 1] == "NGRAM"
    assert argvs == {3: "4", 5: "6", 7: "8"}


# -- engine facts on the adapter: flag spelling and a speculative config read from a file


class FileSpecAdapter(base.EngineAdapter):
    """An engine as a new contributor would add one: flags spelled `--max_num_seqs`, its
    speculative config read from a file (served here by the fake's vLLM flavour)."""

    kind = "file-spec"
    what = "a file-config engine"
    routes = engines.VLLMAdapter.routes
    flag_separator = "_"
    spec_file_flag = "--speculative_config_file"
    ACCEPTED: ClassVar[dict] = {"flags": ["--max_num_seqs", "--enforce_eager",
                                          "--no_enforce_eager"]}

    def render_argv(self, profile, source=None):
        check = FlagCheck(profile_file(profile, source), self.what)
        argv = [*self.command(profile), "--host", profile.host, "--port", str(profile.port),
                *render_flags(profile.flags, self.ACCEPTED, {}, check, spell=self.flag_name)]
        check.raise_if_any()
        return argv


def test_flag_spelling_is_the_adapters():
    adapter = FileSpecAdapter()
    assert adapter.flag_name("max-num-seqs") == adapter.flag_name("max_num_seqs") == "--max_num_seqs"
    assert engines.engine("vllm").flag_name("max_num_seqs") == "--max-num-seqs"  # default kept
    profile = Profile.model_validate({"name": "p", "engine": "vllm", "command": ["serve"],
                                      "model": {"id": "m"},
                                      "flags": {"max-num-seqs": 8, "enforce-eager": False}})
    assert adapter.render_argv(profile)[-3:] == ["--max_num_seqs", "8", "--no_enforce_eager"]
    with pytest.raises(ParamsError, match=r"p.yaml: flags.max-num-batched-tokens: .*found '--max_num_batched_tokens'"):
        adapter.render_argv(profile.model_copy(update={"flags": {"max-num-batched-tokens": 8}}))


def test_adapter_with_bad_engine_facts_fails_naming_it():
    with pytest.raises(TypeError, match=r"adapter .*Dotted: flag_separator '\.'"):
        type("Dotted", (base.EngineAdapter,), {"flag_separator": "."})
    with pytest.raises(TypeError, match=r"adapter .*Bare: spec_file_flag 'spec'"):
        type("Bare", (base.EngineAdapter,), {"spec_file_flag": "spec"})


def test_speculative_config_side_file_beside_the_log(fake, tmp_path):
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    profile = fake("vllm").model_copy(update={"speculative": SpeculativeConfig(**spec)})
    adapter = FileSpecAdapter()
    assert engines.engine("vllm").side_files(profile, tmp_path / "x.log") == []  # off by default
    with adapter.launch(profile, tmp_path / "logs", log_name="cell") as engine:
        assert engine.alive()
        side = tmp_path / "logs" / "cell.speculative.json"
        assert engine.argv[-2:] == ["--speculative_config_file", str(side.resolve())]
        assert json.loads(side.read_text()) == spec
        assert f"--speculative_config_file {side.resolve()}" in engine.log_path.read_text()
    none = fake("vllm")  # no speculation: no file, no flag
    with adapter.launch(none, tmp_path / "plain") as engine:
        assert "--speculative_config_file" not in engine.argv
    assert not list((tmp_path / "plain").glob("*.speculative.json"))
