"""Feed `specrepro serve` bad inputs and print a markdown table of what each answers: the
first line it prints (stderr, INFO lines skipped) and its exit status, or for a request the
HTTP status and the error's first line. docs/bench/bad-inputs-serve-*.md keep its output.

Usage (from the repository root): python scripts/bad_inputs_serve.py [--model models/embedded]

- Start-up: one `python -m specrepro.cli serve` per bad flag, on models/embedded, a 60 s
  limit each (a flag that is not refused shows as "served" and is stopped).
- Requests: one server with `--api-key`, on a free loopback port; the bodies and the key are
  sent to it. While each 10 MB body is refused, /health is probed and its slowest answer
  reported. Only 127.0.0.1 is ever contacted.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

KEY = "k-41"
BIG = 10 * 1000 * 1000  # bytes of a large body


def first_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("INFO ")]
    line = lines[0] if lines else "(nothing)"
    return re.sub(r"^(ERROR|WARNING) \d\d-\d\d \d\d:\d\d:\d\d ", r"\1 ", line)


def start_case(model: str, flags: list[str]) -> tuple[str, str]:
    cmd = [sys.executable, "-m", "specrepro.cli", "serve", "--model", model, *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=60)
        return first_line(out), str(proc.returncode)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
        return "served (not refused): " + first_line(out), f"{proc.returncode} (stopped)"


def start_cases(taken: int) -> list[tuple[str, list[str]]]:
    spec = "--speculative-config"
    return [(" ".join(f) if f else "", f) for f in (
        ["--port", "99999"], ["--port", "-1"], ["--port", "abc"], ["--port", str(taken)],
        ["--host", "999.1.1.1"], ["--host", "nosuchhost.invalid"], ["--host", "10.255.255.1"],
        ["--device", "cuda"], ["--device", "tpu"], ["--dtype", "float16"],
        ["--quantization", "int8"], ["--kv-cache-memory-bytes", "10"],
        ["--kv-cache-memory-bytes", "-5"], ["--kv-cache-memory-bytes", "1000000"],
        ["--max-model-len", "100000"], ["--max-model-len", "0"], ["--max-model-len", "abc"],
        ["--max-num-seqs", "0"], ["--max-num-batched-tokens", "0"], ["--max-waiting", "0"],
        ["--threads", "0"], ["--served-model-name", ""], ["--api-key", ""],
        ["--log-file", "/nonexistent/serve.log"], ["--profile-dir", "/proc/no-such-dir"],
        [spec, "{bad"], [spec, '{"method": "eagle", "num_speculative_tokens": 3}'],
        [spec, '{"method": "dflash"}'], [spec, '{"method": "dflash", "num_speculative_tokens": 1000}'],
        ["--default-chat-template-kwargs", "[1]"], ["--compile-scope", "x"],
        ["--per-request-spec-decode-metrics", "all"], ["--seed", "abc"], ["--no-such-flag"])]


def serve_for_requests(model: str, log: Path) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "specrepro.cli", "serve", "--model", model, "--port", "0",
           "--api-key", KEY]
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        m = re.search(r"Starting specrepro embedded server on (http://\S+)", log.read_text())
        if m:
            return proc, m.group(1)
        if proc.poll() is not None:
            raise SystemExit(f"the server exited: {log.read_text()}")
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit("the server was not ready in 180 s")


def answer(r: requests.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return r.text.splitlines()[0][:200] if r.text else "(empty)"
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        return err.get("message", "")[:300]
    return json.dumps(body)[:200]


def timed_with_health(url: str, post) -> tuple[requests.Response, float, float, int]:
    """post() while /health is probed: (response, its seconds, slowest probe s, probes)."""
    done, out, waits = threading.Event(), {}, []

    def run():
        t0 = time.monotonic()
        out["r"] = post()
        out["s"] = time.monotonic() - t0
        done.set()
    t = threading.Thread(target=run)
    t.start()
    while not done.is_set():
        t0 = time.monotonic()
        requests.get(f"{url}/health", timeout=120)
        waits.append(time.monotonic() - t0)
        time.sleep(0.005)
    t.join()
    return out["r"], out["s"], max(waits, default=0.0), len(waits)


def request_cases(url: str, log: Path) -> list[tuple[str, str, str]]:
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    rows = []

    def post(path, data, headers=auth, what=""):
        r = requests.post(f"{url}{path}", data=data, headers=headers, timeout=120)
        rows.append((what, answer(r), str(r.status_code)))
    ok = json.dumps({"model": "embedded", "prompt": "a", "max_tokens": 2})
    post("/v1/completions", ok, {"Content-Type": "application/json"}, "/v1 request, no key")
    post("/v1/completions", ok, {**auth, "Authorization": "Bearer wrong"}, "/v1 request, wrong key")
    r = requests.get(f"{url}/health", timeout=10)
    rows.append(("GET /health, no key", "(empty body: open, as vLLM's)", str(r.status_code)))
    post("/v1/completions", ok, what="model `embedded` (the profiles' id), right key")
    post("/v1/completions", ok.replace('"embedded"', '"models/embedded"'),
         what="model `models/embedded` (the path)")
    post("/v1/completions", ok.replace('"embedded"', '"nope"'), what="model `nope`")
    post("/v1/completions", "{not json", what="malformed JSON body")
    text = "word " * (BIG // 5)
    bodies = {"10 MB prompt (a string)": ("/v1/completions", {"prompt": text}),
              "10 MB chat message": ("/v1/chat/completions",
                                     {"messages": [{"role": "user", "content": text}]}),
              "10 MB prompt of token ids": ("/v1/completions",
                                            {"prompt": list(range(10, 10 + BIG // 7))})}
    for what, (path, fields) in bodies.items():
        body = json.dumps({"model": "embedded", "max_tokens": 4, **fields}).encode()
        r, s, slowest, n = timed_with_health(url, lambda p=path, b=body: requests.post(
            f"{url}{p}", data=b, headers=auth, timeout=120))
        rows.append((f"{what}: {len(body) / 1e6:.1f} MB body",
                     (f"{answer(r)[:160]}... (answered in {s * 1000:.0f} ms; /health "
                      f"slowest {slowest * 1000:.0f} ms over {n} probes)"), str(r.status_code)))
    post("/v1/completions", b"{" + b" " * (65 * 1024 * 1024) + b"}", what="65 MiB body")
    r = requests.post(f"{url}/v1/completions", stream=True, headers=auth, timeout=60, json={
        "model": "embedded", "prompt": "a", "max_tokens": 400, "ignore_eos": True,
        "stream": True})
    next(line for line in r.iter_lines() if line)
    r.close()  # a client gone mid-stream
    time.sleep(1.0)
    gone = [ln for ln in log.read_text().splitlines() if "went away" in ln or "Traceback" in ln]
    rows.append(("client disconnects mid-stream", " / ".join(
        re.sub(r"^INFO \d\d-\d\d \d\d:\d\d:\d\d ", "INFO ", ln) for ln in gone)
        or "(nothing logged)", "log"))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/embedded")
    ap.add_argument("--requests-only", action="store_true", help="skip the start-up flags")
    args = ap.parse_args()
    rows = []
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        for what, flags in [] if args.requests_only else start_cases(busy.getsockname()[1]):
            line, rc = start_case(args.model, flags)
            rows.append((f"`serve {what}`", line, rc))
            print(f"{what}: {rc} {line}", file=sys.stderr, flush=True)
    log = Path(f"/tmp/bad-inputs-serve-{time.time_ns()}.log")
    proc, url = serve_for_requests(args.model, log)
    try:
        rows += request_cases(url, log)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print("| # | input | first line it prints (or the HTTP answer) | rc / HTTP |")
    print("| --- | --- | --- | --- |")
    for i, (what, line, rc) in enumerate(rows, 1):
        cell = line.replace("|", "\\|")
        print(f"| {i} | {what} | {cell} | {rc} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
