"""The embedded server's HTTP routes: vLLM's OpenAI-compatible API over one engine loop.

Design:
- `Server` holds the aiohttp handlers: `/health` (503 once the engine loop died),
  `/version`, `/v1/models`, `/metrics` (server_metrics.py, vLLM's names),
  `/v1/completions` and `/v1/chat/completions` (JSON or SSE), and, only where a profile
  directory is configured (as vLLM's profiler config), `/start_profile` and `/stop_profile`.
- A generation request's body is read on the event loop, then parsed, checked and tokenized
  on a worker thread (protocol.py: the body, the chat template, the context length), so that
  a large body never holds up `/health` or the streams in flight (a 10 MB prompt took 12 s
  of one core to tokenize). A prompt that cannot fit the context whatever its
  tokens is refused before the tokenizer runs: a token spans at most
  `Tokenizer.max_token_chars` characters, so a prompt of C characters is at least
  C / max_token_chars tokens. The tokenizer then runs with the interpreter released
  (`encode_batch`). The request goes to the engine thread (engine_loop.py) as an
  `EngineRequest` and is answered from the events that thread sends: one JSON body when
  they are all in, or one SSE chunk per event (a chat stream opens with vLLM's role chunk).
- The model: answered to under the served name and under the model path as given (the
  profiles send `embedded`, a user of `--model models/embedded` may send either).
- `--api-key` (as vLLM's): every `/v1` route wants `Authorization: Bearer <key>`, compared
  in constant time, and answers 401 `{"error": "Unauthorized"}` otherwise; `/health`,
  `/version`, `/metrics` and the profiler's routes stay open, as in vLLM.
- Errors: a bad request answers 400 naming its parameter; a full waiting queue
  (`--max-waiting`) 503 ServiceUnavailableError; a fault in one request 500, or an SSE error
  event once streaming. A client that disconnects (or is cancelled by aiohttp) has its
  request aborted, which frees its slot, and is logged as one line (a write to its closed
  connection is that disconnect, not a fault).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import traceback
import uuid

from aiohttp import web

from specrepro import __version__
from specrepro.embedded.engine_loop import EngineLoop, Event, Tracked, event_sink
from specrepro.embedded.protocol import (
    APIError,
    GenerationRequest,
    ResponseBuilder,
    TextStream,
    Usage,
    check_context_length,
    parse_chat,
    parse_completion,
)
from specrepro.embedded.server_metrics import ServerMetrics

log = logging.getLogger(__name__)

VERSION = f"specrepro-embedded {__version__}"


def _sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def _error_response(err: APIError) -> web.Response:
    return web.json_response(err.body(), status=err.status)


class Server:
    """aiohttp handlers over one engine loop."""

    def __init__(self, engine, model_name: str, model_path: str, max_model_len: int,
                 spec_tokens: int | None, default_chat_template_kwargs: dict | None = None,
                 profile_dir: str | None = None, api_key: str | None = None):
        self.engine, self.model_name, self.model_path = engine, model_name, model_path
        # the names a request may give: the served one first (the default), then the path
        self.model_names = tuple(dict.fromkeys((model_name, model_path)))
        self.api_key = api_key
        self.max_model_len, self.spec_tokens = max_model_len, spec_tokens
        self.default_chat_template_kwargs = default_chat_template_kwargs or {}
        self.tokenizer = engine.tokenizer
        self.metrics = ServerMetrics(engine, model_name, _cache_info(engine, max_model_len))
        self.loop_thread = EngineLoop(engine, self.metrics)
        self.created = int(time.time())
        self.profile_dir = profile_dir

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024,
                              middlewares=[self._authorize] if self.api_key else [])
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.prometheus)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        if self.profile_dir:  # as vLLM: the profiler's endpoints only where it is configured
            app.router.add_post("/start_profile", self.start_profile)
            app.router.add_post("/stop_profile", self.stop_profile)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app) -> None:
        self.loop_thread.start()

    async def _on_cleanup(self, app) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.loop_thread.stop)

    @web.middleware
    async def _authorize(self, request: web.Request, handler) -> web.StreamResponse:
        """vLLM's check: /v1 routes want the key as a bearer token; the rest stay open."""
        if request.method == "OPTIONS" or not request.path.startswith("/v1"):
            return await handler(request)
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    # -- plain endpoints ------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.loop_thread.alive else 503)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self.created,
            "owned_by": "specrepro", "root": self.model_path, "parent": None,
            "max_model_len": self.max_model_len, "permission": []}]})

    async def prometheus(self, request: web.Request) -> web.Response:
        body = self.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})

    async def start_profile(self, request: web.Request) -> web.Response:
        return await self._profile("start")

    async def stop_profile(self, request: web.Request) -> web.Response:
        return await self._profile("stop")

    async def _profile(self, action: str) -> web.Response:
        try:
            path = await asyncio.wrap_future(self.loop_thread.profile(action, self.profile_dir))
        except RuntimeError as exc:
            return web.json_response({"error": {"message": str(exc), "type": "BadRequestError",
                                                "code": 400}}, status=400)
        log.info("profiler %s%s", "started" if action == "start" else "stopped",
                 f": trace {path}" if path else "")
        return web.json_response({"trace": path})

    # -- generation ---------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        arrival = time.monotonic()
        try:
            raw = await request.read()
            req, prompt_ids, max_tokens = await asyncio.to_thread(self._prepare, raw, kind)
        except APIError as err:
            return _error_response(err)
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        rid = f"{prefix}-{uuid.uuid4().hex}"
        events: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        tracked = Tracked(stream=TextStream(self.tokenizer, req.stop),
                          sink=event_sink(loop, events),
                          arrival=arrival, stop_token_ids=frozenset(req.stop_token_ids))
        builder = ResponseBuilder(req, rid, self.spec_tokens)
        state = {"finished": False}
        try:  # from here on, leaving without a finish (client gone, cancelled) aborts
            try:
                await asyncio.wrap_future(self.loop_thread.submit(
                    self._engine_request(rid, req, prompt_ids, max_tokens), tracked))
            except Exception as exc:  # noqa: BLE001 - mapped to 503, 400 or 500
                state["finished"] = True
                return _error_response(_admission_error(exc, rid))
            if req.stream:
                return await self._stream(request, builder, events, state)
            return await self._collect(builder, events, prompt_ids, state)
        finally:
            if not state["finished"]:  # client gone or handler cancelled: free the slot
                self.loop_thread.abort(rid)
                log.info("request %s aborted: the client %s went away", rid,
                         request.remote or "")

    def _prepare(self, raw: bytes, kind: str) -> tuple[GenerationRequest, list[int], int]:
        """The body -> (request, prompt ids, max tokens), or APIError; on a worker thread."""
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(f"malformed JSON body: {exc}") from None
        if kind == "chat":
            req = parse_chat(body, self.model_names, self.default_chat_template_kwargs)
        else:
            req = parse_completion(body, self.model_names)
        prompt_ids = self._prompt_ids(req)
        return req, prompt_ids, check_context_length(len(prompt_ids), req.max_tokens,
                                                     self.max_model_len)

    def _prompt_ids(self, req: GenerationRequest) -> list[int]:
        if req.kind == "chat":
            kwargs = req.chat_template_kwargs
            try:
                text = self.tokenizer.apply_chat_template(
                    req.messages, add_generation_prompt=req.add_generation_prompt,
                    tokenize=False, **kwargs)
            except Exception as exc:  # noqa: BLE001 - a template that rejects these messages
                raise APIError(f"chat template failed: {exc}", param="messages") from None
            return self._encode(text, "messages")
        if req.prompt_token_ids is not None:
            if len(req.prompt_token_ids) >= self.max_model_len:  # before a pass over them
                check_context_length(len(req.prompt_token_ids), req.max_tokens,
                                     self.max_model_len)
            bad = [t for t in req.prompt_token_ids if t >= self.tokenizer.vocab_size]
            if bad:
                raise APIError(f"prompt: token id {bad[0]} is outside the vocabulary "
                               f"(size {self.tokenizer.vocab_size})", param="prompt")
            return req.prompt_token_ids
        ids = self._encode(req.prompt, "prompt")
        if not ids:
            raise APIError("prompt: the prompt is empty", param="prompt")
        return ids

    def _encode(self, text: str, param: str) -> list[int]:
        """The text's ids; a text too long for the context whatever its tokens is refused
        without tokenizing it (module docstring)."""
        span = self.tokenizer.max_token_chars
        least = -(-len(text) // span)
        if least >= self.max_model_len:
            raise APIError(f"This model's maximum context length is {self.max_model_len} "
                           f"tokens. However, the text of your {param} has {len(text):,} "
                           f"characters, at least {least:,} tokens (a token spans at most "
                           f"{span} characters). Please reduce the length of the {param}.",
                           param=param)
        return self.tokenizer.encode_batch([text])[0]  # releases the interpreter

    def _engine_request(self, rid: str, req: GenerationRequest, prompt_ids: list[int],
                        max_tokens: int):
        from specrepro.embedded.engine import EngineRequest

        # the end of a chat turn ends generation as the end of text does (ignore_eos drops
        # both, as vLLM drops generation_config's eos ids); the engine handles the eos itself
        stops = list(req.stop_token_ids)
        if not req.ignore_eos:
            stops += [t for t in self.tokenizer.stop_token_ids()
                      if t != self.tokenizer.eos_token_id and t not in stops]
        return EngineRequest(request_id=rid, prompt_token_ids=list(prompt_ids),
                             sampling=req.sampling, max_tokens=max_tokens,
                             stop_token_ids=stops, ignore_eos=req.ignore_eos)

    async def _collect(self, builder: ResponseBuilder, events: asyncio.Queue,
                       prompt_ids: list[int], state: dict) -> web.Response:
        text, token_ids = [], []
        while True:
            ev: Event = await events.get()
            if ev.error is not None:
                state["finished"] = True
                return _error_response(ev.error)
            text.append(ev.text)
            token_ids += ev.token_ids
            if ev.finished:
                state["finished"] = True
                return web.json_response(builder.full(
                    "".join(text), ev.finish_reason, ev.stop_reason, token_ids, prompt_ids,
                    ev.usage))

    async def _stream(self, request: web.Request, builder: ResponseBuilder,
                      events: asyncio.Queue, state: dict) -> web.StreamResponse:
        ev: Event = await events.get()
        if ev.error is not None:  # failed before anything was sent: a plain error response
            state["finished"] = True
            return _error_response(ev.error)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        try:
            await self._send_events(request, resp, builder, events, state, ev)
        except ConnectionResetError:
            # aiohttp's ClientConnectionResetError: the client left between two chunks,
            # before aiohttp cancelled this handler; _generate aborts and logs it
            pass
        return resp

    async def _send_events(self, request: web.Request, resp: web.StreamResponse,
                           builder: ResponseBuilder, events: asyncio.Queue, state: dict,
                           ev: Event) -> None:
        await resp.prepare(request)
        if builder.req.kind == "chat":  # vLLM's first chat chunk: the role, no tokens
            await resp.write(_sse(builder.chunk(
                "", [], usage=Usage(prompt_tokens=ev.usage.prompt_tokens), first=True)))
        while True:
            if ev.error is not None:
                state["finished"] = True
                await resp.write(_sse(ev.error.body()))
                break
            await resp.write(_sse(builder.chunk(ev.text, ev.token_ids, ev.finish_reason,
                                                ev.stop_reason, ev.usage)))
            if ev.finished:
                state["finished"] = True
                if builder.req.include_usage:
                    await resp.write(_sse(builder.usage_chunk(ev.usage)))
                break
            ev = await events.get()
        await resp.write(_sse(b"[DONE]"))
        await resp.write_eof()


def _admission_error(exc: Exception, rid: str) -> APIError:
    from specrepro.embedded.engine import PromptTooLongError, QueueFullError

    if isinstance(exc, QueueFullError):
        return APIError(f"the waiting queue is full, retry later: {exc}", status=503)
    if isinstance(exc, (PromptTooLongError, ValueError)):
        return APIError(str(exc), param="prompt")
    log.error("add_request(%s) failed:\n%s", rid,
              "".join(traceback.format_exception(exc)))
    return APIError(f"internal error admitting request {rid}: {exc}", status=500)


def _cache_info(engine, max_model_len: int) -> dict[str, str]:
    tokens = int(engine.kv_pool_tokens)
    return {"block_size": "1", "num_gpu_blocks": str(tokens), "kv_cache_size_tokens": str(tokens),
            "kv_cache_max_concurrency": f"{float(engine.max_concurrency):.2f}",
            "max_model_len": str(max_model_len), "enable_prefix_caching": "False"}
