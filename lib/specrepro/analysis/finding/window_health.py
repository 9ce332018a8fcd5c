"""Whether a cell's window was healthy and its warnings its own, and the one mark that says not.

Design:
- A steady window (harness/steady.py) stores what it saw: `window_all_busy` (every stream
  busy over it; its warnings say why not), `window_turnovers_min` (the fewest requests a
  stream completed inside it) and `window_requests` (all streams); the harness adds a
  cell's other caveats to its `warnings`. This module is the one place that judges them:
  `marks_of` gives a cell's marks, `with_health` stores them on a finding's cells as the
  `health` column, beside `own_warnings` (its warnings less those every cell of the finding
  carries), once, where a finding's cells are read (finding.from_store); the rest reads
  those two columns:
  - "window not steady": `window_all_busy` is false (a ramp-up not over, a stream idle,
    the engine running fewer requests than streams): its rate is not the steady one;
  - "window cut short": it closed at `max_window_s` with a stream that completed fewer
    requests inside it than the study's `turnovers`;
  - "warned": a warning that not every cell of the finding carries. One that every cell
    carries (no NVML on a CPU run) qualifies the finding, not a cell: the report says it
    once (`common_warnings`, show.show_header) and marks no figure with it. A cell's own
    window warnings (harness/steady.window_fields', worded "window ...") are its window
    marks, not a "warned" too.
  Cells stored before windows, or timed by every prompt once, carry null window columns and
  no window mark.
- One display: a figure averaged over runs carries its cells' marks after its number, in
  brackets, as the loop mark does ("window not steady in 1 of 3 runs"; `flag`, through
  tables.flagged), and a table that shows a marked figure says under it what each mark
  means and which cells carry it, with their warnings' text (`notes`). A check that read
  a marked cell names the marks in its reason (`reason`, analysis/verdict/verdicts.py); its
  outcome stands: a window that was not steady is said beside the figure, never dropped.
"""

from __future__ import annotations

import polars as pl

MARKS = {
    "window not steady": (
        "not every stream was busy over the cell's steady window (a ramp-up not over, a "
        "stream idle inside it, or the engine running fewer requests than streams: "
        "harness/steady.py): its rate is not the steady one"),
    "window cut short": (
        "the window closed at max_window_s before every stream completed the requests "
        "inside it that the study's window declares (`turnovers`)"),
    "warned": "the cell carries a warning that not every cell of this finding carries",
}
WINDOW_WORDS = "window "  # how harness/steady.window_fields words a window's own warnings
HEALTH = "health"  # the column `with_health` adds: a cell's marks, MARKS' keys in order
OWN = "own_warnings"  # and the cell's warnings that not every cell of its finding carries


def _warnings(row: dict) -> list[str]:
    return list(row.get("warnings") or [])


def common_warnings(cells: pl.DataFrame) -> list[str]:
    """The warnings every cell carries (in the first cell's order): said once, never a mark."""
    if not cells.height or "warnings" not in cells.columns:
        return []
    rows = [_warnings(r) for r in cells.select("warnings").iter_rows(named=True)]
    return [w for w in dict.fromkeys(rows[0]) if all(w in r for r in rows[1:])]


def marks_of(row: dict, turnovers: int | None, common: list[str] = ()) -> list[str]:
    """A cell's marks (module docstring), in MARKS' order; `turnovers`: the study window's,
    None where the study has no window (no window mark can be judged)."""
    marks = []
    if row.get("window_all_busy") is False:
        marks.append("window not steady")
    least = row.get("window_turnovers_min")
    if turnovers is not None and least is not None and least < turnovers:
        marks.append("window cut short")
    own = [w for w in _warnings(row) if w not in common]
    if [w for w in own if not (marks and w.startswith(WINDOW_WORDS))]:
        marks.append("warned")
    return marks


