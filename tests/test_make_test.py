"""`make test` is what CI runs: the Makefile's test target sets the variables CI needs (the
seeds folder where it exists, offline mode, CI=1) and gets headless Chromium (its `browser`
prerequisite), and .ci/run calls exactly the README's test command with none of its own.

The target is run for real in a copy of the Makefile with a stand-in Python that prints its
environment, from a scrubbed environment, once with ../shared/seeds beside the copy and once
without. `browser` runs with a PATH of stand-ins (chromium, id, apt-get), so that the test
sees what it would install and never installs anything."""

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
                    args: tuple[str, ...] = (), cores: int = 1) -> dict[str, str]:
    """The environment `make test` gives pytest, in a checkout copy under tmp_path/repo, on a
    machine whose `nproc` says `cores` (the pytest arguments: `argv_of`)."""
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
    tools = stand_ins(tmp_path / "bin", chromium=True)  # `browser` finds it: nothing to get
    (tools / "nproc").unlink()
    (tools / "nproc").write_text(f"#!/bin/sh\necho {cores}\n")
    (tools / "nproc").chmod(0o755)
    env = {"PATH": f"{tools}:{os.environ['PATH']}", "HOME": os.environ.get("HOME", "/root")}
    env.update(extra_env or {})
    done = subprocess.run(["make", "-s", "test", f"PY={fake}", *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    got = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    return {k: got[k] for k in VARS if k in got}


def test_make_test_sets_what_ci_needs(tmp_path):
    env = run_test_target(tmp_path, seeds=True)
    assert env == {
        "SPECREPRO_SEEDS_DIR": str(tmp_path / "shared" / "seeds"),
        "SPECREPRO_DATA_DIR": str(tmp_path / "shared" / "data"),
        "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false", "CI": "1"}


def argv_of(tmp_path: Path) -> list[str]:
    """The arguments the last `run_test_target` under tmp_path gave pytest."""
    return (tmp_path / "env.txt.argv").read_text().split()


@pytest.mark.parametrize("cores, args, workers", [
    (1, (), None), (2, (), 2), (3, (), 3), (16, (), 4),
    (16, ("TEST_WORKERS=0",), None), (1, ("TEST_WORKERS=3",), 3)])
def test_the_tests_run_in_a_worker_per_core_up_to_four(tmp_path, cores, args, workers):
    """pytest-xdist's workers on two or more cores (a file per worker at a time: module
    fixtures are built once; in the order conftest collects), none on one core or where
    TEST_WORKERS=0 says so."""
    run_test_target(tmp_path, seeds=False, args=args, cores=cores)
    parallel = [] if workers is None else ["-n", str(workers), "--dist", "loadfile",
                                           "--no-loadscope-reorder"]
    assert argv_of(tmp_path) == ["-m", "pytest", "-q", *parallel]


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


def stand_ins(folder: Path, *, chromium: bool, uid: int = 0, apt: bool = True) -> Path:
    """A folder of stand-in commands: `chromium` (where asked), `id` printing `uid`, and
    `apt-get` recording its arguments in apt-get.log beside them (where asked); beside them
    the real tools the Makefile reads itself with."""
    folder.mkdir(exist_ok=True)
    for tool in ("sed", "find", "nproc"):
        if not (folder / tool).exists():
            (folder / tool).symlink_to(shutil.which(tool))
    scripts = {"id": f"#!/bin/sh\necho {uid}\n"}
    if chromium:
        scripts["chromium"] = "#!/bin/sh\nexit 0\n"
    if apt:
        scripts["apt-get"] = f"#!/bin/sh\necho \"$@\" >> {folder / 'apt-get.log'}\n"
    for name, text in scripts.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def run_browser(tmp_path: Path, ci: str, **stand_in) -> tuple[subprocess.CompletedProcess, str]:
    """`make browser` in a copy of the Makefile, with only the stand-ins and bash's folder on
    PATH (no real chromium, id or apt-get): the result, and what apt-get was asked."""
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    shutil.copy(ROOT / "Makefile", repo / "Makefile")
    (repo / "lib" / "specrepro").mkdir(parents=True, exist_ok=True)
    (repo / "findings").mkdir(parents=True, exist_ok=True)
    (repo / "findings" / "findings.yaml").write_text("")  # the Makefile reads it
    tools = stand_ins(tmp_path / "bin", **stand_in)
    env = {"PATH": str(tools), "HOME": "/nonexistent", "CI": ci}
    done = subprocess.run([shutil.which("make"), "-s", "browser"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    log = tools / "apt-get.log"
    return done, log.read_text() if log.exists() else ""


def test_browser_present_is_left_alone(tmp_path):
    done, apt = run_browser(tmp_path, "1", chromium=True)
    assert (done.returncode, done.stdout, done.stderr, apt) == (0, "", "", "")


def test_browser_missing_under_ci_is_installed_as_root(tmp_path):
    """A fresh machine here (and CI's) is root with apt-get: `make test` installs chromium
    itself, as .ci/run used to, so the README's second command passes there."""
    done, apt = run_browser(tmp_path, "1", chromium=False)
    assert done.returncode == 0, done.stderr
    assert "installing chromium" in done.stdout
    assert apt.splitlines() == ["update -qq", "install -y -qq chromium"]


def test_browser_missing_without_root_says_what_to_do_in_one_line(tmp_path):
    done, apt = run_browser(tmp_path, "1", chromium=False, uid=1000)
    assert done.returncode == 2 and apt == ""
    lines = [line for line in done.stderr.splitlines() if not line.startswith("make:")]
    assert len(lines) == 1, done.stderr
    assert "apt-get install chromium" in lines[0] and "make test CI=" in lines[0]


def test_browser_missing_without_ci_is_a_note(tmp_path):
    done, apt = run_browser(tmp_path, "", chromium=False)
    assert done.returncode == 0 and apt == ""
    assert "tests will skip" in done.stdout


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
