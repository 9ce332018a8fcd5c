"""Workloads: stable ids, sizes, lm-eval's GSM8K prompt, HumanEval, essays, prefill."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from specrepro import data, workloads
from specrepro.workloads import WorkloadError, WorkloadSpec, build_workload


@pytest.fixture
def shared_data():
    root = os.environ.get(data.DATA_DIR_ENV)
    if not root or not os.path.isdir(root):
        pytest.skip(f"{data.DATA_DIR_ENV} is not set to the shared data directory")
    return Path(root)


def test_gsm8k_first_n_with_stable_ids(shared_data):
    spec = {"name": "gsm8k", "n": 12, "form": "completion"}
    first, again = build_workload(spec), build_workload(spec)
    assert first == again and len(first) == 12
    assert [p.id for p in first][:2] == ["gsm8k-test-0000", "gsm8k-test-0001"]
    test = data.read_gsm8k("test")
    assert first[7].id == "gsm8k-test-0007" and first[7].reference == test[7]["answer"]
    assert first[0].text == f"Question: {test[0]['question']}\nAnswer:"
    assert first[0].metadata["answer_number"] == "18"
    assert first[0].stop == ("Question:", "</s>", "<|im_end|>")


def test_gsm8k_prefix_stable_across_n(shared_data):
    small = build_workload({"name": "gsm8k", "n": 3, "shots": 5, "form": "completion"})
    large = build_workload({"name": "gsm8k", "n": 8, "shots": 5, "form": "completion"})
    assert large[:3] == small


def test_gsm8k_chat_wraps_the_question(shared_data):
    (p,) = build_workload({"name": "gsm8k", "n": 1, "form": "chat"})
    assert p.text is None and p.form == "chat"
    assert p.messages == [{"role": "user", "content": build_workload(
        {"name": "gsm8k", "n": 1, "form": "completion"})[0].text}]


def test_gsm8k_five_shot_has_five_examples(shared_data):
    text = build_workload({"name": "gsm8k", "n": 4, "shots": 5, "form": "completion"})
    chat = build_workload({"name": "gsm8k", "n": 4, "shots": 5, "form": "chat"})
    train = data.read_gsm8k("train")
    for t, c in zip(text, chat):
        assert t.text.count("Question: ") == 6 and t.text.count("\n#### ") == 5
        assert t.text.endswith("\nAnswer:") and len(t.metadata["fewshot_train_rows"]) == 5
        assert [m["role"] for m in c.messages] == ["user", "assistant"] * 5 + ["user"]
        assert [m["content"] for m in c.messages[1::2]] == [
            train[i]["answer"] for i in t.metadata["fewshot_train_rows"]]
    assert text[0].metadata["fewshot_train_rows"] != text[1].metadata["fewshot_train_rows"]


def lm_eval_gsm8k_task(root: Path):
    """lm-eval's own gsm8k task, reading the local JSONL instead of the hub."""
    import lm_eval
    import yaml
    from lm_eval.api.task import ConfigurableTask

    cfg = yaml.safe_load((Path(lm_eval.__file__).parent / "tasks/gsm8k/gsm8k.yaml").read_text())
    cfg.pop("tag", None)
    cfg.update(dataset_path="json", dataset_name=None, dataset_kwargs={"data_files": {
        s: str(root / "gsm8k" / f"{s}.jsonl") for s in ("train", "test")}})
    task = ConfigurableTask(config=cfg)
    task.set_fewshot_seed(1234)  # lm_eval.defaults.DEFAULT_OTHER_SEED, the evaluator's default
    return task


def test_gsm8k_prompts_are_lm_evals(shared_data):
    n = 4
    ours_text = build_workload({"name": "gsm8k", "n": n, "shots": 5, "form": "completion"})
    ours_chat = build_workload({"name": "gsm8k", "n": n, "shots": 5, "form": "chat"})
    ours_zero = build_workload({"name": "gsm8k", "n": n, "shots": 0, "form": "completion"})
    task = lm_eval_gsm8k_task(shared_data)
    docs = list(task.test_docs())[:n]
    # one sampler stream over the docs in order, as build_all_requests draws it
    assert [task.fewshot_context(d, 5) for d in docs] == [p.text for p in ours_text]
    task.set_fewshot_seed(1234)

    def as_messages(msgs, add_generation_prompt=True):  # the chat turns, unrendered
        return msgs

    assert [task.fewshot_context(d, 5, apply_chat_template=True, fewshot_as_multiturn=True,
                                 chat_template=as_messages) for d in docs] == [
        p.messages for p in ours_chat]
    assert [task.fewshot_context(d, 0) for d in docs] == [p.text for p in ours_zero]
    assert task.config.generation_kwargs["until"] == list(workloads.GSM8K_STOP)
    assert task.config.num_fewshot == 5


