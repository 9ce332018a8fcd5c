"""Dataset access: local GSM8K and WikiText-2, the hub fallback, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specrepro import data


@pytest.fixture
def shared_data():
    root = os.environ.get(data.DATA_DIR_ENV)
    if not root or not os.path.isdir(root):
        pytest.skip(f"{data.DATA_DIR_ENV} is not set to the shared data directory")
    return root


def test_import_needs_only_the_standard_library():
    code = ("import sys, specrepro.data; "
            "assert not {'datasets', 'numpy', 'polars'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_read_gsm8k_splits(shared_data):
    test, train = data.read_gsm8k("test"), data.read_gsm8k("train")
    assert (len(test), len(train)) == (1319, 7473)
    assert set(test[0]) == {"question", "answer"}
    assert test[0]["answer"].endswith("#### 18")


def test_load_gsm8k_through_datasets_matches_stdlib_reader(shared_data):
    assert data.load_gsm8k("test").to_list() == data.read_gsm8k("test")


def test_explicit_data_dir_wins_over_environment(tmp_path, monkeypatch, shared_data):
    (tmp_path / "gsm8k").mkdir()
    row = {"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}
    (tmp_path / "gsm8k" / "test.jsonl").write_text(json.dumps(row) + "\n")
    assert data.read_gsm8k("test", tmp_path) == [row]
    assert data.load_gsm8k("test", tmp_path).to_list() == [row]


def test_missing_data_dir_names_variable_and_path(tmp_path, monkeypatch):
    missing = tmp_path / "nowhere"
    monkeypatch.setenv(data.DATA_DIR_ENV, str(missing))
    for read in (data.read_gsm8k, data.load_gsm8k):
        with pytest.raises(data.DataError) as e:
            read("test")
        msg = str(e.value)
        assert data.DATA_DIR_ENV in msg and str(missing / "gsm8k" / "test.jsonl") in msg
        assert "does not exist" in msg
    with pytest.raises(data.DataError, match=r"wikitext-2/valid\.txt"):
        data.read_wikitext("valid")


def test_unset_variable_reads_the_hub(monkeypatch):
    import datasets

    monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)
    monkeypatch.setattr(data, "CHECKOUT_DATA_DIR", None)  # no ../shared/data default here
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub is not asked first (hub_unreachable)
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append((a, k)) or "ds")
    assert data.load_gsm8k("train") == "ds"
    assert calls == [(("openai/gsm8k", "main"), {"split": "train"})]
    with pytest.raises(data.DataError, match=data.DATA_DIR_ENV):
        data.read_gsm8k("train")  # the stdlib reader has no hub


def test_hub_failure_says_what_to_set(monkeypatch):
    import datasets

    def offline(*a, **k):
        raise ConnectionError("no network")

    monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)
    monkeypatch.setattr(data, "CHECKOUT_DATA_DIR", None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(data.DataError, match=r"openai/gsm8k.*no network.*SPECREPRO_DATA_DIR"):
        data.load_gsm8k("test")


def test_unknown_split():
    with pytest.raises(data.DataError, match="validation"):
        data.read_gsm8k("validation")


def test_read_wikitext(shared_data):
    valid, test = data.read_wikitext("valid"), data.read_wikitext("test")
    assert " @-@ " in test and len(valid) > 1_000_000 and len(test) > 1_000_000


@pytest.mark.parametrize("raw,clean", [
    (" = Robert Boulter = \n", "= Robert Boulter =\n"),
    (" = = Career = = \n", "== Career ==\n"),
    (" = = = 2000 – 2005 = = = \n", "=== 2000 – 2005 ===\n"),
    (" a guest @-@ starring role , in 1 @,@ 000 days @.@ \n",
     "a guest-starring role, in 1,000 days.\n"),
    (' as " Craig " in " Teddy \'s Story " ; he ( now ) did n\'t \n',
     'as "Craig" in "Teddy\'s Story"; he (now) didn\'t\n'),
    (" 3 @.@ 5 % of the vote ! Really ? Yes : no \n", "3.5% of the vote! Really? Yes: no\n"),
    (" x = 5 is not a heading \n", "x = 5 is not a heading\n"),
])
def test_detokenize_wikitext(raw, clean):
    assert data.detokenize_wikitext(raw) == clean


def test_detokenize_real_text(shared_data):
    text = data.detokenize_wikitext(data.read_wikitext("valid"))
    for token in (" @-@ ", " @,@ ", " @.@ ", " , ", " . ", " = = "):
        assert token not in text
