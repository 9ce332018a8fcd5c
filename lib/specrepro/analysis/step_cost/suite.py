"""A suite's own cells and floor in the step-cost model's terms.

Design:
- A suite names its device and target as step-cost records (`substrate.card`,
  `substrate.target`, params/substrate.py). From them:
  - `floor_line`: the sentence the substrate line of every report closes with: the bytes a
    step reads (the target's weights, and each arm's drafter passes: one for a block drafter,
    k for a chain) over the card's rated and its measured bandwidth, and, where the finding
    measured one stream, each arm's step as a share of both floors. Bytes and bandwidth are
    decimal throughout (step_cost_data.Size converts a GiB once), so the floor is like for like
    with the articles' 71-78 % (rated bandwidth) and with the suite's own GEMMs (measured).
  - `finding_cells`: the finding's cells as rows of step_cost_cells.COLUMNS, so the model is
    checked on, and the roofline drawn with, the suite's own measurements as on the stand-in's.
- An arm's target is its own where its profile serves another record than the suite's
  (step_cost_cells.target_record: the model id and the quantization applied at load), so
  notebook 03's arms each read their own precision's bytes a step, and each arm's step is a
  share of its own floor; where the profile serves nothing a record names (the embedded
  engine's simulated NVFP4, which keeps its weights dequantized in the model's dtype), the
  suite's target, and the floor line says so. Arms of the suite's target read as before.
- A drafter's record is found by the arm's drafter id, or, for the embedded engine that keeps
  its drafters beside its model, by `<model id>/<method>`; an arm whose drafter has no record
  is left out of the floor and said so.
"""

from __future__ import annotations

import json

import polars as pl

from specrepro.analysis.finding.finding import Finding
from specrepro.analysis.step_cost import model as sc
from specrepro.analysis.step_cost.cells import COLUMNS, runtime_of, target_record
from specrepro.analysis.step_cost.data import card, model, model_by_id
from specrepro.speculative import draft_tokens_at


def _target(arm, suite_target: str) -> tuple[str, bool]:
    """(target record, found) of a study arm: the record its profile serves, else the
    suite's with found False."""
    own = target_record(arm.resolved)
    return (own, True) if own is not None else (suite_target, False)


def _drafter(arm) -> tuple[str | None, int]:
    """(drafter record, k) of a study arm; (None, 0) for plain decoding."""
    p = arm.resolved
    spec = p.speculative
    if spec is None or spec.method in (None, "none") or not spec.num_speculative_tokens:
        return None, 0
    did = p.drafter.id if p.drafter else f"{p.model.id}/{spec.method}"
    return model_by_id(did), spec.num_speculative_tokens


def floor_line(f: Finding) -> str:
    """'' where the suite names no card or target; else the floor sentence."""
    sub = f.suite.substrate
    if sub is None or not sub.card or not sub.target:
        return ""
    c, t = card(sub.card), model(sub.target)
    arms, missing, unpriced = [], [], []
    for a in f.study.arms:
        if a.noise_of is not None:
            continue
        d, k = _drafter(a)
        if k and d is None:
            missing.append(a.name)
            continue
        target, found = _target(a, sub.target)
        if not found:
            unpriced.append(a)
        parts = sc.passes(model(target), model(d) if d else None, k, 1, 0.0)
        arms.append((a.name, sum(p.weight_bytes for p in parts), target))
    # arms reading the same bytes of the same target share a clause
    unique: dict[tuple[float, str], list[str]] = {}
    for name, b, target in arms:
        unique.setdefault((b, target), []).append(name)

    def floors(b: float) -> str:
        fl = sc.floor_ms(c, b)
        return " / ".join(f"{fl[k]:.2f} ms {k}" for k in ("rated", "measured") if fl[k] is not None)

    rated, meas = c.rated_bandwidth_gb_s.value, c.measured_bandwidth_gb_s.value
    bw = " and ".join(x for x in (f"{rated / 1e3:.3g} TB/s rated" if rated else "",
                                  f"{meas / 1e3:.3g} TB/s measured" if meas else "") if x)
    # a 44-MB target reads as 0.0441 GB
    size = 3 if max((b for b, _ in unique), default=0) >= 1e9 else 4
    reads = "; ".join(
        f"{', '.join(names)}"
        + (f" (its own target: {model(target).label})" if target != sub.target else "")
        + f": {b / 1e9:.{size}g} GB, floor {floors(b)}" for (b, target), names in unique.items())
    text = (f"Floor (analysis/step_cost/model.py, decimal GB and TB/s): a step of {t.label} on "
            f"{c.label} ({bw}) reads, with each arm's drafter passes, {reads}.")
    shares = []
    one = f.cells.filter(pl.col("concurrency") == 1) if "concurrency" in f.cells.columns else f.cells
    for name, b, _ in arms:
        steps = one.filter(pl.col("arm") == name)["step_ms"].drop_nulls()
        if steps.len():
            step = float(steps.mean())
            fl = sc.floor_ms(c, b)
            parts = [f"{100 * fl[k] / step:.0f} % of the {k} floor's speed"
                     for k in ("rated", "measured") if fl[k] is not None]
            shares.append(f"{name} {step:.2f} ms ({', '.join(parts)})")
    if shares:
        text += " At one stream: " + "; ".join(shares) + "."
    if missing:
        text += f" No drafter record for {', '.join(missing)}: not in the floor."
    if unpriced:
        served = "; ".join(f"{a.name} ({a.resolved.model.id}, quantization "
                           f"{a.resolved.flags.get('quantization')})" for a in unpriced)
        text += (f" No target record for what {served} serves: priced as the suite's "
                 "target.")
    return text


def finding_cells(f: Finding) -> pl.DataFrame:
    """The finding's measured cells as step-cost rows (step_cost_cells.COLUMNS); empty where
    the suite names no card or target."""
    sub = f.suite.substrate
    if sub is None or not sub.card or not sub.target or not f.cells.height:
        return pl.DataFrame(schema=COLUMNS)
    by_arm = {a.name: a for a in f.study.arms}
    rows = []
    for c in f.cells.iter_rows(named=True):
        a = by_arm.get(c["arm"])
        if a is None or c["agg_tok_s"] is None:
            continue
        d, k = _drafter(a)
        target, _ = _target(a, sub.target)
        schedule = json.loads(c["schedule"]) if c.get("schedule") else None
        k = draft_tokens_at(schedule, k, c["concurrency"]) if k else 0
        p = a.resolved
        per_request = max(c.get("n_requests") or 1, 1)
        rows.append({"card": sub.card, "engine": p.engine,
                     "runtime": runtime_of(p),
                     "arm": c["arm"], "profile": p.name, "target": target, "drafter": d,
                     "drafts": k, "streams": c["concurrency"], "tok_s": c["agg_tok_s"],
                     "acceptance_length": c.get("acceptance_length") if k else None,
                     "per_position": c.get("per_position_acceptance") if k else None,
                     "busy": c.get("busy_share"),
                     "context_tokens": ((c.get("prompt_tokens") or 0)
                                        + (c.get("output_tokens") or 0) / 2) / per_request,
                     "source": f"{f.suite.name}: {c['arm']} at {c['concurrency']} streams, "
                               f"repeat {c.get('repeat')}", "note": None})
    return pl.DataFrame(rows, schema=COLUMNS)
