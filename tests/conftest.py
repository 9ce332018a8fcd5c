"""Shared fixtures: a tiny complete checkpoint and the embedded server, as a process or in-process.

- `tiny_checkpoint` (session): a randomly initialised, complete checkpoint (target, tokenizer,
  drafters mtp / dflash / draft_model) built by `checkpoint.build_random_checkpoint`.
- `embedded_server` (session): `python -m specrepro.embedded.serve` on a free 127.0.0.1 port,
  serving the tiny checkpoint with n-gram drafts at 3 tokens and per-request spec metrics.
  It yields the base URL (a `str`, with `.process` and `.log_path` attached); the model is
  served as `embedded-tiny` and also logs to `<log dir>/embedded_server.log` (`--log-file`).
- `start_embedded_server(*flags)` (function scope): the same with other flags; stopped at the
  end of the test.
- `inprocess_server(**engine_config)` (function scope): the aiohttp app and the engine in this
  process (a server thread), so a test can reach into the engine: free slots, fault injection;
  `server_kw` goes to `Server` (model_name, model_path, api_key; the names default to "tiny").
- `one_torch_thread` (module): torch on one CPU thread for a module's tests and the fixtures
  they share (engine tests: microsecond kernels, threads only contend on a shared box; a
  module fixture that trains a drafter took 16-52 s on two threads beside other work, 5 s on
  one); modules opt in with `pytestmark`, which sets it up before their other module fixtures.
- `random_prompts(n, seed)` (a function; `from conftest import random_prompts`): token-id
  prompts of 4-13 tokens, every other one repeating its first three tokens (n-gram hits).
- `load_script(name)` (a function, likewise): a module of `scripts/` by file name, for the
  benchmark scripts' end-to-end tests (scripts/ is no package).
- Order: the files that hold a `slow` test are collected first (`pytest_collection_modifyitems`).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest


def pytest_collection_modifyitems(config, items):
    """Test files that hold a `slow` test run first, each file's tests still together (its
    module fixtures are built once): under `make test`'s pytest-xdist workers (a file per
    worker at a time, in this order) the longest file starts at once beside the rest rather
    than last, alone (the notebooks' module fixture is a quarter of the suite)."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


READY = re.compile(r"Starting specrepro embedded server on (http://\S+)")
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str):
    """scripts/<name>.py as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def one_torch_thread():
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)  # microsecond kernels: threads only contend on a shared box
    yield
    torch.set_num_threads(n)


def random_prompts(n: int, seed: int) -> list[list[int]]:
    """n prompts of token ids in [3, 500), 4-13 tokens; odd ones repeat their first three
    tokens, so n-gram lookup finds matches."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = torch.randint(3, 500, (int(torch.randint(4, 14, (1,), generator=g)),),
                          generator=g).tolist()
        out.append(p + p[:3] if i % 2 else p)
    return out


def store_cell_id(n: int) -> str:
    """A constructed store's cell id: arm 'a' at concurrency n (the store tests' cells)."""
    from specrepro.identity import digest

    return digest(arm={"name": "a"}, concurrency=n, seed=0)


def store_requests(n: int) -> list[dict]:
    """n request rows of two tokens each, as a constructed store's cell holds them."""
    return [{"request_idx": i, "prompt_id": f"p{i}", "ttft_s": 0.1, "completion_tokens": 2,
             "chunk_gap_us": [100_000, 10_000], "chunk_tokens": [1, 1], "token_ids": [1, 2]}
            for i in range(n)]


def self_distilled(ckpt: Path, name: str, cfg, batch_kwargs=lambda g: {}, steps: int = 60):
    """Drafter `name` of DrafterConfig `cfg`, trained `steps` steps on the tiny target's own
    greedy continuations (16 random 4-token starts + 28 tokens, labels the target's argmax)
    so that its drafts get accepted, and saved into checkpoint `ckpt` beside the others.
    `batch_kwargs(generator)` gives the extra `training_loss` arguments of each step (a block
    drafter's anchors and block lengths)."""
    import torch

    from specrepro.embedded.checkpoint import load_target, save_drafters
    from specrepro.embedded.config import EngineConfig
    from specrepro.embedded.engine import LLMEngine
    from specrepro.embedded.proposers import build_proposer
    from specrepro.embedded.sampling import SamplingParams

    target, tok = load_target(ckpt)
    torch.manual_seed(0)
    prop = build_proposer(cfg, target).train()
    g = torch.Generator().manual_seed(0)
    eng = LLMEngine(EngineConfig(model_dir=str(ckpt), max_num_seqs=8, max_model_len=64))
    starts = [p[:4] for p in random_prompts(16, seed=5)]
    outs = eng.generate(starts, SamplingParams(temperature=0.0), 28, ignore_eos=True)
    seqs = torch.tensor([s + o for s, o in zip(starts, outs)])  # [16, 32]
    target.requires_grad_(False)
    opt = torch.optim.AdamW(prop.parameters(), lr=3e-3)
    for _ in range(steps):
        with torch.no_grad():
            out = target(seqs, hidden_layers=prop.target_layers)
        labels = out.logits.argmax(-1)
        labels[:, :4] = -100  # the random starts are no target output
        loss, _ = prop.training_loss(seqs, labels, out.hidden, **batch_kwargs(g))
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_drafters(ckpt, target, tok, {name: prop.eval()}, add=True)
    return ckpt


