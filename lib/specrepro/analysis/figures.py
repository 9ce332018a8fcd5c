"""The notebooks' figures: measured beside published, every repeat shown, units on axes.

Design:
- One function per figure, taking a `Finding` (and the claims), returning a matplotlib
  Figure; `save_figure` writes it to `<figures_dir>/<notebook>__<name>.png` and `.svg`.
- Absolute speeds are not comparable across hardware (a 27B target on a GB10 against a
  12M one on a CPU), so tok/s is drawn in two panels, measured and article, and the shapes
  that do carry over (gains in %, tokens per step, acceptance by position, ratios) share one
  axis with the article's values marked (black outlined markers, labelled "article").
- Every run is a dot; lines and bars are means over repeats.
- Stable output: fixed names, `svg.hashsalt`, no dates or software tags in the metadata,
  text kept as text in SVG, fixed size and DPI, so an unchanged result rewrites the same files.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: notebooks display the returned figures themselves
import matplotlib.pyplot as plt
import polars as pl
import seaborn as sns

from specrepro import metrics
from specrepro.analysis import tables
from specrepro.analysis.claims import Claims
from specrepro.analysis.finding import Finding
from specrepro.analysis.gates import evaluate_gates
from specrepro.analysis.overlay import published_points

ARTICLE = {"marker": "D", "s": 46, "facecolor": "none", "edgecolor": "black", "linewidth": 1.2,
           "zorder": 5}
DPI = 110


def style() -> None:
    """The house style, and the settings that make SVG output byte-stable."""
    sns.set_theme(style="whitegrid", context="notebook", font_scale=0.9)
    plt.rcParams.update({"svg.hashsalt": "specrepro", "svg.fonttype": "none",
                         "figure.dpi": DPI, "savefig.dpi": DPI,
                         "figure.constrained_layout.use": True})


def save_figure(fig: plt.Figure, figures_dir: str | Path, notebook_id: str, name: str
                ) -> list[Path]:
    """Write <notebook>__<name>.png and .svg; returns both paths."""
    out = Path(figures_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{notebook_id}__{name}"
    png, svg = stem.with_suffix(".png"), stem.with_suffix(".svg")
    fig.savefig(png, metadata={"Software": None})
    fig.savefig(svg, metadata={"Date": None, "Creator": None})
    return [png, svg]


def palette(f: Finding) -> dict[str, tuple]:
    """A stable colour per arm label, in the study's order."""
    labels = list(f.labels.values())
    return dict(zip(labels, sns.color_palette("colorblind", len(labels)), strict=True))


def _runs_and_means(ax, cells: pl.DataFrame, x: str, y: str, colors: dict, log2x: bool = True,
                    scale: float = 1.0) -> None:
    """Every run as a dot, the mean over repeats as a line, one colour per arm."""
    for label, part in cells.group_by("label", maintain_order=True):
        label = label[0]
        part = part.filter(pl.col(y).is_not_null())
        if not part.height:
            continue
        ax.scatter(part[x], part[y] * scale, color=colors[label], s=14, alpha=0.6)
        means = part.group_by(x).agg(pl.col(y).mean()).sort(x)
        ax.plot(means[x], means[y] * scale, color=colors[label], marker="o", label=label)
    if log2x:
        _streams_axis(ax, cells[x].to_list())


def _article_lines(ax, pub: pl.DataFrame, colors: dict, labels: dict, y: str = "value",
                   scale: float = 1.0) -> None:
    order = {arm: i for i, arm in enumerate(labels)}
    pub = pub.sort(pl.col("study_arm").replace_strict(order, default=len(order)))
    for arm, part in pub.group_by("study_arm", maintain_order=True):
        part = part.filter(pl.col("concurrency").is_not_null()).sort("concurrency")
        label = labels.get(arm[0])
        if not part.height or label is None:
            continue
        ax.plot(part["concurrency"], part[y] * scale, color=colors[label], linestyle="--",
                marker="D", mfc="none", label=label)
    _streams_axis(ax, pub["concurrency"].to_list())


