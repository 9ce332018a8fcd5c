"""Prometheus text → a normalised snapshot of an engine's speculative-decoding counters.

Design:
- One parser for every engine: `prometheus_client.parser.text_string_to_metric_families`
  reads the exposition text; samples are looked up by their scraped name (counters
  carry `_total`) and **summed over label sets** (`model_name`, `engine`, `tp_rank`,
  `is_streaming`, ...), so several engine cores or DP ranks add up. vLLM writes a
  `<name>_created` sample beside every counter (a separate gauge family holding the
  counter's creation time, about 1.8e9): it is never looked up, since only the exact
  `_total` names are (tests/fixtures/engines/vllm-0.26.0). `vllm:iteration_tokens_total`
  is a histogram despite its name and is not read.
- Each engine keeps its counters under its own names (vLLM's `vllm:*`, SGLang's `sglang:*`);
  an engine's `MetricNames` (on its adapter, harness/engines/) maps them onto one
  `SpecCounters` record, and this module names no engine. The embedded engine uses vLLM's
  names. SGLang has no cumulative accepted-token counter and no per-position one: its
  acceptance comes from its adapter (per-response fields, else `spec_verify_calls`,
  `generation_tokens` and `num_requests`); its `spec_accept_*` gauges are windowed and not
  read. A server of unknown make (`generic`: attached, OpenAI-compatible) has none.
- SGLang runs prometheus_client in multiprocess mode, where a labelled counter has no
  sample until it is first incremented: 0.5.14 with the radix cache off never shows
  `sglang:cached_tokens_total` (metrics_collector.py:1507), nor `spec_verify_calls_total`
  without speculation. So where `MetricNames.appear_on_first_use` (SGLang's) a counter
  missing from the first scrape and present in the second counted from zero.
- A metric the text lacks gives `None`, never 0: the runner warns and goes on.
  `MetricNames.lost_without` says, per engine, what a missing `/metrics` costs.
- `delta(before, after)` subtracts counters and keeps the later gauges; a counter that
  went down means the engine restarted between the scrapes, which is an error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

Labels = dict[str, str]



@dataclass(frozen=True)
class MetricNames:
    """An engine's metric vocabulary, kept on its adapter: `counters` maps each
    `SpecCounters` field to its scraped sample name (counters end in `_total`);
    `histograms` a latency phase to a histogram's base name (engine_latency.py);
    `busy_seconds` the counter of seconds spent in forward passes, if any;
    `appear_on_first_use`: a labelled counter has no sample until first incremented
    (multiprocess prometheus_client); `lost_without`: what a cell loses when `/metrics`
    does not answer (the warning's text). `family` names the vocabulary in errors."""

    family: str
    counters: Mapping[str, str]
    lost_without: str
    histograms: Mapping[str, str] = field(default_factory=dict)
    busy_seconds: str | None = None
    appear_on_first_use: bool = False


# Point-in-time values: a delta keeps the later scrape's value.
GAUGES = ("requests_running", "requests_waiting", "kv_usage", "kv_pool_tokens")


@dataclass(frozen=True)
class SpecCounters:
    """One scrape (or the difference of two) in engine-neutral names; None = not exposed."""

    names: MetricNames  # the vocabulary it was read with
    num_drafts: float | None = None
    num_draft_tokens: float | None = None
    num_accepted_tokens: float | None = None
    accepted_per_pos: tuple[float, ...] | None = None  # index = draft position
    spec_verify_calls: float | None = None  # SGLang: verify steps of finished requests
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    prompt_tokens_cached: float | None = None
    num_preemptions: float | None = None
    request_success: dict[str, float] | None = None  # finished_reason -> count
    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_usage: float | None = None  # fraction of the KV pool in use, 1 = full
    kv_pool_tokens: float | None = None
    num_requests: float | None = None  # SGLang: finished requests (vLLM: request_success)

    def missing(self) -> list[str]:
        """Fields this engine's family should expose but the scrape lacked."""
        return [name for name in self.names.counters if getattr(self, name) is None]

    @property
    def engine(self) -> str:
        """The metric family it was read with ('vllm', 'sglang', ...)."""
        return self.names.family

    @property
    def requests_finished(self) -> float | None:
        if self.num_requests is not None:
            return self.num_requests
        return None if self.request_success is None else sum(self.request_success.values())


class CounterReset(ValueError):
    """A counter went down between two scrapes: the engine restarted in between."""


def samples(text: str) -> dict[str, list[tuple[Labels, float]]]:
    """Scraped sample name -> [(labels, value)], from Prometheus exposition text."""
    out: dict[str, list[tuple[Labels, float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def total(found: dict, name: str) -> float | None:
    """A sample summed over its label sets; None when the scrape lacks it."""
    rows = found.get(name)
    return None if rows is None else sum(value for _, value in rows)


def _by_label(found: dict, name: str, label: str) -> dict[str, float] | None:
    rows = found.get(name)
    if rows is None:
        return None
    out: dict[str, float] = {}
    for labels, value in rows:
        key = labels.get(label, "")
        out[key] = out.get(key, 0.0) + value
    return out


def _per_position(found: dict, name: str) -> tuple[float, ...] | None:
    """Per-position counters (label `position` = "0".."K-1") as a list, summed over engines."""
    by_pos = _by_label(found, name, "position")
    if not by_pos:
        return None
    k = max(int(p) for p in by_pos) + 1
    return tuple(by_pos.get(str(i), 0.0) for i in range(k))


def _kv_pool_tokens(found: dict, name: str) -> float | None:
    """vLLM: the `kv_cache_size_tokens` label of the info gauge; SGLang: a plain gauge."""
    rows = found.get(name)
    if rows is None:
        return None
    if name.endswith("cache_config_info"):
        sizes = [float(l["kv_cache_size_tokens"]) for l, _ in rows
                 if l.get("kv_cache_size_tokens") not in (None, "", "None")]
        return sum(sizes) if sizes else None
    return sum(value for _, value in rows)


def parse(text: str, names: MetricNames) -> SpecCounters:
    """A snapshot from one /metrics text, read with an engine's metric names."""
    found = samples(text)
    values: dict[str, object] = {}
    for field_name, metric in names.counters.items():
        if field_name == "accepted_per_pos":
            values[field_name] = _per_position(found, metric)
        elif field_name == "request_success":
            values[field_name] = _by_label(found, metric, "finished_reason")
        elif field_name == "kv_pool_tokens":
            values[field_name] = _kv_pool_tokens(found, metric)
        else:
            values[field_name] = total(found, metric)
    return SpecCounters(names=names, **values)


def _sub(name: str, before: float | None, after: float | None) -> float | None:
    if before is None or after is None:
        return None
    if after < before:
        raise CounterReset(f"counter {name} went down from {before:g} to {after:g} between "
                           "two scrapes: the engine restarted in between")
    return after - before


def delta(before: SpecCounters, after: SpecCounters) -> SpecCounters:
    """What happened between two scrapes of one engine: counters subtracted, gauges later."""
    if before.names != after.names:
        raise ValueError(f"expected two scrapes of one engine, found {before.engine!r} and "
                         f"{after.engine!r}")
    values: dict[str, object] = {}
    lazy = after.names.appear_on_first_use
    for f in dataclasses.fields(SpecCounters):
        name, old, new = f.name, getattr(before, f.name), getattr(after, f.name)
        if name == "names":
            continue
        if lazy and old is None and isinstance(new, float) and name not in GAUGES:
            old = 0.0  # first incremented between the scrapes (module docstring)
        if name in GAUGES:
            values[name] = new
        elif name == "accepted_per_pos":
            values[name] = _sub_positions(old, new)
        elif name == "request_success":
            values[name] = None if old is None or new is None else {
                reason: _sub(f"request_success[{reason}]", old.get(reason, 0.0), count)
                for reason, count in new.items()}
        else:
            values[name] = _sub(name, old, new)
    return SpecCounters(names=after.names, **values)


def _sub_positions(old: tuple | None, new: tuple | None) -> tuple[float, ...] | None:
    if old is None or new is None:
        return None
    # A position first seen after the first scrape counted from zero before it.
    padded = tuple(old) + (0.0,) * (len(new) - len(old))
    return tuple(_sub(f"accepted_per_pos[{i}]", a, b) for i, (a, b) in enumerate(zip(padded, new)))
