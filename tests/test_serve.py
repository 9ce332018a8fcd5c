"""The embedded server as a harness sees it: a process on a port, the official `openai`
client, vLLM's metric names, its error JSON, stop strings and disconnects."""

import json
import os
import subprocess
import sys
import time

import pytest
import requests
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str) -> dict[str, float]:
    """/metrics as {name|label=value...: value}, model_name and engine labels checked."""
    text = requests.get(f"{url}/metrics", timeout=10).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            assert s.labels.get("engine") == "0" and s.labels.get("model_name"), s
            extra = "".join(f"|{k}={v}" for k, v in sorted(s.labels.items())
                            if k not in ("model_name", "engine"))
            out[s.name + extra] = s.value
    return out


def delta(before: dict, after: dict, name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


SPEC = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total")


def wait_idle(url: str, timeout: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(url)
        if (m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
                and m["vllm:kv_cache_usage_perc"] == 0):
            return m
        assert time.monotonic() < deadline, f"server not idle: {m}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def model(embedded_server) -> str:
    return requests.get(f"{embedded_server}/v1/models", timeout=10).json()["data"][0]["id"]


@pytest.fixture(scope="module")
def client(embedded_server) -> OpenAI:
    return OpenAI(base_url=f"{embedded_server}/v1", api_key="unused", max_retries=0)


def test_plain_endpoints(embedded_server, model):
    assert requests.get(f"{embedded_server}/health", timeout=10).status_code == 200
    assert requests.get(f"{embedded_server}/version", timeout=10).json()["version"].startswith(
        "specrepro-embedded ")
    card = requests.get(f"{embedded_server}/v1/models", timeout=10).json()["data"][0]
    assert card["max_model_len"] == 512 and card["id"] == "embedded-tiny" == model
    for log in (embedded_server.log_path, embedded_server.log_path.parent / "embedded_server.log"):
        text = log.read_text()  # stderr, and --log-file
        assert "KV cache size: 4,096 tokens, Maximum concurrency for 512 tokens per request: " \
            "8.00x" in text
        assert f"Starting specrepro embedded server on {embedded_server}" in text
        # the line a person reads (`make serve`): the base URL and the model id to send
        assert f"Ready: OpenAI base URL {embedded_server}/v1, model 'embedded-tiny'" in text
        assert "vLLM server" not in text  # it names itself, not the engine it imitates
    m = scrape(embedded_server)
    info = [k for k in m if k.startswith("vllm:cache_config_info")]
    assert len(info) == 1 and "kv_cache_size_tokens=4096" in info[0]
    assert "block_size=1" in info[0] and "num_gpu_blocks=4096" in info[0]
    for name in ("vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
                 "vllm:e2e_request_latency_seconds_count", "vllm:num_preemptions_total",
                 "vllm:spec_decode_num_accepted_tokens_per_pos_total|position=2",
                 "vllm:request_success_total|finished_reason=length"):
        assert name in m, name


def _check_counters(before, after, usage, spec, n_tokens):
    assert usage.completion_tokens == n_tokens
    assert delta(before, after, "vllm:generation_tokens_total") == n_tokens
    assert delta(before, after, "vllm:prompt_tokens_total") == usage.prompt_tokens
    assert delta(before, after, "vllm:spec_decode_num_drafts_total") == spec["num_spec_steps"]
    assert delta(before, after, "vllm:spec_decode_num_draft_tokens_total") == \
        spec["num_draft_tokens"]
    assert delta(before, after, "vllm:spec_decode_num_accepted_tokens_total") == \
        spec["num_accepted_draft_tokens"]
    assert spec["num_spec_steps"] > 0 and spec["num_draft_tokens"] > 0
    assert spec["mean_acceptance_length"] == pytest.approx(
        1 + spec["num_accepted_draft_tokens"] / spec["num_spec_steps"])


def test_openai_client_streams_completions_and_counters_agree(embedded_server, client, model):
    before = wait_idle(embedded_server)
    stream = client.completions.create(
        model=model, prompt="def fibonacci(n):", max_tokens=60, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True, "return_token_ids": True})
    seen, text, token_ids, final = 0, "", [], None
    for chunk in stream:
        if not chunk.choices:  # the include_usage chunk
            final = chunk
            continue
        ids = chunk.choices[0].token_ids
        assert chunk.usage.completion_tokens - seen == len(ids) >= 1  # tokens of this chunk
        seen = chunk.usage.completion_tokens
        text += chunk.choices[0].text
        token_ids += ids
    assert final is not None and final.usage.completion_tokens == len(token_ids) == 60
    after = wait_idle(embedded_server)
    _check_counters(before, after, final.usage, final.model_extra["metrics"]
                    ["speculative_decoding"], len(token_ids))
    assert delta(before, after, "vllm:request_success_total|finished_reason=length") == 1
    # a speculative step that accepts drafts sends its tokens in one chunk: fewer chunks
    assert delta(before, after, "vllm:inter_token_latency_seconds_count") <= len(token_ids) - 1
    # the same request without streaming gives the same tokens and text
    full = client.completions.create(model=model, prompt="def fibonacci(n):", max_tokens=60,
                                     temperature=0, extra_body={"ignore_eos": True,
                                                                "return_token_ids": True})
    assert full.choices[0].token_ids == token_ids and full.choices[0].text == text
    assert full.choices[0].finish_reason == "length"


def test_openai_client_streams_chat(embedded_server, client, model):
    before = wait_idle(embedded_server)
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 12 + 30?"}],
        max_completion_tokens=40, temperature=0.8, top_p=0.9, seed=5, stream=True,
        reasoning_effort="low", stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, "top_k": 50,
                    "chat_template_kwargs": {"enable_thinking": False}})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "length"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == 40
    after = wait_idle(embedded_server)
    _check_counters(before, after, usage, chunks[-1].model_extra["metrics"]
                    ["speculative_decoding"], 40)
    text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
    again = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 12 + 30?"}],
        max_completion_tokens=40, temperature=0.8, top_p=0.9, seed=5,
        extra_body={"ignore_eos": True, "top_k": 50})
    assert again.choices[0].message.content == text  # the seed reproduces the sample


