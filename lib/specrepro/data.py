"""Dataset access: GSM8K and WikiText-2, from the hub or from a local directory.

Design:
- One environment variable, ``SPECREPRO_DATA_DIR``, names a directory laid out
  like ``../shared/data``: ``gsm8k/{train,test}.jsonl`` (the hub's rows, one JSON
  object a line) and ``wikitext-2/{valid,test}.txt`` (the tokenized raw text).
  Where it is set it wins over the hub, so tests and CI never touch the network.
  Unset, it defaults as the Makefile's does, to the checkout's ``../shared/data``
  where that directory exists (`CHECKOUT_DATA_DIR`), so ``specrepro run`` outside
  ``make`` finds the same data; set empty, it means the hub.
  Every function also takes an explicit ``data_dir`` that wins over all of these.
- The hub is asked once: before ``datasets`` (whose client retries an unreachable host
  five times over some 25 s), one request with a short timeout (`hub_unreachable`);
  where it gets no answer, DataError says so at once. In offline mode
  (``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE``) nothing is asked: ``datasets`` reads its
  cache. A run checks its data this way before any engine starts (workloads.check_data).
- Two ways to GSM8K that return the same rows:
  ``load_gsm8k`` goes through ``datasets`` (hub ``openai/gsm8k``/``main``, or
  the local JSONL through the ``json`` builder) and returns a ``datasets.Dataset``;
  ``read_gsm8k`` is pure standard library and returns ``list[dict]``, for
  places without ``datasets`` (the GPU box that trains the embedded model).
- This module imports only the standard library at import time; ``datasets``
  is imported inside the functions that need it.
- Missing data fails with ``DataError``, one line naming the variable and the path tried.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
import urllib.error
import urllib.request
from pathlib import Path

DATA_DIR_ENV = "SPECREPRO_DATA_DIR"
GSM8K_HUB = ("openai/gsm8k", "main")
GSM8K_SPLITS = ("train", "test")
WIKITEXT_SPLITS = ("valid", "test")
# The Makefile's `SPECREPRO_DATA_DIR ?= $(abspath ../shared/data)`, seen from a checkout
# (this file is <checkout>/lib/specrepro/data.py); None where this is no checkout.
_CHECKOUT = Path(__file__).resolve().parents[2]
CHECKOUT_DATA_DIR: Path | None = (_CHECKOUT.parent / "shared" / "data"
                                  if (_CHECKOUT / "Makefile").is_file() else None)
HUB_TIMEOUT_S = 5.0


class DataError(RuntimeError):
    """A dataset could not be found or read; the message says where we looked."""


class DataMalformed(DataError):
    """A data file that was found but is not what it must be; the message names its line."""


def data_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """The local data directory: ``explicit`` if given, else ``$SPECREPRO_DATA_DIR`` (set
    empty: None, the hub), else the checkout's ``../shared/data`` where it exists, else
    None (the hub)."""
    if explicit is not None:
        return Path(explicit)
    value = os.environ.get(DATA_DIR_ENV)
    if value is not None:
        return Path(value) if value else None
    if CHECKOUT_DATA_DIR is not None and CHECKOUT_DATA_DIR.is_dir():
        return CHECKOUT_DATA_DIR
    return None


def _unset_note() -> str:
    """Why no data directory is used, for a message: the variable and the default."""
    if os.environ.get(DATA_DIR_ENV) == "":
        return f"{DATA_DIR_ENV} is set empty (the hub)"
    default = (f" and the checkout's default {CHECKOUT_DATA_DIR} does not exist"
               if CHECKOUT_DATA_DIR is not None else "")
    return f"{DATA_DIR_ENV} is not set{default}"


def _local_file(explicit: str | os.PathLike | None, relative: str, what: str,
                note: str = "") -> Path:
    """`relative` under the data directory (`explicit`, else $SPECREPRO_DATA_DIR); a
    DataError that names the variable, the directory and the path when it is missing."""
    root = data_dir(explicit)
    if root is None:
        raise DataError(f"{what}: {_unset_note()}; set it to a directory holding "
                        f"{relative}{note}")
    path = root / relative
    if not path.is_file():
        hint = "" if root.is_dir() else f" (the directory {root} does not exist)"
        raise DataError(f"{what}: {_source(explicit)}={root}, tried {path}, no such file{hint}")
    return path


def _source(explicit: str | os.PathLike | None) -> str:
    if explicit is not None:
        return "data_dir"
    if os.environ.get(DATA_DIR_ENV) is None:
        return f"{DATA_DIR_ENV} (unset: the checkout's default)"
    return DATA_DIR_ENV


def _offline() -> bool:
    """The hub's and datasets' offline switches: nothing is asked of the network."""
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


@functools.cache
def hub_unreachable() -> str | None:
    """Why the hub does not answer (one request, `HUB_TIMEOUT_S`), or None where it
    answers (any HTTP status: the hub is there; datasets says the rest). Asked once a
    process."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    url = f"{endpoint}/api/datasets/{GSM8K_HUB[0]}"
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"),
                               timeout=HUB_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return None
    except (OSError, ValueError) as e:  # URLError, timeouts, refused; ValueError: a bad URL
        reason = getattr(e, "reason", e)
        return f"{endpoint}: {type(reason).__name__}: {reason}"
    return None


