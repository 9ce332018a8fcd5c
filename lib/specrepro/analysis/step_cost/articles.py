"""The step-cost model fed each article's own box, model bytes and acceptance, against the
article's published speeds (the other way of checking it).

Design:
- Every published speed figure (lib/specrepro/published: `agg_tok_s` and `step_ms`, stats
  value / mean / approx; an article's own predictions and ranges are not measurements) is a
  row. Its arm (arms.csv) gives the card (`hardware`), the records (step_cost/models.yaml
  `published:`: target by precision, drafter by method and precision), the engine and the
  drafts, a schedule's drafts at the row's level.
- Tokens a step are the article's own: the arm's acceptance length at the row's workload,
  temperature and level, else at the nearest level that ran the same drafts, else 1 + its
  per-position rates, else another arm of the same article, method, drafter precision and
  drafts (nearest level), else step_cost/check.yaml's `acceptance_at_k`. Each row says which.
  A row with none is listed as not covered, with why; so is a row on a card without a record.
- Nothing is fitted on an article's numbers: the engine's overheads are the stand-in's
  (`step_cost_check.fit` on the reference card, carried), the bandwidth the card's rated one
  (neither article measured a GEMM). So a miss is what the stand-in's engines and the
  articles' byte counts do not explain on that box, and its size is the finding (as article
  A's own estimate missed by "the whole cost of the draft pass").
- Request slots fewer than the streams (step_cost/check.yaml) queue the rest; context a
  request (the KV read) is the article's where it gives one, else left out, said per row.
"""

from __future__ import annotations

import polars as pl

from specrepro.analysis.step_cost import model as sc
from specrepro.analysis.step_cost.cells import check_config
from specrepro.analysis.step_cost.check import Fits, fit
from specrepro.analysis.step_cost.data import card, card_for_hardware, model, published_records
from specrepro.published import load_arms, load_published

SPEED_METRICS = ("agg_tok_s", "step_ms")
MEASURED_STATS = ("value", "mean", "approx")
METHODS = {"dflash2": "block", "mtp": "chain"}  # the published methods a drafter record runs


def parse_schedule(text: str | None) -> list[tuple[int, int, int]]:
    """arms.csv's '7@1-12,3@13-32' as [(1, 12, 7), (13, 32, 3)]."""
    out = []
    for part in (text or "").split(","):
        if part.strip():
            k, rng = part.split("@")
            lo, hi = rng.split("-")
            out.append((int(lo), int(hi), int(k)))
    return out


def drafts_at(arm: dict, streams: int | None) -> int:
    """Drafts a request at `streams`: the schedule's tier covering it, else the arm's drafts
    (a level below the first stated tier, as in 'zero drafts above 24', runs the base)."""
    k = arm["drafts"] or 0
    for lo, hi, kk in parse_schedule(arm["schedule"]):
        if streams is not None and lo <= streams <= hi:
            return kk
    return k


def _speed_rows(published: pl.DataFrame) -> pl.DataFrame:
    rows = published.filter(pl.col("metric").is_in(SPEED_METRICS)
                            & pl.col("stat").is_in(MEASURED_STATS))
    # one figure printed twice (a table and a sentence) is one row: the first source kept
    return rows.unique(["arm", "workload", "concurrency", "temperature", "metric", "value"],
                       keep="first", maintain_order=True)


