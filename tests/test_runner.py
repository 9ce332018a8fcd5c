"""The runner on the embedded server: a whole small sweep, resume, window mode, missing
/metrics, bad params files, the engine dying mid-cell, Ctrl-C, a deadline (between cells and
during one), the archive rewritten after each cell and a resume from it, bad flag values."""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import polars as pl
import pytest
import yaml

from conftest import ThreadedApp
from specrepro.grading import grade_gsm8k
from specrepro.harness import cpu_placement, engine_http, engines, promtext
from specrepro.harness.run_command import main
from specrepro.harness.runner import IGNORE_EOS_WARNING, run_study
from specrepro.identity import local_model_fingerprint
from specrepro.params import NOTEBOOK_IDS, ParamsError, load_suite
from specrepro.params import resolve_file as resolve
from specrepro.store import ResultStore, load_attempts

REPO = Path(__file__).resolve().parents[1]

# Two synthetic GSM8K problems, so grading runs without the shared data directory.
GSM8K_ROWS = [{"question": "Tom has 3 apples and buys 4 more. How many apples?",
               "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
              {"question": "A box holds 6 pens. How many pens are in 2 boxes?",
               "answer": "6 * 2 = <<6*2=12>>12\n#### 12"}]


@pytest.fixture
def params_dir(tmp_path, monkeypatch):
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GSM8K_ROWS))
    monkeypatch.setenv("SPECREPRO_DATA_DIR", str(tmp_path / "data"))
    for sub in ("params/profiles", "params/studies"):
        (tmp_path / sub).mkdir(parents=True)
    return tmp_path / "params"


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def attach_profile(params: Path, name: str, url: str, model: str) -> None:
    write(params / "profiles" / f"{name}.yaml",
          {"engine": "attach", "url": str(url), "attached_engine": "embedded",
           "model": {"id": model, "revision": None}})


def study(params: Path, arms: list[dict], **extra) -> Path:
    data = {"name": "tiny_sweep", "notebook": "01_drafter_block_sweep", "arms": arms,
            "workloads": [{"name": "essays", "n": 2, "form": "chat", "max_tokens": 16}],
            "concurrency": [1], "sampling": [{"temperature": 0.0}], "seed": 100, **extra}
    return write(params / "studies" / "01_tiny.yaml", data)


def served_model(url: str) -> str:
    return engine_http.http_json(f"{url}/v1/models")["data"][0]["id"]


def scrape(url: str) -> promtext.SpecCounters:
    text = engine_http.http_get(f"{url}/metrics")[1].decode()
    return promtext.parse(text, engines.engine("embedded").metrics)


def run(path: Path, tmp: Path, **kw):
    (plan,) = resolve(path)
    st, _, run_id = plan
    store = ResultStore(tmp / "results", st.name, run_id)
    return run_study(st, store, progress=False, power_interval_s=0.2, **kw), store


def test_small_sweep_fills_every_column_and_agrees_with_the_counters(
        embedded_server, params_dir, tmp_path):
    model = served_model(embedded_server)
    attach_profile(params_dir, "served", embedded_server, model)
    path = study(params_dir, [{"name": "base", "profile": "served"},
                              {"name": "again", "profile": "served"}],
                 baseline="base", concurrency=[1, 2],
                 workloads=[{"name": "essays", "n": 2, "form": "chat", "max_tokens": 16},
                            {"name": "gsm8k", "n": 2, "form": "chat", "max_tokens": 16}])
    before = scrape(embedded_server)
    summary, store = run(path, tmp_path)
    d = promtext.delta(before, scrape(embedded_server))
    assert (summary.ok, summary.failed, summary.errors) == (8, 0, [])
    cells, reqs = store.load_cells(), store.load_requests()
    assert cells.height == 8 and reqs.height == 16
    for c in cells.iter_rows(named=True):
        assert c["status"] == "ok" and c["n_errors"] == 0 and c["counters_consistent"]
        assert c["acceptance_length"] == pytest.approx(
            1 + c["num_accepted_tokens"] / c["num_drafts"])
        assert len(c["per_position_acceptance"]) == 3  # the fixture's MTP drafts 3 tokens
        assert sum(c["per_position_acceptance"]) == pytest.approx(c["acceptance_length"] - 1)
        assert c["agg_tok_s"] > 0 and c["ttft_p50_ms"] > 0 and c["itl_p50_ms"] > 0
        # the engine's own histograms over the cell (vLLM's names on the embedded server:
        # TTFT, ITL, end to end; no queue or phase histograms, so those stay None)
        assert c["engine_ttft_ms"] > 0 and c["engine_itl_ms"] > 0 and c["engine_e2e_ms"] > 0
        assert c["engine_e2e_ms"] > c["engine_ttft_ms"]
        assert c["engine_queue_ms"] is None and c["engine_busy_share"] is None
        assert c["per_stream_tok_s"] == pytest.approx(c["agg_tok_s"] / c["concurrency"])
        assert c["step_ms"] > 0 and c["repeated_4gram_share"] is not None
        assert c["kv_pool_tokens"] > 0 and c["engine"] == "embedded"
        assert c["power_w_mean"] is None and c["peak_mem_mib"] is None  # attached, no GPU
        # greedy, same server, same prompts and seeds: the second arm matches the baseline
        assert c["identical_to_baseline"] == (None if c["arm"] == "base" else 1.0)
        assert (c["gsm8k_n"] == 2) == (c["workload"] == "gsm8k")
    # the run's cells account for everything the server counted over the run
    assert d.generation_tokens == cells["output_tokens"].sum()
    assert d.num_drafts == cells["num_drafts"].sum()
    assert d.num_accepted_tokens == cells["num_accepted_tokens"].sum()
    # GSM8K graded on the very outputs that were timed
    gsm = reqs.join(cells.select("cell_id", "workload"), on="cell_id").filter(
        pl.col("workload") == "gsm8k")
    for r in gsm.iter_rows(named=True):
        gold = GSM8K_ROWS[int(r["prompt_id"].rsplit("-", 1)[1])]["answer"]
        assert r["gsm8k_strict"] == grade_gsm8k(r["text"], gold)["strict"]
    # a second run resumes: nothing is measured again, no duplicate rows
    again, _ = run(path, tmp_path)
    assert (again.ok, again.skipped) == (0, 8)
    assert load_attempts(store.root).height == 8
    session = store.manifest()["sessions"][0]
    assert session["engines"][0]["version"].startswith("specrepro-embedded")
    assert session["engines"][0]["ready_s"] is None  # attached: not started here
    assert session["power_note"] and session["params"]["name"] == "tiny_sweep"
    # the session's parts were merged at its end: one file per table (the resume wrote none)
    for table in ("cells", "requests"):
        assert [p.name for p in (store.root / table).iterdir()] == [
            f"session-{session['session_id']}.parquet"]
    # an attached engine is not the harness's to place
    assert session["placement"]["pinned"] is False
    assert "attached engine" in session["placement"]["note"]
    assert session["engines"][0]["placement"] == session["placement"]


