"""The steady window (harness/steady.py): against a fake engine, it opens after ramp-up and
closes before drain, every stream turns over, the caps spread; an engine that queues
streams is flagged; on constructed records, each rule of `window_all_busy`."""

from __future__ import annotations

import math

import pytest

from fake_engine import FakeEngine
from specrepro.harness import engine_http, engines, promtext, steady
from specrepro.harness.loadgen import LoadConfig, LoadGenerator
from specrepro.harness.records import LoadResult, RequestRecord
from specrepro.params.window import Window
from specrepro.workloads import Prompt

PROMPTS = [Prompt(id=f"p{i}", workload="essays", max_tokens=16, text=f"prompt number {i}")
           for i in range(4)]


@pytest.fixture
def engine(request):
    made = []

    def make(**kw) -> FakeEngine:
        made.append(FakeEngine(**kw))
        return made[-1]

    yield make
    for e in made:
        e.close()


def run_window(eng: FakeEngine, c: int, **window) -> LoadResult:
    w = Window(**{"skip_s": 0.0, "window_s": 0.3, "turnovers": 2, "max_window_s": 4.0,
                  **window})
    cfg = LoadConfig(url=eng.url, model="fake", concurrency=c, steady=w,
                     features=engines.engine("vllm").request_features)
    return LoadGenerator(cfg).run(PROMPTS, lambda: engine_http.http_get(f"{eng.url}/metrics")[1]
                                  .decode())


def tokens(text_a: str, text_b: str) -> float:
    a, b = (promtext.parse(t, engines.engine("vllm").metrics) for t in (text_a, text_b))
    return promtext.delta(a, b).generation_tokens


def test_the_window_opens_after_ramp_up_and_closes_before_drain(engine):
    eng = engine(slots=8, step_s=0.01, cold_s=0.5)  # the load's first step is a cold 0.5 s
    res = run_window(eng, 4)
    opened, closed = res.span
    # opened once every stream had a token, so after the cold step
    assert res.start_at[0] - res.load_start >= 0.5
    firsts = {}
    for r in res.records:
        firsts[r.stream] = min(firsts.get(r.stream, math.inf), r.arrivals[0])
    assert sorted(firsts) == [0, 1, 2, 3] and max(firsts.values()) < res.start_at[0]
    # inside: every step ran all four streams but for turnovers; the drain came after the
    # closing scrape (no request sent after it; steps with fewer streams follow it)
    inside = eng.running_between(opened, closed)
    assert inside and min(inside) >= 2 and sum(inside) / len(inside) >= 3.5
    assert all(r.started <= res.end_at[1] for r in res.records)
    assert min(eng.running_between(res.end_at[1], math.inf)) < 4
    # every stream completed two requests inside the window
    assert min(steady.completed_per_stream(res.records, opened, 4, closed)) >= 2
    # the window's counter rate is the engine's steady rate, not the whole load's
    window_rate = tokens(res.start, res.window) / res.wall_s
    whole = tokens(res.before, res.after) / (max(r.started + r.e2e_s for r in res.records)
                                             - res.load_start)
    assert window_rate > 1.3 * whole
    # caps spread over [8, 16] request by request (every request ran to its cap)
    caps = {r.completion_tokens for r in res.records}
    assert min(caps) >= 8 and max(caps) == 16 and len(caps) >= 3


@pytest.mark.parametrize("slots, busy", [(4, True), (2, False)])
def test_an_engine_that_queues_streams_is_flagged(engine, slots, busy):
    eng = engine(slots=slots, step_s=0.02)
    res = run_window(eng, 4, window_s=0.6)
    warnings: list[str] = []
    vllm = engines.engine("vllm").metrics
    g = [steady.gauges(promtext.parse(t, vllm)) for t in (res.start, res.window)]
    row = steady.window_fields(res, 4, Window(turnovers=2), g[0], g[1], warnings)
    assert row["window_all_busy"] is busy
    assert row["window_running_start"] == (4 if busy else 2) or busy  # a turnover may show
    assert any("queued streams" in w for w in warnings) is (not busy)


