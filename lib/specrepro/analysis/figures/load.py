"""Figures of article B's schedule under load (notebook 06) and the bill (notebook 07).

Design (the package's __init__.py has the suite's figures; common.py the shared pieces):
- `load_sweep`: throughput against streams (measured, article in a panel of its own) and
  each arm's ratio to no speculation on one axis, run by run against the baseline's mean,
  with the article's ratios marked at its own levels (8 and 32 streams; a level this run
  does not reach is labelled so on the axis) and the crossing of the arm the claims say
  crosses the baseline (`crossing_arm`: the arm claims.yaml's checks put above the study's
  baseline at the lowest level and below it at the highest; notebook 06's static 7 drafts),
  found by what the claim says of it, never by its method or draft count.
- `bill_chart`: KV pool per arm; the pool's change against MTP beside both articles' (the
  MTP arm found through claims.yaml, `kv_reference`: the study arm mapped to a published
  MTP arm, which vLLM and SGLang run as an EAGLE head; where the study has none, nothing of
  the articles' is drawn and the title says so); tokens per joule where a power source
  measured it (else the panel says why not), and the article's in a panel and on an axis
  of its own (0.2-5.4 tok/J on a 27B target against tens on a 12M one).
"""

from __future__ import annotations

import math

import polars as pl

from specrepro import findings, metrics
from specrepro.analysis.figures import common as fc
from specrepro.analysis.figures import marks as fm
from specrepro.analysis.figures.sweep import TPS, article_lines, published_against_base
from specrepro.analysis.finding import tables
from specrepro.analysis.finding.finding import Finding
from specrepro.analysis.verdict.claims import Claims, ClaimsError
from specrepro.analysis.verdict.overlay import published_points
from specrepro.published import load_arms, load_published


def load_sweep(f: Finding, claims: Claims) -> fc.plt.Figure:
    """Throughput against streams (measured, article) and each arm's ratio to no
    speculation, with the crossing of static 7 drafts marked."""
    st, c = fc.styles(f), f.cells
    fig, axes = fc.figure(3, (14, 5.2))
    speed = fm.untested(f, claims, "agg_tok_s")
    for ax in (axes[0], axes[2]):
        fm.declare(ax, speed)
    fc.lines_by_streams(axes[0], f, c, "agg_tok_s", st)
    axes[0].set(title="measured (this engine)", xlabel="concurrent streams", ylabel=TPS)
    pub = published_points(claims, "agg_tok_s").filter(
        pl.col("workload") == claims.published_workload(c["workload"][0]))
    article_lines(axes[1], pub, f)
    axes[1].set(title=f"article {claims.article}", xlabel="concurrent streams", ylabel=TPS)
    base = f.study.baseline
    base_label = f.labels.get(base, base)
    fc.changes_by_streams(axes[2], f, c, st, as_ratio=True)
    for row in published_against_base(pub, base, f.labels).to_dicts():
        color = st.get(f.labels.get(row["study_arm"]), {}).get("color", "black")
        fc.article_marker(axes[2], row["concurrency"], row["value"] / row["_b"], color)
    fc.key(axes[2], f"article {claims.article} (diamonds, the arm's colour)", "article",
           **fc.ARTICLE)
    crossing = crossing_arm(f, claims)
    cross, note = _crossing(c, crossing, base, base_label) if crossing else (None, "")
    if cross is not None:
        axes[2].axvline(cross, color="grey", linestyle=":", label=note)
    axes[2].axhline(1.0, color="grey", linewidth=0.8)
    fc.streams_axis(axes[2], c["concurrency"].to_list(), pub["concurrency"].to_list())
    axes[2].set(title=f"against {base_label}", xlabel="concurrent streams",
                ylabel=f"throughput / {base_label} (x)")
    fc.title(fig, claims, c, "agg_tok_s", extra="" if cross is not None else note)
    fm.mark(fig)
    fc.legend_below(fig, axes)
    return fig


def crossing_arm(f: Finding, claims: Claims) -> str | None:
    """The study arm the claims say crosses the baseline as load grows: one that a compare
    check puts above the study's baseline at the lowest level and another below it at the
    highest (06: "static 7 drafts beats no speculation at low load" and "is slower than no
    speculation at the highest load"). None where no arm of the study is claimed to cross;
    more than one fails naming the claims entry, since the figure marks one crossing."""
    base, arms = f.study.baseline, [a.name for a in f.study.arms]

    def claimed(level: str, direction: str) -> set[str]:
        return {r.a.arm for r in claims.checks
                if r.kind == "compare" and r.a is not None and r.b is not None
                and r.b.arm == base and r.a.concurrency == level and r.direction == direction}

    found = [a for a in arms if a in claimed("lowest", "higher") & claimed("highest", "lower")]
    if len(found) > 1:
        raise ClaimsError(f"{findings.shown(claims.notebook_id)}: checks claim {found} each cross "
                         f"the baseline {base!r} (above it at the lowest level, below at the "
                         "highest); the load figure marks one crossing: expected at most one")
    return found[0] if found else None