def test_steady_window_with_warmup(embedded_server, params_dir, tmp_path):
    attach_profile(params_dir, "served", embedded_server, served_model(embedded_server))
    path = study(params_dir, [{"name": "base", "profile": "served"}],
                 window={"skip_s": 0.0, "window_s": 1.5, "max_window_s": 1.5,
                         "turnovers": 1}, warmup=2, concurrency=[2], ignore_eos=True)
    summary, store = run(path, tmp_path)
    (c,) = store.load_cells().iter_rows(named=True)
    assert summary.ok == 1 and c["wall_s"] == pytest.approx(1.5, abs=0.3)
    assert c["timing"] == "window" and c["window_requests"] is not None
    assert c["counters_consistent"]  # warm-up excluded, in-flight requests drained
    assert c["n_requests"] >= 2 and c["output_tokens"] > 0 and c["ignore_eos"]
    assert IGNORE_EOS_WARNING in c["warnings"]
    assert IGNORE_EOS_WARNING in store.manifest()["sessions"][0]["warnings"]


class NoMetricsProxy(ThreadedApp):
    """Forwards everything but /metrics (404) to an engine, as a production proxy might."""

    def __init__(self, upstream: str):
        self.upstream = upstream
        super().__init__()

    async def make_app(self):
        import aiohttp
        from aiohttp import web

        self.session = aiohttp.ClientSession()

        async def forward(request: web.Request) -> web.StreamResponse:
            if request.path == "/metrics":
                raise web.HTTPNotFound()
            async with self.session.request(request.method, self.upstream + request.path_qs,
                                            data=await request.read(),
                                            headers={"Content-Type": "application/json"}) as up:
                resp = web.StreamResponse(status=up.status, headers={
                    "Content-Type": up.headers.get("Content-Type", "application/json")})
                await resp.prepare(request)
                async for data in up.content.iter_any():
                    await resp.write(data)
                await resp.write_eof()
                return resp

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        return app

    async def cleanup(self) -> None:
        await self.session.close()
        await super().cleanup()


def test_missing_metrics_leaves_acceptance_empty_with_a_warning(
        embedded_server, params_dir, tmp_path):
    proxy = NoMetricsProxy(embedded_server)
    try:
        attach_profile(params_dir, "proxied", proxy.url, served_model(embedded_server))
        path = study(params_dir, [{"name": "proxied", "profile": "proxied"}],
                     concurrency=[1, 2])
        summary, store = run(path, tmp_path)
    finally:
        proxy.close()
    assert (summary.ok, summary.failed) == (2, 0)
    for c in store.load_cells().iter_rows(named=True):
        assert c["acceptance_length"] is None and c["per_position_acceptance"] is None
        assert c["counters_consistent"] is None and c["agg_tok_s"] > 0
        assert any("/metrics" in w for w in c["warnings"])