def _check_split(split: str, allowed: tuple[str, ...], dataset: str) -> None:
    if split not in allowed:
        raise DataError(f"{dataset}: unknown split {split!r}, expected one of {allowed}")


# --- GSM8K -----------------------------------------------------------------


def gsm8k_path(split: str, root: str | os.PathLike | None = None) -> Path:
    """The local JSONL file of a GSM8K split; DataError if it (or the directory) is missing."""
    _check_split(split, GSM8K_SPLITS, "GSM8K")
    return _local_file(root, f"gsm8k/{split}.jsonl", f"GSM8K {split}",
                       f" (the layout of the hub dataset {GSM8K_HUB[0]})")


GSM8K_ROW = ("a JSON object with the text fields 'question' and 'answer' (its reasoning, "
             "then '#### <number>'), one a line, as the hub dataset openai/gsm8k")


def read_gsm8k(split: str, root: str | os.PathLike | None = None) -> list[dict]:
    """GSM8K rows ``{"question", "answer"}`` from the local JSONL, standard library only;
    DataError naming the file and line of the first row that is not one (`GSM8K_ROW`)."""
    path = gsm8k_path(split, root)
    rows = []
    try:
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataMalformed(f"GSM8K {split}: {path}:{lineno} is not JSON ({e}); "
                                    f"each line must be {GSM8K_ROW}") from e
                if problem := _gsm8k_row_problem(row):
                    raise DataMalformed(f"GSM8K {split}: {path}:{lineno} {problem}; each line "
                                    f"must be {GSM8K_ROW}")
                rows.append(row)
    except UnicodeDecodeError as e:
        raise DataMalformed(f"GSM8K {split}: {path} is not UTF-8 text (byte {e.start})") from e
    if not rows:
        raise DataMalformed(f"GSM8K {split}: {path} holds no rows; it must hold {GSM8K_ROW}")
    return rows


def _gsm8k_row_problem(row: object) -> str | None:
    if not isinstance(row, dict):
        return f"is a JSON {type(row).__name__}, not an object"
    missing = [k for k in ("question", "answer") if not isinstance(row.get(k), str)]
    if missing:
        return (f"has no text field {' or '.join(repr(k) for k in missing)} (its keys: "
                f"{', '.join(map(str, row)) or 'none'})")
    if "####" not in row["answer"]:
        return "has an 'answer' without its final '#### <number>'"
    return None


def load_gsm8k(split: str, root: str | os.PathLike | None = None):
    """GSM8K as a ``datasets.Dataset``: local JSONL where a data dir is named, else the hub."""
    import datasets

    _check_split(split, GSM8K_SPLITS, "GSM8K")
    if data_dir(root) is not None:
        path = gsm8k_path(split, root)
        read_gsm8k(split, root)  # every row checked: a bad line named, not datasets' traceback
        return datasets.load_dataset("json", data_files={split: str(path)}, split=split)
    todo = f"set {DATA_DIR_ENV} to a directory holding gsm8k/{split}.jsonl" + (
        " (offline mode: only the datasets cache was read)" if _offline()
        else ", or HF_HUB_OFFLINE=1 where the datasets cache holds it")
    if not _offline() and (why := hub_unreachable()):
        raise DataError(f"GSM8K {split}: {_unset_note()}, and the hub gave no answer "
                        f"({why}); {todo}")
    try:
        return datasets.load_dataset(*GSM8K_HUB, split=split)
    except Exception as e:  # no network, no cache: say what to do instead
        first = (str(e).strip().splitlines() or [""])[0]
        raise DataError(
            f"GSM8K {split}: could not load {GSM8K_HUB[0]} ({GSM8K_HUB[1]}) from the hub "
            f"({type(e).__name__}: {first}) and {_unset_note()}; {todo}"
        ) from e


def check_gsm8k(split: str, root: str | os.PathLike | None = None) -> None:
    """DataError (one line) where no source answers for a GSM8K split: the local file
    where a data directory is named, else the hub (asked once: `load_gsm8k`, which also
    leaves the split in the datasets cache for the run that follows)."""
    if data_dir(root) is not None:
        read_gsm8k(split, root)  # there, and every row a GSM8K row
        return
    try:
        load_gsm8k(split, root)
    except ImportError:  # no `datasets` here: only the local file would do (read_gsm8k)
        gsm8k_path(split, root)


