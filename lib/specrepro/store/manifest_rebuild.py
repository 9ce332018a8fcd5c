"""A store's manifest rebuilt from its files: where manifest.json is damaged or missing.

Design (the manifest's contract: result_store.py; a table file's: integrity.py):
- `checked_manifest(root)` is how the store reads its manifest: as stored where it is one;
  rebuilt where the file is no manifest (sharing.ManifestDamaged: empty, truncated, not an
  object of sessions) or is missing from a store that holds table files (deleted by hand:
  reading on would drop the session history and, without the engines' versions, start
  every engine again to learn them).
- The rebuild keeps what can be known: the sessions a damaged file still holds whole
  (`salvaged`: a manifest is written with sorted keys and two-space indents, so its
  `quarantined` list and its sessions are read one JSON value at a time up to the damage),
  and every other session from its cells rows (`from_cells`: its id, first start and
  last end, and per arm the profile, engine and engine version, marked `rebuilt`, which
  `known_version` accepts by arm and profile name: a cell id computed with it matches a
  stored cell only where that version measured it, so an arm whose cells are all stored
  is skipped without a start). What a session's rows do not hold (params, command, git
  commit, host, packages, engine argv and start-up facts) is said lost, in one line.
- The quarantine folder is listed back: the entries the damaged file still held, and one
  for every other file there (its problem read again where it is a table file), so a
  file set aside while the manifest could not record it is not forgotten.
- The damaged file is moved to `quarantine/manifest.json` (never over an earlier one:
  integrity.move_aside) and recorded there; the new one written under the root's lock
  (sharing.locked), after checking that another process did not rebuild it first. A
  store that cannot be written (read-only) gets the rebuilt manifest in memory only, and
  the line says so.
"""
from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import polars as pl

from specrepro.store.files import table_files
from specrepro.store.integrity import QUARANTINE, damage, first_line, move_aside
from specrepro.store.loaders import load_attempts
from specrepro.store.sharing import ManifestDamaged, locked, read_manifest, write_json

MANIFEST = "manifest.json"
LOST = "params, command, git commit, host, packages, engine argv and start-up facts"


def checked_manifest(root: Path) -> dict[str, Any]:
    """The store's manifest as stored (params references unresolved); rebuilt first where
    the file is damaged, or missing from a store with table files (module docstring)."""
    root = Path(root)
    try:
        manifest = read_manifest(root)
    except ManifestDamaged as err:
        return rebuild(root, err)
    if not (root / MANIFEST).exists() and _has_tables(root):
        return rebuild(root, None)
    return manifest


def _has_tables(root: Path) -> bool:
    return any(table_files(root, t) for t in ("cells", "requests"))


def rebuild(root: Path, damaged: ManifestDamaged | None) -> dict[str, Any]:
    """The manifest rebuilt from the damaged file's whole parts and the cells rows,
    written in place of the damaged or missing one (the damaged one moved to quarantine/),
    with one line on stderr saying what was kept and what was lost."""
    text = damaged.path.read_bytes().decode("utf-8", "replace") if damaged else ""
    kept, quarantined = salvaged(text)
    rows = load_attempts(root)
    known = {s.get("session_id") for s in kept}
    rebuilt = [s for s in from_cells(rows) if s["session_id"] not in known]
    sessions = sorted(kept + rebuilt, key=lambda s: (s.get("started_at") is None,
                                                     str(s.get("started_at"))))
    manifest = {"study": root.parent.name, "run_id": root.name, "sessions": sessions,
                "rebuilt": {"at": _now(), "by": _argv(), "from": "cells rows"
                            + (" and the damaged manifest's whole parts" if damaged else "")}}
    note, moved = "", None
    try:
        with locked(root):
            try:
                current = read_manifest(root) if (root / MANIFEST).exists() else None
            except ManifestDamaged:
                current = None
            if current is not None:  # another process rebuilt it while this one read
                return current
            moved = _write(root, manifest, quarantined, damaged)
    except OSError as err:  # a read-only store: the rebuilt manifest serves this reader
        note = f"; not written ({first_line(err)}): rebuilt again by the next reader"
        manifest["quarantined"] = _listed(root, quarantined)
    kept_text = (f"from its cells rows, as {_n(len(rebuilt), 'session')}" if not damaged else
                 f"{_n(len(kept), 'session')} read whole from the damaged file, "
                 f"{_n(len(rebuilt), 'session')} from their cells rows")
    where = (f"damaged manifest {damaged.path}: {damaged.problem}; "
             + (f"moved to {moved}; " if moved else "left in place; ")
             if damaged else f"{root / MANIFEST} is missing while the store holds "
             f"{_n(rows.height, 'attempt')}; ")
    print(f"specrepro: {where}rebuilt {kept_text} (each arm's profile, engine and engine "
          f"version kept; their {LOST} lost){note}", file=sys.stderr, flush=True)
    return manifest


