"""Acceptance parity between engines serving the same weights: one study's result stores,
matched cell for cell, as four reader tables.

Design:
- Input: two or more stores of one study (`<results_dir>/<study>/<run_id>`), each with a
  name for readers ("vLLM 0.26.0", "embedded"). `load_store` reads a store's ok cells and
  their requests (load_cells / load_requests). One store is the reference, the
  first given or a named one: gaps, ratios and output identity are each other engine's
  against it.
- Matching: cells are matched across stores by cell_key.CELL_KEY (arm, workload,
  concurrency, temperature, repeat), never by cell_id: the id hashes the engine's version
  and profile, so the same cell has another id on every engine. Where a store holds two ok
  cells at one key (the study measured again under changed parameters), the later one
  counts, as finding.stored_cells keeps it, and the acceptance table's notes say so.
- The grid is the union over the stores of arm x level (workload, temperature,
  concurrency), arms in the study's order (the reference store's manifest). A store
  without an arm, or without a level of it, gets a row whose note says which, with its
  figures null: a missing measurement is never shown as a zero.
- Tables (tables.Table: a caption says what rows and cells are; `tables()` builds all four):
  `acceptance` tokens per step per arm x level x engine (mean over repeats, and whether the
  repeats agree exactly), per-position acceptance, and the gap against the reference (%),
  flagged above a threshold (5 %, the issue's target); `identity` per arm x level how many
  prompts' outputs are token-identical to the reference engine's and where the others first
  differ; `invariance` per engine and arm whether outputs repeat run to run, across batch
  size and across arms (greedy speculative decoding is lossless, so on a batch-invariant
  engine every arm reproduces the first arm's text); `speed` throughput and latencies side
  by side, with each engine's ratio to the reference.
- Outputs are compared by token ids, same prompt_id (`compare_outputs`); the first differing
  position counts completion tokens from 0, and an output that is a prefix of the other
  differs at the shorter one's length. Text is not compared (detokenizers join tokens
  differently); a request without token ids is counted apart in the note.
- Words and numbers: headers from tables.NAMES (`tables.name`), a level that does not vary
  moves to the caption (tables.varying_levels), every number through tables.fmt in
  `render` (plain text or Markdown). Gaps are metrics.relative_change_pct, medians
  metrics.percentile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from specrepro import metrics
from specrepro.analysis.finding import cell_key, tables
from specrepro.analysis.finding.tables import Table
from specrepro.store import ResultStore, load_cells, load_requests

GAP_PCT = 5.0  # tokens per step within 5 % of the reference engine's
EARLY = (32, 64)  # "differs before token N": a divergence that early changes most of the text
SPEED = ("agg_tok_s", "ttft_p50_ms", "itl_p50_ms", "itl_request_mean_ms")


class ParityError(ValueError):
    """A store or a reference that cannot be compared; the message names which."""


@dataclass(frozen=True)
class Store:
    """One engine's results of the study: ok cells (one per cell key) and their outputs."""

    name: str
    path: Path
    cells: pl.DataFrame
    outputs: dict[tuple, dict[str, list[int] | None]]  # cell key -> prompt_id -> token ids
    arms: tuple[str, ...]  # the study's arm order, as its manifest has it
    superseded: int  # ok cells left out: an older cell at the same key
    past_eos: int = 0  # outputs that carried tokens after an end-of-text token (cut there)


def _study_arms(path: Path, cells: pl.DataFrame) -> tuple[str, ...]:
    """Arm names in the study's order (latest manifest session that has them), then any
    arm the cells hold beyond it; without a manifest, the cells' order."""
    store = ResultStore(path.parent.parent, path.parent.name, path.name)
    declared: list[str] = []
    for session in reversed(store.manifest().get("sessions", [])):
        arms = (session.get("params") or {}).get("arms")
        if isinstance(arms, list) and all(isinstance(a, dict) and "name" in a for a in arms):
            declared = [a["name"] for a in arms]
            break
    return tuple(dict.fromkeys([*declared, *cells["arm"].to_list()]))


def until_eos(ids: list[int] | None, eos: frozenset[int]) -> tuple[list[int] | None, bool]:
    """The output up to and including its first end-of-text token, and whether anything
    followed it (SGLang 0.5.14 under speculation returns the accepted tokens of the verify
    step past the end of text in `output_ids`; its text stops at the end)."""
    if ids is None or not eos:
        return ids, False
    for i, t in enumerate(ids):
        if t in eos:
            return ids[:i + 1], i + 1 < len(ids)
    return ids, False