def _streams_axis(ax, levels) -> None:
    """A log2 axis of concurrent streams with a tick at each level measured or published."""
    ax.set_xscale("log", base=2)
    ticks = sorted({int(x) for x in levels if x is not None})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def _temps(cells: pl.DataFrame) -> str:
    temps = sorted(t for t in cells["temperature"].unique().to_list() if t is not None)
    return ", ".join(f"T={t:g}" for t in temps)


def _article_tag(claims: Claims, cells: pl.DataFrame) -> str:
    """How the article's values are labelled: with their temperature where a notebook
    compares across temperatures (claims.published_temperature)."""
    if claims.temperature_note(cells["temperature"].to_list()):
        return f"article {claims.article} at T={claims.published_temperature:g}"
    return f"article {claims.article}"


def _published_against_base(pub: pl.DataFrame, base: str, labels: dict) -> pl.DataFrame:
    """The article's points of every study arm but the baseline, each with the baseline's
    value at the same level (column `_b`)."""
    pub_base = pub.filter(pl.col("study_arm") == base).select(
        "concurrency", pl.col("value").alias("_b"))
    return pub.filter((pl.col("study_arm") != base) & pl.col("study_arm").is_in(list(labels))
                      ).join(pub_base, on="concurrency")


def _against_base_axis(ax, reference: float, levels: list, title: str, ylabel: str) -> None:
    """An each-arm-against-the-baseline panel: a grey line where an arm equals the baseline
    (`reference`: 0 % or 1x), streams on x."""
    ax.axhline(reference, color="grey", linewidth=0.8)
    _streams_axis(ax, levels)
    ax.set(title=title, xlabel="concurrent streams", ylabel=ylabel)


def _temperature_title(fig, claims: Claims, cells: pl.DataFrame) -> None:
    note = claims.temperature_note(cells["temperature"].to_list())
    if note:
        fig.suptitle(note, fontsize=9)


def _rep_suffix(cells: pl.DataFrame, label: str) -> str:
    share = cells.filter(pl.col("label") == label)["repeated_4gram_share"].drop_nulls()
    return f"\n(rep. 4-grams {share.mean():.0%})" if share.len() else ""


# ---------------------------------------------------------------------------- 01


def block_sweep_speed(f: Finding, claims: Claims) -> plt.Figure:
    """Aggregate tok/s against streams, measured and article, and the gain over MTP in %."""
    colors, c = palette(f), f.cells
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    _runs_and_means(axes[0], c, "concurrency", "agg_tok_s", colors)
    axes[0].set(title=f"measured (this engine, {_temps(c)})", xlabel="concurrent streams",
                ylabel="aggregate decode throughput (tok/s)")
    want = claims.compared_temperature(c["temperature"][0])
    pub = published_points(claims, "agg_tok_s").filter(
        pl.col("temperature").is_null() | (pl.col("temperature") == want))
    _article_lines(axes[1], pub, colors, f.labels)
    axes[1].set(title=_article_tag(claims, c), xlabel="concurrent streams",
                ylabel="aggregate decode throughput (tok/s)")
    _temperature_title(fig, claims, c)
    base = f.study.baseline
    g = tables.gain_over(c, base)
    for label, part in g.filter(pl.col("arm") != base).group_by("label", maintain_order=True):
        part = part.sort("concurrency")
        axes[2].plot(part["concurrency"], part["change_pct"], marker="o", color=colors[label[0]],
                     label=label[0])
    pg = _published_against_base(pub, base, f.labels)
    if pg.height:
        gains = [metrics.relative_change_pct(a, b) for a, b in
                 zip(pg["value"].to_list(), pg["_b"].to_list(), strict=True)]
        for (arm, conc, gain) in zip(pg["study_arm"].to_list(), pg["concurrency"].to_list(),
                                     gains, strict=True):
            ax_kw = dict(ARTICLE, edgecolor=colors.get(f.labels.get(arm), "black"))
            axes[2].scatter([conc], [gain], **ax_kw)
        axes[2].scatter([], [], label=f"{_article_tag(claims, c)} (same colour)", **ARTICLE)
    _against_base_axis(axes[2], 0, c["concurrency"].to_list() + pub["concurrency"].to_list(),
                       f"gain over {f.labels.get(base, base)}",
                       "throughput change against MTP (%)")
    for ax in axes:
        ax.legend(fontsize=7)
    return fig


