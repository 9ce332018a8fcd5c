"""Verdict rules as data: what each check of a claim compares, and when it holds.

Design:
- A notebook's claim (claims.yaml) is judged by a list of checks, each a `Rule` read from
  the entry's `checks:`. A rule names the article's own arm and metric, the measured side
  (`a`, and for comparisons `b`: a study arm at a workload, concurrency and temperature), the
  direction the article found (`higher`, `lower`, or `same`) and a magnitude band. The
  numbers compared with come from published/*.csv (one home for the articles' figures);
  a rule never types a published number.
- Kinds:
  - `compare`: the relative change of `metric` from b to a, in percent, measured against
    the article's change between the same arms (claims.yaml `arms` maps study arms to
    published ones; a side's `article_arm` overrides where the article measured another
    arm for the same point). `band.at_least`/`band.at_most` bound the measured change as a
    share of the article's (at_least 0.5: "at least half the article's effect");
    `band.within` bounds |change| in percent for `same`.
  - `spread`: the relative range (max - min) / mean of `metric` over repeats, a's against
    b's: a ratio, `higher` when a spreads more.
  - `straddle`: a's runs fall on both sides of b's mean (its worst run below, its best above).
  - `gate`: a gate the article declared before its run (published/gates.csv, by id),
    evaluated as declared.
- Noise (analysis/verdict/noise.py, whose functions also print the rule): resolution before
  direction. Where the measured noise band is at least the article's effect (a "same"
  claim's own band, a gate's demanded gain) the check is "not resolvable here", with the
  repeats that would resolve it; else a difference inside the band is a tie, never a win.
  With one run on both sides no spread was measured, and the rule text says so.
- Testability: `not_testable` lists the engines (the engines of a rule's arms) on which a
  rule cannot be tested and why (a memory ceiling where memory is set by a utilization
  flag); an entry's optional `device: cpu | cuda` limits it to arms measured on that device
  (`finding.cuda_arms`: `--device cuda`, or a launched vLLM or SGLang), so a reason true of
  the embedded engine on a CPU is not given where it ran on the H200; `needs: power` makes
  it untestable where no watts were measured, `needs: drafter_change` where the changed
  drafter proposed exactly what the baseline's did (the engine ignored the change). A rule
  whose arm, workload or level the study did not measure is not testable either, with that
  reason.
- Mechanism: `mechanism` names what the check presupposes about the substrate
  (analysis/verdict/mechanisms.yaml: `weight_read_step` for speed, `power_near_cap` for energy,
  `kv_by_bytes` for memory); analysis/verdict/mechanism.py measures it per arm and level, and a
  check whose mechanism is absent or unmeasured is not testable there. A check of a speed
  or energy metric must name one (`SPEED_METRICS`), so none is judged without it.
- Validation happens on load (`parse_checks`), so a typo fails naming the notebook, the
  check and the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specrepro import findings
from specrepro.analysis.finding.cell_key import CELL, LEVEL
from specrepro.analysis.verdict import noise

OUTCOMES = ("holds", "holds in direction only", "does not hold", "not resolvable here",
            "not testable here")
# "not resolvable here": the suite's noise is at least the effect the article reports, so no
# measurement of this size could tell it (analysis/verdict/noise.py, `resolution`); never a failure
SYMBOLS = {"holds": "✓", "holds in direction only": "◐", "does not hold": "✗",
           "not resolvable here": "≈", "not testable here": "–"}
UNTESTED = ("not resolvable here", "not testable here")  # outcomes that test nothing
KINDS = ("compare", "spread", "straddle", "gate")
DIRECTIONS = ("higher", "lower", "same")
LEVELS = ("lowest", "highest", "any")
# `needs:` "power": untestable without measured watts; "drafter_change": untestable where the
# challenger's drafter proposed exactly what the baseline's did (analysis/verdict/same_drafts.py)
NEEDS = ("power", "drafter_change")
# what a check presupposes of the substrate (analysis/verdict/mechanisms.yaml has one entry each)
MECHANISMS = ("weight_read_step", "power_near_cap", "kv_by_bytes")
# metrics whose checks must name a mechanism: they move with the step, not with the drafts
SPEED_METRICS = frozenset({"agg_tok_s", "step_ms", "tokens_per_joule"})
DEVICES = ("cpu", "cuda")  # a not_testable / cannot_test entry's `device` (not `on`: YAML 1.1 reads it as true)

# The measured metrics a rule may name (each a column of the cells table, in the article's
# metric name); their words, units and scale are analysis/finding/tables.py's NAMES.
METRICS = ("agg_tok_s", "acceptance_length", "draft_acceptance_rate", "step_ms",
           "kv_pool_tokens", "tokens_per_joule", "peak_mem_mib")


class RuleError(ValueError):
    """A check in claims.yaml is malformed; the message names the notebook, check and key."""


@dataclass(frozen=True)
class Side:
    """One measured point of a rule and the article's twin of it."""

    arm: str                          # a study arm name
    workload: str | None = None       # a study workload; None: the finding's only one
    concurrency: int | str = "lowest"  # a level, or lowest / highest / any (arm-level facts)
    temperature: float | None = None  # None: the finding's only temperature
    article_arm: str | None = None    # None: claims.yaml `arms` maps `arm`


