"""Engine adapters: a profile → an argv, a running server, its version, its startup facts.

Design:
- One adapter per engine kind (`VLLMAdapter`, `SGLangAdapter`, `EmbeddedAdapter`,
  `AttachAdapter`), each a small class that knows that engine's flags, readiness
  signal, version route, startup log lines and metric family.
- `render_argv` turns a profile into the engine's argv; the flags are checked and rendered
  by `flags.py` against the engine version's generated lists (a wrong one fails as a
  `ParamsError` naming the profile file and the flag). The embedded engine's lists, its
  `--speculative-config` keys, methods and drafter precisions are the contract in
  `specrepro.speculative`, which its server's parser is built from, so the two cannot part.
  SGLang's algorithms are vLLM's methods in SGLang's spelling (`SGLangAdapter.ALGORITHMS`).
- `launch()` starts the command in its own process group with the profile's env, logs
  to a file, and waits on the engine's own readiness signal (`ROUTES`: vLLM and the
  embedded engine `GET /health`; SGLang 0.5.23 `GET /ready`; SGLang 0.5.14 has no
  `/ready`, so its 404 moves the poll on to `/health_generate`, which answers 503 until
  the warm-up generation returned). It fails fast when the process exits, naming the
  log's first error line, and at the profile's `ready_timeout_s`, with the log's tail in
  the error; on any error, Ctrl-C included, the group is stopped before the exception
  propagates. The running engine is a `process.EngineHandle`.
- CPU placement (`process.plan_placement`): given a pinned `Placement`, `launch()` starts
  the engine from a thread on the engine's CPU set (the process inherits it), adds the
  adapter's `threads_flag` set to the size of that set unless the profile sets it, and
  records on the handle the mask the process really got. `cpu_threads(profile)` tells the
  plan how many CPUs the engine computes with.
- Startup facts come from the engine's own log lines, each engine's a table of `LogFact`s
  (`VLLM_LOG`, `SGLANG_LOG` in startup_logs.py, read from the H200 captures in
  tests/fixtures/engines): the KV pool in tokens, how many requests it holds, the
  attention backend and the other kernels that change speed. The version comes from the engine's endpoint (`ROUTES`);
  one that gives none is recorded as unknown, with a warning saying so.
- Attaching (`AttachAdapter`): the engine behind a URL is found from its routes; an
  OpenAI-compatible server that is neither vLLM, SGLang nor the embedded engine (guidellm's
  mock server: `/health` and `/v1/models`, no `/version`, `/server_info` or `/metrics`) is
  attached as `generic`, with warnings naming what cannot be measured on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

from specrepro import speculative
from specrepro.harness import lifecycle, promtext
from specrepro.harness.flags import (
    FlagCheck,
    engine_cli,
    engine_cli_versions,
    flag_name,
    model_flags,
    profile_file,
    render_flags,
)
from specrepro.harness.process import (
    EngineHandle,
    LogFact,
    Placement,
    Routes,
    StartupInfo,
    http_get,
    http_json,
    parse_log,
    poll_ready,
    read_version,
    startup_error,
    thread_affinity,
)
from specrepro.harness.startup_logs import (  # noqa: F401 (parse_*_log: the adapters' API)
    SGLANG_LOG,
    VLLM_LOG,
    parse_sglang_log,
    parse_vllm_log,
)
from specrepro.params import Profile

POLL_S = (0.1, 1.0)  # readiness polling starts fast and backs off to once a second


class EngineError(RuntimeError):
    """The engine failed to start, died, or did not become ready; the message has the log tail."""


# ------------------------------------------------------------------------- routes


ROUTES: dict[str, Routes] = {
    # vLLM 0.26.0 and 0.33.0: /health is 200 once the engine is up; /version {"version"}
    "vllm": Routes(("/health",), ("/version",)),
    "embedded": Routes(("/health",), ("/version",)),
    # SGLang 0.5.23: /ready, 200 after warm-up, no generation (its /health runs one of
    # >= 1 s). 0.5.14 has no /ready (404): /health_generate is 503 while the server is
    # Starting, then runs a 1-token generation with log_metrics=False, so no counter moves
    # (0.5.14 http_server.py:561-635; its /health is the same handler). /version is 404 in
    # both; /server_info carries "version", /get_server_info is 0.5.14's deprecated alias.
    "sglang": Routes(("/ready", "/health_generate"), ("/server_info", "/get_server_info")),
    # an OpenAI-compatible server that is neither (guidellm 0.8.1's mock server)
    "generic": Routes(("/health", "/v1/models"), ()),
}

# ---------------------------------------------------------------------------- adapters


class EngineAdapter:
    """What every engine adapter offers; subclasses fill in the engine's own facts."""

    kind: ClassVar[str]
    log_facts: ClassVar[tuple[LogFact, ...]] = VLLM_LOG
    threads_flag: ClassVar[str | None] = None  # the engine's CPU-threads flag, if it has one
    # How the engine writes torch.profiler traces to a folder, between POST /start_profile
    # and POST /stop_profile (harness/profiling.py): the flags and environment that turn it
    # on, "{dir}" standing for the folder. Empty: this harness cannot turn one on.
    profiling: ClassVar[dict[str, dict]] = {}

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
    def routes(self) -> Routes:
        return ROUTES.get(self.kind, ROUTES["generic"])

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
        return {}

    def metrics_engine(self, handle: EngineHandle) -> str:
        return self.kind

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
                flag_name(k) == self.threads_flag for k in profile.flags):
            argv += [self.threads_flag, str(placement.threads)]
        url = self.url(profile)
        log_dir, pid_dir = Path(log_dir), Path(pid_dir or Path(log_dir) / ".engines")
        if taken := lifecycle.clear_port(profile.host, profile.port, pid_dir):
            raise EngineError(f"profile {profile.name!r}: {taken}")
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{log_name or profile.name}.log"
        env = {**os.environ, **profile.env, **lifecycle.marker_env(pid_dir, profile.port)}
        with log_path.open("ab") as log:
            offset = log.tell()  # appended to by every launch: this one's lines start here
            log.write(f"$ {' '.join(argv)}\n".encode())
            log.flush()
            with thread_affinity(placement.engine_cpus if pinned else None):
                process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True,
                                           env=env)
        handle = EngineHandle(profile, self, url, process, log_path, argv,  # now live: stopped at exit
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
        handle.warnings += facts_warnings(handle, self.kind, self.routes)


def facts_warnings(handle: EngineHandle, family: str, routes: Routes) -> list[str]:
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
    if status != 200:
        lost = promtext.LOST_WITHOUT_METRICS[promtext.ENGINE_FAMILY[handle.engine]]
        out.append(f"{handle.url}/metrics answers {status or 'nothing'}: not measured: {lost}")
    return out


class VLLMAdapter(EngineAdapter):
    """`vllm serve MODEL …`, flags checked against the generated list of the profile's
    engine_version (vLLM 0.26.0 or 0.33.0; 0.33.0 where no list was generated)."""

    kind = "vllm"
    cli = "vllm-0.33.0"
    what = "vLLM 0.33.0"
    reserved: ClassVar[dict[str, str]] = {"--model": "model.id", "--revision": "model.revision",
                "--served-model-name": "model.served_name", "--host": "host", "--port": "port",
                "--tensor-parallel-size": "parallel", "--data-parallel-size": "parallel",
                "--speculative-config": "speculative", "--spec-method": "speculative",
                "--spec-model": "speculative", "--spec-tokens": "speculative"}
    # Methods that read a separate checkpoint: the profile's drafter.
    drafter_methods = ("dflash", "draft_model", "eagle", "eagle3", "dspark")
    # --profiler-config (vllm/config/profiler.py: `profiler` "torch" and an absolute
    # `torch_profiler_dir`; it is left out of the compile cache's hash); the worker's trace
    # holds CPU and GPU events, the front end's a CPU trace of its own
    profiling: ClassVar[dict[str, dict]] = {
        "flags": {"profiler-config": {"profiler": "torch", "torch_profiler_dir": "{dir}"}}}

    def render_argv(self, profile: Profile, source: str | Path | None = None) -> list[str]:
        accepted, what = self.flag_list(profile)
        check = FlagCheck(profile_file(profile, source), what)
        argv = [*self.command(profile), profile.model.id]
        argv += self.model_flags(profile)
        if profile.speculative is not None:
            spec = self.speculative_config(profile, accepted, check)
            argv += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
        if any(flag_name(k) == "--disable-log-stats" and v for k, v in profile.flags.items()):
            check.fail("flags.disable-log-stats", "expected the engine's metrics on (the harness "
                       "reads acceptance from them), found disable-log-stats, which removes them")
        self.check_compilation(profile, accepted, check)
        argv += render_flags(profile.flags, accepted, self.reserved, check)
        check.raise_if_any()
        return argv

    def model_flags(self, profile: Profile) -> list[str]:
        return model_flags(profile, "--tensor-parallel-size", "--data-parallel-size")

    def speculative_config(self, profile: Profile, accepted: dict, check: FlagCheck) -> dict:
        """The `--speculative-config` JSON: the profile's keys, the drafter as model/revision."""
        spec = profile.speculative.model_dump(mode="json", exclude_none=True)
        if spec["method"] in self.drafter_methods and "model" not in spec:
            if profile.drafter is None:
                check.fail("drafter", f"expected a drafter checkpoint for method "
                                      f"{spec['method']!r}, found none")
            else:
                spec["model"] = profile.drafter.id
                if profile.drafter.revision:
                    spec["revision"] = profile.drafter.revision
        for key, value in spec.items():
            where = f"speculative.{key}"
            if not check.one_of(where, key, accepted["speculative_config_keys"],
                                "a --speculative-config key"):
                continue
            if key == "method":
                check.one_of(where, value, accepted["speculative_methods"], "a speculative method")
            elif key == "quantization":
                check.one_of(where, value, accepted["quantization_methods"], "a quantization method")
            elif key in accepted["speculative_config_choices"]:
                check.one_of(where, value, accepted["speculative_config_choices"][key],
                             f"a value of {key}")
        return spec

    def check_compilation(self, profile: Profile, accepted: dict, check: FlagCheck) -> None:
        """`compilation-config` keys and its cudagraph_mode (case-insensitive in vLLM)."""
        for key, value in profile.flags.items():
            if flag_name(key) != "--compilation-config" or not isinstance(value, dict):
                continue
            for sub, sub_value in value.items():
                where = f"flags.{key}.{sub}"
                if check.one_of(where, sub, accepted["compilation_config_keys"],
                                "a compilation-config key") and sub == "cudagraph_mode":
                    check.one_of(where, str(sub_value).upper(), accepted["cudagraph_modes"],
                                 "a cudagraph_mode")


class EmbeddedAdapter(VLLMAdapter):
    """`python -m specrepro.embedded.serve --model DIR …`: it mirrors `vllm serve`.

    Its flags, their closed choices, its `--speculative-config` keys, methods and drafter
    precisions are read from `specrepro.speculative`, the contract its server's parser is
    built from (docs/architecture.md, "the embedded server's command line"); it prints
    vLLM's startup lines and exposes vLLM's metric names.
    """

    kind = "embedded"
    what = "the embedded engine"
    threads_flag = "--threads"
    profiling: ClassVar[dict[str, dict]] = {"flags": {"profile-dir": "{dir}"}}

    def cpu_threads(self, profile: Profile) -> int | None:
        """The profile's `threads`, else the server's own default: 1 on the CPU device
        (serve.engine_threads), torch's on cuda (as many as it is given)."""
        for key, value in profile.flags.items():
            if flag_name(key) == "--threads" and value is not None:
                return int(value)
        device = next((v for k, v in profile.flags.items() if flag_name(k) == "--device"), "cpu")
        return 1 if device == "cpu" else None

    def render_argv(self, profile: Profile, source: str | Path | None = None) -> list[str]:
        accepted = {"flags": speculative.server_flag_names(),
                    "flag_choices": speculative.server_flag_choices()}
        check = FlagCheck(profile_file(profile, source), self.what)
        if profile.parallel.tensor_parallel_size > 1 or profile.parallel.data_parallel_size > 1:
            check.fail("parallel", "expected 1 and 1 (the embedded engine has no tensor or data "
                                   f"parallelism), found {profile.parallel.model_dump()}")
        argv = [*self.command(profile), "--model", profile.model.id]
        if profile.model.served_name:
            argv += ["--served-model-name", profile.model.served_name]
        argv += ["--host", profile.host, "--port", str(profile.port)]
        if profile.speculative is not None:
            spec = profile.speculative.model_dump(mode="json", exclude_none=True)
            for key, value in spec.items():
                if check.one_of(f"speculative.{key}", key, list(speculative.SPEC_KEYS),
                                "a --speculative-config key") and key == "method":
                    check.one_of("speculative.method", value, list(speculative.EMBEDDED_METHODS),
                                 "a method")
            if spec.get("quantization") not in speculative.DRAFTER_QUANTIZATIONS:
                valid = " or ".join("null" if q is None else repr(q)
                                    for q in speculative.DRAFTER_QUANTIZATIONS)
                check.fail("speculative.quantization", f"expected {valid}, "
                                                       f"found {spec['quantization']!r}")
            argv += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
        argv += render_flags(profile.flags, accepted, self.reserved, check)
        check.raise_if_any()
        return argv


class SGLangAdapter(EngineAdapter):
    """`python -m sglang.launch_server --model-path MODEL …`, checked against the generated
    list of the profile's engine_version (SGLang 0.5.14 or 0.5.23; 0.5.23 otherwise)."""

    kind = "sglang"
    cli = "sglang-0.5.23"
    what = "SGLang 0.5.23"
    log_facts = SGLANG_LOG  # readiness and version: ROUTES["sglang"]
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

    def render_argv(self, profile: Profile, source: str | Path | None = None) -> list[str]:
        accepted, what = self.flag_list(profile)
        check = FlagCheck(profile_file(profile, source), what)
        argv = [*self.command(profile), "--model-path", profile.model.id]
        argv += model_flags(profile, "--tp-size", "--dp-size")
        if profile.speculative is not None:
            argv += self.speculative_flags(profile, accepted, check)
        argv.append("--enable-metrics")  # off by default; /metrics needs it
        argv += render_flags(profile.flags, accepted, self.reserved, check)
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


class AttachAdapter(EngineAdapter):
    """A server someone else started (article A measured through its production proxy).

    Nothing is launched or stopped. Which engine answers decides how counters are read:
    `profile.attached_engine` where the profile schema has it, else detected from the
    routes (`/version` answers on vLLM and the embedded engine, `/server_info` on SGLang;
    a server with neither that answers `/health` or `/v1/models` is `generic`).
    """

    kind = "attach"
    PROBES = ("/version", "/server_info", "/health", "/v1/models")  # what detect() tries

    def render_argv(self, profile: Profile, source: str | Path | None = None) -> list[str]:
        return []

    def url(self, profile: Profile) -> str:
        return (profile.url or "").rstrip("/").removesuffix("/v1")

    def launch(self, profile: Profile, log_dir: str | Path | None = None,
               source: str | Path | None = None,
               placement: Placement | None = None, log_name: str | None = None,
               pid_dir: str | Path | None = None) -> EngineHandle:
        """Reach the running engine; placement is not this harness's to choose (the
        runner records why), nor its lifetime."""
        handle = EngineHandle(profile, self, self.url(profile), placement=placement)
        probe = self.detect(handle.url, getattr(profile, "attached_engine", None))
        if probe is None:
            raise EngineError(f"profile {profile.name!r}: no engine answers at {handle.url} "
                              f"(tried {', '.join(self.PROBES)})")
        if probe not in ROUTES:
            raise EngineError(f"profile {profile.name!r}: attached_engine {probe!r}: expected "
                              f"one of {sorted(ROUTES)}")
        handle.attached = probe
        routes = ROUTES[probe]
        status, route = poll_ready(handle.url, routes)
        if status != 200:
            raise EngineError(f"profile {profile.name!r}: {handle.url}{routes.ready[route]} "
                              f"answers {status or 'nothing'}, not 200; the engine is not ready")
        if probe == "generic":
            handle.warnings.append(
                f"profile {profile.name!r}: {handle.url} is an OpenAI-compatible server that is "
                "neither vLLM, SGLang nor the embedded engine (no /version or /server_info): "
                "attached as a generic engine; its requests are timed, its engine facts "
                "(version, KV pool, acceptance) are unknown")
        handle.version = read_version(handle.url, routes)
        handle.warnings += facts_warnings(handle, probe, routes)
        return handle

    @staticmethod
    def detect(url: str, declared: str | None = None) -> str | None:
        if declared is not None:
            return declared
        body = http_json(f"{url}/version")
        if isinstance(body, dict) and body.get("version") is not None:
            return "embedded" if "specrepro-embedded" in str(body.get("version")) else "vllm"
        if http_json(f"{url}/server_info") is not None:
            return "sglang"
        if any(http_get(f"{url}{r}")[0] == 200 for r in ROUTES["generic"].ready):
            return "generic"
        return None

    def metrics_engine(self, handle: EngineHandle) -> str:
        return handle.attached or "vllm"

    # Whatever answers is asked for SGLang's per-response acceptance fields, as a launched
    # SGLang is, when the profile's return_spec_details says so.
    request_extras = SGLangAdapter.request_extras


ADAPTERS: dict[str, EngineAdapter] = {
    "vllm": VLLMAdapter(), "sglang": SGLangAdapter(), "embedded": EmbeddedAdapter(),
    "attach": AttachAdapter(),
}


def adapter_for(profile: Profile) -> EngineAdapter:
    if profile.engine not in ADAPTERS:  # e.g. the in-process transformers peer (peer.py)
        raise EngineError(f"profile {profile.name!r}: engine {profile.engine!r} is not an HTTP "
                          f"server; expected one of {sorted(ADAPTERS)}")
    return ADAPTERS[profile.engine]


def render_argv(profile: Profile, source: str | Path | None = None) -> list[str]:
    return adapter_for(profile).render_argv(profile, source)


def launch(profile: Profile, log_dir: str | Path, source: str | Path | None = None,
           placement: Placement | None = None, log_name: str | None = None,
           pid_dir: str | Path | None = None) -> EngineHandle:
    """Start (or attach to) the profile's engine; use as `with launch(p, dir) as engine:`."""
    return adapter_for(profile).launch(profile, log_dir, source, placement, log_name, pid_dir)
