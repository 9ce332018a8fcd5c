"""Bad inputs refused before an engine starts or a file is written (issue 41, items 4, 5
and 6): names that would put a store outside the results folder, a results folder that
cannot be written, a malformed GSM8K file, `n` past a workload's prompts, and what
`specrepro check` can know of an engine's bounds, a model folder and a workload's size.
Constructed params trees; no engine runs (a start would fail the test)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from specrepro.cli import main as specrepro
from specrepro.harness.run_command import main as run
from specrepro.params import ParamsError, load_suite, resolve_study
from specrepro.store import ResultsError, ResultStore

GSM8K = [{"question": "Tom has 3 apples and buys 4 more. How many apples?",
          "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
         {"question": "A box holds 6 pens. How many pens are in 2 boxes?",
          "answer": "6 * 2 = <<6*2=12>>12\n#### 12"}]


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """params/{suite.yaml, studies/s.yaml, profiles/p.yaml} with a local model folder
    (config.json: a 2,048-token context) and GSM8K data; returns a writer of the suite
    with overrides for its notebook, its profile and its top level."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GSM8K))
    monkeypatch.setenv("SPECREPRO_DATA_DIR", str(tmp_path / "data"))
    params = tmp_path / "params"

    def make(overrides=None, profile=None, top=None) -> Path:
        write(params / "profiles" / "p.yaml", {
            "engine": "embedded", "command": ["{python}", "-m", "specrepro.embedded.serve"],
            "model": {"id": str(model)}, "port": 8197,
            "flags": {"max-num-seqs": 4}, **(profile or {})})
        write(params / "studies" / "s.yaml", {
            "name": "07_the_bill", "notebook": "07_the_bill",
            "arms": [{"name": "a", "profile": "p"}],
            "workloads": [{"name": "essays", "n": 2, "form": "completion", "max_tokens": 8}],
            "concurrency": [1, 2]})
        return write(params / "suite.yaml", {
            "name": "t", "run_id": "r", "results_dir": "../results", "binds": "listed",
            "notebooks": {"07_the_bill": {"study": "studies/s.yaml",
                                          "overrides": overrides or {}}}, **(top or {})})
    return make


@pytest.fixture
def no_engine(monkeypatch):
    """A run that gets as far as an engine start fails the test there."""
    from specrepro.harness import engine_pool

    def start(arm, *a, **k):
        raise AssertionError(f"an engine started for arm {arm.name!r}")

    monkeypatch.setattr(engine_pool, "start_engine", start)


def written(tmp_path: Path) -> list[str]:
    """Everything under tmp_path but the inputs: what a refused command must not write."""
    inputs = ("params", "data", "model")
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")
                  if p.parts[len(tmp_path.parts)] not in inputs)


def check(path: Path, capsys) -> tuple[int, str]:
    code = specrepro(["check", str(path)])
    return code, capsys.readouterr().err


# ------------------------------------------------------------------ paths (item 4)


@pytest.mark.parametrize("where, key, value", [
    ("top", "run_id", "../../../escape-runid"),
    ("top", "name", "../escape-suite"),
    ("overrides", "name", "../../escape-study"),
    ("top", "run_id", "a/b"),
    ("top", "run_id", ".."),
])
def test_a_name_that_is_a_path_is_refused_naming_file_key_and_value(
        tree, tmp_path, where, key, value, no_engine, capsys):
    suite = tree(**{where: {key: value}})
    assert run([str(suite)]) == 2
    err = capsys.readouterr().err
    assert f"{suite}: " in err and f"{key}: expected one folder name" in err
    assert repr(value) in err
    assert written(tmp_path) == [] and not (tmp_path.parent / "escape-runid").exists()


