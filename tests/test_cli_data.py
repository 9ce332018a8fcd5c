"""The CLI finds the data a user has: the Makefile's default (the checkout's
../shared/data) where SPECREPRO_DATA_DIR is unset; where no source answers, one line at
start, before any engine starts, after one request to the hub at most."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from specrepro import data, workloads
from specrepro.harness import run_command

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "params" / "smoke.yaml"  # its notebooks 03, 04, 05 and 07 read GSM8K
CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens, refused at once


@pytest.fixture
def no_data(monkeypatch, tmp_path):
    """A machine with no data directory: the variable unset, no ../shared/data beside the
    checkout, not offline, and the hub unreachable."""
    monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)
    monkeypatch.setattr(data, "CHECKOUT_DATA_DIR", tmp_path / "no-shared-data")
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", CLOSED)
    data.hub_unreachable.cache_clear()
    yield
    data.hub_unreachable.cache_clear()


def test_unset_variable_means_the_makefiles_default(monkeypatch, tmp_path):
    monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)
    assert data.CHECKOUT_DATA_DIR == REPO.parent / "shared" / "data"  # make's ../shared/data
    monkeypatch.setattr(data, "CHECKOUT_DATA_DIR", tmp_path)
    assert data.data_dir() == tmp_path
    monkeypatch.setattr(data, "CHECKOUT_DATA_DIR", tmp_path / "absent")
    assert data.data_dir() is None  # the hub
    monkeypatch.setattr(data, "CHECKOUT_DATA_DIR", tmp_path)
    monkeypatch.setenv(data.DATA_DIR_ENV, "")
    assert data.data_dir() is None  # set empty: the hub, as `make` also keeps it empty


def test_the_hub_is_asked_once(no_data, monkeypatch):
    calls = []

    def refused(request, timeout):
        calls.append((request.full_url, request.get_method(), timeout))
        raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))

    monkeypatch.setattr(urllib.request, "urlopen", refused)
    gsm8k5 = {"name": "gsm8k", "n": 2, "shots": 5}  # reads test and train
    for _ in range(2):
        with pytest.raises(data.DataError) as e:
            workloads.check_data([gsm8k5, gsm8k5])
    msg = str(e.value)
    assert "\n" not in msg and "GSM8K test" in msg and "SPECREPRO_DATA_DIR is not set" in msg
    assert f"the hub gave no answer ({CLOSED}: ConnectionRefusedError" in msg
    assert calls == [(f"{CLOSED}/api/datasets/openai/gsm8k", "HEAD", data.HUB_TIMEOUT_S)]


def test_check_data_names_the_missing_split(tmp_path, monkeypatch):
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path))
    workloads.check_data([{"name": "gsm8k", "n": 1}, {"name": "humaneval", "n": 1}])
    with pytest.raises(data.DataError, match=r"GSM8K train: .*gsm8k/train\.jsonl, no such"):
        workloads.check_data([{"name": "gsm8k", "n": 1, "shots": 5}])
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path / "absent"))
    workloads.check_data([{"name": "essays", "n": 1}, {"name": "prefill", "n": 1}])


def test_run_without_data_stops_before_any_engine(no_data, monkeypatch, tmp_path, capsys):
    def engines_started(*a, **k):
        raise AssertionError("run_studies was called: engines would start")

    monkeypatch.setattr(run_command, "run_studies", engines_started)
    started = time.monotonic()
    code = run_command.main([str(SMOKE), "--results-dir", str(tmp_path / "results"),
                             "--no-progress"])
    took = time.monotonic() - started
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: GSM8K test: SPECREPRO_DATA_DIR")
    assert took < 5, took
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("hub", ["unreachable", "offline"])
def test_the_command_without_data(hub, tmp_path):
    """`specrepro run params/smoke.yaml` as a user types it, on a machine without the
    data: exit 2 with one line in seconds, nothing stored."""
    env = {k: v for k, v in os.environ.items()
           if k not in (data.DATA_DIR_ENV, "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env.update({"HF_ENDPOINT": CLOSED} if hub == "unreachable" else {"HF_HUB_OFFLINE": "1"})
    # this checkout has ../shared/data beside it: the run sees a machine without it
    code = ("import sys; from specrepro import data, cli; "
            f"data.CHECKOUT_DATA_DIR = data.Path({json.dumps(str(tmp_path / 'none'))}); "
            "sys.exit(cli.main(sys.argv[1:]))")
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", code, "run", "params/smoke.yaml", "--results-dir",
         str(tmp_path / "results")], cwd=REPO, env=env, capture_output=True, text=True,
        check=False, timeout=60)
    took = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: GSM8K test: ")
    assert ("the hub gave no answer" if hub == "unreachable" else "offline mode") in proc.stderr
    assert took < 20, took  # imports included, on a busy 2-core machine
    assert not (tmp_path / "results").exists()
