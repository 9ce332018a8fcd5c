"""A finding's verdict: each check of its claim (claims.yaml `checks:`) evaluated on the cells.

Design:
- The rules are data (analysis/verdict/rules.py); this module evaluates them on a `Finding` and
  the articles' published figures, and nothing here names a published number or an arm.
- Each check gives one of five outcomes (rules.OUTCOMES), the article's value and the
  measured one as text (with the level and temperature each was taken at), the ratio of the
  measured effect to the article's, and the rule in words, so a reader sees why.
- What a check compares, each side's values at the level it resolves to, measured and
  published, is analysis/verdict/check_sides.py's; this module turns them into outcomes and words.
- A check whose mechanism (analysis/verdict/mechanism.py) is absent or unmeasured on the substrate is
  "not testable here" with the measured reason; one whose noise is at least the article's
  effect is "not resolvable here" (analysis/verdict/noise.py), never "does not hold". A check that
  read a cell whose window was not steady, was cut short or carries a warning of its own
  (analysis/finding/window_health.py) names it in its reason; its outcome stands.
- The finding's outcome is judged over the article's checks only: any check that does not
  hold makes it "does not hold"; all tested checks holding makes it "holds"; some holding
  in direction only, "holds in direction only"; none tested, "not testable here" (or "not
  resolvable here" where every one is that). Coverage is part of the verdict: where some
  checks were not tested, "holds" reads "holds in part" (◔) and the text "holds on 1 of 4
  checks (3 not testable here: ...)", so a finding whose core check is untested never reads
  as a plain "holds".
  Substitute gates (a suite's own, where the article's cannot be measured) stand beside,
  labelled, and never decide it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import polars as pl

from specrepro import metrics
from specrepro.analysis.finding import tables, text_quality, window_health
from specrepro.analysis.finding.finding import Finding, devices
from specrepro.analysis.verdict import mechanism, noise, substitute_gates
from specrepro.analysis.verdict.check_sides import (
    Measured,
    NotTestable,
    arm_cells,
    article_pair,
    article_single,
    measured_pair,
    published_runs,
)
from specrepro.analysis.verdict.claims import Claims, claims_for
from specrepro.analysis.verdict.gates import evaluate_gate
from specrepro.analysis.verdict.rules import SPEED_METRICS, SYMBOLS, UNTESTED, Rule, Side
from specrepro.analysis.verdict.same_drafts import same_drafts
from specrepro.published import load_gates

_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


@dataclass
class CheckResult:
    claim: str
    outcome: str
    article: str = ""
    measured: str = ""
    ratio: float | None = None  # measured effect / article effect
    rule: str = ""
    reason: str = ""            # why not testable, or what decided it
    substitute: bool = False    # a suite's own gate, standing beside the article's
    noise: str = ""             # the band a difference had to leave (analysis/verdict/noise.py)

    @property
    def symbol(self) -> str:
        return SYMBOLS[self.outcome]

    def as_dict(self) -> dict:
        return {"claim": self.claim, "article": self.article, "measured": self.measured,
                "ratio": self.ratio, "outcome": self.outcome, "symbol": self.symbol,
                "rule": self.rule, "reason": self.reason, "substitute": self.substitute,
                "noise": self.noise}


# A finding's outcomes beyond a check's: "holds in part" where every tested check holds but
# some were not tested (◔: partly filled, as the coverage is)
FINDING_SYMBOLS = {**SYMBOLS, "holds in part": "◔"}


@dataclass
class Verdict:
    notebook_id: str
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def own(self) -> list[CheckResult]:
        return [c for c in self.checks if not c.substitute]

    @property
    def outcome(self) -> str:
        states = [c.outcome for c in self.own]
        if "does not hold" in states:
            return "does not hold"
        tested = [s for s in states if s not in UNTESTED]
        if not tested:
            return ("not resolvable here" if states and all(s == "not resolvable here"
                                                             for s in states)
                    else "not testable here")
        if len(tested) < len(states) and all(s == "holds" for s in tested):
            return "holds in part"
        return "holds" if all(s == "holds" for s in tested) else "holds in direction only"

    @property
    def symbol(self) -> str:
        return FINDING_SYMBOLS[self.outcome]

    @property
    def holds(self) -> bool | None:
        return {"holds": True, "does not hold": False}.get(self.outcome)

    @property
    def text(self) -> str:
        return coverage_text(self.outcome, [(c.outcome, c.reason) for c in self.own])


def _why_kind(reason: str) -> str:
    """A reason's head, as the coverage line counts it: 'weight-read decode step absent'."""
    head = reason.split(" (")[0].split(":")[0].strip()
    return head or "no reason given"


