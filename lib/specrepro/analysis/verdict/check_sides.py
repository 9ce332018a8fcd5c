"""The two sides a check compares: the measured values of each rule side, and the article's.

Design:
- A rule (analysis/verdict/rules.py) names two sides, `a` and `b` (an arm, a workload, a level, a
  temperature); a check compares `a` with `b` on the measured cells and, separately, in the
  article's published figures. This module reads both: `measured_pair` the runs of each
  side at the level it resolves to (`Measured`), `article_pair` / `article_single` /
  `published_runs` the article's values; analysis/verdict/verdicts.py turns them into outcomes.
- A side's level resolves per side: `lowest` / `highest` is the lowest / highest
  concurrency the study declares for both arms, which must then have been measured for both
  (a partial store, a run stopped at its deadline, makes such a check not testable here,
  naming the level, rather than judging it at a lower one); with no declared levels (a
  finding built by hand), the lowest / highest at which both arms were measured; on the
  measured side and, separately, in the article (which may have reached 16 streams where
  this study stops at 8: both are named). A published figure matches a measured one at the
  same workload (claims.yaml `workloads` maps names) and temperature (or claims.yaml
  `published_temperature`), and of several published rows for one point the one the
  overlay compares (`overlay.choose`).
- A side that cannot be read raises `NotTestable`, its message the reason a reader sees.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import polars as pl

from specrepro.analysis.finding import tables
from specrepro.analysis.finding.finding import Finding, declared_cells
from specrepro.analysis.verdict.claims import Claims
from specrepro.analysis.verdict.overlay import choose
from specrepro.analysis.verdict.rules import Rule, Side
from specrepro.published import load_published

STATS = ("value", "mean", "approx")  # published figures of one point (not min, max, a range)


class NotTestable(Exception):
    """A check cannot be evaluated on this run; the message says why."""


# ------------------------------------------------------------------ measured side


@dataclass
class Measured:
    """One side's runs of a metric at the workload, level and temperature it resolved to."""

    values: list[float]
    workload: str | None
    concurrency: int | None
    temperature: float | None

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    @property
    def lo(self) -> float:
        return min(self.values)

    @property
    def hi(self) -> float:
        return max(self.values)


def arm_cells(f: Finding, arm: str) -> pl.DataFrame:
    if arm not in {a.name for a in f.study.arms}:
        raise NotTestable(f"this suite's study has no arm {arm!r}")
    cells = f.cells.filter(pl.col("arm") == arm)
    if not cells.height:
        raise NotTestable(f"arm {arm!r} has no successful measurement")
    return cells


def _only(cells: pl.DataFrame, column: str, wanted, what: str):
    have = sorted(set(cells[column].drop_nulls().to_list()))
    if wanted is not None:
        if wanted not in have:
            raise NotTestable(f"{what} {wanted!r} was not measured (measured: {have})")
        return wanted
    if len(have) != 1:
        raise NotTestable(f"the check names no {what} and the study measured {have}")
    return have[0]


def _resolve(f: Finding, side: Side, other: Side | None) -> tuple[pl.DataFrame, dict]:
    """The cells of one side at its workload and temperature, and the levels both sides share."""
    cells = arm_cells(f, side.arm)
    workload = _only(cells, "workload", side.workload, "workload")
    temp = _only(cells, "temperature", side.temperature, "temperature")
    part = cells.filter((pl.col("workload") == workload) & (pl.col("temperature") == temp))
    levels = set(part["concurrency"].to_list())
    declared = _declared_levels(f, side.arm, workload, temp)
    if other is not None:
        oc = arm_cells(f, other.arm)
        ow = _only(oc, "workload", other.workload or side.workload, "workload")
        ot = _only(oc, "temperature", other.temperature, "temperature")
        levels &= set(oc.filter((pl.col("workload") == ow) & (pl.col("temperature") == ot))
                      ["concurrency"].to_list())
        declared &= _declared_levels(f, other.arm, ow, ot)
    return part, {"workload": workload, "temperature": temp, "levels": sorted(levels),
                  "declared": sorted(declared)}


