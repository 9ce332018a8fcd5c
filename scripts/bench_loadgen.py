"""Is the load generator ever the bottleneck? Streamed tokens per second one core can consume.

A fake OpenAI server (aiohttp, in this process, on the same event loop as the client)
streams vLLM-shaped chat chunks as fast as it can: one token per chunk (the worst case for
the client: the most chunks to parse per token), with continuous usage and token ids, as
the harness asks real engines. The harness's own `LoadGenerator` drives it with N
closed-loop streams. The process is pinned to one CPU, so the figure is what one core does
while *also* producing the stream: a lower bound on the client's capacity. It is compared
with the fastest rate an article arm needs: article B's 1,617.5 tok/s at 32 streams.

    python scripts/bench_loadgen.py [--streams 32] [--requests 128] [--tokens 256]

Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

from aiohttp import web

from specrepro.harness.loadgen import LoadConfig, LoadGenerator
from specrepro.workloads import Prompt

NEEDED_TOK_S = 1617.5  # article B: the fastest arm's aggregate rate, 32 streams


def chunk(i: int, token: int, prompt_tokens: int, finish: str | None = None) -> bytes:
    body = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0,
            "model": "bench",
            "choices": [{"index": 0, "delta": {"content": " tok"}, "logprobs": None,
                         "finish_reason": finish, "stop_reason": None, "token_ids": [token]}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": i,
                      "total_tokens": prompt_tokens + i}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def fake_chat(request: web.Request) -> web.StreamResponse:
    """Stream max_completion_tokens one-token chunks with no pause, then usage and [DONE]."""
    body = await request.json()
    n, prompt_tokens = int(body["max_completion_tokens"]), 12
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(1, n + 1):
        await resp.write(chunk(i, 1000 + i % 100, prompt_tokens,
                               "length" if i == n else None))
    usage = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0,
             "model": "bench", "choices": [],
             "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                       "total_tokens": prompt_tokens + n}}
    await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def bench(streams: int, requests: int, tokens: int) -> dict:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake_chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    prompts = [Prompt(id=f"b{i}", workload="bench", max_tokens=tokens,
                      messages=[{"role": "user", "content": "go"}]) for i in range(requests)]
    gen = LoadGenerator(LoadConfig(url=url, model="bench", concurrency=streams))  # vLLM's features
    cpu0 = time.process_time()
    result = await gen.arun(prompts)
    cpu = time.process_time() - cpu0
    await runner.cleanup()
    received = sum(r.completion_tokens or 0 for r in result.records)
    errors = [r.error for r in result.records if r.error]
    if errors:
        raise SystemExit(f"bench: {len(errors)} requests failed, first: {errors[0]}")
    parsed = sum(len(r.itl_s) + 1 for r in result.records)
    if parsed != received:
        raise SystemExit(f"bench: parsed {parsed} tokens, usage says {received}")
    rate = received / result.wall_s
    return {"streams": streams, "requests": requests, "tokens_per_request": tokens,
            "tokens": received, "wall_s": round(result.wall_s, 3), "cpu_s": round(cpu, 3),
            "tok_s": round(rate, 1), "needed_tok_s": NEEDED_TOK_S,
            "headroom": round(rate / NEEDED_TOK_S, 2), "cpus": sorted(os.sched_getaffinity(0))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=256, help="tokens per request")
    ap.add_argument("--cpu", type=int, default=None, help="pin to this CPU (default: the first)")
    args = ap.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {args.cpu if args.cpu is not None else cpus[0]})
    res = asyncio.run(bench(args.streams, args.requests, args.tokens))
    print(f"{'streams':>8} {'tokens':>8} {'wall s':>8} {'cpu s':>7} {'tok/s':>9} "
          f"{'needed':>8} {'headroom':>9}")
    print(f"{res['streams']:>8} {res['tokens']:>8} {res['wall_s']:>8.2f} {res['cpu_s']:>7.2f} "
          f"{res['tok_s']:>9.1f} {NEEDED_TOK_S:>8.1f} {res['headroom']:>8.1f}x")
    print(json.dumps(res))
    return 0 if res["tok_s"] > NEEDED_TOK_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
