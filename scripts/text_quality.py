"""The figures behind the loop flag and the prose workload's cap (issue 30, item 4).

Not a test: it prints tables, no thresholds. Three sections, each a subcommand:

    python scripts/text_quality.py natural   # repeated 4-grams of natural text
    python scripts/text_quality.py cells     # the stored cells of results/*/, by share
    python scripts/text_quality.py caps      # the prose workload on the embedded engine

- natural: the repeated-4-gram share (metrics.repeated_ngram_share, the embedded model's
  tokenizer, the function every cell uses) of WikiText-2 test and valid over windows of
  64-512 tokens, standard-library code, GSM8K's gold answers and HumanEval's reference
  solutions: what text that is not a loop reads.
- cells: every stored ok cell of results/<suite>/<study>/<run>/, binned by its
  `repeated_4gram_share`, with its share of requests that ended at max_tokens (derived from
  the requests where the row lacks it, text_quality.with_length_share), and the split at
  metrics.LOOP_SHARE.
- caps: the `prose` workload's prompts run greedy and sampled on the embedded engine
  (LLMEngine, CPU, no speculation: greedy outputs are the same with any drafter), to the
  largest cap once; for each smaller cap the outputs are the same run cut there (greedy
  output is a prefix of a longer one; sampled, each request's generator draws the same
  tokens). Per cap: the share that ended at end-of-text, at the cap, the pooled repeated
  4-grams and the mean output tokens. `--words` varies the prompt's length.

Measured 2026-12-04 on the 2-core CPU (`caps --temperature 0` and `0.7`, 48 prompts of 64
words, 131 tokens on average), what chose workloads.PROSE_MAX_TOKENS and PROSE_PROMPT_WORDS;
each cell: pooled repeated 4-grams / share of requests that ended at end-of-text:

| cap | greedy | T=0.7 |
| --- | --- | --- |
| 16 | 0.091 / 0.25 | 0.010 / 0.12 |
| 32 | 0.227 / 0.50 | 0.021 / 0.27 |
| 48 | 0.337 / 0.54 | 0.028 / 0.44 |
| 64 | 0.430 / 0.56 | 0.046 / 0.58 |
| 96 | 0.535 / 0.60 | 0.066 / 0.73 |
| 128 | 0.607 / 0.62 | 0.081 / 0.83 |
| 192 | 0.702 / 0.67 | 0.078 / 0.92 |
| 256 | 0.762 / 0.67 | 0.098 / 0.94 |

Sampled at T=0.7 the outputs stay prose (natural WikiText-2 over 64-128-token windows:
0.011-0.025, their 95th percentile 0.066-0.096) and end by themselves; 192 is the first cap
at which 9 in 10 do, and past it the cap hardly binds (mean output 72 tokens). Greedy, no
cap keeps them prose: a third loop within their first 32 tokens (0.227 there) and the cells
reach the loop flag (metrics.LOOP_SHARE, 0.45) from 96 tokens on. Prompt length, greedy at
256 tokens: 16 words 0.882 / 0.23, 32 words 0.762 / 0.46 (T=0.7: 0.114 / 0.94), 64 words
0.762 / 0.67, 128 words 0.852 / 0.62 (24 paragraphs long enough); 64 words ended most.
"""

from __future__ import annotations

import argparse
import glob
import sys
import time
from pathlib import Path

from specrepro import data, metrics, workloads

CAPS = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def _windows(ids: list[list[int]], size: int) -> list[list[int]]:
    return [x[i:i + size] for x in ids for i in range(0, len(x) - size + 1, size)]


def _line(name: str, seqs: list[list]) -> str:
    shares = sorted(s for s in (metrics.repeated_ngram_share(x) for x in seqs) if s is not None)
    q = (lambda p: shares[int(p * (len(shares) - 1))]) if shares else (lambda p: float("nan"))
    return (f"| {name} | {len(shares)} | {metrics.pooled_repeated_ngram_share(seqs):.3f} | "
            f"{q(0.5):.3f} | {q(0.95):.3f} | {q(0.99):.3f} | {shares[-1] if shares else 0:.3f} |")


def natural(args) -> None:
    from specrepro.embedded.tokenizer import Tokenizer
    from specrepro.tools.training.corpus import stdlib_files, wikitext_articles

    tok = Tokenizer.load(args.model)
    print("| text | pieces | pooled | median | p95 | p99 | max |\n| --- | --- | --- | --- | "
          "--- | --- | --- |")
    for split in data.WIKITEXT_SPLITS:
        text = data.detokenize_wikitext(data.read_wikitext(split, args.data_dir))
        ids = [tok.encode(a) for a in wikitext_articles(text)]
        for size in (64, 128, 256, 512):
            print(_line(f"WikiText-2 {split}, {size}-token windows", _windows(ids, size)))
    code = [tok.encode(p.read_text(errors="replace")) for p in stdlib_files()[::4]]
    print(_line("standard-library code, 512-token windows", _windows(code, 512)))
    gold = [tok.encode(r["answer"]) for r in data.read_gsm8k("test", args.data_dir)]
    print(_line("GSM8K test, gold answers", gold))
    ref = [tok.encode(p["prompt"] + p["canonical_solution"])
           for p in workloads.humaneval_problems()]
    print(_line("HumanEval, prompt + reference solution", ref))


