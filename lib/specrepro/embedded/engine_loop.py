"""The engine thread of the embedded server: the one thread that steps the `LLMEngine`, and
the output processing a vLLM front end does on what each step returns.

Design:
- Two threads. The engine thread (`EngineLoop`) owns the engine: it executes commands (add,
  abort, profile) from a thread-safe inbox between steps, calls `engine.step()` while work
  is unfinished, and runs the output processing (incremental detokenization, stop strings,
  latency histograms). It hands each request's events to that request's `asyncio.Queue`
  through its sink (`event_sink`: `loop.call_soon_threadsafe`). The event-loop thread
  (api_server.py) validates requests, renders chat templates, awaits events and writes JSON
  or SSE chunks.
- Stop strings are matched on the detokenized text after each step (`protocol.TextStream`),
  and text that could be the start of a stop string is held back until it cannot be; a match
  aborts the request in the engine before its next step, so no slot is held for text nobody
  will see. As in vLLM, the tokens of that step count in `completion_tokens` and the text is
  cut before the stop string.
- One event per engine step and request: a speculative step that yields several tokens sends
  them in one event (one chunk), and `continuous_usage_stats` lets a client count them.
- Faults stay per request: an exception while processing one request's output fails only that
  request; an exception from `engine.step()` fails the request named by the exception's
  `request_id` attribute, or else every request in flight (the engine's state for them
  cannot be trusted), and the loop keeps stepping. Should the loop itself die, every request
  in flight fails and `alive` turns False (/health answers 503).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field

from specrepro.embedded.protocol import APIError, TextStream, Usage
from specrepro.embedded.server_metrics import ServerMetrics

log = logging.getLogger(__name__)


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
class Tracked:
    """Engine-thread state of one request in flight; the route that accepted it builds it
    (api_server.py) and the engine thread owns it once submitted."""

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
        self.tracked: dict[str, Tracked] = {}
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

    def submit(self, engine_request, tracked: Tracked) -> concurrent.futures.Future:
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

    def _add(self, engine_request, tracked: Tracked, fut) -> None:
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

    def _process(self, rid: str, tr: Tracked, out, now: float) -> None:
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


def event_sink(loop: asyncio.AbstractEventLoop, events: asyncio.Queue):
    """The engine thread's way to hand a request its events (a no-op once the loop closed)."""
    def put(ev: Event) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, ev)
        except RuntimeError:  # the event loop is shut down: nobody is listening
            pass
    return put
