"""The substrates in every report: the article's values, then each check of the claim
judged by the same rule on every suite that stored results for the notebook.

Design:
- The substrates are data: `SUITES` names their params files, in the table's order: the
  stand-in on the real engines (params/h100-standin.yaml: the articles' regime, a decode step
  that reads 22.5 GB), the small target on the real engines on the H200
  (params/h200-engines.yaml), the embedded engine on the same H200
  (params/h200-embedded.yaml), and the embedded engine on the CPU (params/default.yaml, the
  suite `make all` renders). A suite whose target is not the small one names it after the
  engines and card ("vLLM 0.26.0 on 1x NVIDIA H100, the stand-in"). A constant, not
  discovered from params/*.yaml: a substrate with
  nothing stored for a notebook must still be a column ("not measured", never a number),
  which discovery would drop, and the suites with no committed results (h200.yaml,
  rtx-pro-6000.yaml, dgx-spark-gb10.yaml, smoke.yaml) would add columns of nothing.
- Replay only: each suite's study for the notebook is resolved from its params file (no
  notebook overrides) and its stored cells read from the suite's own results_dir
  (`finding.stored_cells`, cell identities and all); nothing is measured, no engine started
  (analysis imports neither the pipeline nor the harness). A suite that does not bind the
  notebook, or stored nothing that matches its study, is "not measured" with the reason; one
  with declared cells missing is "partial: N of M cells", judged on what is stored (the
  checks that need the missing cells are not testable there, as in its own report).
- The same checks and rules: `verdicts.verdict(finding, claims)` on each substrate, so a
  column says what that suite's own report says; the article's checks only (substitute
  gates are each suite's own and do not decide a verdict).
- Names: a measured substrate is named as its summary names what measured it
  (`summary.engine_names` on `summary.card`: "vLLM 0.26.0 on 1x NVIDIA H200"); a substrate
  that measured nothing by its role in `SUITES`. The teaching line uses a shorter tag
  ("vLLM on the H200").
- A cell: the check's measured value compacted to its effect and the level it was taken at
  (the runs behind it are in that substrate's own report), its verdict as symbol and word.
- The teaching line is computed, never typed: the finding's verdict per substrate, then each
  check whose tested verdicts differ between substrates ("holds on X, does not hold on Y"),
  with its effect in the article and on each substrate; checks not testable somewhere are
  counted per substrate.
- Output: `compare(nb)` gives a `Comparison` (its `as_dict()` travels as the report's output
  metadata `{"specrepro": {"substrates": ...}}` for the index), `.table()` a `tables.Table`,
  `substrates_html()` the report's table (`<table id="substrates">`).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from specrepro.analysis.finding import tables
from specrepro.analysis.finding.finding import (
    Finding,
    FindingError,
    from_store,
    missing_folders,
    project_root,
    stored_cells,
)
from specrepro.analysis.render.summary import card, engine_names, engine_words, measured_substrate
from specrepro.analysis.render.summary import partial as partial_text
from specrepro.analysis.verdict import host_bound
from specrepro.analysis.verdict.claims import Claims, claims_for
from specrepro.analysis.verdict.rules import UNTESTED
from specrepro.analysis.verdict.verdicts import CheckResult, coverage_text, verdict
from specrepro.params import ParamsError, load_suite, resolve_study


@dataclass(frozen=True)
class SuiteRef:
    params: str  # relative to the project root
    role: str    # what it stands for where it measured nothing
    target: str = ""  # said after the engines and card where it is not the small target


# The stand-in first: its target's step is a weight read, the articles' regime, so its
# verdicts are the answer; then the small target on the real engines and the embedded engine
# (host-bound on the H200), and the CPU. The stand-in's cells are on the H100: no H200 was
# lent for them (params/h100-standin.yaml); params/h200-standin.yaml takes this place once
# it has stored results.
SUITES = (SuiteRef("params/h100-standin.yaml",
                   "the stand-in on the real engines (vLLM, SGLang), 1x NVIDIA H100",
                   "the stand-in"),
          SuiteRef("params/h200-engines.yaml", "the real engines (vLLM, SGLang) on 1x NVIDIA H200"),
          SuiteRef("params/h200-embedded.yaml", "the embedded engine on 1x NVIDIA H200"),
          SuiteRef("params/default.yaml", "the embedded engine on CPU"))
NOT_MEASURED = "not measured"


@dataclass
class Substrate:
    """One suite's replay for a notebook: its name, how much it stored, its checks."""

    ref: SuiteRef
    name: str
    tag: str
    status: str = NOT_MEASURED   # "measured" | "partial" | "not measured"
    why: str = ""                # why not measured, or the partial store in words
    cells: int = 0
    declared: int = 0
    description: str = ""        # the summary's full substrate line
    outcome: str = ""
    symbol: str = ""
    checks: list[CheckResult] = field(default_factory=list)
    busy: str = ""               # how busy its device was (analysis/verdict/host_bound.py), in words

    @property
    def coverage(self) -> str:
        """The verdict with how much of the claim was tested ('holds on 1 of 4 checks (...)')."""
        return coverage_text(self.outcome, [(c.outcome, c.reason) for c in self.checks]
                             ) if self.outcome else ""

    @property
    def noise(self) -> str:
        """The widest noise band its checks met ('±58.7%'), or why none was measured."""
        bands = [float(m.group(1)) for c in self.checks
                 if (m := _BAND.match(c.noise or ""))]
        if bands:
            return f"±{max(bands):.1f}%"
        return "not measured" if self.checks else ""

    @property
    def header(self) -> str:
        if self.status == "partial":
            return f"partial: {self.cells} of {self.declared} cells"
        if self.status == NOT_MEASURED:
            return NOT_MEASURED
        return f"{self.cells} cells"

    def as_dict(self) -> dict:
        return {"params": self.ref.params, "name": self.name, "tag": self.tag,
                "status": self.status, "header": self.header, "why": self.why,
                "cells": self.cells, "declared": self.declared, "outcome": self.outcome,
                "symbol": self.symbol, "checks": [c.symbol for c in self.checks],
                "coverage": self.coverage,
                "noise": self.noise, "busy": self.busy}


