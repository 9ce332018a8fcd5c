"""A results row made to fit its table: every column present, each value of its column's type.

Design: the store writes only normalized rows, so every file of a table has the same columns
and types (schema.py) and a wrong value fails at the write that brings it, naming the
column and the cell, not at a later read. A row gives its required columns (`CELL_REQUIRED`,
`REQUEST_REQUIRED`); every other column takes its default (`DEFAULTS`, else null); a column
the schema lacks fails. `frame` and `empty` build tables of the schema's columns in order.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import polars as pl

from specrepro.store.schema import CELL_SCHEMA, DEFAULTS


class ResultsError(ValueError):
    """A row or a store is wrong; the message names the column, cell or file."""


def _coerce(column: str, dtype: pl.DataType, value: Any, where: str) -> Any:
    """Make a value fit its column's type, or fail naming the column."""
    if value is None:
        return None
    if isinstance(value, float) and math.isnan(value) and dtype != pl.Float64:
        return None
    try:
        if dtype == pl.Int64:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise TypeError
            return int(value)
        if dtype == pl.Float64:
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        if dtype == pl.Boolean:
            if not isinstance(value, bool):
                raise TypeError
            return value
        if dtype == pl.String:
            if isinstance(value, (list, dict)):
                return json.dumps(value, sort_keys=True)
            return str(value)
        if isinstance(dtype, pl.Datetime):
            if isinstance(value, str):
                value = dt.datetime.fromisoformat(value)
            if not isinstance(value, dt.datetime):
                raise TypeError
            return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        if isinstance(dtype, pl.List):
            if not isinstance(value, (list, tuple)):
                raise TypeError
            return [_coerce(column, dtype.inner, v, where) for v in value]
    except (TypeError, ValueError):
        raise ResultsError(f"{where}: column {column!r}: expected {dtype}, found {value!r}"
                           ) from None
    return value


def normalize(row: Mapping[str, Any], schema: Mapping[str, pl.DataType],
              required: Iterable[str], where: str) -> dict[str, Any]:
    """A row with every schema column, defaults filled in and values coerced."""
    unknown = [k for k in row if k not in schema]
    if unknown:
        raise ResultsError(
            f"{where}: unknown column(s) {unknown}; expected columns of {', '.join(schema)}")
    missing = [k for k in required if row.get(k) is None]
    if missing:
        raise ResultsError(f"{where}: missing required column(s) {missing}")
    out = {}
    for column, dtype in schema.items():
        value = row.get(column, DEFAULTS.get(column) if schema is CELL_SCHEMA else None)
        out[column] = _coerce(column, dtype, value, where)
    return out


def frame(rows: list[dict], schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=dict(schema), orient="row") if rows else empty(schema)


def empty(schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(schema=dict(schema))
