"""A study → cells and requests in the results store; the `specrepro run` command.

Design:
- `run_study(study, store)` walks the study's cells arm by arm (the baseline arm first, so
  the others can be compared with it). Per arm it launches the engine once through its
  adapter (or attaches, or loads the in-process transformers peer), then per cell
  (workload × concurrency × sampling × repeat): skip it if the store has an `ok` attempt
  (resume), scrape `/metrics` before and after the measured load (inside the load
  generator, after warm-up), sample power and memory, and append one attempt with its
  requests. Every figure comes from `metrics.py`; nothing is re-derived here.
- Cell identity includes the engine version, known only once the engine answers. To skip
  an arm whose cells are all done without launching it, the version an earlier session
  recorded in the manifest for the same arm and profile is tried first.
- Faults: a cell whose engine dies is appended as `failed` with the first request error
  and the engine log's tail, the arm's remaining cells are left for a re-run, and the run
  goes on with the next arm. `/metrics` missing leaves acceptance empty with a warning.
  Counter deltas that do not match the tokens the client saw (another client's traffic, a
  restart) set `counters_consistent=False` with a warning. Ctrl-C records the current
  cell as `interrupted` with the requests that ended, stops the engine and ends the
  session as interrupted; a second run resumes.
- Relative paths in profiles (model, drafter) are relative to the working directory,
  which should be the repository root (engines are started there too).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from specrepro import metrics
from specrepro.grading import grade_gsm8k
from specrepro.harness import engines, power, promtext
from specrepro.harness.loadgen import LoadConfig, LoadGenerator, LoadResult, RequestRecord
from specrepro.params import (
    Cell,
    ParamsError,
    Problem,
    ResolvedArm,
    ResolvedStudy,
    load_suite,
    params_hash,
    read_tree,
    resolve_study,
    standalone_suite,
)
from specrepro.results import ResultStore, cell_id, now
from specrepro.workloads import Prompt, build_workload

IGNORE_EOS_WARNING = (
    "ignore_eos is on: every output runs to max_tokens past its end of text, where a model "
    "tends to repeat itself, and repetition is easy to draft, so acceptance is inflated "
    "(article B); compare repeated_4gram_share")
PEER_SEQUENTIAL = "the transformers peer serves one request at a time: concurrency {c} ran sequentially"


@dataclass
class RunSummary:
    """What one run_study call did."""

    ok: int = 0
    failed: int = 0
    interrupted: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 130 if self.interrupted else (1 if self.failed or self.errors else 0)


# ------------------------------------------------------------------------- engines


@dataclass
class ArmEngine:
    """The running engine of one arm: an HTTP handle or the in-process peer."""

    arm: ResolvedArm
    handle: engines.EngineHandle | None = None
    peer: Any = None  # peer.TransformersPeer

    @property
    def profile(self):
        return self.arm.resolved

    @property
    def version(self) -> str | None:
        return self.peer.version() if self.peer is not None else self.handle.version

    @property
    def family(self) -> str:
        """Whose metric names and request features apply: vllm, embedded, sglang, peer."""
        return "transformers" if self.peer is not None else self.handle.engine

    @property
    def pid(self) -> int | None:
        if self.peer is not None:
            return power.current_pid()
        return self.handle.process.pid if self.handle.process is not None else None

    def alive(self) -> bool:
        if self.peer is not None:
            return True
        if not self.handle.alive():
            return False
        adapter = engines.ADAPTERS.get(self.handle.attached or self.profile.engine)
        path = adapter.ready_path if adapter is not None else "/health"
        return engines.http_get(self.handle.url + path, timeout=5.0)[0] != 0

    def scrape(self) -> str | None:
        return None if self.peer is not None else self.handle.metrics_text()

    def describe(self) -> dict:
        p = self.profile
        info = {"arm": self.arm.name, "profile": p.name, "profile_file": p.source,
                "profile_hash": params_hash(p.identity()), "engine": p.engine,
                "version": self.version, "flags": p.flags,
                "speculative": p.speculative.model_dump(mode="json") if p.speculative else None}
        if self.handle is not None:
            h = self.handle
            info.update(url=h.url, argv=h.argv, attached=h.attached,
                        log=str(h.log_path) if h.log_path else None,
                        kv_pool_tokens=h.startup.kv_pool_tokens,
                        max_concurrency=h.startup.max_concurrency, warnings=h.warnings)
        return info

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.stop()


def start_engine(arm: ResolvedArm, log_dir: Path, root: Path) -> ArmEngine:
    profile = arm.resolved
    if profile.engine == "transformers":
        from specrepro.harness.peer import TransformersPeer

        return ArmEngine(arm, peer=TransformersPeer(profile, root).load())
    return ArmEngine(arm, handle=engines.launch(profile, log_dir, profile.source))


def known_version(store: ResultStore, arm: ResolvedArm) -> str | None:
    """The engine version an earlier session recorded for this arm and profile."""
    want = params_hash(arm.resolved.identity())
    for session in reversed(store.manifest().get("sessions", [])):
        for eng in reversed(session.get("engines") or []):
            if eng.get("arm") == arm.name and eng.get("profile_hash") == want:
                return eng.get("version")
    if arm.resolved.engine == "transformers":
        from specrepro.harness.peer import version

        return version()
    return None


# ------------------------------------------------------------------------ figures


def acceptance(delta: promtext.SpecCounters | None, records: Sequence[RequestRecord],
               family: str) -> dict:
    """Acceptance counters and figures of a cell: engine counters (vLLM names), SGLang's
    per-response fields, or the peer's own counts."""
    drafts = draft_tokens = accepted = None
    per_pos = None
    if family == "transformers":
        from specrepro.harness.peer import peer_counts

        c = peer_counts(records)
        if c is not None:
            drafts, draft_tokens = c["num_drafts"], c["num_draft_tokens"]
            accepted, per_pos = c["num_accepted_tokens"], c["accepted_per_pos"]
    elif family == "sglang":
        c = sglang_counts(records)
        if c is not None:
            drafts, draft_tokens, accepted, per_pos = c
    elif delta is not None:
        drafts, draft_tokens = delta.num_drafts, delta.num_draft_tokens
        accepted, per_pos = delta.num_accepted_tokens, delta.accepted_per_pos
    return {"num_drafts": drafts, "num_draft_tokens": draft_tokens,
            "num_accepted_tokens": accepted,
            "acceptance_length": metrics.acceptance_length(accepted, drafts),
            "draft_acceptance_rate": metrics.draft_acceptance_rate(accepted, draft_tokens),
            "per_position_acceptance": metrics.per_position_acceptance(per_pos, drafts)}


