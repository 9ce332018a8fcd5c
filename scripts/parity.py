"""Acceptance parity between engines on the same weights: one study's result stores side by
side (tokens per step and its gap, token identity of outputs, invariance within each engine,
speed), as lib/specrepro/analysis/parity.py builds them.

    python scripts/parity.py \\
        --store "vLLM 0.26.0=results/h200-engines/01_drafter_block_sweep/h200-engines" \\
        --store "embedded=results/h200-embedded/01_drafter_block_sweep/h200-embedded" \\
        [--reference NAME] [--gap-pct 5] [--markdown]

Prints the four tables, each under one line saying what it shows (plain text, or Markdown).
A figure, not a test: no thresholds fail the run; a gap above --gap-pct is flagged.
"""

from __future__ import annotations

import argparse

from specrepro.analysis import parity

TITLES = {"acceptance": "Acceptance", "identity": "Identity across engines",
          "invariance": "Invariance within each engine", "speed": "Speed"}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", action="append", required=True, metavar="NAME=PATH",
                    help="a run directory <results_dir>/<study>/<run_id> and the engine's name "
                         "for readers; twice or more (the first is the reference by default)")
    ap.add_argument("--reference", default=None, help="the store name to compare against")
    ap.add_argument("--gap-pct", type=float, default=parity.GAP_PCT,
                    help="flag a tokens-per-step gap whose size is above this (%%)")
    ap.add_argument("--markdown", action="store_true", help="Markdown tables")
    args = ap.parse_args(argv)
    stores = []
    for spec in args.store:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            ap.error(f"--store {spec!r}: expected NAME=PATH")
        try:
            stores.append(parity.load_store(name, path))
        except parity.ParityError as err:
            ap.error(f"--store {spec!r}: {err}")
    if len(stores) < 2:
        ap.error(f"--store: two or more are compared, got {len(stores)}")
    if len({s.name for s in stores}) < len(stores):
        ap.error(f"--store: names must differ, got {[s.name for s in stores]}")
    try:
        parity.reference_of(stores, args.reference)
    except parity.ParityError as err:
        ap.error(f"--reference: {err}")
    return args, stores


def main(argv=None) -> dict:
    args, stores = parse_args(argv)
    out = parity.tables_for(stores, args.reference, args.gap_pct)
    for key, table in out.items():
        head = f"## {TITLES[key]}" if args.markdown else f"== {TITLES[key]} =="
        print(f"{head}\n\n{parity.render(table, args.markdown)}\n")
    return out


if __name__ == "__main__":
    main()
