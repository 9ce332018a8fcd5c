"""Figures of article A's sweep (notebook 01) and its temperature runs (notebook 02).

Design (the package's __init__.py has the suite's figures; common.py the shared pieces):
- 01 says three things, one figure each: throughput and the gain over MTP against load
  (`block_sweep_speed`); tokens per step and acceptance at each draft position, every arm
  beside every other in grouped bars, the article's per-position figures marked where it
  prints them (`acceptance_by_arm`; MTP's come from production traffic, not the probe, and
  are labelled so); and the step time the claim is about (`step_time`: ms per step =
  1000 x tokens per step / per-stream tok/s, metrics.step_ms, the article's ~121 ms on its
  own axis, since a GB10 and this engine share no scale).
- 02 (`temperature_runs`) draws what the article printed as what it is: its single runs as
  dots, a mean of runs as a mean (a line, "article mean") beside them, never as one more
  run, and its printed ranges as ranges.
- Artists that tests look for carry a gid ("article-mean|<arm>|<T>", "position|<label>|<i>").
"""

from __future__ import annotations

import textwrap

import polars as pl

from specrepro import metrics
from specrepro.analysis.figures import common as fc
from specrepro.analysis.figures import marks as fm
from specrepro.analysis.finding.finding import Finding
from specrepro.analysis.verdict.claims import Claims
from specrepro.analysis.verdict.overlay import (
    points_at,
    published_points,
    published_positions,
    published_ranges,
)

TPS = "aggregate decode throughput (tok/s)"


def published_against_base(pub: pl.DataFrame, base: str, labels: dict) -> pl.DataFrame:
    """The article's points of every study arm but the baseline, each with the baseline's
    value at the same level (column `_b`)."""
    pub_base = pub.filter(pl.col("study_arm") == base).select(
        "concurrency", pl.col("value").alias("_b"))
    return pub.filter((pl.col("study_arm") != base) & pl.col("study_arm").is_in(list(labels))
                      ).join(pub_base, on="concurrency")


def article_lines(ax, pub: pl.DataFrame, f: Finding, y: str = "value") -> None:
    """The article's figures against streams, one line per arm in the arm's style with
    hollow markers (the arm's label is the measured panel's; this panel's title says
    'article')."""
    st = fc.styles(f)
    levels = sorted({int(x) for x in pub["concurrency"].drop_nulls().to_list()})
    for label in f.labels.values():
        arm = fc.arm_of(f, label)
        part = pub.filter((pl.col("study_arm") == arm) & pl.col("concurrency").is_not_null())
        at = dict(zip(part["concurrency"].to_list(), part[y].to_list(), strict=True))
        if at:  # every level of the panel, a gap (NaN) where the article has no figure
            ax.plot(levels, [at.get(x, float("nan")) for x in levels], mfc="none",
                    gid=f"article-line|{arm}", **st[label])
    fc.key(ax, "article (hollow markers, the arm's colour and line)", "article-line",
           kind="line", color="black", marker="o", mfc="none", linestyle="none")
    fc.streams_axis(ax, pub["concurrency"].to_list())


# ---------------------------------------------------------------------------- 01


def block_sweep_speed(f: Finding, claims: Claims) -> fc.plt.Figure:
    """Aggregate tok/s against streams, measured and article, and the gain over the
    baseline (MTP) in %, the article's gains marked in each arm's colour."""
    st, c = fc.styles(f), f.cells
    fig, axes = fc.figure(3, (13, 4.8))
    speed = fm.untested(f, claims, "agg_tok_s")
    for ax in (axes[0], axes[2]):
        fm.declare(ax, speed)
    fc.lines_by_streams(axes[0], f, c, "agg_tok_s", st)
    axes[0].set(title=f"measured (this engine, {fc.temps(c)})", xlabel="concurrent streams",
                ylabel=TPS)
    want = claims.compared_temperature(c["temperature"][0])
    pub = published_points(claims, "agg_tok_s").filter(
        pl.col("temperature").is_null() | (pl.col("temperature") == want))
    article_lines(axes[1], pub, f)
    axes[1].set(title=fc.article_tag(claims, c), xlabel="concurrent streams", ylabel=TPS)
    base = f.study.baseline
    base_label = f.labels.get(base, base)
    fc.changes_by_streams(axes[2], f, c, st)
    for row in published_against_base(pub, base, f.labels).to_dicts():
        color = st.get(f.labels.get(row["study_arm"]), {}).get("color", "black")
        fc.article_marker(axes[2], row["concurrency"],
                          metrics.relative_change_pct(row["value"], row["_b"]), color)
    fc.key(axes[2], f"{fc.article_tag(claims, c)} (diamonds, the arm's colour)", "article",
           **fc.ARTICLE)
    axes[2].axhline(0, color="grey", linewidth=0.8)
    fc.streams_axis(axes[2], c["concurrency"].to_list(), pub["concurrency"].to_list())
    axes[2].set(title=f"gain over {base_label}", xlabel="concurrent streams",
                ylabel=f"throughput change against {base_label} (%)")
    fc.title(fig, claims, c, "agg_tok_s")
    fm.mark(fig)
    fc.legend_below(fig, axes)
    return fig


