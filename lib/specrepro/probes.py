"""A study's probes: their answers as the results store's manifest holds them, one reading
for what `specrepro probe` asks again (only a probe with none) and for the report's table.

Design: a probe (params `probes:`) asks whether one profile's engine starts and serves;
`specrepro probe` (harness/probe_command.py, beside the harness's other commands, since
asking starts an engine) writes its answer. Its answer is the latest of two kinds of record
in the manifest's sessions, matched on the probe's resolved profile
(`identity.profile_hash`, so a changed flag or engine pin is a new question):
- `probes` records that `specrepro probe` wrote: serves, does not start (with the engine's
  error), or starts and does not serve;
- `engines` records of a run whose arm used the same profile: an entry with an `error` is
  an engine that did not start; one without is an engine that started and served that
  run's cells. Entries written before failed starts carried their profile hash are matched
  through the session's own resolved params.
Each answer says where it comes from (session, command, log), so a reviewer can open the
engine's log. `answers` is the report's table: one row per declared probe, its latest
answer, or for a probe never asked, how to ask it.
"""
from __future__ import annotations

import polars as pl

from specrepro import identity
from specrepro.params import Profile, ResolvedProbe, ResolvedStudy

COLUMNS = ["probe", "question", "profile", "answer", "why", "asked", "source", "log"]


def _session_hash(session: dict, arm: str) -> str | None:
    """The profile hash of `arm` as that session resolved it (older failed-start entries)."""
    for a in (session.get("params") or {}).get("arms", []):
        if a.get("name") == arm and isinstance(a.get("resolved"), dict):
            try:
                return identity.profile_hash(Profile.model_validate(a["resolved"]))
            except ValueError:
                return None
    return None


def _first_line(text: str | None) -> str:
    """The error's own sentence: the launcher's message up to the log's last lines."""
    if not text:
        return ""
    return text.split(", last lines:")[0].split("; log /")[0].split("\n")[0]


def _store_log(path: str | None, arm: str, profile: str) -> str:
    """The engine's log as the store keeps it (logs/<name>.log.gz), wherever it ran."""
    name = path.rsplit("/", 1)[-1] if path else f"{arm}--{profile}.log"
    return f"logs/{name if name.endswith('.gz') else name + '.gz'}"


def _records(manifest: dict, name: str, profile: str, want: str) -> list[dict]:
    """Every record that answers the probe, in session order."""
    out = []
    for s in manifest.get("sessions", []):
        when = s.get("started_at") or ""
        sid = s.get("session_id", "")
        for rec in s.get("probes") or []:
            if rec.get("probe") == name and rec.get("profile_hash") == want:
                out.append({"answer": rec.get("answer", ""), "why": _first_line(rec.get("error")),
                            "asked": rec.get("asked_at") or when,
                            "source": f"specrepro probe, session {sid}",
                            "log": _store_log(rec.get("log"), name, profile)})
        for eng in s.get("engines") or []:
            if eng.get("profile") != profile:
                continue
            got = eng.get("profile_hash") or _session_hash(s, eng.get("arm", ""))
            if got != want:
                continue
            failed = bool(eng.get("error"))
            out.append({"answer": "does not start" if failed else "serves",
                        "why": _first_line(eng.get("error")) if failed
                        else f"{eng.get('engine', '')} {eng.get('version') or ''} served the "
                             f"cells of arm {eng.get('arm')!r}".strip(),
                        "asked": when,
                        "source": f"specrepro run (arm {eng.get('arm')!r}), session {sid}",
                        "log": _store_log(eng.get("log"), eng.get("arm", ""), profile)})
    return out


def latest(manifest: dict, probe: ResolvedProbe) -> dict | None:
    """The probe's latest answer (answer, why, asked, source, log), or None if never asked;
    `specrepro probe` asks only the probes this finds nothing for."""
    found = _records(manifest, probe.name, probe.resolved.name,
                     identity.profile_hash(probe.resolved))
    return found[-1] if found else None


def answers(study: ResolvedStudy, manifest: dict, suite_path: str = "SUITE") -> pl.DataFrame:
    """One row per declared probe: its latest answer, or how to ask it."""
    rows = []
    for p in study.probes:
        row = latest(manifest, p) or {
            "answer": "not asked yet", "asked": "", "log": "",
            "why": f"specrepro probe {suite_path} --study {study.notebook_id} --probe {p.name}",
            "source": ""}
        rows.append({"probe": p.label or p.name, "question": p.question,
                     "profile": p.resolved.name, **row})
    return pl.DataFrame(rows, schema={c: pl.String for c in COLUMNS})
