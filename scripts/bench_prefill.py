"""Admission under a burst: N GSM8K prompts arriving at once at the embedded engine, one
prefill pass per request against every chunk of a step in one padded pass
(`--batched-prefill`, embedded/prefill.py), side by side in one run.

Prints, per mode and repeat: time to each request's first token (p50, max, measured from the
burst at the engine's own steps, no HTTP), the time until every request finished and the
aggregate tok/s; then the greedy outputs' agreement between the modes. Not a test: figures,
no thresholds. The peer table's 32-stream gap (docs/bench/peer-h200-2026-12-02.md) is the
question it answers: how much of it is admission.

    python scripts/bench_prefill.py --model models/embedded                    # 2-core CPU
    python scripts/bench_prefill.py --model models/embedded --device cuda      # the H200

Reads GSM8K through `specrepro.data.read_gsm8k` (standard library only), so it runs on the
H200 image.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specrepro.data import read_gsm8k
from specrepro.embedded.config import EngineConfig
from specrepro.embedded.engine import EngineRequest, LLMEngine
from specrepro.embedded.sampling import SamplingParams


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/embedded")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default=None, help="float32 (CPU default) | bfloat16 (CUDA)")
    ap.add_argument("--streams", type=int, default=32, help="requests in the burst")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--budget", type=int, default=512, help="--max-num-batched-tokens")
    ap.add_argument("--repeats", type=int, default=3)
    return ap.parse_args(argv)


def burst(eng: LLMEngine, prompts: list[list[int]], max_tokens: int, sync) -> dict:
    """All prompts at once; first-token and finish times from the burst, in seconds."""
    for i, p in enumerate(prompts):
        eng.add_request(EngineRequest(f"r{i}", p, SamplingParams(temperature=0.0),
                                      max_tokens=max_tokens, ignore_eos=True))
    first, outputs, t0 = {}, {f"r{i}": [] for i in range(len(prompts))}, time.perf_counter()
    while eng.has_unfinished():
        outs = eng.step()
        sync()
        now = time.perf_counter() - t0
        for o in outs:
            first.setdefault(o.request_id, now)
            outputs[o.request_id].extend(o.new_token_ids)
    wall = time.perf_counter() - t0
    ttft = sorted(first.values())
    return {"ttft_p50_ms": 1e3 * statistics.median(ttft), "ttft_max_ms": 1e3 * ttft[-1],
            "wall_ms": 1e3 * wall, "tok_s": sum(map(len, outputs.values())) / wall,
            "outputs": [outputs[f"r{i}"] for i in range(len(prompts))]}


def main(argv=None) -> int:
    args = parse_args(argv)
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    engines = {mode: LLMEngine(EngineConfig(
        model_dir=args.model, device=args.device, dtype=dtype, max_num_seqs=args.streams,
        max_model_len=1024, max_num_batched_tokens=args.budget,
        batched_prefill=mode == "batched")) for mode in ("one pass each", "batched")}
    tok = next(iter(engines.values())).tokenizer
    rows = read_gsm8k("test")[: args.streams]
    prompts = [tok.encode(f"Question: {r['question']}\nAnswer:") for r in rows]
    print(f"{args.streams} GSM8K prompts at once ({sum(map(len, prompts)):,} prompt tokens, "
          f"{args.max_tokens} tokens each), budget {args.budget} tokens a step, {args.device} "
          f"{dtype}")
    for eng in engines.values():  # warm-up: shapes and graphs met before any timed burst
        burst(eng, prompts, 4, sync)
    print(f"{'mode':<14} {'repeat':>6} {'TTFT p50 ms':>12} {'TTFT max ms':>12} "
          f"{'all done ms':>12} {'tok/s':>9}")
    last = {}
    for r in range(args.repeats):
        for mode, eng in engines.items():  # alternating: the modes share the machine's noise
            res = burst(eng, prompts, args.max_tokens, sync)
            last[mode] = res["outputs"]
            print(f"{mode:<14} {r:>6} {res['ttft_p50_ms']:>12.1f} {res['ttft_max_ms']:>12.1f} "
                  f"{res['wall_ms']:>12.1f} {res['tok_s']:>9.0f}")
    a, b = last.values()
    same = sum(x == y for x, y in zip(a, b))
    print(f"greedy outputs identical between the modes: {same} of {len(a)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
