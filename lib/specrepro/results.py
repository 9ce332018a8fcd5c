"""The results store: append-only Parquet tables of cells and requests, and a manifest.

Design (docs/architecture.md "Contract: results"):
- Layout: `<results_dir>/<study>/<run_id>/` with `cells/` and `requests/` (one Parquet
  part file per attempt of a cell, `<cell_id>-a<attempt>.parquet`), `manifest.json`
  (one entry per session that wrote to this run) and `logs/`.
- A **cell** is one arm x workload x concurrency x sampling x repeat; its `cell_id`
  (`specrepro.identity.cell_id`) hashes everything that defines it, so a changed parameter
  is a new cell, measured anew.
- Every attempt is a new part file, written to a temporary name and hard-linked into
  place (which fails rather than replace an existing file): nothing is ever rewritten.
  The requests part is written before the cells part, so a cell row implies its requests.
- Resume: `completed_cell_ids()` are the cells with an `ok` attempt; a re-run skips them.
  The loader returns, per cell, the latest `ok` attempt; failed attempts stay on disk.
- Manifest: begin_session(info) takes what only the caller knows (`params`: the resolved
  study; `engines`: name, version, flags, argv; `models`: ids and revisions) and adds git
  commit and dirty flag, package versions, host, GPU/driver/CUDA (NVML) and the start time;
  update_session() adds engines as they launch, end_session() the end time.
- Every part file has the same columns and types (CELL_SCHEMA / REQUEST_SCHEMA): a row
  that leaves a column out gets its default, a row with a column the schema lacks fails.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import math
import os
import platform
import re
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

# the manifest stores params objects as the cell ids hash them (pydantic in JSON mode)
from specrepro.identity import jsonable

STATUSES = ("ok", "failed", "interrupted")

CELL_SCHEMA: dict[str, pl.DataType] = {
    "study": pl.String,
    "run_id": pl.String,
    "cell_id": pl.String,
    "attempt": pl.Int64,
    "status": pl.String,
    "error": pl.String,
    "started_at": pl.Datetime("us", "UTC"),
    "ended_at": pl.Datetime("us", "UTC"),
    "arm": pl.String,
    "profile": pl.String,
    "engine": pl.String,
    "engine_version": pl.String,
    "method": pl.String,
    "num_speculative_tokens": pl.Int64,
    "schedule": pl.String,  # the draft schedule as JSON ([[lo, hi, k], ...]) or null
    "workload": pl.String,
    "n_prompts": pl.Int64,
    "concurrency": pl.Int64,
    "temperature": pl.Float64,
    "top_p": pl.Float64,
    "top_k": pl.Int64,
    "repeat": pl.Int64,
    "seed": pl.Int64,
    "ignore_eos": pl.Boolean,
    "n_requests": pl.Int64,
    "n_errors": pl.Int64,
    "prompt_tokens": pl.Int64,
    "output_tokens": pl.Int64,
    "wall_s": pl.Float64,
    "agg_tok_s": pl.Float64,
    "per_stream_tok_s": pl.Float64,
    "ttft_p50_ms": pl.Float64,
    "ttft_p95_ms": pl.Float64,
    "itl_p50_ms": pl.Float64,
    "e2e_p50_s": pl.Float64,
    "num_drafts": pl.Int64,
    "num_draft_tokens": pl.Int64,
    "num_accepted_tokens": pl.Int64,
    "acceptance_length": pl.Float64,
    "draft_acceptance_rate": pl.Float64,
    "per_position_acceptance": pl.List(pl.Float64),
    "step_ms": pl.Float64,
    "gsm8k_strict_correct": pl.Int64,
    "gsm8k_flexible_correct": pl.Int64,
    "gsm8k_n": pl.Int64,
    "repeated_4gram_share": pl.Float64,
    "identical_to_baseline": pl.Float64,  # share of requests token-identical to the baseline arm
    "power_w_mean": pl.Float64,
    "energy_j": pl.Float64,
    "tokens_per_joule": pl.Float64,
    "peak_mem_mib": pl.Float64,
    "kv_pool_tokens": pl.Int64,
    "max_concurrency": pl.Float64,  # the engine's "Maximum concurrency ... 3.01x"
    "counters_consistent": pl.Boolean,
    "warnings": pl.List(pl.String),
}

REQUEST_SCHEMA: dict[str, pl.DataType] = {
    "cell_id": pl.String,
    "attempt": pl.Int64,
    "request_idx": pl.Int64,
    "prompt_id": pl.String,
    "seed": pl.Int64,
    "ttft_s": pl.Float64,
    "itl_s": pl.List(pl.Float64),
    "e2e_s": pl.Float64,
    "prompt_tokens": pl.Int64,
    "completion_tokens": pl.Int64,
    "text": pl.String,
    "token_ids": pl.List(pl.Int64),
    "finish_reason": pl.String,
    "error": pl.String,
    "gsm8k_strict": pl.Boolean,
    "gsm8k_flexible": pl.Boolean,
}

# Columns a row must give; every other column defaults to null ([] for warnings).
CELL_REQUIRED = ("cell_id", "attempt", "status")
REQUEST_REQUIRED = ("request_idx",)
DEFAULTS: dict[str, Any] = {"warnings": []}

MANIFEST_PACKAGES = (
    "specrepro",
    "torch",
    "polars",
    "pyarrow",
    "pydantic",
    "numpy",
    "transformers",
    "tokenizers",
    "safetensors",
    "datasets",
    "evaluate",
    "papermill",
    "aiohttp",
    "openai",
    "nvidia-ml-py",
    "vllm",
    "sglang",
    "flashinfer-python",
)

_PART = re.compile(r"^(?P<cell>[0-9a-f]{16})-a(?P<attempt>\d+)\.parquet$")


class ResultsError(ValueError):
    """A row or a store is wrong; the message names the column, cell or file."""


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# --------------------------------------------------------------------- normalising


def _coerce(column: str, dtype: pl.DataType, value: Any, where: str) -> Any:
    """Make a value fit its column's type, or fail naming the column."""
    if value is None:
        return None
    if isinstance(value, float) and math.isnan(value) and dtype != pl.Float64:
        return None
    try:
        if dtype == pl.Int64:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise TypeError
            return int(value)
        if dtype == pl.Float64:
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        if dtype == pl.Boolean:
            if not isinstance(value, bool):
                raise TypeError
            return value
        if dtype == pl.String:
            if isinstance(value, (list, dict)):
                return json.dumps(value, sort_keys=True)
            return str(value)
        if isinstance(dtype, pl.Datetime):
            if isinstance(value, str):
                value = dt.datetime.fromisoformat(value)
            if not isinstance(value, dt.datetime):
                raise TypeError
            return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        if isinstance(dtype, pl.List):
            if not isinstance(value, (list, tuple)):
                raise TypeError
            return [_coerce(column, dtype.inner, v, where) for v in value]
    except (TypeError, ValueError):
        raise ResultsError(
            f"{where}: column {column!r}: expected {dtype}, found {value!r}"
        ) from None
    return value