def acceptance_by_arm(f: Finding, claims: Claims, concurrency: int | None = None
                      ) -> plt.Figure:
    """Tokens per step per arm at one level (article marked) and acceptance by position."""
    colors, c = palette(f), f.cells
    level = concurrency or c["concurrency"].min()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    at = c.filter(pl.col("concurrency") == level)
    labels = [lab for lab in f.labels.values() if lab in at["label"].to_list()]
    for i, label in enumerate(labels):
        part = at.filter(pl.col("label") == label)["acceptance_length"].drop_nulls()
        if part.len():
            axes[0].bar(i, part.mean(), color=colors[label])
            axes[0].scatter([i] * part.len(), part, color="black", s=10, zorder=4)
    want = claims.compared_temperature(at["temperature"][0] if at.height else None)
    pub = published_points(claims, "acceptance_length").filter(
        (pl.col("concurrency") == level)
        & (pl.col("temperature").is_null() | (pl.col("temperature") == want)))
    for row in pub.to_dicts():
        label = f.labels.get(row["study_arm"])
        if label in labels:
            axes[0].scatter([labels.index(label)], [row["value"]], **ARTICLE)
    tag = _article_tag(claims, c)
    axes[0].scatter([], [], label=tag, **ARTICLE)
    axes[0].set_xticks(range(len(labels)), [lab + _rep_suffix(at, lab) for lab in labels],
                       rotation=20, fontsize=7)
    axes[0].set(ylabel="acceptance length (tokens per step)",
                title=f"tokens per step at {level} stream(s)")
    axes[0].legend(fontsize=7)
    pos = tables.positions(c, level)
    for label, part in pos.group_by("label", maintain_order=True):
        axes[1].plot(part["position"], part["acceptance"] * 100, marker="o",
                     color=colors[label[0]], label=label[0])
    pub_pos = published_points_positions(claims, level)
    for arm, part in pub_pos.group_by("study_arm", maintain_order=True):
        label = f.labels.get(arm[0], arm[0])
        axes[1].plot(part["position"], part["value"], linestyle="--", color="black",
                     marker="D", mfc="none", label=f"{tag}: {label}")
    axes[1].set(xlabel="draft position", ylabel="accepted at this position (% of steps)",
                title=f"acceptance by position at {level} stream(s)")
    axes[1].legend(fontsize=7)
    _temperature_title(fig, claims, c)
    return fig


def published_points_positions(claims: Claims, concurrency: int) -> pl.DataFrame:
    """Article per-position acceptance rates (%) for the mapped arms at one level."""
    frames = []
    for i in range(1, 10):
        p = published_points(claims, f"acceptance_rate_pos{i}")
        p = p.filter(pl.col("concurrency") == concurrency)
        if p.height:
            frames.append(p.with_columns(pl.lit(i).alias("position")))
    if not frames:
        return pl.DataFrame(schema={"study_arm": pl.String, "position": pl.Int32,
                                    "value": pl.Float64})
    return pl.concat(frames, how="vertical_relaxed").sort(["study_arm", "position"])


# ---------------------------------------------------------------------------- 02


