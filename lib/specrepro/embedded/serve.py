"""The embedded engine's OpenAI-compatible server, speaking vLLM's API, metrics and log lines.

Design:
- Two threads. The engine thread owns the `LLMEngine`: it executes commands (add, abort) from
  a thread-safe inbox between steps, calls `engine.step()` while work is unfinished, and runs
  the output processing a vLLM front end does (incremental detokenization, stop strings,
  latency histograms). It hands each request's events to that request's `asyncio.Queue`
  with `loop.call_soon_threadsafe`. The event-loop thread (aiohttp) validates requests,
  renders chat templates, awaits events and writes JSON or SSE chunks.
- Stop strings are matched on the detokenized text after each step (`protocol.TextStream`),
  and text that could be the start of a stop string is held back until it cannot be; a match
  aborts the request in the engine before its next step, so no slot is held for text nobody
  will see. As in vLLM, the tokens of that step count in `completion_tokens` and the text is
  cut before the stop string.
- One chunk per engine step and request: a speculative step that yields several tokens sends
  them in one chunk, and `continuous_usage_stats` lets a client count them.
- Faults stay per request: an exception while processing one request's output fails only that
  request (HTTP 500, or an SSE error event once streaming); an exception from `engine.step()`
  fails the request named by the exception's `request_id` attribute, or else every request in
  flight (the engine's state for them cannot be trusted), and the server keeps serving.
  A client that disconnects (or is cancelled by aiohttp) has its request aborted, which frees
  its slot. A full waiting queue (`--max-waiting`) answers 503 ServiceUnavailableError.
- Command line: `python -m specrepro.embedded.serve` / `specrepro serve` mirrors `vllm serve`
  (docs/architecture.md); `--port 0` binds a free port, which the startup log line names.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import errno
import json
import logging
import queue
import signal
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field

from aiohttp import web

from specrepro import __version__
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
from specrepro.speculative import add_server_flags, spec_config_epilog

log = logging.getLogger("specrepro.embedded.serve")

VERSION = f"specrepro-embedded {__version__}"


# --------------------------------------------------------------------------- engine thread

@dataclass
class Event:
    """What the engine thread tells a request's handler after a step."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    usage: Usage | None = None
    error: APIError | None = None


@dataclass
class _Tracked:
    """Engine-thread state of one request in flight."""

    stream: TextStream
    sink: object  # callable(Event), thread-safe
    arrival: float
    stop_token_ids: frozenset
    usage: Usage = field(default_factory=Usage)
    first: float | None = None
    last: float = 0.0


