"""Cells that several studies of one command share: measured once, filed under each.

Design:
- Two studies often ask for the same measurement: 06 and 07 both time no speculation and
  the block drafter at 7 drafts on essays at 1, 8, 32 and 128 streams, on the same engine
  start (launch_plan.launch_groups). Where two cells have one `identity.shared_key` (the
  cell's identity less its arm's name: same resolved profile, workload, level, sampling,
  repeat, seed, engine version and measurement settings), the command measures the first
  one it meets and files a copy of that attempt under every other study that asks for it:
  the cells row with the study's own cell id, arm name and `shared_from`
  (`<study>/<cell_id>` of the measured attempt). Power, energy and the window's counters
  come with it, so 07's bill reads the windows 06 timed.
- The row is an attempt of its own in the receiving store; its requests are not copied
  (a windowed 128-stream cell holds some 500 requests with every chunk's timing: 06's
  fourteen cells on the H100 took 1.4 MB, and 07's copies of them as much again). The
  loaders read them from the measured attempt in the sibling store, under the copy's id
  (store.load_requests): the two stores travel and are committed together. The measured
  attempt is never touched. Its `identical_to_baseline` is recomputed
  against the receiving study's own baseline, which may be another arm.
- Sources are the command's stores: what they held when it began (an earlier command's
  cells count) and what it measures as it goes. A cell is looked up under every engine
  version a store of the command has recorded for its profile, since a study that never
  ran the arm has no version of its own before its engine answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import polars as pl

from specrepro import identity
from specrepro.harness.arm_engine import known_version
from specrepro.harness.cells import baseline_requests, identical_share
from specrepro.params import Cell, ResolvedArm
from specrepro.store import REQUEST_SCHEMA

_Run = Any  # runner._Run: a study of the command, its store and its done cells

# columns of a copied cells row that are the receiving store's, not the measured attempt's
OWN_COLUMNS = ("study", "run_id", "session_id", "attempt", "cell_id", "arm")


class SharedCells:
    """The command's measured cells by shared key (module docstring)."""

    def __init__(self, ctxs: Sequence[_Run]):
        self.ctxs = list(ctxs)
        self.by_key: dict[str, tuple[_Run, str]] = {}  # shared key -> (its study, cell id)
        self.filed: set[str] = set()  # the cell ids this command filed as copies
        for ctx in self.ctxs:
            for arm in ctx.study.arms:
                version = known_version(ctx.store, arm)
                for cell in (c for c in ctx.study.cells() if c.arm.name == arm.name):
                    cid = ctx.cid(cell, version)
                    if cid in ctx.done:
                        self.add(ctx, cell, cid, version)

    def add(self, ctx: _Run, cell: Cell, cid: str, version: str | None) -> None:
        """A cell of `ctx` with an ok attempt: a source for the other studies."""
        self.by_key.setdefault(identity.shared_key(ctx.study, cell, version), (ctx, cid))

    def versions(self, arm: ResolvedArm) -> list[str | None]:
        """Every engine version a store of the command recorded for the arm's profile."""
        want = identity.profile_hash(arm.resolved)
        out: list[str | None] = []
        for ctx in self.ctxs:
            for other in ctx.study.arms:
                if identity.profile_hash(other.resolved) == want:
                    v = ctx.versions.get(other.name) or known_version(ctx.store, other)
                    if v not in out:
                        out.append(v)
        return out

    def fill(self, ctx: _Run, arm: ResolvedArm, cells: Sequence[Cell],
             version: str | None) -> int:
        """Copy into `ctx`'s store every cell of `cells` it lacks that another study of
        the command has measured; returns how many. `version`: the arm's engine version
        where known (a live engine's, or the one its store recorded): only cells of that
        version are its cells; else each version a store of the command recorded is tried."""
        tried = [version] if version is not None else self.versions(arm)
        n = 0
        for cell in cells:
            for v in tried:
                cid = ctx.cid(cell, v)
                if cid in ctx.done:
                    break
                source = self.by_key.get(identity.shared_key(ctx.study, cell, v))
                if source is None or source[0] is ctx:
                    continue
                self.copy(source, ctx, cell, cid)
                ctx.done.add(cid)
                self.filed.add(cid)
                n += 1
                break
        return n

    def copy(self, source: tuple[_Run, str], ctx: _Run, cell: Cell, cid: str) -> None:
        """File the source's ok attempt under `ctx` as cell `cid` of arm `cell.arm`."""
        src, src_cid = source
        cells = src.store.load_cells().filter(pl.col("cell_id") == src_cid)
        row = cells.row(0, named=True)
        reqs = src.store.load_requests().filter((pl.col("cell_id") == src_cid)
                                                & (pl.col("attempt") == row["attempt"]))
        requests = [{k: v for k, v in r.items() if k in REQUEST_SCHEMA
                     and k not in ("cell_id", "attempt")} for r in reqs.iter_rows(named=True)]
        out = {k: v for k, v in row.items() if k not in OWN_COLUMNS}
        out.update(cell_id=cid, arm=cell.arm.name, shared_from=f"{src.study.name}/{src_cid}")
        note = (f"measured once for {src.study.name} (arm {row['arm']!r}, cell {src_cid}) "
                "and shared: the same profile, workload, level, sampling, repeat and seed")
        out["warnings"] = [*(row["warnings"] or []), note]
        records = [SimpleNamespace(ok=r["error"] is None, prompt_id=r["prompt_id"],
                                   seed=r["seed"], token_ids=r["token_ids"], text=r["text"])
                   for r in requests]
        out["identical_to_baseline"] = identical_share(
            records, baseline_requests(ctx.store, ctx.study, cell))
        # the requests stay in the measured attempt's store: the loaders read them from
        # there for this cell (store.load_requests), so a shared cell costs no second copy
        ctx.store.append_cell(out, [])