def coverage_text(outcome: str, checks: list[tuple[str, str]]) -> str:
    """'holds on 1 of 4 checks (3 not testable here: host-bound x2, loops x1)': what the
    verdict rests on, from each check's (outcome, reason)."""
    n = len(checks)
    if not n:
        return f"{outcome} (no checks)"
    tested = [o for o, _ in checks if o not in UNTESTED]
    noun = "check" if n == 1 else "checks"  # 08 has one: "none of 1 check tested"
    parts = []
    for state in UNTESTED:
        whys = [("noise at least the effect" if state == "not resolvable here" else
                 _why_kind(r)) for o, r in checks if o == state]
        if whys:
            counts = {w: whys.count(w) for w in dict.fromkeys(whys)}
            parts.append(f"{len(whys)} {state}: " + ", ".join(
                f"{w}{f' x{c}' if c > 1 else ''}" for w, c in counts.items()))
    if not tested:
        return f"{outcome}: none of {n} {noun} tested ({'; '.join(parts)})"
    held = {o: tested.count(o) for o in dict.fromkeys(tested)}
    detail = ", ".join(f"{c} {o}" for o, c in held.items())
    if outcome in ("holds", "holds in part"):  # every tested check holds: "holds on 1 of 4"
        head = (f"holds on {len(tested)} of {n} {noun}" if parts
                else f"holds on all {n} {noun}")
    else:  # "does not hold on all 4 checks" would read as four failures: count the tested
        head = f"{outcome}: {len(tested)} of {n} {noun} tested"
    return head + f" ({detail}" + (f"; {'; '.join(parts)}" if parts else "") + ")"


# ---------------------------------------------------------------------- formatting


def _num(x: float, unit: str = "") -> str:
    text = f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"
    return text + unit if unit == "%" else f"{text} {unit}".strip()


def _at(level: int | None, temp: float | None, other_temp: float | None = None) -> str:
    """'; 8 streams, T=0.7' (against another temperature where b's differs), or ''."""
    parts = []
    if level is not None:
        parts.append(f"{level} stream{'s' if level != 1 else ''}")
    if temp is not None:
        parts.append(f"T={temp:g}" + (f" against T={other_temp:g}"
                                      if other_temp is not None and other_temp != temp else ""))
    return "; " + ", ".join(parts) if parts else ""


def _runs(m: Measured, unit: str) -> str:
    if len(m.values) == 1:
        return f"{_num(m.mean, unit)} (1 run)"
    if m.lo == m.hi:
        return f"{_num(m.mean, unit)} ({len(m.values)} runs, identical)"
    return (f"{_num(m.mean, unit)} (range {_num(m.lo)}–{_num(m.hi)}, "
            f"{len(m.values)} runs)")


def _noise(f: Finding, rule: Rule, metric: str, ma: Measured, mb: Measured) -> noise.Noise:
    """The check's noise band: the cells' spread and the A/A twins' (analysis/verdict/noise.py), both
    relative, so the metric's table scale cancels."""
    return noise.measure(f, metric, [(s.arm, m.values, m.workload, m.temperature, m.concurrency)
                                     for s, m in ((rule.a, ma), (rule.b, mb))])