def load_store(name: str, path: Path | str, eos: Sequence[int] = ()) -> Store:
    """A store's ok cells and outputs, each output cut after its first token of `eos` (the
    model's end-of-text ids; none: kept whole); ParityError names the path where there are
    no cells."""
    path = Path(path)
    if not path.is_dir():
        raise ParityError(f"{path}: no such directory (expected <results_dir>/<study>/<run_id>)")
    ok = load_cells(path)
    if not ok.height:
        raise ParityError(f"{path}: holds no ok cells")
    runs = ok.select("study", "run_id").unique().rows()
    if len(runs) > 1:  # a folder above the run: cells of other studies would match keys
        raise ParityError(f"{path}: holds {len(runs)} runs ({', '.join(map('/'.join, runs))}); "
                          "give one <results_dir>/<study>/<run_id>")
    cells = (ok.sort("ended_at", nulls_last=False)
             .group_by(cell_key.CELL_KEY, maintain_order=True).last()
             .sort([*cell_key.CELL_KEY]))
    reqs = load_requests(path, cells).join(
        cells.select("cell_id", "attempt", *cell_key.CELL_KEY), on=["cell_id", "attempt"])
    outputs: dict[tuple, dict[str, list[int] | None]] = {}
    ends, past = frozenset(eos), 0
    for r in reqs.select(*cell_key.CELL_KEY, "prompt_id", "token_ids").iter_rows(named=True):
        ids, cut = until_eos(r["token_ids"], ends)
        past += cut
        outputs.setdefault(cell_key.key_of(r), {})[r["prompt_id"]] = ids
    return Store(name, path, cells, outputs, _study_arms(path, cells), ok.height - cells.height,
                 past)


def load_stores(specs: Sequence[str], eos: Sequence[int] = ()) -> list[Store]:
    """Stores from NAME=PATH specs (the scripts' --store), two or more, names distinct;
    ParityError names the spec that is wrong."""
    stores = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ParityError(f"--store {spec!r}: expected NAME=PATH")
        try:
            stores.append(load_store(name, path, eos))
        except ParityError as err:
            raise ParityError(f"--store {spec!r}: {err}") from None
    if len(stores) < 2:
        raise ParityError(f"--store: two or more are compared, got {len(stores)}")
    if len({s.name for s in stores}) < len(stores):
        raise ParityError(f"--store: names must differ, got {[s.name for s in stores]}")
    return stores


def reference_of(stores: list[Store], reference: str | None) -> Store:
    """The named store, or the first; ParityError lists the names when it is none of them."""
    if reference is None:
        return stores[0]
    for s in stores:
        if s.name == reference:
            return s
    raise ParityError(f"reference {reference!r} is not among the stores' names: "
                      + ", ".join(repr(s.name) for s in stores))


# ----------------------------------------------------------------------- the grid


def _arm_order(stores: list[Store], ref: Store) -> list[str]:
    """The reference study's arms in its order, then any other store's."""
    return list(dict.fromkeys([*ref.arms, *(a for s in stores for a in s.arms)]))


def arm_levels(stores: list[Store], ref: Store) -> list[dict]:
    """Every arm x level any store measured, arms in the reference study's order."""
    rank = {a: i for i, a in enumerate(_arm_order(stores, ref))}
    levels = pl.concat([s.cells.select("arm", *cell_key.READING) for s in stores]).unique()
    return sorted(levels.to_dicts(), key=lambda r: (
        rank.get(r["arm"], len(rank)), *((r[k] is None, r[k] or 0) for k in cell_key.READING)))


def cells_at(store: Store, level: dict) -> pl.DataFrame:
    """The store's cells (every repeat) of one arm at one level."""
    return store.cells.filter(cell_key.at(level))


def _absent(store: Store, arm: str, what: str = "this level") -> str:
    """Why a store has no cells here, in words."""
    if store.cells.filter(pl.col("arm") == arm).height == 0:
        return f"not measured: no arm {arm} in this store"
    return f"not measured: arm {arm} has no cells at {what} in this store"


def reader_table(rows: list[dict], caption: str, keys=cell_key.READING,
                 notes: tuple[str, ...] = ()) -> Table:
    """Rows (with raw level keys) as a reader table: a level that varies is a column named
    as tables does it, a constant one moves to the caption."""
    raw = pl.DataFrame(rows, infer_schema_length=None)
    shown, fixed = tables.varying_levels(raw, keys)
    drop = [k for k in tables.LEVEL_COLUMNS if k in raw.columns and k not in shown]
    frame = raw.drop(drop).rename({k: tables.LEVEL_COLUMNS[k] for k in shown})
    return Table(frame, tables.with_fixed(caption, fixed), notes)


