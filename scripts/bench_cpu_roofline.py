"""The CPU's roofline for the step-cost model: the weight-read bandwidth and the math rate
its GEMMs reach, as the embedded engine runs them there.

    python scripts/bench_cpu_roofline.py --out docs/bench/cpu-roofline-2core-DATE.jsonl

The embedded engine on the CPU keeps its linear weights K-major in fp32 and runs one torch
thread (params/default.yaml, embedded/model.py), so this times `x[T, K] @ W[K, N]` in fp32,
cycling over copies of W 8x the last-level cache (the weights come from memory, not the
cache, as a decode step's do), at 1 and 2 threads and T from 1 to 1,024 tokens. Each line of
the output is one cell: threads, tokens, milliseconds a GEMM, the weights' bytes read per
second and the FLOP/s. Nothing here is a test: it prints and writes figures, which
lib/specrepro/analysis/step_cost/cards.yaml cites as the CPU's measured values.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

K = N = 2048          # 16 MiB of fp32 weights a matrix
COPIES = 8            # 128 MiB: 4x the 32-MiB L3 of the machine this was written on
MIN_S = 1.0           # each cell loops at least this long


def cell(torch, threads: int, tokens: int, ws: list) -> dict:
    torch.set_num_threads(threads)
    x = torch.randn(tokens, K, dtype=torch.float32)
    for w in ws:  # warm: page the copies in, let the threads start
        x @ w
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < MIN_S:
        for w in ws:
            x @ w
            n += 1
    s = (time.perf_counter() - t0) / n
    return {"kind": "cpu_gemm", "threads": threads, "tokens": tokens, "ms": s * 1e3,
            "weight_gb_s": K * N * 4 / s / 1e9, "gflop_s": 2 * tokens * K * N / s / 1e9}


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="a .jsonl file, written anew")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 32, 128, 512, 1024])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    ws = [torch.randn(K, N, dtype=torch.float32) * 0.02 for _ in range(COPIES)]
    rows = [{"kind": "host", "machine": platform.machine(), "processor": platform.processor(),
             "cpu_model": _cpu_model(), "mem_total_bytes": _mem_total(), "torch": torch.__version__,
             "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}]
    # the machine is shared: every cell `--repeats` times, interleaved, all kept (the step-cost
    # data file cites the best of them as what the GEMM reaches)
    for rep in range(args.repeats):
        for threads in (1, 2):
            for t in args.tokens:
                rows.append({**cell(torch, threads, t, ws), "repeat": rep})
                r = rows[-1]
                print(f"repeat {rep} threads={threads} T={t:<5} {r['ms']:8.3f} ms  "
                      f"{r['weight_gb_s']:6.2f} GB/s of weights  {r['gflop_s']:7.1f} GFLOP/s",
                      flush=True)
    print(f"host: {rows[0]}", flush=True)
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


def _mem_total() -> int | None:
    """/proc/meminfo's MemTotal in bytes (the file says kB: KiB)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