class EngineLoop:
    """The thread that steps the engine; the only code that touches it after start-up."""

    def __init__(self, engine, metrics: ServerMetrics):
        self.engine, self.metrics = engine, metrics
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.tracked: dict[str, _Tracked] = {}
        self.thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self.alive = False
        self.profiler = None  # torch.profiler.profile while /start_profile runs

    # -- called from the event loop ----------------------------------------
    def start(self) -> None:
        self.alive = True
        self.thread.start()

    def stop(self) -> None:
        self.inbox.put(("stop",))
        self.thread.join(timeout=10)

    def submit(self, engine_request, tracked: _Tracked) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.inbox.put(("add", engine_request, tracked, fut))
        return fut

    def abort(self, request_id: str) -> None:
        self.inbox.put(("abort", request_id))

    # -- engine thread ------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                busy = self.engine.has_unfinished()
                if not self._drain(block=not busy):
                    return
                if self.engine.has_unfinished():
                    self._step()
        except Exception:  # a bug here would hang every client: say so, /health turns 503
            log.exception("engine loop died")
        finally:
            self.alive = False
            for rid in list(self.tracked):
                self._fail(rid, "engine loop stopped")

    def _drain(self, block: bool) -> bool:
        """Execute pending commands; False on stop. Blocks for the first one when idle."""
        try:
            cmd = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            if cmd[0] == "stop":
                return False
            if cmd[0] == "add":
                self._add(*cmd[1:])
            elif cmd[0] == "abort":
                self._abort(cmd[1], "abort")
            elif cmd[0] == "profile":
                self._profile(*cmd[1:])
            try:
                cmd = self.inbox.get_nowait()
            except queue.Empty:
                return True

    def _profile(self, action: str, out_dir: str, fut) -> None:
        """torch.profiler around the engine's steps, started and stopped on this thread
        (the one that steps the engine: the profiler's CPU ops are its thread's); stop
        writes `embedded-<time>.pt.trace.json` in out_dir and answers its path."""
        import torch

        try:
            if action == "start":
                if self.profiler is not None:
                    raise RuntimeError("a profile is already running: POST /stop_profile first")
                activities = [torch.profiler.ProfilerActivity.CPU]
                if torch.cuda.is_available():
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                self.profiler = torch.profiler.profile(activities=activities)
                self.profiler.__enter__()
                fut.set_result(None)
                return
            prof, self.profiler = self.profiler, None
            if prof is None:
                raise RuntimeError("no profile is running: POST /start_profile first")
            prof.__exit__(None, None, None)
            path = f"{out_dir}/embedded-{time.strftime('%Y%m%dT%H%M%S')}.pt.trace.json"
            prof.export_chrome_trace(path)
            fut.set_result(path)
        except Exception as exc:  # noqa: BLE001 - the handler answers it
            fut.set_exception(exc)

    def profile(self, action: str, out_dir: str) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.inbox.put(("profile", action, out_dir, fut))
        return fut

    def _add(self, engine_request, tracked: _Tracked, fut) -> None:
        try:
            self.engine.add_request(engine_request)
        except Exception as exc:  # noqa: BLE001 - queue full, prompt too long: the handler maps it
            fut.set_exception(exc)
            return
        self.tracked[engine_request.request_id] = tracked
        fut.set_result(None)

    def _abort(self, request_id: str, reason: str) -> bool:
        tr = self.tracked.pop(request_id, None)
        if tr is None:
            return False  # finished (or failed) already
        self._engine_abort(request_id)
        self.metrics.request_finished(reason)
        return True

    def _engine_abort(self, request_id: str) -> None:
        try:
            self.engine.abort(request_id)
        except Exception:
            log.exception("engine.abort(%s) failed", request_id)

    def _fail(self, request_id: str, why) -> None:
        tr = self.tracked.get(request_id)
        if tr is None:
            return
        self._abort(request_id, "error")
        tr.sink(Event(finished=True, finish_reason="error", error=APIError(
            f"internal error in request {request_id}: {why}", status=500)))

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as exc:  # noqa: BLE001 - fail the requests, keep serving
            log.error("engine.step() failed:\n%s", traceback.format_exc())
            rid = getattr(exc, "request_id", None)
            for r in ([rid] if rid in self.tracked else list(self.tracked)):
                self._fail(r, f"{type(exc).__name__}: {exc}")
            return
        now = time.monotonic()
        for out in outputs:
            tr = self.tracked.get(out.request_id)
            if tr is None:
                continue  # aborted while the step ran
            try:
                self._process(out.request_id, tr, out, now)
            except Exception as exc:  # noqa: BLE001 - fail this request only
                log.error("output of %s failed:\n%s", out.request_id, traceback.format_exc())
                self._fail(out.request_id, f"{type(exc).__name__}: {exc}")

    def _process(self, rid: str, tr: _Tracked, out, now: float) -> None:
        """vLLM's output processor for one request: counts, latency, text, stop strings."""
        new = list(out.new_token_ids)
        u = tr.usage
        u.prompt_tokens = out.num_prompt_tokens
        u.completion_tokens += len(new)
        u.num_spec_steps = out.num_spec_steps
        u.num_accepted_draft_tokens = out.num_accepted_draft_tokens
        u.num_draft_tokens = out.num_draft_tokens
        if new:
            if tr.first is None:
                tr.first = now
                self.metrics.ttft.observe(now - tr.arrival)
            else:
                self.metrics.itl.observe(now - tr.last)
            tr.last = now
        stopped = tr.stream.add(new)
        finished = bool(out.finished) or stopped
        if not new and not finished:
            return  # a prefill chunk: nothing to say yet
        reason = "stop" if stopped else out.finish_reason
        stop_reason = tr.stream.stop_reason if stopped else (
            new[-1] if reason == "stop" and new and new[-1] in tr.stop_token_ids else None)
        if finished:
            del self.tracked[rid]
            if stopped and not out.finished:
                self._engine_abort(rid)  # free the slot before the next step
            self.metrics.e2e.observe(now - tr.arrival)
            self.metrics.request_finished(reason or "stop")
        tr.sink(Event(text=tr.stream.delta(finished), token_ids=new, finished=finished,
                      finish_reason=reason, stop_reason=stop_reason,
                      usage=Usage(**vars(u))))


