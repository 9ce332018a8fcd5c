"""Print, per speculative arm of a stored study, its tokens per step at two levels (the
engine's counters) beside each level's prompt-to-prompt noise (per request, from the
stream's chunks), and whether the two agree (analysis/finding/acceptance_levels.py).

    python scripts/acceptance_levels.py results/h200-standin/06_draft_schedule_under_load/h200-standin \
        --low 1 --high 32

Nothing is measured. Used to decide whether acceptance must be measured at every level
or once (issue 37).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store", type=Path, help="a study's run folder (cells/, requests/)")
    ap.add_argument("--low", type=int, default=1)
    ap.add_argument("--high", type=int, default=32)
    args = ap.parse_args(argv)
    from specrepro.analysis.finding.acceptance_levels import levels, table
    from specrepro.store import load_cells, load_requests

    if not (args.store / "cells").is_dir():
        print(f"{args.store}: no cells/ folder: expected a study's run folder", file=sys.stderr)
        return 2
    cells, requests = load_cells(args.store), load_requests(args.store)
    print("arm\tstreams\tcounters tok/step\tper request mean\tsd\tn\tse\tchunks/counters")
    for x in levels(cells, requests):
        def f(v, d=3):
            return "-" if v is None else f"{v:.{d}f}"
        print(f"{x.arm}\t{x.concurrency}\t{f(x.counters)}\t{f(x.per_request_mean)}\t"
              f"{f(x.per_request_sd)}\t{x.n_requests}\t{f(x.se)}\t{f(x.chunk_vs_counters)}")
    print()
    for row in table(cells, requests, args.low, args.high):
        z = "-" if row["z"] is None else f"{row['z']:.2f}"
        print(f"{row['arm']}: {row['low'].counters:.3f} at {args.low} against "
              f"{row['high'].counters:.3f} at {args.high} streams ({row['delta_pct']:+.2f} %), "
              f"z = {z} -> {'agree' if row['agree'] else 'differ' if row['agree'] is not None else 'no noise'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