def temperature_runs(f: Finding, claims: Claims) -> plt.Figure:
    """Every single-stream run per arm and temperature: tok/s (measured, article) and draft
    acceptance (%), with the article's values marked."""
    colors, c = palette(f), f.cells
    temps = sorted(c["temperature"].unique().to_list())
    labels = [lab for lab in f.labels.values() if lab in c["label"].to_list()]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    width = 0.8 / max(len(temps), 1)
    shades = dict(zip(temps, [1.0, 0.55, 0.3][: len(temps)], strict=False))

    def draw(ax, frame, y, scale=1.0):
        for i, label in enumerate(labels):
            for j, t in enumerate(temps):
                part = frame.filter((pl.col("label") == label) & (pl.col("temperature") == t))
                vals = part[y].drop_nulls() * scale
                x = i + (j - (len(temps) - 1) / 2) * width
                if vals.len():
                    ax.bar(x, vals.mean(), width=width * 0.9, color=colors[label],
                           alpha=shades[t], yerr=vals.std() if vals.len() > 1 else None,
                           capsize=3)
                    ax.scatter([x] * vals.len(), vals, color="black", s=10, zorder=4)
        ax.set_xticks(range(len(labels)), labels, rotation=20, fontsize=7)

    draw(axes[0], c, "agg_tok_s")
    axes[0].set(ylabel="single-stream decode (tok/s)",
                title="measured: every run, mean ± sd; shade = T " +
                      " / ".join(f"{t:g}" for t in temps))
    pub = pl.concat([published_points(claims, "agg_tok_s"),
                     published_points(claims, "agg_tok_s", repeats=True)])
    pub = pub.filter(pl.col("concurrency") == 1)
    for i, label in enumerate(labels):
        arm = next(a for a, lab in f.labels.items() if lab == label)
        for j, t in enumerate(temps):
            part = pub.filter((pl.col("study_arm") == arm) & (pl.col("temperature") == t))
            x = i + (j - (len(temps) - 1) / 2) * width
            if part.height:
                axes[1].scatter([x] * part.height, part["value"], color=colors[label],
                                alpha=shades[t], edgecolor="black", s=22)
    axes[1].set_xticks(range(len(labels)), labels, rotation=20, fontsize=7)
    axes[1].set(ylabel="single-stream decode (tok/s)",
                title=f"article {claims.article}: every published run")
    draw(axes[2], c, "draft_acceptance_rate", 100.0)
    pub_acc = published_points(claims, "draft_acceptance_rate")
    for row in pub_acc.to_dicts():
        label = f.labels.get(row["study_arm"])
        if label in labels and row["temperature"] in temps:
            j = temps.index(row["temperature"])
            x = labels.index(label) + (j - (len(temps) - 1) / 2) * width
            axes[2].scatter([x], [row["value"]], **ARTICLE)
    axes[2].scatter([], [], label="article", **ARTICLE)
    axes[2].legend(fontsize=7)
    axes[2].set(ylabel="draft tokens accepted (%)", title="draft acceptance rate")
    return fig


# ---------------------------------------------------------------------------- 03, 04


def acceptance_pairs(f: Finding, claims: Claims) -> plt.Figure:
    """Acceptance length per workload and level for each arm, the article's marked; and
    throughput per arm in two panels (measured, article)."""
    colors, c = palette(f), f.cells
    means = tables.mean_over_repeats(c, ["acceptance_length", "agg_tok_s",
                                         "repeated_4gram_share"])
    groups = means.select("workload", "concurrency").unique(maintain_order=True).to_dicts()
    labels = [lab for lab in f.labels.values() if lab in means["label"].to_list()]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    width = 0.8 / max(len(labels), 1)
    pub_acc = published_points(claims, "acceptance_length")
    pub_tps = published_points(claims, "agg_tok_s")
    names = []
    for gi, grp in enumerate(groups):
        part = means.filter((pl.col("workload") == grp["workload"])
                            & (pl.col("concurrency") == grp["concurrency"]))
        rep = part["repeated_4gram_share"].drop_nulls()
        names.append(f"{grp['workload']}\n{grp['concurrency']} stream(s)"
                     + (f"\nrep. 4-grams {rep.mean():.0%}" if rep.len() else ""))
        for li, label in enumerate(labels):
            x = gi + (li - (len(labels) - 1) / 2) * width
            row = part.filter(pl.col("label") == label)
            arm = next(a for a, lab in f.labels.items() if lab == label)
            for ax, col, pub in ((axes[0], "acceptance_length", pub_acc),
                                 (axes[1], "agg_tok_s", None)):
                if row.height and row[col][0] is not None:
                    ax.bar(x, row[col][0], width=width * 0.9, color=colors[label],
                           label=label if gi == 0 else None)
                if pub is not None:
                    hit = pub.filter((pl.col("study_arm") == arm)
                                     & (pl.col("workload") == claims.published_workload(
                                         grp["workload"]))
                                     & (pl.col("concurrency") == grp["concurrency"]))
                    if hit.height:
                        ax.scatter([x], [hit["value"][0]], **ARTICLE)
            hit = pub_tps.filter((pl.col("study_arm") == arm)
                                 & (pl.col("workload") == claims.published_workload(
                                     grp["workload"]))
                                 & (pl.col("concurrency") == grp["concurrency"]))
            if hit.height:
                axes[2].bar(x + gi * 0, hit["value"][0], width=width * 0.9, color=colors[label],
                            hatch="//", edgecolor="black")
    axes[0].scatter([], [], label="article", **ARTICLE)
    for ax, title, ylabel in (
            (axes[0], "acceptance length", "acceptance length (tokens per step)"),
            (axes[1], "measured (this engine)", "aggregate decode throughput (tok/s)"),
            (axes[2], f"article {claims.article} (hatched, same colours)",
             "aggregate decode throughput (tok/s)")):
        ax.set_xticks(range(len(groups)), names, fontsize=7)
        ax.set(title=title, ylabel=ylabel)
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7)
    return fig


