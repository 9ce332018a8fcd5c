"""What each finding compares against the articles: its `claims.yaml`, loaded and checked.

Design:
- One entry per finding, in its folder (`findings/<id>/claims.yaml`, specrepro/findings.py;
  the keys are documented in findings/README.md): its title, the article's claim in a
  sentence, the map from the study's arm names to published arm ids (and workloads to
  published workloads; a workload standing in for a published one, data.STANDS_FOR, maps
  by itself), which of two published values to compare where an article prints two, and the article claims the
  embedded engine cannot test (docs/design.md) with the reason; an entry's `device: cpu | cuda`
  says it only where the cells were measured on that device (the default suite's CPU
  reasons, such as 8 request slots or the host's resident memory, are wrong on the H200).
- Data, not code: a suite that renames arms adds its names to `arms` here; nothing in the
  notebooks or the table functions names a published arm.
- `published_temperature`: the temperature of the article's figures a notebook compares
  against, whatever temperature a suite measures at (the embedded suites run notebook 01
  greedy, article A's sweep is at T=0.7). Unset: a published figure matches only a measured
  level at its own temperature. Where the two differ, tables and figures say so.
- `checks`: the verdict rules, one per sub-claim (analysis/verdict/rules.py says what a rule is;
  analysis/verdict/verdicts.py evaluates them), validated here on load.
- A `cannot_test` entry may name the published `sources` that quote it (article A's "MTP
  ... spreads 18 to 21 across three days"): `Claims.comparable` sets those rows aside, so
  the verdicts, the overlay and the figures never compare a measurement with a claim the
  notebook says it cannot test. Only an entry untestable on every substrate may (no
  `unless`, no `device`).
- Every published arm id is checked against `published/arms.csv` on load, so a typo fails
  here, naming the notebook and the id; every quoted source against the published rows.
- The entries are the findings of the registry (`findings/findings.yaml`), one each: a
  registered finding without its claims file, or a finding's folder the registry does not
  list, fails on load naming the id and both files (`findings.check_folders`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import polars as pl
import yaml

from specrepro import findings
from specrepro.analysis.verdict.rules import DEVICES, Rule, parse_checks
from specrepro.data import STANDS_FOR
from specrepro.published import load_arms, load_gates, load_published


class ClaimsError(ValueError):
    """claims.yaml names something that does not exist; the message says where."""


@dataclass(frozen=True)
class Untestable:
    claim: str
    why: str
    unless: str | None = None  # "power": testable where the cells carry measured watts
    device: str | None = None  # "cpu" | "cuda": said only where the cells were measured there
    sources: tuple[str, ...] = ()  # published `source`s quoting it: never compared with


@dataclass(frozen=True)
class Preference:
    """Where two published values exist, compare against the one whose source contains this."""

    arm: str
    metric: str
    source: str


@dataclass(frozen=True)
class Claims:
    notebook_id: str
    title: str
    article: str
    claim: str
    arms: dict[str, str] = field(default_factory=dict)  # study arm -> published arm id
    workloads: dict[str, str] = field(default_factory=dict)  # study workload -> published
    prefer: tuple[Preference, ...] = ()
    cannot_test: tuple[Untestable, ...] = ()
    published_temperature: float | None = None  # None: match the measured temperature
    checks: tuple[Rule, ...] = ()  # the verdict rules (analysis/verdict/rules.py)

    def compared_temperature(self, measured: float | None) -> float | None:
        """The temperature of the published figures compared with a level measured at
        `measured`."""
        return measured if self.published_temperature is None else self.published_temperature

    def temperature_note(self, measured: list[float]) -> str:
        """'article at T=0.7, measured at T=0' where the compared temperatures differ from
        the measured ones; '' where they are the same."""
        measured = sorted({t for t in measured if t is not None})
        if self.published_temperature is None or measured == [self.published_temperature]:
            return ""
        at = ", ".join(f"T={t:g}" for t in measured) or "n/a"
        return f"article at T={self.published_temperature:g}, measured at {at}"

    def comparable(self, rows: pl.DataFrame) -> pl.DataFrame:
        """Published rows less those quoting a claim this notebook cannot test (a
        `cannot_test` entry's `sources`): such a figure is never set against a measurement."""
        quoted = [q for u in self.cannot_test for q in u.sources]
        return rows.filter(~pl.col("source").is_in(quoted)) if quoted else rows

    def set_aside(self, rows: pl.DataFrame) -> str:
        """' but a claim not testable here: <claim>' for the cannot_test claims `rows` quote
        ('' where they quote none)."""
        have = set(rows["source"].to_list())
        hit = [u.claim for u in self.cannot_test if have & set(u.sources)]
        return f" but a claim not testable here: {'; '.join(hit)}" if hit else ""

    def published_workload(self, workload: str) -> str:
        """The published workload a measured one is compared with: the entry's `workloads`,
        else the one it stands in for (data.STANDS_FOR: prose for the essays)."""
        return self.workloads.get(workload, STANDS_FOR.get(workload, workload))


@functools.cache
def all_claims() -> dict[str, Claims]:
    """Every finding's claims, in the registry's order."""
    raw = registered()
    known = set(load_arms()["arm"].to_list())
    gates = set(load_gates()["gate"].to_list())
    sources = set(load_published()["source"].to_list())
    out = {}
    for nb, entry in raw.items():
        for study_arm, pub in entry.get("arms", {}).items():
            if pub not in known:
                raise ClaimsError(
                    f"{findings.shown(nb)}: arms.{study_arm}: published arm {pub!r} is not in "
                    "published/arms.csv"
                )
        out[nb] = Claims(
            notebook_id=nb,
            title=entry["title"],
            article=entry["article"],
            claim=" ".join(entry["claim"].split()),
            arms=dict(entry.get("arms", {})),
            workloads=dict(entry.get("workloads", {})),
            prefer=tuple(Preference(**p) for p in entry.get("prefer", [])),
            cannot_test=tuple(_untestable(nb, i, u, sources)
                              for i, u in enumerate(entry.get("cannot_test", []))),
            published_temperature=_temperature(nb, entry.get("published_temperature")),
            checks=parse_checks(entry.get("checks"), nb, known, gates,
                                set(entry.get("arms", {}))),
        )
    return out


def registered() -> dict[str, dict]:
    """Each registered finding's claims file, read: the registry's findings and no other
    folder (`findings.check_folders`), or a ClaimsError naming the file and the registry."""
    try:
        findings.check_folders(findings.IDS)
    except findings.FindingsError as err:
        raise ClaimsError(f"{err} (the registry: {findings.REGISTRY})") from None
    raw = {}
    for nb in findings.IDS:
        entry = yaml.safe_load(findings.claims_path(nb).read_text(encoding="utf-8"))
        if not isinstance(entry, dict):
            raise ClaimsError(f"{findings.shown(nb)}: expected a mapping (title, article, "
                              f"claim, ...), found {type(entry).__name__}")
        raw[nb] = entry
    return raw


def _untestable(nb: str, i: int, raw, published: set[str] = frozenset()) -> Untestable:
    """One `cannot_test` entry: claim and why, optional `unless: power` and `device: cpu | cuda`,
    and `sources`: the published sources (published/*.csv `source`, exactly) that quote it."""
    where = f"{findings.shown(nb)}: cannot_test[{i}]"
    if (not isinstance(raw, dict) or not {"claim", "why"} <= set(raw)
            or not set(raw) <= {"claim", "why", "unless", "device", "sources"}):
        raise ClaimsError(f"{where}: expected {{claim, why, unless: power (optional), device: cpu "
                          f"| cuda (optional), sources (optional)}}, found {raw!r}")
    quoted = raw.get("sources") or []
    if not isinstance(quoted, list) or not all(isinstance(q, str) for q in quoted):
        raise ClaimsError(f"{where}.sources: expected a list of published sources, found "
                          f"{quoted!r}")
    if unknown := [q for q in quoted if q not in published]:
        raise ClaimsError(f"{where}.sources: no published row has the source {unknown[0]!r}")
    if quoted and (raw.get("unless") or raw.get("device")):  # set aside everywhere, or not
        raise ClaimsError(f"{where}.sources: only a claim untestable on every substrate (no "
                          "unless, no device) sets its quotes aside")
    if raw.get("unless") not in (None, "power"):
        raise ClaimsError(f"{where}.unless: expected 'power' or nothing, found {raw['unless']!r}")
    if raw.get("device") not in (None, *DEVICES):
        raise ClaimsError(f"{where}.device: expected one of {list(DEVICES)} or nothing, found "
                          f"{raw['device']!r}")
    return Untestable(raw["claim"], raw["why"], raw.get("unless"), raw.get("device"),
                      tuple(quoted))


def _temperature(nb: str, value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ClaimsError(f"{findings.shown(nb)}: published_temperature: expected a "
                          f"temperature >= 0 or nothing, found {value!r}")
    return float(value)


def claims_for(notebook_id: str) -> Claims:
    claims = all_claims()
    if notebook_id not in claims:
        raise ClaimsError(
            f"no claims for finding {notebook_id!r} (findings/{notebook_id}/claims.yaml); the "
            f"registry {findings.REGISTRY} lists {', '.join(claims)}"
        )
    return claims[notebook_id]
