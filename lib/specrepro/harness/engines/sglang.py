"""SGLang (`python -m sglang.launch_server`): its flags, routes, startup-log lines, metric
names and histograms, and where its acceptance comes from.

Design:
- `SGLangAdapter` renders the launch command checked against the generated flag list of
  the profile's engine_version (harness/engine_cli/sglang-*.json). SGLang's algorithms
  are vLLM's methods in SGLang's spelling (`ALGORITHMS`), with the same K on both engines.
- Readiness (`ROUTES`): 0.5.23 `GET /ready`; 0.5.14 has no `/ready`, so its 404 moves the
  poll on to `/health_generate`, which answers 503 until the warm-up generation returned.
  Startup facts: `SGLANG_LOG`; metrics: `SGLANG_METRICS` (the `sglang:*` names; its
  multiprocess prometheus_client shows a labelled counter only once incremented).
- Acceptance (`SGLangAdapter.acceptance`): SGLang has no cumulative accepted-token counter
  and no per-position one. Its per-response fields summed over the requests
  (`sglang_counts`; 0.5.23 returns them under `sglext.spec_tokens_details`, 0.5.14 only in
  its native `/generate`'s `meta_info`, which the load generator sends where a profile says
  `api: native` (`sglang_native_details`, with the warning SGLANG_FROM_NATIVE naming the
  source), never in its OpenAI responses). Where its responses carry none, its counters
  give tokens per step (`sglang_counter_counts`), and what it does not count (draft
  tokens, per position) is None with the warning "not counted by this engine", never a
  zero.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from specrepro.harness.engine_http import Routes
from specrepro.harness.engines.base import Counts, EngineAdapter, Probe
from specrepro.harness.flags import FlagCheck, model_flags, profile_file, render_flags
from specrepro.harness.loadgen import RequestFeatures
from specrepro.harness.promtext import MetricNames, SpecCounters
from specrepro.harness.records import RequestRecord
from specrepro.harness.startup_log import LogFact
from specrepro.params import Profile

# SGLang 0.5.23: /ready, 200 after warm-up, no generation (its /health runs one of
# >= 1 s). 0.5.14 has no /ready (404): /health_generate is 503 while the server is
# Starting, then runs a 1-token generation with log_metrics=False, so no counter moves
# (0.5.14 http_server.py:561-635; its /health is the same handler). /version is 404 in
# both; /server_info carries "version", /get_server_info is 0.5.14's deprecated alias.
ROUTES = Routes(("/ready", "/health_generate"), ("/server_info", "/get_server_info"))

# SGLang 0.5.14: the scheduler's capacity line (managers/scheduler.py:936) is printed after
# any reset of max_running_requests, so the last wins; the rest is its server_args line.
SGLANG_LOG = (
    LogFact("kv_pool_tokens", r"max_total_num_tokens=(\d+)", last=True),
    LogFact("max_running_requests", r"max_running_requests=(\d+), context_len", last=True),
    LogFact("max_concurrency", r"max_running_requests=(\d+), context_len", last=True),
    LogFact("tokens_per_request", r"max_running_requests=\d+, context_len=(\d+)", last=True),
    LogFact("attention_backend", r"server_args=ServerArgs\(.*?, attention_backend='([\w-]+)'"),
    LogFact("kernels.decode_attention_backend", r", decode_attention_backend='([\w-]+)'"),
    LogFact("kernels.prefill_attention_backend", r", prefill_attention_backend='([\w-]+)'"),
    LogFact("kernels.sampling_backend", r", sampling_backend='([\w-]+)'"),
    LogFact("kernels.draft_attention_backend",  # speculative/dflash_worker_v2.py:195
            r"draft runner\. attention_backend=([\w-]+)"),
    LogFact("kernels.draft_attention_backend", r", speculative_draft_attention_backend='([\w-]+)'"),
    LogFact("kernels.cuda_graph_decode",
            r"cuda_graph_config=CudaGraphConfig\(decode=PhaseConfig\(backend='(\w+)'"),
    LogFact("kernels.kv_cache_dtype", r"KV Cache is allocated\. dtype: ([\w.]+)"),  # memory_pool.py:1023
)

# field -> scraped sample name (observability/metrics_collector.py, 0.5.14)
SGLANG_METRICS = MetricNames(
    family="sglang",
    counters={
        "spec_verify_calls": "sglang:spec_verify_calls_total",
        "generation_tokens": "sglang:generation_tokens_total",
        "prompt_tokens": "sglang:prompt_tokens_total",
        "prompt_tokens_cached": "sglang:cached_tokens_total",  # label cache_source; lazy
        "num_requests": "sglang:num_requests_total",  # finished requests
        "requests_running": "sglang:num_running_reqs",
        "requests_waiting": "sglang:num_queue_reqs",
        "kv_usage": "sglang:token_usage",
        "kv_pool_tokens": "sglang:max_total_num_tokens",
    },
    histograms={"queue": "sglang:queue_time_seconds",
                "ttft": "sglang:time_to_first_token_seconds",
                "itl": "sglang:inter_token_latency_seconds",
                "e2e": "sglang:e2e_request_latency_seconds"},
    # seconds its GPU spent in forward passes (engine_latency.py's busy share)
    busy_seconds="sglang:forward_execution_seconds_total",
    # multiprocess prometheus_client: 0.5.14 with the radix cache off never shows
    # sglang:cached_tokens_total (metrics_collector.py:1507), nor spec_verify_calls_total
    # without speculation
    appear_on_first_use=True,
    lost_without=("acceptance where the responses carry none (SGLang 0.5.14's never do), the "
                  "counter check (counters_consistent) and the KV pool where the startup log "
                  "lacks it"),
)

# ------------------------------------------------------------------------ acceptance


NOT_COUNTED = "not counted by this engine"
SGLANG_FROM_COUNTERS = (
    "acceptance from SGLang's counters (its OpenAI responses carry no per-request "
    "acceptance): num_accepted_tokens = Δgeneration_tokens − Δspec_verify_calls − "
    "Δnum_requests, a request's first token coming from its prefill; a low bound where an "
    "output stops at max_tokens inside a step")
SGLANG_NO_POSITIONS = (f"num_draft_tokens, draft_acceptance_rate and per_position_acceptance: "
                       f"{NOT_COUNTED} (SGLang has no per-position counter)")
SGLANG_FROM_NATIVE = (
    "acceptance from SGLang's native /generate meta_info, per request, summed over {n} "
    "requests: acceptance_length = 1 + Σspec_num_correct_drafts / Σspec_verify_ct (vLLM's "
    "footing; SGLang's own spec_accept_length, Σcompletion_tokens / Σspec_verify_ct, is "
    "{own}), per position from spec_correct_drafts_histogram")
# SGLang 0.5.14 writes each of these under two names (tokenizer_manager.py:2333-2352);
# the first is the one 0.5.23 keeps
SGLANG_ALIASES = {"spec_num_correct_drafts": "spec_accepted_drafts",
                  "spec_num_proposed_drafts": "spec_proposed_drafts",
                  "spec_correct_drafts_histogram": "spec_accept_histogram"}


def sglang_details(records: Sequence[RequestRecord], warnings: list[str]) -> list[dict] | None:
    """Each answered request's per-response acceptance fields (`sglext.spec_tokens_details`,
    the fields of a native response's `meta_info`), or None unless every one has them: a
    partial sum would pass for the cell's."""
    ok = [r for r in records if r.ok]
    native = [(r.spec or {}).get("sglang_meta") for r in ok]
    if ok and all(m is not None for m in native):
        return sglang_native_details(native, warnings)
    found = [((r.spec or {}).get("sglext") or {}).get("spec_tokens_details") for r in ok]
    have = [d for d in found if d and "spec_verify_ct" in d]
    if have and len(have) < len(ok):
        warnings.append(f"{len(have)} of {len(ok)} SGLang responses carried per-request "
                        "acceptance fields: they are not used")
    return have if have and len(have) == len(ok) else None


