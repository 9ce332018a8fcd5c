"""GSM8K exact match (lm-evaluation-harness ``gsm8k``: strict-match and flexible-extract)
as a Hugging Face ``evaluate`` metric module, loadable from the installed package
without a hub fetch: ``evaluate.load(specrepro.grading.METRIC_PATH)``.

The scoring itself is ``specrepro.grading.gsm8k.grade_gsm8k``; this file only adapts
it to ``evaluate``'s batch interface.
"""

import datasets
import evaluate

from specrepro.grading.gsm8k import grade_gsm8k

_DESCRIPTION = """\
Exact match on GSM8K final answers, graded as lm-evaluation-harness 0.4.13's `gsm8k`
task does: `strict_match` extracts the first `#### <number>`, `flexible_extract` the
last number-like string; both are compared to the gold answer after deleting `,`, `$`,
everything up to `#### ` and a trailing `.`, ignoring case.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of model completions (raw generated text).
    references: list of GSM8K gold answers (the dataset's `answer` field, or the bare number).
Returns:
    strict_match: share of completions whose strict-match answer is correct.
    flexible_extract: share of completions whose flexible-extract answer is correct.
Examples:
    >>> metric = evaluate.load(specrepro.grading.METRIC_PATH)
    >>> metric.compute(predictions=["so 18.\\n#### 18"], references=["... #### 18"])
    {'strict_match': 1.0, 'flexible_extract': 1.0}
"""

_CITATION = """\
@article{cobbe2021gsm8k,
  title={Training Verifiers to Solve Math Word Problems},
  author={Cobbe, Karl and Kosaraju, Vineet and Bavarian, Mohammad and others},
  journal={arXiv preprint arXiv:2110.14168},
  year={2021}
}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Gsm8kExactMatch(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Value("string"),
                    "references": datasets.Value("string"),
                }
            ),
            reference_urls=["https://github.com/EleutherAI/lm-evaluation-harness"],
        )

    def _compute(self, predictions, references):
        grades = [grade_gsm8k(p, r) for p, r in zip(predictions, references)]
        n = len(grades)
        return {
            "strict_match": sum(g["strict"] for g in grades) / n,
            "flexible_extract": sum(g["flexible"] for g in grades) / n,
        }
