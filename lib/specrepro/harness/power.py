"""Board power, energy and memory while a cell runs: an NVML sampler thread.

Design:
- `PowerSampler` samples every `interval_s` (2 s by default) in a daemon thread,
  plus once at start and once at stop so a short cell still has two samples. Per sample
  it reads, summed over the GPUs it watches (a tensor-parallel engine uses several):
  board power (`nvmlDeviceGetPowerUsage`, mW) and memory used (`nvmlDeviceGetMemoryInfo`).
- Energy comes from the card's own counter (`nvmlDeviceGetTotalEnergyConsumption`, mJ since
  driver load) where every watched card has one, else from ∫ power dt (trapezoids over the
  samples); `PowerReport.energy_source` says which.
- Over the measured span (`stop(span=(a, b))`, the load's monotonic bounds: a steady
  window's opening and closing scrapes, or the first send and last end): the counter is
  read at every sample, and its value at a and b is interpolated between the readings
  around each edge, so energy and mean power cover exactly the span the tokens were
  counted over (tokens per joule). Without a span, start to stop. A steady window's edges
  fall inside steady load, where the draw is flat between two readings; the skip and the
  drain around it (up to half of a short windowed cell at 700 W against 80 W idle) no
  longer count against the window's tokens.
- Without NVML (no library, no driver, no device) the sampler is off: every GPU figure is
  None (never 0) and `note` says why ("no NVML device: power not measured"); the runner puts
  the note in the manifest.
- How busy the device was (`busy_share`, 0-1): on a GPU the mean of NVML's utilization
  (`nvmlDeviceGetUtilizationRates().gpu`: the share of the last sample period in which a
  kernel ran) over the samples, averaged over the watched GPUs; without NVML, the engine
  process tree's CPU seconds over the span's wall seconds (capped at 1: the embedded engine
  runs one torch thread on the CPU). A decode step that leaves the device mostly idle is
  measured on host overhead, and the verdicts say so (analysis/verdict/host_bound.py).
- The resident memory (RSS) of the engine's process tree is sampled too (psutil), for the
  CPU case: the embedded engine's FP8-drafter gate uses peak resident memory. Where Linux
  exposes it, the kernel's own high-water mark (`VmHWM` in /proc/<pid>/status) is used, which
  a 2-second sampler cannot miss; it is the peak since the process started.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

NO_NVML = "no NVML device: power not measured"
MIB = 2**20


@dataclass
class PowerReport:
    """What one sampling span measured; GPU fields are None where nothing was measured."""

    power_w_mean: float | None = None
    energy_j: float | None = None
    energy_source: str | None = None  # "nvml_energy_counter" | "integrated_power" | None
    peak_mem_mib: float | None = None  # GPU memory used, peak over samples
    mem_used_mib: float | None = None  # GPU memory used at the last sample
    peak_rss_mib: float | None = None  # engine process tree: kernel high-water mark or samples
    duration_s: float | None = None
    busy_share: float | None = None  # 0-1: GPU utilization, or the engine's CPU share
    busy_source: str | None = None  # "nvml_utilization" | "engine_cpu_time" | None
    n_samples: int = 0
    note: str | None = None
    devices: list[str] = field(default_factory=list)


def _nvml():
    """The initialised pynvml module and the device count, or (None, note)."""
    try:
        import pynvml
    except ImportError:
        return None, f"{NO_NVML} (nvidia-ml-py is not installed)"
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as err:
        return None, f"{NO_NVML} ({err})"
    if count == 0:
        pynvml.nvmlShutdown()
        return None, NO_NVML
    return pynvml, None


def nvml_note() -> str | None:
    """None where NVML answers with a device, else the note the manifest records."""
    nv, note = _nvml()
    if nv is not None:
        nv.nvmlShutdown()
    return note


def process_tree_rss(pid: int) -> int | None:
    """Resident bytes of a process and its children, None if it is gone."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


def process_tree_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process and its children (None if it is gone)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total, found = 0.0, False
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
        found = True
    return total if found else None


def peak_rss_hwm(pid: int) -> int | None:
    """Sum of the kernel's peak-RSS marks (VmHWM) over a process tree; None off Linux."""
    try:
        procs = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return None
    total, found = 0, False
    for p in procs:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1]) * 1024  # kB
                    found = True
        except (OSError, ValueError):
            continue
    return total if found else None


