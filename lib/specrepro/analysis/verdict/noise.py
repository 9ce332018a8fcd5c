"""A suite's own noise, and the rule that a difference inside it is a tie.

Design:
- Two measures, per check, both relative to the mean in percent:
  - the run-to-run spread of the two cells compared: each cell's (max - min) / mean over its
    repeats, the larger of the two;
  - the A/A noise: a study arm declared `noise_of: <arm>` runs that arm again, as cells of
    its own (params/schema.py). At each workload, level and temperature, the A/A noise is
    |mean(twin) - mean(arm)| / mean(arm): what two measurements of one configuration differ
    by in this suite. It is taken for either side of the check that has a twin, the larger.
    A twin measured at a study's lowest and highest levels only (the stand-in suites) gives
    a level between them the larger of its two ends, and the band says so.
  - across prompts, where a side's repeats are identical (greedy decoding is deterministic:
    three equal runs measure the code path, not the noise, and would read ±0.0 %): a
    bootstrap over its requests of each request's tokens per streamed chunk after the first
    (a step's accepted drafts plus its bonus token), the 95 % interval's width relative to
    the mean (`prompt_spread`), for the acceptance metrics.
- The band is the larger of the measures (`Noise.band_pct`).
- Resolution before direction (`resolution`): where the band is at least the effect the
  article reports (for a "same" claim, its own `within`), no run of this size can tell it:
  "not resolvable here", with the repeats that would, never "does not hold". Where the band
  is narrower than the article's effect, a directional difference inside it is a tie: the
  article's effect would have shown and did not.
- One "same" rule, symmetric (`same_outcome`; `same_rule_text` prints it from the same
  bounds): not resolvable where the noise is at least the claim's band, whichever side of it
  the change falls; else holds inside the band, does not hold outside it.
- With one run a side and no twin, no noise was measured: a directional difference is judged
  on its sign alone, a "same" claim on its own band alone, and each says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

# The acceptance metrics, whose greedy repeats are identical: their noise is across prompts.
ACCEPTANCE = frozenset({"acceptance_length", "draft_acceptance_rate"})
BOOTSTRAP = 1000  # resamples of a side's requests; seeded, so a report re-renders the same


@dataclass(frozen=True)
class Noise:
    spread_pct: float | None = None  # the larger relative range of the two cells
    aa_pct: float | None = None      # the larger A/A difference of a side with a twin
    aa_where: str = ""               # which twin, at which level
    prompt_pct: float | None = None  # across prompts where repeats are identical (bootstrap)
    prompt_where: str = ""
    runs: int = 1                    # the fewer runs of the two sides

    @property
    def band_pct(self) -> float | None:
        known = [v for v in (self.spread_pct, self.aa_pct, self.prompt_pct) if v is not None]
        return max(known) if known else None

    def text(self) -> str:
        if self.band_pct is None:
            return "not measured (1 run each, no A/A twin)"
        parts = []
        if self.aa_pct is not None:
            parts.append(f"A/A {self.aa_pct:.1f}%{f' ({self.aa_where})' if self.aa_where else ''}")
        if self.spread_pct is not None:
            parts.append(f"run-to-run {self.spread_pct:.1f}%")
        if self.prompt_pct is not None:
            parts.append(f"across prompts {self.prompt_pct:.1f}% ({self.prompt_where})")
        return f"±{self.band_pct:.1f}% ({'; '.join(parts)})"

    def tie(self, change_pct: float) -> bool:
        """Whether a change is inside the band (False where no noise was measured)."""
        return self.band_pct is not None and abs(change_pct) <= self.band_pct


def resolution(band_pct: float | None, effect_pct: float | None, runs: int) -> str | None:
    """Why a band of `band_pct` cannot resolve an effect of `effect_pct` measured from `runs`
    repeats a side, with the repeats that would, or None where it can (or nothing is known).
    The repeats: the band taken to shrink as 1/sqrt(repeats), as a mean's error does, so the
    fewest n with runs x (band / effect)^2 < n."""
    if band_pct is None or not effect_pct or band_pct < abs(effect_pct):
        return None
    n = math.floor(max(runs, 1) * (band_pct / abs(effect_pct)) ** 2) + 1
    return (f"noise ±{band_pct:.1f}% against the article's "
            f"{abs(effect_pct):.1f}%; about {n} repeats a side would resolve it "
            f"({max(runs, 1)} x ({band_pct:.1f} / {abs(effect_pct):.1f})^2, the band taken to "
            "shrink as 1/sqrt(repeats))")


def same_outcome(change_pct: float, within: float | None, band_pct: float | None,
                 runs: int) -> tuple[str, str]:
    """The one "same" rule: (outcome, reason). Its text is `same_rule_text`."""
    if within is None and band_pct is None:
        return "not testable here", ("a 'same' claim needs a band or measured noise, and this "
                                     "one has neither (1 run each, no A/A twin)")
    if within is not None and (why := resolution(band_pct, within, runs)):
        return "not resolvable here", (f"{why.replace('the article', 'the claim')}; measured "
                                       f"{change_pct:+.1f}%")
    limit = within if within is not None else band_pct
    ok = abs(change_pct) <= limit
    where = (f"the claim's band, within ±{within:g}%" if within is not None
             else f"the noise band, ±{band_pct:.1f}%")
    noise = ("no noise measured (1 run each, no A/A twin)" if band_pct is None
             else f"noise ±{band_pct:.1f}%")
    return ("holds" if ok else "does not hold",
            f"{change_pct:+.1f}% is {'inside' if ok else 'outside'} {where}; {noise}")


def same_rule_text(within: float | None) -> str:
    """`same_outcome` in words, from the same bounds."""
    if within is None:
        return ("holds when the change is inside the measured noise band; does not hold "
                "outside it; not testable where no noise was measured")
    return (f"holds when |change| <= {within:g}%; does not hold when it is larger; not "
            f"resolvable here when the noise band is {within:g}% or wider, whichever side "
            "the change falls (one rule, both sides)")


def prompt_spread(requests: pl.DataFrame, cell_ids: list[str]) -> tuple[float, int] | None:
    """The 95 % bootstrap interval's width over the cells' requests of each request's tokens
    per streamed chunk after the first, relative to the mean, in percent, and the number of
    requests; None below two requests with chunks."""
    if requests is None or "chunk_tokens" not in requests.columns:
        return None
    part = requests.filter(pl.col("cell_id").is_in(cell_ids))
    per = []
    for chunks in part["chunk_tokens"].to_list():
        if chunks is not None and len(chunks) > 1:
            per.append(sum(chunks[1:]) / (len(chunks) - 1))
    if len(per) < 2:
        return None
    vals = np.asarray(per)
    rng = np.random.default_rng(0)
    means = vals[rng.integers(0, len(vals), size=(BOOTSTRAP, len(vals)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return 100.0 * float(hi - lo) / float(vals.mean()), len(per)


def spread_pct(values: list[float]) -> float | None:
    """(max - min) / mean in percent over a cell's repeats; None below two runs."""
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return 100.0 * (max(values) - min(values)) / abs(mean) if mean else None