def _acceptance(pub: pl.DataFrame, arms: dict, row: dict, k: int) -> tuple[float | None, str]:
    """(tokens a step, where it comes from) for a published row at k drafts."""
    if k == 0:
        return 1.0, "plain decoding: 1 token a step"
    same = pub.filter(pl.col("workload").eq_missing(row["workload"])
                      & pl.col("temperature").eq_missing(row["temperature"])
                      & pl.col("stat").is_in(MEASURED_STATS))
    al = same.filter(pl.col("metric") == "acceptance_length")

    def runs_k(r: dict) -> bool:
        """The row's arm drafted k at its level; a row without a level counts only for an
        arm with one fixed draft count (a schedule's tiers would be ambiguous)."""
        a = arms[r["arm"]]
        if r["concurrency"] is None:
            return not a["schedule"] and (a["drafts"] or 0) == k
        return drafts_at(a, r["concurrency"]) == k

    def nearest(cands: pl.DataFrame, what: str) -> tuple[float | None, str]:
        ok = [r for r in cands.iter_rows(named=True) if runs_k(r)]
        if not ok:
            return None, ""
        best = min(ok, key=lambda r: abs((r["concurrency"] or 1e9) - (row["concurrency"] or 1)))
        at = f"at {best['concurrency']} streams" if best["concurrency"] else "(no level given)"
        return best["value"], f"{what}: {best['value']:g} {at} ({best['source'][:60]})"

    got = nearest(al.filter(pl.col("arm") == row["arm"]), "its acceptance length")
    if got[0] is not None:
        return got
    rates = same.filter((pl.col("arm") == row["arm"])
                        & pl.col("metric").str.starts_with("acceptance_rate_pos"))
    if rates.height >= k:
        vals = [r["value"] / 100 for r in rates.sort("metric").iter_rows(named=True)][:k]
        return sc.tokens_per_step(per_position=vals, k=k), \
            f"1 + its per-position rates ({', '.join(f'{v:.0%}' for v in vals)})"
    me = arms[row["arm"]]
    kin = [a for a, x in arms.items() if a != row["arm"] and x["article"] == me["article"]
           and x["method"] == me["method"] and x["drafter_precision"] == me["drafter_precision"]]
    got = nearest(al.filter(pl.col("arm").is_in(kin)), "a sibling arm's acceptance length")
    if got[0] is not None:
        return got
    for entry in check_config()["acceptance_at_k"]:
        if entry.article == me["article"] and entry.method == me["method"] and entry.drafts == k:
            src = pub.filter((pl.col("arm") == entry.arm) & (pl.col("metric") == "acceptance_length"))
            if src.height:
                return src["value"][0], f"{src['value'][0]:g} at {k} drafts ({entry.source[:80]})"
    at_t = f" at T={row['temperature']:g}" if row.get("temperature") is not None else ""
    return None, (f"no published acceptance for {row['arm']} at {k} drafts on "
                  f"{row['workload']}{at_t}")


def context_tokens(article: str, workload: str | None) -> tuple[float, str]:
    """(tokens a request holds, where that comes from) for an article's workload: 0 where
    unpublished, and the KV read then left out, said so."""
    for c in check_config()["context_tokens"]:
        if c.article == article and c.workload == workload:
            return (c.value or 0.0), (c.source if c.value else f"KV not priced: {c.source}")
    return 0.0, f"KV not priced: no context length for article {article}'s {workload}"


def _slots(arm: str) -> tuple[int | None, str]:
    for s in check_config()["request_slots"]:
        if s.arm == arm:
            return int(s.value), s.source
    return None, ""


def predict_row(row: dict, arms: dict, pub: pl.DataFrame, fits: Fits) -> dict:
    """The model's figure for one published speed row, or why it does not cover it."""
    arm = arms[row["arm"]]
    base = {"article": row["article"], "arm": row["arm"], "label": arm["label"],
            "workload": row["workload"], "streams": row["concurrency"],
            "temperature": row["temperature"], "metric": row["metric"],
            "published": row["value"], "source": row["source"], "engine": arm["engine"]}
    card_id = card_for_hardware(arm["hardware"])
    target_id, drafter_id = published_records(arm["article"], arm["target_precision"],
                                              arm["method"], arm["drafter_precision"])
    k = drafts_at(arm, row["concurrency"]) if arm["method"] != "none" else 0
    why = None
    if card_id is None:
        why = f"no card record for {arm['hardware']!r}"
    elif row["concurrency"] is None:
        why = "no level given"
    elif target_id is None or (k and drafter_id is None):
        why = f"no model record for {arm['method']} with a {arm['target_precision']} target"
    elif arm["engine"] is None:
        why = "no engine named"
    tokens, tok_src = (None, "")
    if why is None:
        tokens, tok_src = _acceptance(pub, arms, row, k)
        if tokens is None:
            why = tok_src
    if why is not None:
        return {**base, "covered": False, "why": why}
    c = card(card_id)
    over = fits.of(card_id, arm["engine"])
    ctx, ctx_src = context_tokens(arm["article"], row["workload"])
    slots, slots_src = _slots(row["arm"])
    run = sc.running(row["concurrency"], slots)
    target = model(target_id)
    drafter = model(drafter_id) if k else None
    st = sc.step(c, sc.passes(target, drafter, k, run, ctx), over)
    pred_tok = sc.tok_s(run, tokens, st.total_ms)
    pred = pred_tok if row["metric"] == "agg_tok_s" else st.total_ms
    return {**base, "covered": True, "why": "", "card": card_id, "target": target_id,
            "drafter": drafter_id if k else None, "drafts": k, "running": run,
            "tokens_per_step": tokens, "tokens_source": tok_src, "predicted": pred,
            "error_pct": 100 * (pred / row["value"] - 1), "predicted_step_ms": st.total_ms,
            "memory_ms": st.memory_ms, "math_ms": st.math_ms, "overhead_ms": st.overhead_ms,
            "bound": st.bound, "verified_tokens": run * (1 + k),
            "step_bytes": st.bytes, "step_flops": st.flops,
            "ridge_tokens": sc.ridge_tokens(c, target),
            "note": "; ".join(x for x in (
                f"{slots} request slots: {row['concurrency'] - run} streams queue ({slots_src})"
                if slots and run < row["concurrency"] else "", ctx_src if not ctx else "") if x)}


