"""The load generator: asynchronous streaming OpenAI requests with closed-loop concurrency.

Design:
- One aiohttp session per run, its connection limit at least the concurrency, so the
  client never queues requests the engine should be queuing. N workers pull prompts from
  one queue (closed loop: a worker sends its next request when its last one ends).
- Two timings: **every prompt once** (closed loop over the prompts), or, with
  `LoadConfig.steady` (a study's `window:` block, params/window.py), a **steady window**
  (harness/steady.py says why and how): the workers cycle the prompts, output caps spread
  request by request (`steady.spread_cap`); the window opens (`start` scrape) `skip_s`
  after the load starts and once every stream has received a token, and closes (`window`
  scrape) at the first `steady.GRID_S` tick past `window_s` where every stream has
  completed `turnovers` requests inside it (at `max_window_s` at the latest); only then does
  sending stop and the requests in flight finish. The loop that drives this is here
  (`LoadGenerator._steady_window`), asking steady.py's rules (`may_open`, `closing_ticks`,
  `may_close`), which read the records and import nothing of this module. A `scrape`
  callable is called at the measured span's edges, inside the load, so counter deltas
  cover exactly that span: after warm-up (`before`), as the window opens and closes, after
  the last request (`after`); `LoadResult` keeps each window scrape's monotonic bounds, so
  ramp-up and drain fall outside the span by construction. Each request records its
  stream (the worker that sent it). Warm-up requests use prompts of their own, so the
  measured prompts do not hit a prefix cache the warm-up filled.
- Every request is streamed with `stream_options: {include_usage, continuous_usage_stats}`
  where the engine has it, so a chunk carrying m tokens (a speculative step) is counted as
  m tokens: its gap since the previous token-carrying chunk is split into m inter-token
  latencies of gap/m (vLLM's own ITL histogram is per step, SGLang's per token;
  ours is per token). Tokens that arrive with the first chunk get
  0 s. `itl_s` therefore has completion_tokens − 1 entries.
- Per-request seeds are derived from the cell seed and the prompt index
  (`request_seed`), so a repeat with the same seed sends the same requests.
- A failed request (HTTP error, an error event in the stream, a dropped connection, a
  timeout) is recorded with its error, never raised. Records are appended to
  `LoadGenerator.records` as they finish, so whoever interrupts a run keeps them.
- `LoadConfig.api = "native"` (a profile's `api`, SGLang only, completion-form prompts
  only) streams SGLang's own `POST /generate` instead of `/v1/completions`: it returns the
  output token ids and, in its last chunk, the request's speculative figures
  (`native_request_body`, `NativeStreamTimer`). Read from the SGLang 0.5.14 wheel
  (`sglang-0.5.14-cp312-cp312-manylinux_2_34_x86_64.whl`, `_version.py` 0.5.14):
  - `sglang/srt/entrypoints/http_server.py:764-803`: each output is one event
    `data: <json>` (`:778`); a ValueError mid-stream becomes one
    `data: {"error": {"message", "type", "code", ...}}` (`:787-796`); the stream always ends
    `data: [DONE]` (`:797`). Errors before the stream starts are plain HTTP errors.
  - `sglang/srt/managers/tokenizer_manager.py:1861-1893`: every chunk has a `meta_info`
    (`id`, `finish_reason` (null until the end), `prompt_tokens`, `completion_tokens`: the
    tokens so far, `cached_tokens`, ...). `:1945-1989`: with `--incremental-streaming-output`
    off (its default, `sglang/srt/server_args.py:965-968`) `text` and `output_ids` are
    **cumulative** (the whole output so far; an intermediate chunk's text is filled in at
    `:1474-1482`, and of several queued chunks only the last is sent, `:1468`); with it on
    they are the chunk's **increment** (queued ones concatenated, `:1344-1379`).
    `completion_tokens` is len(output ids so far) in both
    (`managers/scheduler_components/output_streamer.py:359-372`), so the timer tells the two
    apart by it and splits each chunk's gap over `completion_tokens` − the previous.
  - `:2052-2062`: the speculative fields go into the **finished** chunk's meta_info only
    (`_calculate_spec_decoding_metrics`, `:2301-2352`: `spec_verify_ct`,
    `spec_num_correct_drafts` (alias `spec_accepted_drafts`), `spec_num_proposed_drafts`
    = verify_ct × (num_draft_tokens − 1) (alias `spec_proposed_drafts`),
    `spec_accept_rate`, `spec_accept_length` = completion_tokens / spec_verify_ct,
    `spec_correct_drafts_histogram` (alias `spec_accept_histogram`)); none at all when the
    request had no verify step (`:2312-2316`).
  - `finish_reason` is `{"type": "stop", "matched": ...}`, `{"type": "length", "length": n}`
    or `{"type": "abort", "message", "status_code", "err_type"}`
    (`managers/schedule_batch.py:154-215`); stop and length are OpenAI's words, abort is
    recorded as the request's error.
  - `sglang/srt/sampling/sampling_params.py:71-98`: `max_new_tokens`, `stop`, `temperature`
    (default 1.0), `top_p`, `top_k`, `ignore_eos`, `sampling_seed`; the OpenAI completions
    route maps `seed` to `sampling_seed` (`entrypoints/openai/serving_completions.py:162`),
    so both paths send the same requests.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from specrepro.harness import steady
from specrepro.harness.records import LoadResult, RequestRecord
from specrepro.params.window import Window
from specrepro.workloads import Prompt

SEED_STRIDE = 1_000_003  # a prime: seeds of neighbouring cells do not collide for < 1e6 prompts



@dataclass(frozen=True)
class RequestFeatures:
    """What an engine's server accepts beyond the common OpenAI fields (each adapter's
    `request_features`, harness/engines/): `continuous_usage_stats` in stream_options,
    `return_token_ids` (SGLang's OpenAI server has none), and `native_api`: a native
    streaming `POST /generate` (SGLang's) the `api: native` load speaks. The default is
    vLLM's, which the in-process peer is also given."""

    continuous_usage_stats: bool = True
    return_token_ids: bool = True
    native_api: bool = False


APIS = ("openai", "native")  # LoadConfig.api; native: SGLang's /generate (module docstring)
NATIVE_PATH = "/generate"
# SGLang's finish_reason.type in OpenAI's words (`abort` is an error, not a finish)
NATIVE_FINISH = {"stop": "stop", "length": "length"}


def request_seed(cell_seed: int, prompt_index: int) -> int:
    """The seed of one request: deterministic in (cell seed, prompt index), < 2**31."""
    return (cell_seed * SEED_STRIDE + prompt_index) % 2**31


@dataclass(frozen=True)
class LoadConfig:
    """How one cell's load is sent."""

    url: str  # the engine's base URL, without /v1
    model: str  # the served model name
    concurrency: int = 1
    warmup: int = 0  # requests sent and discarded before measuring
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int = 0  # the cell seed; each request derives its own
    ignore_eos: bool = False
    thinking: bool | None = None  # chat_template_kwargs.enable_thinking where set
    reasoning_effort: str | None = None
    features: RequestFeatures = RequestFeatures()  # the engine's (its adapter's)
    extra_body: dict = field(default_factory=dict)  # e.g. SGLang's return_spec_tokens_details
    request_timeout_s: float = 600.0
    api: str = "openai"  # openai | native (SGLang's POST /generate; APIS)
    steady: Window | None = None  # a steady window (steady.py); None: every prompt once


class StreamTimer:
    """Turns the chunks of one stream into token counts, TTFT and per-token ITL."""

    def __init__(self, record: RequestRecord):
        self.r = record
        self.usage_tokens = 0  # completion_tokens seen in the last continuous usage
        self.counted = 0  # tokens attributed to chunks so far

    def chunk(self, body: dict, now: float) -> None:
        r = self.r
        if self.error_event(body, "choices"):
            return
        usage = body.get("usage") or None
        choices = body.get("choices") or []
        m = 0
        for choice in choices:
            piece = choice.get("text")
            if piece is None:
                piece = (choice.get("delta") or {}).get("content")
            ids = choice.get("token_ids")
            if ids:
                r.token_ids = (r.token_ids or []) + list(ids)
            if piece:
                r.text += piece
            if choice.get("finish_reason") is not None:
                r.finish_reason = choice["finish_reason"]
            # how many tokens this chunk carries: continuous usage, else token ids, else 1
            if usage and usage.get("completion_tokens") is not None:
                m = max(m, int(usage["completion_tokens"]) - self.usage_tokens)
            elif ids:
                m = max(m, len(ids))
            elif piece:
                m = max(m, 1)
        if usage:
            r.prompt_tokens = usage.get("prompt_tokens", r.prompt_tokens)
            if usage.get("completion_tokens") is not None:
                self.usage_tokens = int(usage["completion_tokens"])
                r.completion_tokens = self.usage_tokens
        for key in ("metrics", "sglext"):  # per-response acceptance (usage chunk or last)
            if body.get(key):
                r.spec = {**(r.spec or {}), key: body[key]}
        if m > 0:
            self.tokens(m, now)

    def error_event(self, body: dict, payload: str) -> bool:
        """An event that carries an error and no output (`payload`: the key an output event
        has) records the error's message on the request; True where it was one."""
        if "error" not in body or payload in body:
            return False
        err = body["error"]
        self.r.error = err.get("message", str(err)) if isinstance(err, dict) else str(err)
        return True

    def tokens(self, m: int, now: float) -> None:
        """m tokens arrived at `now` (RequestRecord.add_chunk)."""
        self.r.add_chunk(now, m)
        self.counted += m

    def finish(self, now: float) -> None:
        r = self.r
        r.e2e_s = now - r.started
        if r.completion_tokens is None and r.error is None:
            r.completion_tokens = len(r.token_ids) if r.token_ids is not None else self.counted


class NativeStreamTimer(StreamTimer):
    """The chunks of SGLang's native `/generate` stream (module docstring): output ids and
    text cumulative or incremental (told apart by meta_info.completion_tokens), the token
    count of a chunk from completion_tokens, the finish reason in OpenAI's words and the
    final meta_info's speculative fields in `record.spec["sglang_meta"]`."""

    META_KEYS = ("completion_tokens", "prompt_tokens", "cached_tokens", "e2e_latency")

    def chunk(self, body: dict, now: float) -> None:
        r = self.r
        if self.error_event(body, "meta_info"):
            return
        meta = body.get("meta_info") or {}
        total = meta.get("completion_tokens")
        total = int(total) if total is not None else None
        seen = r.token_ids or []
        ids, piece = body.get("output_ids"), body.get("text")
        if ids is not None:
            ids = [int(t) for t in ids]
            if total is not None:
                cumulative = len(ids) == total and total >= len(seen)
            else:  # no count: cumulative where the chunk repeats what came before
                cumulative = len(ids) >= len(seen) > 0 and ids[:len(seen)] == seen
            r.token_ids = ids if cumulative else seen + ids
            if piece is not None:
                r.text = piece if cumulative else r.text + piece
        elif piece is not None:  # no ids (not SGLang 0.5.14's format): text increments
            r.text += piece
        if total is not None:
            m = total - self.usage_tokens
            self.usage_tokens = r.completion_tokens = total
        else:
            m = len(r.token_ids or []) - self.counted
        if meta.get("prompt_tokens") is not None:
            r.prompt_tokens = int(meta["prompt_tokens"])
        finish = meta.get("finish_reason")
        if finish is not None:
            kind = finish.get("type") if isinstance(finish, dict) else str(finish)
            if kind in NATIVE_FINISH:
                r.finish_reason = NATIVE_FINISH[kind]
            else:
                r.finish_reason = kind
                why = finish.get("message") if isinstance(finish, dict) else None
                code = finish.get("status_code") if isinstance(finish, dict) else None
                r.error = (f"SGLang finished the request with {kind!r}"
                           + (f" (status {code})" if code is not None else "")
                           + (f": {why}" if why else ""))
            kept = {k: v for k, v in meta.items()
                    if k.startswith("spec_") or k in self.META_KEYS}
            r.spec = {**(r.spec or {}), "sglang_meta": kept}
        if m > 0:
            self.tokens(m, now)


def native_request_body(prompt: Prompt, cfg: LoadConfig, seed: int) -> tuple[str, dict]:
    """(path, JSON body) of one streaming SGLang `/generate` request: the prompt's text and
    SGLang's sampling_params (module docstring). Output ids and meta_info come with every
    chunk unasked; nothing else is needed for them."""
    if prompt.form == "chat":
        raise ValueError(f"api native (SGLang's /generate) takes completion-form prompts; "
                         f"prompt {prompt.id!r} of workload {prompt.workload!r} is chat-form")
    params: dict[str, Any] = {
        "temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": cfg.top_k,
        "max_new_tokens": prompt.max_tokens,  # SGLang's default is 128
        "sampling_seed": seed,  # what its OpenAI route makes of `seed`
    }
    if cfg.ignore_eos:
        params["ignore_eos"] = True
    if prompt.stop:
        params["stop"] = list(prompt.stop)
    # cfg.extra_body is for the OpenAI routes (SGLang's return_spec_tokens_details, a field
    # GenerateReqInput lacks): not sent here
    return NATIVE_PATH, {"text": prompt.text, "sampling_params": params, "stream": True}


def request_body(prompt: Prompt, cfg: LoadConfig, seed: int) -> tuple[str, dict]:
    """(path, JSON body) of one streaming request for a prompt."""
    if cfg.api == "native":
        return native_request_body(prompt, cfg, seed)
    feats = cfg.features
    body: dict[str, Any] = {
        "model": cfg.model, "stream": True, "seed": seed,
        "temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": cfg.top_k,
        "stream_options": {"include_usage": True},
    }
    if feats.continuous_usage_stats:
        body["stream_options"]["continuous_usage_stats"] = True
    if feats.return_token_ids:
        body["return_token_ids"] = True
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    if prompt.stop:
        body["stop"] = list(prompt.stop)
    if prompt.form == "chat":
        path = "/v1/chat/completions"
        body["messages"] = prompt.messages
        body["max_completion_tokens"] = prompt.max_tokens  # never the engine's default
        if cfg.thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": cfg.thinking}
        if cfg.reasoning_effort is not None:
            body["reasoning_effort"] = cfg.reasoning_effort
    else:
        path = "/v1/completions"
        body["prompt"] = prompt.text
        body["max_tokens"] = prompt.max_tokens  # vLLM and SGLang default to 16
    body.update(cfg.extra_body)
    return path, body


def warmup_prompts(like: Sequence[Prompt], n: int) -> list[Prompt]:
    """n prompts of the workload's form and length cap that share no prefix with it."""
    form, cap = (like[0].form, like[0].max_tokens) if like else ("chat", 16)
    out = []
    for i in range(n):
        text = f"Warm-up request {i}: write a short paragraph about the number {i + 7}."
        kw = {"messages": [{"role": "user", "content": text}]} if form == "chat" else {"text": text}
        out.append(Prompt(id=f"warmup-{i:03d}", workload="warmup", max_tokens=cap, **kw))
    return out


Scrape = Callable[[], Any]  # the caller's scrape: its value is kept in LoadResult


class LoadGenerator:
    """Sends one cell's load; `records` fills as requests end (kept on interruption)."""

    def __init__(self, cfg: LoadConfig):
        if cfg.api not in APIS:
            raise ValueError(f"load api: expected one of {list(APIS)}, found {cfg.api!r}")
        if cfg.api == "native" and not cfg.features.native_api:
            raise ValueError("load api 'native' is SGLang's /generate: expected an engine "
                             "that has it (RequestFeatures.native_api), found one without")
        self.cfg = cfg
        self.records: list[RequestRecord] = []
        self.warmup_records: list[RequestRecord] = []
        self.live: dict[int, RequestRecord] = {}  # stream -> its request in flight

    def run(self, prompts: Sequence[Prompt], scrape: Scrape | None = None) -> LoadResult:
        """Warm up, scrape, send the load, scrape; blocking (asyncio.run inside)."""
        return asyncio.run(self.arun(prompts, scrape))

    async def arun(self, prompts: Sequence[Prompt], scrape: Scrape | None = None) -> LoadResult:
        if not prompts:
            raise ValueError("load generator: no prompts to send")
        cfg = self.cfg
        chat = sorted({p.workload for p in prompts if p.form == "chat"})
        if cfg.api == "native" and chat:
            raise ValueError(f"load api 'native' (SGLang's /generate) takes completion-form "
                             f"prompts; workload {', '.join(map(repr, chat))} is chat-form")
        limit = max(cfg.concurrency, 1) * 2  # headroom: a closing connection never blocks one
        timeout = aiohttp.ClientTimeout(total=cfg.request_timeout_s, sock_connect=10)
        connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit)
        async with aiohttp.ClientSession(cfg.url, connector=connector, timeout=timeout) as session:
            if cfg.warmup:
                warm = warmup_prompts(prompts, cfg.warmup)
                await self._closed_loop(session, list(enumerate(warm)), self.warmup_records,
                                        warmup=True)
            result = LoadResult(self.records, None)
            result.before = await call_scrape(scrape)
            start = result.load_start = time.monotonic()
            if cfg.steady is None:
                await self._closed_loop(session, list(enumerate(prompts)), self.records)
                end = max((r.started + (r.e2e_s or 0.0) for r in self.records), default=start)
                result.wall_s, result.span = end - start, (start, end)
            else:
                await self._steady_window(session, prompts, result, scrape, start, cfg.steady)
            result.after = await call_scrape(scrape)
        return result

    async def _steady_window(self, session, prompts: Sequence[Prompt], result: LoadResult,
                             scrape: Scrape | None, start: float, w: Window) -> None:
        """A steady window (module docstring): N workers cycle the prompts, their caps
        spread; the window opens once ramp-up is over and closes on a tick once every stream
        has turned over (steady.py's rules); then sending stops and requests in flight
        finish."""
        n, stop, counter = self.cfg.concurrency, asyncio.Event(), itertools.count()

        def next_item() -> tuple[int, Prompt] | None:
            if stop.is_set():
                return None
            i = next(counter)
            p = prompts[i % len(prompts)]
            return i, replace(p, max_tokens=steady.spread_cap(p.max_tokens, i, w.cap_spread))

        workers = [asyncio.create_task(self._worker(session, next_item, self.records, stream=i))
                   for i in range(n)]
        give_up = steady.give_up_at(start, w)
        while time.monotonic() < give_up and not steady.may_open(
                self.records, self.live, n, time.monotonic() - start, w):
            await asyncio.sleep(steady.POLL_S)
        result.start, result.start_at = await timed_scrape(scrape)
        opened = sum(result.start_at) / 2
        for tick in steady.closing_ticks(opened, w):
            await asyncio.sleep(max(0.0, tick - time.monotonic()))
            if steady.may_close(self.records, opened, n, tick, w):
                break
        result.window, result.end_at = await timed_scrape(scrape)
        stop.set()
        result.span = (opened, sum(result.end_at) / 2)
        result.wall_s = result.span[1] - result.span[0]
        await asyncio.gather(*workers)

    async def _closed_loop(self, session, items: list[tuple[int, Prompt]],
                           sink: list[RequestRecord], warmup: bool = False) -> None:
        queue = list(reversed(items))

        def next_item() -> tuple[int, Prompt] | None:
            return queue.pop() if queue else None

        n = min(self.cfg.concurrency, len(items))
        await asyncio.gather(*(self._worker(session, next_item, sink, warmup, stream=i)
                               for i in range(n)))

    async def _worker(self, session, next_item, sink: list[RequestRecord],
                     warmup: bool = False, stream: int | None = None) -> None:
        """One stream: send `next_item()`'s requests one after another until it gives None."""
        while (item := next_item()) is not None:
            idx, prompt = item
            await self.send(session, idx, prompt, sink, warmup, stream)

    async def send(self, session: aiohttp.ClientSession, idx: int, prompt: Prompt,
                   sink: list[RequestRecord], warmup: bool = False,
                   stream: int | None = None) -> RequestRecord:
        """One streaming request, appended to sink when it ends (also when cancelled);
        never raises for a failed request, only records it. While it streams it is its
        stream's entry in `live`."""
        seed = request_seed(self.cfg.seed + (10**6 if warmup else 0), idx)
        record = RequestRecord(idx, prompt.id, seed, warmup=warmup, stream=stream)
        if stream is not None and not warmup:
            self.live[stream] = record
        path, body = request_body(prompt, self.cfg, seed)
        timer = NativeStreamTimer(record) if self.cfg.api == "native" else StreamTimer(record)
        record.started = time.monotonic()
        try:
            async with session.post(path, json=body) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:500]
                    record.error = f"HTTP {resp.status} from {path}: {text}"
                else:
                    await self._read_stream(resp, timer)
        except asyncio.CancelledError:
            record.error = "cancelled (the run was interrupted)"
            raise
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            record.error = f"{type(err).__name__} on {path}: {err}".strip()
        finally:
            timer.finish(time.monotonic())
            if record.error is None and record.finish_reason is None:
                record.error = "stream ended without a finish_reason (connection dropped?)"
            sink.append(record)
        return record

    @staticmethod
    async def _read_stream(resp: aiohttp.ClientResponse, timer: StreamTimer) -> None:
        # SSE: events separated by blank lines; we only need `data:` lines.
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            try:
                body = json.loads(data)
            except ValueError:
                timer.r.error = f"unparsable stream chunk: {data[:200]!r}"
                break
            timer.chunk(body, time.monotonic())
            if timer.r.error is not None:
                break


async def call_scrape(scrape: Scrape | None) -> Any:
    """Run a blocking scrape (urllib) off the event loop, so streams keep flowing."""
    return None if scrape is None else await asyncio.to_thread(scrape)


async def timed_scrape(scrape: Scrape | None) -> tuple[Any, tuple[float, float]]:
    """A scrape and the monotonic bounds it was read within."""
    a = time.monotonic()
    value = await call_scrape(scrape)
    return value, (a, time.monotonic())


def run_load(prompts: Sequence[Prompt], cfg: LoadConfig,
             scrape: Scrape | None = None) -> LoadResult:
    """Convenience: one cell's load, blocking."""
    return LoadGenerator(cfg).run(prompts, scrape)
