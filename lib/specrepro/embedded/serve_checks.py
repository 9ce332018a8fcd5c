"""What `specrepro serve` refuses before it serves: each bad flag is one line naming the flag
and its value, and exit status 2, never a traceback.

Design:
- Before the model loads (`before_load`), so that a bad flag costs no start: the address
  (`--host` must resolve to an address of this machine, `--port` must be free: the bind is
  tried, and a port already taken names its listener), `--device cuda` on a machine without
  CUDA, `--profile-dir` that cannot be made, and a `--max-model-len` past the checkpoint's
  `max_position_embeddings` (vLLM's "derived max_model_len"). The value checks that need
  no machine (`--port` in 0-65535, a byte count >= 1, a non-empty name or key) are
  argparse types in `speculative.SERVER_FLAGS`, and argparse's error is one line too
  (serve.py).
- Once the engine is built (`after_load`), what only its sizes tell: a KV pool that cannot
  hold one request of `--max-model-len` tokens (vLLM refuses the same at start: "To serve at
  least one request with the model's max seq len ..."), with the bytes that would and the
  length that fits.
- The bind is tried again when the server starts (a listener may come between); serve.py
  names that failure with `busy`.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
from pathlib import Path

log = logging.getLogger("specrepro.embedded.serve")


def before_load(args) -> str | None:
    """The first problem with the flags that can be seen before the model loads, or None."""
    return address_problem(args.host, args.port) or device_problem(args.device) \
        or profile_dir_problem(args.profile_dir) or length_problem(args.model, args.max_model_len)


def length_problem(model_dir: str, max_model_len: int) -> str | None:
    """A --max-model-len past the checkpoint's max_position_embeddings (a checkpoint that is
    missing or unreadable is the engine's to name)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
        positions = int(config["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if max_model_len > positions:
        return (f"--max-model-len {max_model_len} is longer than the model's "
                f"max_position_embeddings {positions} ({Path(model_dir) / 'config.json'}); "
                f"pass --max-model-len {positions} or less")
    return None


def after_load(engine, args) -> str | None:
    """The first problem that the built engine's sizes show, or None."""
    pool, need = int(engine.kv_pool_tokens), args.max_model_len
    if pool < need:
        per_token = int(engine.kv_bytes_per_token)
        shorter = f", or --max-model-len {pool} or less" if pool >= 2 else ""
        return (f"--kv-cache-memory-bytes {args.kv_cache_memory_bytes} holds a KV pool of "
                f"{pool:,} tokens ({per_token:,} bytes a token, drafter caches included), "
                f"less than one request of --max-model-len {need:,}: pass "
                f"--kv-cache-memory-bytes {need * per_token} or more{shorter}")
    return None


def address_problem(host: str, port: int) -> str | None:
    """Why host:port cannot be listened on, in one line naming the flag to change; None where
    it can (port 0: any free one). The bind itself is tried (as asyncio's server binds)."""
    try:
        infos = socket.getaddrinfo(host, port or None, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        why = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        return (f"--host {host}: not an address of this machine ({why}); pass an address it "
                f"has, e.g. --host 127.0.0.1 or --host 0.0.0.0")
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's server does
        try:
            s.bind(addr)
        except OSError as exc:
            return busy(host, port, exc)
    return None


def busy(host: str, port: int, exc: OSError) -> str:
    """One line for a failed bind: the address not this machine's (--host), or the port taken
    (its listener named, as far as this user can see: pid, user, command line, as `specrepro
    run` names a taken port in harness/lifecycle.py, a layer this one does not import) or
    forbidden (--port)."""
    where = f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    if exc.errno == errno.EADDRNOTAVAIL:
        return (f"{where}; --host {host} is not an address of this machine: pass one it has, "
                f"e.g. --host 127.0.0.1 or --host 0.0.0.0")
    if exc.errno == errno.EACCES:
        return f"{where}; a port below 1024 needs root: pass another --port (0: a free one)"
    try:
        import psutil

        pids = sorted({c.pid for c in psutil.net_connections(kind="tcp")
                       if c.pid and c.laddr and c.laddr.port == port
                       and c.status == psutil.CONN_LISTEN})
        for pid in pids:
            proc = psutil.Process(pid)
            cmd = " ".join(proc.cmdline())
            where += (f"; pid {pid} (user {proc.username()}) listens there: "
                      f"`{cmd[:160] + ('...' if len(cmd) > 160 else '')}`")
    except Exception as err:  # noqa: BLE001 - naming the listener is a courtesy, not a failure
        log.debug("could not name the listener on port %d: %s", port, err)
    return " ".join(f"{where}; stop it or pass another --port".split())


def device_problem(device: str) -> str | None:
    """--device cuda where torch sees no CUDA device: say what torch has."""
    if device != "cuda":
        return None
    import torch

    if torch.cuda.is_available():
        return None
    build = (f"torch {torch.__version__} is built without CUDA" if torch.version.cuda is None
             else f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no CUDA device")
    return f"--device cuda: {build}; pass --device cpu"


def profile_dir_problem(profile_dir: str | None) -> str | None:
    if not profile_dir:
        return None
    try:
        os.makedirs(profile_dir, exist_ok=True)
    except OSError as exc:
        return f"--profile-dir {profile_dir}: cannot make it: {exc.strerror or exc}"
    if not os.access(profile_dir, os.W_OK):
        return f"--profile-dir {profile_dir}: not writable by this user"
    return None