# --- WikiText-2 ------------------------------------------------------------


def read_wikitext(split: str, root: str | os.PathLike | None = None) -> str:
    """The tokenized raw text of a WikiText-2 split (``valid`` or ``test``)."""
    _check_split(split, WIKITEXT_SPLITS, "WikiText-2")
    path = _local_file(root, f"wikitext-2/{split}.txt", f"WikiText-2 {split}")
    return path.read_text(encoding="utf-8")


# Order matters: joiners first (" @-@ " -> "-"), then headings, then the spaces
# the tokenizer put around punctuation and inside quotes/brackets.
_WIKITEXT_RULES: tuple[tuple[re.Pattern, str], ...] = tuple(
    (re.compile(pattern, re.MULTILINE), repl)
    for pattern, repl in (
        (r" @([-,.])@ ", r"\1"),
        # " = = Title = = " -> "== Title ==" (the level is kept as in MediaWiki)
        (r"^ *((?:= )+)(.*?) ((?:= ?)+) *$",
         lambda m: f"{'=' * m.group(1).count('=')} {m.group(2)} {'=' * m.group(1).count('=')}"),
        (r" ([.,;:!?%)\]}])", r"\1"),
        (r"([(\[{$]) ", r"\1"),
        (r" (n't|'t|'s|'re|'ve|'m|'ll|'d)\b", r"\1"),
        (r'" ([^"\n]*?) "', r'"\1"'),
        (r"^ +| +$", ""),
    )
)


def detokenize_wikitext(text: str) -> str:
    """Undo WikiText's word tokenization: ``@-@``/``@,@``/``@.@`` joiners, headings,
    spaces before punctuation and inside quotes and brackets, split contractions.

    ``<unk>`` is left as is: the word it replaced is gone.
    """
    for pattern, repl in _WIKITEXT_RULES:
        text = pattern.sub(repl, text)
    return text


# --------------------------------------------------------------- WikiText-2 articles

# Every 20th WikiText-2 article of a split (the 11th, 31st, ...) is held out of the embedded
# target's training (tools/training/corpus.py); the `prose` workload (workloads.py)
# continues these articles. One home for the rule and the article structure both read.
PROSE_HOLDOUT_EVERY = 20


def prose_heldout(index: int, every: int = PROSE_HOLDOUT_EVERY) -> bool:
    """Whether article `index` (0-based, in `wikitext_articles` order) of a WikiText-2 split
    is held out of training (`prose_holdout_every` = `every`)."""
    return index % every == every // 2


_ARTICLE = re.compile(r"^= [^=].* =$", re.MULTILINE)
_HEADING = re.compile(r"^=+ .* =+$", re.MULTILINE)
PROSE_DOCS = ("articles", "sections", "paragraphs")


def wikitext_articles(text: str) -> list[str]:
    """Split detokenized WikiText at top-level headings ("= Title =")."""
    starts = [m.start() for m in _ARTICLE.finditer(text)] + [len(text)]
    arts = [text[a:b] for a, b in itertools.pairwise(starts)]
    return [re.sub(r"\n{3,}", "\n\n", a).strip() for a in arts if a.strip()]


def article_units(article: str, prose_docs: str = "articles") -> list[str]:
    """One article (from `wikitext_articles`) as documents of the chosen unit, in order.

    sections: cut before every heading line ("= T =", "== Sub ==", ...), the heading kept
    at the top of its text; paragraphs: every line (detokenized WikiText holds one
    paragraph a line), a heading joined to the paragraph after it. Units with no text beyond a heading are dropped.
    """
    if prose_docs not in PROSE_DOCS:
        raise ValueError(f"prose_docs must be one of {PROSE_DOCS}, got {prose_docs!r}")
    if prose_docs == "articles":
        return [article]
    if prose_docs == "sections":
        starts = sorted({0, *(m.start() for m in _HEADING.finditer(article))}) + [len(article)]
        parts = [article[a:b].strip() for a, b in itertools.pairwise(starts)]
    else:
        parts, heading = [], ""
        for para in (p.strip() for p in article.split("\n")):  # one paragraph a line
            if _HEADING.fullmatch(para):
                heading = f"{heading}\n\n{para}" if heading else para
            elif para:
                parts.append(f"{heading}\n\n{para}" if heading else para)
                heading = ""
    return [p for p in parts if p and not _HEADING.fullmatch(p.split("\n\n")[-1])]



# A workload that stands in for one the articles measured: the held-out prose continues
# WikiText-2 articles in place of article B's essays (workloads.py labels its prompts so;
# analysis/verdict/claims.py compares it with the published essays).
STANDS_FOR = {"prose": "essays"}
