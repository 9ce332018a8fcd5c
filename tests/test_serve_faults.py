"""Faults, with the engine in this process so a test can reach into it: a full waiting queue,
a request whose processing fails, an engine step that raises, a client that disconnects."""

import threading
import time

import requests

POISON = 7  # first prompt token of the request a test breaks


def _wait(cond, timeout=15.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _complete(url, prompt, max_tokens=8, **kw):
    return requests.post(f"{url}/v1/completions", timeout=60, json={
        "model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, **kw})


def _open_stream(url, path, body):
    """A streaming request whose first chunk has arrived; the connection stays open until
    `.close()` (closing the line iterator early would close the connection)."""
    r = requests.post(f"{url}{path}", stream=True, timeout=60, json={**body, "stream": True})
    r.lines = r.iter_lines()
    assert next(line for line in r.lines if line).startswith(b"data: {")
    return r


def _poison(engine, breaker):
    """Wrap engine.step so `breaker(outputs, poisoned_ids)` can break a marked request."""
    real_add, real_step, poisoned = engine.add_request, engine.step, set()

    def add_request(req):
        if req.prompt_token_ids[0] == POISON:
            poisoned.add(req.request_id)
        return real_add(req)

    def step():
        return breaker(real_step(), poisoned)
    engine.add_request, engine.step = add_request, step


def _all_free(engine):
    return (len(engine.free_slots) == engine.config.max_num_seqs and not engine.running
            and not engine.waiting)


def test_full_queue_answers_503(inprocess_server):
    srv = inprocess_server(max_num_seqs=1, max_waiting=1, max_model_len=4096)
    engine = srv.engine
    running = _open_stream(srv.url, "/v1/completions", {
        "model": "tiny", "prompt": "a", "max_tokens": 4000, "ignore_eos": True})
    waiting = []
    t = threading.Thread(target=lambda: waiting.append(_complete(srv.url, "b", 4)))
    t.start()
    _wait(lambda: engine.stats.num_waiting == 1, what="a waiting request")
    r = _complete(srv.url, "c")
    assert r.status_code == 503
    err = r.json()["error"]
    assert err["type"] == "ServiceUnavailableError" and "full" in err["message"]
    running.close()  # the waiting request now gets the slot
    t.join(60)
    assert waiting[0].status_code == 200
    _wait(lambda: _all_free(engine), what="free slots")


def test_failing_request_fails_alone(inprocess_server):
    srv = inprocess_server()

    def breaker(outputs, poisoned):
        for out in outputs:
            if out.request_id in poisoned:
                out.new_token_ids = None  # garbage from the engine for this request only
        return outputs
    _poison(srv.engine, breaker)
    results = {}
    threads = [threading.Thread(target=lambda p=p: results.__setitem__(
        p, _complete(srv.url, [p, 3, 4], 40))) for p in (POISON, 9, 10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results[POISON].status_code == 500
    assert results[POISON].json()["error"]["type"] == "InternalServerError"
    for p in (9, 10):
        assert results[p].status_code == 200
        assert results[p].json()["usage"]["completion_tokens"] == 40
    _wait(lambda: _all_free(srv.engine), what="free slots")


def test_step_exception_fails_requests_in_flight_and_the_server_keeps_serving(
        inprocess_server):
    srv = inprocess_server()

    def breaker(outputs, poisoned):
        if poisoned & set(srv.engine.running):
            raise RuntimeError("injected fault in engine.step")
        return outputs
    _poison(srv.engine, breaker)
    r = _complete(srv.url, [POISON, 1, 2], 40)
    assert r.status_code == 500 and "injected fault" in r.json()["error"]["message"]
    stream = requests.post(f"{srv.url}/v1/completions", timeout=60, json={
        "model": "tiny", "prompt": [POISON, 5], "max_tokens": 40, "stream": True})
    assert stream.status_code == 500  # failed before its first chunk: a plain error
    _wait(lambda: _all_free(srv.engine), what="free slots")
    ok = _complete(srv.url, "fine", 12)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 12
    metrics = requests.get(f"{srv.url}/metrics", timeout=10).text
    assert 'vllm:request_success_total{engine="0",finished_reason="error",model_name="tiny"} 2.0' \
        in metrics


def test_disconnect_frees_the_engine_slot(inprocess_server):
    srv = inprocess_server(max_num_seqs=2)
    streams = []
    for prompt in ("a", "b"):
        streams.append(_open_stream(srv.url, "/v1/chat/completions", {
            "model": "tiny", "messages": [{"role": "user", "content": prompt}],
            "ignore_eos": True}))
    assert len(srv.engine.free_slots) == 0
    for r in streams:
        r.close()
    _wait(lambda: _all_free(srv.engine), what="free slots")
    text = requests.get(f"{srv.url}/metrics", timeout=10).text
    assert 'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0' in text
    assert 'finished_reason="abort",model_name="tiny"} 2.0' in text


def test_health_turns_503_when_the_engine_loop_dies(inprocess_server):
    srv = inprocess_server()
    assert requests.get(f"{srv.url}/health", timeout=10).status_code == 200

    def broken():
        raise RuntimeError("engine state corrupted")
    srv.engine.has_unfinished = broken
    srv.server.loop_thread.abort("wake-the-loop")
    _wait(lambda: requests.get(f"{srv.url}/health", timeout=10).status_code == 503,
          what="/health 503")