def sglang_counts(records: Sequence[RequestRecord]):
    """Σ spec_verify_ct, Σ spec_num_proposed_drafts, Σ spec_num_correct_drafts and the
    per-position counts from spec_correct_drafts_histogram (hist[j]: steps with j correct
    drafts, so position i was accepted in Σ_{j>i} hist[j] steps). ENGINE_FACTS §4.4."""
    rows = [(r.spec or {}).get("sglext", {}).get("spec_tokens_details") for r in records]
    rows = [d for d in rows if d]
    if not rows:
        return None
    drafts = sum(d.get("spec_verify_ct", 0) for d in rows)
    proposed = sum(d.get("spec_num_proposed_drafts", 0) for d in rows)
    correct = sum(d.get("spec_num_correct_drafts", 0) for d in rows)
    hists = [d.get("spec_correct_drafts_histogram") for d in rows]
    per_pos = None
    if all(isinstance(h, list) for h in hists):
        k = max(len(h) for h in hists) - 1
        per_pos = [sum(sum(h[j] for j in range(i + 1, len(h))) for h in hists)
                   for i in range(max(k, 0))]
    return drafts, proposed, correct, per_pos


def latency_fields(records: Sequence[RequestRecord]) -> dict:
    ok = [r for r in records if r.ok]
    ttft = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
    itl = [x * 1000 for r in ok for x in r.itl_s]
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    return {"ttft_p50_ms": metrics.percentile(ttft, 50), "ttft_p95_ms": metrics.percentile(ttft, 95),
            "itl_p50_ms": metrics.percentile(itl, 50), "e2e_p50_s": metrics.percentile(e2e, 50)}


