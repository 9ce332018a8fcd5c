"""The server with `--device cuda`: the engine thread steps a CUDA engine (CUDA graphs captured
on that thread) while streams run concurrently. Skipped where there is no GPU. Standard
library only on the client side, so it runs on the GPU image as is."""

import json
import threading
import urllib.request

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _post(url: str, body: dict) -> list[dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        lines = [line.decode().strip() for line in r]
    events = [line[6:] for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def _counter(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


@pytest.mark.parametrize("spec", [None, '{"method": "mtp", "num_speculative_tokens": 3}'])
def test_cuda_server_streams_concurrently(start_embedded_server, spec):
    flags = ["--device", "cuda", "--max-num-seqs", "8", "--max-model-len", "1024"]
    url = start_embedded_server(*flags, *(["--speculative-config", spec] if spec else []))
    results = {}

    def stream(i):
        results[i] = _post(f"{url}/v1/completions", {
            "prompt": f"def f_{i}(x):", "max_tokens": 64, "ignore_eos": True, "stream": True,
            "temperature": 0.0 if i % 2 else 0.8, "seed": i,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    threads = [threading.Thread(target=stream, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert len(results) == 12
    total = 0
    for chunks in results.values():
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 64
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        total += 64
    assert _counter(url, "vllm:generation_tokens_total") == total
    assert _counter(url, "vllm:num_requests_running") == 0
    if spec:
        assert _counter(url, "vllm:spec_decode_num_drafts_total") > 0
