"""Engines die with their run (harness/lifecycle.py, harness/engine_watchdog.py): a real
`specrepro run` killed with SIGTERM, SIGHUP and SIGKILL leaves no engine and its re-run
completes with no cell lost or measured twice; a stale engine of the results dir is
stopped and said, one in use or someone else's is named; the watchdog stops an engine's
whole group (its children too) when its run dies; SIGTERM and SIGHUP act as Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import polars as pl
import psutil
import pytest
import yaml

from specrepro.harness import engine_http, engines, lifecycle, promtext
from specrepro.harness.run_command import main as run_main
from specrepro.store import ResultStore

REPO = Path(__file__).resolve().parents[1]
GONE_S = 15.0  # how long a killed run's engine may take to go (the watchdog polls each 1 s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def marked(pid_dir: Path) -> list[psutil.Process]:
    """Live processes whose environment names a pid file under pid_dir (engines and their
    children), and watchdogs guarding one."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            if (p.environ().get(lifecycle.MARK, "").startswith(str(pid_dir))
                    or str(pid_dir) in " ".join(p.cmdline())):
                found.append(p)
        except psutil.Error:
            continue
    return found


# ------------------------------------------------------------- a real run, killed


def tiny_study(tmp: Path, ckpt: Path, port: int) -> Path:
    params = tmp / "params"
    (params / "profiles").mkdir(parents=True)
    (params / "studies").mkdir(parents=True)
    (params / "profiles" / "tiny.yaml").write_text(yaml.safe_dump({
        "engine": "embedded", "command": ["{python}", "-m", "specrepro.embedded.serve"],
        "host": "127.0.0.1", "port": port,
        "model": {"id": str(ckpt), "revision": None, "served_name": "tiny"},
        "flags": {"max-model-len": 512, "max-num-seqs": 4},
        "speculative": {"method": "mtp", "num_speculative_tokens": 3},
        "env": {"OMP_NUM_THREADS": "1"}, "ready_timeout_s": 120}))
    path = params / "studies" / "01_tiny.yaml"
    # Three cells: a short first one (2 HumanEval prompts at one stream, only to be stored),
    # then two long enough (6 prompts x 96 tokens, ignore_eos) to be caught in flight.
    path.write_text(yaml.safe_dump({
        "name": "tiny_kill", "notebook": "01_drafter_block_sweep",
        "arms": [{"name": "mtp", "profile": "tiny"}], "concurrency": [1, 2, 3],
        "workloads": [{"name": "humaneval", "n": 2, "form": "completion", "max_tokens": 16},
                      {"name": "essays", "n": 6, "form": "chat", "max_tokens": 96}],
        "skip": [{"workload": "humaneval", "concurrency": [2, 3]},
                 {"workload": "essays", "concurrency": [1]}],
        "sampling": [{"temperature": 0.0}], "seed": 100, "ignore_eos": True}))
    return path


def streaming(url: str) -> bool:
    status, body = engine_http.http_get(f"{url}/metrics", timeout=2)
    snap = (promtext.parse(body.decode(), engines.engine("embedded").metrics) if status == 200
            else None)
    return snap is not None and (snap.requests_running or 0) > 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL],
                         ids=["SIGTERM", "SIGHUP", "SIGKILL"])
