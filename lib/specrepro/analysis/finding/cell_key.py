"""The cell's key: the columns that identify a measured level, defined once for analysis.

Design:
- A study measures each arm at each level (a workload, a number of concurrent streams, a
  sampling temperature), each repeat its own cell. The results tables carry these as
  columns; `LEVEL`, `CELL` (an arm at a level: what the repeats of one cell share) and
  `CELL_KEY` (one stored cell: what ties a row to the cell the study declares) name them in
  the tables' order, so a table grouped by them keeps that order.
- Readers see levels workload first, then temperature, then streams: `READING` is that order
  of the `LEVEL` columns, for the group-bys and sorts whose output becomes a reader's rows
  and columns. The two orders are kept apart on purpose: changing either reorders a
  rendered table.
- Helpers take the names from here rather than spelling them: `key_of` (a row's values, in
  a key's order), `declared_key` (the same for a cell the study declares, `params.Cell`),
  `at` (the filter for the rows of a level, or of an arm at a level). A column named on its
  own, such as `pl.col("concurrency")` to read streams, is a use of one column, not a key.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping, Sequence

import polars as pl

LEVEL = ("workload", "concurrency", "temperature")  # what arms are compared at
READING = ("workload", "temperature", "concurrency")  # the same, in the order readers see
CELL = ("arm", *LEVEL)  # an arm at a level: its repeats share it
CELL_KEY = (*CELL, "repeat")  # one stored cell


def key_of(row: Mapping, keys: Sequence[str] = CELL_KEY) -> tuple:
    """A row's (or level dict's) values of `keys`, in their order."""
    return tuple(row[k] for k in keys)


def declared_key(cell) -> tuple:
    """A declared cell's (`params.Cell`) values of CELL_KEY: what its stored row carries."""
    return (cell.arm.name, cell.workload.name, cell.concurrency, cell.sampling.temperature,
            cell.repeat)


def at(level: Mapping, keys: Sequence[str] = CELL) -> pl.Expr:
    """The rows whose `keys` columns equal the level's values (a null never matches)."""
    return functools.reduce(operator.and_, (pl.col(k) == level[k] for k in keys))