@dataclass(frozen=True)
class Band:
    at_least: float | None = None  # measured effect >= at_least x the article's
    at_most: float | None = None   # measured effect <= at_most x the article's
    within: float | None = None    # |measured change| <= within (percent), for `same`

    def text(self) -> str:
        parts = []
        if self.at_least is not None:
            parts.append(f"at least {self.at_least:g} of the article's effect")
        if self.at_most is not None:
            parts.append(f"at most {self.at_most:g} of it")
        if self.within is not None:
            parts.append(f"within ±{self.within:g}%")
        return " and ".join(parts)


@dataclass(frozen=True)
class NotTestable:
    engines: tuple[str, ...]
    why: str
    device: str | None = None  # "cpu" | "cuda": only where the rule's arms ran there; None: anywhere


@dataclass(frozen=True)
class Rule:
    claim: str
    kind: str = "compare"
    metric: str | None = None
    a: Side | None = None
    b: Side | None = None
    direction: str = "higher"
    band: Band = field(default_factory=Band)
    gate: str | None = None           # a published/gates.csv gate id (kind gate)
    needs: str | None = None          # one of NEEDS
    mechanism: str | None = None      # one of MECHANISMS: what the substrate must show
    not_testable: tuple[NotTestable, ...] = ()

    def text(self) -> str:
        """The rule as the reader sees it beside the verdict."""
        if self.kind == "gate":
            return ("the article's gate, evaluated as it declared it; a gain it demands is "
                    "not resolvable where the noise band is at least that gain, and not met "
                    "inside the band")
        if self.kind == "straddle":
            return ("holds when a's worst run is below b's mean and its best run above it; "
                    "does not hold when all its runs are on one side")
        if self.kind == "spread":
            return ("relative range (max - min) / mean over repeats; holds when the "
                    f"ratio is {'above' if self.direction == 'higher' else 'below'} 1")
        if self.direction == "same":
            return noise.same_rule_text(self.band.within)
        word = "above" if self.direction == "higher" else "below"
        band = self.band.text()
        return (f"direction: {word} the other arm; "
                + (f"holds with {band}, holds in direction only with less; " if band else "")
                + "not resolvable here where the noise band (run-to-run, A/A, across "
                "prompts) is at least the article's effect; else a difference inside the band "
                "is a tie, which does not hold")


# --------------------------------------------------------------------------- loading

_SIDE_KEYS = {*CELL, "article_arm"}  # a side names an arm at a level, as the cells do
_RULE_KEYS = {"claim", "kind", "metric", "a", "b", "direction", "band", "gate", "needs",
              "mechanism", "not_testable"}


def _where(nb: str, i: int, key: str = "") -> str:
    return f"{findings.shown(nb)}: checks[{i}]" + (f".{key}" if key else "")


def _mapping(raw: Any, keys: set[str], where: str, what: str = "a mapping") -> dict:
    """`raw` as a mapping of only `keys`, else the error naming where and what was found."""
    if not isinstance(raw, dict):
        raise RuleError(f"{where}: expected {what}, found {raw!r}")
    unknown = set(raw) - keys
    if unknown:
        raise RuleError(f"{where}: unknown keys {sorted(unknown)}; expected some of "
                        f"{sorted(keys)}")
    return raw


def _side(raw: Any, nb: str, i: int, key: str, inherit: Side | None = None) -> Side:
    where = _where(nb, i, key)
    _mapping(raw, _SIDE_KEYS, where, "a mapping with 'arm'")
    base = {} if inherit is None else {k: getattr(inherit, k) for k in LEVEL}
    merged = {**base, **raw}
    if not isinstance(merged.get("arm"), str):
        raise RuleError(f"{where}.arm: expected a study arm name, found {merged.get('arm')!r}")
    level = merged.get("concurrency", "lowest")
    if not ((isinstance(level, int) and not isinstance(level, bool) and level >= 1)
            or level in LEVELS):
        raise RuleError(f"{where}.concurrency: expected a positive integer or one of "
                        f"{list(LEVELS)}, found {level!r}")
    temp = merged.get("temperature")
    if temp is not None and (isinstance(temp, bool) or not isinstance(temp, int | float)):
        raise RuleError(f"{where}.temperature: expected a number, found {temp!r}")
    return Side(arm=merged["arm"], workload=merged.get("workload"), concurrency=level,
                temperature=None if temp is None else float(temp),
                article_arm=merged.get("article_arm"))


