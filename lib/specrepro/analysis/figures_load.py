"""Figures of article B's schedule under load (notebook 06) and the bill (notebook 07).

Design (figures.py has the suite's; figures_common.py the shared pieces):
- `load_sweep`: throughput against streams (measured, article in a panel of its own) and
  each arm's ratio to no speculation on one axis, run by run against the baseline's mean,
  with the article's ratios marked at its own levels (8 and 32 streams; a level this run
  does not reach is labelled so on the axis) and the crossing of static 7 drafts.
- `bill_chart`: KV pool per arm, the pool's change against MTP beside both articles', and
  tokens per joule where a power source measured it (else the panel says why not).
"""

from __future__ import annotations

import polars as pl

from specrepro import metrics
from specrepro.analysis import figures_common as fc
from specrepro.analysis import tables
from specrepro.analysis.claims import Claims
from specrepro.analysis.figures_sweep import TPS, _published_against_base, article_lines
from specrepro.analysis.finding import Finding
from specrepro.analysis.overlay import published_points
from specrepro.published import load_published


def load_sweep(f: Finding, claims: Claims) -> fc.plt.Figure:
    """Throughput against streams (measured, article) and each arm's ratio to no
    speculation, with the crossing of static 7 drafts marked."""
    st, c = fc.styles(f), f.cells
    fig, axes = fc.figure(3, (14, 5.2))
    fc.lines_by_streams(axes[0], f, c, "agg_tok_s", st)
    axes[0].set(title="measured (this engine)", xlabel="concurrent streams", ylabel=TPS)
    pub = published_points(claims, "agg_tok_s").filter(
        pl.col("workload") == claims.published_workload(c["workload"][0]))
    article_lines(axes[1], pub, f)
    axes[1].set(title=f"article {claims.article}", xlabel="concurrent streams", ylabel=TPS)
    base = f.study.baseline
    base_label = f.labels.get(base, base)
    fc.changes_by_streams(axes[2], f, c, st, as_ratio=True)
    for row in _published_against_base(pub, base, f.labels).to_dicts():
        color = st.get(f.labels.get(row["study_arm"]), {}).get("color", "black")
        fc.article_marker(axes[2], row["concurrency"], row["value"] / row["_b"], color)
    fc.key(axes[2], f"article {claims.article} (diamonds, the arm's colour)", "article",
           **fc.ARTICLE)
    static7 = next((a.name for a in f.study.arms if a.resolved.method == "dflash"
                    and a.resolved.speculative.num_speculative_tokens == 7
                    and not a.resolved.speculative.num_speculative_tokens_per_batch_size), None)
    cross = tables.crossing(c, static7, base) if static7 else None
    if cross is not None:
        axes[2].axvline(cross, color="grey", linestyle=":",
                        label=f"static 7 below {base_label} from {cross:.3g} streams")
    axes[2].axhline(1.0, color="grey", linewidth=0.8)
    fc.streams_axis(axes[2], c["concurrency"].to_list(), pub["concurrency"].to_list())
    axes[2].set(title=f"against {base_label}", xlabel="concurrent streams",
                ylabel=f"throughput / {base_label} (x)")
    fc.title(fig, claims, c, "agg_tok_s")
    fc.legend_below(fig, axes)
    return fig


def bill_chart(f: Finding, claims: Claims) -> fc.plt.Figure:
    """KV pool tokens per arm, the pool's change against MTP in % beside the articles', and
    tokens per joule where there is a power source."""
    st, c = fc.styles(f), f.cells
    fig, axes = fc.figure(3, (14, 4.6))
    ref = next((a.name for a in f.study.arms if a.resolved.method == "mtp"), f.study.baseline)
    kv = tables.kv_cost(c, ref)
    labels = kv["label"].to_list()
    axes[0].bar(range(len(labels)), kv["kv_pool_tokens"].fill_null(0),
                color=[st[lab]["color"] for lab in labels])
    axes[0].set_xticks(range(len(labels)), labels, rotation=20, fontsize=7)
    axes[0].set(ylabel="KV pool (tokens)", title="KV pool at the same memory budget")
    axes[0].yaxis.set_major_formatter(lambda v, _: tables.fmt(int(v)))
    pub = published_points(claims, "kv_pool_tokens")
    pub_ref = pub.filter(pl.col("study_arm") == ref)["value"]
    measured = kv.filter(pl.col("arm") != ref)
    names = measured["label"].to_list()
    axes[1].bar(range(len(names)), measured["change_pct"].fill_null(0),
                color=[st[lab]["color"] for lab in names])
    if pub_ref.len():
        for row in pub.filter(pl.col("study_arm") != ref).to_dicts():
            label = f.labels.get(row["study_arm"])
            if label in names:
                fc.article_marker(axes[1], names.index(label),
                                  metrics.relative_change_pct(row["value"], pub_ref[0]))
    a_pub = article_a_kv_change(claims)
    if a_pub is not None:
        axes[1].axhline(a_pub, color="black", linestyle=":",
                        label=f"article A: block drafter against MTP, {a_pub:+.0f}%")
    fc.key(axes[1], "article B (vLLM 0.32.0)", "article", **fc.ARTICLE)
    axes[1].axhline(0, color="grey", linewidth=0.8)
    axes[1].set_xticks(range(len(names)), names, rotation=20, fontsize=7)
    axes[1].set(ylabel=f"KV pool against {f.labels.get(ref, ref)} (%)",
                title="what the drafter costs in context")
    if f.has_power:
        fc.lines_by_streams(axes[2], f, c, "tokens_per_joule", st)
        axes[2].set(xlabel="concurrent streams", ylabel="tokens per joule (tok/J)",
                    title="energy")
    else:
        fc.no_data(axes[2], "no power source on this run:\nno NVML GPU, so no watts\n"
                            "and no tokens per joule")
        axes[2].set(title="energy")
    fc.title(fig, None, c, "tokens_per_joule" if f.has_power else None)
    fc.legend_below(fig, axes)
    return fig


def article_a_kv_change(claims: Claims) -> float | None:
    """Article A's KV pool change, block drafter (5 drafts) against MTP (%): the published
    arms claims.yaml maps to article A's pair (`dflash-k5`, `mtp-k3`)."""
    block, mtp = claims.arms.get("dflash-k5"), claims.arms.get("mtp-k3")
    pub = load_published("A").filter(pl.col("metric") == "kv_pool_tokens")
    vals = {r["arm"]: r["value"] for r in pub.to_dicts()}
    if block in vals and mtp in vals:
        return metrics.relative_change_pct(vals[block], vals[mtp])
    return None