def sglang_native_details(metas: Sequence[dict], warnings: list[str]) -> list[dict] | None:
    """The speculative fields of native `/generate` responses (the final meta_info of each,
    loadgen.NativeStreamTimer) under 0.5.23's names. SGLang writes them only for a request
    that had a verify step (0.5.14 managers/tokenizer_manager.py:2312-2316), so where some
    responses have them, one without is a request all of whose tokens came from its
    prefill: 0 steps, 0 drafts, nothing to add. None where none has them (no speculation)."""
    named = []
    for meta in metas:
        d = dict(meta)
        for name, alias in SGLANG_ALIASES.items():
            if d.get(name) is None and d.get(alias) is not None:
                d[name] = d[alias]
        named.append(d)
    have = [d for d in named if d.get("spec_verify_ct")]
    if not have:
        return None
    if len(have) < len(named):
        warnings.append(f"{len(named) - len(have)} of {len(named)} SGLang /generate responses "
                        "had no verify step (no spec_verify_ct: every token from the prefill) "
                        "and add no step and no draft")
    steps = sum(d["spec_verify_ct"] for d in have)
    tokens = [d.get("completion_tokens") for d in named]
    own = (f"{sum(tokens) / steps:.4g}" if all(t is not None for t in tokens)
           else "unknown (a response without completion_tokens)")
    warnings.append(SGLANG_FROM_NATIVE.format(n=len(named), own=own))
    return have