# ------------------------------------------------------------------------ the kinds


def _measured_change(ma: Measured, mb: Measured, unit: str) -> tuple[float, str]:
    """The relative change of a's mean from b's (%), and it in words with both sides' runs."""
    change = metrics.relative_change_pct(ma.mean, mb.mean)
    if change is None:
        raise NotTestable("the reference arm measured zero")
    return change, (f"{change:+.1f}% ({_runs(ma, unit)} against {_runs(mb, unit)}"
                    f"{_at(ma.concurrency, ma.temperature, mb.temperature)})")


def _article_change(claims: Claims, rule: Rule, ma: Measured, mb: Measured
                    ) -> tuple[float | None, str]:
    """The article's change between the rule's arms (%), and it in words."""
    unit = tables.NAMES[rule.metric][1]
    va, vb, level, temp = article_pair(claims, rule, ma, mb)
    change = metrics.relative_change_pct(va, vb)
    return change, (f"{change:+.1f}% ({_num(va, unit)} against {_num(vb, unit)}"
                    f"{_at(level, *temp)})")


def _compare(f: Finding, claims: Claims, rule: Rule) -> CheckResult:
    unit = tables.NAMES[rule.metric][1]
    ma, mb = measured_pair(f, rule, claims=claims)
    change, measured = _measured_change(ma, mb, unit)
    nz = _noise(f, rule, rule.metric, ma, mb)
    tie = nz.tie(change)
    where = ("no noise measured (1 run each, no A/A twin)" if nz.band_pct is None else
             f"{'inside' if tie else 'outside'} the noise band, ±{nz.band_pct:.1f}%")
    res = CheckResult(rule.claim, "does not hold", measured=measured, rule=rule.text(),
                      noise=nz.text())
    try:
        art_change, res.article = _article_change(claims, rule, ma, mb)
    except NotTestable as why:
        art_change, res.article = None, f"not printed ({why})"
    if rule.direction == "same":  # the one symmetric rule (noise.same_outcome)
        res.outcome, res.reason = noise.same_outcome(change, rule.band.within, nz.band_pct,
                                                     nz.runs)
        if res.outcome == "not testable here":
            raise NotTestable(res.reason)
        return res
    if art_change not in (None, 0):
        res.ratio = change / art_change
    right_way = change > 0 if rule.direction == "higher" else change < 0
    # a change outside the band the article's way is resolved, whatever the article's size
    if (not right_way or tie) and (why := noise.resolution(nz.band_pct, art_change, nz.runs)):
        res.outcome, res.reason = "not resolvable here", (
            f"{why}; measured {change:+.1f}%, {'in' if right_way else 'against'} the "
            "article's direction")
        return res
    if tie:
        res.reason = (f"a tie: {change:+.1f}% is inside the noise band, ±{nz.band_pct:.1f}%, "
                      "which is narrower than the article's effect: that effect would show")
    elif not right_way:
        res.reason = f"the other way ({where})"
    else:
        res.reason = where
        in_band = res.ratio is None or (
            (rule.band.at_least is None or res.ratio >= rule.band.at_least)
            and (rule.band.at_most is None or res.ratio <= rule.band.at_most))
        res.outcome = "holds" if in_band else "holds in direction only"
        if res.ratio is None:
            res.reason += "; the article prints no effect to size it against"
    return res


def _rel_range(vals: list[float]) -> float:
    return (max(vals) - min(vals)) / (sum(vals) / len(vals))