def test_gsm8k_reads_the_data_dir(tmp_path, monkeypatch):
    (tmp_path / "gsm8k").mkdir()
    rows = [{"question": f"What is {i}+1?", "answer": f"{i}+1={i + 1}\n#### {i + 1}"}
            for i in range(6)]
    for split in ("train", "test"):
        (tmp_path / "gsm8k" / f"{split}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path))
    prompts = build_workload({"name": "gsm8k", "n": 3, "shots": 5, "form": "completion"})
    assert prompts[2].text.endswith("Question: What is 2+1?\nAnswer:")
    assert prompts[2].reference == "2+1=3\n#### 3"
    with pytest.raises(WorkloadError, match="n=7, but only 6"):
        build_workload({"name": "gsm8k", "n": 7})


def test_gsm8k_missing_data_dir_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path / "absent"))
    with pytest.raises(data.DataError, match=r"SPECREPRO_DATA_DIR=.*absent.*gsm8k/test\.jsonl"):
        build_workload({"name": "gsm8k", "n": 1})


def test_humaneval_first_32():
    chat = build_workload({"name": "humaneval", "n": 32, "form": "chat"})
    text = build_workload({"name": "humaneval", "n": 32, "form": "completion", "max_tokens": 300})
    assert len(chat) == len(text) == 32
    assert [p.reference for p in text] == [f"HumanEval/{i}" for i in range(32)]
    assert text[0].id == "humaneval-0000" and text[0].max_tokens == 300
    assert text[0].text.startswith("from typing import List") and "def has_close_elements" in \
        text[0].text
    assert text[0].text in chat[0].messages[0]["content"] and chat[0].stop == ()
    assert chat[0].max_tokens == workloads.DEFAULT_MAX_TOKENS["humaneval"]


def test_essays():
    topics = workloads.essay_topics()
    assert len(topics) >= 32 and len(set(topics)) == len(topics)
    assert all(t.startswith("Write an essay about ") for t in topics)
    prompts = build_workload({"name": "essays", "n": 32})
    assert len(prompts) == 32 and {p.max_tokens for p in prompts} == {512}
    assert len({p.id for p in prompts}) == 32 and prompts[31].id == "essays-0031"
    assert prompts[0].messages == [{"role": "user", "content": topics[0]}]
    with pytest.raises(WorkloadError, match="essays"):
        build_workload({"name": "essays", "n": len(topics) + 1})


PREFILL_TARGETS = (1300, 12000, 79000)


def test_prefill_lengths_by_estimate():
    spec = {"name": "prefill", "n": 2, "form": "completion", "prefill_tokens": PREFILL_TARGETS}
    prompts = build_workload(spec)
    assert [p.id for p in prompts][:3] == ["prefill-01300-00", "prefill-01300-01",
                                           "prefill-12000-00"]
    assert len(prompts) == 6 and prompts == build_workload(spec)
    for p in prompts:
        target = p.metadata["target_tokens"]
        assert len(p.text) / 3.5 == pytest.approx(target, rel=0.001)
    # no two prompts share an opening, so a prefix cache cannot serve one from another
    assert len({p.text[:200] for p in prompts}) == len(prompts)
    assert len({p.text[200:2000] for p in prompts}) == len(prompts)


def test_prefill_lengths_with_a_tokenizer():
    def count_tokens(text: str) -> int:  # a stand-in tokenizer: words and symbols
        return len(re.findall(r"\w+|[^\w\s]", text))

    prompts = build_workload({"name": "prefill", "n": 1, "form": "chat",
                              "prefill_tokens": PREFILL_TARGETS}, count_tokens=count_tokens)
    for p, target in zip(prompts, PREFILL_TARGETS):
        assert count_tokens(p.messages[0]["content"]) == pytest.approx(target, rel=0.02)
        assert p.metadata["tokenizer"] == "count_tokens"


def test_spec_from_params_workload():
    from specrepro.params import Workload

    spec = WorkloadSpec.of(Workload(name="prefill", n=1, prefill_tokens=[1300], max_tokens=8))
    assert (spec.prefill_tokens, spec.max_tokens, spec.form) == ((1300,), 8, "chat")
    (p,) = build_workload(spec)
    assert p.max_tokens == 8 and p.id == "prefill-01300-00"


@pytest.mark.parametrize("spec,match", [
    ({"name": "poems", "n": 1}, "unknown"),
    ({"name": "essays", "n": 1, "form": "speech"}, "form"),
    ({"name": "essays", "n": 1, "shots": 5}, "shots"),
    ({"name": "gsm8k", "n": 1, "shots": 3}, "shots"),
    ({"name": "prefill", "n": 1}, "prefill_tokens"),
    ({"name": "essays", "n": 1, "colour": "red"}, "colour"),
    ({"name": "essays", "n": 0}, "n must be"),
])
def test_bad_specs(spec, match, shared_data):
    with pytest.raises(WorkloadError, match=match):
        build_workload(spec)


def test_stop_override_replaces_the_workloads_own_stop_strings():
    default = build_workload({"name": "humaneval", "n": 2, "form": "completion"})
    assert default[0].stop and "\ndef" in default[0].stop
    none = build_workload({"name": "humaneval", "n": 2, "form": "completion", "stop": []})
    assert [p.stop for p in none] == [(), ()]
    mine = build_workload({"name": "humaneval", "n": 1, "form": "completion", "stop": ["\n\n"]})
    assert mine[0].stop == ("\n\n",)
    assert [p.text for p in none] == [p.text for p in default]
