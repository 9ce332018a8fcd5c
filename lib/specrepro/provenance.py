"""Provenance: what a measuring session ran on, for the results manifest.

Design:
- Each function answers one question a reader of a result asks (which packages at which
  versions, which commit and whether it was dirty, which host and CPU, which GPUs with which
  driver), from the running process alone; none raises: what cannot be read comes back as
  None or a note saying why, so a session on a machine without git or NVML is still
  recorded.
- `store.ResultStore.begin_session` stores them; the reports' summary reads them back.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

MANIFEST_PACKAGES = (
    "specrepro", "torch", "polars", "pyarrow", "pydantic", "numpy", "transformers",
    "tokenizers", "safetensors", "datasets", "evaluate", "papermill", "aiohttp", "openai",
    "nvidia-ml-py", "vllm", "sglang", "flashinfer-python",
)



def package_versions(names: Iterable[str] = MANIFEST_PACKAGES) -> dict[str, str | None]:
    """Installed versions from package metadata (no imports: torch is slow to import)."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_state(cwd: Path | None = None) -> dict[str, Any]:
    """Commit and dirty flag of the checkout holding cwd (or this package)."""
    where = cwd or Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            res = subprocess.run(["git", *args], cwd=where, capture_output=True, text=True,
                                 timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return res.stdout.strip() if res.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    note = None if commit else "no git commit found (not a checkout, or no commits yet)"
    return {"commit": commit, "dirty": None if status is None else bool(status), "note": note}


def gpu_info() -> dict[str, Any]:
    """GPU names, driver and CUDA version through NVML, or a note saying why there are none."""
    try:
        import pynvml
    except ImportError:
        return {"gpus": [], "note": "nvidia-ml-py (pynvml) is not installed"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:  # library not found, driver not loaded, no device
        return {"gpus": [], "note": f"no NVIDIA GPU answered NVML: {err}"}
    try:
        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            gpus.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                         "memory_mib": pynvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20,
                         "power_limit_w": _power_limit_w(pynvml, handle)})
        driver = pynvml.nvmlSystemGetDriverVersion()
        return {"gpus": gpus, "driver": driver.decode() if isinstance(driver, bytes) else driver,
                "cuda": f"{cuda // 1000}.{cuda % 1000 // 10}", "note": None}
    finally:
        pynvml.nvmlShutdown()


def _power_limit_w(pynvml: Any, handle: Any) -> float | None:
    try:
        return pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000  # mW -> W
    except pynvml.NVMLError:  # not supported on every board
        return None


def cpu_model() -> str | None:
    """The CPU's marketing name (/proc/cpuinfo's `model name`; platform.processor() is only
    the architecture on Linux), or None where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


def boot_id() -> str | None:
    """This boot of the machine (Linux), so two leased machines that share a hostname are
    told apart: an engine's first start on a machine compiles what later ones reuse."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def host_info() -> dict[str, Any]:
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return {
        "hostname": socket.gethostname(),
        "boot_id": boot_id(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpus_available": None if affinity is None else len(affinity),
        "cpu_model": cpu_model(),
        "processor": platform.processor() or platform.machine(),
    }