def replay(params_file: str | Path, notebook_id: str) -> Finding:
    """The notebook's finding from a suite's stored results, never measuring; FindingError
    (with the reason) where the suite does not bind it or stored nothing that matches."""
    path = Path(params_file)
    path = path if path.is_absolute() else project_root() / path
    suite = load_suite(path)
    if notebook_id not in suite.notebooks:
        raise FindingError(f"{path.name} does not bind {notebook_id}")
    try:
        study = resolve_study(suite, notebook_id)
    except ParamsError as err:
        raise FindingError(f"{path.name} does not resolve {notebook_id}: {err}") from err
    store = suite.results_path / study.name / suite.run_id
    cells = stored_cells(store, study)
    if not cells.height:
        gone = sorted(missing_folders(study, project_root()))
        raise FindingError(
            f"stored cells cannot be matched here: {', '.join(gone)} do not exist "
            "(`specrepro export-drafters` writes build/engine-drafters/)" if gone and store.is_dir()
            else f"no stored results for {study.name} in {path.name}'s results")
    return from_store(notebook_id, study, suite, store, cells)


def _tag(f: Finding, target: str = "") -> str:
    words = [{"embedded": "the embedded engine"}.get(e, engine_words(e)) for e in
             dict.fromkeys(f.cells["engine"].drop_nulls().to_list())]
    where = card(f)
    # the card's model only ("1x NVIDIA H100 80GB HBM3" -> "the H100"): the name says the rest
    where = ("the " + where.split("x ", 1)[1].replace("NVIDIA ", "").split()[0]
             if not where.startswith("CPU") else "the CPU")
    return f"{' and '.join(words)} on {where}" + (f" ({target})" if target else "")