def with_health(cells: pl.DataFrame, study) -> pl.DataFrame:
    """A finding's cells with the `health` column: each cell's marks (empty: healthy).
    `study` is the finding's (its window's `turnovers`)."""
    window = getattr(study, "window", None)
    turnovers = window.turnovers if window is not None else None
    common = common_warnings(cells)
    rows = list(cells.iter_rows(named=True))
    marks = [marks_of(r, turnovers, common) for r in rows]
    own = [[w for w in _warnings(r) if w not in common] for r in rows]
    return cells.with_columns(pl.Series(HEALTH, marks, dtype=pl.List(pl.String)),
                              pl.Series(OWN, own, dtype=pl.List(pl.String)))


def _marks(cells: pl.DataFrame) -> list[list[str]]:
    if HEALTH not in cells.columns:  # a frame built by hand: nothing judged, nothing marked
        return [[] for _ in range(cells.height)]
    return [m or [] for m in cells[HEALTH].to_list()]


def flag(cells: pl.DataFrame) -> str | None:
    """The marks of a figure averaged over `cells` (its runs): 'window not steady' where
    every run carries it, 'window not steady in 1 of 3 runs' where some do, several joined
    by '; '; None where no run is marked."""
    per_cell = _marks(cells)
    out = []
    for mark in MARKS:
        k = sum(mark in m for m in per_cell)
        if k:
            out.append(mark if k == len(per_cell) else f"{mark} in {k} of {len(per_cell)} runs")
    return "; ".join(out) or None


def _where(row: dict) -> str:
    """'mtp-k3, humaneval, 8 streams, T=0': a cell's arm and level in words."""
    parts = [row.get("label") or row.get("arm"), row.get("workload")]
    if row.get("concurrency") is not None:
        c = row["concurrency"]
        parts.append(f"{c} stream{'s' if c != 1 else ''}")
    if row.get("temperature") is not None:
        parts.append(f"T={row['temperature']:g}")
    return ", ".join(str(p) for p in parts if p is not None)


def notes(cells: pl.DataFrame) -> tuple[str, ...]:
    """The words under a table whose figures average `cells`: what each mark present means,
    then the marked cells, one line per level and what it says (its runs listed): their
    marks, each window's requests and their own warnings' text ((): no cell is marked)."""
    per_cell = _marks(cells)
    if not any(per_cell):
        return ()
    present = [m for m in MARKS if any(m in marks for marks in per_cell)]
    head = ("; ".join(f"[{m}]: {MARKS[m]}" for m in present)
            + "; a figure averaged over runs says how many of them are marked")
    said: dict[tuple, list[str]] = {}  # (level, marks, window, warnings) -> its runs
    for row, marks in zip(cells.iter_rows(named=True), per_cell, strict=True):
        if not marks:
            continue
        seen = ""
        if row.get("window_requests") is not None:
            seen = (f" (window: {row['window_requests']} requests completed inside it, "
                    f"{row.get('window_turnovers_min')} by the fewest stream)")
        key = (_where(row), ", ".join(marks), seen, " | ".join(row.get(OWN) or []))
        said.setdefault(key, []).append(str(row.get("repeat")))
    lines = [f"{where}, run{'s' if len(runs) > 1 else ''} {', '.join(runs)}: {marks}{seen}"
             + (f": {text}" if text else "")
             for (where, marks, seen, text), runs in said.items()]
    return (head, *lines)


def _side(cells: pl.DataFrame, arm: str, workload: str | None, level: int | None,
          temperature: float | None) -> pl.DataFrame:
    part = cells.filter(pl.col("arm") == arm)
    for col, value in (("workload", workload), ("concurrency", level),
                       ("temperature", temperature)):
        if value is not None:
            part = part.filter(pl.col(col) == value)
    return part


def reason(cells: pl.DataFrame, sides: list[tuple]) -> str:
    """What a check's reason says of the marks on the cells it read ('' where none is
    marked); `sides`: (arm, workload, level, temperature) each side read, None for any."""
    parts = []
    for arm, workload, level, temp in dict.fromkeys(sides):
        marked = flag(_side(cells, arm, workload, level, temp))
        if marked:
            at = f" at {level} stream{'s' if level != 1 else ''}" if level is not None else ""
            parts.append(f"{arm}{at}: {marked}")
    if not parts:
        return ""
    return "it rests on marked cells (see the tables' notes): " + "; ".join(parts)
