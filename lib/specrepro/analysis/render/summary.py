"""A report's first table: each check of the claim, the article beside the measurement.

Design:
- One row per check of the notebook's verdict (analysis/verdict/verdicts.py): the sub-claim, the
  article's value, the measured value, the ratio of the measured effect to the article's,
  the verdict as a word and a symbol (never colour alone) with what decided it, and the
  rule in words. Substitute gates follow, labelled.
- The two column heads say what measured each side: the article's engine, version, card
  and target (published/arms.csv), and this run's engine and version with its hardware
  (CPU model and count, or GPU name and driver, from the run's manifest) and where the
  engine and the client ran (the manifest's `placement`).
- A partial store (a run stopped at its deadline) is said under the verdict line: how many
  of the declared cells have no measurement and which (`Finding.missing_text`); the checks
  that need them are not testable here, never judged on a stand-in.
- The HTML is `<table id="summary">`, one `<tr class="check" data-outcome=...>` per check,
  the verdict in `<td class="verdict">`; the same content travels as output metadata
  (`{"specrepro": {"summary": ...}}`) for the index (report.py), so nothing is parsed back
  out of HTML.
"""

from __future__ import annotations

import html

import polars as pl

from specrepro.analysis.finding.finding import Finding
from specrepro.analysis.step_cost import suite as step_cost_suite
from specrepro.analysis.verdict import host_bound
from specrepro.analysis.verdict.claims import Claims
from specrepro.analysis.verdict.verdicts import Verdict, verdict
from specrepro.published import load_arms, load_vocabulary

# The articles' target model (both articles measured the same one); published/arms.csv
# gives each arm's engine, version, card and the target's precision.
ARTICLE_MODEL = "Qwen3.8-27B"


def engine_words(name: str) -> str:
    """An engine's name as readers read it (published/vocabulary.csv), else the name."""
    vocab = load_vocabulary().filter((pl.col("kind") == "engine") & (pl.col("name") == name))
    return vocab["description"][0] if vocab.height else name


def article_substrate(claims: Claims) -> str:
    """'vLLM 0.28.0 on ASUS Ascent GX10 (GB10, ...); Qwen3.8-27B, NVFP4 target'."""
    arms = load_arms()
    used = arms.filter(pl.col("arm").is_in(list(claims.arms.values())))
    engines = []
    for row in used.select(["engine", "engine_version"]).unique(maintain_order=True).iter_rows():
        if row[0]:
            engines.append(" ".join(p for p in (engine_words(row[0]), row[1]) if p))
    cards = []
    for hw in used["hardware"].drop_nulls().unique(maintain_order=True).to_list():
        card = arms.filter(pl.col("arm") == f"hw_{hw}")
        cards.append(card["label"][0] if card.height else hw)
    precision = sorted(set(used["target_precision"].drop_nulls().to_list()))
    return (", ".join(dict.fromkeys(engines)) + (" on " + " and ".join(cards) if cards else "")
            + f"; {ARTICLE_MODEL}" + (f", {'/'.join(p.upper() for p in precision)} target"
                                      if precision else ""))


def _session(f: Finding) -> dict:
    """The manifest's latest session that measured something (else the latest)."""
    sessions = f.manifest.get("sessions", [])
    done = [s for s in sessions if s.get("engines")]
    return (done or sessions or [{}])[-1]


def hardware(session: dict) -> str:
    """GPU name and driver where NVML answered, else the CPU model and count."""
    gpu = session.get("gpu") or {}
    if gpu.get("gpus"):
        names = sorted({g["name"] for g in gpu["gpus"]})
        return (f"{len(gpu['gpus'])}x {', '.join(names)} (driver {gpu.get('driver')}, "
                f"CUDA {gpu.get('cuda')})")
    host = session.get("host") or {}
    cpu = host.get("cpu_model") or host.get("processor") or "unknown CPU"
    return f"CPU {cpu}, {host.get('cpu_count', '?')} CPUs"


def placement(session: dict) -> str:
    p = session.get("placement")
    if not p:
        return "engine and client placement not recorded"
    if p.get("pinned"):
        return f"engine on CPUs {p.get('engine_cpus')}, client on CPUs {p.get('client_cpus')}"
    return "not pinned" + (f" ({p['note']})" if p.get("note") else "")


def engine_names(f: Finding) -> list[str]:
    """The engines that measured the cells with their versions: ['vLLM 0.26.0']."""
    engines = (f.cells.select(["engine", "engine_version"]).unique(maintain_order=True)
               .iter_rows())
    # the embedded engine reports "specrepro-embedded 0.1.0", vLLM and the peer a bare "0.26.0"
    names = [(v if " " in v else f"{engine_words(e)} {v}") if v
             else f"{engine_words(e)} (version unknown)" for e, v in engines if e]
    return list(dict.fromkeys(names))