class PowerSampler:
    """Samples GPU power/memory (NVML) and the engine's RSS between start() and stop()."""

    def __init__(self, interval_s: float = 2.0, devices: list[int] | None = None,
                 pid: int | None = None):
        self.interval_s = interval_s
        self.device_ids = devices  # None: every visible GPU
        self.pid = pid  # the engine process (its children count too); None: no RSS
        self._nv, self.note = None, None
        self._handles: list = []
        self._samples: list[tuple[float, float | None, float | None]] = []  # (t, W, MiB)
        self._rss_peak: int | None = None
        self._util: list[float] = []  # NVML utilization per sample, mean over devices (%)
        self._cpu0: float | None = None  # the engine tree's CPU seconds at start
        self._energy0: float | None = None
        self._energy: list[tuple[float, float]] = []  # (t, the counter in mJ) per sample
        self._t0 = self._t1 = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self._nv is not None

    def start(self) -> PowerSampler:
        self._nv, self.note = _nvml()
        if self._nv is not None:
            nv = self._nv
            ids = self.device_ids if self.device_ids is not None else range(
                nv.nvmlDeviceGetCount())
            self._handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in ids]
            self._energy0 = self._energy_mj()
        self._cpu0 = process_tree_cpu_s(self.pid) if self.pid is not None else None
        self._t0 = time.monotonic()
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="power-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self, span: tuple[float, float] | None = None) -> PowerReport:
        """The report from start to stop, its energy and mean power over `span` (monotonic
        bounds inside them) where given (module docstring)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 5)
        self._sample()
        self._t1 = time.monotonic()
        report = self._report(span)
        if self._nv is not None:
            self._nv.nvmlShutdown()
            self._nv = None
        return report

    # -- sampling

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        watts = mib = None
        if self._nv is not None:
            nv = self._nv
            try:
                watts = sum(nv.nvmlDeviceGetPowerUsage(h) for h in self._handles) / 1000.0
            except nv.NVMLError:
                watts = None
            try:
                mib = sum(nv.nvmlDeviceGetMemoryInfo(h).used for h in self._handles) / MIB
            except nv.NVMLError:
                mib = None
            try:
                util = [nv.nvmlDeviceGetUtilizationRates(h).gpu for h in self._handles]
                self._util.append(sum(util) / len(util))
            except (nv.NVMLError, ZeroDivisionError):
                pass
        now = time.monotonic()
        self._samples.append((now, watts, mib))
        if self._energy0 is not None:
            mj = self._energy_mj()
            if mj is not None:
                self._energy.append((now, mj))
        if self.pid is not None:
            rss = process_tree_rss(self.pid)
            if rss is not None:
                self._rss_peak = max(rss, self._rss_peak or 0)

    def _energy_mj(self) -> float | None:
        nv = self._nv
        try:
            return float(sum(nv.nvmlDeviceGetTotalEnergyConsumption(h) for h in self._handles))
        except nv.NVMLError:  # not every board has the counter (pre-Volta, some SKUs)
            return None

    # -- report

    def _report(self, span: tuple[float, float] | None = None) -> PowerReport:
        rep = PowerReport(duration_s=self._t1 - self._t0, n_samples=len(self._samples),
                          note=self.note)
        if self.pid is not None:
            hwm = peak_rss_hwm(self.pid)
            peak = max(hwm or 0, self._rss_peak or 0)
            rep.peak_rss_mib = peak / MIB if peak else None
        if self._nv is None:
            cpu1 = process_tree_cpu_s(self.pid) if self.pid is not None else None
            if self._cpu0 is not None and cpu1 is not None and rep.duration_s:
                rep.busy_share = min(1.0, max(0.0, (cpu1 - self._cpu0) / rep.duration_s))
                rep.busy_source = "engine_cpu_time"
            return rep
        if self._util:
            rep.busy_share = sum(self._util) / len(self._util) / 100.0
            rep.busy_source = "nvml_utilization"
        nv = self._nv
        rep.devices = [_name(nv, h) for h in self._handles]
        watts = [(t, w) for t, w, _ in self._samples if w is not None]
        mems = [m for _, _, m in self._samples if m is not None]
        if mems:
            rep.peak_mem_mib, rep.mem_used_mib = max(mems), mems[-1]
        edges = None  # the span's part inside start-stop, where it has one
        if span is not None:
            lo, hi = max(span[0], self._t0), min(span[1], self._t1)
            if hi > lo:
                edges = (lo, hi)
                watts = _clip(watts, lo, hi)
                rep.duration_s = hi - lo
        integral = _trapezoid(watts)
        if watts and rep.duration_s:
            rep.power_w_mean = (integral / rep.duration_s if integral is not None and
                                len(watts) > 1 else watts[0][1])
        counter = self._energy if len(self._energy) > 1 else []
        if counter and edges is not None:
            rep.energy_j = (_at(counter, edges[1]) - _at(counter, edges[0])) / 1000.0
            rep.energy_source = "nvml_energy_counter"
            rep.power_w_mean = rep.energy_j / rep.duration_s
        elif counter:
            rep.energy_j = (counter[-1][1] - self._energy0) / 1000.0
            rep.energy_source = "nvml_energy_counter"
            if rep.duration_s:
                rep.power_w_mean = rep.energy_j / rep.duration_s
        elif integral is not None:
            rep.energy_j, rep.energy_source = integral, "integrated_power"
        return rep


def _at(points: list[tuple[float, float]], t: float) -> float:
    """A cumulative reading at time t, linear between the samples around it (clamped to
    the first and last)."""
    if t <= points[0][0]:
        return points[0][1]
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        if t <= t1:
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1
    return points[-1][1]


def _clip(points: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    """(t, W) samples inside [lo, hi], with the edges' values interpolated in."""
    if len(points) < 2:
        return points
    inner = [(t, w) for t, w in points if lo < t < hi]
    return [(lo, _at(points, lo)), *inner, (hi, _at(points, hi))]


def _trapezoid(points: list[tuple[float, float]]) -> float | None:
    """∫ power dt in joules over (t, W) samples; None with fewer than two."""
    if len(points) < 2:
        return None
    return sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in itertools.pairwise(points))


def _name(nv, handle) -> str:
    name = nv.nvmlDeviceGetName(handle)
    return name.decode() if isinstance(name, bytes) else name


def current_pid() -> int:
    """This process, for the in-process transformers peer."""
    return os.getpid()
