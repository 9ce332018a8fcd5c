"""A cell's identity, in one place: what defines a measurement, and the hashes of it.

Design:
- A cell (one arm x workload x concurrency x sampling x repeat) is identified by a hash of
  everything that defines it (`cell_identity`): the resolved arm's profile with its flags
  and model revisions (`profile_identity`), the workload as declared, the concurrency, the
  sampling, the repeat and its seed, the engine version and the study's measurement
  settings (a windowed cell's adds its window's timing, `measurement`: declaring a window
  changes only the ids of the cells it covers). The runner keys the results store by it, and the notebooks' loader recomputes it
  to keep out stored rows that were measured under other parameters; both call `cell_id`.
  `shared_key` is the same less the arm's name: two studies' cells with one key are one
  measurement (a command measures it once and files it under each study).
- `digest(*parts, **fields)`: sorted-key compact JSON, sha256, first 16 hex digits (the
  store's cell ids). `params_hash(obj)`: the profile hash a run's manifest records (sorted-key
  JSON with the default separators; kept apart from `digest` because stored manifests carry
  it). Pydantic models are dumped in JSON mode first.
- Model fingerprint: a profile names its model by id and revision. A hub id's revision pins
  its weights; a local directory (the embedded checkpoint, a researcher's own copy) has none,
  so without a fingerprint a retrained checkpoint would replay cells measured on the old
  weights. `local_model_fingerprint(id)`: None when `id` is not an existing directory (a hub
  id); else sha256 over the sorted relative paths of its files and their contents. Prose that
  does not change what is served (`*.md`, the training reports `quality*.json`) is left out.
  Files above `FULL_HASH_LIMIT` (a 27B model's shards) contribute their size and their first
  and last MiB instead of every byte, so fingerprinting stays fast; the embedded checkpoint
  (~40 MB) is hashed in full. Relative ids resolve against the working directory, which is
  the repository root for the runner, the notebooks and the analysis alike. Memoised on
  (path, every file's size and mtime), since every cell's identity asks.
- Duck-typed on the params objects (a `Profile`, a `ResolvedStudy`, a `Cell`), so it imports
  nothing of `params` and `params` nothing of it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from fnmatch import fnmatch
from functools import lru_cache
from pathlib import Path
from typing import Any

# Profile fields that do not change what is measured (prose, timeouts).
PROFILE_PROSE = {"description", "article_arm", "ready_timeout_s"}
# Study fields that change what a cell measures.
MEASUREMENT_FIELDS = {"warmup", "ignore_eos", "thinking", "reasoning_effort"}
# The retired fixed window's two settings at the only values they now have: every cell is
# timed by the steady window (its timing enters below) or sends every prompt once, and every
# stored cell hashed these two as "requests" and null (no committed store ran the fixed
# window), so they stay in each identity as constants and no stored cell's id changes.
RETIRED_MEASUREMENT = {"mode": "requests", "window_s": None}


# ------------------------------------------------------------------------------- hashing


def jsonable(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def digest(*parts: Any, **fields: Any) -> str:
    """Stable hash of everything given: sorted-key compact JSON, sha256, 16 hex digits."""
    payload = {"_": list(parts), **fields} if parts else fields
    text = json.dumps(jsonable(payload), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def params_hash(obj: Any) -> str:
    """Short stable hash of any params object or mapping (sorted-key JSON, sha256)."""
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump(mode="json")
    text = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- identities


def profile_identity(profile: Any, recorded: Mapping[str, str] | None = None) -> dict:
    """What of a profile defines the measurement (no prose, no timeouts); a model or drafter
    that is a local directory adds its content fingerprint. `recorded` ({folder: content
    fingerprint}, from a store's manifest) stands in for a local folder this machine does
    not have (a replay of a GPU machine's 21-GiB stand-in on a laptop): a folder that
    exists here is always fingerprinted from its own bytes."""
    ident = profile.model_dump(mode="json", exclude=PROFILE_PROSE)
    for key, ref in (("model", profile.model), ("drafter", profile.drafter)):
        content = local_model_fingerprint(ref.id) if ref is not None else None
        if content is None and ref is not None and recorded and ref.id in recorded \
                and not Path(ref.id).exists():
            content = recorded[ref.id]
        if content is not None:
            ident[key]["content_sha256"] = content
    return ident


def profile_hash(profile: Any, recorded: Mapping[str, str] | None = None) -> str:
    """The profile hash a run's manifest records for an arm (`recorded`: profile_identity's)."""
    return params_hash(profile_identity(profile, recorded))


def measurement(study: Any, cell: Any = None) -> dict:
    """Study-level settings that change what a cell measures; for a cell timed in the
    study's steady window (params/window.py), the window's timing too. Only there: a key
    added to every cell's identity would orphan every stored cell."""
    out = {**RETIRED_MEASUREMENT, **study.model_dump(mode="json", include=MEASUREMENT_FIELDS)}
    if cell is not None and getattr(study, "window", None) is not None and study.windowed(cell):
        out["window"] = study.window.timing()
    return out


def cell_identity(study: Any, cell: Any, engine_version: str | None,
                  recorded: Mapping[str, str] | None = None,
                  profiles: dict[str, dict] | None = None) -> dict:
    """Everything that defines a cell of a resolved study: the resolved arm (profile and
    overrides, model revisions inside), workload, concurrency, sampling, repeat, seed,
    engine version and the study's measurement settings (`recorded`: profile_identity's).
    `profiles` ({arm name: profile_identity}) memoises the arms' profile identities over
    many cells of one study: each one walks the local model folders' files."""
    arm = next(a for a in study.arms if a.name == cell.arm.name)
    profiles = {} if profiles is None else profiles
    if arm.name not in profiles:
        profiles[arm.name] = profile_identity(arm.resolved, recorded)
    return {
        "arm": {"name": arm.name, "profile": profiles[arm.name]},
        "workload": cell.workload.model_dump(mode="json"),
        "concurrency": cell.concurrency,
        "sampling": cell.sampling.model_dump(mode="json"),
        "repeat": cell.repeat,
        "seed": cell.seed,
        "engine_version": engine_version,
        "measurement": measurement(study, cell),
    }


def cell_id(study: Any, cell: Any, engine_version: str | None,
            recorded: Mapping[str, str] | None = None,
            profiles: dict[str, dict] | None = None) -> str:
    """The results store's key for a cell measured on an engine of this version
    (`recorded`: fingerprints of local folders absent here, profile_identity's; `profiles`:
    cell_identity's memo)."""
    return digest(cell_identity(study, cell, engine_version, recorded, profiles))


def recorded_fingerprints(manifest: Mapping[str, Any]) -> dict[str, str]:
    """{local folder: the content fingerprint its sessions recorded} from a store's
    manifest (each session's `models`), where every session that recorded the folder
    recorded one fingerprint: a folder exported anew between sessions is left out."""
    seen: dict[str, set[str]] = {}
    for session in manifest.get("sessions", []):
        for m in session.get("models") or []:
            if m.get("id") and m.get("content_sha256"):
                seen.setdefault(m["id"], set()).add(m["content_sha256"])
    return {k: next(iter(v)) for k, v in seen.items() if len(v) == 1}


def shared_key(study: Any, cell: Any, engine_version: str | None) -> str:
    """What two studies' cells must share to be one measurement: the cell's identity less
    its arm's name (the resolved profile stays, and so do the workload, level, sampling,
    repeat, seed, engine version and measurement settings) and whether it is an A/A twin.
    A command that runs several studies measures such a cell once and files it under each
    (harness/shared_cells.py)."""
    ident = cell_identity(study, cell, engine_version)
    # an A/A twin is its arm measured again on a start of its own: it shares only with
    # another study's twin, never with the arm it is the noise of
    twin = getattr(next(a for a in study.arms if a.name == cell.arm.name), "noise_of", None)
    ident["arm"] = {"profile": ident["arm"]["profile"], "twin": twin is not None}
    return digest(ident)


# --------------------------------------------------------------------- model fingerprint

SKIP_SUFFIXES = (".md",)
# fnmatch patterns: records, not weights (an exported drafter's export.json names the
# absolute path it was exported from, which must not make a cell depend on the checkout's place)
SKIP_NAMES = ("quality*.json", "training-*.json", "export.json")
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
    """sha256 (16 hex digits) of a local model directory's files, or None for a hub id. A
    stand-in's folder (`standin.json`, tools/export/standin.py) is keyed by its recipe
    (the budget, the seed, the source checkpoint's sha256 and the part) when every file it
    lists has the size it records; tens of GB are not hashed per cell."""
    root = Path(model_id)
    if not root.is_dir():
        return None
    recipe = standin_recipe(root)
    if recipe is not None:
        return digest("standin", recipe)
    stamp = tuple((p.relative_to(root).as_posix(), (st := p.stat()).st_size, st.st_mtime_ns)
                  for p in _files(root))
    return _fingerprint(str(root.resolve()), stamp)


STANDIN_RECIPE = "standin.json"


def standin_recipe(root: Path) -> dict | None:
    """A stand-in folder's recipe and part, or None (not a stand-in, or its files are not
    exactly the ones its recipe lists at the sizes it records: then it is hashed like any
    folder)."""
    try:
        meta = json.loads((root / STANDIN_RECIPE).read_text())
        files, part = meta["files"], meta["part"]
        recipe = meta["recipe"]
        on_disk = {p.relative_to(root).as_posix() for p in root.rglob("*")
                   if p.is_file() and p.name != STANDIN_RECIPE}
        sizes_ok = on_disk == set(files) and all(
            (root / f).stat().st_size == n for f, n in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {"recipe": recipe, "part": part, "files": files} if sizes_ok else None
