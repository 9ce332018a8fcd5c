"""The loader of the articles' published numbers (the CSV files of this package).

Design:
- The CSV files beside this module are the only copy of the numbers:
  `article_a.csv` and `article_b.csv` (one row per printed figure, tidy),
  `arms.csv` (every arm id a row may name), `gates.csv` (article B's four
  pre-registered gates for the FP8 drafter) and `vocabulary.csv` (the declared
  articles, engines, methods, workloads, stats and metrics, each metric with
  the unit(s) it may carry).
- A row's `source` says where the figure is printed, in a form a test can
  follow back into the article's text: `text: <verbatim phrase>` names the
  sentence, `table: <phrase of the table's header> | row: <first cell> |
  col: <header cell>` names a table cell. Rows with stat `derived` are not
  printed (their note says how they were computed).
- Where an article prints two values for one thing (B: one-stream essays 153.4
  and 155.2; A: acceptance length 3.16 against per-position rates that sum to
  3.40), both rows are kept, each with its own source; the analysis chooses.
- Percent-valued metrics (`%` unit) keep the article's percent, not a
  fraction; `agg_tok_s` at concurrency 1 is the single-stream rate.
- Every file is checked row by row on load with the standard `csv` module, so
  an error names the file, the line and the column; only then is it turned
  into a polars DataFrame with a fixed schema.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import polars as pl

__all__ = [
    "ARMS_SCHEMA",
    "ARTICLE_FILES",
    "GATES_SCHEMA",
    "PUBLISHED_SCHEMA",
    "PublishedError",
    "load_arms",
    "load_gates",
    "load_published",
    "load_vocabulary",
]

# The seed file each article letter stands for (read from SPECREPRO_SEEDS_DIR by tests).
ARTICLE_FILES = {"A": "000_2d5428f3f422e252.txt", "B": "004_b1b66b56a4972115.txt"}
_ARTICLE_CSV = {"A": "article_a.csv", "B": "article_b.csv"}
_GATE_OPS = (">=", "<=", ">", "<")


class PublishedError(ValueError):
    """A published CSV does not match its schema or the declared vocabulary."""


# --- cell parsers: text -> typed value, or raise ValueError with what was expected ----


def _text(cell: str) -> str:
    if not cell:
        raise ValueError("expected a non-empty string, found an empty cell")
    return cell


def _opt_text(cell: str) -> str | None:
    return cell or None


def _float(cell: str) -> float:
    try:
        value = float(cell)
    except ValueError:
        raise ValueError(f"expected a number, found {cell!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, found {cell!r}")
    return value


def _opt_float(cell: str) -> float | None:
    return _float(cell) if cell else None


def _opt_pos_int(cell: str) -> int | None:
    if not cell:
        return None
    if not cell.isdigit() or int(cell) < 1:
        raise ValueError(f"expected a positive integer or an empty cell, found {cell!r}")
    return int(cell)


def _opt_nonneg_int(cell: str) -> int | None:
    if not cell:
        return None
    if not cell.isdigit():
        raise ValueError(f"expected a non-negative integer or an empty cell, found {cell!r}")
    return int(cell)


_Column = tuple[Callable[[str], object], pl.DataType]

PUBLISHED_COLUMNS: dict[str, _Column] = {
    "article": (_text, pl.String()),
    "section": (_text, pl.String()),
    "source": (_text, pl.String()),
    "arm": (_text, pl.String()),
    "engine": (_opt_text, pl.String()),
    "engine_version": (_opt_text, pl.String()),
    "workload": (_opt_text, pl.String()),
    "concurrency": (_opt_pos_int, pl.Int64()),
    "temperature": (_opt_float, pl.Float64()),
    "repeat": (_opt_pos_int, pl.Int64()),
    "metric": (_text, pl.String()),
    "stat": (_text, pl.String()),
    "value": (_float, pl.Float64()),
    "unit": (_text, pl.String()),
    "baseline_arm": (_opt_text, pl.String()),
    "note": (_opt_text, pl.String()),
}
ARMS_COLUMNS: dict[str, _Column] = {
    "arm": (_text, pl.String()),
    "article": (_text, pl.String()),
    "label": (_text, pl.String()),
    "engine": (_opt_text, pl.String()),
    "engine_version": (_opt_text, pl.String()),
    "method": (_text, pl.String()),
    "drafts": (_opt_nonneg_int, pl.Int64()),
    "schedule": (_opt_text, pl.String()),
    "target_precision": (_opt_text, pl.String()),
    "drafter_precision": (_opt_text, pl.String()),
    "hardware": (_text, pl.String()),
    "notes": (_opt_text, pl.String()),
}
GATES_COLUMNS: dict[str, _Column] = {
    "gate": (_text, pl.String()),
    "arm": (_text, pl.String()),
    "baseline_arm": (_opt_text, pl.String()),
    "metric": (_text, pl.String()),
    "workload": (_opt_text, pl.String()),
    "concurrency": (_opt_pos_int, pl.Int64()),
    "temperature": (_opt_float, pl.Float64()),
    "op": (_text, pl.String()),
    "threshold": (_float, pl.Float64()),
    "unit": (_text, pl.String()),
    "published_outcome": (_text, pl.String()),
    "source": (_text, pl.String()),
}
VOCABULARY_COLUMNS: dict[str, _Column] = {
    "kind": (_text, pl.String()),
    "name": (_text, pl.String()),
    "unit": (_opt_text, pl.String()),
    "description": (_text, pl.String()),
}


def _schema(columns: dict[str, _Column]) -> dict[str, pl.DataType]:
    """A file's DataFrame schema: its columns' dtypes."""
    return {name: dtype for name, (_, dtype) in columns.items()}


PUBLISHED_SCHEMA = _schema(PUBLISHED_COLUMNS)
ARMS_SCHEMA = _schema(ARMS_COLUMNS)
GATES_SCHEMA = _schema(GATES_COLUMNS)


# --- reading --------------------------------------------------------------------------


def _where(directory: Path | None, name: str):
    return (directory / name) if directory is not None else resources.files(__package__) / name


def _read_rows(directory: Path | None, name: str, columns: dict[str, _Column]):
    """Parse one CSV into typed dicts; yield (line number, row). Header must match exactly."""
    path = _where(directory, name)
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header != list(columns):
            raise PublishedError(f"{name}: header is {header}, expected {list(columns)}")
        for row in reader:
            line = reader.line_num
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(columns):
                raise PublishedError(
                    f"{name}, line {line}: {len(row)} cells, expected {len(columns)}"
                )
            typed = {}
            for (column, (parse, _)), cell in zip(columns.items(), row, strict=True):
                try:
                    typed[column] = parse(cell.strip())
                except ValueError as err:
                    raise PublishedError(f"{name}, line {line}, column {column!r}: {err}") from None
            yield line, typed


class _Vocabulary:
    """The declared names of each kind, and the units each metric may carry."""

    def __init__(self, rows: list[dict]):
        self.names: dict[str, set[str]] = {}
        self.units: dict[str, set[str]] = {}
        for row in rows:
            self.names.setdefault(row["kind"], set()).add(row["name"])
            if row["kind"] == "metric":
                self.units[row["name"]] = set((row["unit"] or "").split("|"))

    def check(self, name: str, line: int, column: str, kind: str, value: str | None) -> None:
        if value is not None and value not in self.names.get(kind, ()):
            raise PublishedError(
                f"{name}, line {line}, column {column!r}: {value!r} is not a declared {kind} "
                f"(vocabulary.csv declares {sorted(self.names.get(kind, ()))})"
            )

    def check_unit(self, name: str, line: int, metric: str, unit: str) -> None:
        if unit not in self.units[metric]:
            raise PublishedError(
                f"{name}, line {line}, column 'unit': {unit!r} is not a unit of {metric!r} "
                f"(vocabulary.csv allows {sorted(self.units[metric])})"
            )


def _vocabulary_rows(directory: Path | None) -> list[dict]:
    return [row for _, row in _read_rows(directory, "vocabulary.csv", VOCABULARY_COLUMNS)]


def _vocabulary(directory: Path | None) -> _Vocabulary:
    return _Vocabulary(_vocabulary_rows(directory))


def _arms(directory: Path | None, vocab: _Vocabulary) -> dict[str, dict]:
    arms: dict[str, dict] = {}
    for line, row in _read_rows(directory, "arms.csv", ARMS_COLUMNS):
        if row["arm"] in arms:
            raise PublishedError(f"arms.csv, line {line}: arm {row['arm']!r} declared twice")
        for article in row["article"].split("|"):
            vocab.check("arms.csv", line, "article", "article", article)
        vocab.check("arms.csv", line, "engine", "engine", row["engine"])
        vocab.check("arms.csv", line, "method", "method", row["method"])
        arms[row["arm"]] = row
    return arms


def _frame(rows: list[dict], schema: dict) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=schema, orient="row")


# --- public loaders -------------------------------------------------------------------


def load_vocabulary(directory: Path | None = None) -> pl.DataFrame:
    """vocabulary.csv as a DataFrame (kind, name, unit, description)."""
    return _frame(_vocabulary_rows(directory), _schema(VOCABULARY_COLUMNS))


def load_arms(directory: Path | None = None) -> pl.DataFrame:
    """arms.csv, validated against the vocabulary: one row per arm id."""
    arms = _arms(directory, _vocabulary(directory))
    return _frame(list(arms.values()), ARMS_SCHEMA)


def _check_arm_columns(name: str, line: int, row: dict, arms) -> None:
    """A row's `arm` and `baseline_arm` (where given) must be arms of arms.csv."""
    for column in ("arm", "baseline_arm"):
        if row[column] is not None and row[column] not in arms:
            raise PublishedError(
                f"{name}, line {line}, column {column!r}: arm {row[column]!r} is not in arms.csv"
            )


