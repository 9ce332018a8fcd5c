"""Price a drafter by its step: time each stage of a speculative step alone, on a row of a
fixed context, and print what the step costs in plain decodes.

    python scripts/bench_step_stages.py --model models/embedded                 # 2-core CPU
    python scripts/bench_step_stages.py --model models/embedded --device cuda   # the H200

Stages (the engine's, spec.py): `decode` a one-token target pass (autoregressive decoding's
whole step), `verify` the target over k+1 tokens, `propose` k drafts, `observe` the drafter
reading the verify pass, `accept` greedy acceptance. On CUDA each stage is captured in its own
CUDA graph over whole cache rows, as the engine's static decode program runs them, and timed
by replays; on the CPU each runs eagerly at the engine's bucketed attention span. A step
costs `cost` = (verify + propose + observe + accept) / decode decodes, so a drafter whose
tokens per step is tau speeds one stream up by at most tau / cost (the engine's own step adds
host work; in a step the stages also evict each other's weights from the CPU's caches, so
the engine's step is slower than this sum there: bench_engine.py measures the real thing).
`tau for Nx` is the tokens per step a drafter of this cost needs for an N-fold speedup.

Prints a table and ends with one JSON line. Not a test: figures, no thresholds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import partial

import torch

from specrepro.embedded.checkpoint import list_drafters, load_proposer, load_target
from specrepro.embedded.config import EngineConfig
from specrepro.embedded.graphs import capture_graph
from specrepro.embedded.model import relayout_linear_weights
from specrepro.embedded.spec import Drafts, Verified, accept_greedy


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/embedded")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default=None, help="float32 (CPU default) | bfloat16 (CUDA)")
    ap.add_argument("--drafters", default=None,
                    help="comma-separated drafter names of drafters.json (default: all)")
    ap.add_argument("--ks", default="3,5,7")
    ap.add_argument("--context", type=int, default=256, help="tokens already in the row")
    ap.add_argument("--iters", type=int, default=100, help="timed calls per stage (median)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--speedups", default="1.4,2.5", help="speedups to print tau for")
    args = ap.parse_args(argv)
    if args.context < 1 or args.iters < 1:
        ap.error("--context and --iters must be >= 1")
    return args


class Timer:
    """Median wall time of a stage: CUDA graph replays on CUDA, eager calls on the CPU."""

    def __init__(self, device: str, iters: int):
        self.cuda, self.iters = device == "cuda", iters

    def __call__(self, fn) -> float:
        if self.cuda:  # warm up on a side stream, then capture, as the engine's captures do
            graph, _, _ = capture_graph(fn)
            run = graph.replay
        else:
            run = fn
        for _ in range(3):
            run()
        times = []
        for _ in range(self.iters):
            if self.cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            run()
            if self.cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e3


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev, static = args.device, args.device == "cuda"
    dtype = getattr(torch, args.dtype or ("bfloat16" if static else "float32"))
    target, _ = load_target(args.model, device=dev, dtype=dtype)
    names = list_drafters(args.model)
    wanted = args.drafters.split(",") if args.drafters else list(names)
    unknown = [n for n in wanted if n not in names]
    if unknown:
        raise SystemExit(f"--drafters: {unknown} not in {args.model}/drafters.json "
                         f"({sorted(names)})")
    ks = [int(k) for k in args.ks.split(",")]
    k_layout = dev == "cpu" and dtype == torch.float32  # the engine's "auto" weight layout
    if k_layout:
        relayout_linear_weights(target, True)
    ctx, max_len = args.context, args.context + max(ks) + 1
    cache = target.new_cache(2, max_len, device=dev, dtype=dtype)
    slots = torch.tensor([0], device=dev)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, target.config.vocab_size, (1, ctx + max(ks) + 1), generator=g).to(dev)
    timer = Timer(dev, args.iters)

    bucket = EngineConfig.kv_len_bucket

    def span(end):  # the engine's attention span: whole rows when static, else bucketed
        return max_len if static else min(-(-end // bucket) * bucket, max_len)

    def target_pass(s, layers=()):
        pos = torch.arange(ctx, ctx + s, device=dev)[None]
        return lambda: target(ids[:, ctx:ctx + s], positions=pos, cache=cache, slots=slots,
                              kv_len=span(ctx + s), hidden_layers=layers)

    rows = []
    print(f"# bench_step_stages: {args.model} on {dev} ({str(dtype).split('.')[-1]}, "
          f"{torch.get_num_threads()} threads), context {ctx}, median of {args.iters}, "
          f"{'CUDA graph per stage' if static else 'eager'}, torch {torch.__version__}")
    with torch.inference_mode():
        pre = torch.arange(ctx, device=dev)[None]
        target(ids[:, :ctx], positions=pre, cache=cache, slots=slots, kv_len=ctx)
        decode = timer(target_pass(1))
        targets = [float(x) for x in args.speedups.split(",")]
        print(f"decode (one-token target pass) {decode:.3f} ms\n")
        head = (f"{'drafter':14s}{'k':>3s}{'verify':>9s}{'propose':>9s}{'observe':>9s}"
                f"{'accept':>8s}{'step':>8s}{'cost':>7s}"
                + "".join(f"{f'tau {s:g}x':>10s}" for s in targets))
        print(head)
        for name in wanted:
            prop = load_proposer(args.model, names[name], target, name=name)
            if k_layout:
                relayout_linear_weights(prop, True)
            prop.static_bound = static
            prop.allocate(2, max_len, dev, dtype)
            prop.finalize()
            layers = tuple(prop.target_layers)
            out = target(ids[:, :ctx], positions=pre, cache=cache, slots=slots, kv_len=ctx,
                         hidden_layers=layers)
            prop.observe(slots, ids[:, :ctx], pre, out.hidden)
            cl = torch.tensor([ctx], device=dev)
            for k in ks:
                verify_fn = target_pass(k + 1, layers)
                verified = verify_fn()
                pos = torch.arange(ctx, ctx + k + 1, device=dev)[None]
                drafts = Drafts(ids[:, ctx + 1:ctx + k + 1], None, None)
                v = Verified(verified.logits, ids[:, ctx:ctx + k + 1], pos, verified.hidden)
                t = {"verify": timer(verify_fn),
                     "propose": timer(partial(prop.propose, slots, cl, ids[:, ctx], k)),
                     "observe": timer(partial(prop.observe, slots, v.input_ids, pos, v.hidden)),
                     "accept": timer(partial(accept_greedy, drafts, v))}
                step = sum(t.values())
                cost = step / decode
                row = {"drafter": name, "method": names[name], "k": k, **t, "step": step,
                       "cost_decodes": cost, "tau_needed": {str(s): s * cost for s in targets}}
                rows.append(row)
                print(f"{name:14s}{k:3d}{t['verify']:9.3f}{t['propose']:9.3f}"
                      f"{t['observe']:9.3f}{t['accept']:8.3f}{step:8.3f}{cost:7.2f}"
                      + "".join(f"{s * cost:10.2f}" for s in targets))
    res = {"device": dev, "dtype": str(dtype).split(".")[-1], "context": ctx,
           "threads": torch.get_num_threads(), "torch": torch.__version__,
           "decode_ms": decode, "rows": rows}
    if static:
        res["gpu"] = torch.cuda.get_device_name()
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
