"""What every figure shares: one style per arm, means with their spread, article markers,
the streams axis, and one legend below the panels.

Design:
- Series: each arm of a study gets a colour from the Okabe-Ito palette (colour-blind safe,
  every pair apart in hue or lightness; `PALETTE`), a marker and a line style of its own,
  in the study's order, so an arm looks the same in every panel and can be told apart
  without colour. Black stays the article's: hollow black-edged diamonds (`ARTICLE`).
- A measured point or bar is the mean over repeats; its error bar is the min-max over the
  runs, drawn only where there are two or more; the figure's title says so, with the run
  counts (`spread_note`), and says n=1 where one run is all there is.
- Legends never sit over data: `legend_below` gathers every panel's entries (once each)
  into one legend under the panels.
- The streams axis is log2 with a tick at every level measured or published; a level only
  the article has is labelled "(article)", so a reader sees where this run did not reach.
"""

from __future__ import annotations

import textwrap

import matplotlib

matplotlib.use("Agg")  # headless: notebooks display the returned figures themselves
import matplotlib.pyplot as plt
import polars as pl

from specrepro import metrics
from specrepro.analysis.finding import tables
from specrepro.analysis.finding.cell_key import CELL, READING
from specrepro.analysis.finding.finding import Finding
from specrepro.analysis.verdict.claims import Claims

# Okabe & Ito (2008), reordered so that the first four (most studies' arms) are the four
# most distinct; black last but one, since the article's markers are black-edged.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#000000",
           "#F0E442"]
MARKERS = ["o", "s", "^", "v", "P", "X", "h", "*"]  # no "D": the article's diamond
LINESTYLES = ["-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1)), (0, (1, 1)),
              (0, (5, 2, 1, 2))]
ARTICLE = {"marker": "D", "s": 46, "facecolor": "none", "edgecolor": "black", "linewidth": 1.2,
           "zorder": 5}
ERR = {"capsize": 3, "elinewidth": 1.0, "ecolor": "#333333"}


def series(labels: list[str]) -> dict[str, dict]:
    """A stable style per arm label, in the given order: color, marker, linestyle."""
    return {lab: {"color": PALETTE[i % len(PALETTE)], "marker": MARKERS[i % len(MARKERS)],
                  "linestyle": LINESTYLES[i % len(LINESTYLES)]}
            for i, lab in enumerate(labels)}


def styles(f: Finding) -> dict[str, dict]:
    return series(list(f.labels.values()))


def palette(f: Finding) -> dict[str, str]:
    """A stable colour per arm label, in the study's order."""
    return {lab: s["color"] for lab, s in styles(f).items()}


def labels_in(f: Finding, frame: pl.DataFrame) -> list[str]:
    """The study's arm labels that `frame` has, in the study's order."""
    have = set(frame["label"].to_list())
    return [lab for lab in f.labels.values() if lab in have]


def arm_of(f: Finding, label: str) -> str:
    return next(a for a, lab in f.labels.items() if lab == label)


def stats(values, factor: float = 1.0) -> dict | None:
    """Mean, min, max and n of the runs (tables.spread_of: the same figure as the tables)."""
    return tables.spread_of(values, factor)


def yerr(s: dict) -> list[list[float]] | None:
    """An asymmetric error bar from the mean to min and max; None for a single run."""
    if s is None or s["n"] < 2:
        return None
    # max(0, ...): the mean of equal runs can land an ulp outside them
    return [[max(0.0, s["mean"] - s["min"])], [max(0.0, s["max"] - s["mean"])]]


