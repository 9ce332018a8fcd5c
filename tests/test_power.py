"""The power sampler: off without a GPU (None, never 0, with a note), NVML's energy counter
or ∫ power dt where a card answers (a stand-in pynvml module), and peak resident memory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types

import pytest

from specrepro.harness import power


class FakeNVML(types.ModuleType):
    """pynvml with one card drawing a steady 150 W; energy counter optional."""

    class NVMLError(Exception):
        pass

    def __init__(self, energy_counter: bool):
        super().__init__("pynvml")
        self.energy_counter = energy_counter
        self.t0 = time.monotonic()
        self.shutdowns = 0

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return b"Fake H200"

    def nvmlDeviceGetPowerUsage(self, h):
        return 150_000  # mW

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(used=(1024 + 512 * (time.monotonic() > self.t0)) * 2**20)

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=40, memory=10)

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if not self.energy_counter:
            raise self.NVMLError("Not Supported")
        return (time.monotonic() - self.t0) * 150_000  # mJ at 150 W


def test_without_nvml_power_is_off_with_a_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as on a box without it
    sampler = power.PowerSampler(interval_s=0.05, pid=os.getpid()).start()
    time.sleep(0.12)
    rep = sampler.stop()
    assert not sampler.enabled
    assert rep.note.startswith(power.NO_NVML)
    assert rep.power_w_mean is None and rep.energy_j is None and rep.peak_mem_mib is None
    assert rep.peak_rss_mib > 10  # this Python process holds more than 10 MiB
    assert power.nvml_note().startswith(power.NO_NVML)


@pytest.mark.parametrize("counter", [True, False])
def test_energy_from_counter_or_integrated_power(monkeypatch, counter):
    fake = FakeNVML(counter)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    sampler = power.PowerSampler(interval_s=0.05).start()
    time.sleep(0.3)
    rep = sampler.stop()
    assert sampler.note is None and rep.devices == ["Fake H200"]
    assert rep.energy_source == ("nvml_energy_counter" if counter else "integrated_power")
    assert rep.energy_j == pytest.approx(150 * rep.duration_s, rel=0.15)
    assert rep.power_w_mean == pytest.approx(150, rel=0.15)
    assert rep.peak_mem_mib == 1536 and rep.n_samples >= 4
    assert rep.busy_share == pytest.approx(0.40) and rep.busy_source == "nvml_utilization"
    assert fake.shutdowns == 1


def test_peak_rss_of_a_child_process_tree():
    code = "b = bytearray(64 * 2**20); import time; time.sleep(2)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(1.0)
        sampler = power.PowerSampler(interval_s=0.1, pid=child.pid).start()
        time.sleep(0.3)
        rep = sampler.stop()
    finally:
        child.kill()
        child.wait()
    assert rep.peak_rss_mib >= 64


def test_trapezoid_needs_two_samples():
    assert power._trapezoid([(0.0, 100.0)]) is None
    assert power._trapezoid([(0.0, 100.0), (2.0, 200.0)]) == 300.0


def test_busy_share_on_the_cpu_is_the_engine_trees_cpu_time(monkeypatch):
    """Without NVML the busy share is the engine process tree's CPU seconds over the wall
    seconds: a spinning engine near 1, a sleeping one near 0 (the host-bound rule's input)."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    shares = {}
    for name, code in (("spin", "while True: pass"), ("sleep", "import time; time.sleep(60)")):
        proc = subprocess.Popen([sys.executable, "-c", code])
        try:
            time.sleep(0.3)  # past the interpreter's start
            sampler = power.PowerSampler(interval_s=0.1, pid=proc.pid).start()
            time.sleep(0.8)
            rep = sampler.stop()
        finally:
            proc.kill()
            proc.wait()
        assert rep.busy_source == "engine_cpu_time"
        shares[name] = rep.busy_share
    # a spinning child gets a core on an idle machine (~1.0); the shared 2-core box under
    # load gave it 0.45: the test asks only that the two are told apart
    assert shares["spin"] > 0.2 and shares["sleep"] < 0.05, shares


class SteppedNVML(FakeNVML):
    """A card at 100 W that draws 700 W between t0 + 0.3 s and t0 + 0.9 s (a cell's load
    between its skip and its drain); the counter integrates exactly that."""

    HIGH = (0.3, 0.9)

    def _watts(self, t):
        lo, hi = self.HIGH
        return 700.0 if lo <= t - self.t0 < hi else 100.0

    def nvmlDeviceGetPowerUsage(self, h):
        return self._watts(time.monotonic()) * 1000

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        dt = time.monotonic() - self.t0
        lo, hi = self.HIGH
        high = min(max(dt - lo, 0.0), hi - lo)
        return (100.0 * (dt - high) + 700.0 * high) * 1000  # mJ


def test_energy_and_power_cover_the_measured_span_only(monkeypatch):
    """A windowed cell counts its tokens inside the window: its joules must be the
    window's too, not the skip's and the drain's around it (tokens per joule)."""
    fake = SteppedNVML(energy_counter=True)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    sampler = power.PowerSampler(interval_s=0.05).start()
    time.sleep(1.2)
    span = (fake.t0 + 0.4, fake.t0 + 0.8)  # inside the 700-W stretch
    inside = sampler.stop(span=span)
    assert inside.energy_source == "nvml_energy_counter"
    assert inside.duration_s == pytest.approx(0.4, abs=1e-6)
    # the counter is read every 0.05 s: the edges are interpolated inside flat draw
    assert inside.power_w_mean == pytest.approx(700.0, rel=0.02)
    assert inside.energy_j == pytest.approx(700.0 * 0.4, rel=0.02)
    fake.t0 = time.monotonic()
    whole = power.PowerSampler(interval_s=0.05).start()
    time.sleep(1.2)
    rep = whole.stop()  # no span: start to stop, skip and drain included
    assert rep.power_w_mean < 500 and rep.energy_j == pytest.approx(
        100.0 * rep.duration_s + 600.0 * 0.6, rel=0.05)