def twins(study, arm: str) -> list[str]:
    """The study's A/A twins of `arm`."""
    return [a.name for a in study.arms if getattr(a, "noise_of", None) == arm]


def aa_pct(cells: pl.DataFrame, arm: str, twin: str, metric: str, workload: str | None,
           temperature: float | None, level: int | None) -> float | None:
    """|mean(twin) - mean(arm)| / mean(arm) in percent of `metric` at one point, or None
    where either has no value there."""
    def mean(name: str) -> float | None:
        part = cells.filter(pl.col("arm") == name)
        if workload is not None:
            part = part.filter(pl.col("workload") == workload)
        if temperature is not None:
            part = part.filter(pl.col("temperature") == temperature)
        if level is not None:
            part = part.filter(pl.col("concurrency") == level)
        vals = part[metric].drop_nulls() if metric in part.columns else []
        return float(vals.mean()) if len(vals) else None

    a, t = mean(arm), mean(twin)
    if a is None or t is None or a == 0:
        return None
    return 100.0 * abs(t - a) / abs(a)


def _side_cells(f, arm: str, workload, temperature, level) -> list[str]:
    part = f.cells.filter(pl.col("arm") == arm)
    for col, want in (("workload", workload), ("temperature", temperature),
                      ("concurrency", level)):
        if want is not None:
            part = part.filter(pl.col(col) == want)
    return part["cell_id"].to_list() if "cell_id" in part.columns else []


def measure(f, metric: str, sides: list[tuple[str, list[float], str | None, float | None,
                                                   int | None]]) -> Noise:
    """The noise of a check over its sides, each (arm, values, workload, temperature, level).
    A side whose repeats are identical gives no run-to-run spread for an acceptance metric:
    its noise is across its prompts (`prompt_spread`)."""
    spreads, prompts = [], []
    for arm, values, workload, temp, level in sides:
        identical = len(values) >= 2 and max(values) == min(values)
        if identical and metric in ACCEPTANCE:
            got = prompt_spread(getattr(f, "requests", None),
                                _side_cells(f, arm, workload, temp, level))
            if got is not None:
                prompts.append((got[0], f"{arm}: bootstrap over {got[1]} requests"))
            continue
        if (s := spread_pct(values)) is not None:
            spreads.append(s)
    prompt = max(prompts, default=None)
    best, where = None, ""
    # a Finding keeps its twins apart (finding.Finding.twin_cells); a bare study holds them
    twin_of = getattr(f, "twin_of", None) or {}
    extra = getattr(f, "twin_cells", None)
    cells = f.cells if extra is None or extra.height == 0 else pl.concat(
        [f.cells, extra.select(f.cells.columns)], how="vertical_relaxed")
    for arm, _, workload, temp, level in sides:
        for twin in [t for t, a in twin_of.items() if a == arm] or twins(f.study, arm):
            got = aa_pct(cells, arm, twin, metric, workload, temp, level)
            at = f" at {level} stream{'s' if level != 1 else ''}" if level else ""
            if got is None and level is not None:
                # a twin measured at the study's lowest and highest levels only: between
                # them the suite's noise is the larger of its two ends, and says so
                ends = twin_levels(cells, twin, workload, temp)
                got = max((v for v in (aa_pct(cells, arm, twin, metric, workload, temp, lv)
                                       for lv in ends) if v is not None), default=None)
                at = (f" at {', '.join(map(str, ends))} streams, the larger (none at "
                      f"{level})") if got is not None else at
            if got is not None and (best is None or got > best):
                best, where = got, f"{arm} against its twin {twin}{at}"
    runs = min((len(v) for _, v, *_ in sides), default=1)
    return Noise(max(spreads) if spreads else None, best, where,
                 prompt[0] if prompt else None, prompt[1] if prompt else "", runs)


def twin_levels(cells: pl.DataFrame, twin: str, workload: str | None,
                temperature: float | None) -> list[int]:
    """The levels a twin was measured at (of one workload and temperature where given)."""
    part = cells.filter(pl.col("arm") == twin)
    if workload is not None:
        part = part.filter(pl.col("workload") == workload)
    if temperature is not None:
        part = part.filter(pl.col("temperature") == temperature)
    return sorted(set(part["concurrency"].to_list()))
