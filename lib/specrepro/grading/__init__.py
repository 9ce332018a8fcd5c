"""Grading of model outputs: GSM8K exact match as lm-evaluation-harness does it.

``grade_gsm8k(completion, gold_answer)`` grades one request (the harness calls it
per response); ``load_metric()`` returns the same scoring as an ``evaluate`` metric
module shipped inside this package (``METRIC_PATH``), so no hub fetch is needed.
"""

from __future__ import annotations

from pathlib import Path

from specrepro.grading.gsm8k import (
    EXACT_MATCH,
    FILTERS,
    FLEXIBLE_EXTRACT,
    STRICT_MATCH,
    ExactMatch,
    RegexFilter,
    gold_number,
    grade_gsm8k,
)

METRIC_PATH = str(Path(__file__).parent / "gsm8k_exact_match")


def load_metric(**kwargs):
    """The GSM8K exact-match ``evaluate`` metric, loaded from the package directory."""
    import evaluate

    return evaluate.load(METRIC_PATH, **kwargs)


__all__ = [
    "EXACT_MATCH", "FILTERS", "FLEXIBLE_EXTRACT", "METRIC_PATH", "STRICT_MATCH",
    "ExactMatch", "RegexFilter", "gold_number", "grade_gsm8k", "load_metric",
]