def acceptance_by_arm(f: Finding, claims: Claims, concurrency: int | None = None
                      ) -> fc.plt.Figure:
    """Tokens per step per arm at one level (article marked), and acceptance at each draft
    position in grouped bars, every arm beside every other, with the article's figures."""
    st, c = fc.styles(f), f.cells
    level = concurrency or c["concurrency"].min()
    at = c.filter(pl.col("concurrency") == level)
    labels = fc.labels_in(f, at)
    workload, temp = at["workload"][0], at["temperature"][0]
    tag = fc.article_tag(claims, c)
    fig, axes = fc.figure(2, (12, 4.8))
    fm.declare(axes[0], fm.untested(f, claims, "acceptance_length"))
    pub = published_points(claims, "acceptance_length")
    for i, label in enumerate(labels):
        part = at.filter(pl.col("label") == label)
        fc.mean_bar(axes[0], i, fc.stats(part["acceptance_length"].to_list()), st[label], 0.7,
                    label=label)
        vals = part["acceptance_length"].drop_nulls()
        if vals.len() > 1:
            axes[0].scatter([i] * vals.len(), vals, color="black", s=9, zorder=4)
        for row in points_at(pub, claims, fc.arm_of(f, label), workload, level,
                             temp).to_dicts():
            fc.article_marker(axes[0], i, row["value"])
    fc.key(axes[0], tag, "article", **fc.ARTICLE)
    rep = {lab: at.filter(pl.col("label") == lab)["repeated_4gram_share"].drop_nulls()
           for lab in labels}
    axes[0].set_xticks(range(len(labels)), [
        lab + (f"\n(rep. 4-grams {rep[lab].mean():.0%})" if rep[lab].len() else "")
        for lab in labels], rotation=20, fontsize=7)
    axes[0].set(ylabel="acceptance length (tokens per step)",
                title=f"tokens per step at {level} stream(s)")
    _positions(axes[1], f, at, labels, claims, (workload, level, temp), tag)
    fc.title(fig, claims, c, "acceptance_length")
    fm.mark(fig)
    fc.legend_below(fig, axes, ncol=3)
    return fig


def _positions(ax, f: Finding, at: pl.DataFrame, labels: list[str], claims: Claims,
               level: tuple, tag: str) -> None:
    """Grouped bars: at each draft position one bar per arm that drafts that far, each arm
    at its own offset, so no arm hides another; the article's figures marked on its arm's
    bar (a stand-in arm's, such as MTP on production traffic, with a marker of its own)."""
    st = fc.styles(f)
    width = 0.8 / max(len(labels), 1)
    offset = {lab: (i - (len(labels) - 1) / 2) * width for i, lab in enumerate(labels)}
    depth = 0
    for label in labels:
        per = [p for p in at.filter(pl.col("label") == label)["per_position_acceptance"]
               .to_list() if p]
        n = max((len(p) for p in per), default=0)
        depth = max(depth, n)
        for i in range(n):
            s = fc.stats([p[i] for p in per if i < len(p)], 100.0)
            bars = fc.mean_bar(ax, i + 1 + offset[label], s, st[label], width * 0.95,
                               label=label if i == 0 else None)
            if bars is not None:
                bars.patches[0].set_gid(f"position|{label}|{i + 1}")
    pub = published_positions(claims, *level)
    stand_in = {"marker": "^", "s": 40, "facecolor": "none", "edgecolor": "black",
                "linewidth": 1.2, "zorder": 5}
    for (arm, pub_arm), part in pub.group_by(["study_arm", "published_arm"],
                                             maintain_order=True):
        label = f.labels.get(arm)
        if label not in offset:
            continue
        row = part.row(0, named=True)
        kw = fc.ARTICLE if row["own"] else stand_in
        where = (row["workload"] or "another workload").replace("_", " ")
        name = (f"{tag}: {row['label']}" if row["own"] else
                f"article {claims.article}: {row['label']}"
                + (" (not this probe)" if where in row["label"] else f" ({where}, not this probe)"))
        for r in part.to_dicts():
            ax.scatter([r["position"] + offset[label]], [r["value"]], **kw,
                       gid=f"article-position|{pub_arm}|{r['position']}")
            depth = max(depth, r["position"])
        fc.key(ax, name, f"article-position|{pub_arm}|", **kw)
    ax.set_xticks(range(1, depth + 1))
    ax.set(xlabel="draft position", ylabel="accepted at this position (% of steps)",
           title=f"acceptance by draft position at {level[1]} stream(s)")


