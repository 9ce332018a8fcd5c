"""The step-cost model's tables for readers: floors, speeds side by side, crossovers, misses.

Design:
- Every table is a polars frame built from the two checks (step_cost_check.check: the
  stand-in's cells; step_cost_articles.check_articles: the articles' rows) and the records;
  the notebook shows them (analysis/render/show.py's `show_table`) and scripts/step_cost.py prints
  them as Markdown for docs/bench/. No number is typed here.
- `floor_table`: at one stream, each arm's bytes a step with its drafter's passes, its floor
  against the rated and the measured bandwidth, and its measured step as a share of each
  (the articles' 71-78 % are against rated bandwidth; the substrate lines
  said 83-85 % against measured).
- `side_by_side`: every covered published speed: the article's number, the model's figure
  for the article's box, the stand-in's measurement at the same engine, drafter kind, drafts
  and streams, of its bf16 target (`STANDIN_TARGET`: notebook 03's FP8 and NVFP4 arms run
  the same drafter at the same levels, and averaging them in would mix three targets' steps),
  and the model's figure for that card.
- `crossovers`: where speculation stops paying, measured (the articles', the stand-in's
  cells) and modelled, as streams and as tokens a step over the card's ridge.
- `largest_misses`: the article rows the model misses most, with the step it priced, the
  step the article's own numbers imply, and the gap a step and a request.
"""

from __future__ import annotations

import polars as pl

from specrepro.analysis.step_cost import model as sc
from specrepro.analysis.step_cost.articles import context_tokens, drafts_at
from specrepro.analysis.step_cost.check import MIN_BUSY, Fits
from specrepro.analysis.step_cost.data import card, cards, model, models
from specrepro.published import load_arms, load_published

FAMILY = {"dflash2": "block", "mtp": "chain", "none": None}  # published method -> drafter kind
STANDIN_TARGET = "standin-target"  # the stand-in's cells a published speed is set beside


def cards_table() -> pl.DataFrame:
    """Each card: rated and measured bandwidth, peak math, power cap, memory, sources."""
    rows = []
    for cid, c in cards().items():
        peaks = ", ".join(f"{p} {v.value:g}" for p, v in c.peak_tflop_s.items() if v.value)
        meas = ", ".join(f"{p} {v.value:g}" for p, v in c.measured_peak_tflop_s.items() if v.value)
        rows.append({"card": cid, "label": c.label,
                     "rated GB/s": c.rated_bandwidth_gb_s.value,
                     "measured GB/s": c.measured_bandwidth_gb_s.value,
                     "peak TFLOP/s (dense)": peaks or None, "measured TFLOP/s": meas or None,
                     "power cap W": c.power_cap_w.value, "memory GB": c.memory_gb.value,
                     "sources": " | ".join(f"{k}: {v.source}" for k, v in (
                         ("rated", c.rated_bandwidth_gb_s), ("measured", c.measured_bandwidth_gb_s),
                         ("power", c.power_cap_w)))})
    return pl.DataFrame(rows)


def models_table() -> pl.DataFrame:
    rows = []
    for name, m in models().items():
        rows.append({"record": name, "label": m.label, "role": m.role, "drafts": m.drafts,
                     "GB a pass": m.weights.n_bytes / 1e9,
                     "GFLOP a token": sum(v.value for v in m.gflop_per_token.values()),
                     "precision": "/".join(m.gflop_per_token), "layers": m.layers.value,
                     "KV bytes a token": m.kv_bytes_per_token.value,
                     "weights source": m.weights.source})
    return pl.DataFrame(rows)


def fits_table(fits: Fits) -> pl.DataFrame:
    return pl.DataFrame([{"card": c, "engine": e, "fixed ms": o.fixed_ms,
                          "speculative ms": o.speculative_ms, "fixed: fitted on": o.fixed_source,
                          "speculative: fitted on": o.speculative_source}
                         for (c, e), o in sorted(fits.overheads.items())],
                        schema={"card": pl.String, "engine": pl.String, "fixed ms": pl.Float64,
                                "speculative ms": pl.Float64, "fixed: fitted on": pl.String,
                                "speculative: fitted on": pl.String})