def test_spread_caps_are_deterministic_and_within_their_range():
    caps = [steady.spread_cap(48, i, 0.5) for i in range(200)]
    assert caps == [steady.spread_cap(48, i, 0.5) for i in range(200)]
    assert caps[0] == 48 and min(caps) >= 24 and max(caps) == 48
    assert len(set(caps)) >= 20  # spread, not bunched
    assert steady.spread_cap(48, 7, 0.0) == 48 and steady.spread_cap(1, 5, 0.9) == 1


# --------------------------------------------------------------- constructed windows


def stream_records(stream: int, spans, gap: float = 0.1) -> list[RequestRecord]:
    """Back-to-back requests of one stream, a token every `gap` seconds."""
    out = []
    for i, (a, b) in enumerate(spans):
        r = RequestRecord(request_idx=10 * stream + i, prompt_id="p", seed=0, stream=stream,
                          started=a, e2e_s=b - a, finish_reason="length")
        t = a + gap
        while t <= b + 1e-9:
            r.add_chunk(t, 1)
            t += gap
        out.append(r)
    return out


def constructed(records, start=(0.49, 0.51), end=(3.49, 3.51)) -> LoadResult:
    res = LoadResult(records, 3.0, load_start=0.0, start_at=start, end_at=end)
    res.span = (sum(start) / 2, sum(end) / 2)
    return res


FULL = [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0), (3.0, 4.0)]


def fields(records, start_gauges=(2, 0), end_gauges=(2, 0), **kw):
    warnings: list[str] = []
    row = steady.window_fields(constructed(records, **kw), 2, Window(turnovers=3),
                               start_gauges, end_gauges, warnings)
    return row, warnings


def test_a_steady_window_of_two_streams_is_all_busy():
    row, warnings = fields(stream_records(0, FULL) + stream_records(1, FULL))
    assert row["window_all_busy"] is True and warnings == []
    assert (row["window_turnovers_min"], row["window_requests"]) == (3, 6)
    assert row["window_start_s"] == pytest.approx(0.5) and row["timing"] == "window"
    assert (row["window_running_start"], row["window_waiting_end"]) == (2, 0)


def test_a_stream_without_a_token_when_the_window_opens_is_ramp_up():
    late = stream_records(1, [(0.0, 1.0)], gap=0.8) + stream_records(1, FULL[1:])
    row, warnings = fields(stream_records(0, FULL) + late, start=(0.7, 0.72))
    assert row["window_all_busy"] is False and "ramp-up not over" in warnings[0]


def test_a_stream_idle_inside_the_window_is_flagged():
    gappy = [(0.0, 1.0), (1.0, 2.0), (2.5, 3.0), (3.0, 4.0)]
    row, warnings = fields(stream_records(0, FULL) + stream_records(1, gappy))
    assert row["window_all_busy"] is False and "stream 1: 0.50 s" in warnings[0]


