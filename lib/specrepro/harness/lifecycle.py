"""Engines die with their run: stop signals, the engine's watchdog, pid files, stale engines.

Design:
- Signals (`stop_signals`): for a run's duration SIGTERM and SIGHUP take Ctrl-C's path: the
  handler notes the signal and calls the SIGINT handler in force (`deadline.ctrl_c_raises`
  makes it Python's, or asyncio's while the load generator runs), so the cell in flight is
  stored as interrupted, the engine stopped, the store merged, exactly as after Ctrl-C;
  `received()` names the signal for the messages and the exit status (128 + its number).
  In the teardown (`shielded`: the engines stopped, the store being merged) a stop signal
  is noted and nothing more, so that the session ends whole.
  A signal the host ignores (SIG_IGN: `nohup`) stays ignored. A SIGHUP from a closed
  terminal leaves stdout/stderr on a hung-up tty whose writes fail (EIO), which would
  break the teardown: those are pointed at /dev/null first (a `kill -HUP` with the
  terminal still there keeps them, and the message is printed).
- Every launched engine runs in its own process group (engines/base.py starts it with
  `start_new_session=True`) and gets a watchdog (`guard`: engine_watchdog.py, a child of the
  run in a session of its own) that stops the group when the run dies, SIGKILL included. A
  `Guard` is released by `EngineHandle.stop()` once the group is gone: the watchdog ended,
  the pid file removed.
- Pid files: `<results_dir>/.engines/<port>.json` (`engines_dir`), one per launched engine:
  its pid (= pgid), argv, start time, log, and the run that owns it (pid, start time,
  command line). Beside the stores, not in one: a launch group may start from another
  study's store on a re-run, and the archive packs stores only; the folder ignores itself
  in git. The engine's environment carries the pid file's path (`MARK`), inherited by its
  children, which is how its processes are told from a process that reuses a pid.
- Before a launch (`clear_port`): a pid file for the port whose engine still runs while
  its run has exited is a stale engine of this results dir: its processes are stopped
  (SIGTERM, grace, SIGKILL) and a line says so. One whose run is still alive is in use:
  the launch fails saying by which run. A port taken otherwise is described: the listening
  process's pid, command line, owner, start time and parent (psutil), and, for a specrepro
  engine of another results dir, its pid file, its run, and the command that stops it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from specrepro.harness import engine_handle as handles
from specrepro.harness import engine_http

MARK = "SPECREPRO_ENGINE_PIDFILE"  # in an engine's environment: its pid file's path
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
PORT_FREE_S = 10.0  # after a stale engine is stopped, how long its port may take to close

# ----------------------------------------------------------------------------- signals

_received: list[int] = []  # the stop signals of the current run, in order
_TTYS: dict[int, bool] = {}  # stdout and stderr: whether each was a terminal at the start
_SHIELD: list[bool] = [False]  # in the teardown: note a stop signal, raise nothing


def received() -> str | None:
    """The name of the first stop signal of the current run (SIGTERM, SIGHUP), or None."""
    return signal.Signals(_received[0]).name if _received else None


def exit_status(name: str | None) -> int:
    """An interrupted run's exit status: 128 + the stop signal's number (143 SIGTERM, 129
    SIGHUP), 130 (SIGINT) after Ctrl-C or a deadline's SIGINT."""
    return 128 + int(signal.Signals[name] if name else signal.SIGINT)


def _hung_up(fds: dict[int, bool]) -> None:
    """Point the standard fds that were a terminal and no longer are (hung up) at
    /dev/null, so that the teardown's writes do not fail."""
    null = None
    for fd, was_tty in fds.items():
        if was_tty and not os.isatty(fd):
            null = null if null is not None else os.open(os.devnull, os.O_WRONLY)
            with contextlib.suppress(OSError):
                os.dup2(null, fd)
    if null is not None:
        os.close(null)


def _as_ctrl_c(signum: int, frame: Any) -> None:
    _received.append(signum)
    if signum == signal.SIGHUP:
        _hung_up(_TTYS)
    if _SHIELD[0]:
        return
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):  # Python's (raises KeyboardInterrupt) or asyncio's (cancels)
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP act as Ctrl-C inside the block (module docstring); only the main
    thread may set handlers, elsewhere nothing changes."""
    _received.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _TTYS.update({fd: _isatty(fd) for fd in (1, 2)})
    previous = {}
    for sig in STOP_SIGNALS:
        before = signal.getsignal(sig)
        if before is signal.SIG_IGN:  # nohup, or a host that means it
            continue
        previous[sig] = before
        signal.signal(sig, _as_ctrl_c)
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Inside, SIGTERM and SIGHUP are noted and raise nothing (the run's teardown)."""
    before, _SHIELD[0] = _SHIELD[0], True
    try:
        yield
    finally:
        _SHIELD[0] = before


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