def _spread(f: Finding, claims: Claims, rule: Rule) -> CheckResult:
    ma, mb = measured_pair(f, rule)
    if len(ma.values) < 2 or len(mb.values) < 2:
        raise NotTestable("a spread needs at least two runs of each arm "
                          f"({len(ma.values)} and {len(mb.values)} measured)")
    ra, rb = _rel_range(ma.values), _rel_range(mb.values)
    ratio = ra / rb if rb else float("inf")
    res = CheckResult(rule.claim, "does not hold", rule=rule.text(),
                      measured=f"{ra:.2f} against {rb:.2f} (ratio {ratio:.2f}; "
                               f"{len(ma.values)} and {len(mb.values)} runs"
                               f"{_at(ma.concurrency, ma.temperature)})")
    try:
        pa = published_runs(claims, rule.a, rule.metric, ma)
        res.article = f"{_rel_range(pa):.2f} (runs {', '.join(_num(v) for v in pa)})"
        pb = published_runs(claims, rule.b, rule.metric, mb)  # a's stay where b has none
        art = _rel_range(pa) / _rel_range(pb)
        res.article = (f"{_rel_range(pa):.2f} against {_rel_range(pb):.2f} (ratio {art:.2f}; "
                       f"runs {', '.join(_num(v) for v in pa)} against "
                       f"{', '.join(_num(v) for v in pb)})")
        res.ratio = ratio / art
    except NotTestable as why:
        res.article = f"{res.article} against " * bool(res.article) + f"not printed ({why})"
    wider = ratio > 1 if rule.direction == "higher" else ratio < 1
    res.outcome = "holds" if wider else "does not hold"
    return res


def _straddle(f: Finding, claims: Claims, rule: Rule) -> CheckResult:
    unit = tables.NAMES[rule.metric][1]
    ma, mb = measured_pair(f, rule)
    res = CheckResult(rule.claim, "does not hold", rule=rule.text(),
                      measured=f"runs {_num(ma.lo)}–{_num(ma.hi, unit)} ({len(ma.values)}) "
                               f"against a mean of {_num(mb.mean, unit)}"
                               f"{_at(ma.concurrency, ma.temperature)}")
    try:
        pa = published_runs(claims, rule.a, rule.metric, ma)
        vb = article_single(claims, rule.b, rule.metric, mb)
        res.article = f"runs {_num(min(pa))}–{_num(max(pa), unit)} against {_num(vb, unit)}"
    except NotTestable as why:
        res.article = f"not printed ({why})"
    if len(ma.values) < 2:
        raise NotTestable("one run: no spread to straddle with")
    if ma.lo < mb.mean < ma.hi:
        res.outcome = "holds"
    else:
        side = "below" if ma.hi <= mb.mean else "above"
        res.reason = f"every run is {side} the other arm's mean"
    return res


def _gate_row(rule: Rule) -> dict:
    return load_gates().filter(pl.col("gate") == rule.gate).row(0, named=True)


def _gate_article(rule: Rule) -> str:
    g = _gate_row(rule)
    where = ", ".join(p for p in (g["workload"], g["concurrency"] and
                                  f"{g['concurrency']} stream{'s' if g['concurrency'] != 1 else ''}")
                      if p)
    return (f"{g['op']} {g['threshold']:,g} {g['unit']}" + (f" ({where})" if where else "")
            + f": {g['published_outcome']} in the article")


