"""Figures of article B's paired comparisons (notebooks 03, 04, 05) and the FP8 gates.

Design (figures.py has the suite's; figures_common.py the shared pieces):
- `acceptance_pairs`: per workload and level, each arm's tokens per step (mean, min-max)
  with the article's figure marked at the compared temperature (overlay.points_at: the
  same rule the overlay table uses, so article B's T=1.0 GSM8K figure, 5.92, is never
  drawn against greedy measurements, where its greedy figure is 6.17); measured tok/s; and
  the article's tok/s in a panel of its own (hardware apart).
- `gate_chart`: each declared gate's value against its threshold; pass and fail differ in
  colour, hatch and text, not colour alone.
"""

from __future__ import annotations

import polars as pl

from specrepro.analysis import figures_common as fc
from specrepro.analysis import tables
from specrepro.analysis.claims import Claims
from specrepro.analysis.finding import Finding
from specrepro.analysis.gates import evaluate_gates
from specrepro.analysis.overlay import points_at, published_points

TPS = "aggregate decode throughput (tok/s)"


def acceptance_pairs(f: Finding, claims: Claims) -> fc.plt.Figure:
    """Acceptance length per workload and level for each arm, the article's marked; and
    throughput per arm in two panels (measured, article)."""
    st, c = fc.styles(f), f.cells
    keys = ["workload", "concurrency", "temperature"]
    groups = c.select(keys).unique(maintain_order=True).to_dicts()
    labels = fc.labels_in(f, c)
    fig, axes = fc.figure(3, (14, 4.8))
    width = 0.8 / max(len(labels), 1)
    pub_acc = published_points(claims, "acceptance_length")
    pub_tps = published_points(claims, "agg_tok_s")
    names = []
    for gi, grp in enumerate(groups):
        part = c.filter(*(pl.col(k) == grp[k] for k in keys if grp[k] is not None))
        rep = part["repeated_4gram_share"].drop_nulls()
        names.append(f"{grp['workload']}\n{grp['concurrency']} stream(s)"
                     + (f"\nrep. 4-grams {rep.mean():.0%}" if rep.len() else ""))
        for li, label in enumerate(labels):
            x = gi + (li - (len(labels) - 1) / 2) * width
            mine = part.filter(pl.col("label") == label)
            arm = fc.arm_of(f, label)
            for ax, col in ((axes[0], "acceptance_length"), (axes[1], "agg_tok_s")):
                fc.mean_bar(ax, x, fc.stats(mine[col].to_list()), st[label], width * 0.9,
                            label=label)
            at = (arm, grp["workload"], grp["concurrency"], grp["temperature"])
            for row in points_at(pub_acc, claims, *at).to_dicts():
                fc.article_marker(axes[0], x, row["value"],
                                  gid=f"article|{arm}|{grp['workload']}|{grp['concurrency']}")
            hit = points_at(pub_tps, claims, *at)
            if hit.height:
                axes[2].bar([x], [hit["value"][0]], width=width * 0.9,
                            color=st[label]["color"], hatch="//", edgecolor="black",
                            label=label)
    fc.key(axes[0], f"{fc.article_tag(claims, c)} (at the compared temperature)", "article",
           **fc.ARTICLE)
    for ax, ttl, ylabel in (
            (axes[0], "tokens per step", "acceptance length (tokens per step)"),
            (axes[1], "measured (this engine)", TPS),
            (axes[2], f"article {claims.article} (hatched: another machine)", TPS)):
        ax.set_xticks(range(len(groups)), names, fontsize=7)
        ax.set(title=ttl, ylabel=ylabel)
    fc.title(fig, claims, c, "acceptance_length")
    fc.legend_below(fig, axes)
    return fig


def gate_chart(f: Finding) -> fc.plt.Figure:
    """Each declared gate: the gated value against its threshold, pass or fail."""
    g = evaluate_gates(f.cells, f.study.gates)
    n = max(g.height, 1)
    fig, axes = fc.plt.subplots(1, n, figsize=(3.6 * n, 3.9), squeeze=False,
                                layout="constrained")
    look = {"pass": {"color": fc.PALETTE[2], "hatch": ""},
            "fail": {"color": fc.PALETTE[4], "hatch": "xx"}}
    for ax, row in zip(axes[0], g.to_dicts(), strict=False):
        kw = look.get(row["result"], {"color": "lightgrey", "hatch": ".."})
        if row["value"] is not None:
            ax.bar([0], [row["value"]], edgecolor="black", **kw)
        else:
            ax.text(0, 0, "not measured", ha="center")
        ax.axhline(row["threshold"], color="black", linestyle="--")
        ax.set_xticks([0], [row["result"].upper()])
        unit = row["unit"] or ""
        ref = f.labels.get(row["reference_arm"], row["reference_arm"])
        ylabel = f"change against {ref} ({unit})" if row["reference_arm"] else unit
        words = tables.NAMES.get(row["metric"], (row["metric"],))[0]
        ax.set(title=f"{row['gate']}\n{words}, {row['workload']}, "
                     f"{tables.streams(row['concurrency'])}\ngate (dashed): {row['op']} "
                     f"{row['threshold']:g}", ylabel=ylabel)
        ax.title.set_fontsize(8)
    return fig