def mean_line(ax, xs: list, st: list[dict | None], style: dict, label: str | None,
              runs: list[list[float]] | None = None, levels: list | None = None) -> None:
    """Means joined by the series' line, min-max error bars where n > 1, and every run as a
    small dot (`runs`, one list per x). With `levels` (every level of the panel) the line
    breaks where the series has no mean, never joining two levels across a missing one."""
    pts = [(x, s) for x, s in zip(xs, st, strict=True) if s is not None]
    if not pts:
        return
    mean = {x: s["mean"] for x, s in pts}
    line_x = sorted(set(levels) | set(mean)) if levels else [x for x, _ in pts]
    ax.plot(line_x, [mean.get(x, float("nan")) for x in line_x], label=label, **style)
    for x, s in pts:
        e = yerr(s)
        if e is not None:
            ax.errorbar([x], [s["mean"]], yerr=e, fmt="none", **ERR)
    for x, vals in zip(xs, runs or [], strict=False):
        if len(vals) > 1:
            ax.scatter([x] * len(vals), vals, color=style["color"], s=9, alpha=0.5, zorder=3,
                       gid=f"runs|{label}")  # figures_marks greys them with their line


def mean_bar(ax, x: float, s: dict | None, style: dict, width: float, label: str | None = None,
             **kw):
    """One bar at the mean, its min-max error bar where n > 1; returns the bar container."""
    if s is None:
        return None
    bars = ax.bar([x], [s["mean"]], width=width, color=style["color"], label=label,
                  edgecolor="white", linewidth=0.5, **kw)
    e = yerr(s)
    if e is not None:
        ax.errorbar([x], [s["mean"]], yerr=e, fmt="none", **ERR)
    return bars


def article_marker(ax, x: float, y: float, color: str = "black", gid: str | None = None,
                   **kw) -> None:
    """An article's figure as a hollow diamond; its gid starts with "article" (the group a
    legend key names, figure_checks)."""
    ax.scatter([x], [y], **{**ARTICLE, "edgecolor": color, **kw},
               gid=gid or f"article|at|{x:g}|{y:.6g}")


def key(ax, label: str, gid: str, kind: str = "scatter", **style) -> bool:
    """A legend key in `style`, gid `key|<gid>` (an empty scatter or line, or a bar of 0 at
    x = 0 for a hatch, `kind`), for a group of drawn artists, those whose gid starts with
    `gid`: added only when the panel drew one of them, so the legend never lists what is not
    there (figure_checks). Returns whether it was."""
    arts = list(ax.collections) + list(ax.lines) + list(ax.patches)
    if not any((a.get_gid() or "").startswith(gid) for a in arts):
        return False
    draw = {"scatter": lambda **kw: ax.scatter([], [], **kw),
            "line": lambda **kw: ax.plot([], [], **kw),
            "bar": lambda **kw: ax.bar([0], [0], **kw)}[kind]
    draw(label=label, gid=f"key|{gid}", **style)
    return True


def streams_axis(ax, measured, published=()) -> None:
    """A log2 axis of concurrent streams, a tick at each level measured or published; one
    only the article has is labelled '(article)'."""
    ax.set_xscale("log", base=2)
    have = {int(x) for x in measured if x is not None}
    ticks = sorted(have | {int(x) for x in published if x is not None})
    ax.set_xticks(ticks, [str(t) if t in have or not have else f"{t}\n(article)"
                          for t in ticks])
    ax.minorticks_off()


def no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def temps(cells: pl.DataFrame) -> str:
    ts = sorted(t for t in cells["temperature"].unique().to_list() if t is not None)
    return ", ".join(f"T={t:g}" for t in ts)


def article_tag(claims: Claims, cells: pl.DataFrame) -> str:
    """How the article's values are labelled: with their temperature where a notebook
    compares across temperatures (claims.published_temperature)."""
    if claims.temperature_note(cells["temperature"].to_list()):
        return f"article {claims.article} at T={claims.published_temperature:g}"
    return f"article {claims.article}"


def spread_note(cells: pl.DataFrame, value: str) -> str:
    """What the error bars are, from the run counts of the levels drawn."""
    per = (cells.filter(pl.col(value).is_not_null())
           .group_by(CELL).len()["len"].to_list())
    if not per:
        return ""
    lo, hi = min(per), max(per)
    if hi == 1:
        return "one run per point (n=1): no error bars"
    runs = f"{lo}" if lo == hi else f"{lo}-{hi}"
    return (f"points and bars: mean of {runs} runs; error bars: min-max over the runs"
            + ("; n=1 points have none" if lo == 1 else ""))