def test_the_engine_running_fewer_streams_at_both_scrapes_is_flagged():
    records = stream_records(0, FULL) + stream_records(1, FULL)
    # no request ends near 0.5 s or 3.5 s: one stream queued all window long
    row, warnings = fields(records, start_gauges=(1, 1), end_gauges=(1, 1))
    assert row["window_all_busy"] is False and "queued streams" in warnings[0]
    # short at one scrape only: a reading that fell in a turnover is noise
    row, warnings = fields(records, start_gauges=(1, 1))
    assert row["window_all_busy"] is True and warnings == []
    # a stream whose next request waited 0.5 s for its first token was queued
    queued = stream_records(1, [(0.0, 0.4)]) + stream_records(1, [(0.4, 1.0)], gap=0.5) \
        + stream_records(1, [(1.0, 2.0), (2.0, 3.4)]) \
        + stream_records(1, [(3.4, 4.0)], gap=0.5)
    row, warnings = fields(stream_records(0, FULL) + queued, start_gauges=(1, 1),
                           end_gauges=(1, 1))
    assert row["window_all_busy"] is False
    # a request of stream 1 ended at 0.45 s and its next had a token at 0.55 s: the
    # opening scrape at 0.5 s fell in that quick turnover, so one deficit is explained
    turning = stream_records(1, [(0.0, 0.45), (0.45, 1.0), (1.0, 2.0), (2.0, 3.0),
                                 (3.0, 4.0)])
    row, warnings = fields(stream_records(0, FULL) + turning, start_gauges=(1, 1),
                           end_gauges=(1, 1))
    assert row["window_all_busy"] is True and warnings == []
    # an engine that reports no gauges is judged from the client's records alone
    row, _ = fields(records, start_gauges=None, end_gauges=None)
    assert row["window_all_busy"] is True and row["window_running_start"] is None


def test_too_few_turnovers_at_max_window_say_so():
    short = [(0.0, 1.5), (1.5, 3.0), (3.0, 4.5)]
    row, warnings = fields(stream_records(0, FULL) + stream_records(1, short))
    assert row["window_turnovers_min"] == 2 and row["window_all_busy"] is True
    assert any("fewer than the 3 turnovers" in w for w in warnings)


# ------------------------------------------------------- the rules the generator's loop asks


def test_the_window_opens_after_skip_once_every_stream_has_a_token():
    w = Window(skip_s=0.5, window_s=1.0, max_window_s=2.0)
    one = stream_records(0, FULL[:1])
    assert not steady.may_open(one, {}, 2, 0.4, w)  # skip_s not over
    assert not steady.may_open(one, {}, 2, 0.6, w)  # stream 1 has no token yet
    live = {1: stream_records(1, [(0.0, 0.3)])[0]}  # its first request, in flight
    assert steady.may_open(one, live, 2, 0.6, w)
    assert steady.give_up_at(10.0, w) == pytest.approx(12.5)


def test_the_window_closes_on_a_tick_once_every_stream_turned_over_or_at_its_longest():
    w = Window(skip_s=0.0, window_s=1.0, turnovers=2, max_window_s=2.0)
    ticks = list(steady.closing_ticks(0.5, w))
    assert ticks == pytest.approx([1.5 + steady.GRID_S * i for i in range(4)] + [2.5])
    assert steady.closing_ticks(0.0, Window(window_s=3.0, max_window_s=3.0)).__next__() == 3.0
    records = stream_records(0, FULL) + stream_records(1, [(0.0, 2.0), (2.0, 3.0)])
    # stream 1 completes its second request inside the window (opened at 0.5) at 3.0 s
    assert not steady.may_close(records[:5], 0.5, 2, 1.5, w)
    assert steady.may_close(records, 0.5, 2, 2.0, w)
    assert steady.may_close(records[:4], 0.5, 2, 2.5, w)  # max_window_s: closes anyway


def test_the_steady_window_is_arithmetic_on_real_types_and_drives_no_load():
    """steady.py reads what the client recorded and answers the generator's questions; the
    asyncio loop is the generator's. No name of it stands in for another module's type
    (`X = Any`), every annotation of its functions resolves to a type, and it defines no
    coroutine (nothing here drives workers or calls back into the generator)."""
    import inspect
    import typing

    def parts(tp) -> list:
        return [tp, *(p for a in typing.get_args(tp) for p in parts(a))]

    assert not [n for n, v in vars(steady).items() if v is typing.Any]
    for name, fn in inspect.getmembers(steady, inspect.isfunction):
        if fn.__module__ != steady.__name__:
            continue
        assert not inspect.iscoroutinefunction(fn), f"steady.{name} is a coroutine"
        hints = typing.get_type_hints(fn)
        assert all(typing.Any not in parts(tp) for tp in hints.values()), (name, hints)
