"""`specrepro serve` / `python -m specrepro.embedded.serve`: the embedded engine's
OpenAI-compatible server started from its command line, speaking vLLM's API, metrics and
log lines.

Design:
- Three modules, one per concept: this one is the command line and the start-up (flags,
  logging, the engine built from the flags, the start-up lines a harness parses, the
  listening socket, SIGINT/SIGTERM); api_server.py the HTTP routes; engine_loop.py the
  engine thread and its output processing.
- The command line mirrors `vllm serve` (docs/architecture.md); its flags are data
  (`speculative.SERVER_FLAGS`). `--port 0` binds a free port, which the start-up log line
  names; a port already taken is one line naming its listener, exit 2, checked before the
  model loads and again at the bind.
- Start-up order: the port, the engine (a bad flag or checkpoint: one line, exit 2), vLLM's
  memory and KV-cache lines, with `--compile` a warm-up so that no client's timed window
  compiles, then the server; "Starting specrepro embedded server on http://HOST:PORT"
  once it listens (where vLLM prints "Starting vLLM server on").
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import signal
import sys

from aiohttp import web

from specrepro.embedded.api_server import VERSION, Server
from specrepro.speculative import add_server_flags, spec_config_epilog

# named, not __name__: run as `python -m`, this module is __main__
log = logging.getLogger("specrepro.embedded.serve")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specrepro serve", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The embedded engine's OpenAI-compatible server (/v1/completions, "
                    "/v1/chat/completions, /metrics); from the repository root it serves "
                    "models/embedded with no argument.",
        epilog=spec_config_epilog())
    return add_server_flags(p)  # the flags as data: specrepro.speculative.SERVER_FLAGS


def setup_logging(log_file: str | None) -> None:
    """vLLM's log format, to stderr and to --log-file."""
    fmt = logging.Formatter("%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s",
                            datefmt="%m-%d %H:%M:%S")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    root = logging.getLogger()
    for h in handlers:
        h.setFormatter(fmt)
        root.addHandler(h)
    root.setLevel(logging.INFO)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


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
    try:
        await stop.wait()
    finally:
        log.info("Shutting down")
        await runner.cleanup()


def port_taken(host: str, port: int) -> str | None:
    """Why host:port cannot be listened on, in one line naming the listener where this user
    can see it; None where it can (port 0: any free one). Checked before the model loads, so
    a busy port costs no start; the bind itself is checked too (a listener may come between)."""
    if port == 0:
        return None
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's server does
        try:
            s.bind((host, port))
        except OSError as exc:
            return _busy(host, port, exc)
    return None


def _busy(host: str, port: int, exc: OSError) -> str:
    """One line: the bind's error and who listens there (pid, user, command line) as far as
    this user can see, as `specrepro run` names a taken port (harness/lifecycle.py, a layer
    this one does not import)."""
    why = f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    try:
        import psutil

        pids = sorted({c.pid for c in psutil.net_connections(kind="tcp")
                       if c.pid and c.laddr and c.laddr.port == port
                       and c.status == psutil.CONN_LISTEN})
        for pid in pids:
            proc = psutil.Process(pid)
            cmd = " ".join(proc.cmdline())
            why += (f"; pid {pid} (user {proc.username()}) listens there: "
                    f"`{cmd[:160] + ('...' if len(cmd) > 160 else '')}`")
    except Exception as err:  # noqa: BLE001 - naming the listener is a courtesy, not a failure
        log.debug("could not name the listener on port %d: %s", port, err)
    return " ".join(f"{why}; stop it or pass another --port".split())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_file)
    if problem := port_taken(args.host, args.port):
        log.error("%s", problem)
        return 2
    log.info("specrepro embedded engine %s, args: %s", VERSION, vars(args))
    try:
        engine = build_engine(args)
    except (ValueError, FileNotFoundError) as exc:  # a bad flag or checkpoint: say which
        log.error("cannot start the engine: %s", exc)
        return 2
    log_engine(engine, args)
    if args.compile:  # compile before ready, never inside a client's timed window
        log.info("warm-up (torch.compile of every request path) took %.1f s",
                 engine.warm_up())
    spec = args.speculative_config or {}
    spec_tokens = (int(spec.get("num_speculative_tokens") or 0)
                   if args.per_request_spec_decode_metrics != "none" else None)
    if args.profile_dir:
        import os

        os.makedirs(args.profile_dir, exist_ok=True)
    server = Server(engine, args.served_model_name or args.model, args.model,
                    args.max_model_len, spec_tokens, args.default_chat_template_kwargs,
                    args.profile_dir)

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
        log.error("%s", _busy(args.host, args.port, exc))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
