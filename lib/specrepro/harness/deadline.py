"""A run that ends cleanly at a deadline (harness/runner.py's docstring says when it acts;
the archive rewritten after each cell is harness/archive.py).

Design:
- `Deadline` is a point on this process's monotonic clock, from `--deadline-s` or
  `--until`; `armed()` runs a watchdog thread that sends SIGINT to the main thread when the
  deadline passes, so the cell in flight takes Ctrl-C's own path (`ctrl_c_raises`) and is
  stored as interrupted. Off the main thread nothing is armed (signals reach only it).
- The argparse types name the flag and what was expected.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import math
import signal
import threading
import time
from dataclasses import dataclass

from specrepro.store import now

WATCH_S = 0.25  # the deadline's watchdog re-reads the deadline at least this often




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


# -------------------------------------------------------------- deadline, archive


def start_repays(remaining_s: float, start_s: list[float], cell_s: list[float],
                 cell_bound_s: float | None, cells_left: int) -> bool:
    """Whether an engine start now is worth it before the deadline: the start (the longest
    so far after the command's first, which may be the machine's cold start: 125-183 s
    against 72 s for a later start of the stand-in, docs/bench/standin-h200-2026-12-03;
    the first where it is the only one) and one cell (the longest, or the declared bound)
    must fit, and then either every cell left in the launch group fits too, or the cells
    that fit (at the mean cell time) take at least as long as the start. Otherwise the
    group would be started again by the next command, and this start would have bought
    less measuring than it cost (on the H200, 2026-12-02: a 106-s start for one 10-s cell
    before the deadline). A start that runs past the deadline is stopped by the watchdog
    like a cell, so a misjudged one costs the time left, never the command."""
    start = max(start_s[1:] or start_s, default=0.0)
    if remaining_s <= start + max([*cell_s, cell_bound_s or 0.0]):
        return False
    if not cell_s or cells_left <= 0:
        return True  # no cell measured yet to count by
    typical = sum(cell_s) / len(cell_s)
    fit = int((remaining_s - start) // typical)
    return fit >= cells_left or fit * typical >= start


@dataclass
class Deadline:
    """When measuring must stop, on this process's monotonic clock (module docstring)."""

    at: float  # time.monotonic() seconds
    given: str  # as the user gave it, for messages: "--deadline-s 540"
    cell_bound_s: float | None = None  # a declared bound on one cell, before any has run
    fired: bool = False  # the watchdog interrupted a cell or an engine start

    @classmethod
    def after(cls, seconds: float, cell_bound_s: float | None = None) -> Deadline:
        return cls(time.monotonic() + seconds, f"--deadline-s {seconds:g}", cell_bound_s)

    @classmethod
    def until(cls, when: dt.datetime, cell_bound_s: float | None = None) -> Deadline:
        left = (when - now()).total_seconds()
        return cls(time.monotonic() + left, f"--until {when.isoformat()}", cell_bound_s)

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def record(self) -> dict:  # the manifest's: the wall-clock time it stands for
        at = now() + dt.timedelta(seconds=self.remaining())
        return {"at": at.isoformat(), "given": self.given, "cell_bound_s": self.cell_bound_s}

    @contextlib.contextmanager
    def armed(self):
        """While inside, the deadline passing acts as Ctrl-C: SIGINT to the main thread.
        The watchdog re-reads `at` every WATCH_S and fires under a lock that leaving the
        block takes too, so it never fires once the block is left. Off the main thread
        nothing is armed (signals reach only the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        main, left, lock = threading.main_thread().ident, threading.Event(), threading.Lock()

        def watch() -> None:
            while not left.wait(min(max(self.remaining(), 0.0), WATCH_S)):
                if self.remaining() <= 0:
                    with lock:
                        if not left.is_set():
                            self.fired = True
                            signal.pthread_kill(main, signal.SIGINT)
                    return

        watchdog = threading.Thread(target=watch, name="specrepro-deadline", daemon=True)
        watchdog.start()
        try:
            yield
        finally:
            with lock:  # a SIGINT sent before this returns is raised here, inside the block
                left.set()
            watchdog.join()


def seconds_arg(text: str) -> float:
    """argparse type: a positive, finite number of seconds (argparse names the flag)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, found {text!r}")
    return value


def zoned_time_arg(text: str) -> dt.datetime:
    """argparse type: an ISO 8601 time with its zone (a bare one would be ambiguous)."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time with its zone, such as 2026-12-01T18:30:00Z or "
            f"2026-12-01T19:30:00+01:00, found {text!r}")
    return when


def deadline_of(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Deadline | None:
    """The run's deadline from --deadline-s / --until (and --cell-bound-s), or None."""
    if args.deadline_s is not None:
        return Deadline.after(args.deadline_s, args.cell_bound_s)
    if args.until is not None:
        deadline = Deadline.until(args.until, args.cell_bound_s)
        if deadline.remaining() <= 0:
            ap.error(f"argument --until: expected a time still to come, found {args.until:%FT%T%z}"
                     f" ({-deadline.remaining():.0f} s ago)")
        return deadline
    if args.cell_bound_s is not None:
        ap.error("argument --cell-bound-s: expected it with --deadline-s or --until (it bounds "
                 "a cell against the deadline), found it alone")
    return None
