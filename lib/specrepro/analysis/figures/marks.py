"""Data a verdict did not test, drawn marked.

Design:
- `untested(f, claims, metric)` reads the verdict (verdicts.py, the one home of outcomes):
  for each arm label, whether the checks of `metric` leave its series untested and why. An
  arm that a check of the metric compares is untested when every such check of it is not
  testable or not resolvable here; an arm no check names (01's 4-draft block drafter, whose
  tok/s runs on the same substrate) follows the metric's checks when every one of them is
  untested. A metric no check reads has nothing to say, and nothing is marked.
- A figure declares, per panel, the series it draws from such data (`declare`, which puts
  them in figure_checks' registry on the axes) before drawing, and calls `mark(fig)` before
  its legend: a panel whose every labelled measured series is untested is hatched whole and
  its title says why (the arms keep their colours, so the article's panel still reads
  against them); in a panel where some series were tested, only the untested ones turn
  grey (lines, their run dots) or hatched (bars), and a legend key says why. figure_checks
  .unmarked then fails any declared series drawn unmarked (save_figure runs it), so a
  figure that declares and forgets to mark, or draws around the helpers, never ships.
- `served_labels`: an arm's label as the engine actually served it, where the verdict's
  same-drafts check (same_drafts.py) found the changed drafter never reached the engine.
"""

from __future__ import annotations

import polars as pl
from matplotlib.patches import Rectangle

from specrepro.analysis.figures import checks as figure_checks
from specrepro.analysis.finding.finding import Finding
from specrepro.analysis.verdict.claims import Claims
from specrepro.analysis.verdict.rules import UNTESTED
from specrepro.analysis.verdict.same_drafts import same_drafts
from specrepro.analysis.verdict.verdicts import Verdict, verdict
from specrepro.published import load_gates

GREY = "#8c8c8c"
HATCH = "////"
UNTESTED_GID = "untested|"  # gid prefix of a series greyed by `mark` (its legend key's group)


def short(outcome: str, reason: str) -> str:
    """'not testable here: a weight-read decode step absent: host-bound' from a check's
    outcome and reason: its head, before the measured figures in brackets and any '; '."""
    head = reason.split(" (")[0].split("; ")[0].strip().rstrip(":")
    return f"{outcome}: {head}" if head else outcome


def untested(f: Finding, claims: Claims, metric: str, v: Verdict | None = None
             ) -> dict[str, str]:
    """{arm label: why its `metric` series is untested} from the verdict's checks of
    `metric` (module docstring: an arm a check names, and one none names)."""
    v = v or verdict(f, claims)
    rows = [(arms, check) for rule, check in zip(claims.checks, v.own, strict=False)
            for m, arms in [_reads(rule, claims)] if m == metric]
    if not rows:
        return {}
    out: dict[str, str] = {}
    every = all(check.outcome in UNTESTED for _, check in rows)
    for arm, label in f.labels.items():
        mine = [c for arms, c in rows if arm in arms]
        if mine and all(c.outcome in UNTESTED for c in mine):
            out[label] = short(mine[0].outcome, mine[0].reason)
        elif not mine and every:
            out[label] = short(rows[0][1].outcome, rows[0][1].reason)
    return out


def _reads(rule, claims: Claims) -> tuple[str | None, set[str]]:
    """The measured metric a check reads and the study arms it reads it on; a gate's from
    published/gates.csv (a change in tok/s reads tok/s), its arms mapped back from the
    article's."""
    if rule.kind != "gate":
        return rule.metric, {s.arm for s in (rule.a, rule.b) if s is not None}
    g = load_gates().filter(pl.col("gate") == rule.gate).row(0, named=True)
    reverse = {pub: arm for arm, pub in claims.arms.items()}
    metric = g["metric"].removesuffix("_change_pct")
    return metric, {reverse[a] for a in (g["arm"], g["baseline_arm"]) if a in reverse}


def declare(ax, reasons: dict[str, str]) -> None:
    """Say which series this panel draws from untested data (figure_checks' registry)."""
    if reasons:
        figure_checks.declare_untested(ax, reasons)


def _series(ax) -> list:
    """The panel's labelled measured series: lines and bars with a legend label, not the
    article's (gid 'article...') nor a legend key (gid 'key|...')."""
    arts = list(ax.lines) + list(ax.containers)
    out = []
    for a in arts:
        gid = figure_checks.gid_of(a) or ""
        if a.get_label() and not a.get_label().startswith("_") and not gid.startswith(
                ("article", figure_checks.KEY)):
            out.append(a)
    return out


def mark(fig) -> None:
    """Mark every declared series of every panel (module docstring): the panel hatched
    whole with the reason in its title, or the series grey or hatched with a legend key."""
    for ax in fig.axes:
        reasons = figure_checks.declared_untested(ax)
        drawn = [a for a in _series(ax) if a.get_label() in reasons]
        if not drawn:
            continue
        whys = list(dict.fromkeys(reasons[a.get_label()] for a in drawn))
        if len(drawn) == len(_series(ax)):
            ax.add_patch(Rectangle((0, 0), 1, 1, transform=ax.transAxes, facecolor="none",
                                   edgecolor="#d9d9d9", hatch=HATCH, linewidth=0, zorder=0,
                                   gid=f"{figure_checks.PANEL_MARK}{'|'.join(whys)}"))
            ax.set_title(f"{ax.get_title()}\nhatched, {'; '.join(whys)}".strip(),
                         fontsize=ax.title.get_fontsize())
            continue
        for a in drawn:
            _grey_out(ax, a)
        bars = any(hasattr(a, "patches") for a in drawn)  # the key looks as the mark does
        for why in whys:
            if bars:
                ax.bar([0], [0], color="white", edgecolor=GREY, hatch=HATCH,
                       label=f"hatched: {why}", gid=f"{figure_checks.KEY}{UNTESTED_GID}")
            else:
                ax.plot([], [], color=GREY, marker="o", label=f"grey: {why}",
                        gid=f"{figure_checks.KEY}{UNTESTED_GID}")


def _grey_out(ax, art) -> None:
    """One series in grey (a line, with its run dots) or hatched (bars), gid `untested|`."""
    label = art.get_label()
    if hasattr(art, "patches"):
        for p in art.patches:
            p.set_hatch(HATCH)
            p.set_edgecolor(GREY)
            p.set_gid(f"{UNTESTED_GID}{label}")
        return
    art.set_color(GREY)
    art.set_gid(f"{UNTESTED_GID}{label}")
    for dots in ax.collections:  # the series' runs (figures_common.mean_line's gid)
        if dots.get_gid() == f"runs|{label}":
            dots.set_color(GREY)


def served_labels(f: Finding) -> dict[str, str]:
    """{label: label as shown}: the changed drafter's arm says it served the baseline's
    drafter where same_drafts found the two proposed identical drafts."""
    shown = dict(zip(f.labels.values(), f.labels.values(), strict=True))
    if same_drafts(f):
        base = f.labels.get(f.study.baseline, f.study.baseline)
        arm = f.labels[f.challenger]
        shown[arm] = f"{arm}; as served: {base}'s drafter (identical drafts)"
    return shown