def sglang_counts(details: Sequence[dict], k: int | None = None):
    """Σ spec_verify_ct, Σ spec_num_proposed_drafts, Σ spec_num_correct_drafts and the
    per-position counts from spec_correct_drafts_histogram (hist[j]: steps with j correct
    drafts, so position i was accepted in Σ_{j>i} hist[j] steps; SGLang grows a histogram
    only to the most drafts a step kept, 0.5.14 managers/schedule_batch.py:1077-1087, so k,
    where known, sets the positions). A field missing from any response leaves its figure
    None."""
    def total(key: str) -> float | None:
        values = [d.get(key) for d in details]
        return None if any(v is None for v in values) else sum(values)

    hists = [d.get("spec_correct_drafts_histogram") for d in details]
    per_pos = None
    if details and all(isinstance(h, list) and h for h in hists):
        n = max(k or 0, max(len(h) for h in hists) - 1)
        per_pos = [sum(sum(h[i + 1:]) for h in hists) for i in range(n)]
    return (total("spec_verify_ct"), total("spec_num_proposed_drafts"),
            total("spec_num_correct_drafts"), per_pos)


def sglang_counter_counts(delta: SpecCounters | None, warnings: list[str]):
    """(verify steps, None, accepted drafts, None) from SGLang's counters, where its
    responses carried no acceptance (SGLANG_FROM_COUNTERS); None without speculation."""
    if delta is None or not delta.spec_verify_calls:
        return None
    verify, gen, finished = delta.spec_verify_calls, delta.generation_tokens, \
        delta.requests_finished
    if gen is None or finished is None:
        warnings.append("SGLang's counters lack sglang:generation_tokens_total or "
                        "sglang:num_requests_total: acceptance not measured")
        return None
    accepted = gen - verify - finished
    if accepted < 0:
        warnings.append(f"SGLang's counters moved by {gen:g} generated tokens, {verify:g} "
                        f"verify steps and {finished:g} requests, fewer tokens than steps: "
                        "acceptance not measured")
        return None
    warnings += [SGLANG_FROM_COUNTERS, SGLANG_NO_POSITIONS]
    return verify, None, accepted, None