def _crossing(cells: pl.DataFrame, arm: str, base: str, base_label: str
              ) -> tuple[float | None, str]:
    """Where static 7 drafts crosses below the baseline, and the words for it. A crossing is
    drawn only where the ratio goes from above 1 to below between two measured levels
    (tables.crossing's interpolation); below already at the lowest level is no crossing:
    the note says 'below at every level measured' (or from the lowest level, where it comes
    back above later), and no line is drawn."""
    cross = tables.crossing(cells, arm, base)
    levels = sorted({x for x in cells["concurrency"].to_list() if x is not None})
    if cross is None or not levels:
        return None, ""
    if cross > levels[0]:
        return cross, f"static 7 crosses below {base_label} at {cross:.3g} streams"
    gain = tables.gain_over(cells.filter(pl.col("arm").is_in([arm, base])), base)
    ahead = gain.filter((pl.col("arm") == arm) & (pl.col("change_pct") >= 0)).height
    span = f"{levels[0]}-{levels[-1]} streams"
    return None, (f"static 7 below {base_label} at every level measured ({span})" if not ahead
                  else f"static 7 below {base_label} already at {levels[0]} stream(s), the "
                       "lowest measured, not at every level")


def bill_chart(f: Finding, claims: Claims) -> fc.plt.Figure:
    """KV pool tokens per arm; the pool's change against the MTP arm in % beside the
    articles'; tokens per joule measured where there is a power source, and the article's on
    an axis of its own."""
    st, c = fc.styles(f), f.cells
    fig, grid = fc.plt.subplots(2, 2, figsize=(13, 8.4), layout="constrained")
    axes = list(grid.flat)
    ref = kv_reference(f, claims)
    kv = tables.kv_cost(c, ref or f.study.baseline)
    labels = kv["label"].to_list()
    axes[0].bar(range(len(labels)), kv["kv_pool_tokens"].fill_null(0),
                color=[st[lab]["color"] for lab in labels])
    axes[0].set_xticks(range(len(labels)), labels, rotation=20, fontsize=7)
    axes[0].set(ylabel="KV pool (tokens)", title="KV pool at the same memory budget")
    axes[0].yaxis.set_major_formatter(lambda v, _: tables.fmt(int(v)))
    notes = _kv_changes(axes[1], f, claims, kv, ref, st)
    fm.declare(axes[2], fm.untested(f, claims, "tokens_per_joule"))
    _energy(axes[2], axes[3], f, claims, st)
    fc.title(fig, None, c, "tokens_per_joule" if f.has_power else None, extra="; ".join(notes))
    fm.mark(fig)
    fc.legend_below(fig, axes)
    return fig


def kv_reference(f: Finding, claims: Claims) -> str | None:
    """The study arm the articles' KV changes are against: the one claims.yaml maps to a
    published MTP arm (arms.csv `method` mtp), whatever method an engine runs it as (vLLM
    and SGLang run the MTP head as an EAGLE head); None where the study has no such arm."""
    method = dict(load_arms().select("arm", "method").iter_rows())
    return next((a.name for a in f.study.arms if method.get(claims.arms.get(a.name)) == "mtp"),
                None)


def _kv_changes(ax, f: Finding, claims: Claims, kv: pl.DataFrame, ref: str | None,
                st: dict) -> list[str]:
    """Each arm's KV pool change against `ref` (else the baseline, and no article figure:
    both articles' are against MTP), the articles' beside it; returns the figure's notes."""
    against = ref or f.study.baseline
    measured = kv.filter(pl.col("arm") != against)
    names = measured["label"].to_list()
    ax.bar(range(len(names)), measured["change_pct"].fill_null(0),
           color=[st[lab]["color"] for lab in names])
    notes = []
    if ref is None:
        notes.append("KV change: the articles' are against MTP, and no arm of this study "
                     "stands for it, so none is drawn")
    else:
        pub = published_points(claims, "kv_pool_tokens")
        pub_ref = pub.filter(pl.col("study_arm") == ref)["value"]
        for row in pub.filter(pl.col("study_arm") != ref).to_dicts() if pub_ref.len() else ():
            label = f.labels.get(row["study_arm"])
            if label in names:
                fc.article_marker(ax, names.index(label),
                                  metrics.relative_change_pct(row["value"], pub_ref[0]))
        a_pub = article_a_kv_change(claims)
        if a_pub is not None:
            ax.axhline(a_pub, color="black", linestyle=":",
                       label=f"article A: block drafter against MTP, {a_pub:+.0f}%")
        fc.key(ax, "article B (vLLM 0.32.0)", "article", **fc.ARTICLE)
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(names)), names, rotation=20, fontsize=7)
    ax.set(ylabel=f"KV pool against {f.labels.get(against, against)} (%)",
           title="what the drafter costs in context")
    return notes


