"""Bad inputs to `specrepro run`, `check` and `compact`, each tried in a sandbox of its own:
what each prints first, its exit status, whether anything was written outside its results
folder, and whether anything measured was lost (issue 41, part B: the store's integrity,
paths, sentences instead of tracebacks, what `check` knows, compact's reach).

    .venv/bin/python scripts/bad_inputs_store.py [--out docs/bench/bad-inputs-store-DATE.md]
        [--sandbox DIR] [--only SUBSTRING]

How each case is judged:
- written outside: every file under the sandbox but the case's results folder (its params,
  its data, the other cases' folders, the sandbox root where `../` would lead), and the
  checkout's `git status`, are listed before and after; any new or changed path is named.
- lost: where the case starts from a measured store (a smoke run of notebook 07 on the
  embedded engine, made once and copied), every cells and requests key readable before
  must be readable after, and every file that was damaged before must still be somewhere
  in the store, byte for byte (quarantine/); a manifest's sessions must all still be named.
Needs the embedded checkpoint (models/embedded) and the data folder (SPECREPRO_DATA_DIR);
runs on the CPU in about five minutes, most of it the four runs that measure again.
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import yaml

from specrepro.store import CELL_SCHEMA, REQUEST_SCHEMA

REPO = Path(__file__).resolve().parents[1]
STUDY, RUN = "07_the_bill", "smoke"
SMOKE = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())


@dataclass
class Case:
    item: str  # the item it belongs to
    what: str  # the bad input, in words
    command: list[str]  # after `specrepro`; {suite}, {results}, {store}, {case} filled in
    suite: dict = field(default_factory=dict)  # suite-level keys changed
    overrides: dict = field(default_factory=dict)  # the notebook's overrides changed
    store: bool = False  # starts from a copy of the measured store
    prepare: object = None  # fn(case_dir, store_root) run before the command
    env: dict = field(default_factory=dict)
    background: bool = False  # a measuring run going on while the command runs


def hurt_requests(store: Path, how: str) -> None:
    (f,) = sorted((store / "requests").glob("session-*.parquet"))
    if how == "truncate":
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    elif how == "empty":
        f.write_bytes(b"")
    else:
        f.unlink()


def hurt_cells(store: Path, how: str) -> None:
    (f,) = sorted((store / "cells").glob("session-*.parquet"))
    if how == "truncate":
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    else:  # wrong schema: a column gone, another of another type
        df = pl.read_parquet(f)
        df.drop("status").with_columns(pl.col("attempt").cast(pl.String)).write_parquet(f)


def hurt_manifest(store: Path, how: str) -> None:
    m = store / "manifest.json"
    data = {"truncate": lambda: m.read_bytes()[:3000], "empty": lambda: b"",
            "list": lambda: b"[]\n", "binary": lambda: b"\xff\xfe\x00{"}.get(how)
    if data is None:
        m.unlink()
    else:
        m.write_bytes(data())


def gsm8k(rows: str):
    def prepare(case: Path, store: Path) -> None:
        d = case / "data" / "gsm8k"
        d.mkdir(parents=True)
        (d / "test.jsonl").write_text(rows)
    return prepare


GOOD_ROW = json.dumps({"question": "Tom has 3 apples and buys 4 more. How many?",
                       "answer": "3 + 4 = 7\n#### 7"}) + "\n"
ESSAYS = {"name": "essays", "n": 2, "form": "completion", "max_tokens": 32}
GSM = [{"name": "gsm8k", "n": 2, "form": "completion", "max_tokens": 32}]
# 07's arms, each on a port of its own off the profiles' 8100 (other runs on this machine)
ARMS = [{"name": "none", "profile": "embedded-none", "overrides": {"port": 18731}},
        {"name": "mtp-control", "profile": "embedded-mtp-memory-matched",
         "overrides": {"port": 18732}},
        {"name": "dflash-k7", "profile": "embedded-dflash", "overrides": {"port": 18733}}]


def arm(i: int, **overrides) -> dict:
    """07's arms with arm i's profile overridden."""
    arms = [dict(a) for a in ARMS]
    arms[i]["overrides"] = {**arms[i]["overrides"], **overrides}
    return {"arms": arms}


def arm0(**overrides) -> dict:
    return arm(0, **overrides)


def no_config(case: Path, store: Path) -> None:
    (case / "model").mkdir()
    shutil.copy(REPO / "models" / "embedded" / "model.safetensors", case / "model")


MEASURED: list[Path] = []  # the measured store, once made (measured_store)


def deep_store(case: Path, store: Path) -> None:
    """A measured store three levels below the folder compact is pointed at."""
    shutil.copytree(MEASURED[0].parents[1], case / "elsewhere" / "someone" / "results")


def two_stores(case: Path, store: Path) -> None:
    """The measured store, and before it (in compact's order) a second one, the same rows
    filed under study 06, whose manifest is truncated."""
    other = case / "results" / "06_draft_schedule_under_load" / RUN
    shutil.copytree(store, other)
    for f in (other / "cells").glob("*.parquet"):
        pl.read_parquet(f).with_columns(pl.lit(other.parent.name).alias("study")).write_parquet(f)
    hurt_manifest(other, "truncate")


def read_only(case: Path, store: Path) -> None:
    ro = case / "ro"
    ro.mkdir()
    if os.geteuid() == 0:  # root writes through a mode: make the folder immutable
        subprocess.run(["chattr", "+i", str(ro)], check=True)
    else:
        ro.chmod(0o555)


CASES: list[Case] = [
    # -- item 3: every table of the store
    Case("3", "requests file truncated, then `run`", ["run", "{suite}"], store=True,
         prepare=lambda c, s: hurt_requests(s, "truncate")),
    Case("3", "requests file deleted, then `run`", ["run", "{suite}"], store=True,
         prepare=lambda c, s: hurt_requests(s, "delete")),
    Case("3", "requests file emptied, then `compact`", ["compact", "{results}"], store=True,
         prepare=lambda c, s: hurt_requests(s, "empty")),
    Case("3", "requests file deleted, then `compact`", ["compact", "{results}"], store=True,
         prepare=lambda c, s: hurt_requests(s, "delete")),
    Case("3", "cells file truncated, then `run`", ["run", "{suite}"], store=True,
         prepare=lambda c, s: hurt_cells(s, "truncate")),
    Case("3", "cells file of the wrong schema, then `compact`", ["compact", "{results}"],
         store=True, prepare=lambda c, s: hurt_cells(s, "schema")),
    # -- item 5 (manifest): damaged, missing
    Case("5", "manifest.json truncated, then `run`", ["run", "{suite}"], store=True,
         prepare=lambda c, s: hurt_manifest(s, "truncate")),
    Case("5", "manifest.json truncated, then `compact`", ["compact", "{results}"], store=True,
         prepare=lambda c, s: hurt_manifest(s, "truncate")),
    Case("5", "manifest.json deleted, then `run` (every cell stored)", ["run", "{suite}"],
         store=True, prepare=lambda c, s: hurt_manifest(s, "delete")),
    Case("5", "manifest.json deleted, then `compact`", ["compact", "{results}"], store=True,
         prepare=lambda c, s: hurt_manifest(s, "delete")),
    Case("5", "manifest.json is `[]`, then `run`", ["run", "{suite}"], store=True,
         prepare=lambda c, s: hurt_manifest(s, "list")),
    Case("5", "manifest.json empty, then `compact`", ["compact", "{results}"], store=True,
         prepare=lambda c, s: hurt_manifest(s, "empty")),
    Case("5", "manifest.json not UTF-8, then `run`", ["run", "{suite}"], store=True,
         prepare=lambda c, s: hurt_manifest(s, "binary")),
    # -- item 4: paths from a params file or the command line
    Case("4", "`run_id: ../../../escape-runid`", ["run", "{suite}"],
         suite={"run_id": "../../../escape-runid"}),
    Case("4", "`--run-id ../../x`", ["run", "{suite}", "--run-id", "../../x"]),
    Case("4", "`--run-id /tmp/abs`", ["run", "{suite}", "--run-id", "/tmp/abs"]),
    Case("4", "`--run-id ''`", ["run", "{suite}", "--run-id", ""]),
    Case("4", "`run_id: a/b`", ["run", "{suite}"], suite={"run_id": "a/b"}),
    Case("4", "`run_id: ..`", ["run", "{suite}"], suite={"run_id": ".."}),
    Case("4", "study `name: ../../escape-study` (suite overrides)", ["run", "{suite}"],
         overrides={"name": "../../escape-study"}),
    Case("4", "suite `name: ../escape-suite`", ["run", "{suite}"],
         suite={"name": "../escape-suite"}),
    Case("4", "arm `name: ../../../escape-arm` (its log's name)", ["run", "{suite}"],
         overrides={"arms": [{**ARMS[0], "name": "../../../escape-arm"}, *ARMS[1:]],
                    "baseline": "mtp-control"}),
    Case("4", "profile `name: ../evil` (an arm's overrides)", ["run", "{suite}"],
         overrides=arm0(name="../evil")),
    # -- item 5: sentences
    Case("5", "a read-only results folder", ["run", "{suite}", "--results-dir",
                                             "{case}/ro/results"], prepare=read_only),
    Case("5", "`--results-dir /dev/null`", ["run", "{suite}", "--results-dir", "/dev/null"]),
    Case("5", "`--results-dir` a regular file", ["run", "{suite}", "--results-dir",
                                                 "{case}/params/suite.yaml"]),
    Case("5", "GSM8K line not JSON", ["run", "{suite}"], overrides={"workloads": GSM},
         prepare=gsm8k(GOOD_ROW * 2 + '{"question": "broken\n'),
         env={"SPECREPRO_DATA_DIR": "{case}/data"}),
    Case("5", "GSM8K row without `answer`", ["run", "{suite}"], overrides={"workloads": GSM},
         prepare=gsm8k(json.dumps({"question": "q", "solution": "#### 4"}) + "\n"),
         env={"SPECREPRO_DATA_DIR": "{case}/data"}),
    Case("5", "GSM8K answer without `#### n`", ["run", "{suite}"], overrides={"workloads": GSM},
         prepare=gsm8k(json.dumps({"question": "q", "answer": "4"}) + "\n"),
         env={"SPECREPRO_DATA_DIR": "{case}/data"}),
    Case("5", "GSM8K file empty", ["run", "{suite}"], overrides={"workloads": GSM},
         prepare=gsm8k(""), env={"SPECREPRO_DATA_DIR": "{case}/data"}),
    Case("5", "GSM8K file missing from the data folder", ["run", "{suite}"],
         overrides={"workloads": GSM}, prepare=lambda c, s: (c / "data").mkdir(),
         env={"SPECREPRO_DATA_DIR": "{case}/data"}),
    Case("5", "`n: 1000000` (essays)", ["run", "{suite}"],
         overrides={"workloads": [{**ESSAYS, "n": 1000000}]}),
    Case("5", "`n: 3` of a 2-row GSM8K file", ["run", "{suite}"],
         overrides={"workloads": [{**GSM[0], "n": 3}]}, prepare=gsm8k(GOOD_ROW * 2),
         env={"SPECREPRO_DATA_DIR": "{case}/data"}),
    # -- item 6: what `check` (and `run`) can know before an engine starts
    Case("6", "`max_tokens: 1000000000000` (check)", ["check", "{suite}"],
         overrides={"workloads": [{**ESSAYS, "max_tokens": 10**12}]}),
    Case("6", "`max_tokens: 1000000000000` (run)", ["run", "{suite}"],
         overrides={"workloads": [{**ESSAYS, "max_tokens": 10**12}]}),
    Case("6", "`max_tokens: 1e12` as written (a string to YAML)", ["check", "{suite}"],
         overrides={"workloads": [{**ESSAYS, "max_tokens": "1e12"}]}),
    Case("6", "`max_tokens: 2048` with `max-model-len: 2048`", ["check", "{suite}"],
         overrides={"workloads": [{**ESSAYS, "max_tokens": 2048}]}),
    Case("6", "prefill of 5,000 tokens past a 2,048 context", ["check", "{suite}"],
         overrides={"workloads": [{"name": "prefill", "n": 1, "form": "completion",
                                   "max_tokens": 8, "prefill_tokens": [5000]}],
                    "concurrency": [1]}),
    Case("6", "`num_speculative_tokens: 1000` (check)", ["check", "{suite}"],
         overrides=arm(2, speculative={"num_speculative_tokens": 1000})),
    Case("6", "`num_speculative_tokens: 1000` (run)", ["run", "{suite}"],
         overrides=arm(2, speculative={"num_speculative_tokens": 1000})),
    Case("6", "`max-num-seqs: 0` (check)", ["check", "{suite}"],
         overrides=arm0(flags={"max-num-seqs": 0})),
    Case("6", "`max-num-seqs: 0` (run)", ["run", "{suite}"],
         overrides=arm0(flags={"max-num-seqs": 0})),
    Case("6", "`max-num-seqs: eight`", ["check", "{suite}"],
         overrides=arm0(flags={"max-num-seqs": "eight"})),
    Case("6", "`max-model-len: -1`", ["check", "{suite}"],
         overrides=arm0(flags={"max-model-len": -1})),
    Case("6", "a model folder without config.json (check)", ["check", "{suite}"],
         overrides=arm0(model={"id": "{case}/model"}), prepare=no_config),
    Case("6", "a model folder without config.json (run)", ["run", "{suite}"],
         overrides=arm0(model={"id": "{case}/model"}), prepare=no_config),
    Case("6", "a model folder that does not exist (run)", ["run", "{suite}"],
         overrides=arm0(model={"id": "{case}/nowhere"})),
    Case("6", "`n: 1000` of HumanEval's 164 (check)", ["check", "{suite}"],
         overrides={"workloads": [{"name": "humaneval", "n": 1000, "form": "completion",
                                   "max_tokens": 32, "stop": []}]}),
    Case("6", "`concurrency: [100000]` with 2 prompts (check)", ["check", "{suite}"],
         overrides={"concurrency": [100000]}),
    Case("6", "`concurrency: [100000]` with 2 prompts (run)", ["run", "{suite}"],
         overrides={"concurrency": [100000]}),
    # -- item 8: compact's reach
    Case("8", "`compact` of a folder whose stores lie three levels down (as /tmp)",
         ["compact", "{case}/elsewhere"], prepare=deep_store),
    Case("8", "`compact` while a run writes the store", ["compact", "{results}"],
         background=True),
    Case("8", "`compact` of two stores, the first (06) with a truncated manifest",
         ["compact", "{results}"], store=True, prepare=two_stores),
    Case("8", "`compact` of a file", ["compact", "{case}/params/suite.yaml"]),
    Case("8", "`compact` of a folder that does not exist", ["compact", "{case}/nowhere"]),
    Case("8", "`compact` of an empty folder", ["compact", "{case}/params/profiles-none"],
         prepare=lambda c, s: (c / "params" / "profiles-none").mkdir()),
    # -- others
    Case("-", "`--notebook` not in the suite", ["run", "{suite}", "--notebook", "99_nothing"]),
    Case("-", "params file missing", ["run", "{case}/params/none.yaml"]),
    Case("-", "params file not YAML", ["check", "{case}/params/bad.yaml"],
         prepare=lambda c, s: (c / "params" / "bad.yaml").write_text("a: [1, 2\n")),
    Case("-", "`--deadline-s -5`", ["run", "{suite}", "--deadline-s", "-5"]),
    Case("-", "`--archive` in a folder that does not exist",
         ["run", "{suite}", "--archive", "{case}/nowhere/a.tar.gz"]),
    Case("-", "`--arm` not in the study", ["run", "{suite}", "--arm", "nobody"]),
]


# ------------------------------------------------------------------ the sandbox


def write_suite(case: Path, c: Case) -> Path:
    # the smoke suite's binding of the study (its own study file, the suite's defaults)
    nb = json.loads(json.dumps(SMOKE.get("notebooks", {}).get(STUDY, {}))
                    .replace("{case}", str(case)))
    nb["overrides"] = {**nb.get("overrides", {}), "arms": ARMS,
                       **json.loads(json.dumps(c.overrides).replace("{case}", str(case)))}
    suite = {k: v for k, v in SMOKE.items() if k != "notebooks"}
    suite.update(profiles=str(REPO / "params" / "profiles"), results_dir="../results",
                 binds="listed", notebooks={STUDY: nb}, **c.suite)
    path = case / "params" / "suite.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(suite, sort_keys=False).replace("'1e12'", "1e12")
    path.write_text(text)
    return path


LIB = [REPO / "lib"]  # the code under test (--lib: another checkout's, to compare)


def specrepro(args: list[str], env: dict | None = None, **kw) -> subprocess.Popen:
    full = {**os.environ, "PYTHONPATH": str(LIB[0]), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "specrepro.cli", *args], cwd=REPO,
                            env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **kw)


def files(root: Path, skip: Path | None) -> dict[str, tuple[int, int]]:
    """path -> (size, mtime_ns) of every file under root but `skip`."""
    out = {}
    for p in root.rglob("*"):
        if skip is not None and (p == skip or skip in p.parents):
            continue
        if p.is_file() or p.is_symlink():
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def git_status() -> set[str]:
    return set(subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                              cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.splitlines())


def readable_keys(store: Path) -> tuple[set, set, dict[str, str], set]:
    """(cells keys, requests keys, sha256 of each damaged table file, manifest session ids)
    of a store: what a command must not lose."""
    cells, reqs, damaged, sessions = set(), set(), {}, set()
    for f in sorted(store.rglob("*.parquet")) if store.is_dir() else []:
        table = f.parent.name
        if table not in ("cells", "requests"):
            continue
        schema = CELL_SCHEMA if table == "cells" else REQUEST_SCHEMA
        keys = ["cell_id", "attempt"] + (["request_idx"] if table == "requests" else [])
        try:
            df = pl.read_parquet(f)
            # damaged as the store sees it: a key column (or a cell's status) gone or retyped
            needed = [*keys, "status"] if table == "cells" else keys
            if any(df.schema.get(k) != schema[k] for k in needed):
                raise ValueError("wrong schema")
            (cells if table == "cells" else reqs).update(df.select(keys).rows())
        except Exception:  # noqa: BLE001 - damaged: its bytes must be kept
            damaged[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    m = store / "manifest.json"
    try:
        sessions = {s["session_id"] for s in json.loads(m.read_text())["sessions"]}
    except Exception:  # noqa: BLE001 - damaged or missing: its bytes must be kept
        if m.is_file():
            damaged[str(m)] = hashlib.sha256(m.read_bytes()).hexdigest()
    return cells, reqs, damaged, sessions


def lost(before, store: Path) -> str:
    cells, reqs, damaged, sessions = before
    a_cells, a_reqs, _, a_sessions = readable_keys(store)
    kept = {hashlib.sha256(f.read_bytes()).hexdigest() for f in store.rglob("*") if f.is_file()}
    gone = []
    if cells - a_cells:
        gone.append(f"{len(cells - a_cells)} cells rows")
    if reqs - a_reqs:
        gone.append(f"{len(reqs - a_reqs)} requests rows")
    missing = [Path(f).name for f, h in damaged.items() if h not in kept]
    if missing:
        gone.append(f"damaged file(s) {', '.join(missing)}")
    if sessions - a_sessions:
        gone.append(f"{len(sessions - a_sessions)} sessions of the manifest")
    return "; ".join(gone) or "none"


def first_line(text: str) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return _cut(line)


def problem_line(text: str) -> str:
    """The first line that names the problem, where the first line does not: past
    argparse's usage lines and compact's list of the stores it acts on."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith(("usage:", "[-", "[--", "params")) or ln.startswith(
                "specrepro compact: ") and " store" in ln.split(":")[1]:
            continue
        return "" if ln == (lines[0] if lines else "") else _cut(ln)
    return ""


def _cut(line: str) -> str:
    return line if len(line) <= 700 else line[:699] + "…"


def run_case(n: int, c: Case, sandbox: Path, measured: Path) -> dict:
    case = sandbox / f"case-{n:02d}"
    case.mkdir()
    suite = write_suite(case, c)
    results = case / "results"
    store = results / STUDY / RUN
    if c.store:
        shutil.copytree(measured, store)
    if c.prepare is not None:
        c.prepare(case, store)
    fill = {"{suite}": str(suite), "{results}": str(results), "{case}": str(case)}
    args = [fill.get(a, a) for a in c.command]
    args = [a.replace("{case}", str(case)) for a in args]
    env = {k: v.replace("{case}", str(case)) for k, v in c.env.items()}
    if args[0] == "run":
        args.append("--no-progress")
    before_keys = readable_keys(store)
    before_files, before_git = files(sandbox, results), git_status()
    live = None
    if c.background:  # a run measuring into the store while compact is pointed at it
        live = specrepro(["run", str(suite), "--no-progress"])
        deadline = time.monotonic() + 120
        while not list((store / "logs").glob("*.log")) and time.monotonic() < deadline:
            time.sleep(0.2)
    started = time.monotonic()
    proc = specrepro(args, env)
    out, _ = proc.communicate(timeout=900)
    took = time.monotonic() - started
    logs_plain = sorted(p.name for p in (store / "logs").glob("*.log")) if live else []
    if live is not None:
        live.communicate(timeout=900)
    after_files = files(sandbox, results)
    outside = sorted({*after_files} - {*before_files}
                     | {p for p in before_files if after_files.get(p) != before_files[p]})
    outside += sorted(git_status() - before_git)
    if c.background:
        note = f"; the run's logs still plain while it ran: {', '.join(logs_plain) or 'none'}"
    else:
        note = ""
    return {"n": n, "item": c.item, "what": c.what, "command": "specrepro " + " ".join(
        a.replace(str(case), "CASE") for a in args), "first": first_line(out).replace(
        str(case), "CASE"), "problem": problem_line(out).replace(str(case), "CASE"),
        "rc": proc.returncode, "s": took,
        "outside": ", ".join(o.replace(str(case), "CASE") for o in outside) or "nothing",
        "lost": (lost(before_keys, store) if c.store else "no store before") + note,
        "output": out.replace(str(case), "CASE")}


def measured_store(sandbox: Path) -> Path:
    """A smoke run of notebook 07 (six cells), made once."""
    base = sandbox / "measured"
    suite = write_suite(base, Case("", "", []))
    proc = specrepro(["run", str(suite), "--no-progress"])
    out, _ = proc.communicate(timeout=900)
    if proc.returncode:
        raise SystemExit(f"the measured store could not be made:\n{out}")
    return base / "results" / STUDY / RUN


def table(rows: list[dict], measured_s: float) -> str:
    intro = (f"Made by `scripts/bad_inputs_store.py` on {dt.date.today().isoformat()}, "
             f"{os.cpu_count()} CPUs, the embedded engine on the CPU; each case in a sandbox "
             "of its own (`CASE`). *First line*: the first line the command prints (stdout "
             "and stderr together, cut at 700 characters); where that is argparse's usage "
             "or compact's list of the stores it acts on, the next column has the line that "
             "names the problem. *Outside*: any file written or "
             "changed outside the case's results folder (its params, data, the sandbox root "
             "where `../` leads, the checkout's `git status`). *Lost*: cells or requests "
             "rows readable before and not after, a damaged file whose bytes are gone, a "
             "manifest session no longer named. The measured store is a smoke run of "
             f"notebook 07 (6 cells, {measured_s:.0f} s), copied for each case that starts "
             "from it.")
    codes = {c: sum(r["rc"] == c for r in rows) for c in sorted({r["rc"] for r in rows})}
    outside = [r["n"] for r in rows if r["outside"] != "nothing"]
    lost_rows = [r["n"] for r in rows if not r["lost"].startswith(("none", "no store"))]
    repaired = [r["n"] for r in rows if r["rc"] == 0]
    summary = (f"{len(rows)} cases; exit status " + ", ".join(
        f"{c}: {k}" for c, k in codes.items()) + (
        f" (0: cases {', '.join(map(str, repaired))}, a damaged store repaired as the README "
        "promises: its cells measured again, or its manifest rebuilt with every cell stored)"
        if repaired else "") + "; written outside the results folder: "
        + (f"cases {', '.join(map(str, outside))}" if outside else "nothing, in every case")
        + "; measured rows or damaged bytes lost: "
        + (f"cases {', '.join(map(str, lost_rows))}" if lost_rows else "none, in every case")
        + ".")
    head = ["# Bad inputs to `specrepro run`, `check` and `compact` (issue 41, part B)", "",
            intro, "", summary, "",
            ("| # | item | bad input | command | first line printed | the line naming the "
             "problem, where another | rc | s | outside | lost |"),
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    body = [f"| {r['n']} | {r['item']} | {_cell(r['what'])} | `{_cell(r['command'])}` | "
            f"{_cell(r['first'])} | {_cell(r['problem'])} | {r['rc']} | {r['s']:.1f} | "
            f"{_cell(r['outside'])} | {_cell(r['lost'])} |" for r in rows]
    return "\n".join(head + body) + "\n"


def _cell(text: object) -> str:
    """Text as one Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path,
                    default=REPO / "docs" / "bench" / f"bad-inputs-store-{dt.date.today()}.md")
    ap.add_argument("--sandbox", type=Path, default=None)
    ap.add_argument("--only", default=None, help="cases whose words hold this")
    ap.add_argument("--lib", type=Path, default=None,
                    help="the lib/ folder whose code runs the cases (default: this checkout's)")
    args = ap.parse_args(argv)
    if args.lib is not None:
        LIB[0] = args.lib.resolve()
    sandbox = args.sandbox or Path(tempfile.mkdtemp(prefix="specrepro-bad-inputs-"))
    sandbox.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    measured = measured_store(sandbox)
    MEASURED.append(measured)
    measured_s = time.monotonic() - started
    rows = []
    try:
        for n, c in enumerate(CASES, 1):
            if args.only and args.only not in c.what:
                continue
            rows.append(run_case(n, c, sandbox, measured))
            r = rows[-1]
            print(f"{n:2d} rc {r['rc']} {r['s']:5.1f}s outside: {r['outside']}; lost: "
                  f"{r['lost']}\n   {r['first']}", flush=True)
    finally:
        ro = [p for p in sandbox.glob("case-*/ro")]
        for p in ro if os.geteuid() == 0 else ():
            subprocess.run(["chattr", "-i", str(p)], check=False)
    args.out.write_text(table(rows, measured_s))
    (sandbox / "cases.json").write_text(json.dumps(rows, indent=1))  # whole outputs
    print(f"{len(rows)} cases -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
