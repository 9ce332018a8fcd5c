"""Print what the linear weights' memory layout costs a target pass of 1 and of k+1 tokens.

The engine stores linear weights K-major on the CPU in fp32 (`EngineConfig.weight_layout`,
config.py; `relayout_linear_weights`, model.py). This script is the measurement behind that default: the committed target's cached
forward at 1 token (a decode) and at 4 and 8 tokens (a verify), row-major against K-major,
eager and `torch.compile`d, and the target's GEMMs alone (its own weights, random
rows), the variants interleaved in one process and each figure the fastest of several rounds (a shared machine only ever slows a round down).

    PYTHONPATH=lib python scripts/bench_weight_layout.py [--model models/embedded]
        [--dtype float32] [--threads 1] [--rounds 12] [--no-compile]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from specrepro.embedded.checkpoint import load_target
from specrepro.embedded.model import relayout_linear_weights

TOKENS = (1, 4, 8)
CONTEXT = 200  # tokens already in the cache; the pass attends over CONTEXT + new ones


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/embedded")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--calls", type=int, default=8, help="passes per timed round")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.calls < 1:
        ap.error("--rounds and --calls must be >= 1")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    slots = torch.tensor([0])
    variants = {}
    for layout in ("row_major", "k_major"):
        model, _ = load_target(args.model, device="cpu", dtype=dtype)
        ids = torch.randint(3, model.config.vocab_size, (1, max(TOKENS)),
                            generator=torch.Generator().manual_seed(0))
        relayout_linear_weights(model, layout == "k_major")
        cache = model.new_cache(1, CONTEXT + max(TOKENS) + 64, dtype=dtype)
        for mode in ("eager", "compiled") if args.compile else ("eager",):
            fn = torch.compile(model, dynamic=False) if mode == "compiled" else model
            variants[(layout, mode)] = (fn, cache)

    def round_ms(fn, cache, s: int) -> float:
        pos = torch.arange(CONTEXT, CONTEXT + s)[None]
        t = time.perf_counter()
        for _ in range(args.calls):
            fn(ids[:, :s], positions=pos, cache=cache, slots=slots, kv_len=cache.max_len)
        return (time.perf_counter() - t) / args.calls * 1e3

    # the target's GEMMs alone (its own weight matrices, in forward order), both layouts
    weights = [m.weight.detach() for m in variants[("row_major", "eager")][0].modules()
               if isinstance(m, torch.nn.Linear)]
    gemm_w = {"row_major": [w.contiguous() for w in weights],
              "k_major": [w.t().contiguous().t() for w in weights]}
    gemm_x = {s: [torch.randn(s, w.shape[1], dtype=dtype) for w in weights] for s in TOKENS}

    def gemm_round_ms(layout: str, s: int) -> float:
        t = time.perf_counter()
        for _ in range(args.calls):
            for x, w in zip(gemm_x[s], gemm_w[layout]):
                torch.nn.functional.linear(x, w)
        return (time.perf_counter() - t) / args.calls * 1e3

    best: dict[tuple, float] = {}
    with torch.inference_mode():
        for (fn, cache) in variants.values():  # compile and warm every shape first
            for s in TOKENS:
                round_ms(fn, cache, s)
        for _ in range(args.rounds):
            for key, (fn, cache) in variants.items():
                for s in TOKENS:
                    best[key + (s,)] = min(best.get(key + (s,), float("inf")),
                                           round_ms(fn, cache, s))
            for layout in gemm_w:
                for s in TOKENS:
                    key = (layout, f"{len(weights)} GEMMs", s)
                    best[key] = min(best.get(key, float("inf")), gemm_round_ms(layout, s))
    print(f"# bench_weight_layout: {args.model}, {args.dtype}, {args.threads} thread(s), "
          f"context {CONTEXT}, fastest of {args.rounds} rounds x {args.calls} passes, torch "
          f"{torch.__version__}\n")
    print(f"{'layout':<10} {'pass':<9}" + "".join(f"{f'{s} tok ms':>10}" for s in TOKENS)
          + "".join(f"{f'{s}/1':>8}" for s in TOKENS[1:]))
    rows = []
    for layout, mode in list(variants) + [(lay, f"{len(weights)} GEMMs") for lay in gemm_w]:
        ms = [best[(layout, mode, s)] for s in TOKENS]
        rows.append({"layout": layout, "mode": mode, "ms": dict(zip(TOKENS, ms)),
                     "verify_over_decode": {s: m / ms[0] for s, m in zip(TOKENS[1:], ms[1:])}})
        print(f"{layout:<10} {mode:<9}" + "".join(f"{m:>10.2f}" for m in ms)
              + "".join(f"{m / ms[0]:>8.2f}" for m in ms[1:]))
    result = {"dtype": args.dtype, "threads": args.threads, "rounds": args.rounds,
              "torch": torch.__version__, "rows": rows}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.exit(main() and 0)
