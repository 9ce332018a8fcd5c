"""One line per notebook: does the finding's shape hold here, and why, computed from the data.

Design:
- A verdict is a list of checks, each a comparison the article's finding implies
  (block drafter tokens per step > MTP's; acceptance falls with temperature; ...), with the
  measured numbers in its sentence. A check whose arms or levels the study did not measure
  is `None` (not tested here) and never counts as holding.
- The finding's shape holds when at least one check holds and none fails; it does not hold
  when any check fails; otherwise this run cannot tell.
- Arms are recognised from the cells (method, draft count, schedule, engine), not from arm
  names, so a suite that renames arms still gets its verdict.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl

from specrepro.analysis import tables
from specrepro.analysis.finding import Finding
from specrepro.analysis.gates import evaluate_gates


@dataclass
class Check:
    holds: bool | None
    detail: str


@dataclass
class Verdict:
    notebook_id: str
    checks: list[Check] = field(default_factory=list)

    @property
    def holds(self) -> bool | None:
        states = [c.holds for c in self.checks]
        if False in states:
            return False
        return True if True in states else None

    @property
    def text(self) -> str:
        tested = [c.detail for c in self.checks if c.holds is not None]
        untested = [c.detail for c in self.checks if c.holds is None]
        if self.holds is True:
            head = "shape holds here: " + "; ".join(tested)
        elif self.holds is False:
            failed = [c.detail for c in self.checks if c.holds is False]
            kept = [c.detail for c in self.checks if c.holds is True]
            head = "does not hold: " + "; ".join(failed)
            if kept:
                head += " (as the article: " + "; ".join(kept) + ")"
        else:
            head = "cannot tell here: nothing the finding needs was measured"
        if untested:
            head += " [not tested here: " + "; ".join(untested) + "]"
        return head + "."


def _fmt(x: float | None, nd: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def _mean(cells: pl.DataFrame, col: str, **where) -> float | None:
    part = cells
    for k, v in where.items():
        part = part.filter(pl.col(k) == v)
    vals = part[col].drop_nulls()
    return float(vals.mean()) if vals.len() else None


def _arm(cells: pl.DataFrame, method: str, k: int | None = None, static: bool = True
         ) -> str | None:
    part = cells.filter(pl.col("method") == method)
    if k is not None:
        part = part.filter(pl.col("num_speculative_tokens") == k)
    if static:
        part = part.filter(pl.col("schedule").is_null())
    arms = part["arm"].unique(maintain_order=True).to_list()
    return arms[0] if arms else None


def _label(f: Finding, arm: str) -> str:
    return f.labels.get(arm, arm)


# ----------------------------------------------------------------------- per notebook


def drafter_block_sweep(f: Finding) -> Verdict:
    c, v = f.cells, Verdict(f.notebook_id)
    mtp = _arm(c, "mtp")
    lo, hi = c["concurrency"].min(), c["concurrency"].max()
    blocks = c.filter(pl.col("method") == "dflash")
    k5 = _arm(c, "dflash", 5)
    best = k5 or (blocks.sort("acceptance_length", descending=True)["arm"][0]
                  if blocks.height else None)
    if mtp and best:
        a_b = _mean(c, "acceptance_length", arm=best, concurrency=lo)
        a_m = _mean(c, "acceptance_length", arm=mtp, concurrency=lo)
        temps = ", ".join(f"T={t:g}" for t in sorted(c["temperature"].unique().to_list()))
        v.checks.append(Check(None if None in (a_b, a_m) else a_b > a_m,
                              f"{_label(f, best)} keeps {_fmt(a_b)} tokens per step at "
                              f"{lo} stream(s) against MTP's {_fmt(a_m)} ({temps})"))
    else:
        v.checks.append(Check(None, "block drafter against MTP (an arm is missing)"))
    if mtp and k5:
        g = tables.gain_over(c.filter(pl.col("arm").is_in([mtp, k5])), mtp)
        gains = g.filter(pl.col("arm") == k5).sort("concurrency")
        vals = gains["change_pct"].to_list()
        ok = None if not vals or None in vals else all(x > 0 for x in vals)
        levels = ", ".join(f"{lv}: {x:+.0f}%" for lv, x in
                           zip(gains["concurrency"].to_list(), vals, strict=True) if x is not None)
        v.checks.append(Check(ok, f"5 drafts gains over MTP at every level ({levels})"
                              if ok else f"5 drafts does not gain at every level ({levels})"))
    k7 = _arm(c, "dflash", 7)
    if mtp and k7 and hi > lo:
        g = tables.gain_over(c.filter(pl.col("arm").is_in([mtp, k7])), mtp)
        g7 = g.filter(pl.col("arm") == k7)
        g_lo = _mean(g7, "change_pct", concurrency=lo)
        g_hi = _mean(g7, "change_pct", concurrency=hi)
        ok = None if None in (g_lo, g_hi) else g_hi < g_lo
        v.checks.append(Check(ok, f"7 drafts' gain over MTP {'shrinks' if ok else 'does not shrink'}"
                              f" with load ({g_lo:+.0f}% at {lo} stream(s), {g_hi:+.0f}% at {hi})"
                              if ok is not None else "7 drafts' gain with load"))
    else:
        v.checks.append(Check(None, "7 drafts' gain with load (needs MTP, 7 drafts and two levels)"))
    return v


def temperature_spread(f: Finding) -> Verdict:
    c, v = f.cells, Verdict(f.notebook_id)
    temps = sorted(c["temperature"].unique().to_list())
    if len(temps) < 2:
        v.checks.append(Check(None, "acceptance against temperature (one temperature only)"))
        return v
    t_lo, t_hi = temps[0], temps[-1]
    falls = []
    for arm in c["arm"].unique(maintain_order=True).to_list():
        a_lo = _mean(c, "draft_acceptance_rate", arm=arm, temperature=t_lo)
        a_hi = _mean(c, "draft_acceptance_rate", arm=arm, temperature=t_hi)
        if None not in (a_lo, a_hi):
            falls.append((arm, a_lo, a_hi))
    detail = ", ".join(f"{_label(f, a)} {lo_:.0%} to {hi_:.0%}" for a, lo_, hi_ in falls)
    ok = None if not falls else all(hi_ < lo_ for _, lo_, hi_ in falls)
    v.checks.append(Check(ok, f"acceptance {'falls' if ok else 'does not fall for every arm'} "
                              f"from T={t_lo:g} to T={t_hi:g} ({detail})"))
    mtp = _arm(c, "mtp")
    sp = tables.spread(c.filter(pl.col("temperature") == t_hi))
    blocks = sp.filter(pl.col("arm") != mtp) if mtp else sp
    if mtp and blocks.height and sp.filter(pl.col("arm") == mtp).height:
        cv_m = sp.filter(pl.col("arm") == mtp)["cv"][0]
        wide = blocks.sort("cv", descending=True, nulls_last=True)
        cv_b, arm_b = wide["cv"][0], wide["arm"][0]
        ok = None if None in (cv_m, cv_b) else cv_b > cv_m
        v.checks.append(Check(ok, f"at T={t_hi:g} {_label(f, arm_b)} spreads more run to run "
                                  f"than MTP (coefficient of variation {_fmt(cv_b)} against "
                                  f"{_fmt(cv_m)})" if ok else
                              f"at T={t_hi:g} no block drafter spreads more than MTP "
                              f"({_fmt(cv_b)} at most against {_fmt(cv_m)})"))
        worst = c.filter((pl.col("arm") == arm_b) & (pl.col("temperature") == t_hi))
        w = worst["agg_tok_s"].min()
        m = _mean(c, "agg_tok_s", arm=mtp, temperature=t_hi)
        ok = None if None in (w, m) else w < m
        v.checks.append(Check(ok, f"its worst run ({_fmt(w, 1)} tok/s) is "
                                  f"{'below' if ok else 'not below'} MTP's mean ({_fmt(m, 1)})"))
    return v


def target_precision(f: Finding) -> Verdict:
    c, v = f.cells, Verdict(f.notebook_id)
    ref = f.study.baseline
    other = f.challenger
    p = tables.paired(c, other, ref, ["acceptance_length"])
    changes = [(w, lv, x) for w, lv, x in zip(p["workload"].to_list(), p["concurrency"].to_list(),
                                              p["acceptance_length__change_pct"].to_list(),
                                              strict=True) if x is not None]
    detail = ", ".join(f"{w} at {lv}: {x:+.1f}%" for w, lv, x in changes)
    ok = None if not changes else all(abs(x) <= 10 for _, _, x in changes)
    v.checks.append(Check(ok, (f"the quantized target moves acceptance length by less than "
                               f"the predicted 10-20% ({detail})") if ok else
                          f"the quantized target moves acceptance length by more than 10% "
                          f"somewhere ({detail})"))
    return v


def engine_comparison(f: Finding) -> Verdict:
    c, v = f.cells, Verdict(f.notebook_id)
    arms = {a.name: a.resolved for a in f.study.arms}
    spec = [a for a, p in arms.items() if p.method != "none"]
    plain = [a for a, p in arms.items() if p.method == "none"]
    if len(spec) != 2 or len(plain) != 2:
        v.checks.append(Check(None, "two engines with and without speculation"))
        return v
    by_engine = {arms[a].engine: a for a in spec}
    plain_by_engine = {arms[a].engine: a for a in plain}
    lo = c["concurrency"].min()
    for w in c["workload"].unique(maintain_order=True).to_list():
        acc = [_mean(c, "acceptance_length", arm=a, workload=w, concurrency=lo) for a in spec]
        if None not in acc:
            rel = abs(acc[0] - acc[1]) / max(acc)
            v.checks.append(Check(rel <= 0.05, f"{w}: acceptance length {acc[0]:.2f} against "
                                  f"{acc[1]:.2f}, {'the same' if rel <= 0.05 else 'not the same'}"
                                  f" within 5%"))
        gaps = []
        for group in (spec, plain):
            t = [_mean(c, "agg_tok_s", arm=a, workload=w, concurrency=lo) for a in group]
            gaps.append(None if None in t else t[0] - t[1])
        if None not in gaps and set(by_engine) == set(plain_by_engine):
            same = (gaps[0] > 0) == (gaps[1] > 0)
            v.checks.append(Check(same, f"{w}: the faster engine without speculation is "
                                  f"{'also' if same else 'not'} the faster with it, so the gap "
                                  f"is {'the engine' if same else 'not only the engine'}'s"))
    return v


def fp8_drafter_gates(f: Finding) -> Verdict:
    v = Verdict(f.notebook_id)
    g = evaluate_gates(f.cells, f.study.gates)
    for row in g.to_dicts():
        ok = {"pass": True, "fail": False}.get(row["result"])
        v.checks.append(Check(ok, f"gate '{row['gate']}' {row['result']} "
                              f"({_fmt(row['value'])} {row['op']} {row['threshold']:g}"
                              f"{' ' + row['unit'] if row['unit'] else ''})"))
    return v


def _tok_s_against(c: pl.DataFrame, arm: str, other: str, level: int, slower: bool = False
                   ) -> tuple[bool | None, float | None, float | None]:
    """Mean aggregate tok/s of `arm` and `other` at `level` streams, and whether `arm` is
    faster (or, with `slower`, slower); None when either was not measured there."""
    a = _mean(c, "agg_tok_s", arm=arm, concurrency=level)
    b = _mean(c, "agg_tok_s", arm=other, concurrency=level)
    return (None if None in (a, b) else (a < b if slower else a > b)), a, b


def draft_schedule_under_load(f: Finding) -> Verdict:
    c, v = f.cells, Verdict(f.notebook_id)
    lo, hi = c["concurrency"].min(), c["concurrency"].max()
    static = c.filter((pl.col("method") == "dflash") & pl.col("schedule").is_null())

    def best_k(level: int) -> tuple[int | None, float | None]:
        part = static.filter(pl.col("concurrency") == level)
        means = part.group_by("num_speculative_tokens").agg(pl.col("agg_tok_s").mean())
        if not means.height:
            return None, None
        top = means.sort("agg_tok_s", descending=True).row(0)
        return top[0], top[1]

    (k_lo, _), (k_hi, _) = best_k(lo), best_k(hi)
    if k_lo is not None and hi > lo and static["num_speculative_tokens"].n_unique() > 1:
        ok = k_lo > k_hi
        v.checks.append(Check(ok, f"the best static block {'shortens' if ok else 'does not shorten'}"
                                  f" with load ({k_lo} drafts at {lo} stream(s), {k_hi} at {hi})"))
    else:
        v.checks.append(Check(None, "best static block against load (needs two block lengths "
                                    "and two levels)"))
    plain = _arm(c, "none")
    k7 = _arm(c, "dflash", 7)
    if plain and k7:
        ok, s_lo, p_lo = _tok_s_against(c, k7, plain, lo)
        v.checks.append(Check(ok, f"static 7 drafts {'beats' if ok else 'does not beat'} no "
                                  f"speculation at {lo} stream(s) ({_fmt(s_lo, 1)} against "
                                  f"{_fmt(p_lo, 1)} tok/s)"))
    sched = c.filter(pl.col("schedule").is_not_null())
    tail = [a for a, s in zip(sched["arm"].to_list(), sched["schedule"].to_list(), strict=True)
            if any(r[2] == 0 for r in json.loads(s))]
    main = [a for a in dict.fromkeys(sched["arm"].to_list()) if a not in tail]
    if main and k7:
        ok, s_hi, k7_hi = _tok_s_against(c, main[0], k7, hi)
        v.checks.append(Check(ok, f"the schedule {'beats' if ok else 'does not beat'} static 7 "
                                  f"drafts at {hi} streams ({_fmt(s_hi, 1)} against "
                                  f"{_fmt(k7_hi, 1)} tok/s)"))
    if tail and plain:
        ok, t_hi, p_hi = _tok_s_against(c, tail[0], plain, hi, slower=True)
        v.checks.append(Check(ok, f"the zero-draft tail is {'slower' if ok else 'not slower'} "
                                  f"than no speculation at {hi} streams ({_fmt(t_hi, 1)} against "
                                  f"{_fmt(p_hi, 1)} tok/s)"))
    return v


def the_bill(f: Finding) -> Verdict:
    c, v = f.cells, Verdict(f.notebook_id)
    mtp, block, plain = _arm(c, "mtp"), _arm(c, "dflash"), _arm(c, "none")
    if mtp and block:
        kv_b = _mean(c, "kv_pool_tokens", arm=block)
        kv_m = _mean(c, "kv_pool_tokens", arm=mtp)
        ok = None if None in (kv_b, kv_m) else kv_b < kv_m
        v.checks.append(Check(ok, f"at the same memory the block drafter's KV pool holds "
                                  f"{_fmt(kv_b, 0)} tokens against MTP's {_fmt(kv_m, 0)}"
                                  + ("" if ok is None else f" ({(kv_b / kv_m - 1):+.0%})")))
    lo = c["concurrency"].min()
    if not f.has_power:
        v.checks.append(Check(None, "tokens per joule: no power source on this run "
                                    "(no NVML GPU), so no watts were measured"))
    elif block and plain:
        tj_b = _mean(c, "tokens_per_joule", arm=block, concurrency=lo)
        tj_p = _mean(c, "tokens_per_joule", arm=plain, concurrency=lo)
        ok = None if None in (tj_b, tj_p) else tj_b > tj_p
        v.checks.append(Check(ok, f"speculation {'raises' if ok else 'does not raise'} tokens "
                                  f"per joule at {lo} stream(s) ({_fmt(tj_b)} against "
                                  f"{_fmt(tj_p)})"))
    return v


VERDICTS: dict[str, Callable[[Finding], Verdict]] = {
    "01_drafter_block_sweep": drafter_block_sweep,
    "02_temperature_spread": temperature_spread,
    "03_target_precision": target_precision,
    "04_engine_comparison": engine_comparison,
    "05_fp8_drafter_gates": fp8_drafter_gates,
    "06_draft_schedule_under_load": draft_schedule_under_load,
    "07_the_bill": the_bill,
}


def verdict(f: Finding) -> Verdict:
    return VERDICTS[f.notebook_id](f)
