"""Figures of article B's paired comparisons (notebooks 03, 04, 05) and the FP8 gates.

Design (the package's __init__.py has the suite's figures; common.py the shared pieces):
- `acceptance_pairs`: per workload and level, each arm's tokens per step (mean, min-max)
  with the article's figure marked at the compared temperature (overlay.points_at: the
  same rule the overlay table uses, so article B's T=1.0 GSM8K figure, 5.92, is never
  drawn against greedy measurements, where its greedy figure is 6.17); measured tok/s; and
  the article's tok/s in a panel of its own (hardware apart).
- `gate_chart`: each declared gate the verdict tested, its value against its threshold; pass
  and fail (as the verdict judged them, `gate_status`) differ in colour, hatch and text, not
  colour alone, and the value is printed under the bar (a bar of 0 draws nothing). A gate
  the verdict calls not testable here (an engine that served the same drafter to both arms,
  a host-bound baseline, a memory set by a flag) or that was not measured is never drawn as
  a pass or a fail: it is named with why in a panel of text beside the tested ones.
"""

from __future__ import annotations

import textwrap

import polars as pl

from specrepro.analysis.figures import common as fc
from specrepro.analysis.figures import marks as fm
from specrepro.analysis.finding import tables
from specrepro.analysis.finding.cell_key import LEVEL, key_of
from specrepro.analysis.finding.finding import Finding
from specrepro.analysis.verdict.claims import Claims, claims_for
from specrepro.analysis.verdict.gates import evaluate_gates
from specrepro.analysis.verdict.overlay import points_at, published_points
from specrepro.analysis.verdict.verdicts import verdict
from specrepro.published import load_arms, load_gates

TPS = "aggregate decode throughput (tok/s)"


def acceptance_pairs(f: Finding, claims: Claims) -> fc.plt.Figure:
    """Acceptance length per workload and level for each arm, the article's marked; and
    throughput per arm in two panels (measured, article). An arm is labelled as the engine
    served it (figures_marks.served_labels); the article's bars are named as the article's
    arms, hollow and hatched, never in a measured arm's colour; a group's repeated 4-grams
    are given per arm, never pooled across arms."""
    st, c = fc.styles(f), f.cells
    shown = fm.served_labels(f)
    groups = c.select(LEVEL).unique(maintain_order=True).to_dicts()
    labels = fc.labels_in(f, c)
    fig, axes = fc.figure(3, (14, 4.8))
    width = 0.8 / max(len(labels), 1)
    for ax, metric in ((axes[0], "acceptance_length"), (axes[1], "agg_tok_s")):
        fm.declare(ax, {shown[k]: why for k, why in fm.untested(f, claims, metric).items()})
    pub_acc = published_points(claims, "acceptance_length")
    pub_tps = published_points(claims, "agg_tok_s")
    pub_look = _article_looks(claims, [fc.arm_of(f, lab) for lab in labels])
    names = []
    for gi, grp in enumerate(groups):
        part = c.filter(*(pl.col(k) == grp[k] for k in LEVEL if grp[k] is not None))
        reps = [part.filter(pl.col("label") == lab)["repeated_4gram_share"].drop_nulls()
                for lab in labels]
        # per arm, in the legend's order: one share pooled over arms hides that one arm loops
        rep = "/".join(f"{100 * r.mean():.0f}" for r in reps if r.len())
        names.append(f"{grp['workload']}\n{tables.streams(grp['concurrency'])}"
                     + (f"\nrep. {rep}%" if rep else ""))
        for li, label in enumerate(labels):
            x = gi + (li - (len(labels) - 1) / 2) * width
            mine = part.filter(pl.col("label") == label)
            arm = fc.arm_of(f, label)
            for ax, col in ((axes[0], "acceptance_length"), (axes[1], "agg_tok_s")):
                fc.mean_bar(ax, x, fc.stats(mine[col].to_list()), st[label], width * 0.9,
                            label=shown[label])
            at = (arm, *key_of(grp, LEVEL))
            for row in points_at(pub_acc, claims, *at).to_dicts():
                fc.article_marker(axes[0], x, row["value"],
                                  gid=f"article|{arm}|{grp['workload']}|{grp['concurrency']}")
            hit = points_at(pub_tps, claims, *at)
            if hit.height:
                name, hatch = pub_look[arm]
                axes[2].bar([x], [hit["value"][0]], width=width * 0.9, color="white",
                            hatch=hatch, edgecolor="black", label=name,
                            gid=f"article-bar|{arm}")
    fc.key(axes[0], f"{fc.article_tag(claims, c)} (at the compared temperature)", "article",
           **fc.ARTICLE)
    for ax, ttl, ylabel in (
            (axes[0], "tokens per step", "acceptance length (tokens per step)"),
            (axes[1], "measured (this engine)", TPS),
            (axes[2], f"article {claims.article}: its engines, another machine", TPS)):
        ax.set_xticks(range(len(groups)), names, fontsize=7)
        ax.set(title=ttl, ylabel=ylabel)
        if any("\nrep. " in n for n in names):
            ax.set_xlabel("rep.: the outputs' repeated 4-grams, per arm in the legend's order",
                          fontsize=7)
    fc.title(fig, claims, c, "acceptance_length")
    fm.mark(fig)
    fc.legend_below(fig, axes, ncol=2)  # arms and the article's engines: long names
    return fig


