"""Does acceptance change with the level? Tokens per step at each level against the
prompt-to-prompt noise (measure acceptance once where it does not).

Design:
- The level's figure is the engine's own: each cell's counters (`acceptance_length`,
  tokens per verify step over its span, every request that stepped in it).
- The noise is the prompts': a request's tokens per step is its completion tokens over
  the token-carrying chunks of its stream after the first (the first chunk is the
  prefill's token; vLLM sends one chunk per engine step that gave the request tokens,
  and coalesces steps only when the client lags). The spread of that figure across the
  requests of a cell is how much the figure moves from one prompt to the next; its
  standard error (sd / sqrt(n)) is how far a window's mean may sit from the true one by
  which prompts it happened to hold.
- Chunk and counter figures are checked against each other per cell
  (`chunk_vs_counters`): where a cell's chunks hold more tokens than its counters' steps
  give (steps coalesced), its per-request figures are not read as steps.
- Two levels agree when |Δ| <= 2 standard errors of the difference (z <= 2), each level's
  standard error from its own requests. Repeats are pooled: they send the same prompts, so
  with several the error is optimistic (the stand-in suite runs one round).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

MIN_CHUNKS = 4  # a request with fewer steps says little about its prompt


@dataclass(frozen=True)
class LevelAcceptance:
    arm: str
    concurrency: int
    counters: float | None  # tokens per step, the engine's counters over the cell
    per_request_mean: float | None  # mean over requests of tokens per step (chunks)
    per_request_sd: float | None
    n_requests: int
    chunk_vs_counters: float | None  # pooled chunk figure / counters figure

    @property
    def se(self) -> float | None:
        if self.per_request_sd is None or self.n_requests < 2:
            return None
        return self.per_request_sd / math.sqrt(self.n_requests)


def per_request(requests: pl.DataFrame) -> pl.DataFrame:
    """Per ok request: its tokens after the first chunk and its chunks after the first."""
    ok = requests.filter(pl.col("error").is_null() & pl.col("chunk_tokens").is_not_null())
    return ok.with_columns(
        pl.col("chunk_tokens").list.slice(1).list.sum().alias("tokens"),
        (pl.col("chunk_tokens").list.len() - 1).alias("steps"),
    ).filter(pl.col("steps") >= MIN_CHUNKS)


def levels(cells: pl.DataFrame, requests: pl.DataFrame) -> list[LevelAcceptance]:
    """Each speculative arm's tokens per step at each level, by counters (the mean over
    its repeats) and by request (pooled over them). Arms on a batch-size schedule are left
    out: their draft count changes with the level by design."""
    out = []
    spec = cells.filter(pl.col("acceptance_length").is_not_null())
    if "schedule" in spec.columns:
        spec = spec.filter(pl.col("schedule").is_null())
    reqs = per_request(requests)
    for (arm, level), rows in sorted(spec.group_by("arm", "concurrency"),
                                     key=lambda kv: (kv[0][0], kv[0][1])):
        keys = rows.select("cell_id", "attempt")
        mine = reqs.join(keys, on=["cell_id", "attempt"], how="semi")
        counters = rows["acceptance_length"].mean()
        taus = (mine["tokens"] / mine["steps"]).to_list() if mine.height else []
        mean = sum(taus) / len(taus) if taus else None
        sd = (math.sqrt(sum((t - mean) ** 2 for t in taus) / (len(taus) - 1))
              if len(taus) > 1 else None)
        pooled = mine["tokens"].sum() / mine["steps"].sum() if mine.height else None
        out.append(LevelAcceptance(arm, level, counters, mean, sd, len(taus),
                                   pooled / counters if pooled and counters else None))
    return out


def agree(a: LevelAcceptance, b: LevelAcceptance) -> tuple[float | None, float | None]:
    """(Δ counters in %, z of the difference against the two levels' standard errors)."""
    if a.counters is None or b.counters is None:
        return None, None
    delta = 100.0 * (b.counters - a.counters) / a.counters
    ses = [x.se for x in (a, b) if x.se is not None]
    if not ses:
        return delta, None
    se = math.sqrt(sum(s * s for s in ses))
    return delta, abs(b.counters - a.counters) / se if se else None


def table(cells: pl.DataFrame, requests: pl.DataFrame, low: int, high: int) -> list[dict]:
    """Per arm: the counters at `low` and `high` streams, each level's per-request noise,
    and whether they agree (z <= 2)."""
    by = {(x.arm, x.concurrency): x for x in levels(cells, requests)}
    out = []
    for arm in sorted({a for a, _ in by}):
        a, b = by.get((arm, low)), by.get((arm, high))
        if a is None or b is None:
            continue
        delta, z = agree(a, b)
        out.append({"arm": arm, "low": a, "high": b, "delta_pct": delta, "z": z,
                    "agree": None if z is None else z <= 2.0})
    return out
