"""Tidy tables of a finding's cells, one function per view the notebooks show.

Design:
- Every function takes the cells frame of a `Finding` (CELL_SCHEMA columns plus `label`)
  and returns a small polars frame; nothing here reads files or draws.
- Repeats are averaged only where a view says so (`mean_over_repeats`); every view that
  shows an acceptance figure carries `repeated_4gram_share` and `length_share` (requests cut
  at max_tokens) beside it, because repetition is easy to draft and inflates acceptance
  (docs/embedded-model.md, lesson 4), with the words that explain them under the table;
  an acceptance figure whose cells are mostly loops carries the mark `text_quality.loop_flag`
  gives it ("loops", or "loops in k of n runs"), rendered after its number, never averaged
  in silently (analysis/finding/text_quality.py). Every measured figure likewise carries the marks
  of its cells' windows and warnings ("window not steady in 1 of 3 runs",
  analysis/finding/window_health.py), and a table that shows one says under it what the mark means
  and which cells carry it, with their warnings (`flagged`, `health_notes`).
- Derived figures use `specrepro.metrics` (relative change, step time), never a formula
  typed again here.
- Two kinds of function: data views (`mean_over_repeats`, `gain_over`, `crossing`,
  `crossings`, `kv_cost`: identifiers and raw units, for code and tests) and reader
  tables (`Table`: `by_streams`, `change_by_streams`, `per_arm`, `bill_table`,
  `spread_table`, `paired_tables`, `crossings_table`, `kv_table`). A reader table names
  arms by their labels and metrics in words with units (`NAMES`), keeps a level column
  only where the level varies (a constant one moves to the caption), and shows every
  measured figure as its mean with its spread over repeats: a `spread_of` struct {mean,
  min, max[, n]} that `show.html_table` renders as "mean (min-max, n=3)", or "mean (n=1)"
  where one run is all there is.
- `fmt` is the one number format (3 significant digits, thousands separators), used by the
  HTML tables and the figures' labels alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from specrepro import metrics
from specrepro.analysis.finding import window_health
from specrepro.analysis.finding.cell_key import CELL, LEVEL, READING
from specrepro.analysis.finding.text_quality import EXPLAIN, LOOP_NOTE, loop_flag
from specrepro.data import STANDS_FOR


def mean_over_repeats(cells: pl.DataFrame, values: list[str]) -> pl.DataFrame:
    """Mean (and run count) of each value per arm x workload x concurrency x temperature."""
    return (cells.group_by(["label", *CELL], maintain_order=True)
            .agg([pl.col(v).mean() for v in values] + [pl.len().alias("runs")]))


def gain_over(cells: pl.DataFrame, baseline: str, value: str = "agg_tok_s") -> pl.DataFrame:
    """Per arm and level, `value` and its relative change (%) against the baseline arm at
    the same workload, concurrency and temperature."""
    means = mean_over_repeats(cells, [value])
    base = (means.filter(pl.col("arm") == baseline)
            .select([*LEVEL, pl.col(value).alias("_base")]))
    joined = means.join(base, on=LEVEL, how="left")
    gains = [metrics.relative_change_pct(v, b)
             for v, b in zip(joined[value].to_list(), joined["_base"].to_list(), strict=True)]
    return (joined.with_columns(pl.Series("change_pct", gains, dtype=pl.Float64))
            .rename({"_base": f"{value}_{baseline}"})
            .select(["label", *CELL, value, f"{value}_{baseline}", "change_pct"]))


def crossing(cells: pl.DataFrame, arm: str, baseline: str, value: str = "agg_tok_s"
             ) -> float | None:
    """The load (streams) at which an arm falls below the baseline: linear in log2(streams)
    between the last level where it was ahead and the first where it is behind; None when
    it never falls behind at the levels measured."""
    g = gain_over(cells.filter(pl.col("arm").is_in([arm, baseline])), baseline, value)
    pts = g.filter(pl.col("arm") == arm).sort("concurrency")
    levels, gains = pts["concurrency"].to_list(), pts["change_pct"].to_list()
    for i, (c, gain) in enumerate(zip(levels, gains, strict=True)):
        if gain is None or gain >= 0:
            continue
        if i == 0 or gains[i - 1] is None:
            return float(c)
        x0, x1 = math.log2(levels[i - 1]), math.log2(c)
        y0, y1 = gains[i - 1], gain
        return float(2 ** (x0 + (x1 - x0) * y0 / (y0 - y1)))
    return None


def crossings(cells: pl.DataFrame, baseline: str, value: str = "agg_tok_s") -> pl.DataFrame:
    """For every arm but the baseline: the load at which it falls below the baseline
    (`crossing`), or null where it stays ahead at every level measured."""
    rows = [{"label": label, "arm": arm, "crossing_streams": crossing(cells, arm, baseline, value)}
            for label, arm in cells.select("label", "arm").unique(maintain_order=True).iter_rows()
            if arm != baseline]
    return pl.DataFrame(rows, schema={"label": pl.String, "arm": pl.String,
                                      "crossing_streams": pl.Float64}, orient="row")


def kv_reference(cells: pl.DataFrame, reference: str | None = None) -> str:
    """The arm a KV pool is compared against: `reference`, else the first MTP arm (the
    articles' comparison), else the first arm."""
    if reference is not None:
        return reference
    mtp = cells.filter(pl.col("method") == "mtp")["arm"]
    return mtp[0] if mtp.len() else cells["arm"][0]


def kv_cost(cells: pl.DataFrame, reference: str | None = None) -> pl.DataFrame:
    """Each arm's KV pool against the reference arm's (default: the first MTP arm, the
    articles' comparison): tokens, tokens given up to the drafter, and %."""
    reference = kv_reference(cells, reference)
    pools = (cells.group_by(["label", "arm"], maintain_order=True)
             .agg(pl.col("kv_pool_tokens").drop_nulls().first(),
                  pl.col("max_concurrency").drop_nulls().first()))
    ref = pools.filter(pl.col("arm") == reference)["kv_pool_tokens"]
    ref_tokens = ref[0] if ref.len() else None
    cost = [None if (t is None or ref_tokens is None) else ref_tokens - t
            for t in pools["kv_pool_tokens"].to_list()]
    pct = [metrics.relative_change_pct(t, ref_tokens) for t in pools["kv_pool_tokens"].to_list()]
    return pools.with_columns(pl.Series("tokens_given_up", cost, dtype=pl.Int64),
                              pl.Series("change_pct", pct, dtype=pl.Float64))


# ----------------------------------------------------------------- reader tables

# What a header or an axis calls a cell column or a published metric: words, the unit shown,
# and the factor from the stored value to that unit (stored fractions are shown in %).
NAMES: dict[str, tuple[str, str, float]] = {
    "agg_tok_s": ("aggregate decode throughput", "tok/s", 1.0),
    "per_stream_tok_s": ("per-stream decode throughput", "tok/s", 1.0),
    "agg_tok_s_change_pct": ("throughput change", "%", 1.0),
    "acceptance_length": ("tokens per step", "tokens/step", 1.0),
    "draft_acceptance_rate": ("draft tokens accepted", "%", 100.0),
    "acceptance_rate_pos": ("accepted at each draft position", "% of steps", 1.0),
    "step_ms": ("step time", "ms", 1.0),
    "repeated_4gram_share": ("repeated 4-grams", "%", 100.0),
    "length_share": ("ended at max_tokens", "%", 100.0),
    "ttft_p50_ms": ("median time to first token", "ms", 1.0),
    "ttft_p95_ms": ("95th percentile time to first token", "ms", 1.0),
    "ttft_p50_s": ("median time to first token", "s", 1.0),
    "itl_p50_ms": ("median inter-token latency (token-weighted, per-token gaps)", "ms", 1.0),
    "itl_request_mean_ms": ("inter-token latency, mean per request (as vllm bench serve)",
                            "ms", 1.0),
    "itl_ms": ("inter-token latency", "ms", 1.0),
    "gsm8k_strict_correct": ("GSM8K correct (strict match)", "problems", 1.0),
    "gsm8k_correct": ("GSM8K correct", "problems", 1.0),
    "identical_to_baseline": ("outputs token-identical to the baseline arm", "%", 100.0),
    "peak_mem_mib": ("peak memory", "MiB", 1.0),
    "kv_pool_tokens": ("KV pool", "tokens", 1.0),
    "max_concurrency": ("full-length requests the KV pool holds", "requests", 1.0),
    "max_concurrency_contexts": ("full-length contexts the KV pool holds", "contexts", 1.0),
    "tokens_per_joule": ("tokens per joule", "tok/J", 1.0),
    "power_w_mean": ("mean board power", "W", 1.0),
    "board_power_w": ("mean board power", "W", 1.0),
    "energy_j": ("energy", "J", 1.0),
}


def name(metric: str, unit: str | None = None) -> str:
    """'tokens per step (tokens/step)': a metric in words with its unit (`unit` overrides
    the shown unit, e.g. a published row's own)."""
    words, shown, _ = NAMES.get(metric, (metric.replace("_", " "), "", 1.0))
    unit = unit if unit is not None else shown
    return f"{words} ({unit})" if unit else words


def scale(metric: str) -> float:
    return NAMES.get(metric, ("", "", 1.0))[2]


def fmt(value) -> str:
    """The one number format: 3 significant digits, thousands separators from 1,000 up."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def streams(n: int | None) -> str:
    return "any load" if n is None else f"{n} stream" + ("" if n == 1 else "s")


def spread_of(values, factor: float = 1.0, with_n: bool = True) -> dict | None:
    """Mean, min and max (and run count) of the measured runs of one figure; None where no
    run measured it."""
    vals = [v * factor for v in values
            if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return None
    out = {"mean": sum(vals) / len(vals), "min": min(vals), "max": max(vals)}
    if with_n:
        out["n"] = len(vals)
    return out


def flagged(spread: dict | None, cells: pl.DataFrame, loops: bool = True) -> dict | None:
    """A figure's spread with the marks of the cells it averages (`flag`: None where none
    is marked; the key is always there, so a column's structs have one shape): the loop
    mark where the figure is an acceptance one (`loops`), and on any figure the marks of
    its cells' windows and warnings (window_health.flag)."""
    if spread is None:
        return None
    marks = (loop_flag(cells["repeated_4gram_share"].to_list()) if loops else None,
             window_health.flag(cells))
    return {**spread, "flag": "; ".join(m for m in marks if m) or None}


def health_notes(cells: pl.DataFrame) -> tuple[str, ...]:
    """The words under a table whose figures average `cells`, where one is marked: what
    each window or warning mark means and which cells carry it (window_health.notes)."""
    return window_health.notes(cells)


TEXT = ("repeated_4gram_share", "length_share")  # what every acceptance figure has beside it
CELL_TEXT_SCHEMA = {t: pl.Float64 for t in TEXT}  # no cells at a level: empty text columns


def text_columns(cells: pl.DataFrame) -> pl.DataFrame:
    """Cells with both text columns, null where a frame built by hand lacks one."""
    return cells.with_columns([pl.lit(None, pl.Float64).alias(t) for t in TEXT
                               if t not in cells.columns])


def text_notes(cells: pl.DataFrame) -> tuple[str, ...]:
    """The words under a table that shows the text columns: what each means, and the loop
    mark where a cell of the table loops."""
    notes = tuple(EXPLAIN[c] for c in TEXT)
    shares = cells["repeated_4gram_share"].to_list() if cells.height else []
    return notes + ((LOOP_NOTE,) if loop_flag(shares) else ())


def with_text(values: list[str]) -> list[str]:
    """`values` with the text columns right after its last acceptance figure, where it
    shows one and lacks them (each once, in TEXT's order)."""
    idx = [i for i, v in enumerate(values) if v in ACCEPTANCE]
    if not idx:
        return list(values)
    rest = [v for v in values if v not in TEXT]
    at = max(i for i, v in enumerate(rest) if v in ACCEPTANCE) + 1
    return rest[:at] + list(TEXT) + rest[at:]


@dataclass(frozen=True)
class Table:
    """A reader table: the frame, a caption that says what rows and cells are, and notes
    shown under it."""

    frame: pl.DataFrame
    caption: str
    notes: tuple[str, ...] = ()


ACCEPTANCE = ("acceptance_length", "draft_acceptance_rate")
LEVEL_COLUMNS = dict(zip(LEVEL, ("workload", "streams", "T"), strict=True))  # readers' names
SPREAD_NOTE = "cells: mean over runs (min-max over the runs, n runs)"


def _level_values(key: str, value):
    if key == "workload" and value in STANDS_FOR:  # measured in place of the article's own
        return f"{value} (for the article's {STANDS_FOR[value]})"
    return f"{value:g}" if key == "temperature" and value is not None else value


def varying_levels(frame: pl.DataFrame, keys=LEVEL) -> tuple[list[str], str]:
    """The level keys whose value varies in `frame` (to show as columns) and the constant
    ones in words (for the caption): 'humaneval, 1 stream, T=0'."""
    shown, fixed = [], []
    for k in keys:
        vals = frame[k].unique(maintain_order=True).to_list() if k in frame.columns else []
        if len(vals) > 1:
            shown.append(k)
        elif vals and vals[0] is not None:  # arm-level figures have no level
            v = vals[0]
            fixed.append(streams(v) if k == "concurrency" else
                         f"T={v:g}" if k == "temperature" else str(_level_values(k, v)))
    return shown, ", ".join(fixed)


def with_fixed(caption: str, fixed: str) -> str:
    return f"{caption}; all at {fixed}" if fixed else caption


def _level_cells(row: dict, shown: list[str]) -> dict:
    return {LEVEL_COLUMNS[k]: _level_values(k, row[k]) for k in shown}


def _groups(cells: pl.DataFrame, keys: list[str] | tuple[str, ...]):
    for key, part in cells.group_by(keys, maintain_order=True):
        yield dict(zip(keys, key, strict=True)), part


def by_streams(cells: pl.DataFrame, value: str = "agg_tok_s", caption: str | None = None
               ) -> Table:
    """One row per level (streams, and workload or temperature where they vary), one column
    per arm: `value` as mean (min-max, n runs). For an acceptance figure, each arm's value
    carries its loop mark and the level's repeated 4-grams and requests cut at max_tokens
    over every arm's cells follow (mean, min-max)."""
    shown, fixed = varying_levels(cells)
    cells = text_columns(cells)
    labels = list(dict.fromkeys(cells["label"].to_list()))
    accept = value in ACCEPTANCE
    rows = []
    for level, at in _groups(cells.sort(READING), READING):
        row = _level_cells(level, shown)
        for label in labels:
            mine = at.filter(pl.col("label") == label)
            row[label] = flagged(spread_of(mine[value].to_list(), scale(value)), mine, accept)
        rows.append(row)
    # an arm without the figure at any level (no speculation has no tokens per step) is
    # left out rather than shown as a column of n/a
    labels = [lab for lab in labels if any(r[lab] is not None for r in rows)]
    rows = [{k: v for k, v in r.items() if k in labels or k in LEVEL_COLUMNS.values()}
            for r in rows]
    cap = caption or f"{name(value)} per arm; {SPREAD_NOTE}"
    notes = health_notes(cells)
    if accept:  # repetition is easy to draft: say how much there was, at every level
        at_level = [at for _, at in _groups(cells.sort(READING), READING)]
        for row, at in zip(rows, at_level, strict=True):
            row.update({f"{name(t)}, all arms": spread_of(at[t].to_list(), scale(t),
                                                          with_n=False) for t in TEXT})
        cap += "; the text columns: every arm's cells at the level"
        notes = text_notes(cells) + notes
    return Table(pl.DataFrame(rows), with_fixed(cap, fixed), notes)


def change_by_streams(cells: pl.DataFrame, baseline: str, value: str = "agg_tok_s"
                      ) -> Table:
    """Each arm's change against the baseline arm at the same level (%), one column per arm:
    the change of the means, with the spread of each run against the baseline's mean."""
    shown, fixed = varying_levels(cells)
    base_label = cells.filter(pl.col("arm") == baseline)["label"]
    base_label = base_label[0] if base_label.len() else baseline
    labels = list(dict.fromkeys(cells.filter(pl.col("arm") != baseline)["label"].to_list()))
    rows = []
    for level, at in _groups(cells.sort(READING), READING):
        base = at.filter(pl.col("arm") == baseline)[value].drop_nulls()
        b = base.mean() if base.len() else None
        row = _level_cells(level, shown)
        for label in labels:
            mine = at.filter(pl.col("label") == label)
            row[label] = flagged(spread_of([metrics.relative_change_pct(v, b)
                                            for v in mine[value].to_list()]), mine, False)
        rows.append(row)
    cap = (f"Change of {name(value, '')} against {base_label} at the same level (%); cells: "
           f"the change of the means (min-max: each run against {base_label}'s mean, n runs)")
    return Table(pl.DataFrame(rows), with_fixed(cap, fixed), health_notes(cells))


def per_arm(cells: pl.DataFrame, values: list[str], caption: str = "") -> Table:
    """One row per arm and level, one column per value (mean, min-max over runs), and the
    run count."""
    shown, fixed = varying_levels(cells)
    cells = text_columns(cells)
    values = with_text(values)  # an acceptance figure never without its text columns
    rows = []
    for level, part in _groups(cells, ["label", *LEVEL]):
        row = {"arm": level["label"], **_level_cells(level, shown)}
        for v in values:
            row[name(v)] = spread_of(part[v].to_list(), scale(v), with_n=False)
            if v not in TEXT:  # a measured figure: its cells' marks (loops: acceptance)
                row[name(v)] = flagged(row[name(v)], part, v in ACCEPTANCE)
        row["runs"] = part.height
        rows.append(row)
    cap = caption or ", ".join(name(v) for v in values)
    notes = text_notes(cells) if set(values) & set(ACCEPTANCE) else ()
    return Table(pl.DataFrame(rows), with_fixed(
        f"{cap}; cells: mean over runs (min-max over the runs)", fixed),
        notes + health_notes(cells))


def bill_table(cells: pl.DataFrame, with_power: bool = True) -> Table:
    """What each arm costs per level: throughput, tokens per step, repetition, peak memory
    and, where a power source measured them (with_power), watts and tokens per joule; the
    KV pool is `kv_table`'s (one value per arm)."""
    values = with_text(["agg_tok_s", "acceptance_length", "peak_mem_mib"])
    if with_power:
        values += ["power_w_mean", "tokens_per_joule"]
    return per_arm(cells, values, "What each arm costs: " + ", ".join(name(v) for v in values))


def spread_table(cells: pl.DataFrame, value: str = "agg_tok_s") -> Table:
    """Run-to-run spread per arm and temperature: runs, mean (min-max), standard deviation
    and coefficient of variation of `value`, with acceptance and repetition beside."""
    shown, fixed = varying_levels(cells, LEVEL)
    cells = text_columns(cells)
    rows = []
    for level, part in _groups(cells, ["label", *LEVEL]):
        vals = part[value].drop_nulls()
        mean = vals.mean() if vals.len() else None
        sd = vals.std() if vals.len() > 1 else None
        rows.append({
            "arm": level["label"], **_level_cells(level, shown), "runs": part.height,
            name(value): flagged(spread_of(vals.to_list(), with_n=False), part, False),
            "sd": sd, "cv (sd / mean)": None if sd is None or not mean else sd / mean,
            **{name(a): flagged(spread_of(part[a].to_list(), scale(a), with_n=False), part)
               for a in ("draft_acceptance_rate", "acceptance_length")},
            **{name(t): spread_of(part[t].to_list(), scale(t), with_n=False) for t in TEXT}})
    return Table(pl.DataFrame(rows), with_fixed(
        f"Run-to-run spread of {name(value)}: mean (min-max) over the runs, standard "
        "deviation (sd) and cv = sd / mean (n=1: none)", fixed),
        text_notes(cells) + health_notes(cells))


def paired_tables(cells: pl.DataFrame, arm: str, reference: str, values: list[str]
                  ) -> list[Table]:
    """Two arms side by side, one small table per value: each level's reference and arm
    (mean, min-max, n runs) and the arm's change against the reference (%)."""
    pair = text_columns(cells).filter(pl.col("arm").is_in([arm, reference]))
    shown, fixed = varying_levels(pair)
    label = {a: pair.filter(pl.col("arm") == a)["label"][0] for a in (arm, reference)
             if pair.filter(pl.col("arm") == a).height}
    out = []
    # an acceptance table is followed by the text columns' tables (with_text), and carries
    # the loop mark and their words
    for v in with_text(values):
        share = scale(v) == 100.0  # a share: its difference in points, not a change of a %
        head = "difference (points)" if share else "change (%)"
        rows = []
        for level, at in _groups(pair.sort(READING), READING):
            ref_at = at.filter(pl.col("arm") == reference)
            arm_at = at.filter(pl.col("arm") == arm)
            ref = spread_of(ref_at[v].to_list(), scale(v))
            new = spread_of(arm_at[v].to_list(), scale(v))
            if ref is None and new is None:  # not measured at this level (GSM8K on essays)
                continue
            if v not in TEXT:  # a measured figure: its cells' marks (loops: acceptance)
                ref = flagged(ref, ref_at, v in ACCEPTANCE)
                new = flagged(new, arm_at, v in ACCEPTANCE)
            a, b = new and new["mean"], ref and ref["mean"]
            rows.append({**_level_cells(level, shown),
                         label.get(reference, reference): ref, label.get(arm, arm): new,
                         head: (None if a is None or b is None else a - b) if share
                         else metrics.relative_change_pct(a, b)})
        notes = ((EXPLAIN[v],) if v in TEXT else text_notes(pair)[len(TEXT):]
                 if v in ACCEPTANCE else ())  # acceptance: the loop words where one loops
        notes += () if v in TEXT else health_notes(pair)
        out.append(Table(pl.DataFrame(rows), with_fixed(
            f"{name(v)}: {label.get(arm, arm)} against {label.get(reference, reference)}; "
            f"{SPREAD_NOTE}; {head.split(' ')[0]}: of the means", fixed), notes))
    return out


def crossings_table(cells: pl.DataFrame, baseline: str, value: str = "agg_tok_s") -> Table:
    """Where each arm falls below the baseline arm, in streams (interpolated in log2)."""
    levels = sorted(cells["concurrency"].unique().to_list())
    base = cells.filter(pl.col("arm") == baseline)["label"]
    base = base[0] if base.len() else baseline
    c = crossings(cells, baseline, value)
    head = f"falls below {base} at (streams)"
    def text(x: float | None) -> str:
        if x is None:
            return f"not at {levels[0]}-{levels[-1]} streams"
        return f"below already at {fmt(x)}" if x == levels[0] else fmt(x)

    rows = [{"arm": r["label"], head: text(r["crossing_streams"])} for r in c.to_dicts()]
    return Table(pl.DataFrame(rows, schema={"arm": pl.String, head: pl.String}),
                 f"Where each arm's {name(value)} falls below {base}'s: linear in log2(streams) "
                 "between the last level ahead and the first behind (means over runs)")


def kv_table(cells: pl.DataFrame, reference: str | None = None) -> Table:
    """Each arm's KV pool and what the drafter costs in it against the reference arm."""
    ref = kv_reference(cells, reference)
    kv = kv_cost(cells, ref)
    ref_label = kv.filter(pl.col("arm") == ref)["label"]
    ref_label = ref_label[0] if ref_label.len() else "the reference"
    frame = kv.select(
        pl.col("label").alias("arm"), pl.col("kv_pool_tokens").alias(name("kv_pool_tokens")),
        pl.col("max_concurrency").alias(name("max_concurrency")),
        pl.col("tokens_given_up").alias(f"given up against {ref_label} (tokens)"),
        pl.col("change_pct").alias(f"against {ref_label} (%)"))
    return Table(frame, f"KV pool at the same memory budget, against {ref_label}: tokens "
                        "given up to the drafter's own caches, and % (set at startup: one "
                        "value per arm)")