def level_of(level: dict) -> dict:
    """An arm-at-a-level's level alone, in the order readers see it."""
    return {k: level[k] for k in cell_key.READING}


# ----------------------------------------------------------------- acceptance


def _per_position(lists: list) -> list[float] | None:
    """Mean over repeats of each draft position's acceptance, in % (stored as fractions);
    None where the engine counts no positions (SGLang 0.5.14)."""
    have = [xs for xs in lists if xs is not None]
    if not have:
        return None
    return [100.0 * sum(col) / len(col) for col in zip(*have, strict=False)]


def acceptance_table(stores: list[Store], reference: str | None = None,
                     threshold_pct: float = GAP_PCT) -> Table:
    """Tokens per step per arm x level x engine, per position, and the gap (%) against the
    reference engine, flagged where its size is above threshold_pct."""
    ref = reference_of(stores, reference)
    tps, gap = tables.name("acceptance_length"), f"gap against {ref.name} (%)"
    flag = f"gap above {tables.fmt(threshold_pct)} %"
    rows = []
    for level in arm_levels(stores, ref):
        ref_at = cells_at(ref, level)["acceptance_length"].drop_nulls()
        ref_mean = ref_at.mean() if ref_at.len() else None
        for s in stores:
            at = cells_at(s, level)
            vals = at["acceptance_length"].drop_nulls().to_list()
            mean = sum(vals) / len(vals) if vals else None
            note = ("reference" if s is ref else "") if at.height else _absent(s, level["arm"])
            if at.height and not vals:
                note = "the engine reported no tokens per step"
            elif at.height and s is not ref and not cells_at(ref, level).height:
                note = f"{ref.name}: " + _absent(ref, level["arm"])
            elif at.height and s is not ref and ref_mean is None:
                note = f"{ref.name} reported no tokens per step here"
            g = None if s is ref else metrics.relative_change_pct(mean, ref_mean)
            rows.append({
                "arm": level["arm"], **level_of(level), "engine": s.name,
                "repeats": at.height or None, tps: mean,
                "repeats agree exactly": len(set(vals)) == 1 if len(vals) > 1 else None,
                tables.name("acceptance_rate_pos"):
                    _per_position(at["per_position_acceptance"].to_list()),
                gap: g, flag: None if g is None else abs(g) > threshold_pct, "note": note})
    notes = tuple(f"{s.name}: {s.superseded} older ok cell(s) at a key measured again left "
                  "out" for s in stores if s.superseded)
    return reader_table(rows, f"Tokens per step per arm, level and engine: mean over repeats, "
                        f"whether the repeats agree exactly, acceptance at each draft position "
                        f"(mean over repeats), and the gap of the mean against {ref.name}'s "
                        f"(flagged above {tables.fmt(threshold_pct)} %)", notes=notes)


# ------------------------------------------------------------------- outputs


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first completion-token position (from 0) where two outputs differ; the shorter
    one's length where one is a prefix of the other; None where they are identical."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


DIFF_COLUMNS = ("prompts compared", "token-identical",
                "first difference, median (token position)",
                "first difference, earliest (token position)",
                *(f"differing before token {n}" for n in EARLY))


def compare_outputs(a: dict[str, list[int] | None] | None,
                    b: dict[str, list[int] | None] | None) -> tuple[dict, str]:
    """Two cells' outputs, prompt by prompt (same prompt_id): the DIFF_COLUMNS figures and a
    note on what could not be compared."""
    if a is None or b is None:
        return dict.fromkeys(DIFF_COLUMNS), ""
    common = [p for p in a if p in b]
    no_ids = [p for p in common if a[p] is None or b[p] is None]
    diffs = [first_difference(a[p], b[p]) for p in common if p not in no_ids]
    where = [d for d in diffs if d is not None]
    notes = []
    if unmatched := len(set(a) ^ set(b)):
        notes.append(f"{unmatched} prompt(s) in one cell only")
    if no_ids:
        notes.append(f"{len(no_ids)} prompt(s) without token ids")
    figures = dict(zip(DIFF_COLUMNS, (
        len(diffs) or None, sum(d is None for d in diffs) if diffs else None,
        metrics.percentile(where, 50), min(where) if where else None,
        *((sum(d < n for d in where) if diffs else None) for n in EARLY)), strict=True))
    return figures, "; ".join(notes)


