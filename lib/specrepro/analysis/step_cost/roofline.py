"""Notebook 08's figure: each card's roofline with the measured and the published steps on it.

Design:
- One panel a card (step_cost/cards.yaml), x the arithmetic intensity of a step (the model's
  FLOPs over its bytes, FLOP/B, log), y the math rate a step reached (its FLOPs over the
  measured or published step time, TFLOP/s, log). The roof is min(peak, bandwidth x
  intensity): solid at the card's rated figures, dashed at its measured ones where measured;
  the ridge, where the two meet, is marked with its tokens a step for the panel's target.
- The points are step_cost_report.roofline_points: filled markers for steps measured here
  (the stand-in's cells, this suite's), hollow black-edged ones for the articles' published
  steps (the house style's article marker, figures_common.ARTICLE). A kind of arm keeps one
  marker in every panel; the legend sits below the panels, a key only for what a panel drew.
- A card with no points still gets its roof (its data are the point), titled so.
"""

from __future__ import annotations

import math

import polars as pl

from specrepro.analysis.figures import common as fc
from specrepro.analysis.step_cost import model as sc
from specrepro.analysis.step_cost.data import card, cards, model

KINDS = ("no speculation", "block drafter", "MTP head / chain drafter")
MARK = dict(zip(KINDS, ("o", "s", "^"), strict=True))
# who measured a point and on which engine (the series up to its colon): one colour each,
# the house palette's; the articles' points are black, as every figure draws them
ENGINE_COLOR = {"vllm": fc.PALETTE[0], "sglang": fc.PALETTE[2], "embedded": fc.PALETTE[3],
                "transformers": fc.PALETTE[5]}
PANEL_TARGET = {"h200": "standin-target", "h100": "standin-target",
                "rtx_pro_6000_maxq": "qwen27b-nvfp4-b", "gb10": "qwen27b-nvfp4-a",
                "cpu": "small-target-fp32"}


def _roof(ax, c, precision: str, xs: list[float]) -> list[float]:
    ys = []
    for kind, style in (("rated", "-"), ("measured", "--")):
        bw = getattr(c, f"{kind}_bandwidth_gb_s").value
        table = c.peak_tflop_s if kind == "rated" else c.measured_peak_tflop_s
        peak = table.get(precision)
        if bw is None or peak is None or peak.value is None:
            continue
        roof = [min(peak.value, bw * x / 1e3) for x in xs]
        ax.plot(xs, roof, color="#555555", linestyle=style, linewidth=1.2,
                gid=f"roof|{kind}", label=f"roof at the {kind} bandwidth and {precision} peak")
        ys += roof
    return ys


def roofline_chart(points: pl.DataFrame, own_color: str = fc.PALETTE[1]) -> fc.plt.Figure:
    """One panel a card: the roofs and the points (step_cost_report.roofline_points)."""
    ids = list(cards())
    fig, axes = fc.figure(len(ids), (3.3 * len(ids), 4.4))
    xs = [2 ** (e / 4) for e in range(-8, 49)]  # 0.25 to 4,096 FLOP/B
    for ax, cid in zip(axes, ids, strict=True):
        c = card(cid)
        target = model(PANEL_TARGET[cid]) if cid in PANEL_TARGET else None
        precision = next(iter(target.gflop_per_token)) if target else "bf16"
        ys = _roof(ax, c, precision, xs)
        mine = points.filter(pl.col("card") == cid)
        for (series,), part in mine.group_by(["series"], maintain_order=True):
            kind = next((k for k in KINDS if series.endswith(k)), KINDS[0])
            who = series.split(":")[0]
            engine = who.split(", ")[-1].split(" ")[0]
            color = ("black" if who.startswith("article") else
                     own_color if not who.startswith("stand-in") else
                     ENGINE_COLOR.get(engine, fc.PALETTE[4]))
            published = part["kind"][0] == "published"
            style = ({"marker": MARK[kind], "s": 34, "facecolor": "none", "edgecolor": color,
                      "linewidth": 1.1} if published else
                     {"marker": MARK[kind], "s": 26, "color": color, "alpha": 0.8})
            ax.scatter(part["intensity"], part["tflop_s"], gid=f"points|{series}",
                       label=series, zorder=4, **style)
            ys += part["tflop_s"].to_list()
        peaks = {*c.peak_tflop_s, *c.measured_peak_tflop_s}
        if target is not None and set(target.gflop_per_token) <= peaks:
            # the ridge, where the card has a peak for the target's precision
            ridge = sc.ridge_tokens(c, target)
            ridge_i = (target.gflop_per_token[precision].value * 1e9 * ridge
                       / target.weights.n_bytes)
            ax.axvline(ridge_i, color="#999999", linestyle=":", linewidth=1.0,
                       gid="ridge", label="_ridge")
            ax.annotate(f"ridge: {ridge:,.0f} tokens a step", (ridge_i, 0.02),
                        xycoords=("data", "axes fraction"), fontsize=7, rotation=90,
                        ha="right", va="bottom")
        ax.set_xscale("log")
        ax.set_yscale("log")
        lo = min(y for y in ys if y > 0) if ys else 1e-3
        hi = max(ys) if ys else 1.0
        ax.set_ylim(10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(hi * 1.5)))
        ax.set_xlim(xs[0], xs[-1])
        what = "" if mine.height else " (no step measured or published)"
        ax.set(title=f"{cid}{what}", xlabel="FLOP a byte read (a step's intensity)",
               ylabel="TFLOP/s a step reached")
    fc.legend_below(fig, axes, ncol=3)
    fig.suptitle("Each card's roofline (solid: rated, dashed: measured here) with the steps "
                 "measured here (filled) and published by the articles (hollow)", fontsize=9)
    return fig
