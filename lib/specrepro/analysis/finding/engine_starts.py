"""How each arm's engine started, read from the study's manifest: the report's record of what
the engine itself said at start-up, beside the numbers it then served.

Design: every launch the runner makes leaves an `engines` entry in its session of the
manifest (harness/arm_engine.py), with `startup`: what the engine's own log said
(each engine adapter's log patterns, harness/engines/), i.e. its KV pool, the full-length requests that pool holds, a
running-request cap where the engine prints one (SGLang), the attention backend and the
kernels it chose (vLLM's "Using MarlinNvFp4LinearKernel for NVFP4 GEMM" on a GPU with no FP4
tensor cores: article B's "zero Marlin" check turned around; "Selected
CutlassFP8ScaledMMLinearKernel" for online FP8) and the GiB its weights took (vLLM's "Model
loading took", target and drafter: an FP8 drafter shows as this falling by what FP8 saves,
article B's 24.98 to 23.26 GiB). This module folds those entries into one
row per arm of the study:
- an entry belongs to an arm when its arm name matches and it was launched from the arm's
  profile as resolved now (`identity.profile_hash`; entries older than the hash, by profile
  name), so a start under a since-changed profile is not shown as this arm's; an arm that
  has only such starts (its profile changed since, or a local folder it serves was written
  anew, e.g. an export) keeps its row, labelled with both hashes: what the engine said then
  is still what it said, but the arm's cells from those starts are not judged;
- the facts of the latest successful start, the range of ready times over every successful
  start (a fresh machine's first start compiles; a later one may hit the compile cache), and
  the count of failed starts (their errors are in the manifest and the probes table);
- arms with no entry (nothing launched yet, or attached engines) are left out; a study with
  no entry at all has no table (`starts` returns an empty frame).
"""
from __future__ import annotations

import re

import polars as pl

from specrepro import identity
from specrepro.analysis.finding import tables
from specrepro.params import ResolvedArm, ResolvedStudy

COLUMNS = {
    "arm": pl.String, "engine": pl.String, "starts": pl.Int64, "failed starts": pl.Int64,
    "ready (s)": pl.String, "KV pool (tokens)": pl.Int64,
    "full-length requests the pool holds": pl.Float64, "running-request cap": pl.Int64,
    "attention": pl.String, "kernels the engine chose": pl.String,
    "weights in memory (GiB)": pl.Float64,
}
CAPTION = ("How each arm's engine started: what the engine logged at start-up, from the "
           "manifest's engine records (the latest successful start; ready time over every "
           "start; a failed start's error is in the manifest; weights in memory: the engine's "
           "own figure for target and drafter together, vLLM's \"Model loading took\")")


def _entries(manifest: dict, arm: ResolvedArm, want: str | None) -> list[dict]:
    """The engine entries of this arm's launches under its profile (by name) whose profile
    hash is `want` (None: any hash)."""
    out = []
    for session in manifest.get("sessions", []):
        for eng in session.get("engines") or []:
            if eng.get("arm") != arm.name or eng.get("profile") != arm.resolved.name:
                continue
            if want is not None and eng.get("profile_hash") not in (None, want):
                continue
            out.append(eng)
    return out


_LOADED = re.compile(r"([\d.]+) GiB")


def _weights_gib(startup: dict) -> float | None:
    """The GiB the engine said its weights took ("Model loading took 24.3 GiB and 4.6
    seconds": vLLM's, target and drafter together; `phases.model_loading`), or None. Article
    B's evidence that its drafter ran in FP8 is this figure falling (24.98 to 23.26 GiB)."""
    m = _LOADED.match((startup.get("phases") or {}).get("model_loading") or "")
    return float(m.group(1)) if m else None


def _kernels(startup: dict) -> str:
    """The kernel lines as `name: what the engine said`, in name order."""
    return "; ".join(f"{k}: {v}" for k, v in sorted((startup.get("kernels") or {}).items()))


def _ready(ok: list[dict]) -> str:
    times = [e["ready_s"] for e in ok if e.get("ready_s") is not None]
    if not times:
        return ""
    lo, hi = min(times), max(times)
    return tables.fmt(lo) if lo == hi else f"{tables.fmt(lo)}\u2013{tables.fmt(hi)}"


def starts(study: ResolvedStudy, manifest: dict) -> pl.DataFrame:
    """One row per arm with a launch in the manifest (COLUMNS), in the study's arm order."""
    rows = []
    # a local folder absent here (the stand-in, written on the GPU machine) enters the hash
    # by the fingerprint the manifest recorded where it was served, as the cells are matched
    recorded = identity.recorded_fingerprints(manifest)
    for arm in study.arms:
        now = identity.profile_hash(arm.resolved, recorded)
        entries = _entries(manifest, arm, now)
        label = arm.label or arm.name
        if not entries:  # only starts under another form of the profile, or none at all
            entries = _entries(manifest, arm, None)
            if not entries:
                continue
            then = sorted({e.get("profile_hash") for e in entries} - {None})
            label += (f" [started as profile {', '.join(then)}; resolved now it is {now}: "
                      "not this arm's cells]")
        ok = [e for e in entries if not e.get("error")]
        last = ok[-1] if ok else {}
        up = last.get("startup") or {}
        version = last.get("version") or arm.resolved.engine_version or ""
        rows.append({
            "arm": label,
            "engine": f"{arm.resolved.engine} {version}".strip(),
            "starts": len(ok), "failed starts": len(entries) - len(ok),
            "ready (s)": _ready(ok),
            "KV pool (tokens)": up.get("kv_pool_tokens", last.get("kv_pool_tokens")),
            "full-length requests the pool holds": up.get("max_concurrency",
                                                          last.get("max_concurrency")),
            "running-request cap": up.get("max_running_requests"),
            "attention": up.get("attention_backend"),
            "kernels the engine chose": _kernels(up) or None,
            "weights in memory (GiB)": _weights_gib(up),
        })
    return pl.DataFrame(rows, schema=COLUMNS)
