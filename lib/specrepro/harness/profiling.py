"""Where an engine's time goes, from a torch.profiler trace: a summary as text.

Design:
- Every engine here writes the same trace format when asked (torch.profiler's Chrome JSON,
  plain or gzipped): vLLM with `--profiler-config '{"profiler": "torch",
  "torch_profiler_dir": DIR}'`, SGLang with `SGLANG_TORCH_PROFILER_DIR=DIR`, the embedded
  server with `--profile-dir DIR`; each then serves `POST /start_profile` and `POST
  /stop_profile` (the adapters hold these facts: `EngineAdapter.profiling`). Nsight Systems
  does not run on the borrowed H200; this does.
- `summarize(path)` reads one trace's complete events (`"ph": "X"`, times in µs) by
  category: GPU work (`kernel`, `gpu_memcpy`, `gpu_memset`), the CUDA runtime calls that
  launch it (`cuda_runtime`, `cuda_driver`: kernel launches against graph launches), and
  CPU operators (`cpu_op`, inclusive times). The figure that decides a small model's speed
  is the GPU's idle share of the traced span: the union of GPU intervals against the span,
  so a launch-bound engine shows as a GPU waiting on its host.
- `render(summary)` is the text: the span, GPU busy and idle, launches, and the top kernels
  and CPU operators by total time.
"""
from __future__ import annotations

import gzip
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver")
TRACE_GLOBS = ("*.pt.trace.json", "*.pt.trace.json.gz", "*.trace.json", "*.trace.json.gz")


class TraceError(ValueError):
    """A trace file that cannot be read; the message names it."""


@dataclass
class Row:
    name: str
    total_us: float
    count: int

    @property
    def mean_us(self) -> float:
        return self.total_us / self.count if self.count else 0.0


@dataclass
class TraceSummary:
    path: str
    span_us: float = 0.0
    gpu_busy_us: float = 0.0
    kernels: list[Row] = field(default_factory=list)  # by total time, all of them
    runtime: list[Row] = field(default_factory=list)
    cpu_ops: list[Row] = field(default_factory=list)

    @property
    def gpu_idle_share(self) -> float | None:
        """The traced span's share with no GPU work; None without GPU events (a CPU run)."""
        if not self.kernels or self.span_us <= 0:
            return None
        return max(0.0, 1.0 - self.gpu_busy_us / self.span_us)

    def count(self, rows: list[Row], *names: str) -> int:
        return sum(r.count for r in rows if r.name in names)


def read_events(path: Path | str) -> list[dict]:
    """The complete events of a Chrome trace (plain or gzipped JSON)."""
    path = Path(path)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        data = json.loads(raw)
    except (OSError, EOFError, json.JSONDecodeError, gzip.BadGzipFile) as err:
        raise TraceError(f"{path}: not a readable trace: {err}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError(f"{path}: no traceEvents list")
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]


def _rows(events: list[dict]) -> list[Row]:
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for e in events:
        total[e["name"]] += float(e["dur"])
        count[e["name"]] += 1
    return sorted((Row(n, total[n], count[n]) for n in total), key=lambda r: -r.total_us)


def _union_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (overlapping streams count once)."""
    busy, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if a > end:
            busy += b - a
            end = b
        elif b > end:
            busy += b - end
            end = b
    return busy


def summarize(path: Path | str) -> TraceSummary:
    events = read_events(path)
    if not events:
        raise TraceError(f"{path}: the trace holds no complete events (was anything run "
                         "between /start_profile and /stop_profile?)")
    by_cat: dict[str, list[dict]] = defaultdict(list)
    for e in events:
        by_cat[str(e.get("cat", "")).lower()].append(e)
    gpu = [e for c in GPU_CATEGORIES for e in by_cat.get(c, [])]
    starts = [float(e["ts"]) for e in events]
    ends = [float(e["ts"]) + float(e["dur"]) for e in events]
    return TraceSummary(
        path=str(path), span_us=max(ends) - min(starts),
        gpu_busy_us=_union_us([(float(e["ts"]), float(e["ts"]) + float(e["dur"]))
                               for e in gpu]),
        kernels=_rows(gpu),
        runtime=_rows([e for c in RUNTIME_CATEGORIES for e in by_cat.get(c, [])]),
        cpu_ops=_rows(by_cat.get("cpu_op", [])))


def _table(title: str, rows: list[Row], top: int, whole_us: float) -> list[str]:
    if not rows:
        return [f"{title}: none in the trace"]
    out = [f"{title} (top {min(top, len(rows))} of {len(rows)} by total time):",
           f"  {'total ms':>9} {'share':>6} {'count':>7} {'mean us':>9}  name"]
    for r in rows[:top]:
        share = f"{100 * r.total_us / whole_us:5.1f}%" if whole_us > 0 else "    - "
        out.append(f"  {r.total_us / 1e3:9.2f} {share:>6} {r.count:7d} {r.mean_us:9.1f}  "
                   f"{r.name[:100]}")
    return out


def render(s: TraceSummary, top: int = 12) -> str:
    """The summary as text (times in ms, shares of the traced span or of GPU busy time)."""
    lines = [f"trace {s.path}", f"  traced span {s.span_us / 1e3:.2f} ms"]
    if s.gpu_idle_share is not None:
        lines.append(f"  GPU busy {s.gpu_busy_us / 1e3:.2f} ms, idle "
                     f"{100 * s.gpu_idle_share:.1f}% of the span; "
                     f"{sum(r.count for r in s.kernels):,} GPU operations")
    else:
        lines.append("  no GPU events (a CPU trace)")
    launches = s.count(s.runtime, "cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx",
                       "cudaLaunchKernelExC")
    graphs = s.count(s.runtime, "cudaGraphLaunch", "cuGraphLaunch")
    if s.runtime:
        lines.append(f"  kernel launches {launches:,}, CUDA graph launches {graphs:,}")
    lines += _table("GPU kernels and copies", s.kernels, top, s.gpu_busy_us)
    lines += _table("CUDA runtime calls", s.runtime, top, s.span_us)
    lines += _table("CPU operators (inclusive)", s.cpu_ops, top, s.span_us)
    return "\n".join(lines)


def traces_in(folder: Path | str, since: float = 0.0) -> list[Path]:
    """Trace files under folder modified at or after `since` (a time.time()), oldest first."""
    found = {p for g in TRACE_GLOBS for p in Path(folder).rglob(g) if p.stat().st_mtime >= since}
    return sorted(found, key=lambda p: p.stat().st_mtime)
