"""GSM8K exact match as lm-evaluation-harness 0.4.13 grades its ``gsm8k`` task.

Design: the task YAML (``lm_eval/tasks/gsm8k/gsm8k.yaml``) is transcribed as
data below: two regex filters, each followed by ``take_first``, and one
``exact_match`` metric with its normalisation. The code reproduces
``lm_eval.filters.extraction.RegexFilter.apply`` and
``lm_eval.api.metrics.exact_match_hf_evaluate`` for one response at a time:

- filter: ``re.findall`` over the response; no match gives the fallback
  ``[invalid]``; else take the match at ``group_select`` (0 = first, -1 = last);
  a pattern with several groups yields tuples, of which the first non-empty
  group is kept (``[invalid]`` if all are empty); the result is stripped.
- exact match: each of ``regexes_to_ignore`` is deleted, in order, from both the
  filtered prediction and the gold answer (``(?s).*#### `` cuts the gold's
  worked solution), then both are lower-cased and compared for equality.

lm-eval is a test dependency only; ``tests/test_grading_gsm8k.py`` holds this
module against its ``RegexFilter``, its ``exact_match`` and the YAML itself.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RegexFilter:
    """One ``filter_list`` entry of the task: ``regex`` then ``take_first``."""

    name: str
    regex_pattern: str
    group_select: int = 0
    fallback: str = "[invalid]"
    regex: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", re.compile(self.regex_pattern))

    def apply(self, response: str) -> str:
        """The extracted answer of one response (or the fallback)."""
        if not isinstance(response, str):
            response = ""
        matches = self.regex.findall(response)
        if not matches:
            return self.fallback
        match = matches[self.group_select]
        if isinstance(match, tuple):  # several groups: the first that matched
            match = next((g for g in match if g), self.fallback)
        return match.strip()


@dataclass(frozen=True)
class ExactMatch:
    """The task's ``exact_match`` metric with its normalisation arguments."""

    regexes_to_ignore: tuple[str, ...] = ()
    ignore_case: bool = False
    ignore_punctuation: bool = False

    def normalize(self, text: str) -> str:
        for pattern in self.regexes_to_ignore:
            text = re.sub(pattern, "", text)
        if self.ignore_case:
            text = text.lower()
        if self.ignore_punctuation:
            text = text.translate(str.maketrans("", "", string.punctuation))
        return text

    def __call__(self, prediction: str, reference: str) -> bool:
        return self.normalize(prediction) == self.normalize(reference)


# lm_eval 0.4.13, tasks/gsm8k/gsm8k.yaml (metadata version 3.0)
STRICT_MATCH = RegexFilter("strict-match", r"#### (\-?[0-9\.\,]+)", group_select=0)
FLEXIBLE_EXTRACT = RegexFilter(
    "flexible-extract", r"(-?[$0-9.,]{2,})|(-?[0-9]+)", group_select=-1
)
FILTERS = (STRICT_MATCH, FLEXIBLE_EXTRACT)
EXACT_MATCH = ExactMatch(
    regexes_to_ignore=(",", r"\$", "(?s).*#### ", r"\.$"),
    ignore_case=True,
    ignore_punctuation=False,
)


def gold_number(answer: str) -> str:
    """The normalised final answer of a GSM8K gold solution (the text after ``#### ``)."""
    return EXACT_MATCH.normalize(answer)


def grade_gsm8k(completion: str, gold_answer: str) -> dict:
    """Grade one completion against a GSM8K gold answer (full solution or bare number).

    Returns ``{"strict": bool, "flexible": bool, "strict_pred": str, "flexible_pred": str}``,
    the predictions being the filtered strings before normalisation, as lm-eval logs them.
    """
    strict_pred = STRICT_MATCH.apply(completion)
    flexible_pred = FLEXIBLE_EXTRACT.apply(completion)
    return {
        "strict": EXACT_MATCH(strict_pred, gold_answer),
        "flexible": EXACT_MATCH(flexible_pred, gold_answer),
        "strict_pred": strict_pred,
        "flexible_pred": flexible_pred,
    }
