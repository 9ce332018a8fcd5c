"""What the stores measured that the planner costs with: engine starts and cell seconds.

Design:
- Two measured constants are stored by every run (runner.py): each engine start's
  seconds to ready (`ready_s` of a session's `engines` entry in the manifest, with the
  arm's `profile`, `profile_hash`, `engine` and `version`), and each attempt's wall span
  (`ended_at - started_at` of its cells row, with its profile, engine, workload, level,
  temperature and `timing`). `read_stores(dirs)` reads both back from any folder that
  holds stores (a results dir, a study's folder, a run's), each store once however many
  of the folders hold it.
- A start is counted once: an entry that rode on another arm's launch (`shared_launch`:
  another study's, or another arm of the same study) repeats that launch's `ready_s`,
  and one that failed (`error`) or attached (`ready_s` null) timed no start.
- A cell is counted where it was measured: a copy filed from another study's attempt
  (`shared_from`, harness/shared_cells.py) carries the measured attempt's times, so it is
  left out of `cells` (it cost nothing) and kept apart in `copies`: it is still a cell the
  study holds, which the planner must not plan (and file) again. `status` is kept: a constant reads `ok` attempts only, the
  spent time (harness/plan_spent.py) every attempt, since a failed or interrupted one
  spent its seconds too.
- `before` keeps what was stored before an instant only: the costs a plan had before a
  lease, to set beside what the lease spent.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specrepro.store import ResultStore, load_attempts


@dataclass(frozen=True)
class StoredStart:
    """One engine start a manifest recorded."""

    study: str
    arm: str
    profile: str
    profile_hash: str
    engine: str
    ready_s: float
    session: str  # the manifest session
    session_at: dt.datetime  # when that session began
    host: str  # the machine: its boot id where recorded, else its hostname
    # (a first start is a machine's; leased machines may all be named "vm")
    launch: int | None  # its ordinal in its command, where recorded
    root: Path  # the store


@dataclass(frozen=True)
class StoredCell:
    """One attempt of a cell, as its cells row says (its wall span in `seconds`)."""

    study: str
    arm: str
    profile: str
    engine: str
    method: str | None
    schedule: str | None  # the draft schedule as JSON, where the arm has one
    workload: str
    n_prompts: int | None
    concurrency: int
    temperature: float | None
    top_p: float | None
    top_k: int | None
    repeat: int | None
    seed: int | None
    timing: str | None  # "window", "requests"; null in cells stored before 2026-12-04
    status: str
    seconds: float
    started_at: dt.datetime
    output_tokens: int | None
    n_requests: int | None
    session: str | None
    root: Path  # the store


@dataclass
class Stored:
    """Every start and attempt the folders hold (module docstring)."""

    starts: list[StoredStart] = field(default_factory=list)
    cells: list[StoredCell] = field(default_factory=list)
    roots: list[Path] = field(default_factory=list)  # the stores read
    copies: list[StoredCell] = field(default_factory=list)  # filed from another study's cell

    def before(self, when: dt.datetime | None) -> Stored:
        """What was stored before `when` (all of it where None)."""
        if when is None:
            return self
        return Stored([s for s in self.starts if s.session_at < when],
                      [c for c in self.cells if c.started_at < when], self.roots,
                      [c for c in self.copies if c.started_at < when])

    def since(self, when: dt.datetime | None) -> Stored:
        """What was stored at `when` or after (all of it where None)."""
        if when is None:
            return self
        return Stored([s for s in self.starts if s.session_at >= when],
                      [c for c in self.cells if c.started_at >= when], self.roots,
                      [c for c in self.copies if c.started_at >= when])

    def ok_measured(self) -> list[StoredCell]:
        """The ok attempts: what a cell constant is read from (copies are not stored here)."""
        return [c for c in self.cells if c.status == "ok"]

    def ok_held(self) -> list[StoredCell]:
        """The ok attempts a study's store holds, measured there or filed from another's:
        the cells that are done."""
        return [c for c in self.cells + self.copies if c.status == "ok"]

    def within(self, roots: set[Path]) -> Stored:
        """What the stores in `roots` hold."""
        return Stored([s for s in self.starts if s.root in roots],
                      [c for c in self.cells if c.root in roots], sorted(roots),
                      [c for c in self.copies if c.root in roots])


def store_roots(dirs: Iterable[Path | str]) -> list[Path]:
    """Every store (`<results>/<study>/<run_id>/` with a manifest) under the folders given,
    each once, in a stable order."""
    seen: dict[Path, None] = {}
    for d in dirs:
        d = Path(d)
        if not d.is_dir():
            continue
        found = [d / "manifest.json"] if (d / "manifest.json").is_file() else []
        found += sorted(p for p in d.rglob("*/manifest.json")
                        if "quarantine" not in p.parts and ".engines" not in p.parts)
        for manifest in found:
            seen.setdefault(manifest.parent.resolve(), None)
    return list(seen)


def _when(text: str | None) -> dt.datetime:
    if not text:
        return dt.datetime.min.replace(tzinfo=dt.UTC)
    when = dt.datetime.fromisoformat(text)
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def read_starts(root: Path) -> list[StoredStart]:
    """The engine starts one store's manifest recorded (module docstring: each once)."""
    store = ResultStore(root.parent.parent, root.parent.name, root.name)
    out = []
    for session in store.manifest().get("sessions", []):
        info = session.get("host") or {}
        host = info.get("boot_id") or info.get("hostname") or ""
        for eng in session.get("engines") or []:
            ready = eng.get("ready_s")
            if ready is None or eng.get("error") or eng.get("shared_launch"):
                continue
            out.append(StoredStart(
                study=store.study, arm=eng.get("arm") or "", profile=eng.get("profile") or "",
                profile_hash=eng.get("profile_hash") or "", engine=eng.get("engine") or "", ready_s=float(ready),
                session=session.get("session_id") or "", session_at=_when(session.get("started_at")),
                host=host, launch=eng.get("launch"), root=root))
    return out


def read_cells(root: Path, *, copies: bool = False) -> list[StoredCell]:
    """One store's attempts that were measured there, with their wall spans; with `copies`,
    the ones filed there from another study's attempt instead (module docstring)."""
    rows = load_attempts(root)
    out = []
    for r in rows.iter_rows(named=True):
        if bool(r.get("shared_from")) != copies or r["started_at"] is None or r["ended_at"] is None:
            continue
        out.append(StoredCell(
            study=r["study"] or root.parent.name, arm=r["arm"] or "", profile=r["profile"] or "",
            engine=r["engine"] or "", method=r["method"], schedule=r["schedule"],
            workload=r["workload"] or "",
            n_prompts=r["n_prompts"], concurrency=r["concurrency"] or 0,
            temperature=r["temperature"], top_p=r["top_p"], top_k=r["top_k"],
            repeat=r["repeat"], seed=r["seed"], timing=r["timing"], status=r["status"],
            seconds=(r["ended_at"] - r["started_at"]).total_seconds(),
            started_at=r["started_at"], output_tokens=r["output_tokens"],
            n_requests=r["n_requests"], session=r["session_id"], root=root))
    return out


def read_stores(dirs: Sequence[Path | str]) -> Stored:
    """Every start and attempt stored under the folders (module docstring)."""
    stored = Stored()
    for root in store_roots(dirs):
        stored.roots.append(root)
        stored.starts += read_starts(root)
        stored.cells += read_cells(root)
        stored.copies += read_cells(root, copies=True)
    return stored