# ---------------------------------------------------------------------------- pid files


def engines_dir(results_dir: Path | str) -> Path:
    """Where a results dir keeps its running engines' pid files."""
    return Path(results_dir) / ".engines"


def pid_path(pid_dir: Path | str, port: int) -> Path:
    return Path(pid_dir) / f"{port}.json"


def _create_time(pid: int) -> float | None:
    try:
        return round(psutil.Process(pid).create_time(), 2)
    except (psutil.Error, OSError):
        return None


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    ignore = path.parent / ".gitignore"
    if not ignore.exists():  # pid files are this machine's, never a commit's
        ignore.write_text("*\n")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def read_record(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass
class Guard:
    """What keeps a launched engine from outliving its run: its pid file and watchdog."""

    pidfile: Path | None
    pid: int
    watchdog: subprocess.Popen | None = None

    def release(self) -> None:
        """After the group is stopped: end the watchdog (SIGTERM from its live run ends it),
        remove the pid file if it is still this engine's."""
        if self.watchdog is not None:
            with contextlib.suppress(OSError):
                self.watchdog.terminate()
            try:
                self.watchdog.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.watchdog.kill()
                self.watchdog.wait()
        if self.pidfile is not None:
            record = read_record(self.pidfile)
            if record is not None and record.get("pid") == self.pid:
                with contextlib.suppress(OSError):
                    self.pidfile.unlink()


def marker_env(pid_dir: Path | str, port: int) -> dict[str, str]:
    """The environment entry that marks an engine's processes as this pid file's."""
    return {MARK: str(pid_path(pid_dir, port).resolve())}


def guard(handle: handles.EngineHandle, pid_dir: Path | str) -> Guard:
    """Write a launched engine's pid file and start its watchdog (module docstring)."""
    popen, argv, log_path = handle.process, handle.argv, handle.log_path
    host, port = handle.profile.host, handle.profile.port
    path = pid_path(pid_dir, port).resolve()
    me = psutil.Process()
    record = {"pid": popen.pid, "pgid": popen.pid, "host": host, "port": port, "argv": argv,
              "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
              "create_time": _create_time(popen.pid), "log": str(log_path) if log_path else None,
              "owner": {"pid": me.pid, "create_time": round(me.create_time(), 2),
                        "argv": me.cmdline()}}
    held = Guard(path, popen.pid)
    _write_json(path, record)
    # Its own session: neither the terminal (Ctrl-C, SIGHUP) nor a signal to the run's job
    # (`kill -9 %1`) reaches it, so it outlives whatever kills the run.
    held.watchdog = subprocess.Popen(
        [sys.executable, "-m", "specrepro.harness.engine_watchdog", "--owner", str(me.pid),
         "--group", str(popen.pid), "--grace", str(handles.STOP_GRACE_S), "--pidfile",
         str(path)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    _write_json(path, {**record, "watchdog_pid": held.watchdog.pid})
    return held


# ------------------------------------------------------------------------ stale engines


def _marked(pidfile: Path) -> list[psutil.Process]:
    """The live processes whose environment names this pid file (an engine and its
    children)."""
    want, found = str(pidfile.resolve()), []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(MARK) == want:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def _owner_alive(record: dict) -> bool:
    owner = record.get("owner") or {}
    pid = owner.get("pid")
    if not isinstance(pid, int) or _create_time(pid) != owner.get("create_time"):
        return False
    if pid == os.getpid():  # this process: alive, but is the engine one of its handles?
        return any(h.process is not None and h.process.pid == record.get("pid")
                   for h in handles.live_handles())
    return True


def describe(pid: int) -> str:
    """A process as a user can find it: pid, command line, user, start, parent."""
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            cmd = " ".join(p.cmdline()) or p.name()
            started = dt.datetime.fromtimestamp(p.create_time()).strftime("%Y-%m-%d %H:%M:%S")
            return (f"pid {pid} `{_short(cmd)}` (user {p.username()}, started {started}, "
                    f"parent pid {p.ppid()})")
    except (psutil.Error, OSError):
        return f"pid {pid} (gone, or not readable by this user)"


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _stop(procs: list[psutil.Process], grace_s: float) -> list[psutil.Process]:
    """SIGTERM, up to grace_s, SIGKILL: the processes still alive after it (none, mostly)."""
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _gone, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    return psutil.wait_procs(alive, timeout=5)[1]


def listeners(port: int) -> list[int]:
    """The pids listening on the TCP port that this user can see (others' are None)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return []
    return sorted({c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr
                   and c.laddr.port == port and c.pid is not None})


def _wait_port_free(host: str, port: int, timeout_s: float = PORT_FREE_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while engine_http.port_open(host, port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _stale(path: Path, say) -> str | None:
    """Stop the stale engine the pid file names (its run has exited); a message where the
    engine is in use by a live run, or would not stop."""
    record = read_record(path)
    if record is None:  # none, or a torn one (nothing else is known of its engine)
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    procs = _marked(path)
    if not procs:  # the engine is gone (its watchdog, or a reboot): the file is left over
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    owner = record.get("owner") or {}
    what = f"pid {record.get('pid')} `{_short(' '.join(record.get('argv') or []))}`"
    if _owner_alive(record):
        return (f"a specrepro engine of this results dir ({what}) listens there for a run "
                f"still going: {describe(owner.get('pid'))}; wait for it, stop it, or give "
                f"this profile another port (pid file {path})")
    left = _stop(procs, handles.STOP_GRACE_S)
    if left:
        return (f"a stale specrepro engine of this results dir ({what}, left by run pid "
                f"{owner.get('pid')}, which has exited) would not stop: "
                f"{', '.join(describe(p.pid) for p in left)}; pid file {path}")
    with contextlib.suppress(OSError):
        path.unlink()
    _wait_port_free(record.get("host") or "127.0.0.1", record.get("port") or 0)
    say(f"stopped a stale engine of this results dir on {record.get('host')}:"
        f"{record.get('port')}: {what}, started {record.get('started_at')} by run pid "
        f"{owner.get('pid')} (`{_short(' '.join(owner.get('argv') or []), 120)}`), which has "
        f"exited; pid file {path}")
    return None


def clear_port(host: str, port: int, pid_dir: Path | str | None, say=None) -> str | None:
    """Before a launch on host:port: stop a stale engine of this results dir (saying
    so, through `say`: stderr by default); None where the port is then free, else what
    holds it, as the end of an error message."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    if pid_dir is not None:
        problem = _stale(pid_path(pid_dir, port), say)
        if problem:
            return problem
    if engine_http.port_open(host, port):
        return f"something already listens on {host}:{port}: {holder(port, pid_dir)}"
    return None


def holder(port: int, pid_dir: Path | str | None = None) -> str:
    """Who listens on the port, as exactly as this user can see, and what to do about it."""
    mine = str(pid_path(pid_dir, port).resolve()) if pid_dir is not None else None
    pids = listeners(port)
    if not pids:
        return ("a process this user cannot see (another user's, or another network "
                f"namespace's: `ss -ltnp` or `sudo lsof -i :{port}` names it); stop it or "
                "change the port")
    parts, ours = [], []
    for pid in pids:
        try:
            env, pgid = psutil.Process(pid).environ(), os.getpgid(pid)
        except (psutil.Error, OSError):
            env, pgid = {}, None
        if MARK not in env:
            parts.append(describe(pid))
            continue
        # launched by specrepro: for another results dir, or for this one with its pid file
        # gone (its run killed before it wrote it); this one's with a pid file is _stale's
        record = read_record(Path(env[MARK])) or {}
        owner = (record.get("owner") or {}).get("pid")
        run = ("for a run still going, " + describe(owner) if record and _owner_alive(record)
               else f"left by run pid {owner}, which has exited" if owner
               else "its pid file missing")
        where = "this results dir" if env[MARK] == mine else "another results dir"
        parts.append(f"a specrepro engine of {where} (pid file {env[MARK]}), {run}: "
                     f"{describe(pid)}")
        ours.append(f"`kill -TERM -- -{pgid}`")
    todo = (f"{' or '.join(ours)} stops it and its children, or change the port" if ours
            else "stop it or change the port")
    return f"{'; '.join(parts)}; {todo}"