def test_a_killed_run_leaves_no_engine_and_its_rerun_measures_each_cell_once(
        sig, tiny_checkpoint, tmp_path):
    port = free_port()
    study = tiny_study(tmp_path, tiny_checkpoint, port)
    results = tmp_path / "results"
    store = ResultStore(results, "tiny_kill", "standalone")
    run = subprocess.Popen(
        [sys.executable, "-m", "specrepro.cli", "run", str(study), "--results-dir",
         str(results), "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        cwd=REPO, start_new_session=True)  # its own group: a kill here reaches only it
    try:
        wait_for(lambda: list(store.cells_dir.glob("*.parquet")), 120, "the first cell stored")
        wait_for(lambda: streaming(f"http://127.0.0.1:{port}"), 30, "the second cell streaming")
        engine = json.loads((lifecycle.engines_dir(results) / f"{port}.json").read_text())
        os.kill(run.pid, sig)
        out = run.communicate(timeout=60)[0].decode()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    if sig == signal.SIGKILL:
        assert run.returncode == -signal.SIGKILL
    else:  # Ctrl-C's path: the cell in flight stored as interrupted, the message printed
        assert run.returncode == 128 + sig, out
        assert f"interrupted by {sig.name}: the engine is stopped" in out
        assert not engine_http.port_open("127.0.0.1", port), "the engine outlived its run's teardown"
        interrupted = store.load_attempts().filter(pl.col("status") == "interrupted")
        assert interrupted["error"].to_list() == [f"interrupted by {sig.name} during the cell"]
        assert store.manifest()["sessions"][-1]["summary"]["signal"] == sig.name
    wait_for(lambda: not engine_http.port_open("127.0.0.1", port), GONE_S, "the port free")
    wait_for(lambda: not marked(results), GONE_S, "no engine or watchdog left")
    assert not psutil.pid_exists(engine["pid"]) or \
        psutil.Process(engine["pid"]).status() == psutil.STATUS_ZOMBIE
    assert not (lifecycle.engines_dir(results) / f"{port}.json").exists()
    measured = store.load_cells().height
    assert 1 <= measured < 3

    assert run_main([str(study), "--results-dir", str(results), "--no-progress"]) == 0
    cells = store.load_cells()
    assert cells.height == 3 and cells["cell_id"].n_unique() == 3  # none lost
    ok = store.load_attempts().filter(pl.col("status") == "ok")
    assert ok.height == 3 and ok["cell_id"].n_unique() == 3  # none measured twice
    assert not engine_http.port_open("127.0.0.1", port) and not marked(results)


# ------------------------------------------------------------------ stale engines


LISTENER = textwrap.dedent("""
    import socket, subprocess, sys, time
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(sys.argv[1])))
    s.listen()
    if len(sys.argv) > 2:  # a child of its own, as vLLM's engine cores are
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    print("ready", flush=True)
    time.sleep(300)
""")


def fake_engine(port: int, env: dict | None = None, child: bool = False) -> subprocess.Popen:
    """A process listening on the port in a session of its own (as engines are started)."""
    proc = subprocess.Popen([sys.executable, "-c", LISTENER, str(port)] + (["child"] * child),
                            stdout=subprocess.PIPE, env={**os.environ, **(env or {})},
                            start_new_session=True)
    assert proc.stdout.readline().strip() == b"ready"
    return proc


def dead_pid() -> tuple[int, float]:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    made = round(psutil.Process(p.pid).create_time(), 2)
    p.wait()
    return p.pid, made


def pid_file(pid_dir: Path, port: int, engine: subprocess.Popen, owner: tuple[int, float]) -> Path:
    path = lifecycle.pid_path(pid_dir, port)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "pid": engine.pid, "pgid": engine.pid, "host": "127.0.0.1", "port": port,
        "argv": engine.args, "started_at": "2026-12-04T00:00:00+00:00",
        "owner": {"pid": owner[0], "create_time": owner[1], "argv": ["specrepro", "run", "x"]}}))
    return path