def _check_published_row(name: str, line: int, row: dict, article: str, arms, vocab) -> None:
    if row["article"] != article:
        raise PublishedError(
            f"{name}, line {line}: article {row['article']!r} in the file of {article}"
        )
    _check_arm_columns(name, line, row, arms)
    arm = arms[row["arm"]]
    if article not in arm["article"].split("|"):
        raise PublishedError(
            f"{name}, line {line}: arm {row['arm']!r} is not an arm of article {article}"
        )
    for column in ("engine", "engine_version"):
        if row[column] != arm[column]:
            raise PublishedError(
                f"{name}, line {line}, column {column!r}: {row[column]!r}, "
                f"but arms.csv gives {arm[column]!r} for {row['arm']!r}"
            )
    vocab.check(name, line, "workload", "workload", row["workload"])
    vocab.check(name, line, "metric", "metric", row["metric"])
    vocab.check(name, line, "stat", "stat", row["stat"])
    vocab.check_unit(name, line, row["metric"], row["unit"])
    if not (row["source"].startswith(("text: ", "table: ", "derived: "))):
        raise PublishedError(
            f"{name}, line {line}, column 'source': expected 'text: …', 'table: …' or 'derived: …'"
        )
    if (row["stat"] == "derived") != row["source"].startswith("derived: "):
        raise PublishedError(f"{name}, line {line}: stat 'derived' goes with a 'derived: …' source")