# --------------------------------------------------------------------------- HTTP

def _sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def _error_response(err: APIError) -> web.Response:
    return web.json_response(err.body(), status=err.status)


class Server:
    """aiohttp handlers over one engine loop."""

    def __init__(self, engine, model_name: str, model_path: str, max_model_len: int,
                 spec_tokens: int | None, default_chat_template_kwargs: dict | None = None,
                 profile_dir: str | None = None):
        self.engine, self.model_name, self.model_path = engine, model_name, model_path
        self.max_model_len, self.spec_tokens = max_model_len, spec_tokens
        self.default_chat_template_kwargs = default_chat_template_kwargs or {}
        self.tokenizer = engine.tokenizer
        self.metrics = ServerMetrics(engine, model_name, _cache_info(engine, max_model_len))
        self.loop_thread = EngineLoop(engine, self.metrics)
        self.created = int(time.time())
        self.profile_dir = profile_dir

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
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
            req = await self._parse(request, kind)
            prompt_ids = self._prompt_ids(req)
            max_tokens = check_context_length(len(prompt_ids), req.max_tokens,
                                              self.max_model_len)
        except APIError as err:
            return _error_response(err)
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        rid = f"{prefix}-{uuid.uuid4().hex}"
        events: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        tracked = _Tracked(stream=TextStream(self.tokenizer, req.stop),
                           sink=_sink(loop, events),
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

    async def _parse(self, request: web.Request, kind: str) -> GenerationRequest:
        try:
            body = json.loads(await request.read())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(f"malformed JSON body: {exc}") from None
        if kind == "chat":
            return parse_chat(body, self.model_name, self.default_chat_template_kwargs)
        return parse_completion(body, self.model_name)

    def _prompt_ids(self, req: GenerationRequest) -> list[int]:
        if req.kind == "chat":
            kwargs = req.chat_template_kwargs
            try:
                return list(self.tokenizer.apply_chat_template(
                    req.messages, add_generation_prompt=req.add_generation_prompt,
                    tokenize=True, **kwargs))
            except Exception as exc:  # noqa: BLE001 - a template that rejects these messages
                raise APIError(f"chat template failed: {exc}", param="messages") from None
        if req.prompt_token_ids is not None:
            bad = [t for t in req.prompt_token_ids if t >= self.tokenizer.vocab_size]
            if bad:
                raise APIError(f"prompt: token id {bad[0]} is outside the vocabulary "
                               f"(size {self.tokenizer.vocab_size})", param="prompt")
            return req.prompt_token_ids
        ids = self.tokenizer.encode(req.prompt)
        if not ids:
            raise APIError("prompt: the prompt is empty", param="prompt")
        return ids

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
        return resp


def _sink(loop: asyncio.AbstractEventLoop, events: asyncio.Queue):
    """The engine thread's way to hand a request its events (a no-op once the loop closed)."""
    def put(ev: Event) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, ev)
        except RuntimeError:  # the event loop is shut down: nobody is listening
            pass
    return put


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


# --------------------------------------------------------------------------- command line

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specrepro serve", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The embedded engine's OpenAI-compatible server (/v1/completions, "
                    "/v1/chat/completions, /metrics); from the repository root it serves "
                    "models/embedded with no argument.",
        epilog=spec_config_epilog())
    return add_server_flags(p)  # the flags as data: specrepro.speculative.SERVER_FLAGS


def setup_logging(log_file: str | None) -> None:
    """vLLM's log format, to stderr and to --log-file."""
    fmt = logging.Formatter("%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s",
                            datefmt="%m-%d %H:%M:%S")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    root = logging.getLogger()
    for h in handlers:
        h.setFormatter(fmt)
        root.addHandler(h)
    root.setLevel(logging.INFO)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def build_engine(args):
    from specrepro.embedded.config import EngineConfig
    from specrepro.embedded.engine import LLMEngine

    return LLMEngine(EngineConfig(
        model_dir=args.model, device=args.device, dtype=args.dtype,
        quantization=args.quantization, max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len, max_num_batched_tokens=args.max_num_batched_tokens,
        batched_prefill=args.batched_prefill,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes, speculative=args.speculative_config,
        max_waiting=args.max_waiting, seed=args.seed, compile=args.compile,
        compile_scope=args.compile_scope,
        num_threads=engine_threads(args)))


