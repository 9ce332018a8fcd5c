"""`specrepro probe`: ask a study's declared probes (does this profile's engine start and
serve?) and store each answer in the study's results store.

Design: a probe (params `probes:`, schema.Probe) is an arm without cells whose question is
declared with the study before it is asked, e.g. "does vLLM 0.26.0 quantize the block
drafter to FP8 online?". Asking it is one engine start: the probe's profile launched as an
arm's is (`arm_engine.start_engine`, the log in the store's logs/ as
`<probe>--<profile>.log.gz`), then one request of the study's first workload in the study's
own request form (`runner.load_config`: chat or completion, OpenAI or SGLang's native API),
then the engine stops. The answer is one of `ANSWERS`, with the engine's error (the root
cause the launcher picks out of the log) when it did not start. It goes into a session of
the study's store as `probes: [{...}]`, beside the engines of the runs, so the same
manifest says what was measured and what could not start; specrepro/probes.py reads it
back for the report. A probe is asked again only with `--again` (a new engine release):
every answer stays, the report shows the latest.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from specrepro import identity
from specrepro.harness import cpu_placement, lifecycle
from specrepro.harness.arm_engine import log_name, placement_for, start_engine
from specrepro.harness.engines.base import EngineError
from specrepro.harness.loadgen import LoadGenerator
from specrepro.harness.run_command import refuse_without_gpu
from specrepro.harness.runner import load_config
from specrepro.params import ParamsError, Problem, ResolvedProbe, ResolvedStudy
from specrepro.params import resolve_file as resolve
from specrepro.probes import latest
from specrepro.store import ResultStore, now, pack_log
from specrepro.workloads import build_workload

SERVES, NO_START, NO_SERVE = "serves", "does not start", "starts, does not serve"
ANSWERS = (SERVES, NO_START, NO_SERVE)
REQUEST_TIMEOUT_S = 300.0


def chosen_probes(study: ResolvedStudy, names: list[str]) -> list[ResolvedProbe]:
    """The study's probes named (all of them when none is), or an error naming the known."""
    known = [p.name for p in study.probes]
    if not known:
        raise ParamsError([Problem(study.source, "probes", f"study {study.name!r} declares "
                                   "no probes (a `probes:` list of {name, profile, question})")])
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ParamsError([Problem(study.source, "probes", f"--probe {unknown[0]!r}: study "
                                   f"{study.name!r} declares the probes {known}")])
    return [p for p in study.probes if not names or p.name in names]


def answered(manifest: dict, probe: ResolvedProbe) -> dict | None:
    """The latest stored answer of this probe with this resolved profile, if any: a probe
    record, or a run's engine entry of the same profile (specrepro/probes.py, the report's
    reading too, so a probe a failed run already answered is not started again)."""
    found = latest(manifest, probe)
    if found is None:
        return None
    return {"probe": probe.name, "profile": probe.resolved.name, "answer": found["answer"],
            "why": found["why"] or None, "source": found["source"]}


def ask(study: ResolvedStudy, probe: ResolvedProbe, store: ResultStore, root: Path) -> dict:
    """Start the probe's engine, send one request, stop it: the answer as stored."""
    record = {"probe": probe.name, "question": probe.question, "profile": probe.resolved.name,
              "profile_hash": identity.profile_hash(probe.resolved),
              "asked_at": now().isoformat(), "error": None}
    log = store.logs_dir / log_name(probe)
    started = time.monotonic()
    try:
        eng = start_engine(probe, store.logs_dir, root,
                           placement_for(probe, study.placement, cpu_placement.allowed_cpus()),
                           lifecycle.engines_dir(store.root.parent.parent))
    except (EngineError, ParamsError, RuntimeError, OSError) as err:
        record.update(answer=NO_START, error=str(err))
    else:
        # start to ready, as `specrepro run` records it for an arm's launch (ready_s)
        record["ready_s"] = round(time.monotonic() - started, 1)
        try:
            record["engine"] = eng.describe()
            cell = next(iter(study.cells()))  # the study's request form and sampling
            # one request, every prompt once: never the study's steady window (a study
            # that windows its one-stream cells would send requests for seconds)
            cfg = dataclasses.replace(load_config(study, cell, eng, REQUEST_TIMEOUT_S),
                                      concurrency=1, warmup=0, steady=None)
            (rec,) = LoadGenerator(cfg).run(build_workload(cell.workload)[:1]).records
            if rec.ok and (rec.completion_tokens or 0) > 0:
                record.update(answer=SERVES, tokens=rec.completion_tokens)
            else:
                record.update(answer=NO_SERVE, error=rec.error or "the answer held no tokens")
        finally:
            eng.stop()
    if log.is_file():
        pack_log(log)
        record["log"] = f"{log}.gz"
    return record


def probe_study(params: str, study_id: str, names: list[str], results_dir: str | None,
                again: bool, argv: list[str]) -> list[dict]:
    """Ask the chosen probes of one study (those unanswered, or all with `again`)."""
    (study, default_dir, run_id), = resolve(params, [study_id])
    probes = chosen_probes(study, names)
    # an engine that cannot start here is no answer about the engine: never store one
    refuse_without_gpu(params, "probes", [p.name for p in probes if p.resolved.needs_gpu],
                       "--probe")
    store = ResultStore(Path(results_dir) if results_dir else default_dir, study.name, run_id)
    out = []
    todo = []
    for probe in probes:
        earlier = None if again or not store.manifest_path.is_file() else answered(
            store.manifest(), probe)
        if earlier is not None:
            out.append({**earlier, "stored": True})
        else:
            todo.append(probe)
    if not todo:
        return out
    store.begin_session({"params": study.model_dump(mode="json"), "command": argv,
                         "probes_asked": [p.name for p in todo]})
    try:
        for probe in todo:
            record = ask(study, probe, store, Path.cwd())
            store.update_session(probes=[record])
            out.append(record)
    finally:
        store.end_session("ok")
    return out


def main(argv: list[str] | None = None) -> int:
    """`specrepro probe SUITE --study ID [--probe NAME ...] [--results-dir DIR] [--again]`."""
    ap = argparse.ArgumentParser(prog="specrepro probe", description=__doc__.splitlines()[0])
    ap.add_argument("params", help="a suite (params/h200-engines.yaml) or a study file")
    ap.add_argument("--study", "--notebook", required=True, dest="study",
                    help="a notebook of the suite or a study of its `studies:`")
    ap.add_argument("--probe", action="append", default=[],
                    help="only this probe (repeatable; default: every probe of the study)")
    ap.add_argument("--results-dir", default=None, help="overrides the suite's results_dir")
    ap.add_argument("--again", action="store_true",
                    help="ask even a probe whose answer is stored (a new engine release)")
    args = ap.parse_args(argv)
    try:
        records = probe_study(args.params, args.study, args.probe, args.results_dir,
                              args.again, ["specrepro", "probe", *(argv or sys.argv[1:])])
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for r in records:
        stored = " (stored earlier; --again asks anew)" if r.get("stored") else ""
        said = r.get("error") or r.get("why")  # a new answer's error; a stored one's why
        why = f": {said}".split("\n")[0] if said else ""
        print(f"{r['probe']} ({r['profile']}): {r['answer']}{why}{stored}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
