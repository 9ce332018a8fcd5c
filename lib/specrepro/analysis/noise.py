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
- The band is the larger of the two measures (`Noise.band_pct`):
  - a directional difference at or inside it is a tie, never a win;
  - a "same" claim holds only when the difference is inside its own band (claims.yaml
    `within`) *and* inside the noise band, never because two ranges touch.
- With one run a side and no twin, no noise was measured:
  - a directional difference is judged on its sign alone and says so;
  - a "same" claim is judged on its own band alone, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl


@dataclass(frozen=True)
class Noise:
    spread_pct: float | None = None  # the larger relative range of the two cells
    aa_pct: float | None = None      # the larger A/A difference of a side with a twin
    aa_where: str = ""               # which twin, at which level

    @property
    def band_pct(self) -> float | None:
        known = [v for v in (self.spread_pct, self.aa_pct) if v is not None]
        return max(known) if known else None

    def text(self) -> str:
        if self.band_pct is None:
            return "not measured (1 run each, no A/A twin)"
        parts = []
        if self.aa_pct is not None:
            parts.append(f"A/A {self.aa_pct:.1f}%{f' ({self.aa_where})' if self.aa_where else ''}")
        if self.spread_pct is not None:
            parts.append(f"run-to-run {self.spread_pct:.1f}%")
        return f"±{self.band_pct:.1f}% ({'; '.join(parts)})"

    def tie(self, change_pct: float) -> bool:
        """Whether a change is inside the band (False where no noise was measured)."""
        return self.band_pct is not None and abs(change_pct) <= self.band_pct


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


def measure(f, metric: str, sides: list[tuple[str, list[float], str | None, float | None,
                                                   int | None]]) -> Noise:
    """The noise of a check over its sides, each (arm, values, workload, temperature, level)."""
    spreads = [s for s in (spread_pct(v) for _, v, *_ in sides) if s is not None]
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
    return Noise(max(spreads) if spreads else None, best, where)


def twin_levels(cells: pl.DataFrame, twin: str, workload: str | None,
                temperature: float | None) -> list[int]:
    """The levels a twin was measured at (of one workload and temperature where given)."""
    part = cells.filter(pl.col("arm") == twin)
    if workload is not None:
        part = part.filter(pl.col("workload") == workload)
    if temperature is not None:
        part = part.filter(pl.col("temperature") == temperature)
    return sorted(set(part["concurrency"].to_list()))
