"""A fake vLLM-like engine for the steady-window and interleave tests: OpenAI streaming
completions from a stepped scheduler, vLLM's counter and gauge names on /metrics.

Every `step_s` the scheduler admits waiting requests into free slots (at most `slots`
running) and emits one token to each running request; a request ends at its max_tokens.
The first step after the engine has been idle takes `cold_s` (a warm-up the window must
leave out). Each step is logged as (time.monotonic() at its end, requests running,
tokens emitted), so a test can read what the engine did inside any interval. Served from
a thread of the test process (conftest.ThreadedApp): monotonic clocks agree.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from aiohttp import web

from conftest import ThreadedApp


class FakeEngine(ThreadedApp):
    def __init__(self, slots: int = 8, step_s: float = 0.01, cold_s: float = 0.0,
                 version: str = "0.0.fake"):
        self.slots, self.step_s, self.cold_s, self.version = slots, step_s, cold_s, version
        self.waiting: list[dict] = []
        self.running: list[dict] = []
        self.steps: list[tuple[float, int, int]] = []  # (end, running, tokens)
        self.generation = self.prompt = 0
        self.success = 0
        self.requests = 0
        super().__init__()

    async def make_app(self) -> web.Application:
        app = web.Application()
        async def health(request):
            return web.Response(text="ok")

        async def version(request):
            return web.json_response({"version": self.version})

        async def models(request):
            return web.json_response({"data": [{"id": "fake"}]})

        app.router.add_get("/health", health)
        app.router.add_get("/version", version)
        app.router.add_get("/v1/models", models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.completions)
        self.wake = asyncio.Event()
        self.loop_task = asyncio.create_task(self.schedule())
        return app

    async def cleanup(self) -> None:
        self.loop_task.cancel()
        await super().cleanup()

    async def schedule(self) -> None:
        idle = True
        while True:
            if not self.waiting and not self.running:
                idle = True
                self.wake.clear()
                await self.wake.wait()
            await asyncio.sleep(self.cold_s if idle and self.cold_s else self.step_s)
            idle = False
            while self.waiting and len(self.running) < self.slots:
                self.running.append(self.waiting.pop(0))
            ran = len(self.running)
            for req in list(self.running):
                req["done"] += 1
                self.generation += 1
                last = req["done"] >= req["max"]
                if last:
                    self.running.remove(req)
                    self.success += 1
                req["queue"].put_nowait((req["done"], last))
            self.steps.append((time.monotonic(), ran, ran))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n_prompt = len(str(body.get("prompt", "")).split())
        req = {"max": int(body["max_tokens"]), "done": 0, "queue": asyncio.Queue()}
        self.requests += 1
        self.prompt += n_prompt
        self.waiting.append(req)
        self.wake.set()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        while True:
            done, last = await req["queue"].get()
            chunk = {"choices": [{"index": 0, "text": "w ", "token_ids": [7],
                                  "finish_reason": "length" if last else None}],
                     "usage": {"prompt_tokens": n_prompt, "completion_tokens": done}}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if last:
                break
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def metrics(self, request: web.Request) -> web.Response:
        lines = [
            "# TYPE vllm:generation_tokens_total counter",
            f'vllm:generation_tokens_total{{model_name="fake"}} {self.generation}',
            "# TYPE vllm:prompt_tokens_total counter",
            f'vllm:prompt_tokens_total{{model_name="fake"}} {self.prompt}',
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{finished_reason="length"}} {self.success}',
            "# TYPE vllm:num_requests_running gauge",
            f'vllm:num_requests_running{{model_name="fake"}} {len(self.running)}',
            "# TYPE vllm:num_requests_waiting gauge",
            f'vllm:num_requests_waiting{{model_name="fake"}} {len(self.waiting)}',
        ]
        return web.Response(text="\n".join(lines) + "\n")

    def running_between(self, lo: float, hi: float) -> list[int]:
        """The running count of every step that ended inside [lo, hi]."""
        return [run for t, run, _ in self.steps if lo <= t <= hi]


def write_params(tmp_path: Path, fakes: dict[str, FakeEngine]) -> Path:
    """A params folder (profiles/, studies/) with one attach profile per fake engine,
    `fake-<name>`, each seen as vLLM: where a test's studies go."""
    import yaml

    params = tmp_path / "params"
    for sub in ("profiles", "studies"):
        (params / sub).mkdir(parents=True, exist_ok=True)
    for name, eng in fakes.items():
        (params / "profiles" / f"fake-{name}.yaml").write_text(yaml.safe_dump(
            {"engine": "attach", "url": eng.url, "attached_engine": "vllm",
             "model": {"id": "fake", "revision": None}}))
    return params