def _declared_levels(f: Finding, arm: str, workload: str, temp: float) -> set[int]:
    """The concurrency levels the finding's study declares for one arm, workload and
    temperature."""
    d = declared_cells(f.study)
    return set(d.filter((pl.col("arm") == arm) & (pl.col("workload") == workload)
                        & (pl.col("temperature") == temp))["concurrency"].to_list())


def _level(wanted, levels: list[int], where: str, declared: list[int] = (),
           empty_ok: bool = False) -> int | None:
    if wanted == "any":
        return None
    if wanted in ("lowest", "highest") and declared:
        level = declared[0] if wanted == "lowest" else declared[-1]
        if level not in levels and not empty_ok:
            raise NotTestable(
                f"{where}: the {wanted} level this study declares for both arms, {level} "
                f"streams, has no successful measurement of both (cells missing from the "
                f"store; both measured at: {', '.join(map(str, levels)) or 'no level'})")
        return level
    if not levels:
        raise NotTestable(f"{where}: no concurrency level has both arms measured")
    if wanted == "lowest":
        return levels[0]
    if wanted == "highest":
        return levels[-1]
    if wanted not in levels and not empty_ok:
        raise NotTestable(f"{where}: {wanted} streams were not measured (measured: {levels})")
    return wanted


def _measure(f: Finding, side: Side, other: Side | None, metric: str,
             empty_ok: bool = False) -> Measured:
    """One side's values over repeats (empty_ok: its level, even with no values, so the
    article's twin can still be named)."""
    part, at = _resolve(f, side, other)
    level = _level(side.concurrency, at["levels"], side.arm, at["declared"], empty_ok)
    if level is not None:
        part = part.filter(pl.col("concurrency") == level)
    words, _, factor = tables.NAMES[metric]
    vals = [float(v) * factor for v in part[metric].drop_nulls().to_list()]
    if not vals and not empty_ok:
        raise NotTestable(f"{words} of {side.arm!r} was not measured on this run")
    return Measured(vals, at["workload"], level, at["temperature"])


def measured_pair(f: Finding, rule: Rule, empty_ok: bool = False, claims: Claims | None = None
          ) -> tuple[Measured, Measured]:
    """Both sides of a rule, each at the levels the two share. With the claims, a `lowest`
    / `highest` rule is taken at the article's own level of it where this study declares
    that level for both arms (the article's 8-stream +78 % beside the measured 8 streams,
    not 1; a declared level with no measurement is not testable, as `_level` says)."""
    ma, mb = (_measure(f, rule.a, rule.b, rule.metric, empty_ok),
              _measure(f, rule.b, rule.a, rule.metric, empty_ok))
    try:
        level = _article_rows(claims, rule, ma, mb)[2] if claims else None
    except NotTestable:  # no published twin: the study's own level
        level = None
    if not isinstance(level, int) or level == ma.concurrency or level not in _resolve(
            f, rule.a, rule.b)[1]["declared"]:
        return ma, mb
    a, b = (replace(s, concurrency=level) for s in (rule.a, rule.b))
    return (_measure(f, a, b, rule.metric, empty_ok), _measure(f, b, a, rule.metric, empty_ok))


# ------------------------------------------------------------------- article side


@functools.cache
def _published() -> pl.DataFrame:
    return load_published()


def _article_arm(claims: Claims, side: Side) -> str:
    arm = side.article_arm or claims.arms.get(side.arm)
    if arm is None:
        raise NotTestable(f"claims.yaml maps no published arm to {side.arm!r}")
    return arm


def _pub_rows(claims: Claims, arm: str, metric: str, m: Measured, side: Side,
              stats=STATS) -> pl.DataFrame:
    """Published rows of one arm and metric at the measured side's workload and
    temperature (claims.yaml's published_temperature where it is set)."""
    rows = claims.comparable(_published()).filter(
        (pl.col("arm") == arm) & (pl.col("metric") == metric) & pl.col("stat").is_in(list(stats)))
    if side.concurrency == "any":  # an arm-level fact (KV pool): no level
        return rows.filter(pl.col("concurrency").is_null())
    temp = side.temperature if side.temperature is not None else \
        claims.compared_temperature(m.temperature)
    work = claims.published_workload(m.workload)
    return rows.filter((pl.col("workload") == work) & (pl.col("temperature") == temp)
                       & pl.col("concurrency").is_not_null())