def _floor_row(where: str, card_id: str, target: str, drafter: str | None, k: int,
               step_ms: float, source: str) -> dict:
    c = card(card_id)
    parts = sc.passes(model(target), model(drafter) if drafter else None, k, 1, 0.0)
    weights = sum(p.weight_bytes for p in parts)
    f = sc.floor_ms(c, weights)
    return {"where": where, "card": card_id, "drafter": drafter or "none", "drafts": k,
            "GB a step": weights / 1e9, "floor ms (rated)": f["rated"],
            "floor ms (measured)": f["measured"], "step ms": step_ms,
            "% of rated floor's speed": 100 * f["rated"] / step_ms if f["rated"] else None,
            "% of measured floor's speed": 100 * f["measured"] / step_ms if f["measured"] else None,
            "source": source}


def floor_table(standin: pl.DataFrame, articles: pl.DataFrame) -> pl.DataFrame:
    """At one stream: each measured arm's bytes a step (the target's weights and every drafter
    pass), its floor at the rated and the measured bandwidth, and its step as a share of each.
    The KV read is left out (a few hundred tokens at one stream: under 0.1 %)."""
    rows = []
    one = standin.filter((pl.col("streams") == 1) & (pl.col("busy") >= MIN_BUSY))
    for (card_id, engine, arm, drafter, k), g in one.group_by(
            "card", "engine", "arm", "drafter", "drafts", maintain_order=True):
        target = g["target"][0]
        rows.append(_floor_row(f"stand-in, {engine}, {arm}", card_id, target, drafter, k,
                               float(g["step_ms"].mean()),
                               f"mean of {g.height} stored cell(s): {g['source'][0]}"))
    arts = articles.filter(pl.col("covered") & (pl.col("streams") == 1)
                           & (pl.col("metric") == "agg_tok_s"))
    for r in arts.unique(["arm"], keep="first", maintain_order=True).iter_rows(named=True):
        step = 1e3 * r["tokens_per_step"] / r["published"]
        rows.append(_floor_row(f"article {r['article']}, {r['label']}", r["card"], r["target"],
                               r["drafter"], r["drafts"], step,
                               f"{r['published']:g} tok/s at {r['tokens_per_step']:g} tokens a step "
                               f"({r['source'][:50]})"))
    return pl.DataFrame(rows)


def _standin_match(standin: pl.DataFrame, engine: str, kind: str | None, k: int,
                   streams: int) -> pl.DataFrame:
    drafter_kind = pl.col("drafter").map_elements(
        lambda d: models()[d].drafts if d else None, return_dtype=pl.String)
    got = standin.with_columns(drafter_kind.alias("kind")).filter(
        (pl.col("engine") == engine) & (pl.col("streams") == streams)
        & (pl.col("target") == STANDIN_TARGET)
        & (pl.col("kind").eq_missing(kind)) & (pl.col("drafts") == (k if kind else 0)))
    return got


def side_by_side(articles: pl.DataFrame, standin: pl.DataFrame) -> pl.DataFrame:
    """Each covered published speed (tok/s): the article's number, the model on the article's
    box, the stand-in's measurement (same engine, drafter kind, drafts and streams; the
    reference card first) and the model on that card."""
    arms = {r["arm"]: r for r in load_arms().iter_rows(named=True)}
    rows = []
    for r in articles.filter(pl.col("covered") & (pl.col("metric") == "agg_tok_s")).iter_rows(named=True):
        kind = FAMILY.get(arms[r["arm"]]["method"])
        m = _standin_match(standin, r["engine"], kind, r["drafts"], r["streams"])
        best = None
        for card_id in ("h200", "h100"):
            g = m.filter(pl.col("card") == card_id)
            if g.height:
                best = (card_id, g)
                break
        row = {"article": r["article"], "arm": r["label"], "workload": r["workload"],
               "streams": r["streams"], "article tok/s": r["published"],
               "model, article's box": r["predicted"], "model error %": r["error_pct"],
               "stand-in tok/s": None, "model, stand-in's card": None, "stand-in error %": None,
               "stand-in cell": "not measured on the stand-in at this engine, drafter, drafts "
                                "and level"}
        if best is not None:
            card_id, g = best
            meas, pred = float(g["tok_s"].mean()), float(g["predicted_tok_s"].mean())
            row.update({"stand-in tok/s": meas, "model, stand-in's card": pred,
                        "stand-in error %": 100 * (pred / meas - 1),
                        "stand-in cell": f"{card_id}, {g['engine'][0]}, {g['arm'][0]} "
                                         f"({g.height} cell{'s' if g.height > 1 else ''})"})
        rows.append(row)
    return pl.DataFrame(rows, infer_schema_length=None)


