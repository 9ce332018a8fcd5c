"""The stand-in's roofline from scripts/bench_standin.py's cells: a figure and a table.

    python scripts/plot_standin_roofline.py docs/bench/standin-h200-2026-12-0[34]/r*-cells.jsonl \
        --target-bytes 22542553600 --out docs/bench/standin-h200-2026-12-04/roofline.png

Each speed cell is a point: tokens per step (vLLM's own scheduled tokens; for SGLang and the
embedded engine, which count no steps, the requests running times 1 + k) against the step
time over the cell's steady window (vLLM's step count; elsewhere streams x tokens per step /
tok/s). The floor is what the card's measured GEMMs allow: the weights read
at the bandwidth a one-token GEMM reached (`--gemm` rows, the best of T <= 128), or the
step's FLOPs (2 per weight per token) at the best bf16 FLOP/s any T reached, whichever is
longer. Prints the points as a Markdown table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ENGINES = ("vLLM 0.26.0", "SGLang 0.5.14", "embedded, compiled", "embedded, eager")
ARMS = {"no speculation": "o", "random weights": "o", "block drafter k=7": "s",
        "EAGLE head k=3": "^"}


def server_engine_arm(server: str) -> tuple[str, str]:
    """A bench server's name (params/standin/bench-h200.yaml) -> (engine, arm)."""
    engine = ("SGLang 0.5.14" if server.startswith("sg-") else
              "embedded, compiled" if server.startswith("emb-") and "compiled" in server else
              "embedded, eager" if server.startswith("emb-") else "vLLM 0.26.0")
    arm = ("random weights" if server.startswith("dummy") else
           "block drafter k=7" if "dflash-k7" in server else
           "EAGLE head k=3" if "eagle-k3" in server else "no speculation")
    return engine, arm


def tokens_per_step(r: dict) -> float:
    """The target pass's tokens per step: vLLM's own count where it has one; else the
    requests running (the streams, or fewer at the window's end) times 1 + k drafts."""
    if r.get("scheduled_tokens_per_step"):
        return r["scheduled_tokens_per_step"]
    k = 7 if "dflash-k7" in r["server"] else 3 if "eagle-k3" in r["server"] else 0
    running = min(r["concurrency"], r.get("running_at_end") or r["concurrency"])
    return running * (1 + k)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cells", nargs="+", type=Path)
    ap.add_argument("--target-bytes", type=float, required=True, help="the target's weight bytes")
    ap.add_argument("--out", type=Path, required=True, help="the figure (PNG)")
    args = ap.parse_args(argv)
    rows = [json.loads(line) for p in args.cells for line in p.read_text().splitlines() if line]
    gemm = [r for r in rows if r["kind"] == "gemm" and not r["zeros"]]
    if not gemm:
        raise SystemExit("no --gemm rows among the cells: the floor needs the card's GEMMs")
    bw = max(r["weight_tb_s"] for r in gemm if r["tokens"] <= 128) * 1e12  # bytes/s
    flops = max(r["tflop_s"] for r in gemm) * 1e12
    params = args.target_bytes / 2  # bf16

    def floor_ms(t: float) -> float:
        return 1e3 * max(args.target_bytes / bw, 2 * params * t / flops)

    speed = [r for r in rows if r["kind"] == "speed" and r.get("step_ms")]
    for r in speed:
        r["engine"], r["arm"] = server_engine_arm(r["server"])
        r["tokens_per_step"] = tokens_per_step(r)
    fig, ax = plt.subplots(figsize=(9, 6.4), layout="constrained")
    colors = dict(zip(ENGINES, ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    for engine in ENGINES:
        for arm, marker in ARMS.items():
            pts = sorted((r["tokens_per_step"], r["step_ms"]) for r in speed
                         if r["engine"] == engine and r["arm"] == arm)
            if pts:
                ax.plot(*zip(*pts), marker=marker, linestyle="none", color=colors[engine],
                        fillstyle="none" if arm == "random weights" else "full",
                        label=f"{engine}: {arm}")
    xs = [1 * 1.25**i for i in range(40)]
    ax.plot(xs, [floor_ms(x) for x in xs], color="black", linewidth=1,
            label=f"floor: {args.target_bytes / 1e9:.1f} GB at {bw / 1e12:.2f} TB/s, "
                  f"or its FLOPs at {flops / 1e12:.0f} TFLOP/s")
    ax.set(xscale="log", yscale="log", xlabel="tokens per step (target pass)",
           ylabel="step time (ms)", title="The stand-in on one H200: three engines")
    fig.legend(fontsize=7, loc="outside lower center", ncols=3)
    ax.grid(True, which="both", alpha=0.3)
    fig.savefig(args.out, dpi=120)
    print(f"bandwidth {bw / 1e12:.2f} TB/s, compute {flops / 1e12:.0f} TFLOP/s, "
          f"ridge {args.target_bytes / bw / (2 * params / flops):.0f} tokens per step")
    print("| engine | arm | streams | tokens/step | step ms | floor ms | floor/step | tok/s |"
          " accept | W | GPU util % | at |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in speed:
        t, s = r["tokens_per_step"], r["step_ms"]
        acc = f"{r['acceptance_length']:.2f}" if r.get("acceptance_length") else "-"
        print(f"| {r['engine']} | {r['arm']} | {r['concurrency']} | {t:.1f} | {s:.2f} | "
              f"{floor_ms(t):.2f} | {floor_ms(t) / s:.0%} | {r['client_tok_s']:,.1f} | {acc} | "
              f"{r['power_w']:.0f} | {r['gpu_util_pct']:.0f} | {r.get('at', '-')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