def grade(records: Sequence[RequestRecord], prompts: dict[str, Prompt]) -> dict[int, dict]:
    """GSM8K strict/flexible per request (the very outputs that were timed)."""
    out = {}
    for r in records:
        p = prompts.get(r.prompt_id)
        if r.ok and p is not None and p.workload == "gsm8k" and p.reference:
            g = grade_gsm8k(r.text, p.reference)
            out[r.request_idx] = {"gsm8k_strict": g["strict"], "gsm8k_flexible": g["flexible"]}
    return out


def repetition(records: Sequence[RequestRecord]) -> float | None:
    """Repeated-4-gram share of the outputs: token ids where every output has them, else words."""
    ok = [r for r in records if r.ok]
    if ok and all(r.token_ids is not None for r in ok):
        return metrics.pooled_repeated_ngram_share([r.token_ids for r in ok], 4)
    return metrics.pooled_repeated_ngram_share([metrics.words(r.text) for r in ok], 4)


def identical_share(records: Sequence[RequestRecord], baseline) -> float | None:
    """Share of requests whose output equals the baseline arm's on the same prompt and seed:
    token ids where both have them (the lossless check), else text."""
    if baseline is None or baseline.height == 0:
        return None
    base = {(row["prompt_id"], row["seed"]): row for row in baseline.iter_rows(named=True)
            if row["error"] is None}
    same = total = 0
    for r in records:
        b = base.get((r.prompt_id, r.seed))
        if not r.ok or b is None:
            continue
        total += 1
        if r.token_ids is not None and b["token_ids"] is not None:
            same += list(r.token_ids) == list(b["token_ids"])
        else:
            same += r.text == b["text"]
    return same / total if total else None


def baseline_requests(store: ResultStore, study: ResolvedStudy, cell: Cell):
    """The baseline arm's requests for the same workload, concurrency, sampling, repeat, seed."""
    if study.baseline is None or study.baseline == cell.arm.name:
        return None
    import polars as pl

    cells = store.load_cells()
    s = cell.sampling
    hit = cells.filter((pl.col("arm") == study.baseline)
                       & (pl.col("workload") == cell.workload.name)
                       & (pl.col("concurrency") == cell.concurrency)
                       & (pl.col("temperature") == s.temperature) & (pl.col("top_p") == s.top_p)
                       & (pl.col("top_k") == s.top_k) & (pl.col("repeat") == cell.repeat)
                       & (pl.col("seed") == cell.seed))
    if hit.height == 0:
        return None
    last = hit.sort("ended_at").tail(1).row(0, named=True)
    reqs = store.load_requests()
    return reqs.filter((pl.col("cell_id") == last["cell_id"])
                       & (pl.col("attempt") == last["attempt"]))


def consistency(delta: promtext.SpecCounters | None, records: Sequence[RequestRecord],
                warnings: list[str]) -> bool | None:
    """Do the engine's token counters moved by exactly what this client sent and received?"""
    if delta is None or delta.generation_tokens is None:
        return None
    sent_out = sum(r.completion_tokens or 0 for r in records)
    sent_in = sum(r.prompt_tokens or 0 for r in records)
    ok = delta.generation_tokens == sent_out
    if delta.prompt_tokens is not None:
        ok = ok and delta.prompt_tokens == sent_in
    if not ok:
        warnings.append(
            f"engine counters moved by {delta.generation_tokens:g} generated / "
            f"{delta.prompt_tokens} prompt tokens, the client saw {sent_out} / {sent_in}: "
            "another client's traffic, a restart, or failed requests")
    return ok


