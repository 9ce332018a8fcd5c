"""Does a real engine load each exported drafter and serve with it? One command on a GPU box.

    python3 scripts/engine_load_check.py vllm|sglang --model models/embedded \
        --drafters build/engine-drafters --out DIR [--only NAME ...]

Starts one server per drafter (`specrepro export-drafters` folders: DIR/<engine>/<name>) plus one
without speculation on one GPU at a small memory share each (vLLM all at once; SGLang one after
another: it sizes its KV pool from the memory that fell free while it loaded its weights, so a
neighbour allocating meanwhile fails it with "Loaded weights leave no GPU memory for the KV
cache", as the first run of 2026-12-01 did), waits until each can generate, sends each the same greedy prompts, and reads each server's speculative counters
before and after. Writes into --out, per server: the startup log, /metrics before and after the
requests, the version endpoint's answer, the responses; and `summary.json`. Prints per server
whether it loaded, the drafts it made and accepted, and whether its greedy text equals the
no-speculation server's (speculative decoding is lossless, so it should).

The engines' flags are the ones docs/engines.md gives for vLLM 0.26.0 and SGLang 0.5.14. Only the
standard library: it runs on the GPU image beside the engine bundles' environment scripts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

PROMPTS = [
    ("Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many"
     " clips in May. How many clips did Natalia sell altogether in April and May?\nAnswer:"),
    "def fibonacci(n):\n",
    "The history of the city begins",
]
MAX_TOKENS = 64
# method -> (k, vLLM speculative-config method, SGLang algorithm)
METHODS = {"dflash": (7, "dflash", "DFLASH"), "mtp": (3, "eagle", "EAGLE")}


def vllm_argv(model: Path, port: int, drafter: Path | None, method: str | None) -> list[str]:
    argv = ["vllm", "serve", str(model), "--port", str(port), "--gpu-memory-utilization", "0.15",
            "--max-model-len", "2048", "--max-num-seqs", "8", "--no-enable-prefix-caching",
            "--enforce-eager", "--seed", "0"]
    if drafter is not None:
        k, name, _ = METHODS[method]
        argv += ["--speculative-config", json.dumps(
            {"method": name, "model": str(drafter), "num_speculative_tokens": k})]
    return argv


def sglang_argv(model: Path, port: int, drafter: Path | None, method: str | None) -> list[str]:
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model),
            "--port", str(port), "--mem-fraction-static", "0.12", "--context-length", "2048",
            "--max-running-requests", "8", "--disable-radix-cache", "--disable-cuda-graph",
            "--attention-backend", "triton", "--sampling-backend", "pytorch",
            "--enable-metrics", "--random-seed", "0"]
    if drafter is not None:
        k, _, algo = METHODS[method]
        argv += ["--speculative-algorithm", algo, "--speculative-draft-model-path", str(drafter)]
        if algo == "DFLASH":
            argv += ["--speculative-num-draft-tokens", str(k + 1)]
        else:
            argv += ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                     "--speculative-num-draft-tokens", str(k + 1)]
    return argv


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as e:
        return 0, str(e)


def post(url: str, body: dict, timeout: float = 120.0) -> tuple[int, dict | str]:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as e:
        return 0, str(e)


def counters(engine: str, text: str) -> dict[str, float]:
    """The speculative counters of a /metrics text (name with labels -> value)."""
    keep = ("vllm:spec_decode", "sglang:spec", "sglang:num_requests_total",
            "sglang:generation_tokens_total", "vllm:generation_tokens_total")
    out = {}
    for line in text.splitlines():
        if line.startswith(keep) and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("engine", choices=("vllm", "sglang"))
    ap.add_argument("--model", type=Path, default=Path("models/embedded"))
    ap.add_argument("--drafters", type=Path, default=Path("build/engine-drafters"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", action="append", default=[], metavar="NAME")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="seconds each server may take to become ready")
    args = ap.parse_args(argv)
    model = args.model.resolve()
    root = args.drafters.resolve() / args.engine
    names = args.only or sorted(p.name for p in root.iterdir() if p.is_dir())
    servers = {"none": (None, None)}
    for name in names:
        cfg = json.loads((root / name / "config.json").read_text())
        method = "dflash" if cfg["architectures"] == ["DFlashDraftModel"] else "mtp"
        servers[name] = (root / name, method)
    args.out.mkdir(parents=True, exist_ok=True)
    build = vllm_argv if args.engine == "vllm" else sglang_argv
    ready_path = "/health" if args.engine == "vllm" else "/health_generate"
    procs, summary, t0 = {}, {}, time.time()

    def start(i, name, drafter, method):
        port = 8100 + i
        cmd = build(model, port, drafter, method)
        log = open(args.out / f"{name}.log", "w")  # noqa: SIM115 (closed after the server stops)
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        procs[name] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                        env=os.environ.copy()), port, log, time.time())

    def wait_ready(pending):
        while pending and time.time() - t0 < args.timeout * len(servers):
            for name in list(pending):
                p, port, _, started = procs[name]
                if p.poll() is not None:
                    summary[name] = {"loaded": False, "exit_code": p.returncode}
                    pending.remove(name)
                elif get(f"http://127.0.0.1:{port}{ready_path}", 3)[0] == 200:
                    summary[name] = {"loaded": True, "ready_s": round(time.time() - started, 1)}
                    pending.remove(name)
                elif time.time() - started > args.timeout:
                    summary[name] = {"loaded": False,
                                     "error": f"not ready after {args.timeout:.0f} s"}
                    pending.remove(name)
            time.sleep(1)

    for i, (name, (drafter, method)) in enumerate(servers.items()):
        start(i, name, drafter, method)
        if args.engine == "sglang":  # one at a time (the module docstring)
            wait_ready([name])
    wait_ready([n for n in procs if n not in summary])
    for name, (p, port, _, _) in procs.items():
        s = summary[name]
        if not s["loaded"]:
            continue
        base = f"http://127.0.0.1:{port}"
        for ep in ("/version", "/server_info", "/get_server_info", "/v1/models"):
            code, text = get(base + ep)
            (args.out / f"{name}.{ep.strip('/').replace('/', '_')}.txt").write_text(f"{code}\n{text}")
        before = get(base + "/metrics")[1]
        (args.out / f"{name}.metrics-before.txt").write_text(before)
        texts, native = [], []
        for prompt in PROMPTS:
            code, r = post(base + "/v1/completions", {"model": str(model), "prompt": prompt,
                                                      "max_tokens": MAX_TOKENS, "temperature": 0})
            texts.append(r["choices"][0]["text"] if code == 200 else f"HTTP {code}: {r}")
            if args.engine == "sglang":  # per-request acceptance is only in meta_info
                code, r = post(base + "/generate", {"text": prompt, "sampling_params": {
                    "max_new_tokens": MAX_TOKENS, "temperature": 0}})
                native.append(r.get("meta_info") if code == 200 else f"HTTP {code}: {r}")
        after = get(base + "/metrics")[1]
        (args.out / f"{name}.metrics-after.txt").write_text(after)
        c0, c1 = counters(args.engine, before), counters(args.engine, after)
        s["counters_moved"] = {k: v - c0.get(k, 0.0) for k, v in c1.items()
                               if v != c0.get(k, 0.0)}
        s["texts"] = texts
        if native:
            s["meta_info"] = native
    ref = summary.get("none", {}).get("texts")
    for name, s in summary.items():
        if name != "none" and s.get("texts") and ref:
            s["same_text_as_no_speculation"] = [a == b for a, b in zip(s["texts"], ref)]
    for p, _, _, _ in procs.values():
        p.terminate()
    for p, _, log, _ in procs.values():
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
        log.close()
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for name, s in summary.items():
        moved = {k: v for k, v in s.get("counters_moved", {}).items() if "spec" in k}
        print(f"{args.engine} {name}: loaded {s['loaded']}"
              + (f" in {s['ready_s']} s" if "ready_s" in s else f" ({s})")
              + (f"; same text as no speculation {s['same_text_as_no_speculation']}"
                 if "same_text_as_no_speculation" in s else "")
              + (f"; spec counters moved {moved}" if moved else ""))
    return 0 if all(s["loaded"] for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
