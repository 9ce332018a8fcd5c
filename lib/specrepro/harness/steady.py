"""The steady window of a multi-stream speed cell: when it opens and closes, and what it saw.

Design:
- Why a window. A multi-stream cell sent as "every prompt once" lasts one request per
  stream (0.9-1.6 s at 8 streams here): its span is ramp-up (every stream's prefill at
  once), a moment of full batch, and drain (streams finishing one by one while the others
  idle), and its rate is mostly those edges. A study's `window:` block (params/window.py)
  times such cells instead over a window of the engine's own counters inside a longer
  closed-loop load (loadgen: N workers cycling the prompts), as article A did (a 40-s
  counter window) and scripts/bench_standin.py's speed cells do.
- This module is the window's arithmetic, on what the client recorded (harness/records.py):
  when it may open and close, the output caps, and what it saw. The asyncio loop that runs
  the workers and takes the scrapes is the load generator's (`LoadGenerator`, loadgen.py),
  which asks these rules; nothing here imports the generator or calls back into it.
- Opening (`may_open`): the load starts; the window opens `skip_s` later, and never
  before every stream has received a token of its first request: then every prefill of
  the synchronized start is over (ramp-up excluded). The opening scrape is `start`; its
  monotonic bounds are kept and the counters count from its midpoint.
- Closing (`closing_ticks`, `may_close`): at the first `GRID_S` tick at or past `window_s`
  after the opening where every stream has completed `turnovers` requests inside the
  window, or at `max_window_s`. Ticks,
  not completions, choose the instant, so the closing scrape does not fall systematically
  in the turnover of the stream that completed last. Sending stops only after the closing
  scrape, so no stream has stopped inside the window (drain excluded); requests in flight
  then finish and are kept with the others (their outputs are graded and compared; the
  `after` scrape checks the counters against everything the client received). The
  client's latencies (TTFT, ITL, end to end) are those of the requests sent and answered
  inside the window (`inside`); the engine's histograms are read over the same scrapes.
- Turnover: output caps are spread request by request over `[cap * (1 - spread), cap]`
  (`spread_cap`, deterministic in the request index, so a repeat with the same seed sends
  the same requests): with one cap every stream that starts together ends together, and the
  engine's batch would empty and refill in lockstep. `turnovers` (3 by default) makes the
  window hold whole cycles of every stream (prefill, decode, finish, the next request);
  `window_turnovers_min` records the fewest any stream completed inside it.
- All streams busy (`window_all_busy`, with warnings naming the cause), from the client's
  records and the engine's gauges at the two scrapes:
  (a) ramp-up over: every stream had a token before the opening scrape;
  (b) no stream idle inside the window for more than `IDLE_GAP_S` (a worker that stopped,
      a client that could not keep up);
  (c) where the engine reports running requests: not at both scrapes fewer than
      concurrency − (the streams in a turnover then). One reading is often short by a
      turnover: measured on this 2-core box (embedded engine, block drafter, 8 streams,
      caps spread 24-48), 58-62 % of gauge readings in steady load showed fewer than 8
      running and 32 % fewer than 8 held (running + waiting), each short stream one whose
      request had just ended and whose next was waiting for its prefill. So a stream
      counts in a turnover at a scrape when the scrape fell between one of its requests'
      end and its next request's first token, and that gap was short (`lag`: three steps,
      the median gap between token-carrying chunks, plus `LAG_FLOOR_S`). With that, 0 of
      135 readings (block drafter, 8 streams), 0 of 91 (4 streams) and 0 of 88 (MTP, 2
      streams) were short, but 5 of 136 without speculation at 8 streams (a prefill there
      takes 4-5 of its 44-ms steps): one short reading is noise, so only a deficit at both
      scrapes flags the cell (an engine with fewer slots than streams queues the same
      streams all window long; a ramp-up not over is rule (a)).
  The gauges are recorded as read (`window_running_*`, `window_waiting_*`).
- Single-stream cells send every prompt once unless the study's window covers them
  (params/window.py): one stream has no ramp-up across streams and no drain, and n prompts
  turn it over n times. Defaults (GPU, article A) and the CPU suite's sizes are argued in params/window.py
  and params/default.yaml.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterator, Mapping, Sequence

from specrepro.harness.promtext import SpecCounters
from specrepro.harness.records import LoadResult, RequestRecord
from specrepro.params.window import Window

POLL_S = 0.02  # how often the opening condition is checked (the client's core; ~free)
GRID_S = 0.25  # the closing ticks after window_s
IDLE_GAP_S = 0.1  # a stream without a request in flight this long inside the window is idle
LAG_FLOOR_S = 0.05  # HTTP and scheduling slack of a turnover, beyond its two steps
GOLDEN = (math.sqrt(5) - 1) / 2  # low-discrepancy spread: caps never bunch up


def spread_cap(cap: int, index: int, spread: float) -> int:
    """Request `index`'s output cap: `cap` less up to `spread` of it, the fractions
    frac(index x golden ratio) (request 0 keeps the cap), at least 1 token."""
    if spread <= 0:
        return cap
    cut = math.floor(spread * cap * ((index * GOLDEN) % 1.0))
    return max(1, cap - cut)


def end_time(r: RequestRecord) -> float | None:
    return None if r.e2e_s is None else r.started + r.e2e_s


def streams_with_token(records: Sequence[RequestRecord],
                       live: Mapping[int, RequestRecord]) -> set[int]:
    """The streams that have received at least one token, ended requests or in flight."""
    have = {r.stream for r in records if r.arrivals and not r.warmup}
    return have | {s for s, r in live.items() if r.arrivals}


def completed_per_stream(records: Sequence[RequestRecord], opened: float, n: int,
                         closed: float | None = None) -> list[int]:
    """Per stream 0..n-1: requests answered whole that ended inside (opened, closed]."""
    counts = [0] * n
    for r in records:
        end = end_time(r)
        if (r.ok and not r.warmup and r.stream is not None and r.stream < n
                and end is not None and end > opened and (closed is None or end <= closed)):
            counts[r.stream] += 1
    return counts


def inside(records: Sequence[RequestRecord], span: tuple[float, float]) -> list[RequestRecord]:
    """The requests sent after the window opened and answered before it closed: the
    client's latencies of a steady cell are theirs (the ramp-up's requests queue behind
    every stream's prefill, the drain's run in an emptying batch)."""
    lo, hi = span
    return [r for r in records if r.started >= lo and (end := end_time(r)) is not None
            and end <= hi]


def fewest_completed(records: Sequence[RequestRecord], opened: float, n: int) -> int:
    return min(completed_per_stream(records, opened, n))


# ------------------------------------------------------------------ opening and closing


def may_open(records: Sequence[RequestRecord], live: Mapping[int, RequestRecord], n: int,
             since_start: float, window: Window) -> bool:
    """Whether the window may open `since_start` seconds into the load: `skip_s` is over
    and every one of the n streams has received a token (ramp-up over)."""
    return since_start >= window.skip_s and len(streams_with_token(records, live)) >= n


def give_up_at(start: float, window: Window) -> float:
    """When the load started at `start` stops waiting to open the window: a stream that
    never gets a token leaves the cell flagged (window_fields), not the load hung."""
    return start + window.skip_s + window.max_window_s


def closing_ticks(opened: float, window: Window) -> Iterator[float]:
    """The instants the window may close at, after it opened at `opened`: `window_s` on,
    every `GRID_S`, the last at `max_window_s`."""
    last = opened + window.max_window_s
    tick = min(opened + window.window_s, last)
    while True:
        yield tick
        if tick >= last:
            return
        tick = min(tick + GRID_S, last)


def may_close(records: Sequence[RequestRecord], opened: float, n: int, tick: float,
              window: Window) -> bool:
    """Whether the window closes at `tick`: every stream has completed `turnovers`
    requests inside it, or it reached `max_window_s`."""
    return (tick >= opened + window.max_window_s
            or fewest_completed(records, opened, n) >= window.turnovers)


# ------------------------------------------------------------------ what the window saw


Gauges = tuple[float | None, float | None]  # (running, waiting) as one scrape read them


def step_lag(records: Sequence[RequestRecord], lo: float, hi: float) -> float:
    """How long a turnover may take: three steps (the median gap between token-carrying
    chunks inside [lo, hi]) plus LAG_FLOOR_S."""
    gaps = [b[0] - a[0] for r in records for a, b in zip(r.chunks, r.chunks[1:])
            if lo <= a[0] and b[0] <= hi]
    return LAG_FLOOR_S + (3 * statistics.median(gaps) if gaps else 0.0)


def turning_over(records: Sequence[RequestRecord], at: tuple[float, float], lag: float
                 ) -> int:
    """Streams in a quick turnover at the scrape whose bounds are `at`: one request ended
    and the stream's next had its first token within `lag` of it, and the scrape fell
    between the two (widened by `lag`: the engine drops a request before its last chunk
    arrives). A stream whose next request waited longer was queued, not turning over."""
    streams: dict[int, list[RequestRecord]] = {}
    for r in records:
        if r.stream is not None and not r.warmup:
            streams.setdefault(r.stream, []).append(r)
    n = 0
    for rs in streams.values():
        rs.sort(key=lambda r: r.started)
        for p, q in itertools.pairwise(rs):
            end = end_time(p)
            if end is None or not q.arrivals:
                continue
            first = q.arrivals[0]
            if first - end <= lag and end - lag <= at[1] and at[0] <= first + lag:
                n += 1
                break
    return n


def idle_streams(records: Sequence[RequestRecord], n: int, lo: float, hi: float
                 ) -> list[tuple[int, float]]:
    """(stream, its longest gap without a request in flight inside [lo, hi]) for each
    stream whose gap exceeds IDLE_GAP_S."""
    out = []
    for s in range(n):
        spans = sorted((r.started, end_time(r) or hi) for r in records
                       if r.stream == s and not r.warmup)
        covered, longest = lo, 0.0
        for a, b in spans:
            if b <= covered:
                continue
            longest = max(longest, min(a, hi) - covered)
            covered = max(covered, b)
            if covered >= hi:
                break
        longest = max(longest, hi - covered)
        if longest > IDLE_GAP_S:
            out.append((s, longest))
    return out


def window_fields(result: LoadResult, n: int, window: Window, start: Gauges | None,
                  end: Gauges | None, warnings: list[str]) -> dict:
    """The cells columns of a steady window (module docstring); the reasons a window was
    not steady go to `warnings`."""
    records = [r for r in result.records if not r.warmup]
    opened, closed = result.span
    counts = completed_per_stream(records, opened, n, closed)
    running = [_int(g[0]) if g else None for g in (start, end)]
    waiting = [_int(g[1]) if g else None for g in (start, end)]
    busy = True
    first = {}
    for r in records:
        if r.arrivals and r.stream is not None:
            first[r.stream] = min(first.get(r.stream, math.inf), r.arrivals[0])
    late = [s for s in range(n) if first.get(s, math.inf) >= result.start_at[0]]
    if late:
        busy = False
        warnings.append(f"window not steady: {len(late)} of {n} streams had no token when "
                        f"the window opened {result.start_at[0] - result.load_start:.2f} s "
                        "into the load (ramp-up not over)")
    idle = idle_streams(records, n, opened, closed)
    if idle:
        busy = False
        s, gap = max(idle, key=lambda x: x[1])
        warnings.append(f"window not steady: {len(idle)} of {n} streams idle inside it "
                        f"(stream {s}: {gap:.2f} s without a request in flight)")
    lag = step_lag(records, opened, closed)
    turning = [turning_over(records, at, lag) for at in (result.start_at, result.end_at)]
    if None not in running and all(run < n - t for run, t in zip(running, turning)):
        busy = False
        warnings.append(
            f"window not steady: the engine ran {running[0]} and {running[1]} requests as "
            f"the window opened and closed, fewer than {n} streams less the {turning[0]} and "
            f"{turning[1]} turning over then: it queued streams it did not run (too few "
            "slots?)")
    if min(counts) < window.turnovers:
        warnings.append(f"window closed at max_window_s ({window.max_window_s:g} s) with a "
                        f"stream that completed {min(counts)} requests inside it, fewer than "
                        f"the {window.turnovers} turnovers declared")
    return {"timing": "window", "window_start_s": opened - result.load_start,
            "window_turnovers_min": min(counts), "window_requests": sum(counts),
            "window_running_start": running[0], "window_running_end": running[1],
            "window_waiting_start": waiting[0], "window_waiting_end": waiting[1],
            "window_all_busy": busy}


def _int(x: float | None) -> int | None:
    return None if x is None else round(x)


def gauges(counters: SpecCounters | None) -> Gauges | None:
    """(running, waiting) of a promtext.SpecCounters scrape, None where it is missing."""
    if counters is None:
        return None
    return counters.requests_running, counters.requests_waiting


NOT_WINDOWED = {"window_start_s": None, "window_turnovers_min": None, "window_requests": None,
                "window_running_start": None, "window_running_end": None,
                "window_waiting_start": None, "window_waiting_end": None,
                "window_all_busy": None}