# ---------------------------------------------------------------------- one cell


def load_config(study: ResolvedStudy, cell: Cell, eng: ArmEngine, timeout_s: float) -> LoadConfig:
    p = eng.profile
    extras = eng.handle.request_extras() if eng.handle is not None else {}
    return LoadConfig(
        url=eng.handle.url if eng.handle is not None else "inprocess",
        model=p.model.served_name or p.model.id, concurrency=cell.concurrency, mode=study.mode,
        window_s=study.window_s, warmup=study.warmup, temperature=cell.sampling.temperature,
        top_p=cell.sampling.top_p, top_k=cell.sampling.top_k, seed=cell.seed,
        ignore_eos=study.ignore_eos, thinking=study.thinking,
        reasoning_effort=study.reasoning_effort,
        engine=eng.family if eng.family in ("vllm", "embedded", "sglang") else "vllm",
        extra_body=extras, request_timeout_s=timeout_s)


def counters_delta(result: LoadResult, family: str, end: str,
                   warnings: list[str]) -> promtext.SpecCounters | None:
    """before → `end` ('after' or 'window') as a SpecCounters delta; None with a warning."""
    if family == "transformers":
        return None
    engine = family if family in promtext.ENGINE_FAMILY else "vllm"
    before, after = result.before, getattr(result, end)
    if before is None or after is None:
        msg = "/metrics did not answer: acceptance and counter checks not measured"
        if msg not in warnings:
            warnings.append(msg)
        return None
    try:
        return promtext.delta(promtext.parse(before, engine), promtext.parse(after, engine))
    except promtext.CounterReset as err:
        warnings.append(str(err))
        return None


def cell_row(study: ResolvedStudy, cell: Cell, eng: ArmEngine, result: LoadResult,
             report: power.PowerReport, warnings: list[str]) -> dict:
    """Every figure of the cells row, from the measured records, counters and power."""
    p, records = eng.profile, result.records
    ok = [r for r in records if r.ok]
    window = study.mode == "window"
    delta = counters_delta(result, eng.family, "window" if window else "after", warnings)
    full = counters_delta(result, eng.family, "after", warnings) if window else delta
    output_tokens = sum(r.completion_tokens or 0 for r in ok)
    if window:  # the decode rate over the window: the engine's counter, else what arrived
        output_tokens = (int(delta.generation_tokens) if delta is not None
                         and delta.generation_tokens is not None else result.tokens_in_span())
    agg = metrics.agg_tok_s(output_tokens, result.wall_s)
    per_stream = metrics.per_stream_tok_s(agg, cell.concurrency)
    acc = acceptance(delta, records, eng.family)
    # a step of autoregressive decoding yields one token: its step time needs no counters
    step_len = 1.0 if p.method == "none" else acc["acceptance_length"]
    spec = p.speculative
    handle = eng.handle
    startup = handle.startup if handle is not None else engines.StartupInfo()
    kv_pool = startup.kv_pool_tokens
    if kv_pool is None and delta is not None and delta.kv_pool_tokens is not None:
        kv_pool = int(delta.kv_pool_tokens)
    return {
        "arm": cell.arm.name, "profile": p.name,
        "engine": (handle.attached or p.engine) if handle is not None else p.engine,
        "engine_version": eng.version, "method": p.method,
        "num_speculative_tokens": spec.num_speculative_tokens if spec else None,
        "schedule": (json.dumps(spec.num_speculative_tokens_per_batch_size)
                     if spec and spec.num_speculative_tokens_per_batch_size else None),
        "workload": cell.workload.name, "n_prompts": cell.workload.n,
        "concurrency": cell.concurrency, "temperature": cell.sampling.temperature,
        "top_p": cell.sampling.top_p, "top_k": cell.sampling.top_k, "repeat": cell.repeat,
        "seed": cell.seed, "ignore_eos": study.ignore_eos,
        "n_requests": len(records), "n_errors": len(records) - len(ok),
        "prompt_tokens": sum(r.prompt_tokens or 0 for r in ok), "output_tokens": output_tokens,
        "wall_s": result.wall_s, "agg_tok_s": agg, "per_stream_tok_s": per_stream,
        **latency_fields(records), **acc,
        "step_ms": metrics.step_ms(step_len, per_stream),
        "repeated_4gram_share": repetition(records),
        "power_w_mean": report.power_w_mean, "energy_j": report.energy_j,
        "tokens_per_joule": metrics.tokens_per_joule(output_tokens, report.energy_j),
        "peak_mem_mib": report.peak_mem_mib if report.peak_mem_mib is not None
        else report.peak_rss_mib,
        "kv_pool_tokens": kv_pool, "max_concurrency": startup.max_concurrency,
        "counters_consistent": consistency(full, records, warnings),
    }


