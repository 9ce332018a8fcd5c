"""The peer table: engines on the same weights and prompts, autoregressive and at their best
speculative arm, 1, 8 and 32 streams (issue 17, item 3), from the peer study's stores, as
lib/specrepro/analysis/finding/peer_table.py builds it; then the autoregressive targets line by line, and
where each engine's autoregressive time goes (the client's latency beside the engine's own
histograms).

    python scripts/peer.py \\
        --store "embedded=results/h200-embedded/peer-embedded/h200-embedded" \\
        --store "vLLM 0.26.0=results/h200-engines/peer-vllm/h200-engines" \\
        --store "SGLang 0.5.14=results/h200-engines/peer-sglang/h200-engines" \\
        [--subject embedded] [--against "vLLM 0.26.0" ...] [--markdown]

A figure, not a test: a missed target is printed as missed, never fails the run. Measure the
stores with `specrepro run SUITE --study peer-…` (each engine alone on the machine).
"""

from __future__ import annotations

import argparse

from specrepro.analysis.finding import parity, peer_table


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", action="append", required=True, metavar="NAME=PATH",
                    help="a run directory <results_dir>/<study>/<run_id> and the engine's name")
    ap.add_argument("--subject", default=None,
                    help="the engine whose ratios over the others are given (default: the first)")
    ap.add_argument("--against", action="append", default=[], metavar="NAME",
                    help="an engine the subject's targets are held against (repeatable; "
                         "default: every other store, which a store of the subject in another "
                         "configuration should not be)")
    ap.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = ap.parse_args(argv)
    try:
        stores = parity.load_stores(args.store)
    except parity.ParityError as err:
        ap.error(str(err))
    subject = args.subject or stores[0].name
    try:
        table = peer_table.table(stores, subject)
    except parity.ParityError as err:
        ap.error(f"--subject: {err}")
    try:
        lines = peer_table.targets(stores, subject, against=args.against)
    except parity.ParityError as err:
        ap.error(f"--against: {err}")
    time = peer_table.time_table(stores)
    print(parity.render(table, args.markdown))
    print()
    print("\n".join(("- " if args.markdown else "  ") + line for line in lines))
    print()
    print(parity.render(time, args.markdown))
    return {"table": table, "targets": lines, "time": time}


if __name__ == "__main__":
    main()