def load_published(article: str | None = None, directory: Path | None = None) -> pl.DataFrame:
    """Every published figure of article "A", "B" or both (None), validated, as a DataFrame.

    Columns and dtypes: PUBLISHED_SCHEMA. Raises PublishedError naming the file, line and
    column of the first row that breaks the schema or the declared vocabulary.
    """
    if article is not None and article not in _ARTICLE_CSV:
        raise PublishedError(
            f"article must be one of {sorted(_ARTICLE_CSV)} or None, got {article!r}"
        )
    vocab = _vocabulary(directory)
    arms = _arms(directory, vocab)
    rows = []
    for letter in [article] if article else sorted(_ARTICLE_CSV):
        name = _ARTICLE_CSV[letter]
        for line, row in _read_rows(directory, name, PUBLISHED_COLUMNS):
            _check_published_row(name, line, row, letter, arms, vocab)
            rows.append(row)
    return _frame(rows, PUBLISHED_SCHEMA)


def load_gates(directory: Path | None = None) -> pl.DataFrame:
    """gates.csv: article B's pre-registered gates, validated, one row per gate."""
    vocab = _vocabulary(directory)
    arms = _arms(directory, vocab)
    rows = []
    for line, row in _read_rows(directory, "gates.csv", GATES_COLUMNS):
        _check_arm_columns("gates.csv", line, row, arms)
        vocab.check("gates.csv", line, "metric", "metric", row["metric"])
        vocab.check("gates.csv", line, "workload", "workload", row["workload"])
        vocab.check_unit("gates.csv", line, row["metric"], row["unit"])
        if row["op"] not in _GATE_OPS:
            raise PublishedError(
                f"gates.csv, line {line}, column 'op': {row['op']!r} not in {_GATE_OPS}"
            )
        if row["published_outcome"] not in ("pass", "fail"):
            raise PublishedError(
                f"gates.csv, line {line}, column 'published_outcome': pass or fail"
            )
        rows.append(row)
    return _frame(rows, GATES_SCHEMA)