def request_rows(records: Sequence[RequestRecord], grades: dict[int, dict]) -> list[dict]:
    return [{**r.row(), **grades.get(r.request_idx, {})}
            for r in sorted(records, key=lambda r: r.request_idx)]


def gsm8k_fields(grades: dict[int, dict]) -> dict:
    if not grades:
        return {"gsm8k_strict_correct": None, "gsm8k_flexible_correct": None, "gsm8k_n": None}
    return {"gsm8k_strict_correct": sum(g["gsm8k_strict"] for g in grades.values()),
            "gsm8k_flexible_correct": sum(g["gsm8k_flexible"] for g in grades.values()),
            "gsm8k_n": len(grades)}


def died_message(eng: ArmEngine, records: Sequence[RequestRecord]) -> str:
    errors = [r.error for r in records if r.error]
    first = f"; first request error: {errors[0]}" if errors else ""
    where = ""
    if eng.handle is not None and eng.handle.log_path is not None:
        where = f"; log {eng.handle.log_path}, last lines:\n{eng.handle.log_tail()}"
    return (f"engine of arm {eng.arm.name!r} ({eng.profile.name}) died during the cell: "
            f"{len(errors)} of {len(records)} requests failed{first}{where}")


# ----------------------------------------------------------------------- the run


@contextlib.contextmanager
def ctrl_c_raises():
    """For the run's duration Ctrl-C raises KeyboardInterrupt, whatever SIGINT handler the
    host process had (a library's, or SIG_IGN): that is what records the cell in flight as
    interrupted and keeps the rest. asyncio.run (the load generator) turns SIGINT into a
    cancellation only when it finds Python's default handler. Only the main thread may set
    handlers; elsewhere the host's stays."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_study(study: ResolvedStudy, store: ResultStore, *, root: Path | str = ".",
              fresh: bool = False, progress: bool = True, power_interval_s: float = 2.0,
              request_timeout_s: float = 600.0, command: list[str] | None = None) -> RunSummary:
    """Measure every cell of a resolved study that the store lacks; see the module docstring."""
    with ctrl_c_raises():
        return _run_study(study, store, root=root, fresh=fresh, progress=progress,
                          power_interval_s=power_interval_s,
                          request_timeout_s=request_timeout_s, command=command)


def _run_study(study, store, *, root, fresh, progress, power_interval_s, request_timeout_s,
               command) -> RunSummary:
    root = Path(root)
    summary = RunSummary()
    note = power.nvml_note()
    run_warnings = [IGNORE_EOS_WARNING] if study.ignore_eos else []
    store.begin_session({"params": study.model_dump(mode="json"), "command": command,
                         "power_note": note, "warnings": run_warnings})
    arms = sorted(study.arms, key=lambda a: a.name != study.baseline)
    all_cells = list(study.cells())
    done = set() if fresh else store.completed_cell_ids()
    prompts_of: dict[str, list[Prompt]] = {}
    bar = tqdm(total=len(all_cells), desc=study.name, unit="cell", disable=not progress)
    status = "ok"
    try:
        for arm in arms:
            cells = [c for c in all_cells if c.arm.name == arm.name]
            version = known_version(store, arm)
            pending = [c for c in cells
                       if cell_id(study.cell_identity(c, version)) not in done]
            if not pending:
                summary.skipped += len(cells)
                bar.update(len(cells))
                continue
            try:
                eng = start_engine(arm, store.logs_dir, root)
            except (engines.EngineError, ParamsError, RuntimeError, OSError) as err:
                summary.errors.append(f"arm {arm.name!r}: {err}")
                store.update_session(engines=[{"arm": arm.name, "profile": arm.resolved.name,
                                               "error": str(err)}])
                bar.update(len(cells))
                continue
            try:
                store.update_session(engines=[eng.describe()],
                                     models=[arm.resolved.model.model_dump(mode="json")]
                                     + ([arm.resolved.drafter.model_dump(mode="json")]
                                        if arm.resolved.drafter else []))
                run_arm(study, store, eng, cells, done, prompts_of, summary, bar,
                        power_interval_s, request_timeout_s, run_warnings)
            finally:
                eng.stop()
    except KeyboardInterrupt:
        status = "interrupted"
        summary.interrupted += 1
    finally:
        bar.close()
        if status == "ok" and (summary.failed or summary.errors):
            status = "failed"
        store.update_session(summary={"ok": summary.ok, "failed": summary.failed,
                                      "skipped": summary.skipped,
                                      "interrupted": summary.interrupted,
                                      "errors": summary.errors})
        store.end_session(status)
    return summary


def run_arm(study, store, eng: ArmEngine, cells, done, prompts_of, summary, bar,
            power_interval_s, request_timeout_s, run_warnings) -> None:
    """The cells of one arm on its running engine; stops at the first dead engine."""
    for cell in cells:
        cid = cell_id(study.cell_identity(cell, eng.version))
        if cid in done:
            summary.skipped += 1
            bar.update(1)
            continue
        key = json.dumps(cell.workload.model_dump(mode="json"), sort_keys=True)
        if key not in prompts_of:
            prompts_of[key] = build_workload(cell.workload)
        status = run_cell(study, store, eng, cell, cid, prompts_of[key], power_interval_s,
                          request_timeout_s, run_warnings)
        setattr(summary, status, getattr(summary, status) + 1)
        bar.update(1)
        if status == "failed" and not eng.alive():
            summary.errors.append(f"arm {eng.arm.name!r}: engine died; its remaining cells "
                                  "are left for a re-run")
            return


def run_cell(study, store, eng: ArmEngine, cell: Cell, cid: str, prompts: list[Prompt],
             power_interval_s: float, request_timeout_s: float, run_warnings) -> str:
    """Measure one cell and append its attempt; returns its status."""
    warnings = list(run_warnings) + list(eng.handle.warnings if eng.handle else [])
    if eng.peer is not None:
        from specrepro.harness.peer import DERIVED_NOTE

        if cell.concurrency > 1:
            warnings.append(PEER_SEQUENTIAL.format(c=cell.concurrency))
        if eng.profile.speculative is not None:
            warnings.append(DERIVED_NOTE)
    cfg = load_config(study, cell, eng, request_timeout_s)
    started = now()
    sampler = power.PowerSampler(power_interval_s, pid=eng.pid).start()
    records: list[RequestRecord] = []
    status, error, result = "ok", None, None
    try:
        if eng.peer is not None:
            result = eng.peer.run(prompts, cfg, records)
        else:
            gen = LoadGenerator(cfg)
            records = gen.records
            result = gen.run(prompts, eng.scrape)
    except KeyboardInterrupt:
        report = sampler.stop()
        result = LoadResult(records, None)
        append(store, study, cell, cid, eng, result, report, prompts, warnings,
               "interrupted", "interrupted by the user (Ctrl-C) during the cell", started)
        raise
    except Exception as err:  # noqa: BLE001 - a fault in this cell is recorded, the run goes on
        status, error = "failed", f"{type(err).__name__}: {err}"
        result = LoadResult(records, None)
    report = sampler.stop()
    if report.note and report.note not in warnings:
        warnings.append(report.note)
    if status == "ok" and not eng.alive():
        status, error = "failed", died_message(eng, records)
    elif status == "ok" and records and not any(r.ok for r in records):
        status, error = "failed", f"every request failed; first error: {records[0].error}"
    append(store, study, cell, cid, eng, result, report, prompts, warnings, status, error,
           started)
    return status


def append(store, study, cell, cid, eng, result, report, prompts, warnings, status, error,
           started) -> None:
    grades = grade(result.records, {p.id: p for p in prompts})
    row = cell_row(study, cell, eng, result, report, warnings)
    row.update(gsm8k_fields(grades))
    row["identical_to_baseline"] = identical_share(result.records,
                                                   baseline_requests(store, study, cell))
    n_err = row["n_errors"]
    if n_err and status == "ok":
        warnings.append(f"{n_err} of {row['n_requests']} requests failed")
    row.update(cell_id=cid, status=status, error=error, started_at=started, ended_at=now(),
               warnings=warnings)
    store.append_cell(row, request_rows(result.records, grades))


# --------------------------------------------------------------------------- CLI


def resolve(path: Path | str, notebooks: Sequence[str] = ()) -> list[tuple[ResolvedStudy, Path, str]]:
    """(study, results dir, run id) for a suite (its notebooks, or those named) or a study
    file (its arms' profiles from the `profiles/` folder beside its folder)."""
    path = Path(path)
    tree = read_tree(path)
    if "notebooks" in tree.data:
        suite = load_suite(path)
        chosen = list(notebooks) or list(suite.notebooks)
        return [(resolve_study(suite, nb), suite.results_path, suite.run_id) for nb in chosen]
    if "arms" in tree.data:
        nb = tree.data.get("notebook")
        profiles = path.resolve().parent.parent / "profiles"
        suite = standalone_suite(path, nb, profiles)
        return [(resolve_study(suite, nb), path.resolve().parents[2] / "results",
                 suite.run_id)]
    raise ParamsError([Problem(str(path), "", "expected a suite (notebooks:) or a study "
                                              f"(arms:), found keys {sorted(tree.data)}")])


def main(argv: list[str] | None = None) -> int:
    """`specrepro run params/<suite or study>.yaml [--notebook ID] [--results-dir DIR] [--fresh]`."""
    ap = argparse.ArgumentParser(prog="specrepro run", description=__doc__.splitlines()[0])
    ap.add_argument("params", help="a suite (params/default.yaml) or a study file")
    ap.add_argument("--notebook", action="append", default=[],
                    help="only this notebook's study (a suite's notebook id; repeatable)")
    ap.add_argument("--results-dir", default=None, help="overrides the suite's results_dir")
    ap.add_argument("--run-id", default=None, help="overrides the suite's run_id")
    ap.add_argument("--fresh", action="store_true",
                    help="measure every cell again (new attempts) instead of resuming")
    ap.add_argument("--power-interval", type=float, default=2.0, help="NVML sampling, seconds")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    try:
        plans = resolve(args.params, args.notebook)
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    code = 0
    for study, results_dir, run_id in plans:
        store = ResultStore(Path(args.results_dir) if args.results_dir else results_dir,
                            study.name, args.run_id or run_id)
        summary = run_study(study, store, fresh=args.fresh, progress=not args.no_progress,
                            power_interval_s=args.power_interval,
                            command=["specrepro", "run", *(argv or sys.argv[1:])])
        print(f"{study.name}: {summary.ok} ok, {summary.failed} failed, {summary.skipped} "
              f"already done, {summary.interrupted} interrupted -> {store.root}")
        for err in summary.errors:
            print(f"  error: {err}", file=sys.stderr)
        code = max(code, summary.exit_code)
        if summary.interrupted:
            print("interrupted: everything measured so far is kept; run again to resume",
                  file=sys.stderr)
            return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