def normalize(
    row: Mapping[str, Any], schema: Mapping[str, pl.DataType], required: Iterable[str], where: str
) -> dict[str, Any]:
    """A row with every schema column, defaults filled in and values coerced."""
    unknown = [k for k in row if k not in schema]
    if unknown:
        raise ResultsError(
            f"{where}: unknown column(s) {unknown}; expected columns of {', '.join(schema)}"
        )
    missing = [k for k in required if row.get(k) is None]
    if missing:
        raise ResultsError(f"{where}: missing required column(s) {missing}")
    out = {}
    for column, dtype in schema.items():
        value = row.get(column, DEFAULTS.get(column) if schema is CELL_SCHEMA else None)
        out[column] = _coerce(column, dtype, value, where)
    return out


def frame(rows: list[dict], schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=dict(schema), orient="row") if rows else empty(schema)


def empty(schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(schema=dict(schema))


# ----------------------------------------------------------------------- writing


def write_part(df: pl.DataFrame, path: Path) -> None:
    """Write a Parquet part atomically, refusing to replace an existing file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        df.write_parquet(tmp)
        os.link(tmp, path)  # atomic, and fails with FileExistsError where rename would replace
    except FileExistsError:
        raise ResultsError(f"{path}: part file exists; attempts are never overwritten") from None
    finally:
        os.unlink(tmp)


def _write_json(data: Any, path: Path) -> None:
    """Whole-file replace of a small JSON document via temp file + rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True, default=str)
        fh.write("\n")
    os.replace(tmp, path)


# ----------------------------------------------------------------------- reading


def _parts(root: Path, table: str) -> list[Path]:
    root = Path(root)
    return sorted(p for p in root.glob(f"**/{table}/*.parquet") if _PART.match(p.name))


def load_attempts(path: Path | str) -> pl.DataFrame:
    """Every attempt (ok, failed, interrupted) under a run directory or any directory above."""
    parts = _parts(Path(path), "cells")
    if not parts:
        return empty(CELL_SCHEMA)
    return pl.concat([pl.read_parquet(p) for p in parts], how="vertical").select(list(CELL_SCHEMA))


