"""Mechanism preconditions: what a check presupposes about the substrate, measured there.

Design:
- The articles' findings rest on mechanisms (analysis/verdict/mechanisms.yaml, validated on load): a
  decode step that is a weight read, power drawn near the card's cap, a KV pool priced by
  bytes. A check names the one it needs (claims.yaml `mechanism:`); where the substrate's
  measured figure misses the bound, the check is "not testable here: <mechanism> absent
  (measured: ...)", never "does not hold". Unknown is not testable either: a side with no
  step cost, or on a GPU no busy figure, cannot pass a speed check.
- Per arm and level, never one figure for every arm (`Figure.where` says where each came
  from):
  - step cost, a speculative step in one-token decodes at the arm's lowest level: from the
    cells (its `step_ms` over the same engine's no-speculation arm's at that workload and
    level), else the suite's step-stage probe (params `substrate.step_probe`: the row of the
    arm's drafter and draft length, with its verify and drafter pass), else another study of
    the same suite that stored a no-speculation arm of the same engine, version, target,
    quantization and card at that level (a plain step is a property of those, not of the
    study: the stand-in's 01 and 02 have no plain arm, its 04 and 06 do), its workload named
    where it differs; else unknown; an arm without speculation is one decode by definition;
  - busy, on a GPU at the check's level: analysis/verdict/host_bound.py's figure;
  - power: the arm's `power_w_mean` at the check's level over its profile's power_limit_w.
- `kv_note` says, beside a memory check, whether the pool falls by the drafter's layer count
  (its config.json beside the target's) rather than by the article's small drafter: where
  the layers predict the measured pool within 0.02, the article's mechanism is absent and
  the check is not testable here, with both ratios.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from specrepro.analysis.finding.finding import Finding, devices, project_root, stored_cells
from specrepro.params import ParamsError, resolve_study

NAMES = ("weight_read_step", "power_near_cap", "kv_by_bytes")
_KEYS = {"weight_read_step": {"words", "max_step_decodes", "min_busy"},
         "power_near_cap": {"words", "min_cap_share"}, "kv_by_bytes": {"words"}}


class MechanismError(ValueError):
    """mechanisms.yaml or a probe file is malformed; the message names the file and key."""


@functools.cache
def mechanisms(text: str | None = None) -> dict[str, dict[str, Any]]:
    """mechanisms.yaml, validated: each of `NAMES` with exactly its keys, bounds numbers."""
    raw = yaml.safe_load(text if text is not None else
                         resources.files(__package__).joinpath("mechanisms.yaml").read_text())
    if not isinstance(raw, dict) or set(raw) != set(NAMES):
        raise MechanismError(f"mechanisms.yaml: expected the mechanisms {list(NAMES)}, found "
                             f"{sorted(raw) if isinstance(raw, dict) else raw!r}")
    for name, entry in raw.items():
        if not isinstance(entry, dict) or set(entry) != _KEYS[name]:
            raise MechanismError(f"mechanisms.yaml: {name}: expected the keys "
                                 f"{sorted(_KEYS[name])}, found {entry!r}")
        for key, value in entry.items():
            if key != "words" and (isinstance(value, bool) or not isinstance(value, int | float)
                                   or value <= 0):
                raise MechanismError(f"mechanisms.yaml: {name}.{key}: expected a number > 0, "
                                     f"found {value!r}")
    return raw


@dataclass(frozen=True)
class Figure:
    value: float
    where: str  # how it was measured, and from which cells or file


# ------------------------------------------------------------------------ step cost


def _arm(f: Finding, name: str):
    return next((a for a in f.study.arms if a.name == name), None)


def _lowest(cells: pl.DataFrame) -> int | None:
    return int(cells["concurrency"].min()) if cells.height else None


@functools.cache
def probe_rows(source: str) -> tuple[dict, ...]:
    """The rows of a step-stage probe file (scripts/bench_step_stages.py's last JSON line)."""
    path = project_root() / source
    try:
        line = [ln for ln in path.read_text().splitlines() if ln.startswith("{")][-1]
        data = json.loads(line)
        decode = float(data["decode_ms"])
        return tuple({**r, "decode_ms": decode} for r in data["rows"])
    except (OSError, IndexError, KeyError, TypeError, ValueError) as err:
        raise MechanismError(f"{source}: expected a step-stage probe (a last JSON line with "
                             f"decode_ms and rows), could not read it: {err}") from err


def _probe_row(rows: tuple[dict, ...], method: str, k: int | None, drafter: str | None):
    named = [r for r in rows if r["method"] == method and r["k"] == k]
    pick = [r for r in named if r["drafter"] == (drafter or method)] or (
        named if drafter is None and len(named) == 1 else [])
    return pick[0] if pick else None


def step_cost(f: Finding, arm: str) -> Figure | None:
    """A speculative step of `arm` at its lowest level, in one-token decodes of its engine."""
    a = _arm(f, arm)
    if a is None:
        return None
    spec = a.resolved.speculative
    if spec is None or spec.method == "none":
        return Figure(1.0, "no speculation: a step is one decode")
    level = _lowest(f.cells.filter(pl.col("arm") == arm))
    if level is None:
        return None
    plain = [b.name for b in f.study.arms if b.resolved.engine == a.resolved.engine
             and b.resolved.speculative is None]
    for base in plain:
        got = _cells_ratio(f, arm, base, level)
        if got is not None:
            return got
    sub = f.suite.substrate
    if sub is not None and sub.step_probe is not None and sub.step_probe.engine == a.resolved.engine:
        folder = spec.model or (a.resolved.drafter.id if a.resolved.drafter else None)
        drafter = Path(folder).name if folder else None
        row = _probe_row(probe_rows(sub.step_probe.source), spec.method,
                         spec.num_speculative_tokens, drafter)
        if row is not None:
            d = row["decode_ms"]
            return Figure(row["step"] / d, (
                f"the step-stage probe {sub.step_probe.source} ({row['drafter']}, "
                f"k={row['k']}: verify {row['verify'] / d:.2f}, drafter pass "
                f"{row['propose'] / d:.2f} decodes; no cells of this study divide its step)"))
    return _suite_plain_ratio(f, arm, level)


def _same_plain(p, q) -> bool:
    """Whether profile `q` (no speculation) decodes as `p` does: same engine and version,
    target, quantization at load and card."""
    def hw(x):
        return x.hardware.name if x.hardware else None
    return (q.speculative is None and q.engine == p.engine
            and q.engine_version == p.engine_version and q.model.id == p.model.id
            and q.flags.get("quantization") == p.flags.get("quantization") and hw(q) == hw(p))


def _suite_study_cells(f: Finding, notebook_id: str):
    """Another notebook's study in the finding's suite and its stored cells (None where the
    suite does not resolve it). Read afresh each time: a store may grow within a process."""
    try:
        st = resolve_study(f.suite, notebook_id)
    except ParamsError:
        return None
    return st, stored_cells(f.suite.results_path / st.name / f.suite.run_id, st)


def _suite_plain_ratio(f: Finding, arm: str, level: int) -> Figure | None:
    """`arm`'s step_ms over a plain step of its engine, target and card that another study
    of the suite stored at `level`: on the same workload where one did, else the first."""
    a = _arm(f, arm)
    mine = f.cells.filter((pl.col("arm") == arm) & (pl.col("concurrency") == level)
                          & pl.col("step_ms").is_not_null())
    if a is None or not mine.height:
        return None
    for nb in sorted(f.suite.notebooks):
        got = None if nb == f.notebook_id else _suite_study_cells(f, nb)
        if got is None:
            continue
        st, cells = got
        plain = [b.name for b in st.arms
                 if b.noise_of is None and _same_plain(a.resolved, b.resolved)]
        theirs = cells.filter(pl.col("arm").is_in(plain) & (pl.col("concurrency") == level)
                              & pl.col("step_ms").is_not_null())
        if not theirs.height:
            continue
        got = _steps_ratio(mine, theirs, level, any_workload=True)
        if got is not None:
            num, den, on, base = got
            return Figure(num / den, f"cells: {num:.3g} ms a step against {nb}'s {base} "
                                 f"{den:.3g} ms (the same engine, target and card; this study "
                                 f"has no plain arm), {on}")
    return None


def _steps_ratio(mine: pl.DataFrame, theirs: pl.DataFrame, level: int | None,
                 any_workload: bool = False) -> tuple[float, float, str, str] | None:
    """The mean step_ms of `mine` and of `theirs` (cells at one level, step_ms set) on the
    first workload both measured, else, with `any_workload`, on each one's first: (mine's,
    theirs', where, the base arm); None where none is shared (and not `any_workload`), or
    the base's step is 0."""
    shared = sorted(set(mine["workload"].to_list()) & set(theirs["workload"].to_list()))
    if not shared and not any_workload:
        return None
    w_mine, w_theirs = ((shared[0], shared[0]) if shared else
                        (sorted(mine["workload"].to_list())[0],
                         sorted(theirs["workload"].to_list())[0]))
    num = float(mine.filter(pl.col("workload") == w_mine)["step_ms"].mean())
    base = theirs.filter(pl.col("workload") == w_theirs)
    den = float(base["step_ms"].mean())
    if not den:
        return None
    on = w_mine if w_mine == w_theirs else f"{w_mine} against {w_theirs}"
    return num, den, f"{on}, {level} stream{'s' if level != 1 else ''}", base["arm"][0]


def _cells_ratio(f: Finding, arm: str, base: str, level: int | None) -> Figure | None:
    """`arm`'s step_ms over `base`'s at `level`, over the workloads both measured there."""
    def at(name: str) -> pl.DataFrame:
        part = f.cells.filter((pl.col("arm") == name) & (pl.col("concurrency") == level))
        return part.filter(pl.col("step_ms").is_not_null())
    got = _steps_ratio(at(arm), at(base), level)
    if got is None:
        return None
    num, den, on, _ = got
    return Figure(num / den, f"cells: {num:.3g} ms a step against {base}'s {den:.3g} ms, {on}")


# --------------------------------------------------------------------------- power


def power_share(f: Finding, arm: str, level: int | None) -> Figure | None:
    """The arm's mean board power at `level` over its profile's power limit."""
    a = _arm(f, arm)
    cap = a.resolved.hardware.power_limit_w if a is not None and a.resolved.hardware else None
    cells = f.cells.filter(pl.col("arm") == arm)
    if level is not None:
        cells = cells.filter(pl.col("concurrency") == level)
    watts = cells["power_w_mean"].drop_nulls() if "power_w_mean" in cells.columns else []
    if not cap or not len(watts):
        return None
    w = float(watts.mean())
    return Figure(w / cap, f"{w:.0f} W of {cap:.0f} W over {len(watts)} cells")


# ---------------------------------------------------------------------- the rule


def _speed_reason(f: Finding, arms: list[tuple[str, int | None]]) -> str | None:
    from specrepro.analysis.verdict import host_bound  # host_bound reads this module's bounds

    m = mechanisms()["weight_read_step"]
    for arm, level in arms:
        if not f.cells.filter(pl.col("arm") == arm).height:
            continue  # nothing measured: the check itself says so
        if "cuda" in devices(f.study, [arm]):  # the measured busy share first: it says most
            b = host_bound.busy(f, arm, level)
            if b is None:
                return (f"{m['words']} not shown: no busy figure for {arm!r} on the GPU"
                        f"{_at(level)}: unknown is not testable")
            if b.share < m["min_busy"]:
                return (f"{m['words']} absent: host-bound (measured: GPU {b.share:.0%} busy "
                        f"while {arm!r} ran{_at(level)}: {b.where}; speed, step and energy "
                        f"checks need the device at least {m['min_busy']:.0%} busy)")
        cost = step_cost(f, arm)
        if cost is None:
            return (f"{m['words']} not shown: no step cost for {arm!r} (no no-speculation "
                    "arm of its engine in the study or stored by another of the suite, no "
                    "step-stage probe of its drafter and draft length): unknown is not "
                    "testable")
        if cost.value > m["max_step_decodes"]:
            return (f"{m['words']} absent (measured: {arm!r} {cost.value:.2f} decodes a step "
                    f"({cost.where}); the articles' is 1.28-1.32, the bound "
                    f"{m['max_step_decodes']:g})")
    return None


def _at(level: int | None) -> str:
    return f" at {level} stream{'s' if level != 1 else ''}" if level is not None else ""


def _power_reason(f: Finding, arms: list[tuple[str, int | None]]) -> str | None:
    m = mechanisms()["power_near_cap"]
    for arm, level in arms:
        p = power_share(f, arm, level)
        if p is None:
            return (f"{m['words']} not shown: no board power or power limit for {arm!r}"
                    f"{_at(level)}: unknown is not testable")
        if p.value < m["min_cap_share"]:
            return (f"{m['words']} absent (measured: {p.value:.0%} of the cap while {arm!r} "
                    f"ran{_at(level)}: {p.where}; the bound {m['min_cap_share']:.0%})")
    return None


def reason(f: Finding, mechanism: str | None, arms: list[tuple[str, int | None]]) -> str | None:
    """Why a check presupposing `mechanism` is not testable on `f`'s substrate, over its arms
    (each with the level the check reads it at), or None where the mechanism is there."""
    if mechanism == "weight_read_step":
        return _speed_reason(f, arms)
    if mechanism == "power_near_cap":
        return _power_reason(f, arms) or _speed_reason(f, arms)
    return None


def step_costs(f: Finding) -> list[tuple[str, Figure | None]]:
    """Every arm's step cost, in the study's order: the report's precondition line."""
    return [(a.name, step_cost(f, a.name)) for a in f.study.arms]


def precondition_line(f: Finding) -> str:
    """One line: each speculative arm's step in decodes and where the figure came from."""
    m = mechanisms()["weight_read_step"]
    parts = []
    for arm, cost in step_costs(f):
        a = _arm(f, arm)
        if a.resolved.speculative is None:
            continue
        parts.append(f"{arm} {cost.value:.2f} ({cost.where})" if cost else f"{arm} unknown")
    if not parts:
        return ""
    absent = any(c is None or c.value > m["max_step_decodes"] for _, c in step_costs(f))
    return (f"Precondition, {m['words']}: a speculative step costs at most "
            f"{m['max_step_decodes']:g} one-token decodes (article B's: 1.28-1.32). Measured, "
            f"at each arm's lowest level: {'; '.join(parts)}. "
            + ("Speed checks are not testable here: the mechanism is absent or unmeasured."
               if absent else "The mechanism is there."))


# --------------------------------------------------------------------------- memory


def _layers(folder: str | None) -> int | None:
    if not folder:
        return None
    path = Path(folder) if Path(folder).is_absolute() else project_root() / folder
    try:
        config = json.loads((path / "config.json").read_text())
        # the embedded drafters keep their shape under their own key (embedded/checkpoint.py)
        return int(config.get("specrepro_drafter", config)["num_hidden_layers"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


def _drafter_folder(a) -> str | None:
    p = a.resolved
    if p.drafter is not None:
        return p.drafter.id
    spec = p.speculative
    if spec is None or spec.method in ("ngram", "none"):
        return None
    return spec.model or f"{p.model.id}/{spec.method}"


def _pool(f: Finding, arm: str) -> float | None:
    vals = f.cells.filter(pl.col("arm") == arm)["kv_pool_tokens"].drop_nulls()
    return float(vals.mean()) if len(vals) else None


def kv_note(f: Finding, arm: str, base: str) -> tuple[bool, str]:
    """What the pool's fall comes from: (whether the drafters' cached layers beside the
    target's explain it, within 0.02 of the measured ratio, so the article's mechanism, a
    small drafter's bytes, is absent; the words: the layers, the ratio they predict against
    the measured one, the article's drafter beside it); (False, '') where the layer counts
    are unknown."""
    a, b = _arm(f, arm), _arm(f, base)
    if a is None or b is None:
        return False, ""
    target = _layers(a.resolved.model.id)
    la, lb = _layers(_drafter_folder(a)), _layers(_drafter_folder(b)) or 0
    pa, pb = _pool(f, arm), _pool(f, base)
    if not target or la is None or not pa or not pb:
        return False, ""
    predicted, measured = (target + lb) / (target + la), pa / pb
    head = (f"{arm}'s drafter caches {la} layer{'s' if la != 1 else ''} beside the target's "
            f"{target} ({base}'s {lb}): equal KV bytes a layer predict a pool of "
            f"x{predicted:.2f}, measured x{measured:.2f}")
    article = ("the article's drafter is a small share of a 27B target's bytes (its pool fell "
               "46 % under vLLM 0.32.0, and 0.33.0 recovered it to 1,122,468 tokens)")
    if abs(measured - predicted) <= 0.02:
        words = mechanisms()["kv_by_bytes"]["words"]
        return True, (f"{words} absent: the pool falls by layer count here ({head}), not by "
                      f"a small drafter's bytes; {article}")
    return False, f"not by layer count alone ({head}); {article}"
