"""`make test` is what CI runs: the Makefile's test target sets the variables CI needs (the
seeds folder where it exists, offline mode, CI=1), and .ci/run calls exactly the README's test
command with none of its own.

The target is run for real in a copy of the Makefile with a stand-in Python that prints its
environment, from a scrubbed environment, once with ../shared/seeds beside the copy and once
without."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VARS = ("SPECREPRO_SEEDS_DIR", "SPECREPRO_DATA_DIR", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
        "TOKENIZERS_PARALLELISM", "CI")

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def run_test_target(tmp_path: Path, seeds: bool, extra_env: dict | None = None,
                    args: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment `make test` gives pytest, in a checkout copy under tmp_path/repo."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (tmp_path / "shared" / "data").mkdir(parents=True)
    if seeds:
        (tmp_path / "shared" / "seeds").mkdir()
    shutil.copy(ROOT / "Makefile", repo / "Makefile")
    (repo / "pyproject.toml").write_text("")
    (repo / ".venv").mkdir()
    os.utime(repo / "pyproject.toml", (1, 1))
    (repo / ".venv" / ".installed").write_text("")  # the venv is there: nothing to build
    out = tmp_path / "env.txt"
    fake = repo / "fakepy"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {out}.argv\nenv > {out}\n")
    fake.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
    env.update(extra_env or {})
    done = subprocess.run(["make", "-s", "test", f"PY={fake}", *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert (out.parent / "env.txt.argv").read_text().split() == ["-m", "pytest", "-q"]
    got = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    return {k: got[k] for k in VARS if k in got}


def test_make_test_sets_what_ci_needs(tmp_path):
    env = run_test_target(tmp_path, seeds=True)
    assert env == {
        "SPECREPRO_SEEDS_DIR": str(tmp_path / "shared" / "seeds"),
        "SPECREPRO_DATA_DIR": str(tmp_path / "shared" / "data"),
        "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false", "CI": "1"}


def test_no_seeds_folder_leaves_the_variable_unset(tmp_path):
    env = run_test_target(tmp_path, seeds=False)
    assert "SPECREPRO_SEEDS_DIR" not in env
    assert env["HF_HUB_OFFLINE"] == "1" and env["CI"] == "1"


def test_the_environment_and_command_line_win(tmp_path):
    env = run_test_target(tmp_path, seeds=True,
                          extra_env={"CI": "true", "SPECREPRO_SEEDS_DIR": "/elsewhere"},
                          args=("HF_HUB_OFFLINE=0",))
    assert env["CI"] == "true" and env["SPECREPRO_SEEDS_DIR"] == "/elsewhere"
    assert env["HF_HUB_OFFLINE"] == "0" and env["HF_DATASETS_OFFLINE"] == "1"


def readme_test_command() -> str:
    """The README's test command: the `make test` line of its first shell block."""
    block = re.search(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL).group(1)
    lines = [line.split("#")[0].strip() for line in block.splitlines()]
    tests = [line for line in lines if "test" in line]
    assert len(tests) == 1, tests
    return tests[0]


def test_ci_runs_exactly_the_readme_command_and_sets_nothing():
    script = (ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in script.splitlines()
                if line.strip() and not line.strip().startswith("#")]
    assert commands[-1] == readme_test_command() == "make test"
    # nothing of its own: the Makefile's target gives every variable (a user gets the same)
    assignments = [c for c in commands if re.match(r"(export\s+)?[A-Z_]+=", c)]
    assert assignments == []
    for var in VARS:
        assert not any(var in c for c in commands), var