def _measured_crossing(standin: pl.DataFrame, card_id: str, engine: str, arm: str,
                       base: str) -> tuple[float | None, list[int]]:
    a = standin.filter((pl.col("card") == card_id) & (pl.col("engine") == engine)
                       & (pl.col("arm") == arm)).group_by("streams").agg(pl.col("tok_s").mean())
    b = standin.filter((pl.col("card") == card_id) & (pl.col("engine") == engine)
                       & (pl.col("arm") == base)).group_by("streams").agg(pl.col("tok_s").mean())
    j = a.join(b, on="streams", suffix="_b").sort("streams")
    if j.height < 3:  # an A/A twin's two levels: a crossing between them is a guess
        return None, j["streams"].to_list()
    return (sc.crossing(j["streams"].to_list(), (j["tok_s"] / j["tok_s_b"]).to_list()),
            j["streams"].to_list())


def crossovers(standin: pl.DataFrame, fits: Fits) -> pl.DataFrame:
    """Where speculation stops paying, measured and modelled, in streams and in tokens a step
    verified over the card's ridge (the target's math time equals its weight read there)."""
    cells = standin
    rows = []

    def add(where, card_id, target, a: sc.Arm, b: sc.Arm, engine, ctx, measured, how):
        c, t = card(card_id), model(target)
        pred = sc.crossover(c, t, a, b, fits.of(card_id, engine), ctx)
        ridge = sc.ridge_tokens(c, t)
        per = 1 + a.k
        rows.append({"where": where, "card": card_id, "measured streams": measured,
                     "how measured": how, "model streams": pred,
                     "tokens a step at the measured crossing":
                         measured * per if measured is not None else None,
                     "model's tokens a step": pred * per if pred is not None else None,
                     "ridge (tokens a step)": ridge,
                     "measured / ridge": measured * per / ridge if measured is not None else None,
                     "model / ridge": pred * per / ridge if pred is not None else None})

    # every stand-in arm drafting a fixed k at every level, against the plain arm of its card,
    # engine and target measured at the most levels (the model's plain side is that target's)
    for (card_id, engine), g in cells.group_by("card", "engine", maintain_order=True):
        plain = (g.filter(pl.col("drafter").is_null()).group_by("arm", "target")
                 .agg(pl.col("streams").n_unique().alias("n")).sort("n", descending=True))
        if not plain.height:
            continue
        for (arm,), a in g.filter(pl.col("drafter").is_not_null()).group_by(
                ["arm"], maintain_order=True):
            if a["drafts"].n_unique() != 1 or a["drafts"][0] == 0:
                continue  # a schedule: its k changes with the level
            same = plain.filter(pl.col("target") == a["target"][0])
            if same.height:
                base = same["arm"][0]
                measured, levels = _measured_crossing(cells, card_id, engine, arm, base)
                how = f"cells at {levels} streams" + (
                    "" if measured is not None else ": fewer than 3 levels in common"
                    if len(levels) < 3 else ": never crossed there")
            else:  # notebook 03's FP8 and NVFP4 targets: measured only with speculation
                base, measured = f"no speculation on {a['target'][0]}", None
                how = "not measured: no plain arm of this target"
            add(f"stand-in, {engine}: {arm} against {base}", card_id, a["target"][0],
                sc.Arm(model(a["drafter"][0]), int(a["drafts"][0]),
                       float(a["tokens_per_step"].mean())), sc.Arm(), engine,
                float(a["context_tokens"].mean()), measured, how)
    pub = load_published()
    arms = {r["arm"]: r for r in load_arms().iter_rows(named=True)}
    cross = pub.filter(pl.col("metric") == "crossing_concurrency")
    ctx_b, _ = context_tokens("B", "essays")
    for r in cross.iter_rows(named=True):  # B: static 7 against plain decoding
        a = arms[r["arm"]]
        add(f"article B: {a['label']} against no speculation", "rtx_pro_6000_maxq",
            "qwen27b-nvfp4-b", sc.Arm(model("dflash2-b"), drafts_at(a, 32), 3.11), sc.Arm(),
            "vllm", ctx_b, r["value"], f"{r['source'][:60]} (acceptance 3.11: the same drafter "
            "at 7 drafts, essays, 8 streams)")
    # A: its 7-draft block against its MTP head, from the published tok/s at each level
    k7 = pub.filter((pl.col("arm") == "dflash2_k7_0280") & (pl.col("metric") == "agg_tok_s")
                    & (pl.col("temperature") == 0.7)).group_by("concurrency").agg(pl.col("value").mean())
    mtp = pub.filter((pl.col("arm") == "mtp3_0280") & (pl.col("metric") == "agg_tok_s")
                     & (pl.col("temperature") == 0.7)).group_by("concurrency").agg(pl.col("value").mean())
    j = k7.join(mtp, on="concurrency", suffix="_mtp").sort("concurrency")
    measured = sc.crossing(j["concurrency"].to_list(), (j["value"] / j["value_mtp"]).to_list())
    ctx_a, _ = context_tokens("A", "code_probe")
    add("article A: DFlash2, 7 drafts, against its MTP head", "gb10", "qwen27b-nvfp4-a",
        sc.Arm(model("dflash2-a"), 7, 3.16), sc.Arm(model("mtp-head-a"), 3, 2.55), "vllm",
        ctx_a, measured, f"published tok/s at {j['concurrency'].to_list()} streams "
        "(acceptance 3.16 and 2.55 at one stream)")
    return pl.DataFrame(rows, infer_schema_length=None)


