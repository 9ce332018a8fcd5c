"""Dataset access: GSM8K and WikiText-2, from the hub or from a local directory.

Design:
- One environment variable, ``SPECREPRO_DATA_DIR``, names a directory laid out
  like ``../shared/data``: ``gsm8k/{train,test}.jsonl`` (the hub's rows, one JSON
  object a line) and ``wikitext-2/{valid,test}.txt`` (the tokenized raw text).
  Where it is set it wins over the hub, so tests and CI never touch the network.
  Every function also takes an explicit ``data_dir`` that wins over both.
- Two ways to GSM8K that return the same rows:
  ``load_gsm8k`` goes through ``datasets`` (hub ``openai/gsm8k``/``main``, or
  the local JSONL through the ``json`` builder) and returns a ``datasets.Dataset``;
  ``read_gsm8k`` is pure standard library and returns ``list[dict]``, for
  places without ``datasets`` (the GPU box that trains the embedded model).
- This module imports only the standard library at import time; ``datasets``
  is imported inside the functions that need it.
- Missing data fails with ``DataError`` naming the variable and the path tried.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

DATA_DIR_ENV = "SPECREPRO_DATA_DIR"
GSM8K_HUB = ("openai/gsm8k", "main")
GSM8K_SPLITS = ("train", "test")
WIKITEXT_SPLITS = ("valid", "test")


class DataError(RuntimeError):
    """A dataset could not be found or read; the message says where we looked."""


def data_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """The local data directory: ``explicit`` if given, else ``$SPECREPRO_DATA_DIR``, else None."""
    if explicit is not None:
        return Path(explicit)
    value = os.environ.get(DATA_DIR_ENV)
    return Path(value) if value else None


def _local_file(explicit: str | os.PathLike | None, relative: str, what: str,
                note: str = "") -> Path:
    """`relative` under the data directory (`explicit`, else $SPECREPRO_DATA_DIR); a
    DataError that names the variable, the directory and the path when it is missing."""
    root = data_dir(explicit)
    if root is None:
        raise DataError(f"{what}: {DATA_DIR_ENV} is not set; set it to a directory holding "
                        f"{relative}{note}")
    path = root / relative
    if not path.is_file():
        hint = "" if root.is_dir() else f" (the directory {root} does not exist)"
        raise DataError(f"{what}: {_source(explicit)}={root}, tried {path}, no such file{hint}")
    return path


def _source(explicit: str | os.PathLike | None) -> str:
    return "data_dir" if explicit is not None else DATA_DIR_ENV


def _check_split(split: str, allowed: tuple[str, ...], dataset: str) -> None:
    if split not in allowed:
        raise DataError(f"{dataset}: unknown split {split!r}, expected one of {allowed}")


# --- GSM8K -----------------------------------------------------------------


def gsm8k_path(split: str, root: str | os.PathLike | None = None) -> Path:
    """The local JSONL file of a GSM8K split; DataError if it (or the directory) is missing."""
    _check_split(split, GSM8K_SPLITS, "GSM8K")
    return _local_file(root, f"gsm8k/{split}.jsonl", f"GSM8K {split}",
                       f" (the layout of the hub dataset {GSM8K_HUB[0]})")


def read_gsm8k(split: str, root: str | os.PathLike | None = None) -> list[dict]:
    """GSM8K rows ``{"question", "answer"}`` from the local JSONL, standard library only."""
    path = gsm8k_path(split, root)
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"GSM8K {split}: {path}:{lineno} is not JSON ({e})") from e
    return rows


def load_gsm8k(split: str, root: str | os.PathLike | None = None):
    """GSM8K as a ``datasets.Dataset``: local JSONL where a data dir is named, else the hub."""
    import datasets

    _check_split(split, GSM8K_SPLITS, "GSM8K")
    if data_dir(root) is not None:
        path = gsm8k_path(split, root)
        return datasets.load_dataset("json", data_files={split: str(path)}, split=split)
    try:
        return datasets.load_dataset(*GSM8K_HUB, split=split)
    except Exception as e:  # no network, no cache: say what to do instead
        raise DataError(
            f"GSM8K {split}: could not load {GSM8K_HUB[0]} ({GSM8K_HUB[1]}) from the hub "
            f"({type(e).__name__}: {e}) and {DATA_DIR_ENV} is not set; set it to a "
            f"directory holding gsm8k/{split}.jsonl"
        ) from e


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
