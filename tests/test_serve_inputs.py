"""Bad inputs to the embedded server (issue 41), each answered clearly and alone:

- at start, every bad flag is one line naming it and its value, exit status 2, before the
  model loads where it can be (a port out of range, a host that is not this machine's,
  `--device cuda` without CUDA, a log file that cannot be opened, a context past the model's
  positions) or once the engine is sized (a KV pool that cannot hold one request);
- a 10 MB body is refused without holding up `/health` (measured: every probe under 100 ms);
- `--api-key` as vLLM's: /v1 wants the bearer token (401 otherwise), /health stays open;
- a client gone mid-stream is one log line, not a traceback;
- the model answers to its served name (`embedded` for models/embedded) and to its path.

The start-up checks call `serve.main` in this process (its `serve` replaced, so that a flag
that is not refused fails the test instead of serving); the rest run on the in-process
server over the tiny checkpoint."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
import requests

from specrepro.embedded import serve


@pytest.fixture
def start(monkeypatch, capsys):
    """`start(*flags)` -> (exit status, the lines it wrote to stderr), the root logger's
    handlers restored after each call (serve.main adds its own)."""
    async def no_serving(*_):
        raise AssertionError("the server started: the flag was not refused")
    monkeypatch.setattr(serve, "serve", no_serving)
    root = logging.getLogger()

    def run(*flags: str) -> tuple[int, list[str]]:
        handlers, level = list(root.handlers), root.level
        try:
            rc = serve.main(list(flags))
        except SystemExit as exc:
            rc = exc.code
        finally:
            root.handlers[:], root.level = handlers, level
        err = capsys.readouterr().err
        return rc, [line for line in err.splitlines() if not line.startswith("INFO ")]
    return run


def test_bad_flags_at_start_are_one_line_each(start, tiny_checkpoint, tmp_path):
    model = ("--model", str(tiny_checkpoint))
    cases = {
        ("--port", "99999"): "argument --port: '99999' is not a port: expected 0-65535",
        ("--port", "-1"): "argument --port: '-1' is not a port",
        ("--host", "999.1.1.1", "--port", "0"): "--host 999.1.1.1: not an address of this "
                                                "machine",
        ("--api-key", ""): "argument --api-key: '' is empty",
        ("--served-model-name", " "): "argument --served-model-name: ' ' is empty",
        ("--kv-cache-memory-bytes", "-5"): "'-5' is not a number of bytes >= 1",
        ("--log-file", str(tmp_path / "no" / "such.log")): f"--log-file {tmp_path}/no/such.log: "
                                                          "cannot open it",
        ("--max-model-len", "100000", "--port", "0"): "--max-model-len 100000 is longer than "
                                                      "the model's max_position_embeddings "
                                                      "4096",
        ("--kv-cache-memory-bytes", "10", "--port", "0"): "--kv-cache-memory-bytes 10 holds a "
                                                          "KV pool of 0 tokens",
    }
    for flags, said in cases.items():
        rc, lines = start(*model, *flags)
        assert rc == 2 and len(lines) == 1 and said in lines[0], (flags, rc, lines)


def test_cuda_asked_without_cuda_is_one_line(start, tiny_checkpoint):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    rc, lines = start("--model", str(tiny_checkpoint), "--device", "cuda", "--port", "0")
    assert rc == 2 and len(lines) == 1, lines
    assert "--device cuda: torch" in lines[0] and "pass --device cpu" in lines[0]


def test_the_default_model_is_served_as_the_profiles_name():
    args = serve.build_parser().parse_args([])
    assert (serve.served_model_name(args), args.model) == ("embedded", "models/embedded")
    named = serve.build_parser().parse_args(["--served-model-name", "standin"])
    assert serve.served_model_name(named) == "standin"


def test_the_model_answers_to_its_served_name_and_its_path(inprocess_server):
    srv = inprocess_server(server_kw={"model_name": "embedded", "model_path": "models/embedded"})
    for name in ("embedded", "models/embedded"):
        r = requests.post(f"{srv.url}/v1/completions", timeout=60, json={
            "model": name, "prompt": "a", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["model"] == name, r.text
    r = requests.post(f"{srv.url}/v1/completions", timeout=60, json={
        "model": "other", "prompt": "a", "max_tokens": 2})
    assert r.status_code == 400 and "`other` does not exist" in r.json()["error"]["message"]
    card = requests.get(f"{srv.url}/v1/models", timeout=10).json()["data"][0]
    assert (card["id"], card["root"]) == ("embedded", "models/embedded")


@pytest.mark.parametrize("path,field", [("/v1/completions", "prompt"),
                                        ("/v1/chat/completions", "messages")])
def test_a_10_mb_body_is_refused_while_health_answers(inprocess_server, path, field):
    """The body is sent in 1 MB chunks; /health is probed from the first chunk until the
    refusal has come. Before issue 41 the prompt was tokenized on the event loop: 10 MB took
    seconds, and /health waited as long."""
    srv = inprocess_server()
    text = "word " * 2_000_000  # 10 MB
    content = text if field == "prompt" else [{"role": "user", "content": text}]
    body = json.dumps({"model": "tiny", field: content, "max_tokens": 4}).encode()

    def chunks():
        for i in range(0, len(body), 1 << 20):
            yield body[i:i + (1 << 20)]
            time.sleep(0.01)
    result, done = {}, threading.Event()

    def post():
        t0 = time.monotonic()
        result["response"] = requests.post(f"{srv.url}{path}", data=chunks(), timeout=120,
                                           headers={"Content-Type": "application/json"})
        result["s"] = time.monotonic() - t0
        done.set()
    sender = threading.Thread(target=post)
    sender.start()
    waits = []
    while not done.is_set():
        t0 = time.monotonic()
        assert requests.get(f"{srv.url}/health", timeout=60).status_code == 200
        waits.append(time.monotonic() - t0)
        time.sleep(0.005)
    sender.join(60)
    r = result["response"]
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["param"] == field and "maximum context length is 512 tokens" in err["message"]
    print(f"\n{path}: refused in {result['s'] * 1000:.0f} ms; /health probes: {len(waits)}, "
          f"slowest {max(waits) * 1000:.1f} ms")
    assert max(waits) < 0.1, f"/health waited {max(waits):.2f} s while the body was refused"


def test_api_key_as_vllm(inprocess_server):
    srv = inprocess_server(server_kw={"api_key": "s3cret"})
    body = {"model": "tiny", "prompt": "a", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        r = requests.post(f"{srv.url}/v1/completions", json=body, headers=headers, timeout=30)
        assert (r.status_code, r.json()) == (401, {"error": "Unauthorized"}), headers
    assert requests.get(f"{srv.url}/v1/models", timeout=10).status_code == 401
    ok = requests.post(f"{srv.url}/v1/completions", json=body, timeout=60,
                       headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
    for open_path in ("/health", "/version", "/metrics"):  # as vLLM: only /v1 is guarded
        assert requests.get(f"{srv.url}{open_path}", timeout=10).status_code == 200, open_path


def test_a_client_gone_mid_stream_is_one_log_line(inprocess_server, monkeypatch, caplog):
    """The client's connection closes between two chunks before aiohttp cancels the handler
    (the race that logged two ClientConnectionResetError tracebacks): the third write finds
    the transport closing."""
    from aiohttp import web
    from aiohttp.client_exceptions import ClientConnectionResetError

    srv = inprocess_server()
    real_write, writes = web.StreamResponse.write, []

    async def write(self, data):
        writes.append(len(data))
        if len(writes) > 2:
            raise ClientConnectionResetError("Cannot write to closing transport")
        return await real_write(self, data)
    monkeypatch.setattr(web.StreamResponse, "write", write)
    caplog.set_level(logging.INFO)
    r = requests.post(f"{srv.url}/v1/completions", stream=True, timeout=60, json={
        "model": "tiny", "prompt": "a", "max_tokens": 200, "ignore_eos": True, "stream": True})
    try:
        for _ in r.iter_lines():
            pass
    except requests.exceptions.RequestException:
        pass  # the stream ends short, as a client that went away would never see
    engine = srv.engine
    deadline = time.monotonic() + 15
    while engine.running or engine.waiting:
        assert time.monotonic() < deadline, "the request still holds its slot"
        time.sleep(0.01)
    said = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.INFO
            and "aiohttp.access" not in rec.name]
    gone = [m for m in said if "went away" in m]
    assert len(gone) == 1 and "aborted" in gone[0], said
    assert not [rec for rec in caplog.records if rec.exc_info or "Error handling" in
                rec.getMessage()], said