def step_time(f: Finding, claims: Claims) -> fc.plt.Figure:
    """Milliseconds per target step per arm and level (metrics.step_ms: 1000 x tokens per
    step / per-stream tok/s, run by run), and the article's step on its own axis."""
    st, c = fc.styles(f), f.cells
    runs = c.with_columns(pl.Series("_step", [
        metrics.step_ms(a, s) for a, s in zip(c["acceptance_length"].to_list(),
                                              c["per_stream_tok_s"].to_list(), strict=True)],
        dtype=pl.Float64))
    fig, axes = fc.figure(2, (12, 4.6))
    fm.declare(axes[0], fm.untested(f, claims, "step_ms"))
    fc.lines_by_streams(axes[0], f, runs, "_step", st)
    axes[0].set(title=f"measured (this engine, {fc.temps(c)})", xlabel="concurrent streams",
                ylabel="step time (ms per target step)")
    want = claims.compared_temperature(c["temperature"][0])
    pub = published_points(claims, "step_ms").filter(
        (pl.col("concurrency") == 1)
        & (pl.col("temperature").is_null() | (pl.col("temperature") == want)))
    labels = [lab for lab in f.labels.values()
              if pub.filter(pl.col("study_arm") == fc.arm_of(f, lab)).height]
    for i, label in enumerate(labels):
        row = pub.filter(pl.col("study_arm") == fc.arm_of(f, label)).row(0, named=True)
        axes[1].bar([i], [row["value"]], color="none", edgecolor=st[label]["color"],
                    hatch="//", linewidth=1.5)
        axes[1].text(i, row["value"], ("~" if row["stat"] == "approx" else "")
                     + f"{row['value']:g} ms", ha="center", va="bottom", fontsize=8)
    if labels:
        axes[1].set_xticks(range(len(labels)), labels, rotation=20, fontsize=7)
        axes[1].set_ylim(0, max(pub["value"]) * 1.2)
    else:
        fc.no_data(axes[1], "the article prints no step time for these arms")
    axes[1].set(title=f"{fc.article_tag(claims, c)}, 1 stream: its own machine and scale",
                ylabel="step time (ms per target step)")
    fc.title(fig, claims, runs, "_step")
    fm.mark(fig)
    fc.legend_below(fig, axes)
    return fig


# ---------------------------------------------------------------------------- 02


