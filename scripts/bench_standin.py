"""The stand-in on a GPU through the harness: roofline, cost against random weights, acceptance.

    python scripts/bench_standin.py params/standin/bench-h200.yaml --phase roofline --out DIR
    python scripts/bench_standin.py --gemm --out DIR      # the card's GEMM bandwidth and FLOP/s

Each phase of the plan starts its servers side by side (the profiles in params/profiles/,
with the plan's port, KV bytes and a compile cache of its own), then measures its cells one
at a time. A speed cell keeps `concurrency` streams busy and reads a steady window (the
harness's, harness/steady.py: from `skip_s` after the load starts, once every stream has a
token, for `window_s`) off the engine's own counters (steps, scheduled tokens, generated tokens, drafts and accepted drafts) and NVML
(board power, GPU utilization, every 0.2 s); an acceptance cell sends each prompt once,
greedy, to its natural end. Each cell is one JSON line in DIR/cells.jsonl (appended), each
engine's log in DIR/logs/, and a table is printed. `--gemm` times x[T, K] @ W[K, N] in bf16
over weights larger than L2, the bandwidth floor and compute ceiling the roofline is drawn
against. Nothing here is a test: it prints figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30


class Nvml:
    """Board power (W) and GPU utilization (%) of device 0 sampled every `interval_s`."""

    def __init__(self, interval_s: float = 0.2):
        import pynvml

        self.nv, self.interval, self.h = pynvml, interval_s, None
        self.samples: list[tuple[float, float, int]] = []
        self._stop = threading.Event()
        try:
            pynvml.nvmlInit()
            self.h = pynvml.nvmlDeviceGetHandleByIndex(0)
        except pynvml.NVMLError as e:  # no GPU here: the cells go on without power
            print(f"no NVML ({e}): power and utilization not measured", flush=True)
            return
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                w = self.nv.nvmlDeviceGetPowerUsage(self.h) / 1000
                u = self.nv.nvmlDeviceGetUtilizationRates(self.h).gpu
            except self.nv.NVMLError:
                continue
            self.samples.append((time.monotonic(), w, u))

    def energy_j(self) -> float | None:
        return None if self.h is None else self.nv.nvmlDeviceGetTotalEnergyConsumption(self.h) / 1000

    def over(self, t0: float, t1: float) -> dict:
        inside = [(w, u) for t, w, u in self.samples if t0 <= t <= t1]
        if not inside:
            return {"power_w": None, "gpu_util_pct": None, "nvml_samples": 0}
        return {"power_w": sum(w for w, _ in inside) / len(inside),
                "power_w_max": max(w for w, _ in inside),
                "gpu_util_pct": sum(u for _, u in inside) / len(inside),
                "nvml_samples": len(inside)}

    def close(self) -> None:
        self._stop.set()
        if self.h is not None:
            self._t.join(2)


def scalars(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text, summed over labels, by sample name."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text or ""):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def delta(a: dict, b: dict, name: str) -> float | None:
    return b[name] - a[name] if name in a and name in b else None


def speed_cell(handle, prompts, c: int, plan: dict, nvml: Nvml) -> dict:
    """One window at c streams; figures over its steady part."""
    from specrepro.harness.loadgen import LoadConfig, LoadGenerator
    from specrepro.params.window import Window

    sp = plan["speed"]
    lo, hi = sp["cap_spread"]
    spread = [replace(p, max_tokens=lo + (i * 37) % (hi - lo + 1), stop=())  # every request to its cap
              for i, p in enumerate(prompts)]
    marks: list[tuple[float, str, float]] = []

    def scrape():  # after warm-up, as the window opens and closes, after the drain
        now = time.monotonic()
        marks.append((now, handle.metrics_text() or "", nvml.energy_j()))
        return now

    # the harness's steady window, fixed to the plan's span: it opens skip_s after the load
    # starts (and once every stream has a token) and closes window_s later, whatever the
    # turnovers (max_window_s = window_s); the caps are the plan's own spread, above
    window = Window(skip_s=sp["skip_s"], window_s=sp["window_s"], max_window_s=sp["window_s"],
                    turnovers=1, cap_spread=0.0)
    cfg = LoadConfig(url=handle.url, model=handle.profile.model.served_name, concurrency=c,
                     steady=window, ignore_eos=True, features=handle.served_by.request_features)
    res = LoadGenerator(cfg).run(spread, scrape)
    (t0, m0, e0), (t1, m1, e1) = marks[1], marks[2]  # the window's opening and closing
    a, b = scalars(m0), scalars(m1)
    span = t1 - t0
    steps = delta(a, b, "vllm:iteration_tokens_total_count")
    sched = delta(a, b, "vllm:iteration_tokens_total_sum")
    gen = delta(a, b, "vllm:generation_tokens_total")
    client = sum(t0 <= t <= t1 for r in res.records for t in r.arrivals)
    row = {"kind": "speed", "concurrency": c, "span_s": span, "steps": steps,
           "step_ms": 1000 * span / steps if steps else None,
           "scheduled_tokens_per_step": sched / steps if steps else None,
           "engine_tok_s": gen / span if gen is not None else None,
           "client_tok_s": client / span, "running_at_end": b.get("vllm:num_requests_running"),
           "energy_j": e1 - e0 if e0 is not None else None, "failed": sum(not r.ok for r in res.records),
           **nvml.over(t0, t1), **accept(handle, m0, m1)}
    if row["step_ms"] is None and row["client_tok_s"]:  # engines without a step histogram
        row["step_ms"] = 1000 * c * (row["acceptance_length"] or 1) / row["client_tok_s"]
    row["tokens_per_joule"] = (gen / row["energy_j"]) if gen and row["energy_j"] else None
    return row


def accept(handle, m0: str, m1: str, records=()) -> dict:
    """Acceptance over two scrapes as the harness reads it (cells.acceptance): vLLM's and the
    embedded engine's counters, SGLang's per-response fields or else its counters."""
    from specrepro.harness import cells, promtext

    served = handle.served_by
    d = promtext.delta(promtext.parse(m0, served.metrics), promtext.parse(m1, served.metrics))
    a = cells.acceptance(d, list(records), served)
    return {"drafts": a["num_drafts"], "accepted": a["num_accepted_tokens"],
            "acceptance_length": a["acceptance_length"]}


def accept_cell(handle, prompts, c: int) -> dict:
    from specrepro.harness.loadgen import LoadConfig, LoadGenerator

    texts: list[str] = []
    cfg = LoadConfig(url=handle.url, model=handle.profile.model.served_name, concurrency=c,
                     features=handle.served_by.request_features)
    res = LoadGenerator(cfg).run(prompts, lambda: texts.append(handle.metrics_text() or ""))
    out = [r.text for r in sorted(res.records, key=lambda r: r.request_idx)]
    return {"kind": "accept", "concurrency": c, "wall_s": res.wall_s,
            "tokens": sum(r.completion_tokens or 0 for r in res.records),
            "failed": sum(not r.ok for r in res.records),
            "length_share": sum(r.finish_reason == "length" for r in res.records) / len(out),
            "outputs": out, **accept(handle, texts[0], texts[-1], res.records)}


def start(name: str, spec: dict, logs: Path):
    from specrepro.harness.engines import launch
    from specrepro.params.resolve import load_profile

    prof = load_profile(ROOT / "params" / "profiles" / f"{spec['profile']}.yaml")
    flags = {**prof.flags, **spec.get("flags", {})}
    env = dict(prof.env)
    if "kv_gib" in spec:  # vLLM side by side: no memory profiling, a compile cache each
        flags.update({"gpu-memory-utilization": 0.1,
                      "kv-cache-memory-bytes": int(spec["kv_gib"] * GIB)})
        env["VLLM_CACHE_ROOT"] = f"/tmp/specrepro-vllm-cache/{name}"
    prof = prof.model_copy(update={"port": spec["port"], "flags": flags, "env": env})
    t = time.monotonic()
    handle = launch(prof, logs, log_name=name)
    return handle, time.monotonic() - t


def run_phase(plan: dict, phase: str, out: Path) -> None:
    from specrepro.workloads import build_workload

    ph = plan["phases"][phase]
    prompts = build_workload(plan["workload"])
    logs = out / "logs"
    with ThreadPoolExecutor(len(ph["servers"])) as pool:
        futs = {}
        for name, spec in ph["servers"].items():
            futs[name] = pool.submit(start, name, spec, logs)
            time.sleep(5)  # staggered: each finds the memory the one before took
        handles = {}
        for name, f in futs.items():
            try:
                handles[name], ready = f.result()
                print(f"{name}: ready in {ready:.0f} s ({' '.join(handles[name].argv[-30:])})",
                      flush=True)
            except Exception as e:  # noqa: BLE001 - a server that failed is reported, others run
                print(f"{name}: did not start: {e}", flush=True)
    nvml = Nvml()
    try:
        for cell in ph["cells"] * ph.get("repeat", 1):  # repeats interleave the cells
            h = handles.get(cell["server"])
            if h is None:
                continue
            for c in cell["concurrency"]:
                row = (speed_cell(h, prompts, c, plan, nvml) if cell["kind"] == "speed"
                       else accept_cell(h, prompts, c))
                row.update(server=cell["server"], profile=h.profile.name, phase=phase,
                           at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
                with open(out / "cells.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(summary(row), flush=True)
    finally:
        nvml.close()
        for h in handles.values():
            h.stop()


def summary(r: dict) -> str:
    f = lambda k, fmt: (fmt % r[k]) if r.get(k) is not None else "-"
    if r["kind"] == "accept":
        return (f"{r['server']:<20} accept c={r['concurrency']:<4} tokens/step "
                f"{f('acceptance_length', '%.3f')}  ({r['drafts']} drafts, {r['tokens']} tokens,"
                f" {r['failed']} failed, {r['length_share']:.0%} at the cap)")
    return (f"{r['server']:<20} speed  c={r['concurrency']:<4} {f('client_tok_s', '%8.1f')} tok/s"
            f"  step {f('step_ms', '%6.2f')} ms  {f('scheduled_tokens_per_step', '%6.1f')} tok/step"
            f"  accept {f('acceptance_length', '%.2f')}  {f('power_w', '%5.0f')} W"
            f"  util {f('gpu_util_pct', '%3.0f')} %  running {f('running_at_end', '%.0f')}")


def gemm(out: Path) -> None:
    """x[T, K] @ W[K, N] in bf16, cycling over weights 4x the L2, timed with CUDA events."""
    import torch

    K, N, n_w = 4992, 19584, 6  # one stand-in MLP projection's shape; 6 x 196 MB
    ws = [torch.randn(K, N, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(n_w)]
    rows = []
    for zeros in (False, True):
        if zeros:
            ws = [torch.zeros_like(w) for w in ws]
        for T in (1, 8, 32, 64, 128, 256, 512, 1024, 2048):
            x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
            for w in ws:
                x @ w
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            reps = 60
            start.record()
            for i in range(reps):
                x @ ws[i % n_w]
            end.record()
            torch.cuda.synchronize()
            s = start.elapsed_time(end) / 1000 / reps
            rows.append({"kind": "gemm", "zeros": zeros, "tokens": T, "ms": s * 1000,
                         "weight_tb_s": K * N * 2 / s / 1e12, "tflop_s": 2 * T * K * N / s / 1e12})
            print(f"gemm {'zeros ' if zeros else 'random'} T={T:<5} {s * 1e3:7.3f} ms  "
                  f"{rows[-1]['weight_tb_s']:5.2f} TB/s of weights  {rows[-1]['tflop_s']:6.1f} "
                  "TFLOP/s", flush=True)
    with open(out / "cells.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def gemm_weights(out: Path, standin: Path) -> None:
    """The stand-in's own weights against random and zero ones of the same shapes: a GEMM
    loop held for 2 s per cell (time and board power), at 1, 256 and 1024 tokens."""
    import torch
    from safetensors import safe_open

    nvml = Nvml(0.1)
    rows = []
    with safe_open(str(standin / "model.safetensors"), "pt", device="cuda") as f:
        sets = {f"{kind} layer {i}": f.get_tensor(f"model.layers.{i}.mlp.{kind}_proj.weight")
                for kind in ("gate", "down") for i in (0, 20)}  # an original, a twin layer
    for name, w in list(sets.items()):
        if name.endswith("layer 0"):
            kind = name.split()[0]
            sets[f"{kind} random"] = torch.randn_like(w, dtype=torch.float32).mul(
                float(w.float().std())).to(w.dtype)
            sets[f"{kind} zeros"] = torch.zeros_like(w)
    for T in (1, 256, 1024):
        for name, w in sets.items():  # w [out, in]: y = x @ w.T, as a Linear
            ws = [w] + [w.clone() for _ in range(3)]  # 4 copies: past the 50-MB L2
            x = torch.randn(T, w.shape[1], device="cuda", dtype=w.dtype)
            for v in ws:
                x @ v.T
            torch.cuda.synchronize()
            n, t0 = 0, time.monotonic()
            while time.monotonic() - t0 < 2.0:
                for _ in range(20):
                    x @ ws[n % 4].T
                    n += 1
                torch.cuda.synchronize()
            t1 = time.monotonic()
            s = (t1 - t0) / n
            p = nvml.over(t0 + 0.5, t1)
            rows.append({"kind": "gemm_weights", "weights": name, "tokens": T, "ms": s * 1e3,
                         "tflop_s": 2 * T * w.numel() / s / 1e12, **p})
            print(f"{name:<16} T={T:<5} {s * 1e3:7.3f} ms {rows[-1]['tflop_s']:6.1f} TFLOP/s "
                  f"{p['power_w'] or 0:5.0f} W", flush=True)
            del ws
    nvml.close()
    with open(out / "cells.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("plan", nargs="?", help="params/standin/bench-*.yaml")
    ap.add_argument("--phase", action="append", default=[], help="a phase of the plan (repeat)")
    ap.add_argument("--gemm", action="store_true", help="time the card's GEMMs first")
    ap.add_argument("--gemm-weights", metavar="TARGET",
                    help="time the stand-in's own MLP weights (TARGET: its target/ folder) "
                         "against random and zero ones")
    ap.add_argument("--out", required=True, help="folder for cells.jsonl and logs/")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.gemm:
        gemm(out)
    if args.gemm_weights:
        gemm_weights(out, Path(args.gemm_weights))
    if args.phase:
        plan = yaml.safe_load(Path(args.plan).read_text())
        for phase in args.phase:
            if phase not in plan["phases"]:
                print(f"{args.plan}: no phase {phase!r} (phases: {list(plan['phases'])})",
                      file=sys.stderr)
                return 2
            run_phase(plan, phase, out)
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)  # profiles name models relative to the repository root
    sys.exit(main())