def test_bad_study_and_profile_files_name_the_file_and_key(params_dir, capsys):
    path = study(params_dir, [{"name": "a", "profile": "nowhere"}])
    assert main([str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "01_tiny.yaml" in err and "arms[0].profile" in err and "nowhere" in err
    write(params_dir / "profiles" / "bad.yaml",
          {"engine": "attach", "url": "http://x", "model": {"id": "m"}, "port": "eighty"})
    path = study(params_dir, [{"name": "a", "profile": "bad"}], concurrancy=[1])
    assert main([str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "01_tiny.yaml" in err and "concurrancy" in err and "did you mean 'concurrency'" in err
    path = study(params_dir, [{"name": "a", "profile": "bad"}])
    assert main([str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "port" in err and "eighty" in err


def test_the_smoke_suite_resolves_for_the_runner():
    plans = resolve(REPO / "params" / "smoke.yaml")
    smoke = load_suite(REPO / "params" / "smoke.yaml")
    assert [st.notebook for st, _, _ in plans] == list(smoke.notebooks)  # every one it binds
    assert list(smoke.notebooks) == list(NOTEBOOK_IDS)  # every finding: it excludes none
    assert all(st.arms and run_id == "smoke" for st, _, run_id in plans)


# ------------------------------------------------------------------ launched engine faults


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def embedded_profile(params: Path, ckpt: Path, port: int) -> None:
    write(params / "profiles" / "tiny-mtp.yaml", {
        "engine": "embedded", "command": ["{python}", "-m", "specrepro.embedded.serve"],
        "host": "127.0.0.1", "port": port,
        "model": {"id": str(ckpt), "revision": None, "served_name": "tiny"},
        "flags": {"max-model-len": 512, "max-num-seqs": 4},
        "speculative": {"method": "mtp", "num_speculative_tokens": 3},
        "env": {"OMP_NUM_THREADS": "1"}, "ready_timeout_s": 120})


def when_second_cell_streams(store_root: Path, url: str, act) -> threading.Thread:
    """Call act() once the first cell is stored and the engine is generating again: a
    running or waiting request, or generated tokens counted since the cell was stored.
    What it saw is kept in `thread.seen` for the failure message."""

    def watch():
        deadline = time.monotonic() + 120
        base = None  # generation tokens when the first cell was stored
        while time.monotonic() < deadline:
            if list((store_root / "cells").glob("*.parquet")):
                status, body = engine_http.http_get(f"{url}/metrics", timeout=5)
                snap = (promtext.parse(body.decode(), engines.engine("embedded").metrics)
                        if status == 200 else None)
                gen = None if snap is None else snap.generation_tokens
                thread.seen.append((round(time.monotonic(), 3), status,
                                    None if snap is None else snap.requests_running, gen))
                if snap is not None:
                    base = gen if base is None else base
                    if ((snap.requests_running or 0) > 0 or (snap.requests_waiting or 0) > 0
                            or (gen or 0) > (base or 0)):
                        act()
                        return
            time.sleep(0.01)

    thread = threading.Thread(target=watch, daemon=True)
    thread.seen = []
    thread.start()
    return thread


def engine_pid(port: int) -> int:
    import psutil

    for child in psutil.Process().children(recursive=True):
        if "specrepro.embedded.serve" in " ".join(child.cmdline()) and str(port) in child.cmdline():
            return child.pid
    raise AssertionError("the runner's engine process was not found")


def fault_study(params_dir, tiny_checkpoint):
    port = free_port()
    embedded_profile(params_dir, tiny_checkpoint, port)
    # Two cells: a short first one (2 GSM8K prompts at one stream) to be stored, then the
    # one the faults hit, at two streams: 6 essays (3 waves of 2) of 160 tokens, long enough
    # for the watcher to catch it streaming (with 2 short prompts it could finish between
    # two polls on CI). The first cell needs no length: 6 x 160 tokens at one stream took
    # half of each test's time and tested nothing more.
    path = study(params_dir, [{"name": "mtp", "profile": "tiny-mtp"}], concurrency=[1, 2],
                 ignore_eos=True,
                 workloads=[{"name": "gsm8k", "n": 2, "form": "chat", "max_tokens": 16},
                            {"name": "essays", "n": 6, "form": "chat", "max_tokens": 160}],
                 skip=[{"workload": "gsm8k", "concurrency": [2]},
                       {"workload": "essays", "concurrency": [1]}])
    return path, port


def test_engine_death_mid_cell_is_a_failed_cell_and_a_rerun_completes(
        tiny_checkpoint, params_dir, tmp_path):
    path, port = fault_study(params_dir, tiny_checkpoint)
    root = tmp_path / "results" / "tiny_sweep" / "standalone"
    watcher = when_second_cell_streams(
        root, f"http://127.0.0.1:{port}", lambda: os.kill(engine_pid(port), signal.SIGKILL))
    summary, store = run(path, tmp_path)
    watcher.join(5)
    assert (summary.ok, summary.failed) == (1, 1)
    attempts = store.load_attempts()
    failed = attempts.filter(pl.col("status") == "failed").row(0, named=True)
    assert "died during the cell" in failed["error"] and "last lines" in failed["error"]
    assert failed["concurrency"] == 2
    summary, store = run(path, tmp_path)  # the re-run measures only the failed cell
    assert (summary.ok, summary.failed, summary.skipped) == (1, 0, 1)
    cells = store.load_cells()
    assert cells.height == 2 and cells["cell_id"].n_unique() == 2
    assert sorted(cells["concurrency"].to_list()) == [1, 2]
    assert store.load_attempts().height == 3  # ok, failed, ok: nothing rewritten
    summary, store = run(path, tmp_path)  # all done: the engine is not even launched
    assert (summary.ok, summary.skipped) == (0, 2)
    assert store.manifest()["sessions"][-1]["engines"] == []


# ---------------------------------------------------------------------- CPU placement


def test_plan_placement_splits_the_cpus_or_says_why_not():
    plan = cpu_placement.plan_placement
    two = plan("auto", (0, 1), 1)
    assert (two.engine_cpus, two.client_cpus, two.pinned, two.threads) == ((1,), (0,), True, 1)
    assert two.record() == {"engine_cpus": [1], "client_cpus": [0], "pinned": True,
                            "note": two.note}
    assert "engine on CPUs [1] (1 thread)" in two.note and "CPUs [0]" in two.note
    four = plan("auto", (0, 1, 2, 3), None)  # as many threads as it gets: all but one CPU
    assert (four.engine_cpus, four.client_cpus, four.threads) == ((1, 2, 3), (0,), 3)
    assert plan("auto", (0, 1, 2, 3), 2).client_cpus == (0, 1)
    capped = plan("auto", (4, 5), 3)  # the profile's own threads: kept, and the note says so
    assert capped.engine_cpus == (5,) and capped.threads is None and "exceed" in capped.note
    for policy, cpus, why, note in [("auto", (3,), None, "one CPU"),
                                    ("auto", None, None, "no CPU affinity"),
                                    ("none", (0, 1), None, "placement 'none'"),
                                    ("auto", (0, 1), "attached: not ours", "attached: not ours")]:
        got = plan(policy, cpus, 1, why_not=why)
        assert not got.pinned and note in got.note and got.threads is None, (policy, cpus)
        assert got.engine_cpus == got.client_cpus == tuple(cpus or ())


def test_the_embedded_engine_computes_with_the_threads_its_server_would_use():
    from specrepro.harness.engines import ENGINES
    from specrepro.params import Profile

    def profile(**flags):
        return Profile(name="p", engine="embedded", command=["x"], model={"id": "m"},
                       flags=flags)

    embedded = ENGINES["embedded"]
    assert embedded.threads_flag == "--threads"
    assert embedded.cpu_threads(profile()) == 1  # serve.engine_threads' CPU default
    assert embedded.cpu_threads(profile(threads=3)) == 3
    assert embedded.cpu_threads(profile(device="cuda")) is None
    assert ENGINES["vllm"].cpu_threads(profile()) is None and ENGINES["vllm"].threads_flag is None


def test_session_placement_names_the_arms_placed_otherwise():
    from specrepro.harness.runner import session_placement

    pinned = cpu_placement.plan_placement("auto", (0, 1), 1)
    peer = cpu_placement.plan_placement("auto", (0, 1), None, why_not="in-process peer")
    assert session_placement({"a": pinned, "b": pinned}) == pinned.record()
    mixed = session_placement({"peer": peer, "a": pinned})
    assert mixed["pinned"] and mixed["engine_cpus"] == [1]
    assert "arm 'peer': in-process peer" in mixed["note"]
    assert session_placement({})["note"] == "no engine was started in this session"


def test_a_launched_engine_and_the_load_generator_run_on_disjoint_cpus(
        tiny_checkpoint, params_dir, tmp_path, monkeypatch):
    from specrepro.harness import runner

    port = free_port()
    embedded_profile(params_dir, tiny_checkpoint, port)
    path = study(params_dir, [{"name": "mtp", "profile": "tiny-mtp"}],
                 workloads=[{"name": "essays", "n": 2, "form": "chat", "max_tokens": 8}])
    cpus = set(os.sched_getaffinity(0))
    seen = {}
    real_run = runner.LoadGenerator.run

    def spy(self, prompts, scrape=None):  # while a cell measures: every thread's mask
        pid = engine_pid(port)
        seen["engine"] = {int(t): os.sched_getaffinity(int(t))
                          for t in os.listdir(f"/proc/{pid}/task")}
        seen["client"] = {int(t): os.sched_getaffinity(int(t))
                          for t in os.listdir("/proc/self/task")}
        return real_run(self, prompts, scrape)

    monkeypatch.setattr(runner.LoadGenerator, "run", spy)
    summary, store = run(path, tmp_path)
    assert summary.ok == 1, summary.errors
    session = store.manifest()["sessions"][-1]
    placement, argv = session["placement"], session["engines"][0]["argv"]
    assert 0 < session["engines"][0]["ready_s"] < 120  # launched: start to ready, recorded
    # the served folder with its content fingerprint, as the cells' identity holds it
    model = session["models"][0]
    assert model["id"] == str(tiny_checkpoint)
    assert model["content_sha256"] == local_model_fingerprint(str(tiny_checkpoint))
    assert session["engines"][0]["placement"] == placement
    assert set(os.sched_getaffinity(0)) == cpus  # the harness is back on its CPUs
    if len(cpus) < 2:
        assert not placement["pinned"] and "one CPU" in placement["note"]
        assert "--threads" not in argv
        return
    engine, client = {max(cpus)}, cpus - {max(cpus)}
    assert placement == {"engine_cpus": [max(cpus)], "client_cpus": sorted(client),
                         "pinned": True, "note": placement["note"]}
    assert argv[-2:] == ["--threads", "1"]  # the server's threads match its one CPU
    # every thread of the engine (its engine loop, torch's) and of the harness is on its set
    assert len(seen["engine"]) >= 2 and all(m == engine for m in seen["engine"].values())
    assert all(m == client for m in seen["client"].values())


def test_cells_of_a_folder_absent_here_are_done_by_the_fingerprint_the_store_recorded(
        tiny_checkpoint, params_dir, tmp_path):
    """A fresh GPU machine without the NVFP4 export (2026-12-07, H100): its arm's cells were
    stored with the folder's content fingerprint in their id; the runner hashed the absent
    folder without it, took the version as unknown and launched the engine to learn it, which
    failed (vLLM looked the folder up on the Hub). The fingerprint the store recorded stands in
    for the absent folder: the arm is skipped, nothing is launched."""
    import shutil

    ckpt = tmp_path / "export"
    shutil.copytree(tiny_checkpoint, ckpt)
    embedded_profile(params_dir, ckpt, free_port())
    path = study(params_dir, [{"name": "mtp", "profile": "tiny-mtp"}],
                 workloads=[{"name": "essays", "n": 1, "form": "chat", "max_tokens": 4}])
    summary, store = run(path, tmp_path)
    assert summary.ok == 1, summary.errors
    shutil.rmtree(ckpt)  # the machine that replays or resumes has no export
    again, store = run(path, tmp_path)
    assert (again.ok, again.skipped, again.failed, again.errors) == (0, 1, 0, [])
    assert not store.manifest()["sessions"][-1].get("engines")  # no launch was tried


def test_ctrl_c_raises_restores_the_hosts_handler():
    from specrepro.harness.runner import ctrl_c_raises
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a host that ignores Ctrl-C
    try:
        with ctrl_c_raises():
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # the handler runs at the next bytecode
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("host_handler", [signal.default_int_handler, signal.SIG_IGN],
                         ids=["default", "ignored"])
def test_ctrl_c_keeps_what_was_measured_and_a_rerun_resumes(
        tiny_checkpoint, params_dir, tmp_path, host_handler):
    # SIG_IGN: what a library may leave behind in the host process; the run still stops
    previous = signal.signal(signal.SIGINT, host_handler)
    try:
        path, port = fault_study(params_dir, tiny_checkpoint)
        root = tmp_path / "results" / "tiny_sweep" / "standalone"
        watcher = when_second_cell_streams(root, f"http://127.0.0.1:{port}",
                                           lambda: os.kill(os.getpid(), signal.SIGINT))
        summary, store = run(path, tmp_path)
        watcher.join(5)
        assert (summary.ok, summary.interrupted) == (1, 1) and summary.exit_code == 130, \
            f"watcher saw (time, status, running, generated) {watcher.seen[-20:]}"
        statuses = sorted(store.load_attempts()["status"].to_list())
        assert statuses == ["interrupted", "ok"]
        assert store.manifest()["sessions"][-1]["status"] == "interrupted"
        assert not engine_http.port_open("127.0.0.1", port)  # the engine was stopped
        summary, store = run(path, tmp_path)
        assert (summary.ok, summary.skipped) == (1, 1) and store.load_cells().height == 2
    finally:
        signal.signal(signal.SIGINT, previous)


# ------------------------------------------------------------- deadline and archive


def test_no_cell_starts_when_the_declared_bound_does_not_fit(params_dir, tmp_path):
    from specrepro.harness.runner import EX_TEMPFAIL, Deadline

    # nothing listens there: the run must stop before it even reaches for the engine
    attach_profile(params_dir, "served", f"http://127.0.0.1:{free_port()}", "m")
    path = study(params_dir, [{"name": "base", "profile": "served"}], concurrency=[1, 2])
    summary, store = run(path, tmp_path, deadline=Deadline.after(60, cell_bound_s=120))
    assert (summary.ok, summary.stopped, summary.left, summary.errors) == (0, "deadline", 2, [])
    assert summary.exit_code == EX_TEMPFAIL
    session = store.manifest()["sessions"][-1]
    assert session["status"] == "deadline" and session["engines"] == []
    assert session["deadline"]["given"] == "--deadline-s 60"
    assert session["deadline"]["cell_bound_s"] == 120
    assert session["summary"]["left"] == 2


def test_a_deadline_stops_the_study_before_a_cell_that_would_not_end_in_time(
        embedded_server, params_dir, tmp_path, monkeypatch):
    from specrepro.harness import runner

    attach_profile(params_dir, "served", embedded_server, served_model(embedded_server))
    path = study(params_dir, [{"name": "base", "profile": "served"}], concurrency=[1, 2, 4])
    deadline = runner.Deadline.after(3600)
    real_run_cell = runner.run_cell

    def then_half_a_cell_left(ctx, *args):
        started = time.monotonic()
        status = real_run_cell(ctx, *args)
        # the deadline is still ahead, but by less than the cell just measured took
        deadline.at = time.monotonic() + (time.monotonic() - started) / 2
        return status

    monkeypatch.setattr(runner, "run_cell", then_half_a_cell_left)
    summary, store = run(path, tmp_path, deadline=deadline)
    assert (summary.ok, summary.interrupted, summary.stopped, summary.left) == (1, 0, "deadline", 2)
    assert not deadline.fired  # it ended between cells, before the deadline came
    assert store.load_attempts()["status"].to_list() == ["ok"]
    assert summary.exit_code == runner.EX_TEMPFAIL
    assert store.manifest()["sessions"][-1]["status"] == "deadline"


def test_the_cell_in_flight_at_the_deadline_is_stored_interrupted_and_a_rerun_resumes(
        tiny_checkpoint, params_dir, tmp_path):
    from specrepro.harness.runner import EX_TEMPFAIL, Deadline

    path, port = fault_study(params_dir, tiny_checkpoint)  # the runner launches the engine
    root = tmp_path / "results" / "tiny_sweep" / "standalone"
    deadline = Deadline.after(3600)
    watcher = when_second_cell_streams(  # the deadline comes while the second cell streams
        root, f"http://127.0.0.1:{port}", lambda: setattr(deadline, "at", time.monotonic() + 0.2))
    summary, store = run(path, tmp_path, deadline=deadline)
    watcher.join(5)
    assert deadline.fired, f"watcher saw (time, status, running, generated) {watcher.seen[-20:]}"
    assert (summary.ok, summary.interrupted, summary.stopped, summary.left) == (
        1, 1, "deadline", 1)
    assert summary.exit_code == EX_TEMPFAIL  # not Ctrl-C's 130: nobody pressed it
    cut = store.load_attempts().filter(pl.col("status") == "interrupted").row(0, named=True)
    assert cut["error"] == "stopped at the deadline (--deadline-s 3600) during the cell"
    assert cut["concurrency"] == 2
    assert store.manifest()["sessions"][-1]["status"] == "deadline"
    assert not engine_http.port_open("127.0.0.1", port)  # the engine was stopped
    summary, store = run(path, tmp_path)  # the next run measures only the interrupted cell
    assert (summary.ok, summary.skipped, summary.stopped) == (1, 1, None)
    assert store.load_cells()["cell_id"].n_unique() == 2
    assert sorted(store.load_attempts()["status"].to_list()) == ["interrupted", "ok", "ok"]


def test_the_archive_is_whole_after_each_cell_and_a_resume_from_it_measures_the_rest(
        embedded_server, params_dir, tmp_path, monkeypatch, capsys):
    import tarfile

    from specrepro.harness import runner

    attach_profile(params_dir, "served", embedded_server, served_model(embedded_server))
    # four prompts for four streams: `specrepro run` refuses a level past its prompts
    path = study(params_dir, [{"name": "base", "profile": "served"}], concurrency=[1, 2, 4],
                 workloads=[{"name": "essays", "n": 4, "form": "chat", "max_tokens": 16}])
    out = tmp_path / "out"
    out.mkdir()
    snapshots: list[bytes] = []
    real_write = runner.Archive.write

    def keep_each(self):
        real_write(self)
        snapshots.append(self.path.read_bytes())

    monkeypatch.setattr(runner.Archive, "write", keep_each)
    assert main([str(path), "--no-progress", "--deadline-s", "3600",
                 "--archive", str(out / "run.tar.gz")]) == 0

    def unpack(data: bytes, into: Path) -> Path:
        into.mkdir(parents=True)
        (into / "a.tar.gz").write_bytes(data)
        with tarfile.open(into / "a.tar.gz") as tar:  # a whole gzip tar, or this raises
            names = tar.getnames()
            assert names and all(n.startswith("tiny_sweep/standalone") for n in names)
            assert not any(Path(n).name.startswith(".") for n in names)  # no temp files
            assert "tiny_sweep/standalone/manifest.json" in names
            tar.extractall(into / "results", filter="data")
        return into / "results"

    # begun, engine attached, one per cell, ended (merged into one file per table)
    stored = [load_attempts(unpack(s, tmp_path / f"snap{i}")).height
              for i, s in enumerate(snapshots)]
    assert stored == [0, 0, 1, 2, 3, 3]
    assert list(out.iterdir()) == [out / "run.tar.gz"]  # the temporary files renamed away
    # a command killed during the second cell left the archive of the first: a new machine
    # unpacks it and resumes, measuring only the two cells it lacks
    elsewhere = unpack(snapshots[2], tmp_path / "elsewhere")
    capsys.readouterr()
    assert main([str(path), "--no-progress", "--results-dir", str(elsewhere)]) == 0
    assert "2 ok, 0 failed, 1 already done" in capsys.readouterr().out
    attempts = load_attempts(elsewhere)
    assert attempts.height == 3 and attempts["cell_id"].n_unique() == 3  # no duplicate
    assert attempts["attempt"].to_list() == [1, 1, 1]
    sessions = json.loads((elsewhere / "tiny_sweep/standalone/manifest.json").read_text())
    assert [s["status"] for s in sessions["sessions"]] == ["running", "ok"]  # killed, resumed


@pytest.mark.parametrize("extra, flag", [
    (["--deadline-s", "soon"], "argument --deadline-s: expected a positive number"),
    (["--deadline-s", "-5"], "argument --deadline-s: expected a positive number"),
    (["--deadline-s", "0"], "argument --deadline-s: expected a positive number"),
    (["--deadline-s", "nan"], "argument --deadline-s: expected a positive number"),
    (["--until", "tomorrow"], "argument --until: expected an ISO 8601 time with its zone"),
    (["--until", "2026-12-01T18:30:00"], "argument --until: expected an ISO 8601 time with its"),
    (["--until", "2000-01-01T00:00:00Z"], "argument --until: expected a time still to come"),
    (["--deadline-s", "60", "--until", "2999-01-01T00:00:00Z"],
     "argument --until: not allowed with argument --deadline-s"),
    (["--cell-bound-s", "30"], "argument --cell-bound-s: expected it with --deadline-s"),
    (["--deadline-s", "60", "--cell-bound-s", "x"], "argument --cell-bound-s: expected a"),
    (["--archive", "/nonexistent/folder/run.tar.gz"], "argument --archive: expected a file in"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_deadline_and_archive_values_fail_naming_the_flag(params_dir, capsys, extra, flag):
    attach_profile(params_dir, "served", "http://127.0.0.1:9", "m")
    path = study(params_dir, [{"name": "base", "profile": "served"}])
    with pytest.raises(SystemExit) as exit_:
        main([str(path), "--no-progress", *extra])
    assert exit_.value.code == 2
    assert flag in capsys.readouterr().err


def test_transformers_peer_arm(tiny_checkpoint, params_dir, tmp_path):
    write(params_dir / "profiles" / "peer-draft.yaml", {
        "engine": "transformers", "command": None,
        "model": {"id": str(tiny_checkpoint), "revision": None},
        "drafter": {"id": str(tiny_checkpoint), "revision": None},
        "flags": {"device": "cpu", "dtype": "float32"},
        "speculative": {"method": "draft_model", "num_speculative_tokens": 3}})
    path = study(params_dir, [{"name": "peer", "profile": "peer-draft"}], concurrency=[2])
    summary, store = run(path, tmp_path)
    (c,) = store.load_cells().iter_rows(named=True)
    assert summary.ok == 1 and c["engine"] == "transformers" and c["n_errors"] == 0
    assert c["engine_version"] == __import__("transformers").__version__
    assert c["acceptance_length"] == pytest.approx(c["output_tokens"] / c["num_drafts"])
    assert len(c["per_position_acceptance"]) == 3 and c["peak_mem_mib"] > 0
    assert any("one request at a time" in w for w in c["warnings"])
    assert any("derived" in w for w in c["warnings"])


def test_sglang_acceptance_from_per_response_fields():
    from specrepro.harness.cells import acceptance
    from specrepro.harness.records import RequestRecord

    def rec(verify, correct, hist):
        r = RequestRecord(0, "p", 0)
        r.spec = {"sglext": {"spec_tokens_details": {
            "spec_verify_ct": verify, "spec_num_correct_drafts": correct,
            "spec_num_proposed_drafts": verify * 3, "spec_correct_drafts_histogram": hist}}}
        return r

    # hist[j]: steps with j correct drafts (K = 3)
    acc = acceptance(None, [rec(4, 8, [0, 1, 2, 1]), rec(2, 1, [1, 1, 0, 0])],
                     engines.engine("sglang"))
    assert acc["num_drafts"] == 6 and acc["num_accepted_tokens"] == 9
    assert acc["acceptance_length"] == pytest.approx(1 + 9 / 6)
    assert acc["draft_acceptance_rate"] == pytest.approx(9 / 18)
    assert acc["per_position_acceptance"] == pytest.approx([5 / 6, 3 / 6, 1 / 6])


# ------------------------------------------------------------- one start for several studies


def test_studies_whose_arms_share_a_profile_share_one_engine_start(
        tiny_checkpoint, params_dir, tmp_path, monkeypatch):
    """Two studies of one command, both with an arm on the same launched profile, and a
    third arm (same profile, other port) of its own: two launches, not three; each study's
    cells and its own copy of the log; the second says whose start it shared."""
    from specrepro.harness import engine_pool, runner
    from specrepro.harness.runner import launch_groups, run_studies

    port = free_port()
    embedded_profile(params_dir, tiny_checkpoint, port)
    spec = yaml.safe_load((params_dir / "profiles" / "tiny-mtp.yaml").read_text())
    write(params_dir / "profiles" / "tiny-mtp-other-port.yaml", {**spec, "port": free_port()})
    small = [{"name": "essays", "n": 2, "form": "chat", "max_tokens": 8}]
    first = study(params_dir, [{"name": "mtp", "profile": "tiny-mtp"}], workloads=small)
    second = write(params_dir / "studies" / "02_tiny.yaml", {
        "name": "tiny_temps", "notebook": "02_temperature_spread",
        "arms": [{"name": "head", "profile": "tiny-mtp"},
                 {"name": "head-elsewhere", "profile": "tiny-mtp-other-port"}],
        "baseline": "head", "workloads": small, "concurrency": [1],
        "sampling": [{"temperature": 0.0}], "seed": 200})
    plans = [resolve(p)[0] for p in (first, second)]
    stores = [(st, ResultStore(tmp_path / "results", st.name, run_id))
              for st, _, run_id in plans]
    launches = []
    real_start = engine_pool.start_engine
    monkeypatch.setattr(engine_pool, "start_engine", lambda arm, *a, **k: (
        launches.append(arm.name), real_start(arm, *a, **k))[1])
    summaries = run_studies(stores, progress=False, power_interval_s=0.2)
    assert [(s.ok, s.errors) for s in summaries] == [(1, []), (2, [])]
    assert launches == ["mtp", "head-elsewhere"]  # head rode on mtp's start
    (_, one), (_, two) = stores
    assert one.load_cells().height == 1 and two.load_cells().height == 2
    head, elsewhere = two.manifest()["sessions"][-1]["engines"]
    (mtp,) = one.manifest()["sessions"][-1]["engines"]
    assert head["arm"] == "head" and head["shared_launch"]["study"] == "tiny_sweep"
    assert head["shared_launch"]["arm"] == "mtp" and head["ready_s"] == mtp["ready_s"]
    assert head["profile_hash"] == mtp["profile_hash"] and "shared_launch" not in elsewhere
    copy = Path(head["log"])
    assert copy == two.logs_dir / "head--tiny-mtp.log.gz" and copy.is_file()  # its own name
    original = Path(mtp["log"])
    assert original == one.logs_dir / "mtp--tiny-mtp.log.gz"  # gzipped once it stopped
    assert not list(one.logs_dir.glob("*.log")) and not list(two.logs_dir.glob("*.log"))
    text = gzip.decompress(original.read_bytes()).decode()
    assert "tiny" in text and gzip.decompress(copy.read_bytes()).decode() == text
    # the groups: by resolved profile, each study's baseline first, order of first sight
    ctxs = [runner._Run(st, store, None, 0.2, 60.0, [], set(), None, None,
                        {a.name for a in st.arms}, [], []) for st, store in stores]
    assert [[(c.study.name, a.name) for c, a in g] for g in launch_groups(ctxs)] == [
        [("tiny_sweep", "mtp"), ("tiny_temps", "head")], [("tiny_temps", "head-elsewhere")]]
    # all done: a second command launches nothing and skips every cell of both
    launches.clear()
    summaries = run_studies(stores, progress=False, power_interval_s=0.2)
    assert launches == [] and [(s.ok, s.skipped) for s in summaries] == [(0, 1), (0, 2)]


def test_launch_groups_run_each_studys_baseline_before_its_other_arms():
    """01-like (baseline x, then y) and 06-like (baseline z, then y): y's start is shared,
    and it waits for z's, so both studies' arms meet a stored baseline."""
    from types import SimpleNamespace

    from specrepro.harness.runner import _Run, launch_groups

    def resolved(name):
        return SimpleNamespace(model_dump=lambda **_: {"name": name}, model=None, drafter=None)

    def ctx(name, baseline, *arms):
        st = SimpleNamespace(name=name, baseline=baseline, placement="none",
                             arms=[SimpleNamespace(name=a, resolved=resolved(p))
                                   for a, p in arms])
        return _Run(st, None, None, 0.2, 60.0, [], set(), None, None,
                    {a for a, _ in arms}, [], [])

    a = ctx("A", "x", ("x", "px"), ("y", "py"))
    b = ctx("B", "z", ("y2", "py"), ("z", "pz"), ("w", "pw"))
    got = [[(c.study.name, arm.name) for c, arm in g] for g in launch_groups([a, b])]
    assert got == [[("A", "x")], [("B", "z")], [("A", "y"), ("B", "y2")], [("B", "w")]]
    # contradictory baselines (each study's baseline is the other's arm): first sight wins
    c = ctx("C", "q", ("q", "pq"), ("r", "pr"))
    d = ctx("D", "r2", ("r2", "pr"), ("q2", "pq"))
    got = [[(c_.study.name, arm.name) for c_, arm in g] for g in launch_groups([c, d])]
    assert got == [[("C", "q"), ("D", "q2")], [("C", "r"), ("D", "r2")]]


def test_engine_filter_runs_only_the_arms_whose_engine_is_staged(embedded_server, params_dir,
                                                                 tmp_path):
    """`--engine`: a machine with one engine staged measures that engine's arms and leaves
    the others' cells for a machine that has theirs; an engine no arm runs on is named."""
    attach_profile(params_dir, "served", embedded_server, served_model(embedded_server))
    write(params_dir / "profiles" / "elsewhere.yaml", {
        "engine": "embedded", "command": ["{python}", "-m", "specrepro.embedded.serve"],
        "model": {"id": str(tmp_path / "never-started"), "revision": None}})
    path = study(params_dir, [{"name": "base", "profile": "served"},
                              {"name": "later", "profile": "elsewhere"}])
    summary, store = run(path, tmp_path, engines_=["attach"])
    assert (summary.ok, summary.failed, summary.errors) == (1, 0, [])
    assert store.load_cells()["arm"].to_list() == ["base"]
    (session,) = store.manifest()["sessions"]
    assert session["arms_run"] == ["base"]
    with pytest.raises(ParamsError, match=r"--engine: expected an engine the arms of "
                                          r"tiny_sweep run on \(attach, embedded\), found 'vllm'"):
        run(path, tmp_path, engines_=["vllm"])


def test_gpu_arms_are_refused_on_a_machine_without_a_gpu(tmp_path, capsys, monkeypatch):
    """`specrepro run` of a suite whose arms launch vLLM, on a machine NVML sees no GPU on:
    nothing runs and nothing is stored (a start that can only fail is no measurement)."""
    from specrepro import provenance

    monkeypatch.setattr(provenance, "gpu_info", lambda: {"gpus": [], "note": "no NVML"})
    suite = str(Path(__file__).resolve().parents[1] / "params" / "h200-engines.yaml")
    assert main([suite, "--notebook", "07_the_bill", "--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert ("arms none of 07_the_bill, mtp-control of 07_the_bill, dflash-k7 of 07_the_bill "
            "start their engine on a GPU" in err and "no NVIDIA GPU that NVML sees (no NVML)"
            in err)
    assert not any(tmp_path.iterdir())
    # --engine that leaves no GPU arm chosen passes the check (and names a bad engine)
    assert main([suite, "--notebook", "07_the_bill", "--engine", "embedded",
                 "--results-dir", str(tmp_path)]) == 2
    assert "--engine: expected an engine the arms of 07_the_bill run on (vllm)" in \
        capsys.readouterr().err


def test_an_engine_starts_only_where_the_cells_after_it_repay_the_start():
    """deadline.start_repays, on the H200's figures of 2026-12-02: with 160 s left, an 85-s
    start and 10-25-s cells, a launch group of 9 cells got one cell before the deadline and
    was started again by the next command (a 106-s start then); now it waits for that one."""
    from specrepro.harness.deadline import start_repays

    cells = [10.0, 14.0, 25.0, 12.0]  # mean 15.25, longest 25
    # the start and its first cell do not fit at all
    assert not start_repays(100.0, [85.0], cells, None, 9)
    # 4 cells fit after the start (61 s of measuring) and 5 would be left: not worth 85 s
    assert not start_repays(160.0, [85.0], cells, None, 9)
    # the same time left finishes a group of 4: worth it, nothing is started twice
    assert start_repays(160.0, [85.0], cells, None, 4)
    # 7 cells fit (107 s of measuring), more than the start costs: worth it
    assert start_repays(200.0, [85.0], cells, None, 9)
    # nothing measured yet to count by: the declared bound alone decides
    assert start_repays(160.0, [85.0], [], 40.0, 9)
    assert not start_repays(120.0, [85.0], [], 40.0, 9)
    # no start timed yet (the command's first group): one cell fitting is enough
    assert start_repays(30.0, [], cells, None, 9)
    # the command's first start may be the machine's cold one (154 s against 72 s later):
    # after a second start, the longest of the later ones prices the next
    assert not start_repays(200.0, [154.0], cells, None, 5)
    assert start_repays(200.0, [154.0, 72.0], cells, None, 5)
    assert not start_repays(200.0, [154.0, 72.0, 140.0], cells, None, 5)
