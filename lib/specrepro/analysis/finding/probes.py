"""A study's probes and their answers, as the report shows them: one row per declared probe,
its latest answer read from the results store's manifest (specrepro/probe_answers.py: probe
records and runs' engine records of the same resolved profile), and for a probe never asked,
how to ask it.
"""
from __future__ import annotations

import polars as pl

from specrepro.params import ResolvedStudy
from specrepro.probe_answers import latest

COLUMNS = ["probe", "question", "profile", "answer", "why", "asked", "source", "log"]


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