def decode_program_without_host_reads(eng, k: int, monkeypatch) -> dict:
    """Run an engine's static decode program (graphs.py) at batch bucket 4 with every host
    read of a tensor forbidden (a CUDA graph cannot hold one); returns its outputs."""
    import torch

    def forbid(name):
        def raiser(*a, **kw):
            raise AssertionError(f"Tensor.{name} inside the decode program")
        return raiser
    for name in ("item", "tolist", "__int__", "__float__", "__bool__", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, forbid(name))
    host = torch.tensor([[0, 1, eng.scratch_slot, eng.scratch_slot], [12, 9, 1, 1],
                         [5, 6, 0, 0]])
    try:
        with torch.inference_mode():
            return eng.decode_step.program(host, k)
    finally:
        monkeypatch.undo()

@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    from specrepro.embedded.checkpoint import build_random_checkpoint

    return build_random_checkpoint(tmp_path_factory.mktemp("tiny_checkpoint"), seed=0)


class ServerURL(str):
    """A server's base URL, with its process and log file."""

    process: subprocess.Popen
    log_path: Path


def launch_server(model_dir: Path, log_dir: Path, *flags: str,
                  timeout: float = 180.0) -> ServerURL:
    """Start the server as a process on a free port; return once it listens."""
    log_path = log_dir / f"serve-{time.monotonic_ns()}.log"
    cmd = [sys.executable, "-m", "specrepro.embedded.serve", "--model", str(model_dir),
           "--port", "0", *flags]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = READY.search(log_path.read_text(errors="replace"))
        if m:
            url = ServerURL(m.group(1))
            url.process, url.log_path = proc, log_path
            return url
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
        time.sleep(0.1)
    stop_server(proc)
    raise TimeoutError(f"server not ready after {timeout} s:\n{log_path.read_text()}")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# n-gram lookup needs no weights, and a random model's repetitive output gives it acceptances
SERVER_FLAGS = ("--served-model-name", "embedded-tiny", "--max-num-seqs", "8",
                "--max-model-len", "512",
                "--speculative-config", ('{"method": "ngram", "num_speculative_tokens": 3, '
                                         '"prompt_lookup_min": 1, "prompt_lookup_max": 3}'),
                "--per-request-spec-decode-metrics", "summary")


@pytest.fixture(scope="session")
def embedded_server(tiny_checkpoint, tmp_path_factory):
    logs = tmp_path_factory.mktemp("serve_logs")
    url = launch_server(tiny_checkpoint, logs, *SERVER_FLAGS, "--log-file",
                        str(logs / "embedded_server.log"))
    yield url
    stop_server(url.process)


@pytest.fixture
def start_embedded_server(tiny_checkpoint, tmp_path):
    started = []

    def start(*flags: str) -> ServerURL:
        url = launch_server(tiny_checkpoint, tmp_path, *flags)
        started.append(url)
        return url

    yield start
    for url in started:
        stop_server(url.process)


class ThreadedApp:
    """An aiohttp app served on 127.0.0.1 (a free port) from an event loop on a thread of
    this process: `url` once started, `close()` to stop. A subclass builds the app
    (`make_app`, run on that loop) and may release more in `cleanup`."""

    RUNNER_KW: ClassVar[dict] = {}

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(60)

    async def make_app(self):
        raise NotImplementedError

    async def _start(self) -> str:
        from aiohttp import web

        self.runner = web.AppRunner(await self.make_app(), **self.RUNNER_KW)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def cleanup(self) -> None:
        await self.runner.cleanup()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.cleanup(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class InProcessServer(ThreadedApp):
    """The server's aiohttp app on a thread of this process, over an engine built here."""

    RUNNER_KW: ClassVar[dict] = {"handler_cancellation": True}

    def __init__(self, engine, model_name: str = "tiny", model_path: str = "tiny", **server_kw):
        from specrepro.embedded.api_server import Server

        self.engine = engine
        self.server = Server(engine, model_name, model_path, engine.config.max_model_len,
                             **server_kw)
        super().__init__()

    async def make_app(self):
        return self.server.app()


@pytest.fixture
def inprocess_server(tiny_checkpoint):
    made = []

    def make(spec_tokens: int | None = None, server_kw: dict | None = None,
             **config) -> InProcessServer:
        from specrepro.embedded.config import EngineConfig
        from specrepro.embedded.engine import LLMEngine

        config = {"max_num_seqs": 4, "max_model_len": 512, **config}
        engine = LLMEngine(EngineConfig(model_dir=str(tiny_checkpoint), **config))
        srv = InProcessServer(engine, spec_tokens=spec_tokens, **(server_kw or {}))
        made.append(srv)
        return srv

    yield make
    for srv in made:
        srv.close()


@pytest.fixture(scope="session")
def engine_exports() -> Path:
    """The git-ignored folders the GPU suites' profiles serve (build/engine-drafters,
    build/nvfp4-target), written into the project root from models/embedded where missing,
    as `make all` writes them: the committed H200 stores' cells and engine records are keyed
    by their fingerprints, so a fresh clone must have them before it reads those stores."""
    from specrepro.tools.export import drafters, nvfp4

    root = Path(__file__).resolve().parents[1]
    build = root / "build"
    build.mkdir(exist_ok=True)
    exports = (("engine-drafters", "vllm/dflash",
                lambda out: drafters.main(["--engine", "all", "--out", out])),
               ("nvfp4-target", "", lambda out: nvfp4.main(["--out", out])))
    # make test's pytest-xdist workers share the project root: one exports while the others
    # wait on the lock, and a folder appears whole (written beside, then renamed), so a
    # notebook reading the committed stores in another worker meanwhile finds it absent (it
    # matches by the fingerprints the stores recorded) or complete, never half written
    with open(build / ".engine-exports.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name, marker, export in exports:
            final = build / name
            if (final / marker).is_dir():
                continue
            if final.exists():  # an earlier export cut short: completed in place
                assert export(str(final)) == 0
                continue
            with drafters.new_folder(final) as scratch:
                assert export(str(scratch)) == 0
    return root