def _choose(rows: pl.DataFrame, claims: Claims) -> dict:
    """Of several published rows for one point, the one the overlay compares too."""
    return choose(rows.to_dicts(), claims)[0]


def _article_level(wanted, levels: list[int]):
    """`lowest` / `highest` resolved on the article's own levels; a number or `any` as is."""
    if wanted in ("lowest", "highest") and levels:
        return levels[0] if wanted == "lowest" else levels[-1]
    return wanted


def _article_rows(claims: Claims, rule: Rule, ma: Measured, mb: Measured):
    """The article's rows of a and b (no single repeats) and the level the rule names,
    resolved on the levels the article prints both at."""
    pa = _pub_rows(claims, _article_arm(claims, rule.a), rule.metric, ma, rule.a)
    pb = _pub_rows(claims, _article_arm(claims, rule.b), rule.metric, mb, rule.b)
    pa, pb = pa.filter(pl.col("repeat").is_null()), pb.filter(pl.col("repeat").is_null())
    return pa, pb, _article_level(rule.a.concurrency, sorted(
        set(pa["concurrency"].to_list()) & set(pb["concurrency"].to_list())))


def article_pair(claims: Claims, rule: Rule, ma: Measured, mb: Measured
                  ) -> tuple[float, float, int | None, float | None]:
    """The article's values of a and b at the level the rule names (resolved on the
    article's own levels), with that level and temperature."""
    pa, pb, level = _article_rows(claims, rule, ma, mb)
    if rule.a.concurrency == "any":
        if not pa.height or not pb.height:
            raise NotTestable("the article prints no such figure for both arms")
        ra, rb = _choose(pa, claims), _choose(pb, claims)
        return ra["value"], rb["value"], None, (None, None)
    pa, pb = pa.filter(pl.col("concurrency") == level), pb.filter(pl.col("concurrency") == level)
    if not pa.height or not pb.height:
        raise NotTestable(f"the article prints no {tables.NAMES[rule.metric][0]} of both "
                          f"arms at {rule.a.concurrency} streams")
    ra, rb = _choose(pa, claims), _choose(pb, claims)
    return ra["value"], rb["value"], level, (ra["temperature"], rb["temperature"])


def article_single(claims: Claims, side: Side, metric: str, m: Measured) -> float:
    """The article's value of one arm at the side's level (on the article's own levels)."""
    rows = _pub_rows(claims, _article_arm(claims, side), metric, m, side) \
        .filter(pl.col("repeat").is_null())
    level = _article_level(side.concurrency,
                           sorted(set(rows["concurrency"].drop_nulls().to_list())))
    if level != "any":
        rows = rows.filter(pl.col("concurrency") == level)
    if not rows.height:
        raise NotTestable(f"the article prints no {tables.NAMES[metric][0]} of "
                          f"{_article_arm(claims, side)!r} there")
    return _choose(rows, claims)["value"]


def published_runs(claims: Claims, side: Side, metric: str, m: Measured) -> list[float]:
    """The article's runs of one arm: its printed repeats, else a printed min and max."""
    arm = _article_arm(claims, side)
    reps = _pub_rows(claims, arm, metric, m, side, stats=("value",)) \
        .filter(pl.col("repeat").is_not_null())
    if reps.height:
        return reps["value"].to_list()
    rng = _published().filter((pl.col("arm") == arm) & (pl.col("metric") == metric)
                              & pl.col("stat").is_in(["min", "max"]))
    if claims.comparable(rng).height == 2:
        return sorted(rng["value"].to_list())
    raise NotTestable(f"the article prints no runs of {arm!r}" + claims.set_aside(rng))