def load_cells(path: Path | str) -> pl.DataFrame:
    """Per cell (within its study and run), the latest attempt whose status is ok."""
    cells = load_attempts(path).filter(pl.col("status") == "ok")
    keys = ["study", "run_id", "cell_id"]
    return (
        cells.sort("attempt")
        .group_by(keys, maintain_order=True)
        .last()
        .select(list(CELL_SCHEMA))
        .sort(
            ["study", "run_id", "arm", "workload", "concurrency", "temperature", "repeat"],
            nulls_last=True,
        )
    )


def load_requests(path: Path | str, cells: pl.DataFrame | None = None) -> pl.DataFrame:
    """The requests of the attempts load_cells() chooses (or of the cells given)."""
    root = Path(path)
    chosen = (load_cells(root) if cells is None else cells).select(
        ["study", "run_id", "cell_id", "attempt"]
    )
    frames = []
    for part in _parts(root, "requests"):
        m = _PART.match(part.name)
        hit = chosen.filter(
            (pl.col("cell_id") == m["cell"]) & (pl.col("attempt") == int(m["attempt"]))
        )
        run_dir = part.parent.parent
        hit = hit.filter(
            (pl.col("run_id") == run_dir.name) & (pl.col("study") == run_dir.parent.name)
        )
        if hit.height:
            frames.append(
                pl.read_parquet(part)
                .select(list(REQUEST_SCHEMA))
                .with_columns(
                    pl.lit(run_dir.parent.name).alias("study"), pl.lit(run_dir.name).alias("run_id")
                )
            )
    if not frames:
        return empty(REQUEST_SCHEMA).with_columns(
            pl.lit(None, pl.String).alias("study"), pl.lit(None, pl.String).alias("run_id")
        )
    return pl.concat(frames, how="vertical").sort(["cell_id", "request_idx"])


# ---------------------------------------------------------------------- manifest


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
            res = subprocess.run(
                ["git", *args], cwd=where, capture_output=True, text=True, timeout=10, check=False
            )
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
            gpus.append(
                {
                    "index": i,
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "memory_mib": pynvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20,
                    "power_limit_w": _power_limit_w(pynvml, handle),
                }
            )
        driver = pynvml.nvmlSystemGetDriverVersion()
        return {
            "gpus": gpus,
            "driver": driver.decode() if isinstance(driver, bytes) else driver,
            "cuda": f"{cuda // 1000}.{cuda % 1000 // 10}",
            "note": None,
        }
    finally:
        pynvml.nvmlShutdown()


def _power_limit_w(pynvml: Any, handle: Any) -> float | None:
    try:
        return pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000  # mW -> W
    except pynvml.NVMLError:  # not supported on every board
        return None


def host_info() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }


# ------------------------------------------------------------------------- store