ARTICLE_HATCHES = ["//", "\\\\", "xx", "..", "++", "oo"]


def _article_looks(claims: Claims, arms: list[str]) -> dict[str, tuple[str, str]]:
    """{study arm: (legend name, hatch)} of the article's arm each study arm is compared
    with: named by the article's own label (its engine and version, arms.csv), one hatch per
    article arm, so the article's series never borrow a measured arm's colour or name."""
    label = dict(load_arms().select("arm", "label").iter_rows())
    pub = list(dict.fromkeys(claims.arms.get(a, a) for a in arms))
    return {a: (f"article {claims.article}: {label.get(claims.arms.get(a, a), claims.arms.get(a, a))}",
                ARTICLE_HATCHES[pub.index(claims.arms.get(a, a)) % len(ARTICLE_HATCHES)])
            for a in arms}


def gate_status(f: Finding, claims: Claims) -> dict[str, tuple[str, str]]:
    """Each study gate's outcome in the verdict and why. A gate that declares one of the
    article's again (same workload, streams and threshold) is judged by the claim's check of
    that gate; the others are the verdict's substitutes, one each in the study's order
    (verdicts._substitutes' rule)."""
    v = verdict(f, claims)
    own = {rule.gate: check for rule, check in zip(claims.checks, v.checks, strict=False)
           if rule.kind == "gate"}
    article = {(r["workload"], r["concurrency"], r["threshold"]): r["gate"]
               for r in load_gates().iter_rows(named=True)}
    subs = iter([c for c in v.checks if c.substitute])
    out = {}
    for gate in f.study.gates:
        key = (gate.workload, gate.concurrency, gate.threshold)
        check = own.get(article[key]) if key in article else next(subs, None)
        out[gate.name] = ((check.outcome, check.reason) if check is not None else
                          ("not testable here", "the verdict has no check of this gate"))
    return out


TESTED = {"holds": "pass", "does not hold": "fail"}


def gate_chart(f: Finding, claims: Claims | None = None) -> fc.plt.Figure:
    """Each declared gate the verdict tested: the gated value against its threshold, pass or
    fail as the verdict judged it; a gate it could not test is named, with why, in a panel
    of its own, never drawn as a pass or a fail."""
    claims = claims or claims_for(f.notebook_id)
    status = gate_status(f, claims)
    rows = evaluate_gates(f.cells, f.study.gates).to_dicts()
    tested = [r for r in rows if status[r["gate"]][0] in TESTED and r["value"] is not None]
    untested = [r for r in rows if r not in tested]
    ratios = [1] * len(tested) + ([2] if untested else [])
    note = _untested_text(untested, status, 3.6 * 2)
    # the list alone is as tall as its lines, not a panel's height
    height = 3.9 if tested else 0.5 + 0.17 * (note.count("\n") + 1)
    fig, axes = fc.plt.subplots(1, len(ratios), figsize=(3.6 * sum(ratios), height),
                                squeeze=False, layout="constrained",
                                gridspec_kw={"width_ratios": ratios})
    look = {"pass": {"color": fc.PALETTE[2], "hatch": ""},
            "fail": {"color": fc.PALETTE[4], "hatch": "xx"}}
    for ax, row in zip(axes[0], tested, strict=False):
        result = TESTED[status[row["gate"]][0]]
        ax.bar([0], [row["value"]], edgecolor="black", gid=f"gate|{row['gate']}|{result}",
               **look[result])
        ax.axhline(row["threshold"], color="black", linestyle="--")
        unit = row["unit"] or ""
        # the value under the verdict: a bar of 0 is drawn as nothing
        ax.set_xticks([0], [f"{result.upper()}\n{tables.fmt(row['value'])} {unit}".strip()])
        ref = f.labels.get(row["reference_arm"], row["reference_arm"])
        ylabel = f"change against {ref} ({unit})" if row["reference_arm"] else unit
        words = tables.NAMES.get(row["metric"], (row["metric"],))[0]
        ax.set(title=f"{row['gate']}\n{words}, {row['workload']}, "
                     f"{tables.streams(row['concurrency'])}\ngate (dashed): {row['op']} "
                     f"{row['threshold']:g}", ylabel=ylabel)
        ax.title.set_fontsize(8)
    if untested:
        ax = axes[0][-1]
        ax.text(0.0, 1.0, note, transform=ax.transAxes, ha="left", va="top", fontsize=8,
                gid="gates-not-tested")
        ax.set_axis_off()
        ax.set_title("not testable here: no pass or fail drawn", fontsize=9)
    return fig


def _untested_text(rows: list[dict], status: dict, width_in: float) -> str:
    """The gates the verdict could not test, one bullet each with the first clause of why."""
    chars = int(width_in * 72 / (8 * 0.55) * 0.85)  # 8 pt text, ~0.55 em a character
    lines = []
    for r in rows:
        outcome, why = status[r["gate"]]
        why = why.split("; ")[0] if outcome == "not testable here" else "not measured"
        rule = f"{r['op']} {r['threshold']:g} {r['unit'] or ''}".rstrip()
        lines.append(textwrap.fill(f"\u2022 {r['gate']} ({rule}): {why}", chars,
                                   subsequent_indent="   "))
    return "\n".join(lines)