def _gate(f: Finding, claims: Claims, rule: Rule) -> CheckResult:
    g = _gate_row(rule)
    reverse = {pub: arm for arm, pub in claims.arms.items()
               if arm in {a.name for a in f.study.arms}}
    res = CheckResult(f"{rule.claim}", "does not hold", rule=rule.text(),
                      article=_gate_article(rule))
    arm = reverse.get(g["arm"])
    if arm is None:
        raise NotTestable(f"no study arm stands for the article's {g['arm']!r}")
    level = g["concurrency"] if g["concurrency"] is not None else "any"
    side = Side(arm=arm, workload=g["workload"], concurrency=level,
                temperature=g["temperature"])
    if g["metric"] == "agg_tok_s_change_pct":
        ref = Side(arm=reverse.get(g["baseline_arm"], g["baseline_arm"]), workload=g["workload"],
                   concurrency=level, temperature=g["temperature"])
        ma, mb = measured_pair(f, Rule(rule.claim, metric="agg_tok_s", a=side, b=ref))
        value, res.measured = _measured_change(ma, mb, tables.NAMES["agg_tok_s"][1])
        passes = _OPS[g["op"]](value, g["threshold"])
        nz = _noise(f, Rule(rule.claim, metric="agg_tok_s", a=side, b=ref), "agg_tok_s",
                    ma, mb)
        res.noise = nz.text()
        if g["threshold"] > 0 and (why := noise.resolution(nz.band_pct, g["threshold"],
                                                           nz.runs)):
            res.outcome, res.reason = "not resolvable here", f"{why}; measured {value:+.1f}%"
            return res
        if passes and g["threshold"] > 0 and nz.tie(value):
            passes, res.reason = False, f"the gain is inside the noise band, ±{nz.band_pct:.1f}%"
    elif g["metric"] == "gsm8k_correct":
        part = arm_cells(f, arm).filter(pl.col("workload") == "gsm8k")
        if level != "any":
            part = part.filter(pl.col("concurrency") == level)
        if not part.height or part["gsm8k_n"].drop_nulls().sum() == 0:
            raise NotTestable(f"GSM8K was not graded at {level} streams on arm {arm!r}")
        right, n = part["gsm8k_strict_correct"].sum(), part["gsm8k_n"].sum()
        denom = int(g["unit"].split("/")[1])
        value = right / n
        passes = _OPS[g["op"]](value, g["threshold"] / denom)
        res.measured = (f"{right} of {n} ({value:.0%}) against {g['threshold']:g} of {denom} "
                        f"({g['threshold'] / denom:.0%})")
    else:
        words, unit, _ = tables.NAMES[g["metric"]]
        part = arm_cells(f, arm)
        vals = part[g["metric"]].drop_nulls()
        if not vals.len():
            raise NotTestable(f"{words} was not measured")
        value = float(vals.max())
        passes = _OPS[g["op"]](value, g["threshold"])
        res.measured = f"{_num(value, unit)} at most over the arm's cells"
    res.outcome = "holds" if passes else "does not hold"
    return res


def _speed_untestable(f: Finding, gate, rules: tuple[Rule, ...], own: list[CheckResult]
                      ) -> str:
    """Why a substitute gate on a speed metric is not testable here ('' where it is): the
    speed precondition measured on its own arms (mechanism.py), else the reason the suite's
    own speed checks were set aside where none of them was tested (an emulated FP8 drafter's
    speed is the emulation's, whichever gate reads it)."""
    if gate.metric not in SPEED_METRICS:
        return ""
    arms = [(a, gate.concurrency) for a in (gate.arm, gate.reference_arm) if a is not None]
    if why := mechanism.reason(f, "weight_read_step", arms):
        return why
    speed = [c for r, c in zip(rules, own, strict=False) if r.mechanism == "weight_read_step"]
    if speed and all(c.outcome in UNTESTED for c in speed):
        first = next(c for c in speed if c.outcome in UNTESTED)
        return f"as the article's speed checks here: {first.reason}"
    return ""


