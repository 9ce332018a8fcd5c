"""Content fingerprint of a local model directory, part of a cell's identity.

Design:
- A profile names its model by id and revision. A hub id's revision pins its weights; a
  local directory (the embedded checkpoint, a researcher's own copy) has none, so without
  this a retrained checkpoint would replay cells measured on the old weights.
- `local_model_fingerprint(id)`: None when `id` is not an existing directory (a hub id);
  else sha256 over the sorted relative paths of its files and their contents. Prose that
  does not change what is served (`*.md`, the training reports `quality*.json`) is left out.
  Files above `FULL_HASH_LIMIT` (a 27B model's shards) contribute their size and their first
  and last MiB instead of every byte, so fingerprinting stays fast; the embedded checkpoint
  (~40 MB) is hashed in full.
- Relative ids resolve against the working directory, which is the repository root for
  the runner, the notebooks and the analysis alike (runner.py).
- Memoised on (path, every file's size and mtime), since every cell's identity asks.
"""

from __future__ import annotations

import hashlib
from fnmatch import fnmatch
from functools import lru_cache
from pathlib import Path

SKIP_SUFFIXES = (".md",)
SKIP_NAMES = ("quality*.json",)  # fnmatch patterns
FULL_HASH_LIMIT = 256 * 2**20
EDGE = 2**20


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*")
                  if p.is_file() and p.suffix not in SKIP_SUFFIXES and not any(fnmatch(p.name, pat) for pat in SKIP_NAMES)
                  and not any(part.startswith(".") for part in p.relative_to(root).parts))


def _file_digest(path: Path, size: int) -> bytes:
    h = hashlib.sha256()
    with path.open("rb") as f:
        if size <= FULL_HASH_LIMIT:
            for chunk in iter(lambda: f.read(2**20), b""):
                h.update(chunk)
        else:
            h.update(b"edges:%d:" % size + f.read(EDGE))
            f.seek(size - EDGE)
            h.update(f.read(EDGE))
    return h.digest()


@lru_cache(maxsize=64)
def _fingerprint(root: str, stamp: tuple) -> str:
    h = hashlib.sha256()
    base = Path(root)
    for rel, size, _ in stamp:
        h.update(rel.encode() + b"\0" + _file_digest(base / rel, size))
    return h.hexdigest()[:16]


def local_model_fingerprint(model_id: str) -> str | None:
    """sha256 (16 hex digits) of a local model directory's files, or None for a hub id."""
    root = Path(model_id)
    if not root.is_dir():
        return None
    stamp = tuple((p.relative_to(root).as_posix(), (st := p.stat()).st_size, st.st_mtime_ns)
                  for p in _files(root))
    return _fingerprint(str(root.resolve()), stamp)