def outputs_at(store: Store, arm: str, level: dict, repeat: int = 0):
    return store.outputs.get(cell_key.key_of({**level, "arm": arm, "repeat": repeat}))


def identity_table(stores: list[Store], reference: str | None = None) -> Table:
    """Per arm x level and engine: prompts whose repeat-0 output is token-identical to the
    reference engine's, and where the others first differ."""
    ref = reference_of(stores, reference)
    rows = []
    for level in arm_levels(stores, ref):
        mine = outputs_at(ref, level["arm"], level)
        for s in stores:
            if s is ref:
                continue
            theirs = outputs_at(s, level["arm"], level)
            figures, note = compare_outputs(theirs, mine)
            if theirs is None:
                note = _absent(s, level["arm"], "this level, repeat 0")
            elif mine is None:
                note = f"{ref.name}: " + _absent(ref, level["arm"], "this level, repeat 0")
            rows.append({"arm": level["arm"], **level_of(level), "engine": s.name, **figures,
                         "note": note})
    return reader_table(rows, f"Outputs token-identical to {ref.name}'s, per arm, level and engine "
                        "(same prompt, repeat 0), and where the others first differ (completion "
                        "token position from 0)", notes=eos_notes(stores))


def eos_notes(stores: list[Store]) -> tuple[str, ...]:
    """One note per store whose outputs went on past an end-of-text token."""
    return tuple(f"{s.name}: {s.past_eos} output(s) carried tokens after the end-of-text "
                 "token; compared up to it" for s in stores if s.past_eos)


def invariance_table(stores: list[Store], reference: str | None = None) -> Table:
    """Per engine and arm: outputs repeat 0 against repeat 1 at each level (where some
    store measured a repeat 1), the highest level against the lowest (repeat 0; where the
    study has two levels; the engine's own highest and lowest where it measured two), and
    each arm against the study's first arm (the reference
    store's) at the lowest level (repeat 0)."""
    ref = reference_of(stores, reference)
    first = _arm_order(stores, ref)[0]
    grid = arm_levels(stores, ref)
    arms = list(dict.fromkeys(lv["arm"] for lv in grid))
    rows = []

    def row(s: Store, arm: str, level: dict, comparison: str, a, b, missing: str) -> None:
        figures, note = compare_outputs(a, b)
        rows.append({"engine": s.name, "arm": arm, **level_of(level), "comparison": comparison,
                     **figures, "note": note if a is not None and b is not None else missing})

    for s in stores:
        for arm in arms:
            mine = [lv for lv in grid if lv["arm"] == arm]
            for lv in mine:
                if all(outputs_at(x, arm, lv, 1) is None for x in stores):
                    continue  # the study measured this level once: no repeat to compare
                n = tables.streams(lv["concurrency"])
                row(s, arm, lv, f"repeat 1 against repeat 0 at {n}", outputs_at(s, arm, lv, 1),
                    outputs_at(s, arm, lv, 0),
                    _absent(s, arm, f"{n}, repeat 0 and 1"))
            for wl, t in dict.fromkeys((lv["workload"], lv["temperature"]) for lv in mine):
                conc = sorted({lv["concurrency"] for lv in grid
                               if (lv["workload"], lv["temperature"]) == (wl, t)})
                # this engine's own highest and lowest level where it measured two: a
                # store that stopped short still shows its batch invariance
                have = [c for c in conc if outputs_at(s, arm, {"workload": wl, "temperature": t,
                                                             "concurrency": c}) is not None]
                conc = have if len(have) >= 2 else conc
                lo, hi = ({"workload": wl, "temperature": t, "concurrency": c}
                          for c in (conc[0], conc[-1]))
                if len(conc) >= 2:  # one batch size measured: nothing to compare across
                    row(s, arm, {**lo, "concurrency": None},
                        f"{tables.streams(hi['concurrency'])} against "
                        f"{tables.streams(lo['concurrency'])}, repeat 0",
                        outputs_at(s, arm, hi), outputs_at(s, arm, lo),
                        _absent(s, arm, f"{tables.streams(lo['concurrency'])} and "
                                        f"{tables.streams(hi['concurrency'])}, repeat 0"))
                if arm != first:
                    row(s, arm, {**lo, "concurrency": None},
                        f"against {first} at {tables.streams(lo['concurrency'])}, repeat 0",
                        outputs_at(s, arm, lo), outputs_at(s, first, lo),
                        _absent(s, arm if outputs_at(s, arm, lo) is None else first,
                                f"{tables.streams(lo['concurrency'])}, repeat 0"))
    return reader_table(rows, "Outputs token-identical within each engine, per arm: repeat to "
                        "repeat, across batch size, and against the first arm (greedy "
                        f"speculative decoding is lossless, so every arm should give {first}'s "
                        "text on a batch-invariant engine); first differences in completion "
                        "tokens from 0", keys=("workload", "temperature"))


