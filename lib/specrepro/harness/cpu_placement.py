"""Where a launched engine and the harness's load generator run: disjoint CPU sets, or why not.

Design:
- CPU placement (`plan_placement`, the study's `placement: auto | none`): on a small machine
  the load generator and the engine share cores and slow each other (measured on the 2-core
  box: a busy loop on the client's core cut the engine's single-stream tok/s from 124.6 to
  84.7). With `auto` and two CPUs or more in this process's affinity mask, a launched engine
  gets the last N CPUs of the mask, N its CPU threads (the adapter's `cpu_threads`: the
  embedded server's `--threads`, else 1 on its CPU device; else all but one CPU), and the
  harness process (the load generator, the power sampler) the others. The engine inherits
  its set at fork: the launching thread takes the engine's set around `Popen` and then
  returns to its own (`thread_affinity`), so every thread the engine starts has it; no
  `preexec_fn`, which is unsafe in a process with threads (a notebook kernel has several).
  The harness then pins each of its own threads (`pin_process`) and undoes it after the
  arm (`restore`). An attached engine, the in-process peer, one CPU, or a platform without
  `os.sched_setaffinity` is not pinned, and the note says why. `Placement.record()` is what
  the manifest keeps under `placement`.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Placement:
    """Where a launched engine and the harness's load generator run, or why not apart.
    `threads`: the engine's CPU threads, the size of its set, where it is pinned."""

    engine_cpus: tuple[int, ...]
    client_cpus: tuple[int, ...]
    pinned: bool
    note: str
    threads: int | None = None

    def record(self) -> dict[str, Any]:
        """The manifest's `placement` (the report summary reads exactly these keys)."""
        return {"engine_cpus": list(self.engine_cpus), "client_cpus": list(self.client_cpus),
                "pinned": self.pinned, "note": self.note}


def allowed_cpus() -> tuple[int, ...] | None:
    """The CPUs in this thread's affinity mask; None where the platform has no affinity call."""
    if not (hasattr(os, "sched_getaffinity") and hasattr(os, "sched_setaffinity")):
        return None
    return tuple(sorted(os.sched_getaffinity(0)))


def plan_placement(policy: str, cpus: tuple[int, ...] | None, engine_threads: int | None,
                   why_not: str | None = None) -> Placement:
    """Disjoint CPU sets for a launched engine and the harness (module docstring).
    policy: the study's `placement` ("auto" | "none"); cpus: allowed_cpus() before any
    pinning; engine_threads: the engine's CPU threads (None: as many as it gets); why_not:
    the reason this engine cannot be pinned (attached, in-process), if any."""
    shared = tuple(cpus or ())
    if policy == "none":
        return Placement(shared, shared, False, f"placement 'none' (the study's setting): the "
                         f"engine and the load generator share CPUs {list(shared)}")
    if why_not:
        return Placement(shared, shared, False, why_not)
    if cpus is None:
        return Placement((), (), False, "no CPU affinity on this platform (os.sched_setaffinity "
                         "is Linux's): the engine and the load generator share the CPUs")
    if len(cpus) < 2:
        return Placement(shared, shared, False, f"one CPU ({list(cpus)}) in this process's "
                         "affinity mask: the engine and the load generator share it")
    n = len(cpus) - 1 if engine_threads is None else engine_threads
    capped = ""
    if n > len(cpus) - 1:
        capped = (f"; its {n} threads exceed the {len(cpus) - 1} CPUs left beside the load "
                  "generator")
        n = len(cpus) - 1
    engine, client = cpus[-n:], cpus[:-n]
    return Placement(engine, client, True,
                     f"engine on CPUs {list(engine)} ({n} thread{'s' if n > 1 else ''}), load "
                     f"generator and harness on CPUs {list(client)}{capped}",
                     threads=None if capped else n)


@contextlib.contextmanager
def thread_affinity(cpus: tuple[int, ...] | None):
    """This thread on cpus for the block (None: unchanged); a process it starts inherits them."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _thread_ids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: the calling thread only
        return [0]


def pin_process(cpus: tuple[int, ...]) -> dict[int, set[int]]:
    """Every thread of this process onto cpus; returns each one's previous mask (restore)."""
    saved = {}
    for tid in _thread_ids():
        try:
            saved[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cpus)
        except OSError:  # the thread ended meanwhile
            saved.pop(tid, None)
    return saved


def restore(saved: dict[int, set[int]], default: tuple[int, ...] | None = None) -> None:
    """Undo pin_process: each thread back to its mask; threads started meanwhile (they
    inherited the pinned set) to `default`, the process's mask before pinning."""
    for tid in set(_thread_ids()) | set(saved):
        mask = saved.get(tid, default)
        if mask:
            try:
                os.sched_setaffinity(tid, mask)
            except OSError:
                pass
