"""A stand-in store's cells as the tables docs/bench/ keeps: each cell's measured step beside
the step-cost model's, and the bytes a step reads against the card's floor.

    python scripts/standin_tables.py --store results/h100-standin \
        --study 01_drafter_block_sweep --study 03_target_precision     # from the project root

Per study, one Markdown table, a row per stored cell measured there (copies filed from another
study are shown where they were measured): arm, workload, streams, temperature, tok/s,
tokens a step (the engine's acceptance counters), the step in ms (streams x tokens a step /
tok/s), the GPU's busy share, the bytes a step reads (the target's weights, the drafter's
passes, the KV cache: analysis/step_cost/model.py), the rated-bandwidth floor of those bytes and
the step's share of it (floor / step: 100 % would be a step that is nothing but its weight
read at the rated bandwidth), and the model's step and its error. Nothing here is a test:
the numbers come from the stored cells and the model's sourced records as they are.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import polars as pl

from specrepro.analysis.step_cost import check as chk
from specrepro.analysis.step_cost import model as sc
from specrepro.analysis.step_cost.data import card
from specrepro.store import load_cells


def rows(store: str, study: str) -> pl.DataFrame:
    """The check's rows of one study of the store (step_cost_check.check: every stored
    stand-in cell, measured and predicted)."""
    checked = chk.check()
    part = checked.filter(pl.col("source").str.starts_with(f"{store.rstrip('/')}/{study}:"))
    if not part.height:
        raise SystemExit(f"error: no stand-in cell of {study} under {store} "
                         "(step_cost/check.yaml lists the stores the model reads)")
    # the check's rows name their cell by id (source: "... (cell 0123456789)"): the workload
    # and temperature come from the cell's own row
    cells = pl.concat([load_cells(p) for p in sorted((Path(store) / study).iterdir())
                       if p.is_dir()], how="diagonal_relaxed")
    by_id = {c["cell_id"][:10]: c for c in cells.iter_rows(named=True)}
    ids = [re.search(r"\(cell ([0-9a-f]{10})\)", s).group(1) for s in part["source"]]
    return part.with_columns(
        pl.Series("workload", [by_id[i]["workload"] for i in ids]),
        pl.Series("temperature", [by_id[i]["temperature"] for i in ids]))


def table(part: pl.DataFrame) -> str:
    cols = ["arm", "target", "workload", "T", "streams", "tok/s", "tokens a step", "step ms",
            "GPU busy", "GB a step", "rated floor ms", "share of floor", "model ms", "model error"]
    out = ["| " + " | ".join(cols) + " |",
           "| --- | --- | --- |" + " ---: |" * (len(cols) - 3)]
    order = ["arm", "workload", "temperature", "streams", "tok_s"]
    for r in part.sort(order).iter_rows(named=True):
        floor = sc.floor_ms(card(r["card"]), r["step_bytes"])["rated"]
        busy = f"{100 * r['busy']:.0f} %" if r["busy"] is not None else "n/a"
        out.append(
            f"| {r['arm']} | {r['target']} | {r['workload']} | {r['temperature']:g} | "
            f"{r['streams']} | {r['tok_s']:,.1f} | "
            f"{r['tokens_per_step']:.2f} | {r['step_ms']:.2f} | {busy} | "
            f"{r['step_bytes'] / 1e9:.2f} | {floor:.2f} | {100 * floor / r['step_ms']:.0f} % | "
            f"{r['predicted_step_ms']:.2f} | {r['error_pct']:+.1f} % |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", required=True, help="a suite's results folder, as "
                    "step_cost/check.yaml names it (e.g. results/h100-standin)")
    ap.add_argument("--study", action="append", required=True, help="a study id (repeatable)")
    args = ap.parse_args(argv)
    for study in args.study:
        part = rows(args.store, study)
        sys.stdout.write(f"### {study} ({part.height} cells measured there)\n\n{table(part)}\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