def check_articles(fits: Fits | None = None) -> pl.DataFrame:
    """One row a published speed figure: covered rows with published, predicted and error;
    the rest with why the model does not cover them."""
    fits = fits or fit_reference()
    pub = load_published()
    arms = {r["arm"]: r for r in load_arms().iter_rows(named=True)}
    rows = [predict_row(r, arms, pub, fits) for r in _speed_rows(pub).iter_rows(named=True)]
    return pl.DataFrame(rows, infer_schema_length=None)


def fit_reference() -> Fits:
    """The stand-in's fits (step_cost_check.fit over its stored cells)."""
    from specrepro.analysis.step_cost.cells import standin_cells

    return fit(standin_cells())


def fp8_drafter_bound(fits: Fits | None = None) -> pl.DataFrame:
    """Article B's bound on the FP8 drafter (about 15 % of a step's bytes, so at most about
    7 % at one stream, close to nothing at 32) beside the model's: the FP8 drafter's step
    against the BF16 one's on B's card, at the same tokens a step (bytes alone) and at each
    arm's published acceptance, at 1 and 32 streams."""
    fits = fits or fit_reference()
    c = card("rtx_pro_6000_maxq")
    target = model("qwen27b-nvfp4-b")
    bf16, fp8 = model("dflash2-b"), model("dflash2-fp8-b")
    over = fits.of("rtx_pro_6000_maxq", "vllm")
    ctx, _ = context_tokens("B", "essays")
    pub = load_published("B")
    arms = {r["arm"]: r for r in load_arms().iter_rows(named=True)}
    rows = []
    for streams in (1, 32):
        k = drafts_at(arms["dflash2_bf16_0330"], streams)
        s_bf = sc.step(c, sc.passes(target, bf16, k, streams, ctx), over)
        s_fp = sc.step(c, sc.passes(target, fp8, k, streams, ctx), over)
        share = bf16.weights.n_bytes / s_bf.bytes
        same = 100 * (s_bf.total_ms / s_fp.total_ms - 1)
        al = {a: _acceptance(pub, arms, {"arm": a, "workload": "essays", "temperature": 0.0,
                                         "concurrency": streams}, k)[0]
              for a in ("dflash2_bf16_0330", "dflash2_fp8_0330")}
        with_al = (100 * (al["dflash2_fp8_0330"] / s_fp.total_ms
                          / (al["dflash2_bf16_0330"] / s_bf.total_ms) - 1)
                   if None not in al.values() else None)
        # B's confirmation table: the two arms measured side by side for the gates
        measured = pub.filter((pl.col("metric") == "agg_tok_s") & (pl.col("workload") == "essays")
                              & (pl.col("concurrency") == streams) & pl.col("arm").is_in(list(al))
                              & pl.col("source").str.contains("confirmation"))
        m = {r["arm"]: r["value"] for r in measured.iter_rows(named=True)}
        published = (100 * (m["dflash2_fp8_0330"] / m["dflash2_bf16_0330"] - 1)
                     if {"dflash2_fp8_0330", "dflash2_bf16_0330"} <= set(m) else None)
        rows.append({"streams": streams, "drafts": k, "drafter_share_of_bytes_pct": 100 * share,
                     "gain_same_acceptance_pct": same, "gain_published_acceptance_pct": with_al,
                     "published_gain_pct": published,
                     "acceptance_bf16": al["dflash2_bf16_0330"], "acceptance_fp8": al["dflash2_fp8_0330"]})
    return pl.DataFrame(rows)