def engine_threads(args) -> int | None:
    """--threads, else one thread on the CPU (measured: OpenMP waits of up to 7.8 ms per
    attention call with 2 threads on a loaded 2-core machine), else torch's default."""
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        return args.threads
    return 1 if args.device == "cpu" else None


def log_engine(engine, args) -> None:
    """The start-up lines vLLM prints, so a harness parses both alike."""
    log.info("Model memory: %.4f GiB (weights and KV caches)", engine.memory_bytes() / 2**30)
    log.info("%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: "
             "%.2fx", "GPU" if args.device == "cuda" else "CPU",
             f"{int(engine.kv_pool_tokens):,}", f"{args.max_model_len:,}",
             float(engine.max_concurrency))


async def serve(server: Server, host: str, port: int, stop: asyncio.Event) -> None:
    # handler_cancellation: a client that goes away cancels its handler, which aborts the
    # request; shutdown_timeout: streams still open at SIGTERM are cut after 5 s
    runner = web.AppRunner(server.app(), handler_cancellation=True, access_log=None,
                           shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1] if port == 0 else port
    # it names itself (vLLM prints "Starting vLLM server on ..." at this point)
    log.info("Starting specrepro embedded server on http://%s:%d", host, bound)
    try:
        await stop.wait()
    finally:
        log.info("Shutting down")
        await runner.cleanup()


def port_taken(host: str, port: int) -> str | None:
    """Why host:port cannot be listened on, in one line naming the listener where this user
    can see it; None where it can (port 0: any free one). Checked before the model loads, so
    a busy port costs no start; the bind itself is checked too (a listener may come between)."""
    if port == 0:
        return None
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's server does
        try:
            s.bind((host, port))
        except OSError as exc:
            return _busy(host, port, exc)
    return None


def _busy(host: str, port: int, exc: OSError) -> str:
    """One line: the bind's error and who listens there (pid, user, command line) as far as
    this user can see, as `specrepro run` names a taken port (harness/lifecycle.py, a layer
    this one does not import)."""
    why = f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    try:
        import psutil

        pids = sorted({c.pid for c in psutil.net_connections(kind="tcp")
                       if c.pid and c.laddr and c.laddr.port == port
                       and c.status == psutil.CONN_LISTEN})
        for pid in pids:
            proc = psutil.Process(pid)
            cmd = " ".join(proc.cmdline())
            why += (f"; pid {pid} (user {proc.username()}) listens there: "
                    f"`{cmd[:160] + ('...' if len(cmd) > 160 else '')}`")
    except Exception as err:  # noqa: BLE001 - naming the listener is a courtesy, not a failure
        log.debug("could not name the listener on port %d: %s", port, err)
    return " ".join(f"{why}; stop it or pass another --port".split())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_file)
    if problem := port_taken(args.host, args.port):
        log.error("%s", problem)
        return 2
    log.info("specrepro embedded engine %s, args: %s", VERSION, vars(args))
    try:
        engine = build_engine(args)
    except (ValueError, FileNotFoundError) as exc:  # a bad flag or checkpoint: say which
        log.error("cannot start the engine: %s", exc)
        return 2
    log_engine(engine, args)
    if args.compile:  # compile before ready, never inside a client's timed window
        log.info("warm-up (torch.compile of every request path) took %.1f s",
                 engine.warm_up())
    spec = args.speculative_config or {}
    spec_tokens = (int(spec.get("num_speculative_tokens") or 0)
                   if args.per_request_spec_decode_metrics != "none" else None)
    if args.profile_dir:
        import os

        os.makedirs(args.profile_dir, exist_ok=True)
    server = Server(engine, args.served_model_name or args.model, args.model,
                    args.max_model_len, spec_tokens, args.default_chat_template_kwargs,
                    args.profile_dir)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(server, args.host, args.port, stop)

    try:
        asyncio.run(run())
    except OSError as exc:  # the port taken after the check above: one line, not a traceback
        if exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise
        log.error("%s", _busy(args.host, args.port, exc))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