def title(fig, claims: Claims | None, cells: pl.DataFrame, value: str | None,
          extra: str = "") -> None:
    """The figure's title line: the temperature note (article at another temperature), what
    the error bars are, and a figure's own note, `extra` (what it left out, and why)."""
    parts = []
    if claims is not None:
        note = claims.temperature_note(cells["temperature"].to_list())
        if note:
            parts.append(note)
    if value is not None:
        parts.append(spread_note(cells, value))
    parts.append(extra)
    text = " | ".join(p for p in parts if p)
    if text:
        fig.suptitle(text, fontsize=9)


def legend_below(fig, axes, ncol: int | None = None) -> None:
    """One legend under the panels with every entry of every panel, once; none inside."""
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab and not lab.startswith("_") and lab not in labels:
                handles.append(h)
                labels.append(lab)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    # the arms first, the article's entries after them
    order = sorted(range(len(labels)), key=lambda i: "article" in labels[i])
    if handles:
        labels = [labels[i] for i in order]
        n, labels = legend_columns(fig, labels, ncol or min(len(labels), 4), LEGEND_PT)
        # the estimate can miss by a column's pads: measure the legend itself and take a
        # column away until it fits the figure's width (figure_checks: clipped)
        r = fig.canvas.get_renderer()
        while True:
            leg = fig.legend([handles[i] for i in order], labels, loc="outside lower center",
                             fontsize=LEGEND_PT, frameon=False, ncol=n)
            if n == 1 or leg.get_window_extent(r).width <= 0.98 * fig.bbox.width:
                break
            leg.remove()
            n -= 1


LEGEND_PT = 7