class ResultStore:
    """One run of one study: `<results_dir>/<study>/<run_id>/`."""

    def __init__(self, results_dir: Path | str, study: str, run_id: str):
        self.study, self.run_id = study, run_id
        self.root = Path(results_dir) / study / run_id
        self.cells_dir = self.root / "cells"
        self.requests_dir = self.root / "requests"
        self.logs_dir = self.root / "logs"
        self.manifest_path = self.root / "manifest.json"
        self.session_id: str | None = None
        self._attempts: dict[str, int] | None = None  # cell_id -> highest attempt on disk

    # -- manifest -----------------------------------------------------------------

    def manifest(self) -> dict[str, Any]:
        if self.manifest_path.is_file():
            return json.loads(self.manifest_path.read_text())
        return {"study": self.study, "run_id": self.run_id, "sessions": []}

    def begin_session(self, manifest_info: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Append a session to manifest.json: the caller's info (resolved params, engines
        with name/version/flags/argv, model ids and revisions) plus what the store finds
        itself (git, package versions, host, GPU, start time). Returns the session."""
        for d in (self.cells_dir, self.requests_dir, self.logs_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.session_id = f"{now():%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"
        session = {
            "session_id": self.session_id,
            "started_at": now().isoformat(),
            "ended_at": None,
            "status": "running",
            "git": git_state(),
            "packages": package_versions(),
            "host": host_info(),
            "gpu": gpu_info(),
            "params": None,
            "engines": [],
            "models": [],
            **jsonable(dict(manifest_info or {})),
        }
        manifest = self.manifest()
        manifest["sessions"].append(session)
        _write_json(manifest, self.manifest_path)
        return session

    def update_session(self, **info: Any) -> dict[str, Any]:
        """Add or replace keys of the current session (e.g. engine version once launched);
        list values for `engines` and `models` are appended to."""

        def change(session: dict) -> None:
            for key, value in jsonable(info).items():
                if key in ("engines", "models") and isinstance(session.get(key), list):
                    session[key] += value if isinstance(value, list) else [value]
                else:
                    session[key] = value

        return self._edit_session(change)

    def end_session(self, status: str = "ok") -> dict[str, Any]:
        def change(session: dict) -> None:
            session["ended_at"] = now().isoformat()
            session["status"] = status

        return self._edit_session(change)

    def _edit_session(self, change: Any) -> dict[str, Any]:
        if self.session_id is None:
            raise ResultsError(f"{self.root}: no session begun (call begin_session first)")
        manifest = self.manifest()
        session = next(s for s in manifest["sessions"] if s["session_id"] == self.session_id)
        change(session)
        _write_json(manifest, self.manifest_path)
        return session

    # -- attempts -----------------------------------------------------------------

    def _scan(self) -> dict[str, int]:
        if self._attempts is None:
            self._attempts = {}
            for part in list(self.cells_dir.glob("*.parquet")) + list(
                self.requests_dir.glob("*.parquet")
            ):
                m = _PART.match(part.name)
                if m:
                    n = int(m["attempt"])
                    self._attempts[m["cell"]] = max(n, self._attempts.get(m["cell"], 0))
        return self._attempts

    def next_attempt(self, cell_id: str) -> int:
        """1 for a cell never tried here, else one past the highest attempt on disk."""
        return self._scan().get(cell_id, 0) + 1

    def append_cell(
        self,
        row: Mapping[str, Any],
        requests_rows: Iterable[Mapping[str, Any]] = (),
    ) -> pl.DataFrame:
        """Write one attempt: its requests part, then its cells part. `attempt` defaults
        to next_attempt(cell_id); study and run_id come from the store."""
        row = dict(row)
        cid = row.get("cell_id")
        if not isinstance(cid, str) or not re.fullmatch(r"[0-9a-f]{16}", cid):
            raise ResultsError(
                f"{self.root}: cell row: expected cell_id from cell_id(), found {cid!r}"
            )
        row.setdefault("attempt", self.next_attempt(cid))
        row.setdefault("study", self.study)
        row.setdefault("run_id", self.run_id)
        if (row["study"], row["run_id"]) != (self.study, self.run_id):
            raise ResultsError(
                f"{self.root}: cell {cid}: row names study/run "
                f"{row['study']}/{row['run_id']}, store is {self.study}/"
                f"{self.run_id}"
            )
        if row.get("status") not in STATUSES:
            raise ResultsError(
                f"{self.root}: cell {cid}: column 'status': expected one of "
                f"{STATUSES}, found {row.get('status')!r}"
            )
        where = f"{self.root}: cell {cid} attempt {row['attempt']}"
        cell = normalize(row, CELL_SCHEMA, CELL_REQUIRED, where)
        reqs = [
            normalize(
                {"cell_id": cid, "attempt": cell["attempt"], **r},
                REQUEST_SCHEMA,
                REQUEST_REQUIRED,
                f"{where}, request {i}",
            )
            for i, r in enumerate(requests_rows)
        ]
        for r in reqs:
            if (r["cell_id"], r["attempt"]) != (cid, cell["attempt"]):
                raise ResultsError(
                    f"{where}: request {r['request_idx']} names cell "
                    f"{r['cell_id']} attempt {r['attempt']}"
                )
        name = f"{cid}-a{cell['attempt']:03d}.parquet"
        if (self.cells_dir / name).exists() or (self.requests_dir / name).exists():
            raise ResultsError(f"{where}: attempt exists; attempts are never overwritten")
        write_part(frame(reqs, REQUEST_SCHEMA), self.requests_dir / name)
        df = frame([cell], CELL_SCHEMA)
        write_part(df, self.cells_dir / name)
        attempts = self._scan()
        attempts[cid] = max(cell["attempt"], attempts.get(cid, 0))
        return df

    def completed_cell_ids(self) -> set[str]:
        """Cells with an ok attempt in this run: a re-run skips them."""
        ok = load_attempts(self.cells_dir.parent).filter(pl.col("status") == "ok")
        return set(ok["cell_id"].to_list())

    def load_attempts(self) -> pl.DataFrame:
        return load_attempts(self.root)

    def load_cells(self) -> pl.DataFrame:
        return load_cells(self.root)

    def load_requests(self) -> pl.DataFrame:
        return load_requests(self.root)
