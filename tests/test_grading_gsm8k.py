"""The GSM8K grader against lm-evaluation-harness 0.4.13 itself: its task YAML, its
RegexFilter and its exact_match, on tricky completions; and the evaluate module."""

from __future__ import annotations

from pathlib import Path

import lm_eval
import pytest
import yaml
from lm_eval.api.registry import get_metric
from lm_eval.filters.extraction import RegexFilter as LmEvalRegexFilter

from specrepro import grading
from specrepro.grading import gsm8k

GOLD_18 = (
    "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n"
    "She makes 9 * 2 = $<<9*2=18>>18 every day at the farmer’s market.\n#### 18"
)
FEWSHOT_ECHO = (
    "Question: Tom has 3 apples and buys 4.\nAnswer: 3 + 4 = 7\n#### 7\n\n"
    "Question: Ann has 5 pears and eats 2.\nAnswer: 5 - 2 = 3\n#### 3"
)

# (completion, gold answer): each exercises a corner of extraction or normalisation.
CASES = [
    ("She makes 9 * 2 = 18 dollars.\n#### 18", GOLD_18),
    ("#### 18", "#### 18"),
    ("The answer is 18.", GOLD_18),  # flexible only, trailing period
    ("The answer is 18", "18"),  # bare-number gold
    ("#### -5", "#### -5"),  # negative
    ("It drops by 5, so -5.\n#### -5", "#### 5"),  # sign matters
    ("The temperature is -12 degrees", "#### -12"),
    ("#### 3.50", "#### 3.5"),  # decimals are compared as strings
    ("#### 3.5", "#### 3.5"),
    ("Total is 0.75 of the cake", "#### 0.75"),
    ("#### 1,234", "#### 1234"),  # commas removed on both sides
    ("#### 1234", "#### 1,234"),
    ("He pays $1,200 in total.", "#### 1200"),  # dollar sign
    ("#### $18", "#### 18"),  # strict regex does not take the $
    ("$18.00", "#### 18"),
    ("So she earns $18.", "#### 18"),  # "$18." -> "18"
    ("18 apples and 20 pears, 38 fruits", "#### 38"),  # last number
    ("38 fruits in all from 18 apples and 20 pears", "#### 38"),
    ("#### 7\n\nQuestion: next\nAnswer: 9\n#### 9", "#### 7"),  # take the first ####
    ("#### 9 wait, no\n#### 7", "#### 7"),
    (FEWSHOT_ECHO + "\n\nQuestion: Janet's ducks...\nAnswer: 9*2=18\n#### 18", GOLD_18),
    (FEWSHOT_ECHO, "#### 7"),  # the echo's first answer
    ("I cannot solve this problem.", GOLD_18),  # no number at all
    ("", GOLD_18),  # empty completion
    ("#### ", "#### 0"),  # #### with nothing after it
    ("####18", GOLD_18),  # no space after ####
    ("#### 18.", GOLD_18),  # trailing period inside the strict match
    ("The answer is 5", "#### 5"),  # a single digit: flexible's second group
    ("Answer: 7 then 8", "#### 8"),  # two single digits, last one wins
    ("x = 1.2.3", "#### 123"),  # dots kept mid-string
    ("Le résultat est 42 €", "#### 42"),  # unicode around the number
    ("答案是 ４２", "#### 42"),  # full-width digits are not [0-9]
    ("The result is 42\u00a0km", "#### 42"),  # non-breaking space
    ("#### 42\u200b", "#### 42"),  # zero-width space after the number
    ("..., ,,", "#### 0"),  # punctuation only: flexible matches but is empty after normalising
    ("#### -", "#### 0"),
    ("Step 1: 2+2=4. Step 2: 4*10=40.\n#### 40\nDone.", "#### 40"),
    ("The answer is $1,000,000.00.", "#### 1000000"),
    ("The answer is 5,", "#### 5"),  # trailing comma
    ("It costs 1, 2, or 3 dollars", "#### 3"),
    ("-.5 is the change", "#### -0.5"),
    ("#### 1e3", "#### 1000"),  # exponent notation is not a number here
    ("ANSWER #### 18", GOLD_18),
    ("17 #### 18 and then 19", GOLD_18),
]


