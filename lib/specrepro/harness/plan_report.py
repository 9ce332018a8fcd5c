"""A plan as text (`specrepro plan`): per notebook, per lease and command, the totals, the
budget and where every constant came from.

Design: plain text a reader scans in a terminal and pastes into a closing note; figures
carry their units (s, h); a command's line is printed whole, copy-pasteable. The per-
notebook figures are the simulation's events (harness/plan.py) summed by the notebook they
were run for: a start under the notebook whose arm launched it (as the manifest records
it), a copy under the notebook it was filed for, for 0 s. Nothing here computes a cost.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from specrepro.harness.plan import Command, Lease, PlanResult


def secs(s: float) -> str:
    return f"{s:,.0f} s"


def hours(s: float) -> str:
    return f"{s / 3600:.1f} h"


@dataclass
class NotebookRow:
    cells: int = 0
    stored: int = 0
    windowed: int = 0
    shared: int = 0
    planned: int = 0
    starts: int = 0
    start_s: float = 0.0
    cell_s: float = 0.0
    left: int = 0
    ids: set[str] = field(default_factory=set)


def notebook_rows(result: PlanResult, within: set[int] | None = None
                  ) -> dict[str, NotebookRow]:
    """Per notebook: its declared cells (in the plan's steps), those stored, windowed,
    copied, measured, its starts and seconds; `within`: the commands (by id) a budget
    keeps, the others' cells counted as left out."""
    rows: dict[str, NotebookRow] = defaultdict(NotebookRow)
    for w in result.works:
        for cells in w.cells.values():
            for pc in cells:
                row = rows[pc.study.notebook_id]
                if pc.cid in row.ids:
                    continue
                row.ids.add(pc.cid)
                row.cells += 1
                row.windowed += pc.windowed
                row.stored += pc.cid in result.stored.get(pc.study.notebook_id, set())
    for lease in result.leases:
        for cmd in lease.commands:
            kept = within is None or id(cmd) in within
            for e in cmd.events:
                row = rows[e.notebook] if e.notebook else None
                if row is None:
                    continue
                if not kept:
                    row.left += e.kind in ("cell", "copy")
                elif e.kind == "start":
                    row.starts += 1
                    row.start_s += e.s
                elif e.kind == "cell":
                    row.planned += 1
                    row.cell_s += e.s
                elif e.kind == "copy":
                    row.shared += 1
    for pc, _ in result.unplanned:
        rows[pc.study.notebook_id].left += 1
    return rows


def table(header: Sequence[str], rows: Sequence[Sequence[str]], first_left: int = 1) -> list[str]:
    """Columns padded to their widths; the first `first_left` left-aligned, the rest right."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    out = []
    for r in [header, *rows]:
        out.append("  " + "  ".join(str(v).ljust(w) if i < first_left else str(v).rjust(w)
                                    for i, (v, w) in enumerate(zip(r, widths))).rstrip())
    return out


def command_summary(cmd: Command) -> str:
    """What a command measures: per notebook, its arms' cells and copies, its starts."""
    by: dict[str, Counter] = defaultdict(Counter)
    copies: Counter = Counter()
    starts = 0
    for e in cmd.events:
        if e.kind == "cell":
            by[e.notebook][e.pc.cell.arm.name] += 1
        elif e.kind == "copy":
            copies[e.notebook] += 1
        elif e.kind == "start":
            starts += 1
    parts = [f"{nb} ({', '.join(f'{arm} {n}' for arm, n in arms.items())})"
             for nb, arms in by.items()]
    cells = sum(sum(a.values()) for a in by.values())
    extra = ("; shared, filed for 0 s: " + ", ".join(f"{n} for {nb}"
                                                    for nb, n in copies.items())
             if copies else "")
    return (f"{starts} start(s), {cells} cell(s): "
            + ("; ".join(parts) if parts else "no cell") + extra)


def lease_lines(lease: Lease, lease_s: float, first: int, before_s: float) -> list[str]:
    """A lease: its total against a lease's seconds (and the plan's running total), its
    fixed costs, each command with what it measures and its line."""
    fixed = "; ".join(f"{label} {secs(e.s)}{' [placeholder]' if 'PLACEHOLDER' in e.source else ''}"
                      for label, e in lease.fixed)
    bundles = ", then ".join(f"{e}'s" for e in lease.engines)
    out = [(f"Lease {lease.index} ({bundles} bundle{'s' if len(lease.engines) > 1 else ''}): "
            f"{secs(lease.total_s)} of {secs(lease_s)} (plan total through it: "
            f"{secs(before_s + lease.total_s)})"),
           f"  fixed: {fixed}"]
    for i, cmd in enumerate(lease.commands, first):
        if cmd.staged:
            out.append(f"  command {i} ({secs(cmd.device_s)}): {cmd.staged}'s bundle staged on "
                       f"the same machine, no engine up")
            out.append(f"    {cmd.line}")
            continue
        if cmd.work is None:
            names = ", ".join(e.name for e in cmd.exports)
            out.append(f"  command {i} ({secs(cmd.device_s)}): export {names}, no engine up")
            out.append(f"    {cmd.line}")
            continue
        ends = (f"stops early: {cmd.stopped}; the next command resumes (exit 75)"
                if cmd.stopped else "ends with its cells measured")
        exports = (f"; first export {', '.join(e.name for e in cmd.exports)} "
                   f"({secs(sum(e.value for e in cmd.exports))})" if cmd.exports else "")
        note = f" [{cmd.work.step.note}]" if cmd.work.step.note else ""
        out.append(f"  command {i} ({secs(cmd.device_s)}: run {secs(cmd.run_s)} of its "
                   f"{cmd.deadline_s}-s deadline{exports}){note}: {ends}")
        out.append(f"    measures {command_summary(cmd)}")
        out.append(f"    {cmd.line}")
    return out


def budget_lines(result: PlanResult, budget_s: float) -> tuple[list[str], set[int]]:
    """Whether the plan fits the budget, the commands it keeps (whole leases, then the
    first commands of the next one that fit with its fixed costs), what it leaves out."""
    kept: set[int] = set()
    spent = 0.0
    whole, partial = 0, 0
    for lease in result.leases:
        used = sum(e.s for _, e in lease.fixed)
        n = 0
        for cmd in lease.commands:
            if spent + used + cmd.device_s > budget_s:
                break
            used += cmd.device_s
            kept.add(id(cmd))
            n += 1
        if n == len(lease.commands) and spent + used <= budget_s:
            spent += used
            whole += 1
            continue
        if n:
            spent += used
            partial = n
        break
    total = result.total_s
    if total <= budget_s:
        return [(f"Budget {secs(budget_s)}: the plan fits ({secs(total)}, "
                f"{secs(budget_s - total)} left)")], kept
    within = (f"lease(s) 1-{whole}" if whole else "no whole lease") + (
        f" and the first {partial} command(s) of lease {whole + 1}" if partial else "")
    out = [(f"Budget {secs(budget_s)}: the plan does NOT fit: it needs {secs(total)} "
           f"({secs(total - budget_s)} more). Within the budget: {secs(spent)}, {within}; "
           "left out:")]
    rows = notebook_rows(result, kept)
    for nb, row in rows.items():
        if row.left:
            out.append(f"  {nb}: {row.left} of {row.cells} cells")
    return out, kept


def render(result: PlanResult, header: str, lease_s: float, budget_s: float | None,
           constants: list[str]) -> str:
    """The whole plan as text (module docstring)."""
    out = [header, ""]
    rows = notebook_rows(result)
    body = []
    tot = NotebookRow()
    for nb, r in rows.items():
        body.append([nb, r.cells, r.stored, r.windowed, r.shared, r.planned, r.left, r.starts,
                     secs(r.start_s), secs(r.cell_s), secs(r.start_s + r.cell_s)])
        for k in ("cells", "stored", "windowed", "shared", "planned", "left", "starts",
                  "start_s", "cell_s"):
            setattr(tot, k, getattr(tot, k) + getattr(r, k))
    body.append(["total", tot.cells, tot.stored, tot.windowed, tot.shared, tot.planned,
                 tot.left, tot.starts, secs(tot.start_s), secs(tot.cell_s),
                 secs(tot.start_s + tot.cell_s)])
    out.append("Per notebook (estimated GPU seconds: engine starts to ready + cells' "
               "started-to-ended spans)")
    out += table(["notebook", "cells", "stored", "windowed", "shared", "measured", "left out",
                  "starts", "starts s", "cells s", "GPU s"], body)
    out.append("  stored: measured before (not planned again); shared: measured once for "
               "another notebook of the same command and filed here for 0 s; a start is "
               "counted under the notebook whose arm launched it")
    if result.unplanned:
        out.append("  not planned:")
        for pc, why in result.unplanned:
            c = pc.cell
            out.append(f"    {pc.study.notebook_id} {c.arm.name} {c.workload.name} "
                       f"{c.concurrency} streams repeat {c.repeat}: {why}")
    out.append("")
    n_cmd, running = 1, 0.0
    for lease in result.leases:
        out += lease_lines(lease, lease_s, n_cmd, running)
        n_cmd += len(lease.commands)
        running += lease.total_s
        out.append("")
    commands = [c for lease in result.leases for c in lease.commands]
    fixed = sum(e.s for lease in result.leases for _, e in lease.fixed) + sum(
        c.staged_s for c in commands)  # a second bundle staged on a lease's machine
    exports = sum(e.value for c in commands for e in c.exports)
    other = result.total_s - fixed - exports - tot.start_s - tot.cell_s
    out.append(f"Total: {len(result.leases)} lease(s), {len(commands)} command(s), "
               f"{secs(result.total_s)} ({hours(result.total_s)}) of device time: fixed "
               f"{secs(fixed)}, exports {secs(exports)}, engine starts {secs(tot.start_s)}, "
               f"cells {secs(tot.cell_s)}, engine stops, per-command and per-cell overheads "
               f"and time cut by deadlines {secs(other)}")
    if budget_s is not None:
        lines, _ = budget_lines(result, budget_s)
        out += lines
    out += ["", ("Constants (measured: read back from the stores; prior: the suite's plan: "
            "block, with its source)")]
    out += [f"  {line}" for line in constants]
    return "\n".join(out) + "\n"
