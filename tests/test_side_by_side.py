"""Arms side by side on one machine (issue 16, item 6; issue 17, item 2): a suite's studies
that no notebook renders, `specrepro run --arm`, one store shared by concurrent sessions
(the manifest edited under a lock), an archive taken while others write, each launch's own
log lines; and scripts/run_arms_side_by_side.sh end to end on the embedded engine."""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from specrepro.harness.archive import Archive
from specrepro.harness.engine_handle import EngineHandle
from specrepro.harness.run_command import main
from specrepro.harness.runner import Deadline, run_study
from specrepro.params import ParamsError, load_suite, resolve_study
from specrepro.params import resolve_file as resolve
from specrepro.store import ResultStore, load_cells

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def params(tmp_path):
    """A suite with one notebook and one benchmark study, arms a and b attached to a URL
    where nothing listens (no cell can run: the tests stop them at a deadline)."""
    p = tmp_path / "params"
    url = f"http://127.0.0.1:{free_port()}"
    for name in ("a", "b"):
        write(p / "profiles" / f"served-{name}.yaml",
              {"engine": "attach", "url": url, "attached_engine": "embedded",
               "model": {"id": "m", "revision": None}})
    study = {"name": "bench", "notebook": "bench",
             "arms": [{"name": "a", "profile": "served-a"}, {"name": "b", "profile": "served-b"}],
             "workloads": [{"name": "essays", "n": 2, "form": "completion", "max_tokens": 8}],
             "concurrency": [1, 2]}
    write(p / "studies" / "bench.yaml", study)
    write(p / "studies" / "01.yaml", {**study, "name": "01_drafter_block_sweep",
                                      "notebook": "01_drafter_block_sweep"})
    return write(p / "suite.yaml", {
        "name": "s", "run_id": "r", "results_dir": "../results", "binds": "listed",
        "notebooks": {"01_drafter_block_sweep": {"study": "studies/01.yaml"}},
        "studies": {"bench-x": {"study": "studies/bench.yaml",
                                "overrides": {"name": "bench-x", "concurrency": [1]}}}})


def test_a_suites_study_runs_only_when_named_and_its_overrides_apply(params):
    assert [st.name for st, _, _ in resolve(params)] == ["01_drafter_block_sweep"]
    (st, results_dir, run_id), = resolve(params, ["bench-x"])
    assert (st.name, st.concurrency, run_id) == ("bench-x", [1], "r")
    assert results_dir == params.parent.parent / "results"
    with pytest.raises(ParamsError, match="expected a notebook or study id.*bench-y"):
        resolve_study(load_suite(params), "bench-y")


def test_a_study_id_may_not_be_a_notebooks(params):
    data = yaml.safe_load(params.read_text())
    data["studies"]["01_drafter_block_sweep"] = data["studies"].pop("bench-x")
    write(params, data)
    with pytest.raises(ParamsError, match=r"studies.*not a notebook's"):
        load_suite(params)


def test_a_study_file_of_no_notebook_resolves_standalone(params):
    (st, _, run_id), = resolve(params.parent / "studies" / "bench.yaml")
    assert (st.name, st.notebook_id, run_id) == ("bench", "bench", "standalone")


def test_arm_runs_only_that_arms_cells_and_says_so_in_the_manifest(params, tmp_path):
    (st, _, _), = resolve(params)
    store = ResultStore(tmp_path / "results", st.name, "r")
    # nothing may start before the deadline: what is left is the chosen arm's cells only
    summary = run_study(st, store, progress=False, arms=["b"],
                        deadline=Deadline.after(60, cell_bound_s=120))
    assert (summary.stopped, summary.left) == ("deadline", 2)
    assert store.manifest()["sessions"][-1]["arms_run"] == ["b"]
    with pytest.raises(ParamsError, match=r"--arm: expected an arm of study .*\(a, b\), found 'c'"):
        run_study(st, store, progress=False, arms=["c"])