class SGLangAdapter(EngineAdapter):
    """`python -m sglang.launch_server --model-path MODEL …`, checked against the generated
    list of the profile's engine_version (SGLang 0.5.14 or 0.5.23; 0.5.23 otherwise)."""

    kind = "sglang"
    cli = "sglang-0.5.23"
    what = "SGLang 0.5.23"
    routes = ROUTES
    log_facts = SGLANG_LOG
    metrics = SGLANG_METRICS
    # its OpenAI server has no return_token_ids; its native /generate is api: native's
    request_features = RequestFeatures(continuous_usage_stats=True, return_token_ids=False,
                                       native_api=True)
    # request slots and tokens: counts (unset: SGLang sizes them from the GPU and the model)
    positive_flags = ("--max-running-requests", "--context-length")
    context_flag = "--context-length"  # unset: the model's max_position_embeddings
    # SGLANG_TORCH_PROFILER_DIR: where /start_profile's torch profiler writes by default
    profiling: ClassVar[dict[str, dict]] = {"env": {"SGLANG_TORCH_PROFILER_DIR": "{dir}"}}
    # vLLM method → SGLang algorithm. NEXTN is SGLang's name for MTP (an EAGLE alias).
    ALGORITHMS: ClassVar[dict[str, str]] = {"mtp": "NEXTN", "eagle": "EAGLE", "eagle3": "EAGLE3", "dflash": "DFLASH",
                  "draft_model": "STANDALONE", "ngram": "NGRAM", "dspark": "DSPARK"}
    SPEC_FLAGS = ("--speculative-algorithm", "--speculative-num-steps",
                  "--speculative-eagle-topk", "--speculative-num-draft-tokens",
                  "--speculative-dflash-block-size", "--speculative-draft-model-path",
                  "--speculative-draft-model", "--speculative-draft-model-revision",
                  "--speculative-draft-model-quantization",
                  "--speculative-use-block-verification")
    reserved: ClassVar[dict[str, str]] = {"--model-path": "model.id", "--model": "model.id",
                "--revision": "model.revision", "--served-model-name": "model.served_name",
                "--host": "host", "--port": "port", "--tp-size": "parallel",
                "--tensor-parallel-size": "parallel", "--dp-size": "parallel",
                "--data-parallel-size": "parallel", "--enable-metrics": "engine (always on)",
                **{f: "speculative" for f in SPEC_FLAGS}}

    detect_rank = 2

    def answers_as(self, probe: Probe) -> bool:
        """Its `/server_info` answers JSON."""
        return probe.json(self.routes.version[0]) is not None

    def render_argv(self, profile: Profile, source: str | Path | None = None) -> list[str]:
        accepted, what = self.flag_list(profile)
        check = FlagCheck(profile_file(profile, source), what)
        argv = [*self.command(profile), "--model-path", profile.model.id]
        argv += model_flags(profile, "--tp-size", "--dp-size")
        if profile.speculative is not None:
            argv += self.speculative_flags(profile, accepted, check)
        argv.append("--enable-metrics")  # off by default; /metrics needs it
        argv += render_flags(profile.flags, accepted, self.reserved, check,
                              spell=self.flag_name)
        for i, part in enumerate(argv):  # the derived flags must exist in this version too
            if i >= len(self.command(profile)) and part.startswith("--") \
                    and part not in accepted["flags"]:
                check.fail("speculative", f"expected flags {check.what} accepts, the adapter "
                                          f"rendered {part!r}")
        check.raise_if_any()
        return argv

    def speculative_flags(self, profile: Profile, accepted: dict, check: FlagCheck) -> list[str]:
        """Same K on both engines: vLLM K drafts = SGLang steps K, topk 1, K+1 draft tokens
        (EAGLE/NEXTN/STANDALONE) or a DFLASH block of K+1."""
        spec = profile.speculative
        algorithm = self.ALGORITHMS.get(spec.method)
        if algorithm is None or algorithm not in accepted["speculative_algorithms"]:
            check.fail("speculative.method", f"expected a method {check.what} has an algorithm "
                                             f"for ({sorted(self.ALGORITHMS)}), found {spec.method!r}")
            return []
        for key in ("num_speculative_tokens_per_batch_size", "prompt_lookup_min",
                    "prompt_lookup_max", "draft_sample_method"):
            if getattr(spec, key) is not None:
                check.fail(f"speculative.{key}", f"expected none ({check.what} has no equivalent), "
                                                 f"found {getattr(spec, key)!r}")
        k = spec.num_speculative_tokens
        argv = ["--speculative-algorithm", algorithm]
        if algorithm == "DFLASH":
            argv += ["--speculative-dflash-block-size", str(k + 1)]
        elif algorithm == "NGRAM" and k is not None:
            # NGRAM verifies a tree of K+1 tokens (its default is 12 whatever K says)
            argv += ["--speculative-num-draft-tokens", str(k + 1)]
        elif k is not None:
            argv += ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                     "--speculative-num-draft-tokens", str(k + 1)]
        drafter = spec.model or (profile.drafter.id if profile.drafter else None)
        if algorithm in ("DFLASH", "STANDALONE", "EAGLE3", "DSPARK") and drafter is None:
            check.fail("drafter", f"expected a drafter checkpoint for {algorithm}, found none")
        if drafter is not None and algorithm != "NEXTN":
            argv += ["--speculative-draft-model-path", drafter]
            if profile.drafter is not None and profile.drafter.revision and not spec.model:
                argv += ["--speculative-draft-model-revision", profile.drafter.revision]
        if spec.quantization is not None:
            choices = accepted["flag_choices"]["--speculative-draft-model-quantization"]
            check.one_of("speculative.quantization", spec.quantization, choices,
                         "a draft quantization")
            argv += ["--speculative-draft-model-quantization", spec.quantization]
        if spec.rejection_sample_method == "block":
            argv.append("--speculative-use-block-verification")
        elif spec.rejection_sample_method not in (None, "standard"):
            check.fail("speculative.rejection_sample_method", f"expected standard or block on "
                       f"{check.what}, found {spec.rejection_sample_method!r}")
        return argv

    def request_extras(self, profile: Profile) -> dict:
        # Asked for, SGLang 0.5.23 returns per-response acceptance fields under
        # sglext.spec_tokens_details (in the final chunk of a stream); 0.5.14 ignores the
        # field (its SglExt has none), and cells.py falls back to its counters.
        return {"return_spec_tokens_details": True} if profile.return_spec_details else {}

    def acceptance(self, delta: SpecCounters | None, records: Sequence[RequestRecord],
                   warnings: list[str], k: int | None = None) -> Counts | None:
        """Its per-response fields summed over the cell's requests, else its counters
        (module docstring)."""
        details = sglang_details(records, warnings)
        return sglang_counts(details, k) if details else sglang_counter_counts(delta, warnings)
