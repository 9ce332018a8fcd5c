"""Did the challenger's drafter propose anything the baseline's did not?

Design:
- A study that changes the drafter alone (05: the block drafter in FP8 against the same
  drafter in BF16, one engine, one target) tests the change only if the engine served the
  changed drafter. An engine can take a flag and not apply it: SGLang 0.5.14 reads
  `--speculative-draft-model-quantization` into the drafter's model config, but its DFlash
  drafter builds `qkv_proj`, `o_proj` and the MLP without that config and `fc` as a plain
  `nn.Linear` (`sglang/srt/models/dflash.py`), so the "FP8" drafter it serves is the BF16 one.
- Measured, not declared: under greedy decoding the verify pass keeps the target's tokens
  whatever the drafter proposes, so a drafter whose weights changed shows only in its
  counters. If every paired greedy cell (same workload and streams, temperature 0) of the
  two arms has the same number of drafts and of accepted draft tokens, over thousands of
  drafts, the two drafters proposed the same tokens at every step: the change never reached
  the drafter and nothing about it was measured. One differing cell is enough to clear it.
- A rule opts in with `needs: drafter_change` (rules.py); the study's baseline is the
  reference and its first challenger (`Finding.challenger`) the changed drafter. Cells
  without the engine's draft counters (no speculation, or an engine that keeps none) and
  sampled cells are left out; with no paired cell left, nothing is claimed.
"""

from __future__ import annotations

import polars as pl

from specrepro.analysis.finding.finding import Finding

_KEY = ["workload", "concurrency"]
_COUNTS = ["num_drafts", "num_accepted_tokens"]


def _greedy_counts(cells: pl.DataFrame, arm: str) -> pl.DataFrame:
    """[cells of `arm` at T=0 with both counters] -> one row per (workload, streams): the
    sorted distinct (drafts, accepted) pairs over its repeats."""
    part = cells.filter((pl.col("arm") == arm) & (pl.col("temperature") == 0)
                        & pl.col("num_drafts").is_not_null()
                        & pl.col("num_accepted_tokens").is_not_null())
    return (part.group_by(_KEY)
            .agg(pl.concat_str([pl.col(c).cast(pl.Utf8) for c in _COUNTS], separator="/")
                 .unique().sort().alias("counts"),
                 pl.col("num_drafts").sum().alias("drafts"), pl.len().alias("runs")))


def same_drafts(f: Finding) -> str:
    """Why the challenger's drafter change was not measured ('' when its drafter proposed
    something the baseline's did not, or when no greedy cell of both arms has counters)."""
    base, arm = f.study.baseline, f.challenger
    if base is None or arm == base:
        return ""
    a, b = _greedy_counts(f.cells, arm), _greedy_counts(f.cells, base)
    paired = a.join(b, on=_KEY, suffix="_base")
    if not paired.height:
        return ""
    if paired.filter(pl.col("counts") != pl.col("counts_base")).height:
        return ""
    labels = f.labels
    first = paired.sort(_KEY).row(0, named=True)
    drafts, accepted = (int(x) for x in first["counts"][0].split("/"))
    runs = int(paired["runs"].sum() + paired["runs_base"].sum())
    return (f"the engine served the same drafter to both arms; {labels[arm]} proposed "
            f"exactly what {labels[base]} did, the same number of drafts and of accepted "
            f"draft tokens in all {paired.height} paired greedy cells ({runs} runs, "
            f"{int(paired['drafts'].sum()):,} of its drafts; e.g. {drafts:,} drafts and "
            f"{accepted:,} accepted on {first['workload']} at {first['concurrency']} "
            f"stream{'s' if first['concurrency'] != 1 else ''}), so the change was never "
            "measured")
