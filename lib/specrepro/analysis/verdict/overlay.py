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
- A change (`agg_tok_s_change_pct`) is computed from the measured cells as the article
  defines it, with metrics.py: against the arm the published row names as its baseline
  (mapped to a study arm) at the same level; where that baseline is the row's own arm, the
  change is across the one level that differs (article A: MTP at T=1.0 against MTP at
  T=0.7), read from the article's own figures of that arm (the level whose figure gives the
  printed change), else from the one measured level of the arm that differs in one key.
- Every measured figure carries its spread over repeats (`measured_min`, `measured_max`,
  `runs`; a change: each run against the baseline's mean), and `overlay_tables` shows it
  split per metric, in words, with the article arm's label (published/arms.csv); an
  acceptance table has the level's repeated 4-grams and requests cut at max_tokens beside
  the measured figure, which carries the loop mark where its cells loop; every measured
  figure carries its cells' window and warning marks (tables.flagged, window_health.py).
- Where the article prints two different values for one thing, the one named by the
  notebook's `prefer` (else a table before a sentence) is compared, and the other stays in
  `also_published` with its source, so the reader sees which was chosen; a change names the
  arm each figure is against (the article prints changes of one arm against several).
- Rows for single repeats (article A's four runs) are left out here; figures show them.
- Rows quoting a claim the notebook cannot test (claims.yaml `cannot_test` `sources`,
  `Claims.comparable`) are left out of the overlay and the figures' points alike.
- `points_at` and `published_positions` give figures the published points of a measured
  level by the overlay's own matching rule (`_matches`), so a marker is never drawn at
  another temperature than the table compares.
"""

from __future__ import annotations

import re

import polars as pl

from specrepro import metrics
from specrepro.analysis.finding import tables, text_quality
from specrepro.analysis.finding.cell_key import CELL, LEVEL, key_of
from specrepro.analysis.finding.tables import Table
from specrepro.analysis.verdict.claims import Claims
from specrepro.published import load_arms, load_published

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
    "measured": pl.Float64, "measured_min": pl.Float64, "measured_max": pl.Float64,
    "runs": pl.Int64,
    "published": pl.Float64, "unit": pl.String, "published_arm": pl.String,
    "published_stat": pl.String, "article": pl.String, "baseline": pl.String,
    "published_baseline": pl.String,  # a change: the article's arm it is against (label)
    "source": pl.String, "also_published": pl.String,
}
LEVEL_KEYS = ("concurrency", "temperature")  # what a same-arm change may differ in


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
    """Per arm x workload x concurrency x temperature: the level's keys and its runs (one
    row dict per repeat)."""
    keys = ["label", *CELL]
    return [{**{k: part[k][0] for k in keys}, "runs": part.to_dicts()}
            for _, part in cells.group_by(keys, maintain_order=True)]


def _figures(level: dict, metric: str) -> list[float]:
    """The level's measured figure of `metric`, one per run that has it."""
    return [v for v in (measured_value(r, metric) for r in level["runs"]) if v is not None]


def _mean(vals: list[float]) -> float | None:
    return sum(vals) / len(vals) if vals else None


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


def choose(rows: list[dict], claims: Claims) -> tuple[dict, list[dict]]:
    """The published row to compare against (the one claims.yaml's `prefer` names, else a
    table's, else the first printed), and the other distinct values."""
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
    pub = claims.comparable(load_published()).filter(
        pl.col("stat").is_in(STATS) & pl.col("repeat").is_null()
        & pl.col("metric").is_in(list(COMPARABLE)))
    if metrics_wanted is not None:
        pub = pub.filter(pl.col("metric").is_in(metrics_wanted))
    levels = _levels(cells)
    reverse = {v: k for k, v in claims.arms.items()}
    arm_label = dict(load_arms().select("arm", "label").iter_rows())
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
            chosen, others = choose(candidates, claims)
            if metric.endswith("_change_pct"):
                base = _baseline_level(chosen, level, levels, claims, reverse)
                base_mean = None if base is None else _mean(
                    _figures(base, metric.removesuffix("_change_pct")))
                values = [v for v in (metrics.relative_change_pct(x, base_mean) for x in
                                      _figures(level, metric.removesuffix("_change_pct")))
                          if v is not None]
                against = None if base is None else (
                    base["label"] if base["arm"] != level["arm"] else "the same arm at " + ", ".join(
                        _key_text(k, base[k]) for k in LEVEL_KEYS if base[k] != level[k]))
            else:
                values, against = _figures(level, metric), None
            also = _also(chosen, others, arm_label)
            arm_level = metric in ARM_LEVEL
            rows.append({
                "label": level["label"], "arm": level["arm"],
                "workload": None if arm_level else level["workload"],
                "concurrency": None if arm_level else level["concurrency"],
                "temperature": None if arm_level else level["temperature"],
                "published_temperature": chosen["temperature"],
                "metric": metric, "measured": _mean(values),
                "measured_min": min(values) if values else None,
                "measured_max": max(values) if values else None, "runs": len(values),
                "published": chosen["value"], "unit": chosen["unit"], "published_arm": pub_arm,
                "published_stat": chosen["stat"], "article": chosen["article"],
                "baseline": against, "source": chosen["source"], "also_published": also,
                "published_baseline": arm_label.get(chosen["baseline_arm"])
                if metric.endswith("_change_pct") else None})
    return pl.DataFrame(rows, schema=OVERLAY_SCHEMA, orient="row")


def _also(chosen: dict, others: list[dict], arm_label: dict) -> str | None:
    """The article's other figures for one point, each with its source; a change names the
    arm each is against, and the compared one's (article B's +15.2 % at 8 streams is against
    memory-matched MTP, the compared +0.7 % against the BF16 drafter)."""
    if not others:
        return None

    def against(r: dict) -> str:
        base = r["baseline_arm"]
        return (f" against {arm_label.get(base, base)}"
                if r["metric"].endswith("_change_pct") and base else "")

    text = "; ".join(f"{o['value']:g}{against(o)} ({o['source']})" for o in others)
    return text + (f"; the compared {chosen['value']:g} is{against(chosen)}"
                   if against(chosen) else "")


def _baseline_level(row: dict, level: dict, levels: list[dict], claims: Claims,
                    reverse: dict) -> dict | None:
    """The measured level a published change row is a change against: its baseline arm at
    the same level, or, where the baseline is the row's own arm, the same arm at the one
    level key that differs (`_across`)."""
    base_arm = reverse.get(row["baseline_arm"] or "")
    if base_arm is None:
        return None
    same = [lv for lv in levels if lv["arm"] == base_arm and lv["workload"] == level["workload"]]
    if base_arm != level["arm"]:
        return next((lv for lv in same if all(lv[k] == level[k] for k in LEVEL_KEYS)), None)
    across = _across(row)
    if across is not None:
        key, value = across
        return next((lv for lv in same
                     if all(lv[k] == level[k] for k in LEVEL_KEYS if k != key)
                     and (claims.compared_temperature(lv[key]) if key == "temperature"
                          else lv[key]) == value), None)
    # the article gives no figure to tell which level: the one measured level that differs
    # in one key, where there is exactly one
    others = [lv for lv in same if sum(lv[k] != level[k] for k in LEVEL_KEYS) == 1]
    return others[0] if len(others) == 1 else None


def _across(row: dict) -> tuple[str, float] | None:
    """A same-arm change's baseline level in the article's terms: (key, value) of the level
    key that differs, read from the arm's own published figures of the changed metric (the
    one whose figure, against the row's level's, gives the printed change best)."""
    base_metric = row["metric"].removesuffix("_change_pct")
    own = load_published().filter(
        (pl.col("arm") == row["arm"]) & (pl.col("metric") == base_metric)
        & pl.col("stat").is_in(STATS) & pl.col("repeat").is_null()
        & (pl.col("workload") == row["workload"])).to_dicts()
    at_row = [r["value"] for r in own if all(r[k] == row[k] for k in LEVEL_KEYS)]
    best, best_err = None, None
    for r in own:
        differ = [k for k in LEVEL_KEYS if r[k] != row[k]]
        if len(differ) != 1 or r[differ[0]] is None:
            continue
        err = (abs(metrics.relative_change_pct(at_row[0], r["value"]) - row["value"])
               if at_row and r["value"] else 0.0)
        if best_err is None or err < best_err:
            best, best_err = (differ[0], r[differ[0]]), err
    return best


def published_points(claims: Claims, metric: str, repeats: bool = False) -> pl.DataFrame:
    """The published figures of one metric for the notebook's mapped arms, with the study
    arm each stands for (for figures: article panels and markers). repeats=True gives the
    single runs (article A's repeated runs) instead of values and means. Where the claims
    name a `published_temperature`, only figures at that temperature (or none) are given."""
    reverse = {v: k for k, v in claims.arms.items()}
    pub = claims.comparable(load_published()).filter((pl.col("metric") == metric)
                                                     & pl.col("arm").is_in(list(reverse)))
    if claims.published_temperature is not None:
        pub = pub.filter(pl.col("temperature").is_null()
                         | (pl.col("temperature") == claims.published_temperature))
    pub = pub.filter(pl.col("repeat").is_not_null() if repeats
                     else pl.col("stat").is_in(STATS) & pl.col("repeat").is_null())
    groups: dict[tuple, list[dict]] = {}
    for r in pub.to_dicts():
        groups.setdefault(key_of(r), []).append(r)  # a published row's arm, level, repeat
    chosen = [choose(rows, claims)[0] for rows in groups.values()]
    out = pl.DataFrame(chosen, schema=pub.schema, orient="row") if chosen else pub.clear()
    return out.with_columns(pl.col("arm").replace_strict(reverse, default=None)
                            .alias("study_arm"))


def points_at(points: pl.DataFrame, claims: Claims, arm: str, workload: str | None,
              concurrency: int | None, temperature: float | None) -> pl.DataFrame:
    """The published points (`published_points`) a measured level of a study arm is compared
    with, by the overlay's own rule: same workload and concurrency, and the compared
    temperature (the level's own unless claims.yaml sets published_temperature)."""
    level = {"workload": workload, "concurrency": concurrency, "temperature": temperature}
    rows = [r for r in points.filter(pl.col("study_arm") == arm).to_dicts()
            if _matches(r, level, claims)]
    return pl.DataFrame(rows, schema=points.schema, orient="row") if rows else points.clear()


POSITIONS_SCHEMA = {"study_arm": pl.String, "published_arm": pl.String, "label": pl.String,
                    "workload": pl.String, "own": pl.Boolean, "position": pl.Int64,
                    "value": pl.Float64, "source": pl.String}


def published_positions(claims: Claims, workload: str | None, concurrency: int | None,
                        temperature: float | None) -> pl.DataFrame:
    """The article's acceptance by draft position (%) to draw beside a measured level, per
    mapped study arm: its published arm's own figures at the compared level (own=True);
    where that arm has none at all, those of the article's other arm of the same method and
    draft count (own=False; article A gives MTP's 75/57/44 % from production traffic, not
    from the probe), with that arm's label and workload so a figure says which it is."""
    arms = load_arms()
    info = {r["arm"]: r for r in arms.to_dicts()}
    pos = load_published().filter(pl.col("metric").str.starts_with("acceptance_rate_pos")
                                  & pl.col("stat").is_in(STATS) & pl.col("repeat").is_null())
    level = {"workload": workload, "concurrency": concurrency, "temperature": temperature}
    rows = []
    for study_arm, pub_arm in claims.arms.items():
        mine = pos.filter(pl.col("arm") == pub_arm).to_dicts()
        own = bool(mine)
        if own:
            mine = [r for r in mine if _matches(r, level, claims)]
        else:
            me = info[pub_arm]
            twins = [a for a, r in info.items() if a != pub_arm and r["method"] == me["method"]
                     and r["drafts"] == me["drafts"] and me["article"] in r["article"].split("|")]
            mine = pos.filter(pl.col("arm").is_in(twins)).to_dicts()
        for r in mine:
            rows.append({"study_arm": study_arm, "published_arm": r["arm"],
                         "label": info[r["arm"]]["label"], "workload": r["workload"],
                         "own": own, "position": int(_POS.match(r["metric"]).group(1)),
                         "value": r["value"], "source": r["source"]})
    return pl.DataFrame(rows, schema=POSITIONS_SCHEMA, orient="row").unique(
        ["study_arm", "published_arm", "position"], keep="first", maintain_order=True)


# ------------------------------------------------------------------ reader tables


def _key_text(key: str, value) -> str:
    return tables.streams(value) if key == "concurrency" else f"T={value:g}"


def short_source(source: str, stat: str | None = None, width: int = 48) -> str:
    """Where the article prints a figure, short: the quoted phrase, or the table and row."""
    kind, _, rest = source.partition(": ")

    def clip(text: str) -> str:
        return text if len(text) <= width else text[: width - 1].rstrip() + "\u2026"

    if kind == "table":
        parts = [x.strip() for x in rest.split("|")]
        row = next((x[5:] for x in parts if x.startswith("row: ")), None)
        text = f"table \u201c{clip(parts[0])}\u201d" + (f", row \u201c{clip(row)}\u201d"
                                                          if row else "")
    elif kind == "text":
        text = f"\u201c{clip(rest)}\u201d"
    else:
        text = clip(source)
    return ("about: " + text) if stat == "approx" else text


def _family(metric: str) -> str:
    return "acceptance_rate_pos" if _POS.match(metric) else metric


def overlay_tables(cells: pl.DataFrame, claims: Claims,
                   metrics_wanted: list[str] | None = None) -> list[Table]:
    """The overlay as one small table per metric (per-position rates together): the arm's
    label, the level where it varies, the article's arm (published/arms.csv label), figure
    and source, the measured mean (min-max over the runs), runs, and measured / article."""
    wanted = None if metrics_wanted is None else [
        m for m in COMPARABLE if _family(m) in {_family(w) for w in metrics_wanted}]
    ov = overlay(cells, claims, wanted)
    arm_label = dict(load_arms().select("arm", "label").iter_rows())
    order = metrics_wanted or ov["metric"].to_list()
    out = []
    for fam in dict.fromkeys(_family(m) for m in order):
        part = ov.filter(pl.col("metric").map_elements(_family, return_dtype=pl.String) == fam)
        if not part.height:
            continue
        if fam == "acceptance_rate_pos":
            part = part.with_columns(pl.col("metric").str.extract(r"(\d+)$").cast(pl.Int64)
                                     .alias("position"))
        out.append(_overlay_table(part, fam, arm_label, _cells_at(cells),
                                  fam in text_quality.ACCEPTANCE_METRICS))
    return out


def _cells_at(cells: pl.DataFrame) -> dict[tuple, pl.DataFrame]:
    """Each measured level's cells (label, workload, concurrency, temperature), whose marks
    a row shows (tables.flagged) and, for an acceptance row, whose text columns."""
    return {tuple(k): part for k, part in
            tables.text_columns(cells).group_by(["label", *LEVEL], maintain_order=True)}


def _overlay_table(part: pl.DataFrame, fam: str, arm_label: dict,
                   cells_at: dict[tuple, pl.DataFrame] | None = None,
                   accept: bool = False) -> Table:
    shown, fixed = tables.varying_levels(part)
    pt = part["published_temperature"].unique().to_list()
    cross_t = part.filter(pl.col("published_temperature").is_not_null()
                          & (pl.col("published_temperature") != pl.col("temperature")))
    t_column = cross_t.height and len(pt) > 1
    rows, notes = [], []
    for r in part.to_dicts():
        if r["measured"] is None:  # nothing here to set beside it: say so under the table
            against = (f" against {r['published_baseline']}" if r["published_baseline"]
                       else "")
            notes.append(f"{r['label']}: the article's {r['published']:g}{against} "
                         f"({arm_label.get(r['published_arm'], r['published_arm'])}, "
                         f"{short_source(r['source'], r['published_stat'])}) has no measured "
                         "counterpart in this run" + (" (its baseline arm is not in this study)"
                                                      if fam.endswith("_change_pct") else ""))
            continue
        row = {"arm": r["label"]}
        row.update({tables.LEVEL_COLUMNS[k]: (f"{r[k]:g}" if k == "temperature" else r[k])
                    for k in shown})
        if t_column:
            row["article T"] = (None if r["published_temperature"] is None
                                else f"{r['published_temperature']:g}")
        if fam == "acceptance_rate_pos":
            row["position"] = r["position"]
        if fam.endswith("_change_pct"):
            row["against"] = r["baseline"]
        row["article arm"] = arm_label.get(r["published_arm"], r["published_arm"])
        row["article"] = r["published"]
        row["source"] = f"{r['article']}: {short_source(r['source'], r['published_stat'])}"
        row["measured"] = (None if r["measured"] is None else
                           {"mean": r["measured"], "min": r["measured_min"],
                            "max": r["measured_max"]})
        at = (cells_at or {}).get(key_of(r, ["label", *LEVEL]))
        at = at if at is not None else pl.DataFrame(schema=tables.CELL_TEXT_SCHEMA)
        # its cells' marks; an acceptance row the loop mark and the text columns beside it
        row["measured"] = tables.flagged(row["measured"], at, accept)
        if accept:
            row.update({tables.name(t): tables.spread_of(at[t].to_list(), tables.scale(t),
                                                         with_n=False) for t in tables.TEXT})
        row["runs"] = r["runs"]
        row["measured / article"] = (None if r["measured"] is None or not r["published"]
                                     else r["measured"] / r["published"])
        rows.append(row)
        if r["also_published"]:
            where = ", ".join(str(_level_text(r, k)) for k in tables.LEVEL_COLUMNS
                              if r[k] is not None)
            notes.append(f"{r['label']}{' at ' + where if where else ''}: the article also "
                         f"prints {r['also_published']}")
    unit = part["unit"][0]
    cap = (f"{tables.name(fam, unit)}: the article's figure beside the measured mean "
           "(min-max over the runs)")
    if cross_t.height and not t_column:
        cap += f"; the article's figures at T={pt[0]:g}"
    if accept and rows:
        cells = pl.concat([c.select(tables.TEXT) for c in cells_at.values()]) if cells_at \
            else None
        notes = [*(tables.text_notes(cells) if cells is not None else ()), *notes]
    if rows and cells_at:  # the marks of the rows' cells, where one is marked
        shown_at = [cells_at[k] for k in dict.fromkeys(key_of(r, ["label", *LEVEL])
                                                       for r in part.to_dicts()
                                                       if r["measured"] is not None)
                    if k in cells_at]
        notes += tables.health_notes(pl.concat(shown_at, how="diagonal_relaxed")) \
            if shown_at else ()
    # no row measured: an empty table that still carries its caption and notes
    frame = pl.DataFrame(rows) if rows else pl.DataFrame(schema=EMPTY_TABLE)
    return Table(frame, tables.with_fixed(cap, fixed), tuple(notes))


EMPTY_TABLE = {"arm": pl.String, "article arm": pl.String, "article": pl.Float64,
               "source": pl.String, "measured": pl.Float64, "runs": pl.Int64,
               "measured / article": pl.Float64}


def _level_text(row: dict, key: str) -> str:
    return _key_text(key, row[key]) if key in LEVEL_KEYS else str(row[key])


def published_ranges(claims: Claims, metric: str) -> pl.DataFrame:
    """The article's printed ranges of one metric (stat min and max of one arm and level,
    e.g. "acceptance from 43% down to 16%" over four runs), one row per range, with the
    study arm it stands for."""
    reverse = {v: k for k, v in claims.arms.items()}
    pub = claims.comparable(load_published()).filter(
        (pl.col("metric") == metric) & pl.col("arm").is_in(list(reverse))
        & pl.col("stat").is_in(["min", "max"]))
    wide = (pub.group_by(CELL, maintain_order=True)
            .agg(pl.col("value").filter(pl.col("stat") == "min").first().alias("min"),
                 pl.col("value").filter(pl.col("stat") == "max").first().alias("max"),
                 pl.col("source").first()))
    return wide.filter(pl.col("min").is_not_null() & pl.col("max").is_not_null()).with_columns(
        pl.col("arm").replace_strict(reverse, default=None).alias("study_arm"))