# ---------------------------------------------------------------------------- 05


def gate_chart(f: Finding) -> plt.Figure:
    """Each declared gate: the gated value against its threshold, pass or fail."""
    g = evaluate_gates(f.cells, f.study.gates)
    n = max(g.height, 1)
    fig, axes = plt.subplots(1, n, figsize=(3.4 * n, 3.6), squeeze=False)
    for ax, row in zip(axes[0], g.to_dicts(), strict=False):
        color = {"pass": "tab:green", "fail": "tab:red"}.get(row["result"], "tab:grey")
        if row["value"] is not None:
            ax.bar([0], [row["value"]], color=color)
        else:
            ax.text(0, 0, "not measured", ha="center")
        ax.axhline(row["threshold"], color="black", linestyle="--",
                   label=f"gate {row['op']} {row['threshold']:g}")
        ax.set_xticks([0], [row["result"]])
        unit = row["unit"] or ""
        ylabel = (f"change against {row['reference_arm']} ({unit})"
                  if row["reference_arm"] else unit)
        ax.set(title=f"{row['gate']}\n{row['metric']}, {row['workload']}, "
                     f"{row['concurrency']} stream(s)", ylabel=ylabel)
        ax.title.set_fontsize(8)
        ax.legend(fontsize=7)
    return fig


# ---------------------------------------------------------------------------- 06


def load_sweep(f: Finding, claims: Claims) -> plt.Figure:
    """Throughput against streams (measured, article) and each arm's ratio to no
    speculation, with the crossing of static 7 drafts marked."""
    colors, c = palette(f), f.cells
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    _runs_and_means(axes[0], c, "concurrency", "agg_tok_s", colors)
    axes[0].set(title="measured (this engine)", xlabel="concurrent streams",
                ylabel="aggregate decode throughput (tok/s)")
    pub = published_points(claims, "agg_tok_s").filter(
        pl.col("workload") == claims.published_workload(c["workload"][0]))
    _article_lines(axes[1], pub, colors, f.labels)
    axes[1].set(title=f"article {claims.article}", xlabel="concurrent streams",
                ylabel="aggregate decode throughput (tok/s)")
    base = f.study.baseline
    g = tables.gain_over(c, base)
    for label, part in g.filter(pl.col("arm") != base).group_by("label", maintain_order=True):
        part = part.sort("concurrency")
        axes[2].plot(part["concurrency"], 1 + part["change_pct"] / 100, marker="o",
                     color=colors[label[0]], label=label[0])
    pr = _published_against_base(pub, base, f.labels)
    for row in pr.to_dicts():
        color = colors.get(f.labels.get(row["study_arm"]), "black")
        axes[2].scatter([row["concurrency"]], [row["value"] / row["_b"]],
                        **dict(ARTICLE, edgecolor=color))
    axes[2].scatter([], [], label="article (same colour)", **ARTICLE)
    static7 = next((a.name for a in f.study.arms if a.resolved.method == "dflash"
                    and a.resolved.speculative.num_speculative_tokens == 7
                    and not a.resolved.speculative.num_speculative_tokens_per_batch_size), None)
    cross = tables.crossing(c, static7, base) if static7 else None
    if cross is not None:
        axes[2].axvline(cross, color="grey", linestyle=":",
                        label=f"static 7 below no speculation from {cross:.3g} streams")
    _against_base_axis(axes[2], 1.0, c["concurrency"].to_list() + pub["concurrency"].to_list(),
                       f"against {f.labels.get(base, base)}", "throughput / no speculation (×)")
    for ax in axes:
        ax.legend(fontsize=6)
    return fig


