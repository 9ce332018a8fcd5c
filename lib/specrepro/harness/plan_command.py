"""`specrepro plan`: the command line over the planner (harness/plan.py) and the
planned-against-spent report (harness/plan_spent.py).

Design: the suite (or study file) is resolved as `specrepro run` resolves it
(params.resolve_file: its notebooks, or the notebooks and studies named), its results dir
is the suite's unless `--results-dir` says otherwise, and the stores under it and under
every `--costs-from` folder are read once (harness/costs.py). The plan prints; `--spent`
prints planned against spent instead. A params error (a bad `plan:` block, a missing
prior) is printed with its file and key, exit 2; otherwise exit 0, whether or not the plan
fits `--budget-s` (the text says which).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specrepro import probes
from specrepro.harness.cost_model import CostModel
from specrepro.harness.costs import read_stores
from specrepro.harness.deadline import seconds_arg, zoned_time_arg
from specrepro.harness.plan import display, make_plan
from specrepro.harness.plan_report import render
from specrepro.harness.plan_spent import render_spent
from specrepro.params import ParamsError, Plan, is_suite, load_suite, read_tree
from specrepro.params import resolve_file as resolve
from specrepro.store import ResultStore


def suite_plan(path: Path) -> tuple[Plan | None, str]:
    """The suite's `plan:` block (None for a study file or a suite without one), its name."""
    if not is_suite(read_tree(path).data):
        return None, path.stem
    suite = load_suite(path)
    return suite.plan, suite.name


def constants(costs: CostModel) -> list[str]:
    """Where each constant came from, measured ones first (labels that share one figure
    on one line), then how many cells each level of the chain costed."""
    by_text: dict[str, list[str]] = {}
    for label, text in sorted(costs.used.items()):
        by_text.setdefault(text, []).append(label)
    lines = {True: [], False: []}
    for text, labels in by_text.items():
        head = labels[0] if len(labels) == 1 else (
            f"{labels[0].split(' ')[0]} of {', '.join(x.split(' ', 1)[1] for x in labels)}"
            if len({x.split(' ')[0] for x in labels}) == 1 else ", ".join(labels))
        lines[text.startswith("measured")].append(f"{head}: {text}")
    chain = [f"cells costed by {how}: {n}" for how, n in sorted(costs.cells_by.items())]
    return (lines[True] or ["measured: nothing stored matched"]) + lines[False] + chain


def probe_lines(plans, results: Path, costs: CostModel) -> list[str]:
    """The selected studies' declared probes, answered or not: one engine start each, asked
    by `gpu_measure.sh ... --probe STUDY` (harness/probe_command.py), not by the commands
    above; an unanswered one's start estimated as a lease's first of its profile."""
    out = []
    for st, _, run_id in plans:
        store = ResultStore(results, st.name, run_id)
        manifest = store.manifest() if store.manifest_path.is_file() else {"sessions": []}
        for probe in st.probes:
            if probes.latest(manifest, probe) is not None:
                out.append(f"  {st.notebook_id} probe {probe.name}: answered (stored)")
                continue
            start = costs.start(probe.resolved)
            pen, _ = costs.first_start(probe.resolved.engine)
            out.append(f"  {st.notebook_id} probe {probe.name} ({probe.resolved.name}): not "
                       f"answered; about {start.s + pen.s:,.0f} s, one start on its own "
                       f"(`--probe {st.notebook_id}` in a command, before its run)")
    return (["", "Probes (not in the commands above)", *out]) if out else []


def main(argv: list[str] | None = None) -> int:
    """`specrepro plan SUITE [--notebook ID ...] [--study ID ...] [--budget-s N]
    [--results-dir DIR] [--costs-from DIR ...] [--spent [--since TIME]]`."""
    ap = argparse.ArgumentParser(
        prog="specrepro plan",
        description="each notebook's cells, engine starts and estimated GPU seconds, split "
                    "into commands that fit one call and leases that fit a budget, in the "
                    "suite's order of value (plan: in the suite); --spent: planned against "
                    "spent after a lease")
    ap.add_argument("params", help="a suite (params/h200-standin.yaml) or a study file")
    ap.add_argument("--notebook", "--study", action="append", default=[], dest="notebook",
                    help="only this notebook, or a study of the suite's `studies:` "
                         "(repeatable; default: every notebook of the suite)")
    ap.add_argument("--budget-s", type=seconds_arg, metavar="N",
                    help="device seconds to spend: whether the plan fits, what it leaves out")
    ap.add_argument("--results-dir", default=None, help="overrides the suite's results_dir")
    ap.add_argument("--costs-from", action="append", default=[], type=Path, metavar="DIR",
                    help="more results folders whose stored starts and cells are measured "
                         "constants (repeatable)")
    ap.add_argument("--spent", action="store_true",
                    help="planned against spent: what the stores' sessions spent on starts "
                         "and cells beside the plan's estimate for the same")
    ap.add_argument("--since", type=zoned_time_arg, metavar="TIME",
                    help="with --spent: only the sessions from TIME on (default: all), "
                         "planned from what was stored before it")
    args = ap.parse_args(argv)
    if args.since is not None and not args.spent:
        ap.error("argument --since: expected it with --spent, found it alone")
    path = Path(args.params)
    try:
        plans = resolve(path, args.notebook)
        plan, name = suite_plan(path)
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    results = Path(args.results_dir) if args.results_dir else plans[0][1]
    stored = read_stores([results, *args.costs_from])
    own = {(results / st.name / run_id).resolve()
           for st, _, run_id in plans}
    suite_stored = stored.within(own)
    studies = {st.notebook_id: st for st, _, _ in plans}
    where = (f"results in {display(results)} ({len([r for r in stored.roots if r in own])} of "
             f"the plan's stores found)")
    if args.costs_from:
        where += "; costs also from " + ", ".join(display(d) for d in args.costs_from)
    try:
        if args.spent:
            since = args.since or min((s.session_at for s in suite_stored.starts), default=None)
            if since is None:
                since = min((c.started_at for c in suite_stored.cells), default=None)
            costs = CostModel(plan, stored.before(since), str(path))
            header = f"specrepro plan {path} --spent: suite {name}; {where}"
            sys.stdout.write(render_spent([st for st, _, _ in plans],
                                          suite_stored.since(since), costs, since, header))
            return 0
        costs = CostModel(plan, stored, str(path))
        result = make_plan(plan, studies, list(studies), suite_stored, costs, str(path), name)
        header = (f"specrepro plan {path}: suite {name}, {len(studies)} notebook(s) or "
                  f"studies; {where}")
        lease_s = plan.lease_s if plan is not None else float("inf")
        text = render(result, header, lease_s, args.budget_s, constants(costs))
        probes = probe_lines(plans, results, costs)
        sys.stdout.write(text + ("\n".join(probes) + "\n" if probes else ""))
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
