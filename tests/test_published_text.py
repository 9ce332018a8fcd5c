"""Every printed figure in the published CSVs is found again in the article's own text.

Each row's `source` is followed back into the article read from SPECREPRO_SEEDS_DIR:
`text: <phrase>` -> the sentence(s) holding that verbatim phrase; `table: <header
phrase> | row: <first cell> | col: <header cell>` -> that one table cell. The row's
value must be among the numbers printed there (thousands separators removed, signs
ignored since "down 5%" is stored as -5, number words such as "seven" counted).
The articles are not part of the project, so the module is skipped without them.
"""

import os
import re
from pathlib import Path

import polars as pl
import pytest

from specrepro.published import ARTICLE_FILES, load_gates, load_published

SEEDS = os.environ.get("SPECREPRO_SEEDS_DIR")
if not SEEDS:
    pytest.skip(
        "SPECREPRO_SEEDS_DIR is unset: the articles' text is not part of the project "
        "(`make test` points it at ../shared/seeds where that exists)",
        allow_module_level=True,
    )

# 1,014,892 | 2.76 | 40 ; thousands groups first so "1,014,892" is one number.
_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")
_WORDS = {
    "zero": 0,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "twelve": 12,
    "sixteen": 16,
    "thirty-two": 32,
}
_WORD = re.compile(r"\b(" + "|".join(sorted(_WORDS, key=len, reverse=True)) + r")\b", re.IGNORECASE)
# A sentence ends at . ! ? followed by whitespace; decimals ("0.28.0") never are.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def numbers_in(span: str) -> set[float]:
    found = {float(m.replace(",", "")) for m in _NUMBER.findall(span)}
    return found | {float(_WORDS[w.lower()]) for w in _WORD.findall(span)}


def _text(article: str) -> str:
    path = Path(SEEDS) / ARTICLE_FILES[article]
    if not path.exists():
        pytest.skip(f"{path} not found in SPECREPRO_SEEDS_DIR")
    return path.read_text(encoding="utf-8")


def sentences_with(text: str, phrase: str) -> list[str]:
    hits = [
        sentence
        for line in text.splitlines()
        for sentence in _SENTENCE_END.split(line)
        if phrase in sentence
    ]
    assert hits, f"phrase not found in the article: {phrase!r}"
    return hits


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def table_cell(text: str, header: str, row: str, col: str) -> str:
    """The cell at (row, col) of the one markdown table whose header line holds `header`."""
    lines = text.splitlines()
    starts = [
        i
        for i, line in enumerate(lines)
        if line.startswith("|") and header in line and not lines[i - 1].startswith("|")
    ]
    assert len(starts) == 1, f"{len(starts)} tables have {header!r} in their header"
    table = []
    for line in lines[starts[0] :]:
        if not line.startswith("|"):
            break
        table.append(_cells(line))
    head, body = table[0], table[2:]  # table[1] is the |---| rule
    # Article B's SGLang table puts the label column's empty header cell last.
    shift = 1 if head[-1] == "" and head[0] != "" else 0
    assert col in head, f"no column {col!r} in {head}"
    index = head.index(col) + shift
    matches = [cells for cells in body if cells[0] == row]
    assert len(matches) == 1, f"{len(matches)} rows labelled {row!r} in table {header!r}"
    return matches[0][index]


def span_of(text: str, source: str) -> str:
    if source.startswith("text: "):
        return " ".join(sentences_with(text, source.removeprefix("text: ")))
    parts = dict(part.split(": ", 1) for part in source.split(" | "))
    return table_cell(text, parts["table"], parts["row"], parts["col"])


PUBLISHED = load_published()
PRINTED = PUBLISHED.filter(pl.col("stat") != "derived")


def _row_id(row: dict) -> str:
    where = f"c{row['concurrency']}" if row["concurrency"] else ""
    return f"{row['article']}-{row['arm']}-{row['workload']}-{where}-{row['metric']}-{row['value']}"


@pytest.mark.parametrize("row", list(PRINTED.iter_rows(named=True)), ids=_row_id)
def test_value_is_printed_at_its_source(row):
    span = span_of(_text(row["article"]), row["source"])
    assert abs(row["value"]) in numbers_in(span), f"{row['value']} not printed in: {span!r}"


@pytest.mark.parametrize("gate", list(load_gates().iter_rows(named=True)), ids=lambda g: g["gate"])
def test_gate_threshold_is_printed_in_the_table(gate):
    span = span_of(_text("B"), gate["source"])
    assert abs(gate["threshold"]) in numbers_in(span), span


def test_most_rows_are_checked_against_the_text():
    assert PRINTED.height >= 300, PRINTED.height


def test_the_locator_can_fail():
    """A wrong value at a real source is refused (so the test above means something)."""
    text = _text("B")
    cell = table_cell(text, "one stream, tok/s", "essays", "DFlash 2, BF16 drafter (0.33.0)")
    assert numbers_in(cell) == {153.4}
    assert 155.2 not in numbers_in(cell)
    with pytest.raises(AssertionError, match="phrase not found"):
        sentences_with(text, "a phrase the article never prints")


@pytest.mark.parametrize("article", ["A", "B"])
def test_sections_are_the_articles_headings(article):
    lines = {line.strip() for line in _text(article).splitlines()}
    sections = set(PUBLISHED.filter(pl.col("article") == article)["section"])
    # Article B opens with four paragraphs before its first heading.
    assert sections - lines <= {"introduction"}, sections - lines