# ---------------------------------------------------------------------- speed


def ratio(new: float | None, old: float | None) -> float | None:
    """One engine's mean over the reference's: a comparison of two stored figures, not a
    metric (the figures themselves are metrics.py's)."""
    return None if new is None or old is None or old == 0 else new / old


def mean_of(frame: pl.DataFrame, column: str) -> float | None:
    vals = frame[column].drop_nulls()
    return vals.mean() if vals.len() else None


def speed_table(stores: list[Store], reference: str | None = None) -> Table:
    """Per arm x level and engine: throughput, median time to first token and both
    inter-token latencies, each as mean (min-max) over repeats (tables.spread_of), and each
    mean's ratio to the reference engine's."""
    ref = reference_of(stores, reference)
    rows = []
    for level in arm_levels(stores, ref):
        ref_at = cells_at(ref, level)
        for s in stores:
            at = cells_at(s, level)
            row = {"arm": level["arm"], **level_of(level), "engine": s.name,
                   "repeats": at.height or None,
                   **{tables.name(v): tables.spread_of(at[v].to_list(), with_n=False)
                      for v in SPEED}}
            for v in SPEED:
                row[f"{tables.NAMES[v][0]} over {ref.name}'s (ratio)"] = (
                    None if s is ref else ratio(mean_of(at, v), mean_of(ref_at, v)))
            row["note"] = ("reference" if s is ref else "") if at.height else _absent(
                s, level["arm"])
            rows.append(row)
    return reader_table(rows, "Speed per arm, level and engine: each figure's mean (min-max) over "
                        f"repeats, and each engine's mean over {ref.name}'s (a ratio)")


def tables_for(stores: list[Store], reference: str | None = None,
               threshold_pct: float = GAP_PCT) -> dict[str, Table]:
    """The four tables, by name."""
    if len(stores) < 2:
        raise ParityError(f"parity needs two stores or more, got {len(stores)}")
    names = [s.name for s in stores]
    if len(set(names)) != len(names):
        raise ParityError(f"store names must differ, got {names}")
    reference_of(stores, reference)  # fail before building anything
    return {"acceptance": acceptance_table(stores, reference, threshold_pct),
            "identity": identity_table(stores, reference),
            "invariance": invariance_table(stores, reference),
            "speed": speed_table(stores, reference)}


# -------------------------------------------------------------------- rendering


def _text(value) -> str:
    if isinstance(value, dict) and "mean" in value:  # tables.spread_of, as show.py writes it
        lo, hi = value["min"], value["max"]
        if value["mean"] is None:
            return tables.fmt(None)
        extra = [] if lo is None or lo == hi else [
            f"{tables.fmt(lo)}{chr(0x2013) if lo >= 0 else ' to '}{tables.fmt(hi)}"]
        if value.get("n") is not None:
            extra.append(f"n={value['n']}")
        return tables.fmt(value["mean"]) + (f" ({', '.join(extra)})" if extra else "")
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(tables.fmt(v) for v in value)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return tables.fmt(None)
    if isinstance(value, int | float):
        return tables.fmt(value)
    return str(value)


def render(table: Table, markdown: bool = False) -> str:
    """A table as aligned plain text or a Markdown table, its caption above and notes
    below; every number in tables.fmt's format, lists joined by commas, n/a for null."""
    head = list(table.frame.columns)
    body = [[_text(v) for v in row] for row in table.frame.rows()]
    numeric = [table.frame[c].dtype.is_numeric() or isinstance(table.frame[c].dtype, pl.Struct)
               for c in head]  # numbers and spreads align right
    if markdown:
        lines = ["| " + " | ".join(head) + " |",
                 "| " + " | ".join("---:" if n else "---" for n in numeric) + " |",
                 *("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in body)]
    else:
        width = [max(len(x) for x in [h, *(r[i] for r in body)]) for i, h in enumerate(head)]

        def line(cells):
            return "  ".join(c.rjust(w) if n else c.ljust(w)
                             for c, w, n in zip(cells, width, numeric, strict=True)).rstrip()

        lines = [line(head), line(["-" * w for w in width]), *(line(r) for r in body)]
    notes = [f"Note: {n}" for n in table.notes]
    return "\n".join([table.caption, "", *lines, *([""] + notes if notes else [])])
