"""The results store: append-only Parquet tables of cells and requests per study and run,
with a manifest of the sessions that wrote them. This module is its public interface: the
harness, the pipeline, the analysis, params and the scripts import these names from
`specrepro.store` and nothing from its modules (tests/test_private_names.py holds that).

Design, one concept a module (docs/architecture.md "Contract: results"):
- `schema.py`: the tables' columns and types, the columns added since stores were first
  written, what a row must give;
- `rows.py`: a row made to fit its table (`normalize`), tables built from rows;
- `files.py`: a table's files on disk: their names, atomic writes, the one reader (each
  key once, legacy files upgraded as read), merging parts into a file;
- `integrity.py`: every file verified as read; a damaged one set aside in `quarantine/`;
- `sharing.py`: sessions sharing one store at once: flocks, the manifest file, readers
  that read again, a session's params stored once;
- `loaders.py`: what the analysis reads: per cell the latest `ok` attempt, its requests,
  and the attempts whose requests are not all stored (`requests_missing`);
- `manifest_rebuild.py`: a damaged or missing manifest rebuilt from the store's files;
- `result_store.py`: one run of one study (`ResultStore`): sessions in the manifest,
  attempts written as parts, a session's parts merged when it ends;
- `compaction.py`: `specrepro compact`: a store made ready to commit, engine logs gzipped.
Layering inside: schema <- rows <- sharing <- integrity <- files <- loaders <-
manifest_rebuild <- result_store <- compaction; no module imports one after it.
"""

from __future__ import annotations

from specrepro.store.compaction import append_log, compact, compact_store, pack_log
from specrepro.store.loaders import load_attempts, load_cells, load_requests, requests_missing
from specrepro.store.result_store import NAME_PATTERN, ResultStore, now
from specrepro.store.rows import ResultsError, empty, frame, normalize
from specrepro.store.schema import (
    CELL_REQUIRED,
    CELL_SCHEMA,
    REQUEST_REQUIRED,
    REQUEST_SCHEMA,
    STATUSES,
)
from specrepro.store.sharing import settled

__all__ = [
    "CELL_REQUIRED", "CELL_SCHEMA", "NAME_PATTERN", "REQUEST_REQUIRED", "REQUEST_SCHEMA",
    "STATUSES",
    "ResultStore", "ResultsError", "append_log", "compact", "compact_store", "empty",
    "frame", "load_attempts", "load_cells", "load_requests", "normalize", "now", "pack_log",
    "requests_missing",
    "settled",
]
