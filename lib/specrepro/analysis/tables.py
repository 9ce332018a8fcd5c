"""Tidy tables of a finding's cells, one function per view the notebooks show.

Design:
- Every function takes the cells frame of a `Finding` (CELL_SCHEMA columns plus `label`)
  and returns a small polars frame; nothing here reads files or draws.
- Repeats are averaged only where a view says so (`mean_over_repeats`); every view that
  shows an acceptance figure carries `repeated_4gram_share` beside it, because repetition
  is easy to draft and inflates acceptance (docs/embedded-model.md, lesson 4).
- Derived figures use `specrepro.metrics` (relative change, step time), never a formula
  typed again here.
"""

from __future__ import annotations

import math

import polars as pl

from specrepro import metrics

LEVEL = ["label", "arm", "workload", "concurrency", "temperature"]

SUMMARY_COLUMNS = [
    "label", "workload", "concurrency", "temperature", "repeat", "seed", "n_requests",
    "n_errors", "output_tokens", "agg_tok_s", "per_stream_tok_s", "acceptance_length",
    "draft_acceptance_rate", "step_ms", "repeated_4gram_share",
]


def summary(cells: pl.DataFrame) -> pl.DataFrame:
    """Every cell, one row each, with its speed, acceptance and repetition."""
    return cells.select([c for c in SUMMARY_COLUMNS if c in cells.columns])


def mean_over_repeats(cells: pl.DataFrame, values: list[str]) -> pl.DataFrame:
    """Mean (and run count) of each value per arm x workload x concurrency x temperature."""
    return (cells.group_by(LEVEL, maintain_order=True)
            .agg([pl.col(v).mean() for v in values] + [pl.len().alias("runs")]))


def by_level(cells: pl.DataFrame, value: str, workload: str | None = None) -> pl.DataFrame:
    """One row per concurrency level, one column per arm (its label): `value`, repeats
    averaged. Arms keep the study's order."""
    data = cells if workload is None else cells.filter(pl.col("workload") == workload)
    means = mean_over_repeats(data, [value])
    labels = list(dict.fromkeys(means["label"].to_list()))
    wide = means.pivot(on="label", index="concurrency", values=value,
                       aggregate_function="mean").sort("concurrency")
    return wide.select(["concurrency", *[lab for lab in labels if lab in wide.columns]])


def gain_over(cells: pl.DataFrame, baseline: str, value: str = "agg_tok_s") -> pl.DataFrame:
    """Per arm and level, `value` and its relative change (%) against the baseline arm at
    the same workload, concurrency and temperature."""
    means = mean_over_repeats(cells, [value])
    base = (means.filter(pl.col("arm") == baseline)
            .select(["workload", "concurrency", "temperature", pl.col(value).alias("_base")]))
    joined = means.join(base, on=["workload", "concurrency", "temperature"], how="left")
    gains = [metrics.relative_change_pct(v, b)
             for v, b in zip(joined[value].to_list(), joined["_base"].to_list(), strict=True)]
    return (joined.with_columns(pl.Series("change_pct", gains, dtype=pl.Float64))
            .rename({"_base": f"{value}_{baseline}"})
            .select(["label", "arm", "workload", "concurrency", "temperature", value,
                     f"{value}_{baseline}", "change_pct"]))


def positions(cells: pl.DataFrame, concurrency: int | None = None) -> pl.DataFrame:
    """Acceptance at each draft position (share of steps whose draft i was kept), per arm,
    at one level (the lowest by default), averaged over repeats and workloads."""
    level = concurrency if concurrency is not None else cells["concurrency"].min()
    data = cells.filter((pl.col("concurrency") == level)
                        & pl.col("per_position_acceptance").is_not_null())
    rows = []
    for (label, arm), part in data.group_by(["label", "arm"], maintain_order=True):
        per = part["per_position_acceptance"].to_list()
        rep = part["repeated_4gram_share"].drop_nulls()
        for i in range(max(len(p) for p in per)):
            vals = [p[i] for p in per if i < len(p)]
            rows.append({"label": label, "arm": arm, "concurrency": level, "position": i + 1,
                         "acceptance": sum(vals) / len(vals),
                         "repeated_4gram_share": rep.mean() if rep.len() else None})
    schema = {"label": pl.String, "arm": pl.String, "concurrency": pl.Int64,
              "position": pl.Int64, "acceptance": pl.Float64,
              "repeated_4gram_share": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row")


def spread(cells: pl.DataFrame, value: str = "agg_tok_s") -> pl.DataFrame:
    """Run-to-run spread per arm and temperature: runs, mean, standard deviation, min, max,
    coefficient of variation, with acceptance and repetition averaged beside."""
    return (cells.group_by(["label", "arm", "temperature"], maintain_order=True)
            .agg(pl.len().alias("runs"), pl.col(value).mean().alias("mean"),
                 pl.col(value).std().alias("std"), pl.col(value).min().alias("min"),
                 pl.col(value).max().alias("max"),
                 pl.col("draft_acceptance_rate").mean(), pl.col("acceptance_length").mean(),
                 pl.col("repeated_4gram_share").mean())
            .with_columns((pl.col("std") / pl.col("mean")).alias("cv")))


def paired(cells: pl.DataFrame, arm: str, reference: str, values: list[str]) -> pl.DataFrame:
    """Two arms side by side per workload and level: each value for the reference arm, the
    arm, and the arm's change against the reference (%)."""
    means = mean_over_repeats(cells, [*values, "repeated_4gram_share"])
    key = ["workload", "concurrency", "temperature"]
    ref = means.filter(pl.col("arm") == reference).drop(["label", "arm", "runs"])
    new = means.filter(pl.col("arm") == arm).drop(["label", "arm", "runs"])
    joined = ref.join(new, on=key, how="full", suffix=f"__{arm}", coalesce=True)
    out = joined.rename({v: f"{v}__{reference}" for v in [*values, "repeated_4gram_share"]})
    for v in values:
        change = [metrics.relative_change_pct(a, b) for a, b in
                  zip(out[f"{v}__{arm}"].to_list(), out[f"{v}__{reference}"].to_list(),
                      strict=True)]
        out = out.with_columns(pl.Series(f"{v}__change_pct", change, dtype=pl.Float64))
    return out.sort(key)


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


BILL_COLUMNS = ["label", "arm", "workload", "concurrency", "agg_tok_s", "power_w_mean",
                "energy_j", "tokens_per_joule", "kv_pool_tokens", "max_concurrency",
                "peak_mem_mib", "acceptance_length", "repeated_4gram_share"]


POWER_COLUMNS = ("power_w_mean", "energy_j", "tokens_per_joule")


def bill(cells: pl.DataFrame, with_power: bool = True) -> pl.DataFrame:
    """What each arm costs per level: throughput, watts, tokens per joule, KV pool tokens,
    the concurrency the pool allows and peak memory (repeats averaged). Without a power
    source (with_power=False) the power columns are left out rather than shown empty."""
    values = [c for c in BILL_COLUMNS if c not in LEVEL and c != "arm"
              and (with_power or c not in POWER_COLUMNS)]
    return mean_over_repeats(cells, values).select(
        ["label", "arm", "workload", "concurrency", *values])


def kv_cost(cells: pl.DataFrame, reference: str | None = None) -> pl.DataFrame:
    """Each arm's KV pool against the reference arm's (default: the first MTP arm, the
    articles' comparison): tokens, tokens given up to the drafter, and %."""
    if reference is None:
        mtp = cells.filter(pl.col("method") == "mtp")["arm"]
        reference = mtp[0] if mtp.len() else cells["arm"][0]
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