# ---------------------------------------------------------------------------- 07


def bill_chart(f: Finding, claims: Claims) -> plt.Figure:
    """KV pool tokens per arm, the pool's change against MTP in % beside the articles', and
    tokens per joule where there is a power source."""
    colors, c = palette(f), f.cells
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    ref = next((a.name for a in f.study.arms if a.resolved.method == "mtp"), f.study.baseline)
    kv = tables.kv_cost(c, ref)
    labels = kv["label"].to_list()
    axes[0].bar(range(len(labels)), kv["kv_pool_tokens"].fill_null(0),
                color=[colors[lab] for lab in labels])
    axes[0].set_xticks(range(len(labels)), labels, rotation=20, fontsize=7)
    axes[0].set(ylabel="KV pool (tokens)", title="KV pool at the same memory budget")
    pub = published_points(claims, "kv_pool_tokens")
    pub_ref = pub.filter(pl.col("study_arm") == ref)["value"]
    measured = kv.filter(pl.col("arm") != ref)
    xs = range(measured.height)
    axes[1].bar(xs, measured["change_pct"].fill_null(0),
                color=[colors[lab] for lab in measured["label"].to_list()])
    if pub_ref.len():
        for row in pub.filter(pl.col("study_arm") != ref).to_dicts():
            label = f.labels.get(row["study_arm"])
            if label in measured["label"].to_list():
                i = measured["label"].to_list().index(label)
                axes[1].scatter([i], [metrics.relative_change_pct(row["value"], pub_ref[0])],
                                **ARTICLE)
    a_pub = published_points_article_a_kv()
    if a_pub is not None:
        axes[1].axhline(a_pub, color="black", linestyle=":",
                        label=f"article A: block drafter against MTP, {a_pub:+.0f}%")
    axes[1].scatter([], [], label="article B (vLLM 0.32.0)", **ARTICLE)
    axes[1].set_xticks(list(xs), measured["label"].to_list(), rotation=20, fontsize=7)
    axes[1].set(ylabel="KV pool against MTP (%)",
                title="what the drafter costs in context")
    axes[1].legend(fontsize=7)
    if f.has_power:
        b = tables.bill(c)
        for label, part in b.group_by("label", maintain_order=True):
            part = part.sort("concurrency")
            axes[2].plot(part["concurrency"], part["tokens_per_joule"], marker="o",
                         color=colors[label[0]], label=label[0])
        _streams_axis(axes[2], b["concurrency"].to_list())
        axes[2].set(xlabel="concurrent streams", ylabel="tokens per joule (tok/J)",
                    title="energy")
        axes[2].legend(fontsize=7)
    else:
        _no_data(axes[2], "no power source on this run:\nno NVML GPU, so no watts\n"
                          "and no tokens per joule")
        axes[2].set(title="energy")
    return fig


def published_points_article_a_kv() -> float | None:
    """Article A's KV pool change, block drafter (5 drafts) against MTP (%)."""
    from specrepro.published import load_published

    pub = load_published("A").filter(pl.col("metric") == "kv_pool_tokens")
    vals = {r["arm"]: r["value"] for r in pub.to_dicts()}
    if "dflash2_k5_0280" in vals and "mtp3_0280" in vals:
        return metrics.relative_change_pct(vals["dflash2_k5_0280"], vals["mtp3_0280"])
    return None

