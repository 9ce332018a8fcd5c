"""The adapter contract: what every engine's module (harness/engines/<engine>.py) offers,
and the process handling they share.

Design:
- One adapter per engine (vllm.py, sglang.py, embedded.py, attach.py, generic.py,
  transformers.py), registered by `profile.engine` in the package's `__init__`. An adapter
  holds every fact of its engine, as class attributes or methods the rest of the harness
  asks for, never branching on an engine's name (tests/test_engine_branches.py):
  - `render_argv`: a profile → the engine's argv, its flags checked and rendered by
    `flags.py` against the engine version's generated lists (harness/engine_cli/; a wrong
    one fails as a `ParamsError` naming the profile file and the flag), each key spelled
    by the adapter's `flag_name` (`flag_separator`: `-` by default, `_` for an engine
    whose flags read `--max_num_seqs`);
  - `spec_file_flag`: for an engine that reads its speculative config from a file, the flag
    that takes the file's path; `launch()` writes `speculative_file(profile)` beside the
    engine's log (`<log name>.speculative.json`) and passes it (`side_files`). None, the
    default (every engine here): the config goes on the command line;
  - `routes` (readiness, version: `engine_http.Routes`), `log_facts` (startup-log patterns,
    `startup_log.LogFact`), `metrics` (`promtext.MetricNames`: counters, latency histograms,
    what a missing /metrics costs; None for an engine with no /metrics),
    `request_features` (`loadgen.RequestFeatures`) and `request_extras`, `acceptance`
    (where a cell's acceptance counts come from: the counters in vLLM's names by default),
    `profiling`, `threads_flag` and `cpu_threads`, `why_unpinned` (why its CPUs are not
    the harness's to choose), `launches` / `in_process` (what the runner starts for it).
- `launch()` starts the command in its own process group with the profile's env, logs
  to a file, and waits on the engine's own readiness signal (its `routes`: a 404 moves the
  poll on to the next route for good). It fails fast when the process exits, naming the
  log's first error line, and at the profile's `ready_timeout_s`, with the log's tail in
  the error; on any error, Ctrl-C included, the group is stopped before the exception
  propagates. The running engine is an `engine_handle.EngineHandle`.
- CPU placement (`cpu_placement.plan_placement`): given a pinned `Placement`, `launch()` starts
  the engine from a thread on the engine's CPU set (the process inherits it), adds the
  adapter's `threads_flag` set to the size of that set unless the profile sets it, and
  records on the handle the mask the process really got. `cpu_threads(profile)` tells the
  plan how many CPUs the engine computes with.
- Startup facts come from the engine's own log lines (`log_facts`, read from the H200
  captures in tests/fixtures/engines): the KV pool in tokens, how many requests it holds,
  the attention backend and the other kernels that change speed. The version comes from
  the engine's version routes; one that gives none is recorded as unknown, with a warning
  saying so (`facts_warnings`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from specrepro.harness import flags, lifecycle, promtext
from specrepro.harness.cpu_placement import Placement, thread_affinity
from specrepro.harness.engine_handle import EngineHandle
from specrepro.harness.engine_http import Routes, http_get, http_json, poll_ready, read_version
from specrepro.harness.flags import engine_cli, engine_cli_versions
from specrepro.harness.loadgen import RequestFeatures
from specrepro.harness.records import RequestRecord
from specrepro.harness.startup_log import LogFact, StartupInfo, parse_log, startup_error
from specrepro.params import Profile

# Readiness polling starts fast and backs off to four times a second: a poll is one local HTTP
# GET, and a start detected up to a second late (the old cap) cost every CPU start ~0.5 s
# (the embedded engine is ready in ~2.6 s) and made `ready_s` that much coarser.
POLL_S = (0.1, 0.25)


class EngineError(RuntimeError):
    """The engine failed to start, died, or did not become ready; the message has the log tail."""


# An OpenAI-compatible server of no known make answers these (guidellm 0.8.1's mock
# server); an adapter that names no routes of its own is polled on them.
OPENAI_ROUTES = Routes(("/health", "/v1/models"), ())

# Acceptance counts of a cell: (drafts, draft tokens, accepted tokens, accepted per position)
Counts = tuple[Any, Any, Any, Any]


class Probe:
    """What a URL answers, each route asked once: how attach.py asks every adapter
    whether the engine behind the URL is its own (`EngineAdapter.answers_as`)."""

    def __init__(self, url: str):
        self.url = url
        self.bodies: dict[str, Any] = {}
        self.statuses: dict[str, int] = {}

    def json(self, route: str) -> Any:
        """The route's JSON body, None unless it answers 200 with JSON."""
        if route not in self.bodies:
            self.bodies[route] = http_json(f"{self.url}{route}")
        return self.bodies[route]

    def status(self, route: str) -> int:
        """The route's HTTP status, 0 when nothing answers."""
        if route not in self.statuses:
            self.statuses[route] = http_get(f"{self.url}{route}")[0]
        return self.statuses[route]