def substrate(ref: SuiteRef, notebook_id: str, claims: Claims) -> Substrate:
    """One suite replayed and judged (or why it is not measured)."""
    try:
        f = replay(ref.params, notebook_id)
    except FindingError as why:
        return Substrate(ref, ref.role, ref.role.replace("1x NVIDIA ", "the "), why=str(why))
    v = verdict(f, claims)
    name = f"{', '.join(engine_names(f)) or 'no engine'} on {card(f)}" + (
        f", {ref.target}" if ref.target else "")
    return Substrate(ref, name, _tag(f, ref.target), "partial" if f.missing else "measured",
                     partial_text(f), f.declared - f.missing, f.declared, measured_substrate(f),
                     v.outcome, v.symbol, [c for c in v.checks if not c.substitute],
                     _busy_words(f))


def _busy_words(f: Finding) -> str:
    """How busy the substrate's device was over its arms, short ('GPU 2-5% busy (profiled)');
    each report's substrate line says where each figure was measured."""
    got: dict[tuple[str, bool], list[float]] = {}
    for a in f.study.arms:
        b = host_bound.busy(f, a.name)
        if b is not None:
            got.setdefault((b.device, b.where.startswith("profiled")), []).append(b.share)
    words = []
    for (device, profiled), shares in got.items():
        lo, hi = round(100 * min(shares)), round(100 * max(shares))
        words.append(f"{device} {lo}{f'-{hi}' if hi != lo else ''}% busy"
                     + (" (profiled)" if profiled else ""))
    return "; ".join(words) or "busy share not measured"


_WORDS = {"not testable here": "is not testable"}
_BAND = re.compile(r"±([0-9.]+)%")
_LEVEL = re.compile(r"\b(stream|streams|T=)")


def compact(text: str) -> str:
    """A check's value in short: its text without the parenthesised runs, keeping the level
    it was taken at ('-25.8% (994 tok/s ...; 1 stream, T=0)' -> '-25.8% (1 stream, T=0)')."""
    if not text or text.startswith("not printed"):
        return "not printed" if text else ""
    out, depth, inner, levels = [], 0, [], []
    for ch in text:
        if ch == "(":
            depth += 1
            if depth == 1:
                inner = []
                continue
        elif ch == ")" and depth:
            depth -= 1
            if depth == 0:
                last = "".join(inner).split("; ")[-1]
                if _LEVEL.search(last):
                    levels.append(last)
                continue
        (inner if depth else out).append(ch)
    head = re.sub(r"\s+", " ", "".join(out)).strip().rstrip(";,")
    return head + (f" ({levels[-1]})" if levels and levels[-1] not in head else "")


def why_short(c: CheckResult) -> str:
    """A not-testable check's reason in a few words ('16 streams not measured')."""
    if c.outcome != "not testable here" or not c.reason:
        return ""
    m = re.search(r"(\d+ streams?), has no successful measurement", c.reason)
    if m:
        return f"{m.group(1)} not measured"
    text = re.split(r"; | \(", c.reason)[0]
    return text if len(text) <= 90 else text[:text.rfind(" ", 0, 88)] + "…"


def measured_cell(c: CheckResult) -> str:
    """A check's measured value for the table: compact, or 'n/a' where nothing stands."""
    return compact(c.measured) or "n/a"


def _effect(c: CheckResult | None) -> str:
    """A check's measured effect for the teaching line: its leading change in %, else its
    compact value."""
    if c is None:
        return ""
    m = re.match(r"^[+-]?[\d,.]+%", c.measured or "")
    return m.group(0) if m else compact(c.measured)


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