def largest_misses(articles: pl.DataFrame, n: int = 5) -> pl.DataFrame:
    """The n covered article rows the model misses most (|error|), each with the step the
    model priced, the step the article's figure implies at its tokens a step, and the gap."""
    rows = articles.filter(pl.col("covered")).with_columns(
        pl.col("error_pct").abs().alias("abs_error")).sort("abs_error", descending=True)
    out = []
    for r in rows.head(n).iter_rows(named=True):
        implied = (1e3 * r["running"] * r["tokens_per_step"] / r["published"]
                   if r["metric"] == "agg_tok_s" else r["published"])
        out.append({"article": r["article"], "arm": r["label"], "workload": r["workload"],
                    "streams": r["streams"], "metric": r["metric"], "published": r["published"],
                    "predicted": r["predicted"], "error %": r["error_pct"],
                    "model step ms": r["predicted_step_ms"], "implied step ms": implied,
                    "gap ms a step": implied - r["predicted_step_ms"],
                    "gap ms a request": (implied - r["predicted_step_ms"]) / r["running"],
                    "bound": r["bound"], "tokens a step / ridge":
                        r["verified_tokens"] / r["ridge_tokens"], "note": r["note"]})
    return pl.DataFrame(out, infer_schema_length=None)


def _kind(drafter: str | None) -> str:
    if not drafter:
        return "no speculation"
    return "block drafter" if models()[drafter].drafts == "block" else "MTP head / chain drafter"


def roofline_points(standin: pl.DataFrame, articles: pl.DataFrame,
                    own: pl.DataFrame | None = None, own_name: str = "this suite") -> pl.DataFrame:
    """Each measured or published step as a point of its card's roofline: the step's
    arithmetic intensity (the model's FLOPs over its bytes, FLOP/B) and the math rate it
    reached (those FLOPs over the measured or published step, TFLOP/s)."""
    rows = []
    for who, df in (("stand-in", standin), (own_name, own)):
        if df is None or not df.height:
            continue
        for r in df.iter_rows(named=True):
            rows.append({"card": r["card"], "series": f"{who}, {r['engine']}: {_kind(r['drafter'] if r['drafts'] else None)}",
                         "kind": "measured", "intensity": r["step_flops"] / r["step_bytes"],
                         "tflop_s": r["step_flops"] / r["step_ms"] * 1e-9,
                         "tokens": r["verified_tokens"]})
    for r in articles.filter(pl.col("covered") & (pl.col("metric") == "agg_tok_s")).iter_rows(named=True):
        step_ms = 1e3 * r["running"] * r["tokens_per_step"] / r["published"]
        rows.append({"card": r["card"], "series": f"article {r['article']}: {_kind(r['drafter'])}",
                     "kind": "published", "intensity": r["step_flops"] / r["step_bytes"],
                     "tflop_s": r["step_flops"] / step_ms * 1e-9, "tokens": r["verified_tokens"]})
    return pl.DataFrame(rows, schema={"card": pl.String, "series": pl.String, "kind": pl.String,
                                      "intensity": pl.Float64, "tflop_s": pl.Float64,
                                      "tokens": pl.Int64})


def markdown(df: pl.DataFrame, digits: int = 1) -> str:
    """A frame as a Markdown table (numbers rounded to `digits`), for docs/bench/."""
    def cell(v) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return f"{v:,.{digits}f}"
        return str(v).replace("|", "/")

    head = "| " + " | ".join(df.columns) + " |"
    rule = "| " + " | ".join("---:" if df.schema[c].is_numeric() else "---"
                             for c in df.columns) + " |"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.iter_rows()]
    return "\n".join([head, rule, *body])
