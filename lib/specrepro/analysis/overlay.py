"""The published overlay: the article's value beside the measured one, with its source.

Design:
- Published rows come from `specrepro.published.load_published()`; `claims.yaml` maps the
  study's arms and workloads to the published ones. A published row matches a measured
  level when every field it gives (workload, concurrency, temperature) agrees; where the
  notebook's claims name a `published_temperature`, the article's figures at that
  temperature are compared with the measured ones at whatever temperature they were taken,
  and the row carries both (`temperature`, `published_temperature`); a blank
  concurrency or workload matches only arm-level metrics (KV pool, memory, slots).
- Published metrics are read in the article's units: percent metrics (acceptance rates,
  changes) are compared as percent, so the measured fraction is scaled to percent.
- `agg_tok_s_change_pct` is computed from the measured cells against the arm the
  published row names as its baseline (mapped to a study arm), with metrics.py.
- Where the article prints two different values for one thing, the one named by the
  notebook's `prefer` (else a table before a sentence) is compared, and the other stays in
  `also_published` with its source, so the reader sees which was chosen.
- Rows for single repeats (article A's four runs) are left out here; figures show them.
"""

from __future__ import annotations

import re

import polars as pl

from specrepro import metrics
from specrepro.analysis.claims import Claims
from specrepro.published import load_published

ARM_LEVEL = {"kv_pool_tokens", "max_concurrency_contexts", "peak_mem_mib", "request_slots"}
# The published metrics a measured cell has a counterpart for (in measured_value).
COMPARABLE = {"agg_tok_s", "acceptance_length", "step_ms", "tokens_per_joule", "board_power_w",
              "kv_pool_tokens", "peak_mem_mib", "gsm8k_correct", "itl_ms", "ttft_p95_ms",
              "draft_acceptance_rate", "ttft_p50_s", "max_concurrency_contexts",
              "agg_tok_s_change_pct", *(f"acceptance_rate_pos{i}" for i in range(1, 17))}
STATS = ("value", "mean", "approx")
_POS = re.compile(r"^acceptance_rate_pos(\d+)$")

OVERLAY_SCHEMA = {
    "label": pl.String, "arm": pl.String, "workload": pl.String, "concurrency": pl.Int64,
    "temperature": pl.Float64, "published_temperature": pl.Float64, "metric": pl.String,
    "measured": pl.Float64,
    "published": pl.Float64, "unit": pl.String, "published_arm": pl.String,
    "source": pl.String, "also_published": pl.String,
}


def measured_value(level: dict, metric: str) -> float | None:
    """A measured level's figure in the published metric's name and unit."""
    m = _POS.match(metric)
    if m:
        per = level.get("per_position_acceptance") or []
        i = int(m.group(1)) - 1
        return 100.0 * per[i] if i < len(per) and per[i] is not None else None
    direct = {"agg_tok_s": "agg_tok_s", "acceptance_length": "acceptance_length",
              "step_ms": "step_ms", "tokens_per_joule": "tokens_per_joule",
              "board_power_w": "power_w_mean", "kv_pool_tokens": "kv_pool_tokens",
              "peak_mem_mib": "peak_mem_mib", "gsm8k_correct": "gsm8k_strict_correct",
              "itl_ms": "itl_p50_ms", "ttft_p95_ms": "ttft_p95_ms",
              "max_concurrency_contexts": "max_concurrency"}
    if metric in direct:
        return level.get(direct[metric])
    if metric == "draft_acceptance_rate":
        v = level.get("draft_acceptance_rate")
        return None if v is None else 100.0 * v
    if metric == "ttft_p50_s":
        v = level.get("ttft_p50_ms")
        return None if v is None else v / 1000.0
    return None


def _levels(cells: pl.DataFrame) -> list[dict]:
    """Per arm x workload x concurrency x temperature: the mean of each figure over repeats
    (per-position acceptance averaged position by position)."""
    out = []
    keys = ["label", "arm", "workload", "concurrency", "temperature"]
    for _, part in cells.group_by(keys, maintain_order=True):
        level = {k: part[k][0] for k in keys}
        for col in part.columns:
            if col in keys or part[col].dtype not in (pl.Float64, pl.Int64):
                continue
            vals = part[col].drop_nulls()
            level[col] = vals.mean() if vals.len() else None
        per = [p for p in part["per_position_acceptance"].to_list() if p]
        if per:
            n = max(len(p) for p in per)
            level["per_position_acceptance"] = [
                sum(p[i] for p in per if i < len(p)) / sum(1 for p in per if i < len(p))
                for i in range(n)]
        out.append(level)
    return out