@dataclass
class Comparison:
    notebook_id: str
    claims: Claims
    substrates: list[Substrate]

    @property
    def measured(self) -> list[Substrate]:
        return [s for s in self.substrates if s.status != NOT_MEASURED]

    def check(self, s: Substrate, i: int) -> CheckResult | None:
        return s.checks[i] if s.status != NOT_MEASURED and i < len(s.checks) else None

    def article(self, i: int) -> str:
        texts = [c.article for s in self.measured if (c := self.check(s, i)) and c.article]
        return texts[0] if texts else ""

    def _seen(self, i: int) -> tuple[dict[str, list[Substrate]], list[Substrate]]:
        """One check's measured substrates by tested outcome, and those where it is untested."""
        seen, untested = {}, []
        for s in self.measured:
            c = self.check(s, i)
            if c is None or c.outcome in UNTESTED:
                untested.append(s)
            else:
                seen.setdefault(c.outcome, []).append(s)
        return seen, untested

    def _effects(self, i: int, seen: dict[str, list[Substrate]]) -> str:
        art = _effect(CheckResult("", "", measured=compact(self.article(i))))
        return ", ".join(([f"{art} in the article"] if art and art != "not printed" else [])
                         + [f"{_effect(self.check(s, i))} on {s.tag}"
                            for subs in seen.values() for s in subs])

    def teaching(self) -> str:
        """What the difference between the substrates teaches, in one line, from the outcomes."""
        ms = self.measured
        gone = [s.tag for s in self.substrates if s.status == NOT_MEASURED]
        absent = f"; not measured on {_and(gone)}" if gone else ""
        if not ms:
            return f"No substrate has stored results for this finding{absent}."
        # each substrate's verdict with its coverage: a finding tested on one check of four
        # never reads as a plain "holds"
        line = "The finding " + "; ".join(
            f"on {s.tag}{' (partial)' if s.status == 'partial' else ''}: {s.coverage}"
            for s in ms) + absent + "."
        if len(ms) < 2:
            return line + " One substrate only: nothing to set beside it."
        changes, partly, nowhere = [], {}, 0
        for i, rule in enumerate(self.claims.checks):
            seen, untested = self._seen(i)
            if not seen:
                nowhere += 1
            elif len(seen) > 1:
                changes.append(f"“{rule.claim}” " + ", ".join(
                    f"{o} on {_and([s.tag for s in subs])}" for o, subs in seen.items())
                    + f" (effect {self._effects(i, seen)})")
            elif untested:
                (o, subs), = seen.items()
                partly.setdefault(_and([s.tag for s in untested]), []).append(
                    f"“{rule.claim}” ({o} on {_and([s.tag for s in subs])}: "
                    f"{self._effects(i, seen)})")
        if changes:
            line += " Verdicts that change between substrates: " + "; ".join(changes) + "."
        for where, checks in partly.items():
            line += f" Not tested on {where} only: {'; '.join(checks)}."
        if not changes and not partly and nowhere < len(self.claims.checks):
            line += " Every check has the same verdict on each substrate that tested it."
        if nowhere:
            line += (f" {nowhere} of {len(self.claims.checks)} checks are not tested (not "
                     "testable or not resolvable) on any measured substrate.")
        return line

    def table(self) -> tables.Table:
        rows = []
        for i, rule in enumerate(self.claims.checks):
            row = {"check": rule.claim, "article": compact(self.article(i))}
            for s in self.substrates:
                c = self.check(s, i)
                row[f"{s.name}: measured"] = measured_cell(c) if c else NOT_MEASURED
                row[f"{s.name}: verdict"] = (f"{c.symbol} {c.outcome}" + (
                    f" ({why_short(c)})" if why_short(c) else "")) if c else NOT_MEASURED
            rows.append(row)
        notes = tuple(f"{s.name}: {s.ref.params}, {s.header}"
                      + (f" ({s.why})" if s.why else "") for s in self.substrates)
        return tables.Table(pl.DataFrame(rows, schema={k: pl.String for k in rows[0]}
                                         if rows else None),
                            CAPTION, (*notes, "What the substrates teach: " + self.teaching()))

    def as_dict(self) -> dict:
        return {"notebook_id": self.notebook_id, "teaching": self.teaching(),
                "substrates": [s.as_dict() for s in self.substrates]}