def _substitutes(f: Finding, claims: Claims, rules: tuple[Rule, ...],
                 own: list[CheckResult] = ()) -> list[CheckResult]:
    """The suite's own gates, where the study has gates and the article declared some:
    labelled as substitutes, evaluated as the suite declared them; one on a speed metric is
    not testable where the speed precondition fails (`_speed_untestable`), never a pass or
    a fail."""
    if not any(r.kind == "gate" for r in rules):
        return []
    declared = {(r["workload"], r["concurrency"], r["threshold"])
                for r in load_gates().iter_rows(named=True)}
    # the substitutes compare the changed drafter with the baseline's too
    unchanged = same_drafts(f) if any(r.needs == "drafter_change" for r in rules) else ""
    out = []
    for gate in f.study.gates:
        if (gate.workload, gate.concurrency, gate.threshold) in declared:
            continue
        row = evaluate_gate(f.cells, gate)
        why = unchanged or _speed_untestable(f, gate, rules, own)
        outcome = ("not testable here" if why else  # an unchanged drafter, no speed mechanism
                   {"pass": "holds", "fail": "does not hold"}.get(row["result"],
                                                                  "not testable here"))
        # its own rule and value, and beside it the article's figure at the same metric and
        # level (analysis/verdict/substitute_gates.py), never the article's gate as if it were that
        temps = f.cells.filter((pl.col("arm") == gate.arm) & (pl.col("workload") == gate.workload)
                               )["temperature"].drop_nulls().unique().to_list()
        text = substitute_gates.describe(claims, gate, row, temps[0] if len(temps) == 1 else None)
        out.append(CheckResult(text["claim"], outcome, substitute=True, article=text["article"],
                               measured=text["measured"], reason=why, rule=text["rule"]))
    return out


KIND = {"compare": _compare, "spread": _spread, "straddle": _straddle, "gate": _gate}


def _engines(f: Finding, rule: Rule, claims: Claims) -> set[str]:
    arms = {a.name: a.resolved.engine for a in f.study.arms}
    if rule.kind == "gate":
        return set(arms.values())
    return {arms[s.arm] for s in (rule.a, rule.b) if s is not None and s.arm in arms}


def _devices(f: Finding, rule: Rule) -> set[str]:
    """Where the rule's arms ran (all arms for a gate): "cpu" and/or "cuda"."""
    known = {a.name for a in f.study.arms}
    arms = None if rule.kind == "gate" else [s.arm for s in (rule.a, rule.b)
                                             if s is not None and s.arm in known]
    return devices(f.study, arms)


def _article_only(f: Finding, claims: Claims, rule: Rule) -> str:
    """The article's side of a check that cannot be evaluated here, where it can be named."""
    if rule.kind == "gate":
        return _gate_article(rule)
    if rule.kind != "compare":
        return ""
    try:
        return _article_change(claims, rule, *measured_pair(f, rule, True, claims))[1]
    except NotTestable:
        return ""


def _not_testable_beside(f: Finding, claims: Claims, rule: Rule, why: str) -> CheckResult:
    """A check not testable for `why`, with what was measured (and its noise) still standing
    beside it."""
    res = CheckResult(rule.claim, "not testable here", rule=rule.text(), reason=why,
                      article=_article_only(f, claims, rule))
    try:
        seen = KIND[rule.kind](f, claims, rule)
        res.article, res.measured, res.noise = seen.article, seen.measured, seen.noise
    except NotTestable:
        pass
    return res


def _mechanism_arms(f: Finding, rule: Rule, claims: Claims) -> list[tuple[str, int | None]]:
    """The arms a check's mechanism is measured on, each at the level the check reads it:
    both sides of a comparison (at the level they resolved to), a gate's arm and baseline at
    the gate's level."""
    if rule.kind == "gate":
        g = _gate_row(rule)
        reverse = {pub: arm for arm, pub in claims.arms.items()}
        arms = [reverse.get(g["arm"]), reverse.get(g["baseline_arm"])]
        level = g["concurrency"] if g["concurrency"] is not None else None
        return [(a, level) for a in dict.fromkeys(arms) if a is not None]
    try:
        ma, mb = measured_pair(f, rule, True, claims)
        levels = (ma.concurrency, mb.concurrency)
    except NotTestable:
        levels = tuple(s.concurrency if isinstance(s.concurrency, int) else None
                       for s in (rule.a, rule.b))
    return [(s.arm, lv) for s, lv in zip((rule.a, rule.b), levels) if s is not None]