# ---------------------------------------------------------------------------- adapters


class EngineAdapter:
    """What every engine adapter offers; subclasses fill in the engine's own facts."""

    kind: ClassVar[str]  # its name: profile.engine, or what attach.py finds behind a URL
    what: ClassVar[str] = ""  # the engine in words, for errors ("vLLM 0.33.0")
    routes: ClassVar[Routes] = OPENAI_ROUTES
    log_facts: ClassVar[tuple[LogFact, ...]] = ()
    metrics: ClassVar[promtext.MetricNames | None] = None  # None: it has no /metrics
    request_features: ClassVar[RequestFeatures] = RequestFeatures()
    launches: ClassVar[bool] = True  # a process this harness starts (and may keep running)
    in_process: ClassVar[bool] = False  # served inside the harness (transformers.py)
    why_unpinned: ClassVar[str | None] = None  # why its CPUs are not the harness's to choose
    # Where attach.py asks it whether a URL's engine is its own, lowest first (a more
    # specific answer before a more general one); None: never found behind a URL.
    detect_rank: ClassVar[int | None] = None
    threads_flag: ClassVar[str | None] = None  # the engine's CPU-threads flag, if it has one
    # What the engine refuses at its start that a profile already shows, checked before any
    # engine starts (harness/preflight.py): flags whose value must be a positive integer (a
    # count of request slots or of tokens), the flag that sets its context length (where a
    # profile sets none: `default_context`, else the model's config.json
    # max_position_embeddings), the largest draft count it takes (None: no bound known from
    # its source), and whether its model must be a local folder (it loads no hub id).
    positive_flags: ClassVar[tuple[str, ...]] = ()
    context_flag: ClassVar[str | None] = None
    max_draft_tokens: ClassVar[int | None] = None
    local_model: ClassVar[bool] = False
    # How the engine writes torch.profiler traces to a folder, between POST /start_profile
    # and POST /stop_profile (harness/profiling.py): the flags and environment that turn it
    # on, "{dir}" standing for the folder. Empty: this harness cannot turn one on.
    profiling: ClassVar[dict[str, dict]] = {}
    # How its flags join their words (flags.FLAG_SEPARATORS): `--max-num-seqs` ("-") or
    # `--max_num_seqs` ("_"); a profile may write a key either way.
    flag_separator: ClassVar[str] = "-"
    # An engine that reads its speculative config from a file: the flag that takes the
    # file's path (launch() writes it beside the log: `side_files`); None: none does.
    spec_file_flag: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.flag_separator not in flags.FLAG_SEPARATORS:
            raise TypeError(f"engine adapter {cls.__qualname__}: flag_separator "
                            f"{cls.flag_separator!r}, expected one of {flags.FLAG_SEPARATORS}")
        if cls.spec_file_flag is not None and not cls.spec_file_flag.startswith("--"):
            raise TypeError(f"engine adapter {cls.__qualname__}: spec_file_flag "
                            f"{cls.spec_file_flag!r}, expected a flag (`--...`)")

    def flag_name(self, key: str) -> str:
        """A profile's flag key as this engine spells the flag (`max_num_seqs` →
        `--max-num-seqs`, or `--max_num_seqs` where `flag_separator` is `_`)."""
        return flags.flag_name(key, self.flag_separator)

    def speculative_file(self, profile: Profile) -> dict | None:
        """What a `spec_file_flag` engine's side file holds: the profile's speculative
        settings (None: it has none, and no file is written)."""
        if profile.speculative is None:
            return None
        return profile.speculative.model_dump(mode="json", exclude_none=True)

    def side_files(self, profile: Profile, log_path: Path) -> list[str]:
        """Write the configs this engine reads from files beside its log (`<log name>.
        speculative.json`, replaced at each launch); the argv that names them ([] for an
        engine with no `spec_file_flag`, or a profile with nothing to put in one)."""
        if self.spec_file_flag is None:
            return []
        spec = self.speculative_file(profile)
        if spec is None:
            return []
        path = log_path.with_name(f"{log_path.stem}.speculative.json")
        path.write_text(json.dumps(spec, indent=1, sort_keys=True) + "\n")
        return [self.spec_file_flag, str(path.resolve())]

    def flag_list(self, profile: Profile) -> tuple[dict, str]:
        """The generated flag list the profile's argv is checked against, and its name: the
        profile's `engine_version` where a list was generated for it (vLLM 0.26.0, SGLang
        0.5.14), else the adapter's default (`cli`); article profiles name versions
        (0.27.1, 0.32.0) no wheel was read for."""
        version = profile.engine_version
        if version and version in engine_cli_versions(self.kind):
            return engine_cli(f"{self.kind}-{version}"), f"{self.what.split()[0]} {version}"
        return engine_cli(self.cli), self.what

    def cpu_threads(self, profile: Profile) -> int | None:
        """The CPU threads the engine computes with (None: as many CPUs as it is given)."""
        return None

    def default_context(self) -> int | None:
        """The context length where a profile sets none; None: the model's own."""
        return None

    def flag(self, profile: Profile, name: str) -> tuple[str, Any] | None:
        """(the key as the profile writes it, its value) of one of its flags (`--max-num-seqs`
        matches `max-num-seqs`, `max_num_seqs`), or None where the profile sets none."""
        return next(((k, v) for k, v in profile.flags.items() if self.flag_name(k) == name),
                    None)

    def profiled(self, profile: Profile, out_dir: str | Path) -> Profile:
        """The profile with its engine's profiler turned on, writing to out_dir."""
        if not self.profiling:
            raise EngineError(f"profile {profile.name!r}: engine {profile.engine!r} has no "
                              "profiler this harness can turn on (EngineAdapter.profiling)")
        where = str(Path(out_dir).resolve())

        def fill(value):
            if isinstance(value, dict):
                return {k: fill(v) for k, v in value.items()}
            return value.replace("{dir}", where) if isinstance(value, str) else value

        return profile.model_copy(update={
            "flags": {**profile.flags, **fill(self.profiling.get("flags", {}))},
            "env": {**profile.env, **fill(self.profiling.get("env", {}))}})

    # -- argv
    def render_argv(self, profile: Profile, source: str | Path | None = None) -> list[str]:
        raise NotImplementedError

    def command(self, profile: Profile) -> list[str]:
        """The profile's command; `{python}` stands for this interpreter."""
        return [sys.executable if part == "{python}" else part for part in profile.command or []]

    @property
    def ready_path(self) -> str:
        """The preferred readiness route; the runner's liveness check takes any answer,
        a 404 included, as alive, which costs SGLang 0.5.14 no generation."""
        return self.routes.ready[0]

    # -- facts read from the running engine
    def version(self, url: str) -> str | None:
        return read_version(url, self.routes)

    def parse_log(self, text: str) -> StartupInfo:
        return parse_log(text, self.log_facts)

    def request_extras(self, profile: Profile) -> dict:
        """Fields added to every request of the profile's load (the OpenAI routes)."""
        return {}

    def answers_as(self, probe: Probe) -> bool:
        """Whether the engine behind a URL is this one, by what its routes answer."""
        return False

    def attached_warnings(self, profile: Profile, url: str) -> list[str]:
        """What to warn of when this engine is found behind an attached URL."""
        return []

    def served_by(self, handle: EngineHandle) -> EngineAdapter:
        """The adapter of the engine that answers on a handle: this one, or what attach.py
        found behind the URL."""
        return self

    def acceptance(self, delta: promtext.SpecCounters | None,
                   records: Sequence[RequestRecord], warnings: list[str],
                   k: int | None = None) -> Counts | None:
        """A cell's acceptance counts from the counter deltas in vLLM's names (vLLM and the
        embedded engine); an engine that counts otherwise overrides it (sglang.py,
        transformers.py). k: the drafts per step, where known."""
        if delta is None:
            return None
        return (delta.num_drafts, delta.num_draft_tokens, delta.num_accepted_tokens,
                delta.accepted_per_pos)

    def load(self, profile: Profile, root: Path) -> Any:
        """An in-process engine, loaded (`in_process` adapters only: transformers.py)."""
        raise EngineError(f"profile {profile.name!r}: engine {profile.engine!r} is not served "
                          "in-process")

    def known_version(self) -> str | None:
        """Its version without a running engine (the in-process peer's library); None."""
        return None

    def url(self, profile: Profile) -> str:
        return f"http://{profile.host}:{profile.port}"

    # -- lifecycle
    def launch(self, profile: Profile, log_dir: str | Path, source: str | Path | None = None,
               placement: Placement | None = None, log_name: str | None = None,
               pid_dir: str | Path | None = None) -> EngineHandle:
        """Start the engine, return once it is ready; nothing outlives a failure or its run
        (lifecycle.py). The log is `<log_dir>/<log_name or profile name>.log`, appended to."""
        argv = self.render_argv(profile, source)
        pinned = placement is not None and placement.pinned
        if pinned and self.threads_flag and placement.threads is not None and not any(
                self.flag_name(k) == self.threads_flag for k in profile.flags):
            argv += [self.threads_flag, str(placement.threads)]
        url = self.url(profile)
        log_dir, pid_dir = Path(log_dir), Path(pid_dir or Path(log_dir) / ".engines")
        if taken := lifecycle.clear_port(profile.host, profile.port, pid_dir):
            raise EngineError(f"profile {profile.name!r}: {taken}")
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{log_name or profile.name}.log"
        argv += self.side_files(profile, log_path)
        env = {**os.environ, **profile.env, **lifecycle.marker_env(pid_dir, profile.port)}
        with log_path.open("ab") as log:
            offset = log.tell()  # appended to by every launch: this one's lines start here
            log.write(f"$ {' '.join(argv)}\n".encode())
            log.flush()
            with thread_affinity(placement.engine_cpus if pinned else None):
                process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True,
                                           env=env)
        handle = EngineHandle(profile, self, url, process, log_path, argv,  # live: stopped at exit
                              log_offset=offset)
        handle.placement = self.checked_placement(placement, process.pid)
        try:
            handle.guard = lifecycle.guard(handle, pid_dir)
            self.wait_ready(handle, profile.ready_timeout_s)
            self.describe(handle)
        except BaseException:
            handle.stop()
            raise
        return handle

    @staticmethod
    def checked_placement(placement: Placement | None, pid: int) -> Placement | None:
        """The placement as the process got it: a pinned one whose mask differs is recorded
        with the mask found, unpinned."""
        if placement is None or not placement.pinned:
            return placement
        try:
            found = tuple(sorted(os.sched_getaffinity(pid)))
        except OSError as err:  # exited already: wait_ready reports it
            return replace(placement, pinned=False, note=f"{placement.note}; the engine's mask "
                                                         f"could not be read: {err}")
        if found == placement.engine_cpus:
            return placement
        return replace(placement, engine_cpus=found, pinned=False,
                       note=f"{placement.note}; but the engine process runs on CPUs {list(found)}")

    def wait_ready(self, handle: EngineHandle, timeout_s: float) -> None:
        """Poll the readiness routes (a 404 moves on to the next, for good) until one is 200,
        the process exits or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        pause, route = POLL_S[0], 0
        while True:
            if handle.process is not None and handle.process.poll() is not None:
                tail = handle.log_tail()
                cause = startup_error(handle.log_text()) or None
                raise EngineError(
                    f"profile {handle.profile.name!r}: the engine exited with code "
                    f"{handle.process.returncode} before it was ready"
                    f"{f' ({cause})' if cause else ''}; log {handle.log_path}, last lines:\n"
                    f"{tail}")
            status, route = poll_ready(handle.url, self.routes, route)
            if status == 200:
                return
            if time.monotonic() > deadline:
                path = self.routes.ready[route]
                absent = "".join(f"; {r} answered 404" for r in self.routes.ready[:route])
                raise EngineError(
                    f"profile {handle.profile.name!r}: not ready at {handle.url}{path} "
                    f"(last status {status or 'none: nothing answers'}{absent}) after "
                    f"{timeout_s:g} s (ready_timeout_s); log {handle.log_path}, last lines:\n"
                    f"{handle.log_tail()}")
            time.sleep(pause)
            pause = min(pause * 1.5, POLL_S[1])

    def describe(self, handle: EngineHandle) -> None:
        """Version and startup facts, with a warning where the version is unknown or not the
        expected one, or /metrics does not answer."""
        handle.version = self.version(handle.url)
        if handle.log_path is not None:
            handle.startup = self.parse_log(handle.log_text())
        handle.warnings += facts_warnings(handle, self.kind, self.routes, self.metrics)


def facts_warnings(handle: EngineHandle, family: str, routes: Routes,
                   metrics: promtext.MetricNames | None) -> list[str]:
    """What a running engine's routes leave unknown: its version (against the profile's
    expected one), and the measurements a missing /metrics costs."""
    out = []
    name, expected = handle.profile.name, handle.profile.engine_version
    if handle.version is None:
        tried = ", ".join(f"{handle.url}{r}" for r in routes.version)
        why = f"{tried} gave none" if tried else "it has no version route"
        out.append(f"profile {name!r}: {family} version unknown ({why}); its "
                   "cells are recorded with engine_version null"
                   + (f", not the {expected} the profile expects" if expected else ""))
    elif expected and not handle.version.endswith(expected):
        out.append(f"profile {name!r} expects {family} {expected}, the engine reports "
                   f"{handle.version}")
    status = http_get(f"{handle.url}/metrics", timeout=10.0)[0]
    if status != 200 and metrics is not None:
        lost = metrics.lost_without
        out.append(f"{handle.url}/metrics answers {status or 'nothing'}: not measured: {lost}")
    return out