def card(f: Finding) -> str:
    """The measured side's hardware in short: '1x NVIDIA H200', 'CPU (2 CPUs)'."""
    session = _session(f)
    gpus = (session.get("gpu") or {}).get("gpus")
    if gpus:
        return f"{len(gpus)}x {', '.join(sorted({g['name'] for g in gpus}))}"
    return f"CPU ({(session.get('host') or {}).get('cpu_count', '?')} CPUs)"


def measured_substrate(f: Finding) -> str:
    """'specrepro-embedded 0.1.0 on CPU x86_64, 2 CPUs (engine on CPUs [1], ...); models/embedded'."""
    names = engine_names(f)
    session = _session(f)
    models = sorted({m["id"] for m in session.get("models", []) if m.get("id")})
    threads = sorted({str(e["flags"]["threads"]) for e in session.get("engines", [])
                      if isinstance(e.get("flags"), dict) and "threads" in e["flags"]})
    where = hardware(session) + (f", {'/'.join(threads)} engine thread"
                                 f"{'' if threads == ['1'] else 's'}" if threads else "")
    return (", ".join(names) or "no engine") + f" on {where} ({placement(session)})" \
        + (f"; {', '.join(models)}" if models else "")


def summary(f: Finding, claims: Claims, v: Verdict | None = None) -> dict:
    """The summary as data: what the index reads and the table shows."""
    v = v or verdict(f, claims)
    return {"notebook_id": f.notebook_id, "title": claims.title, "article": claims.article,
            "claim": claims.claim, "outcome": v.outcome, "symbol": v.symbol, "text": v.text,
            "article_substrate": article_substrate(claims), "substrate": measured_substrate(f),
            # what the numbers are measured on and how busy its device was, in one line on
            # the report's first screen (read before any verdict is believed)
            # the floor against the card's rated and measured bandwidth, drafter bytes
            # included, where the suite names its step-cost records
            "substrate_line": host_bound.substrate_line(f, step_cost_suite.floor_line(f)),
            "checks": [c.as_dict() for c in v.checks], "partial": partial(f)}


def partial(f: Finding) -> str:
    """'' for a complete store, else the missing cells in words for the verdict line."""
    if not f.missing:
        return ""
    return (f"Partial results: {f.missing} of the {f.declared} cells this study declares have "
            f"no successful measurement ({f.missing_text()}); the checks that need them are "
            "not testable here and no figure stands in for a missing cell"
            + (f"; {other}" if (other := f.other_identity_text()) else "")
            + (f"; not measured here: {f.not_measured_why}" if f.not_measured_why else ""))


def _td(text, cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return f"<td{c}>{html.escape(str(text)) if text not in (None, '') else ''}</td>"


def summary_html(s: dict) -> str:
    """The verdict line and `<table id="summary">`."""
    head = (f"<tr><th>Claim</th><th>Article<br><small>{html.escape(s['article_substrate'])}"
            f"</small></th><th>Measured<br><small>{html.escape(s['substrate'])}</small></th>"
            "<th>Measured effect ÷ article's</th><th>Noise<br><small>the band a difference "
            "must leave: run-to-run and A/A</small></th><th>Verdict</th><th>Rule</th></tr>")
    rows = []
    for c in s["checks"]:
        ratio = "" if c["ratio"] is None else f"{c['ratio']:.2f}"
        reason = (f"<br><small>{html.escape(c['reason'])}</small>" if c["reason"] else "")
        cls = "check substitute" if c["substitute"] else "check"
        rows.append(f'<tr class="{cls}" data-outcome="{html.escape(c["outcome"])}">'
                    + _td(c["claim"]) + _td(c["article"]) + _td(c["measured"])
                    + _td(ratio, "ratio") + _td(c.get("noise", ""), "noise")
                    + f'<td class="verdict">{c["symbol"]} {html.escape(c["outcome"])}{reason}</td>'
                    + _td(c["rule"], "rule") + "</tr>")
    line = (f'<p class="verdict-line" data-outcome="{html.escape(s["outcome"])}"><strong>'
            f"Verdict: {s['symbol']} {html.escape(s['text'])}</strong>. "
            f"The article's finding: {html.escape(s['claim'])}</p>")
    if s.get("substrate_line"):
        line += (f'<p class="substrate-line"><strong>Substrate:</strong> '
                 f'{html.escape(s["substrate_line"])}</p>')
    if s.get("partial"):
        line += f'<p class="partial"><strong>{html.escape(s["partial"])}.</strong></p>'
    return (line + '<table id="summary" class="specrepro summary"><caption>Each check of '
            "the article's finding, the article's value beside the measured one, and the rule "
            "that judged it (substitute gates, where listed, are this suite's own and do not "
            f"decide the verdict)</caption><thead>{head}</thead><tbody>{''.join(rows)}"
            "</tbody></table>")