def evaluate(f: Finding, rule: Rule, claims: Claims) -> CheckResult:
    """One check on one finding."""
    engines, where = _engines(f, rule, claims), _devices(f, rule)
    for nt in rule.not_testable:
        if engines & set(nt.engines) and (nt.device is None or nt.device in where):
            return _not_testable_beside(f, claims, rule, nt.why)
    if rule.needs == "power" and not f.has_power:
        return CheckResult(rule.claim, "not testable here", rule=rule.text(),
                           reason="no power source on this run (no NVML GPU): no watts",
                           article=_article_only(f, claims, rule))
    if rule.needs == "drafter_change" and (why := same_drafts(f)):
        return _not_testable_beside(f, claims, rule, why)
    if why := mechanism.reason(f, rule.mechanism, _mechanism_arms(f, rule, claims)):
        return _not_testable_beside(f, claims, rule, why)
    try:
        res = KIND[rule.kind](f, claims, rule)
        if rule.mechanism == "kv_by_bytes" and res.outcome not in UNTESTED:
            by_layers, note = mechanism.kv_note(f, rule.a.arm, rule.b.arm)
            if by_layers:  # a pool that falls by layer count holds for another reason
                return _not_testable_beside(f, claims, rule, note)
            if note:
                res.reason = f"{res.reason}; {note}" if res.reason else note
        return res
    except NotTestable as why:
        return CheckResult(rule.claim, "not testable here", rule=rule.text(), reason=str(why),
                           article=_article_only(f, claims, rule))


def _with_loops(f: Finding, rule: Rule, res: CheckResult) -> CheckResult:
    """text_quality's loop flag on a check's inputs: an acceptance check on cells that are
    mostly loops is not testable here (what it would have said stays in its reason, what was
    measured beside it); a speed, step or energy check names the loops in its reason; a check
    already not testable, or of a figure set at start-up, is left as it is."""
    effect = text_quality.loops_decide(rule)
    if effect is None or res.outcome == "not testable here":  # loops outrank noise
        return res
    why = text_quality.loop_reason(f.cells, rule)
    if not why:
        return res
    if effect == "decide":
        was = f"{res.outcome}{': ' + res.reason if res.reason else ''}"
        res.outcome, res.ratio = "not testable here", None
        res.reason = f"{why}; acceptance on loops measures repetition (on them: {was})"
    else:
        res.reason = f"{res.reason}; {why}" if res.reason else why
    return res


def _rested_on(f: Finding, rule: Rule, claims: Claims) -> list[tuple]:
    """The cells a check read, as (arm, workload, level, temperature), None for any: each
    side at the level it resolved to (`_mechanism_arms`), a gate's at its own workload."""
    arms = _mechanism_arms(f, rule, claims)
    if rule.kind == "gate":
        g = _gate_row(rule)
        return [(a, g["workload"], lv, g["temperature"]) for a, lv in arms]
    sides = [s for s in (rule.a, rule.b) if s is not None]
    return [(s.arm, s.workload, lv, s.temperature) for s, (_, lv) in zip(sides, arms)]


def _with_health(f: Finding, rule: Rule, claims: Claims, res: CheckResult) -> CheckResult:
    """window_health's marks on the cells a check read (a window not steady or cut short, a
    warning of their own), named in its reason; the outcome stands. A check not testable
    here read no cells to judge."""
    if res.outcome == "not testable here":
        return res
    why = window_health.reason(f.cells, _rested_on(f, rule, claims))
    if why:
        res.reason = f"{res.reason}; {why}" if res.reason else why
    return res


def verdict(f: Finding, claims: Claims | None = None) -> Verdict:
    """Every check of the notebook's claim (its inputs' loops flagged: `_with_loops`; their
    window and warning marks named: `_with_health`), then the suite's substitute gates."""
    claims = claims or claims_for(f.notebook_id)
    v = Verdict(f.notebook_id, [_with_health(f, r, claims,
                                             _with_loops(f, r, evaluate(f, r, claims)))
                                for r in claims.checks])
    v.checks += _substitutes(f, claims, claims.checks, v.checks)
    return v
