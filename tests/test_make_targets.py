"""The Makefile's other targets as a user meets them, each run for real in a copy of the
Makefile over a constructed tree with a stand-in Python (no venv, engine or notebook runs):

- `make serve` streams the server's output while it runs (the server prints its URL and
  model id once it listens: a held output showed nothing until Ctrl-C, issue 41);
- a notebook's stamp depends on its study's stores in this suite's results folder only, so a
  smoke run's results do not make the default `make all` run notebooks again (issue 41)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NB = "01_drafter_block_sweep"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def checkout(tmp_path: Path) -> Path:
    """A copy of the Makefile over the files its rules name, all dated 1970 + 1000 s, with the
    venv, the exports and notebook NB's default-suite stamp dated 2000 s (up to date)."""
    repo = tmp_path / "repo"
    files = {"Makefile": (ROOT / "Makefile").read_text(),
             "pyproject.toml": "", "findings/findings.yaml": f"- {NB}: the sweep\n",
             "lib/specrepro/tools/export/drafters.py": "", "lib/specrepro/tools/export/nvfp4.py": "",
             f"findings/{NB}/notebook.ipynb": "{}", f"findings/{NB}/study.yaml": "",
             f"findings/{NB}/claims.yaml": "",
             "params/default.yaml": "results_dir: ../results/default  # the committed store\n",
             "params/smoke.yaml": "results_dir: ../results/smoke\n"}
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
        os.utime(repo / rel, (1000, 1000))
    for rel in (".venv/.installed", "build/engine-drafters/.exported",
                "build/.nvfp4-target.exported", f".stamps/default/{NB}.done"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("")
        os.utime(repo / rel, (2000, 2000))
    return repo


def stored(repo: Path, suite: str) -> None:
    """A session file of NB's study in `suite`'s store, newer than every stamp."""
    f = repo / "results" / suite / NB / "run-1" / "cells" / "session-1.parquet"
    f.parent.mkdir(parents=True)
    f.write_bytes(b"PAR1")
    os.utime(f, (3000, 3000))


def stamp_up_to_date(repo: Path) -> bool:
    """`make -q` on NB's default-suite stamp: whether `make all` would leave NB alone."""
    done = subprocess.run(["make", "-q", f".stamps/default/{NB}.done"], cwd=repo,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode == 0


def test_a_smoke_run_does_not_make_the_default_suite_run_again(tmp_path):
    repo = checkout(tmp_path)
    assert stamp_up_to_date(repo)
    stored(repo, "smoke")  # `make nb NB=... PARAMS=params/smoke.yaml`, as the README shows
    assert stamp_up_to_date(repo)
    stored(repo, "default")  # the default suite's own store changed: the notebook runs again
    assert not stamp_up_to_date(repo)


def test_make_serve_streams_the_server_output(tmp_path):
    """The stand-in server prints its ready line, then serves for 3 s: the line must reach
    the terminal while it serves, not when it exits."""
    repo = checkout(tmp_path)
    fake = tmp_path / "fakepy"
    fake.write_text("#!/bin/sh\necho \"Ready: OpenAI base URL http://127.0.0.1:8000/v1\"\n"
                    "sleep 3\n")
    fake.chmod(0o755)
    start = time.monotonic()
    proc = subprocess.Popen(["make", "serve", f"PY={fake}"], cwd=repo, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        while not any("Ready:" in line for line in lines):
            line = proc.stdout.readline()
            assert line, f"make serve ended without the ready line: {lines}"
            lines.append(line)
        seen_after = time.monotonic() - start
    finally:
        proc.wait(timeout=30)
    assert seen_after < 2.0, f"the ready line came after {seen_after:.1f} s, at the exit"


def test_a_notebook_s_log_is_printed_and_its_failure_fails_the_stamp(tmp_path):
    """The notebook rule keeps its log whole (two notebooks render side by side) and passes
    the runner's exit status on: a failing notebook leaves no stamp."""
    repo = checkout(tmp_path)
    stored(repo, "default")
    fake = tmp_path / "fakepy"
    for rc, stamped in ((3, False), (0, True)):
        fake.write_text(f"#!/bin/sh\necho \"runner: $*\"\necho 'a warning' >&2\nexit {rc}\n")
        fake.chmod(0o755)
        done = subprocess.run(["make", f".stamps/default/{NB}.done", f"PY={fake}"], cwd=repo,
                              capture_output=True, text=True, timeout=60, check=False)
        assert (done.returncode == 0) is stamped, done.stderr
        assert "runner: -m specrepro.analysis.render.notebooks run --params params/default.yaml " \
               "--mode auto" in done.stdout and "a warning" in done.stdout, done.stdout
        stamp = repo / ".stamps" / "default" / f"{NB}.done"
        assert (stamp.stat().st_mtime > 2000) is stamped