CAPTION = ("The article's checks on each substrate: the same rules (claims.yaml) on each suite's "
           "stored results, replayed; a cell gives the measured effect and the level it was "
           "taken at (that suite's own report has the runs behind it) and the verdict")


def compare(notebook_id: str, claims: Claims | None = None, suites=SUITES) -> Comparison:
    """Every substrate of `suites` replayed and judged for one notebook."""
    claims = claims or claims_for(notebook_id)
    return Comparison(notebook_id, claims, [substrate(r, notebook_id, claims) for r in suites])


def substrate_table(notebook_id: str, suites=SUITES) -> tables.Table:
    """The checks × substrates table (article, then per substrate measured and verdict)."""
    return compare(notebook_id, suites=suites).table()


def _e(x) -> str:
    return html.escape(str(x))


def substrates_html(cmp: Comparison, own_suite: str | None = None) -> str:
    """`<table id="substrates">` with a two-row head (each substrate over its two columns),
    the verdict cells marked by outcome, and the teaching line under it."""
    head1 = "<th rowspan='2'>Check</th><th rowspan='2'>Article</th>" + "".join(
        f"<th colspan='2' class='substrate' data-status='{_e(s.status)}'>{_e(s.name)}<br><small>"
        f"{_e(s.ref.params)}: {_e(s.header)}"
        + (f"; verdict {_e(s.symbol)} {_e(s.outcome)}" if s.outcome else "") + "</small></th>"
        for s in cmp.substrates)
    head2 = "".join("<th>measured</th><th>verdict</th>" for _ in cmp.substrates)
    body = []
    for i, rule in enumerate(cmp.claims.checks):
        cells = [f"<td>{_e(rule.claim)}</td><td>{_e(compact(cmp.article(i)))}</td>"]
        for s in cmp.substrates:
            c = cmp.check(s, i)
            if c is None:
                cells.append(f"<td class='na' colspan='2' title='{_e(s.why)}'>{NOT_MEASURED}</td>")
                continue
            why = f" title='{_e(c.reason)}'" if c.reason else ""
            short = f"<br><small>{_e(why_short(c))}</small>" if why_short(c) else ""
            band = (f"<br><small class='noise'>noise {_e(c.noise)}</small>" if c.noise else "")
            cells.append(f"<td>{_e(measured_cell(c))}{band}</td><td class='verdict' "
                         f"data-outcome='{_e(c.outcome)}'{why}>{_e(c.symbol)}&nbsp;"
                         f"{_e(c.outcome)}{short}</td>")
        body.append("<tr class='substrate-check'>" + "".join(cells) + "</tr>")
    notes = [f"{s.name}: {s.description or s.why}" for s in cmp.substrates if s.status != "measured"
             or s.description]
    own = ""
    if own_suite and not any((project_root() / r.ref.params).resolve() == Path(own_suite).resolve()
                             for r in cmp.substrates):
        own = (f"<p class='substrates-own'>This report's suite ({_e(Path(own_suite).name)}) is "
               "not one of these substrates; its verdict is the summary above.</p>")
    foot = "".join(f"<li>{_e(n)}</li>" for n in notes)
    return (f"<table id='substrates' class='specrepro substrates'><caption>{_e(CAPTION)}"
            f"</caption><thead><tr>{head1}</tr><tr>{head2}</tr></thead><tbody>{''.join(body)}"
            "</tbody></table>"
            f"<p class='substrates-teach'><strong>What the substrates teach:</strong> "
            f"{_e(cmp.teaching())}</p>{own}"
            f"<details class='substrates-notes'><summary>What measured each substrate</summary>"
            f"<ul>{foot}</ul></details>")