def legend_columns(fig, labels: list[str], ncol: int, size_pt: float) -> tuple[int, list[str]]:
    """The most columns (at most `ncol`) whose entries fit the figure's width (an entry: its
    handle, pads and text; the legend fills column by column), and the labels, wrapped when
    even one column is too wide. Measured with the figure's renderer before any draw."""
    from matplotlib.font_manager import FontProperties

    r = fig.canvas.get_renderer()
    fs = size_pt * fig.dpi / 72  # px
    extra = (2.0 + 0.8 + 2.0) * fs  # handlelength, handletextpad, columnspacing (defaults)
    room = 0.95 * fig.bbox.width
    prop = FontProperties(size=size_pt)

    def width(text: str) -> float:
        return max(r.get_text_width_height_descent(line, prop, ismath=False)[0]
                   for line in text.split("\n"))

    if any(width(lab) + extra > room for lab in labels):
        chars = max(10, int(len(max(labels, key=len)) * (room - extra)
                            / max(width(lab) for lab in labels)))
        labels = [textwrap.fill(lab, chars, break_long_words=False) for lab in labels]
    entry = [width(lab) + extra for lab in labels]
    for n in range(max(ncol, 1), 0, -1):
        rows = -(-len(entry) // n)
        cols = [max((entry[i] for i in range(len(entry)) if i // rows == j), default=0)
                for j in range(n)]
        if sum(cols) <= room:
            return n, labels
    return 1, labels


def figure(ncols: int, size: tuple[float, float]):
    """A row of panels in the constrained layout (which makes room for `legend_below`)."""
    return plt.subplots(1, ncols, figsize=size, layout="constrained")


def level_stats(part: pl.DataFrame, x: str, value: str, factor: float = 1.0):
    """Per level of `x` (sorted): the levels, the stats of `value` over the runs, and the
    runs themselves (scaled)."""
    xs, st, runs = [], [], []
    for (lv,), at in part.sort(x).group_by([x], maintain_order=True):
        vals = [v * factor for v in at[value].to_list() if v is not None]
        xs.append(lv)
        st.append(stats(vals))
        runs.append(vals)
    return xs, st, runs


def lines_by_streams(ax, f: Finding, cells: pl.DataFrame, value: str, styles: dict) -> None:
    """Each arm's mean of `value` per number of streams (runs as dots, min-max bars), on the
    streams axis of every level the cells measured."""
    levels = sorted({x for x in cells["concurrency"].to_list() if x is not None})
    for label in labels_in(f, cells):
        xs, s, runs = level_stats(cells.filter(pl.col("label") == label), "concurrency", value)
        mean_line(ax, xs, s, styles[label], label, runs, levels)
    streams_axis(ax, cells["concurrency"].to_list())


def changes_by_streams(ax, f: Finding, cells: pl.DataFrame, styles: dict,
                       as_ratio: bool = False) -> None:
    """Each arm but the baseline: its change against the baseline per number of streams (%,
    or a ratio with `as_ratio`), from `change_stats`."""
    base = f.study.baseline
    levels = sorted({x for x in cells["concurrency"].to_list() if x is not None})
    for label in labels_in(f, cells):
        if label != f.labels.get(base, base):
            xs, s, runs = change_stats(cells, base, label, as_ratio=as_ratio)
            mean_line(ax, xs, s, styles[label], label, runs, levels)


def change_stats(cells: pl.DataFrame, baseline: str, label: str, value: str = "agg_tok_s",
                 as_ratio: bool = False):
    """Per concurrency: an arm's change against the baseline arm's mean at the same level,
    run by run (%; as_ratio: x), with its stats: (levels, stats, runs)."""
    xs, st, runs = [], [], []
    for _, at in cells.sort(READING).group_by(READING, maintain_order=True):
        base = at.filter(pl.col("arm") == baseline)[value].drop_nulls()
        mine = at.filter(pl.col("label") == label)[value].to_list()
        if not base.len() or not mine:
            continue
        ch = [metrics.relative_change_pct(v, base.mean()) for v in mine]
        ch = [1 + v / 100 if as_ratio else v for v in ch if v is not None]
        xs.append(at["concurrency"][0])
        st.append(stats(ch))
        runs.append(ch)
    return xs, st, runs


def fit_text(fig) -> None:
    """Wrap what would not fit before the figure is drawn: a panel title wider than its panel
    (the figure's width over its columns), an axis label longer than its panel's side (the
    figure's height over its rows for a y label; the
    legend below the panels is fitted where it is made, `legend_below`). Text extents are
    measured with the figure's renderer, no draw, so a figure whose text fits is unchanged."""
    r = fig.canvas.get_renderer()
    axes = [ax for ax in fig.axes if ax.get_visible()]
    if not axes:
        return
    w, h = fig.bbox.width, fig.bbox.height
    cols = max(len({round(ax.get_position().x0, 2) for ax in axes}), 1)
    rows = max(len({round(ax.get_position().y0, 2) for ax in axes}), 1)
    room = {"title": 0.7 * w / cols, "x": 0.75 * w / cols, "y": 0.62 * h / rows}
    for ax in axes:
        for kind, t in (("title", ax.title), ("x", ax.xaxis.label), ("y", ax.yaxis.label)):
            _wrap_to(t, room[kind], r, along="height" if kind == "y" else "width")


def _wrap_to(t, width_px: float, renderer, along: str = "width") -> None:
    """Wrap text `t` at word boundaries until its extent `along` (the width, or the height of
    a rotated y label) is at most `width_px` (or one word a line)."""
    def size() -> float:
        return getattr(t.get_window_extent(renderer), along)

    text = t.get_text()
    if not text or size() <= width_px:
        return
    lines = text.split("\n")  # its own line breaks stay; each line is wrapped alone
    for chars in range(max(map(len, lines)) - 1, 0, -4):
        t.set_text("\n".join(textwrap.fill(line, chars, break_long_words=False) or line
                             for line in lines))
        if size() <= width_px:
            return