def stop(proc: subprocess.Popen) -> None:
    """Kill a fake engine's group (it and its child), reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()


def test_a_stale_engine_of_this_store_is_stopped_with_its_children_and_said(tmp_path):
    port, pid_dir = free_port(), tmp_path / "results" / ".engines"
    engine = fake_engine(port, lifecycle.marker_env(pid_dir, port), child=True)
    try:
        members = [engine.pid] + [c.pid for c in psutil.Process(engine.pid).children()]
        assert len(members) == 2
        path = pid_file(pid_dir, port, engine, dead_pid())
        said = []
        assert lifecycle.clear_port("127.0.0.1", port, pid_dir, said.append) is None
        engine.wait(timeout=5)  # reaped here: it is this test's child
        assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                       for p in members)
        assert not engine_http.port_open("127.0.0.1", port) and not path.exists()
        (line,) = said
        assert line.startswith(f"stopped a stale engine of this results dir on 127.0.0.1:"
                               f"{port}: pid {engine.pid}") and "which has exited" in line
    finally:
        stop(engine)


def test_an_engine_whose_run_lives_is_not_stopped_and_its_run_is_named(tmp_path):
    port, pid_dir = free_port(), tmp_path / ".engines"
    engine = fake_engine(port, lifecycle.marker_env(pid_dir, port))
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        pid_file(pid_dir, port, engine, (owner.pid, round(psutil.Process(owner.pid)
                                                          .create_time(), 2)))
        said = []
        problem = lifecycle.clear_port("127.0.0.1", port, pid_dir, said.append)
        assert problem is not None and not said and engine.poll() is None
        assert "for a run still going" in problem and f"pid {owner.pid}" in problem
    finally:
        stop(engine)
        owner.kill()
        owner.wait()


def test_a_port_taken_by_another_process_names_its_pid_and_command_line(tmp_path):
    port = free_port()
    other = fake_engine(port)
    try:
        problem = lifecycle.clear_port("127.0.0.1", port, tmp_path / ".engines")
        assert problem.startswith(f"something already listens on 127.0.0.1:{port}: "
                                  f"pid {other.pid} `{sys.executable} -c")
        assert "parent pid" in problem and problem.endswith("stop it or change the port")
        # another results dir's engine: its pid file and the command that stops it
        other_dir = tmp_path / "elsewhere" / ".engines"
        stop(other)
        other = fake_engine(port, lifecycle.marker_env(other_dir, port))
        pid_file(other_dir, port, other, dead_pid())
        problem = lifecycle.clear_port("127.0.0.1", port, tmp_path / ".engines")
        assert "a specrepro engine of another results dir" in problem
        assert f"`kill -TERM -- -{other.pid}` stops it" in problem and other.poll() is None
    finally:
        stop(other)


# ---------------------------------------------------------------------- watchdog


OWNER = textwrap.dedent("""
    import subprocess, sys, time, types
    from pathlib import Path
    from specrepro.harness import lifecycle
    port, pid_dir = int(sys.argv[1]), Path(sys.argv[2])
    engine = subprocess.Popen([sys.executable, "-c", sys.argv[3], str(port), "child"],
                              stdout=subprocess.PIPE, start_new_session=True,
                              env={**lifecycle.os.environ, **lifecycle.marker_env(pid_dir, port)})
    engine.stdout.readline()
    handle = types.SimpleNamespace(process=engine, argv=engine.args, log_path=None,
                                   profile=types.SimpleNamespace(host="127.0.0.1", port=port))
    lifecycle.guard(handle, pid_dir)
    print(engine.pid, flush=True)
    time.sleep(300)
""")


def test_the_watchdog_stops_the_engines_whole_group_when_its_run_is_killed(tmp_path):
    port, pid_dir = free_port(), tmp_path / ".engines"
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(port), str(pid_dir), LISTENER],
                             stdout=subprocess.PIPE, cwd=REPO)
    pgid = None
    try:
        pgid = int(owner.stdout.readline())
        members = [psutil.Process(pgid), *psutil.Process(pgid).children()]
        assert len(members) == 2 and (pid_dir / f"{port}.json").exists()
        owner.kill()
        owner.wait()
        wait_for(lambda: not any(p.is_running() and p.status() != "zombie" for p in members),
                 GONE_S, "the engine and its child gone")
        wait_for(lambda: not (pid_dir / f"{port}.json").exists(), 5, "the pid file removed")
        assert not engine_http.port_open("127.0.0.1", port)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass


# ----------------------------------------------------------------------- signals


def test_sigterm_and_sighup_act_as_ctrl_c_and_an_ignored_sighup_stays_ignored():
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with pytest.raises(KeyboardInterrupt), lifecycle.stop_signals():
            signal.signal(signal.SIGINT, signal.default_int_handler)
            os.kill(os.getpid(), sig)
            time.sleep(5)  # interrupted at once
        assert lifecycle.received() == sig.name
        assert lifecycle.exit_status(lifecycle.received()) == 128 + sig
        assert signal.getsignal(sig) is signal.SIG_DFL  # pytest's (the default) is back
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
    try:
        with lifecycle.stop_signals():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.1)
        assert lifecycle.received() is None
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert lifecycle.exit_status(None) == 130
