"""What one cell's load left: each request as the client saw it, and the load's scrapes.

Design:
- `RequestRecord` is one request as the client saw it: when it was sent, each token's
  arrival and the chunks they came in, its text and token ids, its finish or error, the
  engine's per-response acceptance fields, and the stream (worker) that sent it. `row()` is
  its row of the requests table (timings stored as chunk gaps, metrics.arrival_gaps_us).
- `LoadResult` is one cell's load: its records and the engine's `/metrics` scrapes at the
  measured span's edges (`before` after warm-up, `start` and `window` as a steady window
  opens and closes, `after` once every request ended), with the monotonic bounds of each
  steady-window scrape. A scrape's value is whatever the caller's scrape callable returns
  (the harness: the `/metrics` text).
- Its own module, below its writer and its readers: the load generator
  (loadgen.py) fills them, the steady window's arithmetic (steady.py) and a cell's figures
  (cells.py) read them, and neither reader imports the generator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specrepro.metrics import arrival_gaps_us


@dataclass
class RequestRecord:
    """One request as the client saw it (columns of the requests table, plus timing)."""

    request_idx: int
    prompt_id: str
    seed: int
    started: float = 0.0  # time.monotonic() when sent
    arrivals: list[float] = field(default_factory=list)  # monotonic time of each token
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (monotonic time, tokens)
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    text: str = ""
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    error: str | None = None
    # per-response acceptance fields: vLLM `metrics`, SGLang `sglext`, or `sglang_meta` (the
    # speculative fields and token counts of a native /generate's final meta_info)
    spec: dict | None = None
    warmup: bool = False
    stream: int | None = None  # the worker (stream) that sent it, 0 .. concurrency-1

    @property
    def ok(self) -> bool:
        return self.error is None

    def add_chunk(self, now: float, m: int) -> None:
        """m tokens arrived together at `now` (monotonic): the first chunk sets the TTFT and
        its other tokens get 0 s; a later chunk's gap since the last token is split over its
        m tokens (`itl_s`, what `metrics.token_gaps_s` derives from the stored chunks)."""
        if not self.arrivals:
            self.ttft_s = now - self.started
            self.itl_s += [0.0] * (m - 1)
        else:
            self.itl_s += [(now - self.arrivals[-1]) / m] * m
        self.arrivals += [now] * m
        self.chunks.append((now, m))

    def row(self) -> dict:
        """The record as a row of the requests table (without cell id, attempt, grades)."""
        return {"request_idx": self.request_idx, "prompt_id": self.prompt_id, "seed": self.seed,
                "ttft_s": self.ttft_s, "e2e_s": self.e2e_s,
                # what was measured: each token-carrying chunk's arrival after the one
                # before (the first's after the request was sent), µs, and its tokens;
                # `itl_s` is derived from them (metrics.token_gaps_s), not stored: float
                # seconds are 8 bytes a token that do not compress
                "chunk_gap_us": arrival_gaps_us([t - self.started for t, _ in self.chunks]),
                "chunk_tokens": [m for _, m in self.chunks],
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "text": self.text,
                "token_ids": self.token_ids, "finish_reason": self.finish_reason,
                "error": self.error, "stream": self.stream}


@dataclass
class LoadResult:
    """The measured requests and the counter scrapes at the span's edges."""

    records: list[RequestRecord]
    wall_s: float | None  # first send to last end (requests) or the window's span
    before: Any = None  # scrape() after warm-up
    window: Any = None  # scrape() as a steady window closes
    after: Any = None  # scrape() once every request ended
    span: tuple[float, float] | None = None  # monotonic start/end of the measured span
    start: Any = None  # scrape() as a steady window opens (None: the span opens at `before`)
    load_start: float | None = None  # monotonic: the measured load's first send
    # monotonic bounds of the steady window's opening and closing scrapes (the counters
    # were read somewhere inside each; the span runs midpoint to midpoint)
    start_at: tuple[float, float] | None = None
    end_at: tuple[float, float] | None = None

    def tokens_in_span(self) -> int:
        """Output tokens the client received inside the span (a window's client count)."""
        if self.span is None:
            return sum(r.completion_tokens or 0 for r in self.records if r.ok)
        lo, hi = self.span
        return sum(lo <= t <= hi for r in self.records for t in r.arrivals)