def _band(raw: Any, nb: str, i: int) -> Band:
    if raw is None:
        return Band()
    where = _where(nb, i, "band")
    if not isinstance(raw, dict) or set(raw) - {"at_least", "at_most", "within"}:
        raise RuleError(f"{where}: expected a mapping of at_least / at_most / within, "
                        f"found {raw!r}")
    for k, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
            raise RuleError(f"{where}.{k}: expected a number >= 0, found {v!r}")
    return Band(**{k: float(v) for k, v in raw.items()})


def parse_check(raw: Any, nb: str, i: int, known_arms: set[str], known_gates: set[str],
                study_arms: set[str] | None = None) -> Rule:
    """One `checks:` entry, validated."""
    where = _where(nb, i)
    _mapping(raw, _RULE_KEYS, where)
    if not isinstance(raw.get("claim"), str) or not raw["claim"].strip():
        raise RuleError(f"{where}.claim: expected the sub-claim in words")
    kind = raw.get("kind", "compare")
    if kind not in KINDS:
        raise RuleError(f"{where}.kind: expected one of {list(KINDS)}, found {kind!r}")
    direction = raw.get("direction", "higher")
    if direction not in DIRECTIONS:
        raise RuleError(f"{where}.direction: expected one of {list(DIRECTIONS)}, "
                        f"found {direction!r}")
    needs = raw.get("needs")
    if needs not in (None, *NEEDS):
        raise RuleError(f"{where}.needs: expected one of {list(NEEDS)} or nothing, "
                        f"found {needs!r}")
    mechanism = raw.get("mechanism")
    if mechanism not in (None, *MECHANISMS):
        raise RuleError(f"{where}.mechanism: expected one of {list(MECHANISMS)} or nothing, "
                        f"found {mechanism!r}")
    nts = []
    for j, nt in enumerate(raw.get("not_testable") or []):
        if (not isinstance(nt, dict) or not {"engines", "why"} <= set(nt) <= {"engines", "why", "device"}
                or not isinstance(nt["engines"], list) or not isinstance(nt["why"], str)):
            raise RuleError(f"{where}.not_testable[{j}]: expected {{engines: [...], why: ..., "
                            f"device: cpu | cuda (optional)}}, found {nt!r}")
        if nt.get("device") not in (None, *DEVICES):
            raise RuleError(f"{where}.not_testable[{j}].device: expected one of {list(DEVICES)} "
                            f"or nothing, found {nt['device']!r}")
        nts.append(NotTestable(tuple(nt["engines"]), " ".join(nt["why"].split()),
                               nt.get("device")))
    rule_kw: dict[str, Any] = {"claim": " ".join(raw["claim"].split()), "kind": kind,
                               "direction": direction, "needs": needs, "mechanism": mechanism,
                               "not_testable": tuple(nts), "band": _band(raw.get("band"), nb, i)}
    if kind == "gate":
        gate = raw.get("gate")
        if gate not in known_gates:
            raise RuleError(f"{where}.gate: {gate!r} is not a gate of published/gates.csv "
                            f"({sorted(known_gates)})")
        rule_kw["gate"] = gate
        return Rule(**rule_kw)
    metric = raw.get("metric")
    if metric not in METRICS:
        raise RuleError(f"{where}.metric: expected one of {list(METRICS)}, found {metric!r}")
    a = _side(raw.get("a"), nb, i, "a")
    b = _side(raw.get("b"), nb, i, "b", inherit=a) if "b" in raw else None
    if b is None:
        raise RuleError(f"{where}.b: a {kind} check compares two sides; 'b' is missing")
    for key, side in (("a", a), ("b", b)):
        if study_arms is not None and side.arm not in study_arms:
            raise RuleError(f"{where}.{key}.arm: {side.arm!r} is not an arm of this entry's "
                            f"`arms` ({sorted(study_arms)})")
        if side.article_arm is not None and side.article_arm not in known_arms:
            raise RuleError(f"{where}.{key}.article_arm: {side.article_arm!r} is not in "
                            "published/arms.csv")
    if mechanism is None and metric in SPEED_METRICS:
        raise RuleError(f"{where}.mechanism: a check of {metric!r} must name the "
                        f"mechanism it presupposes (one of {list(MECHANISMS)})")
    return Rule(**rule_kw, metric=metric, a=a, b=b)


def parse_checks(raw: Any, nb: str, known_arms: set[str], known_gates: set[str],
                 study_arms: set[str] | None = None) -> tuple[Rule, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RuleError(f"{findings.shown(nb)}: checks: expected a list, found "
                        f"{type(raw).__name__}")
    return tuple(parse_check(r, nb, i, known_arms, known_gates, study_arms)
                 for i, r in enumerate(raw))
