"""The step-cost model's checks as Markdown (issue 39): every stand-in cell's error, every
article figure's, the floors, crossovers, the FP8 bound and the largest misses.

    python scripts/step_cost.py > /tmp/step-cost.md      # from the project root

It prints what notebook 08 shows (analysis/step_cost/view.py), for docs/bench/. Nothing here
is a test: the numbers come from the stored cells and the published rows as they are.
"""

from __future__ import annotations

import argparse

import polars as pl

from specrepro.analysis.step_cost import check as chk
from specrepro.analysis.step_cost import report as rep
from specrepro.analysis.step_cost.view import StepCostView


def section(title: str, table, cols: list[str] | None = None, digits: int = 1) -> str:
    frame = table.frame.select(cols) if cols else table.frame
    notes = "".join(f"\n{n}\n" for n in table.notes)
    return f"### {title}\n\n{table.caption}.\n\n{rep.markdown(frame, digits)}\n{notes}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.parse_args(argv)
    v = StepCostView.build(None)
    out = []
    out.append(section("The fitted overheads", v.fits_table(), digits=3))
    for lo, hi in ((1, 32), (33, 100_000)):
        s = chk.summary(v.standin, lo, hi)
        out.append(f"Stand-in, {lo}-{min(hi, 512)} streams: median |error| "
                   f"{s['median_abs_error_pct']:.1f} % over {s['cells']} cells; "
                   f"{s['predicted_median_abs_error_pct']:.1f} % over the "
                   f"{s['predicted_cells']} that set no fit; {s['over_bound']} over "
                   f"{chk.MISS_PCT:.0f} %.\n")
    out.append(section("By card and engine, 1-32 streams", v.standin_by_engine()))
    cols = ["card", "engine", "arm", "drafts", "streams", "tok_s", "predicted_tok_s",
            "error_pct", "step_ms", "predicted_step_ms", "bound", "busy", "fitted", "reason",
            "source"]
    out.append(section("Every stand-in cell, 1-32 streams", v.standin_table(), cols))
    out.append(section("Every stand-in cell beyond 32 streams", v.standin_beyond(), cols))
    other = chk.check(combine="max")
    s = chk.summary(other)
    out.append(f"The other bound (a pass costs the larger of its read and its math, not the "
               f"sum): median |error| {s['median_abs_error_pct']:.1f} % at 1-32 streams, "
               f"{chk.summary(other, 33, 100_000)['median_abs_error_pct']:.1f} % beyond.\n")
    out.append(section("Every covered article figure", v.articles_table(),
                       ["article", "label", "workload", "streams", "metric", "published",
                        "predicted", "error_pct", "tokens_per_step", "predicted_step_ms",
                        "bound", "note"]))
    out.append(section("Article figures the model does not cover", v.uncovered_table()))
    out.append(section("Side by side", v.side_by_side_table()))
    out.append(section("Floors at one stream", v.floor_table(), digits=2))
    out.append(section("Crossovers", v.crossover_table()))
    out.append(section("Article B's FP8 drafter bound", v.fp8_table(), digits=2))
    out.append(section("The five largest misses", v.misses_table()))
    cov = v.articles.filter(pl.col("covered"))
    out.append(f"Articles: {cov.height} figures covered, median |error| "
               f"{cov['error_pct'].abs().median():.1f} %; by article: "
               + ", ".join(f"{a} {g['error_pct'].abs().median():.1f} % ({g.height})"
                           for (a,), g in cov.group_by(["article"], maintain_order=True))
               + ".\n")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