def _matches(pub: dict, level: dict, claims: Claims) -> bool:
    arm_level = pub["metric"] in ARM_LEVEL
    if (pub["workload"] is None or pub["concurrency"] is None) and not arm_level:
        return False
    if pub["workload"] is not None and pub["workload"] != claims.published_workload(
            level["workload"]):
        return False
    if pub["concurrency"] is not None and pub["concurrency"] != level["concurrency"]:
        return False
    want = claims.compared_temperature(level["temperature"])
    return pub["temperature"] is None or (want is not None
                                          and abs(pub["temperature"] - want) < 1e-9)


def _choose(rows: list[dict], claims: Claims) -> tuple[dict, list[dict]]:
    """The published row to compare against, and the other distinct values."""
    def rank(r: dict) -> tuple:
        preferred = any(p.arm == r["arm"] and p.metric == r["metric"] and p.source in r["source"]
                        for p in claims.prefer)
        return (not preferred, not r["source"].startswith("table:"))

    ordered = sorted(rows, key=rank)
    chosen = ordered[0]
    others, seen = [], {chosen["value"]}
    for r in ordered[1:]:
        if r["value"] not in seen:
            seen.add(r["value"])
            others.append(r)
    return chosen, others


def overlay(cells: pl.DataFrame, claims: Claims, metrics_wanted: list[str] | None = None
            ) -> pl.DataFrame:
    """Measured beside published for every level of a mapped arm the article gives a figure
    for (one row per level and metric)."""
    pub = load_published().filter(pl.col("stat").is_in(STATS) & pl.col("repeat").is_null()
                                  & pl.col("metric").is_in(list(COMPARABLE)))
    if metrics_wanted is not None:
        pub = pub.filter(pl.col("metric").is_in(metrics_wanted))
    levels = _levels(cells)
    reverse = {v: k for k, v in claims.arms.items()}
    rows, arm_level_done = [], set()
    for level in levels:
        pub_arm = claims.arms.get(level["arm"])
        if pub_arm is None:
            continue
        mine = [r for r in pub.filter(pl.col("arm") == pub_arm).to_dicts()
                if _matches(r, level, claims)]
        by_metric: dict[str, list[dict]] = {}
        for r in mine:
            by_metric.setdefault(r["metric"], []).append(r)
        for metric, candidates in by_metric.items():
            if metric in ARM_LEVEL:  # one row per arm: the pool does not change with load
                if (level["arm"], metric) in arm_level_done:
                    continue
                arm_level_done.add((level["arm"], metric))
            chosen, others = _choose(candidates, claims)
            if metric == "agg_tok_s_change_pct":
                base_arm = reverse.get(chosen["baseline_arm"] or "")
                base = next((lv for lv in levels if lv["arm"] == base_arm
                             and lv["workload"] == level["workload"]
                             and lv["concurrency"] == level["concurrency"]
                             and lv["temperature"] == level["temperature"]), None)
                value = (None if base is None else
                         metrics.relative_change_pct(level.get("agg_tok_s"), base.get("agg_tok_s")))
            else:
                value = measured_value(level, metric)
            also = "; ".join(f"{o['value']:g} ({o['source']})" for o in others) or None
            arm_level = metric in ARM_LEVEL
            rows.append({
                "label": level["label"], "arm": level["arm"],
                "workload": None if arm_level else level["workload"],
                "concurrency": None if arm_level else level["concurrency"],
                "temperature": None if arm_level else level["temperature"],
                "published_temperature": chosen["temperature"],
                "metric": metric, "measured": value, "published": chosen["value"],
                "unit": chosen["unit"], "published_arm": pub_arm, "source": chosen["source"],
                "also_published": also})
    return pl.DataFrame(rows, schema=OVERLAY_SCHEMA, orient="row")


def published_points(claims: Claims, metric: str, repeats: bool = False) -> pl.DataFrame:
    """The published figures of one metric for the notebook's mapped arms, with the study
    arm each stands for (for figures: article panels and markers). repeats=True gives the
    single runs (article A's repeated runs) instead of values and means. Where the claims
    name a `published_temperature`, only figures at that temperature (or none) are given."""
    reverse = {v: k for k, v in claims.arms.items()}
    pub = load_published().filter((pl.col("metric") == metric)
                                  & pl.col("arm").is_in(list(reverse)))
    if claims.published_temperature is not None:
        pub = pub.filter(pl.col("temperature").is_null()
                         | (pl.col("temperature") == claims.published_temperature))
    pub = pub.filter(pl.col("repeat").is_not_null() if repeats
                     else pl.col("stat").is_in(STATS) & pl.col("repeat").is_null())
    groups: dict[tuple, list[dict]] = {}
    for r in pub.to_dicts():
        key = (r["arm"], r["workload"], r["concurrency"], r["temperature"], r["repeat"])
        groups.setdefault(key, []).append(r)
    chosen = [_choose(rows, claims)[0] for rows in groups.values()]
    out = pl.DataFrame(chosen, schema=pub.schema, orient="row") if chosen else pub.clear()
    return out.with_columns(pl.col("arm").replace_strict(reverse, default=None)
                            .alias("study_arm"))