def _log_axis(ax, values: list[float]) -> None:
    """A log y axis ticked at 1-2-5 steps across `values`, labelled as plain numbers."""
    lo, hi = min(values), max(values)
    ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(lo)) - 1,
                                          math.ceil(math.log10(hi)) + 1) for m in (1, 2, 5)]
    ax.set_yscale("log")
    ax.set_ylim(lo / 1.5, hi * 1.5)
    ax.set_yticks([t for t in ticks if lo / 1.5 <= t <= hi * 1.5],
                  [f"{t:g}" for t in ticks if lo / 1.5 <= t <= hi * 1.5])
    ax.minorticks_off()


ARTICLE_TPJ = ["s", "^", "v", "P", "X", "h"]  # one hollow marker per article arm (not the
# KV panel's diamond)


def _energy(ax, ax_pub, f: Finding, claims: Claims, st: dict) -> None:
    """Tokens per joule measured (where a power source measured watts) and the article's,
    each on its own axis: a 12M target on one card and a 27B one on another share no scale
    (0.2-5.4 tok/J in the article would lie flat along the bottom of a measured 0-140)."""
    ylabel = "tokens per joule (tok/J, log scale)"
    if f.has_power:
        fc.lines_by_streams(ax, f, f.cells, "tokens_per_joule", st)
        _log_axis(ax, f.cells["tokens_per_joule"].drop_nulls().to_list())
        ax.set(xlabel="concurrent streams", ylabel=ylabel, title="energy, measured (this engine)")
    else:
        fc.no_data(ax, "no power source on this run:\nno NVML GPU, so no watts\n"
                       "and no tokens per joule")
        ax.set(title="energy, measured (this engine)")
    pub = published_points(claims, "tokens_per_joule")
    arm_label = dict(load_arms().select("arm", "label").iter_rows())
    works = pub["workload"].drop_nulls().to_list()
    usual = max(set(works), key=works.count) if works else None  # the others are marked
    groups = list(pub.group_by(["arm"], maintain_order=True))
    for i, ((arm,), part) in enumerate(groups):
        color = st.get(f.labels.get(part["study_arm"][0]), {}).get("color", "black")
        # each arm a little to one side of its level, so equal figures do not hide each other
        part = part.with_columns(pl.col("concurrency").cast(pl.Float64)
                                 * 2 ** ((i - (len(groups) - 1) / 2) * 0.05))
        ax_pub.scatter(part["concurrency"], part["value"], marker=ARTICLE_TPJ[i % 6], s=46,
                       facecolor="none", edgecolor=color, linewidth=1.2, zorder=5,
                       gid=f"article-tpj|{arm}",
                       label=f"article {part['article'][0]}: {arm_label.get(arm, arm)}")
        for r in part.filter(pl.col("workload") != usual).to_dicts():
            ax_pub.annotate(r["workload"], (r["concurrency"], r["value"]), fontsize=7,
                            xytext=(6, -3), textcoords="offset points")
    which = "/".join(sorted(set(pub["article"].to_list()))) or claims.article
    if pub.height:
        fc.streams_axis(ax_pub, pub["concurrency"].to_list())
        _log_axis(ax_pub, pub["value"].to_list())  # 0.2 at one stream to 5.4 at 32
    else:
        fc.no_data(ax_pub, "the article prints no tokens per joule for these arms")
    ax_pub.set(xlabel="concurrent streams", ylabel=ylabel,
               title=f"energy, article {which} (its own card and axis)"
                     + (f"; {usual} unless marked" if len(set(works)) > 1 else ""))


def article_a_kv_change(claims: Claims) -> float | None:
    """Article A's KV pool change, block drafter (5 drafts) against MTP (%): the published
    arms claims.yaml maps to article A's pair (`dflash-k5`, `mtp-k3`)."""
    block, mtp = claims.arms.get("dflash-k5"), claims.arms.get("mtp-k3")
    pub = load_published("A").filter(pl.col("metric") == "kv_pool_tokens")
    vals = {r["arm"]: r["value"] for r in pub.to_dicts()}
    if block in vals and mtp in vals:
        return metrics.relative_change_pct(vals[block], vals[mtp])
    return None
