"""The embedded server's Prometheus registry, with vLLM 0.33.0's metric names and types.

Design:
- Counters and gauges are read from the engine when scraped (a custom collector over
  `engine.stats`), so `/metrics` reports exactly the engine's cumulative counts: there is no
  second bookkeeping that could drift. Counter families are exposed with `_total`, as vLLM's.
- `vllm:request_success{finished_reason}` is the server's count, because stop strings are
  found by the server's detokenizer (as in vLLM's front end): the engine sees those requests
  as aborted.
- Latency histograms are observed by the engine thread as outputs arrive: TTFT from the
  request's arrival, inter-token latency once per engine step that gave the request tokens
  (vLLM's ITL is per step, not per token), end-to-end latency at the finish. Buckets are vLLM's.
- Every sample carries `model_name` and `engine` ("0", vLLM's engine index).
- `vllm:cache_config_info` is a gauge fixed at 1 whose labels describe the KV pool; the
  embedded engine keeps one contiguous row per slot, so its block is one token and
  `num_gpu_blocks` equals `kv_cache_size_tokens`.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

FINISHED_REASONS = ("stop", "length", "abort", "error")

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class EngineStatsCollector:
    """Reads `engine.stats` at scrape time and yields vLLM's counter and gauge families."""

    def __init__(self, engine, labels: dict[str, str], cache_info: dict[str, str],
                 success_counts: dict[str, int], lock: threading.Lock):
        self.engine, self.labels, self.cache_info = engine, labels, cache_info
        self.success_counts, self.lock = success_counts, lock

    def _family(self, cls, name: str, doc: str, value, extra: dict | None = None):
        extra = extra or {}
        fam = cls(name, doc, labels=[*self.labels, *extra])
        fam.add_metric([*self.labels.values(), *extra.values()], value)
        return fam

    def collect(self):
        s = self.engine.stats
        def counter(name, doc, v):
            return self._family(CounterMetricFamily, name, doc, v)

        def gauge(name, doc, v):
            return self._family(GaugeMetricFamily, name, doc, v)
        yield counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.",
                      s.num_drafts)
        yield counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.",
                      s.num_draft_tokens)
        yield counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
                      s.num_accepted_tokens)
        per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                      "Accepted tokens per draft position.",
                                      labels=[*self.labels, "position"])
        for pos, n in enumerate(s.accepted_per_pos):
            per_pos.add_metric([*self.labels.values(), str(pos)], n)
        yield per_pos
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                      s.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.",
                      s.generation_tokens)
        yield counter("vllm:num_preemptions", "Cumulative number of preemptions.",
                      s.num_preemptions)
        success = CounterMetricFamily("vllm:request_success", "Count of successful requests.",
                                      labels=[*self.labels, "finished_reason"])
        with self.lock:
            counts = dict(self.success_counts)
        for reason in FINISHED_REASONS:
            success.add_metric([*self.labels.values(), reason], counts.get(reason, 0))
        yield success
        yield gauge("vllm:num_requests_running", "Number of requests in model execution.",
                    s.num_running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                    s.num_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                    s.kv_usage)
        yield self._family(GaugeMetricFamily, "vllm:cache_config_info",
                           "Information of the KV cache configuration.", 1, self.cache_info)


class ServerMetrics:
    """The registry behind `/metrics`, and the hooks the engine thread calls."""

    def __init__(self, engine, model_name: str, cache_info: dict[str, str]):
        self.labels = {"model_name": model_name, "engine": "0"}
        self.registry = CollectorRegistry(auto_describe=False)
        self.lock = threading.Lock()
        self.success_counts: dict[str, int] = {r: 0 for r in FINISHED_REASONS}
        self.registry.register(EngineStatsCollector(engine, self.labels, cache_info,
                                                    self.success_counts, self.lock))
        names = list(self.labels)
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", names,
                              buckets=TTFT_BUCKETS, registry=self.registry).labels(**self.labels)
        self.itl = Histogram("vllm:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", names,
                             buckets=ITL_BUCKETS, registry=self.registry).labels(**self.labels)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.", names,
                             buckets=E2E_BUCKETS, registry=self.registry).labels(**self.labels)

    def request_finished(self, reason: str) -> None:
        with self.lock:
            self.success_counts[reason] = self.success_counts.get(reason, 0) + 1

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
