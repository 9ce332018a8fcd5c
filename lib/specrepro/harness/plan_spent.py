"""Planned against spent (`specrepro plan SUITE --spent [--since TIME]`): what a lease's
sessions spent on engine starts and cells, beside what the plan estimated for the same.

Design:
- Spent is what the stores recorded of the sessions that began at `since` or later (by
  default every session of the selected studies' stores): each engine start's `ready_s`
  (once per launch: harness/costs.py) and each attempt's `ended_at - started_at` (copies of
  another study's attempt left out: they cost nothing). A failed or interrupted attempt
  spent its seconds too: it is shown as lost, beside the plan's nothing.
- Planned is the plan's figure for the same launches and cells, from the constants stored
  before `since` only (and the `--costs-from` folders', likewise) and the suite's priors:
  the estimate the plan printed before the lease, not one that already read its results.
  A launch gets the first-start penalty where it was the first of its profile (or of its
  machine, as the engine's prior says) on its host among the spent launches. A cell is
  found among its study's declared cells by what it declares (harness/plan.declared);
  one that is no longer declared has no planned figure and says so.
- The lease's fixed costs (machine start, staging, exports), the engine stops and the
  per-command overheads are not in the stores: the report says so, for the closing note
  to set the lease's device time beside the plan's lease total.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Sequence

from specrepro.harness.cost_model import CostModel
from specrepro.harness.costs import Stored
from specrepro.harness.plan import declared
from specrepro.harness.plan_report import secs, table
from specrepro.params import ResolvedStudy


def ratio(spent: float, planned: float) -> str:
    return f"{spent / planned:.2f}" if planned else "-"


def render_spent(studies: Sequence[ResolvedStudy], spent: Stored, costs: CostModel,
                 since: dt.datetime | None, header: str) -> str:
    """The planned-against-spent report (module docstring)."""
    by_name = {st.name: st for st in studies}
    out = [header, ""]
    if since is not None:
        out.append(f"Sessions from {since.isoformat()} on; planned from what was stored before "
                   "then and the suite's priors.")
    # -------------------------------------------------------------- launches
    launches = sorted((s for s in spent.starts if s.study in by_name),
                      key=lambda s: (s.host, s.session_at, s.launch if s.launch is not None else 0))
    seen_profile: set[tuple[str, str]] = set()
    seen_host: set[str] = set()
    per_nb: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    rows = []
    for s in launches:
        st = by_name[s.study]
        arm = next((a for a in st.arms if a.name == s.arm), None)
        planned = None
        if arm is not None:
            est = costs.start(arm.resolved)
            pen, per = costs.first_start(arm.resolved.engine)
            first = (s.host not in seen_host if per == "machine"
                     else (s.host, s.profile_hash) not in seen_profile)
            planned = est.s + (pen.s if first else 0.0)
        seen_host.add(s.host)
        seen_profile.add((s.host, s.profile_hash))
        nb = st.notebook_id
        per_nb[nb]["starts"] += 1
        per_nb[nb]["start_spent"] += s.ready_s
        per_nb[nb]["start_planned"] += planned or 0.0
        rows.append([nb, s.arm, s.profile, secs(s.ready_s),
                     secs(planned) if planned is not None else "not declared",
                     ratio(s.ready_s, planned or 0.0)])
    out.append("Per launch (engine start to ready)")
    out += table(["notebook", "arm", "profile", "spent", "planned", "spent/planned"], rows,
                 first_left=3) if rows else ["  none"]
    # ----------------------------------------------------------------- cells
    cells: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    unmatched = 0
    for c in spent.cells:
        st = by_name.get(c.study)
        if st is None:
            continue
        nb = st.notebook_id
        row = cells[(nb, c.arm)]
        if c.status != "ok":
            row["lost"] += c.seconds
            per_nb[nb]["lost"] += c.seconds
            continue
        want = (c.arm, c.profile, c.workload, c.concurrency, c.temperature, c.top_p, c.top_k,
                c.repeat, c.seed)
        cell = next((x for x in st.cells() if declared(x) == want), None)
        row["n"] += 1
        row["spent"] += c.seconds
        per_nb[nb]["cells"] += 1
        per_nb[nb]["cell_spent"] += c.seconds
        if cell is None:
            unmatched += 1
            row["unplanned"] += 1
            continue
        est = costs.cell(st, cell).s
        row["planned"] += est
        per_nb[nb]["cell_planned"] += est
    out += ["", ("Per notebook and arm (cells, started to ended; lost: failed or interrupted "
            "attempts)")]
    out += table(["notebook", "arm", "cells", "spent", "planned", "spent/planned", "lost"],
                 [[nb, arm, int(r["n"]), secs(r["spent"]), secs(r["planned"]),
                   ratio(r["spent"], r["planned"]), secs(r["lost"])]
                  for (nb, arm), r in sorted(cells.items())], first_left=2) \
        if cells else ["  none"]
    if unmatched:
        out.append(f"  {unmatched} ok attempt(s) match no cell the study declares now: "
                   "spent, with no planned figure")
    # --------------------------------------------------------------- totals
    out += ["", "Per notebook (GPU seconds: starts + cells + lost)"]
    body, tot = [], defaultdict(float)
    for nb, r in sorted(per_nb.items()):
        planned = r["start_planned"] + r["cell_planned"]
        spent_s = r["start_spent"] + r["cell_spent"] + r["lost"]
        body.append([nb, int(r["starts"]), secs(r["start_spent"]), secs(r["start_planned"]),
                     int(r["cells"]), secs(r["cell_spent"]), secs(r["cell_planned"]),
                     secs(r["lost"]), secs(spent_s), secs(planned), ratio(spent_s, planned)])
        for k, v in r.items():
            tot[k] += v
    planned = tot["start_planned"] + tot["cell_planned"]
    spent_s = tot["start_spent"] + tot["cell_spent"] + tot["lost"]
    body.append(["total", int(tot["starts"]), secs(tot["start_spent"]),
                 secs(tot["start_planned"]), int(tot["cells"]), secs(tot["cell_spent"]),
                 secs(tot["cell_planned"]), secs(tot["lost"]), secs(spent_s), secs(planned),
                 ratio(spent_s, planned)])
    out += table(["notebook", "starts", "spent", "planned", "cells", "spent", "planned", "lost",
                  "spent s", "planned s", "spent/planned"], body)
    off = (f" ({(spent_s - planned) / planned:+.0%})" if planned else "")
    out += ["", (f"Planned {secs(planned)}, spent {secs(spent_s)}{off}: engine starts planned "
                f"{secs(tot['start_planned'])}, spent {secs(tot['start_spent'])}; cells planned "
                f"{secs(tot['cell_planned'])}, spent {secs(tot['cell_spent'])}; lost "
                f"{secs(tot['lost'])}."),
            ("Not in the stores: a lease's fixed costs (machine start, staging, exports), the "
            "engine stops and the per-command overheads: set the lease's device time beside "
            "the plan's lease total for those.")]
    return "\n".join(out) + "\n"