def lm_eval_yaml() -> dict:
    path = Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml"
    return yaml.safe_load(path.read_text())


def test_enough_cases():
    assert len(CASES) >= 30


def test_constants_are_the_task_yaml():
    task = lm_eval_yaml()
    filters = {f["name"]: f["filter"] for f in task["filter_list"]}
    for ours in gsm8k.FILTERS:
        regex, take = filters[ours.name]
        assert (regex["function"], take["function"]) == ("regex", "take_first")
        assert regex["regex_pattern"] == ours.regex_pattern
        assert regex.get("group_select", 0) == ours.group_select
    assert set(filters) == {f.name for f in gsm8k.FILTERS}
    (metric,) = task["metric_list"]
    assert metric["metric"] == "exact_match"
    assert tuple(metric["regexes_to_ignore"]) == gsm8k.EXACT_MATCH.regexes_to_ignore
    assert metric["ignore_case"] == gsm8k.EXACT_MATCH.ignore_case
    assert metric["ignore_punctuation"] == gsm8k.EXACT_MATCH.ignore_punctuation


def lm_eval_grade(completion: str, gold: str) -> dict:
    """What lm-eval computes for one doc: each filter, then exact_match(prediction, gold)."""
    task = lm_eval_yaml()
    (kwargs,) = task["metric_list"]
    kwargs = {k: v for k, v in kwargs.items() if k not in ("metric", "aggregation",
                                                            "higher_is_better")}
    exact_match = get_metric("exact_match")  # the function the task's metric name resolves to
    out = {}
    for f in task["filter_list"]:
        regex = {k: v for k, v in f["filter"][0].items() if k != "function"}
        (pred,) = LmEvalRegexFilter(**regex).apply([[completion]], [{}])[0]
        score = exact_match(predictions=[pred], references=[gold], **kwargs)
        out[f["name"]] = (pred, bool(score["exact_match"]))
    return out


@pytest.mark.parametrize("completion,gold", CASES)
def test_grader_agrees_with_lm_eval(completion, gold):
    ours = grading.grade_gsm8k(completion, gold)
    theirs = lm_eval_grade(completion, gold)
    assert (ours["strict_pred"], ours["strict"]) == theirs["strict-match"]
    assert (ours["flexible_pred"], ours["flexible"]) == theirs["flexible-extract"]


def test_cases_cover_both_outcomes():
    grades = [grading.grade_gsm8k(c, g) for c, g in CASES]
    for key in ("strict", "flexible"):
        assert {g[key] for g in grades} == {True, False}
    assert sum(g["strict_pred"] == "[invalid]" for g in grades) >= 5
    assert sum(g["flexible_pred"] == "[invalid]" for g in grades) >= 2


def test_known_grades():
    assert grading.grade_gsm8k("so 18.\n#### 18", GOLD_18) == {
        "strict": True, "flexible": True, "strict_pred": "18", "flexible_pred": "18"}
    g = grading.grade_gsm8k("The answer is $1,000.", "#### 1000")
    assert (g["strict"], g["flexible"], g["flexible_pred"]) == (False, True, "$1,000.")
    assert grading.gold_number(GOLD_18) == "18"


def test_evaluate_module_loads_from_package_and_matches():
    metric = grading.load_metric()
    preds, refs = zip(*CASES)
    scores = metric.compute(predictions=list(preds), references=list(refs))
    grades = [grading.grade_gsm8k(c, g) for c, g in CASES]
    assert scores["strict_match"] == pytest.approx(sum(g["strict"] for g in grades) / len(CASES))
    assert scores["flexible_extract"] == pytest.approx(
        sum(g["flexible"] for g in grades) / len(CASES))
    assert 0 < scores["strict_match"] < scores["flexible_extract"] < 1
    assert Path(grading.METRIC_PATH).is_relative_to(Path(grading.__file__).parent)
