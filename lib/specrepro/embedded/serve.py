"""`specrepro serve` / `python -m specrepro.embedded.serve`: the embedded engine's
OpenAI-compatible server started from its command line, speaking vLLM's API, metrics and
log lines.

Design:
- Four modules, one per concept: this one is the command line and the start-up (flags,
  logging, the engine built from the flags, the start-up lines a harness parses, the
  listening socket, SIGINT/SIGTERM); serve_checks.py what start-up refuses; api_server.py
  the HTTP routes; engine_loop.py the engine thread and its output processing.
- The command line mirrors `vllm serve` (docs/architecture.md); its flags are data
  (`speculative.SERVER_FLAGS`). `--port 0` binds a free port, which the start-up log line
  names. The model is served as `--served-model-name`, by default the checkpoint folder's
  name (`embedded` for models/embedded, the name the profiles send), and answers to
  `--model` as given too.
- Every bad flag is one line naming it and its value, exit 2 (serve_checks.py): argparse's
  own errors included (`OneLineParser`: its usage block would bury the line).
- Start-up order: the flags, the address, the device and the profile folder
  (`serve_checks.before_load`), the engine (a bad flag or checkpoint: one line), its sizes
  (`after_load`: a KV pool that cannot hold one request), vLLM's memory and KV-cache lines,
  with `--compile` a warm-up so that no client's timed window compiles, then the server;
  "Starting specrepro embedded server on http://HOST:PORT" once it listens (where vLLM
  prints "Starting vLLM server on"), and the line a person reads: the URL to give a client
  and the model id to send.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import signal
import sys
from pathlib import Path

from aiohttp import web

from specrepro.embedded import serve_checks
from specrepro.embedded.api_server import VERSION, Server
from specrepro.speculative import add_server_flags, spec_config_epilog

# named, not __name__: run as `python -m`, this module is __main__
log = logging.getLogger("specrepro.embedded.serve")


class OneLineParser(argparse.ArgumentParser):
    """argparse's error as one line (its usage block for two dozen flags buries it), exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the flags)\n")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="specrepro serve", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The embedded engine's OpenAI-compatible server (/v1/completions, "
                    "/v1/chat/completions, /metrics); from the repository root it serves "
                    "models/embedded with no argument.",
        epilog=spec_config_epilog())
    return add_server_flags(p)  # the flags as data: specrepro.speculative.SERVER_FLAGS


def setup_logging(log_file: str | None) -> str | None:
    """vLLM's log format, to stderr and to --log-file; a log file that cannot be opened is
    returned as the problem (and logging goes to stderr alone)."""
    fmt = logging.Formatter("%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s",
                            datefmt="%m-%d %H:%M:%S")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    problem = None
    if log_file:
        try:
            handlers.append(logging.FileHandler(log_file))
        except OSError as exc:
            problem = f"--log-file {log_file}: cannot open it: {exc.strerror or exc}"
    root = logging.getLogger()
    for h in handlers:
        h.setFormatter(fmt)
        root.addHandler(h)
    root.setLevel(logging.INFO)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    return problem


def build_engine(args):
    from specrepro.embedded.config import EngineConfig
    from specrepro.embedded.engine import LLMEngine

    return LLMEngine(EngineConfig(
        model_dir=args.model, device=args.device, dtype=args.dtype,
        quantization=args.quantization, max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len, max_num_batched_tokens=args.max_num_batched_tokens,
        batched_prefill=args.batched_prefill,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes, speculative=args.speculative_config,
        max_waiting=args.max_waiting, seed=args.seed, compile=args.compile,
        compile_scope=args.compile_scope,
        num_threads=engine_threads(args)))


def engine_threads(args) -> int | None:
    """--threads, else one thread on the CPU (measured: OpenMP waits of up to 7.8 ms per
    attention call with 2 threads on a loaded 2-core machine), else torch's default."""
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        return args.threads
    return 1 if args.device == "cpu" else None


def served_model_name(args) -> str:
    """--served-model-name, else the checkpoint folder's name: `embedded` for the default
    models/embedded, the name every embedded profile sends (the path is answered too)."""
    return args.served_model_name or Path(args.model).name or args.model


def log_engine(engine, args) -> None:
    """The start-up lines vLLM prints, so a harness parses both alike."""
    log.info("Model memory: %.4f GiB (weights and KV caches)", engine.memory_bytes() / 2**30)
    log.info("%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: "
             "%.2fx", "GPU" if args.device == "cuda" else "CPU",
             f"{int(engine.kv_pool_tokens):,}", f"{args.max_model_len:,}",
             float(engine.max_concurrency))


async def serve(server: Server, host: str, port: int, stop: asyncio.Event) -> None:
    # handler_cancellation: a client that goes away cancels its handler, which aborts the
    # request; shutdown_timeout: streams still open at SIGTERM are cut after 5 s
    runner = web.AppRunner(server.app(), handler_cancellation=True, access_log=None,
                           shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1] if port == 0 else port  # the socket site.start() bound
    # it names itself (vLLM prints "Starting vLLM server on ..." at this point)
    log.info("Starting specrepro embedded server on http://%s:%d", host, bound)
    log.info("Ready: OpenAI base URL http://%s:%d/v1, model %r%s; Ctrl-C stops it",
             host, bound, server.model_name,
             f" (or {server.model_path!r})" if server.model_path != server.model_name else "")
    try:
        await stop.wait()
    finally:
        log.info("Shutting down")
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if problem := setup_logging(args.log_file) or serve_checks.before_load(args):
        log.error("%s", problem)
        return 2
    log.info("specrepro embedded engine %s, args: %s", VERSION,
             {**vars(args), "api_key": "***" if args.api_key else None})
    try:
        engine = build_engine(args)
    except (ValueError, FileNotFoundError) as exc:  # a bad flag or checkpoint: say which
        log.error("cannot start the engine: %s", exc)
        return 2
    if problem := serve_checks.after_load(engine, args):
        log.error("%s", problem)
        return 2
    log_engine(engine, args)
    if args.compile:  # compile before ready, never inside a client's timed window
        log.info("warm-up (torch.compile of every request path) took %.1f s",
                 engine.warm_up())
    spec = args.speculative_config or {}
    spec_tokens = (int(spec.get("num_speculative_tokens") or 0)
                   if args.per_request_spec_decode_metrics != "none" else None)
    server = Server(engine, served_model_name(args), args.model, args.max_model_len,
                    spec_tokens, args.default_chat_template_kwargs, args.profile_dir,
                    args.api_key)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(server, args.host, args.port, stop)

    try:
        asyncio.run(run())
    except OSError as exc:  # the port taken after the check above: one line, not a traceback
        if exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise
        log.error("%s", serve_checks.busy(args.host, args.port, exc))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