def test_an_arm_or_profile_name_that_is_a_path_is_refused(tree, capsys):
    """An arm's and a profile's names make its engine's log name (logs/<arm>--<profile>)."""
    suite = tree({"arms": [{"name": "../../evil", "profile": "p"}]})
    with pytest.raises(ParamsError, match=r"arms\[0\]\.name: expected one folder name"):
        resolve_study(load_suite(suite), "07_the_bill")
    suite = tree(profile={"name": "../evil"})
    with pytest.raises(ParamsError, match=r"p\.yaml: name: expected one folder name"):
        resolve_study(load_suite(suite), "07_the_bill")


def test_a_run_id_on_the_command_line_that_is_a_path_is_refused(tree, tmp_path, no_engine,
                                                                 capsys):
    with pytest.raises(SystemExit) as stop:
        run([str(tree()), "--run-id", "../../x"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "argument --run-id: expected one folder name" in err and "'../../x'" in err
    assert written(tmp_path) == []


def test_the_store_refuses_a_study_or_run_that_is_not_one_folder(tmp_path):
    for study, run_id in (("../x", "r"), ("s", "../../x"), ("s", "a/b"), ("s", "")):
        with pytest.raises(ResultsError, match="expected one folder name"):
            ResultStore(tmp_path, study, run_id)


# ------------------------------------------------------------------ sentences (item 5)


def test_a_results_dir_that_is_a_device_is_refused(tree, no_engine, capsys):
    assert run([str(tree()), "--results-dir", "/dev/null"]) == 2
    assert capsys.readouterr().err.startswith(
        "error: results folder /dev/null: /dev/null is a character device, not a folder")


def test_a_results_folder_this_user_cannot_write_is_refused(tree, tmp_path, monkeypatch,
                                                            no_engine, capsys):
    """Read-only for this user (root writes through a mode, so the check is os.access's)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m: False if Path(p) == ro else real(p, m))
    assert run([str(tree()), "--results-dir", str(ro / "results")]) == 2
    err = capsys.readouterr().err
    assert f"error: results folder {ro / 'results'}: {ro} is not writable by this user" in err
    assert "nothing was run" in err and list(ro.iterdir()) == []


@pytest.mark.parametrize("line, said", [
    ('{"question": "broken', "test.jsonl:3 is not JSON"),
    ('{"question": "q", "solution": "4"}',
     "test.jsonl:3 has no text field 'answer' (its keys: question, solution)"),
    ('{"question": "q", "answer": "4"}', "test.jsonl:3 has an 'answer' without its final"),
])
def test_a_malformed_gsm8k_file_is_refused_before_the_first_cell(
        tree, tmp_path, line, said, no_engine, capsys):
    """Today: found only once cells were measured (DatasetGenerationError; KeyError)."""
    with (tmp_path / "data" / "gsm8k" / "test.jsonl").open("a") as fh:
        fh.write(line + "\n")
    suite = tree({"workloads": [{"name": "gsm8k", "n": 2, "form": "completion",
                                 "max_tokens": 8}]})
    assert run([str(suite)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: GSM8K test: ") and said in err
    assert written(tmp_path) == []


def test_n_past_the_workloads_prompts_is_refused_naming_file_and_key(tree, tmp_path,
                                                                     no_engine, capsys):
    """Today: a WorkloadError traceback once the engine had started."""
    suite = tree({"workloads": [{"name": "essays", "n": 1000000, "form": "completion",
                                 "max_tokens": 8}]})
    assert run([str(suite)]) == 2
    err = capsys.readouterr().err
    assert (f"error: {suite}: notebooks.07_the_bill.overrides.workloads[0].n: expected at "
            "most 40 (the prompts workload essays has), found 1000000") in err
    assert written(tmp_path) == []


# ------------------------------------------------------------------ specrepro check (item 6)


CASES = [
    ({"overrides": {"workloads": [{"name": "essays", "n": 2, "form": "completion",
                                   "max_tokens": 10**12}]}},
     ("notebooks.07_the_bill.overrides.workloads[0].max_tokens: expected at most 2047 "
      "output tokens (the context of arm 'a': 2048 tokens, ")),  # the model's config.json
    ({"profile": {"flags": {"max-num-seqs": 4, "max-model-len": 8}}},
     ("workloads[0].max_tokens: expected at most 7 output tokens (the context of arm 'a': "
      "8 tokens, its profile's max-model-len; a request's prompt takes 1+ of them), found 8")),
    ({"profile": {"speculative": {"method": "dflash", "num_speculative_tokens": 1000}}},
     ("p.yaml: speculative.num_speculative_tokens: expected at most 64 drafts (the "
      "embedded engine's bound), found 1000")),
    ({"profile": {"flags": {"max-num-seqs": 0}}},
     ("p.yaml: flags.max-num-seqs: expected a positive integer for --max-num-seqs (the "
      "embedded engine refuses anything else at start), found 0")),
    ({"overrides": {"arms": [{"name": "a", "profile": "p",
                              "overrides": {"flags": {"max-num-seqs": -3}}}]}},
     ("suite.yaml: notebooks.07_the_bill.overrides.arms[0].overrides.flags.max-num-seqs: "
      "expected a positive integer")),
    ({"overrides": {"workloads": [{"name": "humaneval", "n": 1000, "form": "completion",
                                   "max_tokens": 8}]}},
     ("workloads[0].n: expected at most 164 (the prompts workload humaneval has), "
      "found 1000")),
    ({"overrides": {"workloads": [{"name": "prefill", "n": 2, "form": "completion",
                                   "max_tokens": 8, "prefill_tokens": [5000]}]}},
     ("workloads[0].prefill_tokens: expected prompt lengths below 2048 (the context of arm "
      "'a': 2048 tokens, ")),
    ({"overrides": {"concurrency": [100000]}},
     ("notebooks.07_the_bill.overrides.concurrency[0]: expected at most 2 streams for "
      "workload essays (2 prompts")),
]


@pytest.mark.parametrize("case, said", CASES, ids=[
    "max_tokens past the model's context", "max_tokens past the profile's context",
    "drafts past the engine's bound", "no request slots", "slots set by an arm override",
    "n past humaneval", "a prompt past the context", "concurrency past the prompts"])
def test_check_refuses_what_an_engine_or_a_cell_would_refuse(tree, case, said, capsys):
    """Today: `specrepro check` passes each of these (rc 0); the run fails once engines
    start, or stores 100,000 streams that two prompts never kept busy."""
    code, err = check(tree(**case), capsys)
    assert code == 2 and said in err, err


def test_check_refuses_a_model_folder_without_its_config(tree, tmp_path, capsys):
    (tmp_path / "model" / "config.json").unlink()
    (tmp_path / "model" / "model.safetensors").write_bytes(b"")
    code, err = check(tree(), capsys)
    assert code == 2
    assert (f"p.yaml: model.id: expected a model folder holding config.json, found "
            f"{tmp_path / 'model'} without one (it holds model.safetensors)") in err


def test_check_passes_what_fits(tree, capsys):
    assert check(tree(), capsys) == (0, "")


def test_the_shipped_suites_pass(tmp_path, monkeypatch):
    """The smoke suite (the embedded engine, the transformers peer) and the GPU suite's
    engine comparison (vLLM, SGLang), against a GSM8K file of the real one's 1,319 rows;
    every suite's notebooks run through these checks in `make test` (test_notebooks)."""
    from specrepro.harness.preflight import problems

    data = tmp_path / "gsm8k"
    data.mkdir()
    (data / "test.jsonl").write_text("".join(json.dumps(GSM8K[0]) + "\n" for _ in range(1319)))
    monkeypatch.setenv("SPECREPRO_DATA_DIR", str(tmp_path))

    params = Path(__file__).resolve().parents[1] / "params"
    smoke = load_suite(params / "smoke.yaml")
    gpu = load_suite(params / "h200-engines.yaml")
    studies = [resolve_study(smoke, nb) for nb in smoke.notebooks]
    studies.append(resolve_study(gpu, "04_engine_comparison"))
    assert {a.resolved.engine for st in studies for a in st.arms} >= {
        "embedded", "transformers", "vllm", "sglang"}
    assert problems(studies, here=False) == []
