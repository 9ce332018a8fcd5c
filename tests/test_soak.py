"""A bounded soak: 64 concurrent streams (completions and chat, greedy and sampled, some with
stop strings), then streams that disconnect mid-way among streams that finish. No errors, the
counters agree with what the clients received, and nothing leaks: no request left running or
waiting, no KV in use, the server's RSS back within a bound."""

import asyncio
import json
import random
import time

import aiohttp
import psutil
import pytest
import requests

from test_serve import delta, wait_idle

N_STREAMS = 64
RSS_BOUND = 48 * 2**20  # bytes the server may grow by across the soak (allocator noise)


def _body(model: str, i: int) -> tuple[str, dict]:
    rng = random.Random(i)
    common = {"model": model, "stream": True, "ignore_eos": rng.random() < 0.7,
              "temperature": rng.choice([0.0, 0.7, 1.0]), "seed": i,
              "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    if rng.random() < 0.3:
        common["stop"] = [rng.choice(["e", "the", "\n\n", ")"])]
    if i % 2:
        return "/v1/chat/completions", {**common, "max_completion_tokens": rng.randint(4, 24),
                                        "messages": [{"role": "user", "content": f"q {i}"}]}
    return "/v1/completions", {**common, "max_tokens": rng.randint(4, 24),
                               "prompt": f"def f_{i}(x):\n    return"}


async def _stream(session, url: str, path: str, body: dict, hang_up: bool = False) -> dict:
    """Read one SSE stream; return tokens received (from continuous usage) and its end."""
    seen, finish, done = 0, None, False
    async with session.post(f"{url}{path}", json=body) as r:
        assert r.status == 200, await r.text()
        async for raw in r.content:
            line = raw.decode().strip()
            if not line:
                continue
            assert line.startswith("data: ")
            if line == "data: [DONE]":
                done = True
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            if chunk["choices"]:
                finish = chunk["choices"][0]["finish_reason"] or finish
                seen = chunk["usage"]["completion_tokens"]
            else:
                assert chunk["usage"]["completion_tokens"] == seen
            if hang_up:
                return {"hung_up": True}
    return {"tokens": seen, "finish": finish, "done": done}


async def _run(url: str, model: str, indices, hang_up=frozenset()) -> list[dict]:
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        return await asyncio.gather(*[_stream(session, url, *_body(model, i), i in hang_up)
                                      for i in indices])


def _rss(url) -> int:
    return psutil.Process(url.process.pid).memory_info().rss


@pytest.mark.timeout(120)
def test_soak_64_concurrent_streams(embedded_server):
    url = embedded_server
    model = requests.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    asyncio.run(_run(url, model, range(1000, 1000 + N_STREAMS)))  # warm up the allocator
    before = wait_idle(url)
    rss0 = _rss(url)
    t0 = time.monotonic()
    results = asyncio.run(_run(url, model, range(N_STREAMS)))
    wall = time.monotonic() - t0
    after = wait_idle(url)
    assert all(r["done"] and r["finish"] in ("stop", "length") for r in results)
    received = sum(r["tokens"] for r in results)
    assert delta(before, after, "vllm:generation_tokens_total") == received
    assert sum(delta(before, after, f"vllm:request_success_total|finished_reason={reason}")
               for reason in ("stop", "length")) == N_STREAMS
    assert delta(before, after, "vllm:e2e_request_latency_seconds_count") == N_STREAMS
    # half the streams hang up after their first chunk, among streams that finish
    indices = range(2000, 2000 + N_STREAMS)
    hang_up = frozenset(i for i in indices if i % 2 == 0)
    mixed = asyncio.run(_run(url, model, indices, hang_up))
    final = wait_idle(url)
    assert all(r.get("hung_up") or r["done"] for r in mixed)
    assert delta(after, final, "vllm:request_success_total|finished_reason=error") == 0
    finished = sum(delta(after, final, f"vllm:request_success_total|finished_reason={reason}")
                   for reason in ("stop", "length", "abort"))
    assert finished == N_STREAMS
    growth = _rss(url) - rss0
    assert growth < RSS_BOUND, f"server RSS grew by {growth / 2**20:.1f} MiB"
    print(f"soak: {N_STREAMS} streams, {received} tokens in {wall:.1f} s; "
          f"RSS growth {growth / 2**20:.1f} MiB")