def cells(args) -> None:
    import polars as pl

    from specrepro.analysis.finding.text_quality import with_length_share
    from specrepro.store import load_cells, load_requests

    frames = []
    for manifest in sorted(glob.glob(f"{args.results}/*/*/*/manifest.json")):
        root = Path(manifest).parent
        ok = load_cells(root).filter(pl.col("status") == "ok")
        ok = with_length_share(ok, load_requests(root, ok))
        frames.append(ok.select("workload", "temperature", "repeated_4gram_share",
                                "length_share").with_columns(pl.lit(str(root)).alias("store")))
    df = pl.concat(frames)
    print(f"{df.height} ok cells in {len(frames)} stores under {args.results}/")
    print("| repeated 4-grams | cells | workloads | ended at max_tokens, mean |\n"
          "| --- | --- | --- | --- |")
    for lo in [i / 20 for i in range(20)]:
        part = df.filter(pl.col("repeated_4gram_share").is_between(lo, lo + 0.05,
                                                                   closed="left"))
        if part.height:
            loads = ", ".join(f"{w} {n}" for w, n in part.group_by("workload").len()
                              .sort("workload").iter_rows())
            print(f"| {lo:.2f}-{lo + 0.05:.2f} | {part.height} | {loads} | "
                  f"{part['length_share'].mean():.2f} |")
    flag = pl.col("repeated_4gram_share") >= metrics.LOOP_SHARE
    for name, part in (("flagged", df.filter(flag)), ("not flagged", df.filter(~flag))):
        print(f"{name} (LOOP_SHARE {metrics.LOOP_SHARE}): {part.height} cells, repeated "
              f"4-grams {part['repeated_4gram_share'].min():.3f}-"
              f"{part['repeated_4gram_share'].max():.3f}, ended at max_tokens "
              f"{part['length_share'].min():.3f}-{part['length_share'].max():.3f} "
              f"(mean {part['length_share'].mean():.3f})")


def caps(args) -> None:
    from specrepro.embedded.config import EngineConfig
    from specrepro.embedded.engine import LLMEngine
    from specrepro.embedded.sampling import SamplingParams

    eng = LLMEngine(EngineConfig(model_dir=args.model, num_threads=args.threads,
                                 max_num_seqs=args.n))
    tok, eos = eng.tokenizer, eng.eos_token_id
    paragraphs = workloads.prose_paragraphs(args.data_dir, args.words)[:args.n]
    prompts = [tok.encode(workloads.prose_opening(p["text"], args.words)) for p in paragraphs]
    top = max(args.caps)
    print(f"prose, {len(prompts)} prompts of {args.words} words (mean "
          f"{sum(map(len, prompts)) / len(prompts):.0f} tokens), T={args.temperature:g}, "
          f"run to {top} tokens", file=sys.stderr)
    sampling = None if args.temperature == 0 else [
        SamplingParams(temperature=args.temperature, seed=i) for i in range(len(prompts))]
    t0 = time.perf_counter()
    outs = eng.generate(prompts, sampling=sampling, max_tokens=top)
    print(f"generated in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print("| cap | ended at end-of-text | ended at the cap | repeated 4-grams (pooled) | "
          "mean output tokens |\n| --- | --- | --- | --- | --- |")
    for cap in sorted(args.caps):
        cut, ended = [], 0
        for out in outs:
            out = out[:cap]
            if eos in out:
                ended += 1
                out = out[:out.index(eos)]
            cut.append(out)
        print(f"| {cap} | {ended / len(outs):.2f} | {1 - ended / len(outs):.2f} | "
              f"{metrics.pooled_repeated_ngram_share(cut):.3f} | "
              f"{sum(map(len, cut)) / len(cut):.0f} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("section", choices=("natural", "cells", "caps"))
    ap.add_argument("--model", default="models/embedded")
    ap.add_argument("--data-dir", default=None, help="default: $SPECREPRO_DATA_DIR")
    ap.add_argument("--results", default="results")
    ap.add_argument("--words", type=int, default=workloads.PROSE_PROMPT_WORDS)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--n", type=int, default=48, help="prompts (caps)")
    ap.add_argument("--caps", type=int, nargs="+", default=list(CAPS))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    {"natural": natural, "cells": cells, "caps": caps}[args.section](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