def _write(root: Path, manifest: dict, quarantined: list[dict],
           damaged: ManifestDamaged | None) -> Path | None:
    """Move the damaged file aside (and record it), list the quarantine folder, write the
    rebuilt manifest; returns where the damaged file went."""
    moved = None
    if damaged is not None and damaged.path.exists():
        moved = move_aside(damaged.path, root / QUARANTINE, MANIFEST)
        quarantined = [*quarantined, {"file": MANIFEST, "moved_to": str(moved.relative_to(root)),
                                      "problem": damaged.problem, "at": _now(), "by": _argv()}]
    manifest["quarantined"] = _listed(root, quarantined)
    write_json(manifest, root / MANIFEST)
    return moved


def salvaged(text: str) -> tuple[list[dict], list[dict]]:
    """The sessions and quarantine entries a damaged manifest still holds whole: each JSON
    value of its top-level `sessions` and `quarantined` lists read in turn up to the first
    that does not parse (write_json writes them at two spaces' indent)."""
    return _list_items(text, "sessions"), _list_items(text, "quarantined")


def _list_items(text: str, key: str) -> list[dict]:
    at = text.find(f'\n  "{key}": [')
    if at < 0:
        return []
    pos, items, decoder = text.index("[", at) + 1, [], json.JSONDecoder()
    while True:
        while pos < len(text) and text[pos] in " \n\r\t,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return items
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return items
        if isinstance(item, dict):
            items.append(item)


def from_cells(rows: pl.DataFrame) -> list[dict]:
    """One session per session id of the cells rows (`unknown` for rows written before
    rows named theirs): its first start, its last end, and an engine entry per arm,
    profile, engine and version, marked `rebuilt` (module docstring)."""
    if not rows.height:
        return []
    rows = rows.with_columns(pl.col("session_id").fill_null("unknown"))
    out = []
    for (sid,), part in rows.group_by(["session_id"], maintain_order=True):
        engines = (part.select("arm", "profile", "engine", "engine_version").unique(
            maintain_order=True).iter_rows(named=True))
        out.append({
            "session_id": sid, "status": "unknown",
            "started_at": _iso(part["started_at"].min()),
            "ended_at": _iso(part["ended_at"].max()), "params": None,
            "engines": [{"arm": e["arm"], "profile": e["profile"], "engine": e["engine"],
                         "version": e["engine_version"], "profile_hash": None,
                         "rebuilt": True} for e in engines],
            "models": [], "probes": [],
            "rebuilt": f"from its {part.height} cells rows; its {LOST} were in the lost "
                       "manifest"})
    return out


def _listed(root: Path, entries: list[dict]) -> list[dict]:
    """The quarantine entries known, plus one for each file in quarantine/ none names."""
    folder = root / QUARANTINE
    named = {e.get("moved_to") for e in entries}
    out = list(entries)
    for f in sorted(folder.iterdir()) if folder.is_dir() else []:
        rel = str(f.relative_to(root))
        if rel in named or not f.is_file():
            continue
        table, _, name = f.name.partition("--")
        problem = (damage(f, table) if table in ("cells", "requests") else None) or \
            "set aside before the manifest was rebuilt (its record was lost)"
        out.append({"file": f"{table}/{name}" if name else f.name, "moved_to": rel,
                    "problem": problem, "at": _iso(dt.datetime.fromtimestamp(
                        f.stat().st_mtime, dt.UTC)), "by": "the manifest's rebuild"})
    return out


def _n(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def _iso(t: Any) -> str | None:
    return t.isoformat() if t is not None else None


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


def _argv() -> str:
    return " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