def test_seed_reproduces_and_differs(client, model):
    def sample(seed):
        r = client.completions.create(model=model, prompt="x = ", max_tokens=24, temperature=1.0,
                                      seed=seed, extra_body={"ignore_eos": True,
                                                             "return_token_ids": True})
        return r.choices[0].token_ids
    assert sample(11) == sample(11)
    assert sample(11) != sample(12)


def _stop_string(text: str) -> str:
    for i in range(8, len(text) - 3):
        s = text[i:i + 3]
        if "\ufffd" not in s and s.strip():
            return s
    pytest.skip("no usable stop string in the generated text")


def test_stop_strings(embedded_server, client, model):
    kw = {"model": model, "prompt": "import os\n", "max_tokens": 60, "temperature": 0,
          "extra_body": {"ignore_eos": True}}
    text = client.completions.create(**kw).choices[0].text
    stop = _stop_string(text)
    expected = text[:text.find(stop)]
    before = wait_idle(embedded_server)
    r = client.completions.create(**kw, stop=[stop, "\x00never"])
    assert r.choices[0].text == expected and r.choices[0].finish_reason == "stop"
    assert r.choices[0].model_extra["stop_reason"] == stop
    pieces, reasons = [], []
    for chunk in client.completions.create(**kw, stop=stop, stream=True):
        pieces.append(chunk.choices[0].text)
        reasons.append(chunk.choices[0].finish_reason)
    assert "".join(pieces) == expected and reasons[-1] == "stop"
    after = wait_idle(embedded_server)  # the stopped requests freed their slots
    assert delta(before, after, "vllm:request_success_total|finished_reason=stop") == 2


BAD = [
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 10**9}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, "top_p"),
    ("/v1/completions", {"prompt": "x", "top_p": 2}, "top_p"),
    ("/v1/completions", {"prompt": "x", "top_k": -5}, "top_k"),
    ("/v1/completions", {"prompt": "x", "model": "no-such-model"}, "model"),
    ("/v1/completions", {"prompt": [5] * 600}, "prompt"),
    ("/v1/completions", {"prompt": [10**6]}, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "ten"}, "max_tokens"),
    ("/v1/completions", {"prompt": 3}, "prompt"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}},
     "stream_options"),
    ("/v1/completions", {"prompt": "x", "n": 3}, "n"),
    ("/v1/completions", "{\"prompt\": \"x\",", None),
    ("/v1/completions", "[1, 2]", None),
    ("/v1/chat/completions", {"messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 2000}]},
     "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "max_completion_tokens": 10**6}, "max_tokens"),
]


@pytest.mark.parametrize("path, body, param", BAD)
def test_bad_input_gets_400_and_the_server_keeps_serving(embedded_server, model, path, body,
                                                         param):
    data = body if isinstance(body, str) else json.dumps({"model": model, **body})
    r = requests.post(f"{embedded_server}{path}", data=data,
                      headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "BadRequestError" and err["code"] == 400 and err["message"]
    assert err["param"] == param
    ok = requests.post(f"{embedded_server}/v1/completions", timeout=30,
                       json={"model": model, "prompt": "ok", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1


def test_disconnecting_client_frees_its_slot(embedded_server, model):
    before = wait_idle(embedded_server)
    r = requests.post(f"{embedded_server}/v1/completions", stream=True, timeout=30,
                      json={"model": model, "prompt": "a", "max_tokens": 500, "stream": True,
                            "ignore_eos": True})
    lines = r.iter_lines()
    assert next(line for line in lines if line).startswith(b"data: {")
    r.close()  # mid-stream: hundreds of tokens remain
    after = wait_idle(embedded_server)
    assert delta(before, after, "vllm:request_success_total|finished_reason=abort") == 1
    assert delta(before, after, "vllm:generation_tokens_total") < 500


def test_command_line(tmp_path):
    from specrepro.embedded.serve import build_parser, main

    args = build_parser().parse_args([
        "--model", "m", "--max-model-len", "4k", "--no-compile",
        "--speculative-config", '{"method": "dflash", "num-speculative-tokens": 5}'])
    assert args.max_model_len == 4000 and args.host == "127.0.0.1" and args.port == 8000
    assert args.speculative_config == {"method": "dflash", "num_speculative_tokens": 5}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--model", "m", "--speculative-config", "[1]"])
    # a checkpoint that is not there: a clear error and exit status 2, no traceback
    assert main(["--model", str(tmp_path / "missing")]) == 2


def test_busy_port_is_one_line_before_the_model_loads(tmp_path):
    """`specrepro serve` on a port something listens on: one line naming the listener, exit 2,
    and no model loaded (the checkpoint named does not exist: it would fail otherwise)."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "specrepro.cli", "serve", "--model", str(tmp_path / "none"),
             "--port", str(port)], capture_output=True, text=True, timeout=120,
            check=False)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in lines[0]
    assert f"pid {os.getpid()}" in lines[0]  # the listener named: this test's process