def test_an_unknown_arm_on_the_command_line_is_an_error_naming_the_arms(params, capsys):
    assert main([str(params), "--arm", "zz", "--no-progress"]) == 2
    assert "found 'zz'" in capsys.readouterr().err


def _sessions(root: str, n: int) -> None:
    store = ResultStore(root, "st", "r")
    store.begin_session({"params": None})
    for i in range(n):
        store.update_session(engines=[{"i": i}], note=f"{os.getpid()}-{i}")
    store.end_session()


def test_concurrent_sessions_of_one_store_lose_no_manifest_edit(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_sessions, args=(str(tmp_path), 15)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    sessions = json.loads((tmp_path / "st" / "r" / "manifest.json").read_text())["sessions"]
    assert len(sessions) == 6  # each read-modify-write of another session survived
    assert all(s["status"] == "ok" and len(s["engines"]) == 15 for s in sessions)


def test_an_archive_leaves_temporary_files_out_and_skips_one_that_vanishes(tmp_path,
                                                                           monkeypatch):
    store = ResultStore(tmp_path / "results", "st", "r")
    store.begin_session({})
    (store.cells_dir / ".part.parquet.tmp").write_bytes(b"x")
    gone = store.cells_dir / "gone.parquet"
    gone.write_bytes(b"y")
    real_add = tarfile.TarFile.add

    def add(self, name, *a, **kw):  # another session renames its file between list and read
        if Path(name) == gone:
            gone.unlink()
        return real_add(self, name, *a, **kw)

    monkeypatch.setattr(tarfile.TarFile, "add", add)
    archive = Archive(tmp_path / "a.tar.gz")
    archive.add(store)
    archive.write()
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        names = tar.getnames()
    assert "st/r/manifest.json" in names and "st/r/cells" in names
    assert not any(n.endswith((".tmp", "gone.parquet")) for n in names)


def test_a_launch_parses_only_its_own_lines_of_an_appended_log(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("INFO KV cache 999 tokens (an earlier launch)\n")
    offset = log.stat().st_size
    with log.open("a") as fh:
        fh.write("$ vllm serve m\nINFO this launch\n")
    handle = EngineHandle(None, None, "http://x", None, log, ["vllm"], log_offset=offset)
    assert handle.log_text() == "$ vllm serve m\nINFO this launch\n"
    assert "earlier" not in handle.log_tail()


@pytest.mark.timeout(600)
def test_the_side_by_side_script_runs_every_arm_into_one_store(tmp_path, monkeypatch):
    """Three embedded-engine arms at once on the CPU, one store, one archive."""
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    rows = [{"question": f"Tom has {i} apples and buys 2 more. How many apples?",
             "answer": f"{i} + 2 = <<{i}+2={i + 2}>>{i + 2}\n#### {i + 2}"} for i in range(3)]
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = tmp_path / "params"
    (p / "studies").mkdir(parents=True)
    (p / "profiles").symlink_to(REPO / "params" / "profiles")
    study = yaml.safe_load((REPO / "params/studies/parity.yaml").read_text())
    keep = {"none", "dflash-k4", "ngram-k3"}
    study["arms"] = [{**a, "overrides": {**a.get("overrides", {}), "port": free_port(),
                                         "flags": {"max-model-len": 512}}}
                     for a in study["arms"] if a["name"] in keep]
    study["workloads"] = [{"name": "gsm8k", "n": 2, "form": "completion", "max_tokens": 12}]
    path = write(p / "studies" / "parity.yaml", study)
    env = {**os.environ, "SPECREPRO_DATA_DIR": str(tmp_path / "data"),
           "PYTHON": str(REPO / ".venv/bin/python") if (REPO / ".venv/bin/python").exists()
           else "python3"}
    out = subprocess.run(["bash", str(REPO / "scripts/run_arms_side_by_side.sh"), str(path),
                          "parity", "400", str(tmp_path / "a.tar.gz"), "0"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=580,
                         check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "pass 1: exit statuses 0 0 0" in out.stdout
    root = tmp_path / "results" / "parity" / "standalone"
    cells = load_cells(root)
    assert sorted(cells["arm"].to_list()) == sorted(keep)
    manifest = json.loads((root / "manifest.json").read_text())
    assert sorted(s["arms_run"][0] for s in manifest["sessions"]) == sorted(keep)
    assert {f.name for f in (root / "logs").glob("*--*.log.gz")} == {  # gzipped when stopped
        "none--embedded-none.log.gz", "dflash-k4--embedded-dflash.log.gz",
        "ngram-k3--embedded-ngram.log.gz"}
    with tarfile.open(tmp_path / "a.tar.gz") as tar:  # the final archive: the whole store
        merged = [n for n in tar.getnames() if "/cells/session-" in n]
    assert len(merged) == 3


def test_a_reader_meets_a_part_another_session_merges_away_and_reads_again(tmp_path,
                                                                             monkeypatch):
    """A part listed, then merged into its session file and deleted by its own session
    before it is read: the read is taken again and finds the rows in the merged file."""
    from specrepro.store import load_attempts, loaders, now

    store = ResultStore(tmp_path, "st", "r")
    store.begin_session({})
    row = {"cell_id": "0123456789abcdef", "status": "ok", "arm": "a", "workload": "w",
           "concurrency": 1, "repeat": 0, "ended_at": now()}
    store.append_cell(row, [{"request_idx": 0, "prompt_id": "p"}])
    real, merged = loaders.table_files, []

    def files(root, table):  # list the parts, then merge them away before they are read
        found = real(root, table)
        if not merged:
            merged.append(store.merge_session())
        return found

    monkeypatch.setattr(loaders, "table_files", files)
    assert load_attempts(store.root)["cell_id"].to_list() == ["0123456789abcdef"]
    assert merged == [{"requests": 1, "cells": 1}]


def test_repeated_session_params_are_stored_once_and_read_whole(tmp_path):
    """Arms side by side make one session each with the same resolved study: the manifest
    keeps it once; reading gives every session its params; old manifests are compacted
    losslessly."""
    from specrepro.store import compaction

    params = {"arms": [{"name": "a", "profile": {"flags": {"x": 1}}}], "n": 32}
    store = ResultStore(tmp_path, "st", "r")
    first = store.begin_session({"params": params})["session_id"]
    store.end_session()
    other = ResultStore(tmp_path, "st", "r")
    other.begin_session({"params": params})
    other.update_session(note="edited after")
    other.end_session()
    third = ResultStore(tmp_path, "st", "r")
    third.begin_session({"params": {**params, "n": 64}})  # changed: a copy of its own
    raw = json.loads((tmp_path / "st" / "r" / "manifest.json").read_text())["sessions"]
    assert raw[1]["params"] == {"same_as_session": first}
    assert raw[2]["params"]["n"] == 64
    whole = store.manifest()["sessions"]
    assert [s["params"]["n"] for s in whole] == [32, 32, 64]
    assert whole[1]["note"] == "edited after" and whole[1]["status"] == "ok"
    # a manifest written with a copy per session: compacted to references, read the same
    raw[1]["params"] = params
    (tmp_path / "st" / "r" / "manifest.json").write_text(json.dumps({"sessions": raw}))
    before = store.manifest()
    assert store.dedupe_manifest() == 1
    assert store.manifest() == before
    assert compaction.compact(tmp_path) == {tmp_path / "st" / "r": {
        "requests": 0, "cells": 0, "upgraded": 0, "folded": 0, "logs_packed": 0}}


def test_the_gpu_measuring_script_checks_its_arguments_and_runs_a_study(tmp_path,
                                                                        tiny_checkpoint):
    """scripts/gpu_measure.sh: a missing argument, a suite that is not there, a deadline that
    is not whole seconds and an unstaged bundle are one-line errors (exit 2); with an
    environment script it runs the study into its store outside the working tree, whose
    archive holds it."""
    script = str(REPO / "scripts/gpu_measure.sh")

    def run(*args, **env):
        return subprocess.run(["bash", script, *args], capture_output=True, text=True, check=False,
                              cwd=tmp_path, env={**os.environ, **env}, timeout=300)

    out = run("only-one")
    assert out.returncode == 2 and "usage:" in out.stderr
    out = run("nowhere.yaml", "60", "a.tar.gz")
    assert out.returncode == 2 and "no suite file nowhere.yaml" in out.stderr
    study = tmp_path / "params" / "studies" / "tiny_study.yaml"
    study.parent.mkdir(parents=True)
    (tmp_path / "params" / "profiles").mkdir()
    out = run(str(study.relative_to(tmp_path)), "1m", "a.tar.gz")
    assert "no suite file" in out.stderr  # not written yet
    study.write_text(yaml.safe_dump({
        "name": "tiny_study", "notebook": "peer", "arms": [{"name": "none", "profile": "tiny"}],
        "workloads": [{"name": "essays", "n": 2, "form": "completion", "max_tokens": 8}],
        "concurrency": [1], "sampling": [{"temperature": 0.0}], "seed": 3,
        "probes": [{"name": "serves", "profile": "tiny", "question": "Does it serve?"}]}))
    rel = str(study.relative_to(tmp_path))
    out = run(rel, "1m", "a.tar.gz")
    assert out.returncode == 2 and "DEADLINE_S must be whole seconds, got '1m'" in out.stderr
    out = run(rel, "60", "a.tar.gz", SPECREPRO_GPU_ENV=str(tmp_path / "none.sh"))
    assert out.returncode == 2 and "stage an engine bundle first, or set SPECREPRO_GPU_ENV" in out.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "params" / "profiles" / "tiny.yaml").write_text(yaml.safe_dump({
        "engine": "embedded", "command": ["{python}", "-m", "specrepro.embedded.serve"],
        "host": "127.0.0.1", "port": port,
        "model": {"id": str(tiny_checkpoint), "revision": None, "served_name": "tiny"},
        "flags": {"max-model-len": 512, "max-num-seqs": 2}, "env": {"OMP_NUM_THREADS": "1"},
        "ready_timeout_s": 120}))
    env_sh = tmp_path / "env.sh"  # what the bundle's env.sh does: its python first on PATH
    env_sh.write_text(f'export PATH="{Path(sys.executable).parent}:$PATH"\n'
                      f'export PYTHONPATH="{REPO / "lib"}"\n')
    out = run(rel, "120", str(tmp_path / "a.tar.gz"), "--probe", "tiny_study",
              SPECREPRO_GPU_ENV=str(env_sh), SPECREPRO_GPU_RESULTS=str(tmp_path / "machine"),
              SPECREPRO_NO_EXPORT="1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "serves (tiny): serves" in out.stdout
    assert load_cells(tmp_path / "machine" / "tiny_study").height == 1
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        assert any(n.startswith("tiny_study/standalone/cells/") for n in tar.getnames())
        manifest = json.load(tar.extractfile("tiny_study/standalone/manifest.json"))
        # the launch's last /metrics beside its log, every family whole
        scraped = gzip.decompress(tar.extractfile(
            "tiny_study/standalone/logs/none--tiny.metrics.txt.gz").read()).decode()
    assert "vllm:time_to_first_token_seconds_sum" in scraped
    (asked,) = [r for s in manifest["sessions"] for r in s.get("probes") or []]
    assert asked["probe"] == "serves" and asked["answer"] == "serves"
    out = run(rel, "60", "a.tar.gz", "--probe")
    assert out.returncode == 2 and "--probe needs a study id" in out.stderr
