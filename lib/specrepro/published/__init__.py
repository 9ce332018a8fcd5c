"""The two articles' published numbers, as data (the CSV files beside this module), and
their loader (`loader.py`: every file checked row by row, an error naming the file, the line
and the column; its docstring says what each file holds and how a row names its source).

What it offers: `load_published` (the printed figures, tidy), `load_arms` (every arm a row
may name), `load_gates` (article B's pre-registered gates), `load_vocabulary` (the declared
articles, engines, methods, workloads, stats and metrics), their polars schemas, and
`ARTICLE_FILES` (the seed file each article letter stands for).
"""

from specrepro.published.loader import (
    ARMS_SCHEMA,
    ARTICLE_FILES,
    GATES_SCHEMA,
    PUBLISHED_SCHEMA,
    PublishedError,
    load_arms,
    load_gates,
    load_published,
    load_vocabulary,
)

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