def temperature_runs(f: Finding, claims: Claims) -> fc.plt.Figure:
    """Every single-stream run per arm and temperature: tok/s measured (mean, min-max, each
    run) and in the article (its runs as dots, its means as means, its single figures as
    diamonds), and draft acceptance (%) with the article's figures and ranges."""
    st, c = fc.styles(f), f.cells
    ts = sorted(c["temperature"].unique().to_list())
    labels = fc.labels_in(f, c)
    fig, axes = fc.figure(3, (14, 4.8))
    width = 0.8 / max(len(ts), 1)
    hatches = ["", "//", "..", "xx"]

    def x_of(i: int, t: float) -> float:
        return i + (ts.index(t) - (len(ts) - 1) / 2) * width

    def measured(ax, y: str, factor: float = 1.0) -> None:
        for i, label in enumerate(labels):
            for t in ts:
                vals = [v * factor for v in c.filter((pl.col("label") == label)
                                                     & (pl.col("temperature") == t))[y]
                        .to_list() if v is not None]
                bars = fc.mean_bar(ax, x_of(i, t), fc.stats(vals), st[label], width * 0.9,
                                   hatch=hatches[ts.index(t) % len(hatches)])
                if bars is not None:
                    bars.patches[0].set_gid(f"temperature|{t:g}|{label}")
                ax.scatter([x_of(i, t)] * len(vals), vals, color="black", s=9, zorder=4)
        ticks(ax)

    def ticks(ax) -> None:  # each arm, and which bar of its group is which temperature
        ax.set_xticks(range(len(labels)), [textwrap.fill(lab, 16) + "\n" + "   ".join(
            f"T={t:g}" for t in ts) for lab in labels], fontsize=7)

    measured(axes[0], "agg_tok_s")
    for t in ts:  # the temperature key: grey bars with each temperature's hatch
        fc.key(axes[0], f"T={t:g}", f"temperature|{t:g}|", kind="bar", color="#bbbbbb",
               edgecolor="#444444", hatch=hatches[ts.index(t) % len(hatches)])
    axes[0].set(ylabel="single-stream decode (tok/s)", title="measured, per temperature")
    _article_runs(axes[1], f, claims, labels, ts, x_of, width)
    ticks(axes[1])
    axes[1].set(ylabel="single-stream decode (tok/s)",
                title=f"article {claims.article}: its runs, means and figures")
    measured(axes[2], "draft_acceptance_rate", 100.0)
    for row in published_points(claims, "draft_acceptance_rate").to_dicts():
        label = f.labels.get(row["study_arm"])
        if label in labels and row["temperature"] in ts:
            fc.article_marker(axes[2], x_of(labels.index(label), row["temperature"]),
                              row["value"])
    for row in published_ranges(claims, "draft_acceptance_rate").to_dicts():
        label = f.labels.get(row["study_arm"])
        if label in labels and row["temperature"] in ts:
            x = x_of(labels.index(label), row["temperature"])
            mid = (row["min"] + row["max"]) / 2
            axes[2].errorbar([x], [mid], yerr=[[mid - row["min"]], [row["max"] - mid]],
                             fmt="none", ecolor="black", elinewidth=1.2, capsize=6, zorder=5,
                             label=f"article {claims.article}: range over its runs")
    fc.key(axes[2], f"article {claims.article}: a printed figure", "article", **fc.ARTICLE)
    axes[2].set(ylabel="draft tokens accepted (%)", title="draft acceptance rate")
    fc.title(fig, None, c, "agg_tok_s")
    fc.legend_below(fig, axes)
    return fig


def _article_runs(ax, f: Finding, claims: Claims, labels: list[str], ts: list[float], x_of,
                  width: float) -> None:
    """The article's single-stream tok/s as printed: each run a dot, a mean of runs a short
    line (never a dot among the runs), a single figure a hollow diamond."""
    st = fc.styles(f)
    runs = published_points(claims, "agg_tok_s", repeats=True).filter(pl.col("concurrency") == 1)
    figs = published_points(claims, "agg_tok_s").filter(pl.col("concurrency") == 1)
    for i, label in enumerate(labels):
        arm = fc.arm_of(f, label)
        for t in ts:
            x = x_of(i, t)
            mine = runs.filter((pl.col("study_arm") == arm) & (pl.col("temperature") == t))
            if mine.height:
                ax.scatter([x] * mine.height, mine["value"], color=st[label]["color"],
                           edgecolor="black", s=24, zorder=4, gid=f"article-runs|{arm}|{t:g}",
                           label=f"article {claims.article}: one run (a dot each)")
            for row in figs.filter((pl.col("study_arm") == arm)
                                   & (pl.col("temperature") == t)).to_dicts():
                if row["stat"] == "mean":
                    ax.plot([x - width * 0.45, x + width * 0.45], [row["value"]] * 2,
                            color="black", linewidth=2.5, solid_capstyle="butt", zorder=5,
                            gid=f"article-mean|{arm}|{t:g}",
                            label=f"article {claims.article} mean (of its runs)")
                else:
                    fc.article_marker(ax, x, row["value"], gid=f"article-figure|{arm}|{t:g}",
                                      label=f"article {claims.article}: a printed figure")
    if ts:
        ax.set_xlim(-0.6, len(labels) - 0.4)
