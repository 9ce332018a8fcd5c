"""Window health beside the cells it qualifies (analysis/finding/window_health.py): from constructed
cells, a window that was not steady, cut short, or a cell's own warning is marked after the
figures it enters, said under the table with the warning's text, and named by a check that
read it; a healthy cell shows none of it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from specrepro import pipeline
from specrepro.analysis.finding import tables, window_health
from specrepro.analysis.finding.finding import Finding
from specrepro.analysis.verdict import verdicts
from specrepro.analysis.verdict.claims import claims_for
from specrepro.analysis.verdict.rules import Rule, Side
from specrepro.harness import steady
from specrepro.harness.records import LoadResult, RequestRecord
from specrepro.params.window import Window
from specrepro.store import CELL_SCHEMA, REQUEST_SCHEMA, empty, frame

ROOT = Path(__file__).resolve().parents[1]
NVML = "no NVML device: power not measured"  # every cell's: said once, never a mark
QUEUED = ("window not steady: the engine ran 5 and 6 requests as the window opened and "
          "closed, fewer than 8 streams less the 0 and 0 turning over then")


def cell(arm: str, repeat: int, tok_s: float, **kw) -> dict:
    return {"arm": arm, "repeat": repeat, "workload": "humaneval",
            "concurrency": 8, "temperature": 0.0, "agg_tok_s": tok_s,
            "acceptance_length": 2.0, "timing": "window", "window_all_busy": True,
            "window_turnovers_min": 3, "window_requests": 30, "warnings": [NVML], **kw}


def rows(**marked) -> list[dict]:
    """Three runs of two arms at 8 streams, all healthy but for `marked` on dflash-k5's
    second run."""
    return ([cell("mtp-k3", r, 50.0 + r) for r in range(3)]
            + [cell("dflash-k5", r, 60.0 + r, **(marked if r == 1 else {})) for r in range(3)])


def finding(cell_rows: list[dict]) -> Finding:
    suite, study = pipeline.study_for(ROOT / "params" / "default.yaml", "01_drafter_block_sweep")
    full = [{"cell_id": f"c{i}", "attempt": 1, "status": "ok", "engine": "embedded", **r}
            for i, r in enumerate(cell_rows)]
    cells = frame(full, CELL_SCHEMA)
    # labelled and judged as finding.from_store does
    cells = window_health.with_health(cells.with_columns(label=cells["arm"]), study)
    return Finding("01_drafter_block_sweep", study, suite, Path("/nonexistent"), cells,
                   empty(REQUEST_SCHEMA), False, {})


def faster_at_8(f: Finding) -> verdicts.CheckResult:
    """A check of 8-stream throughput, judged on the finding's cells (the article printing
    nothing beside it)."""
    rule = Rule("8 streams: the block drafter decodes faster", metric="agg_tok_s",
                a=Side("dflash-k5", concurrency=8), b=Side("mtp-k3", concurrency=8))
    claims = dataclasses.replace(claims_for(f.notebook_id), checks=(rule,))
    (res,) = verdicts.verdict(f, claims).checks
    return res


def flags(table: tables.Table) -> list[str]:
    return [v["flag"] for r in table.frame.iter_rows(named=True) for v in r.values()
            if isinstance(v, dict) and v.get("flag")]


@pytest.mark.parametrize("marked, mark, said", [
    ({"window_all_busy": False, "warnings": [NVML, QUEUED]}, "window not steady", QUEUED),
    ({"window_turnovers_min": 1}, "window cut short", "1 by the fewest stream"),
    ({"warnings": [NVML, "2 of 30 requests failed"]}, "warned", "2 of 30 requests failed"),
])
def test_a_marked_cell_is_marked_in_the_tables_said_under_them_and_named_by_its_check(
        marked, mark, said):
    f = finding(rows(**marked))
    assert f.cells["health"].to_list() == [[]] * 4 + [[mark]] + [[]]  # the window's own
    # warning is its window mark, not a "warned" too; the study's window says 3 turnovers
    for table in (tables.by_streams(f.cells), tables.per_arm(f.cells, ["agg_tok_s"]),
                  tables.change_by_streams(f.cells, "mtp-k3"),
                  tables.paired_tables(f.cells, "dflash-k5", "mtp-k3", ["agg_tok_s"])[0]):
        assert flags(table) == [f"{mark} in 1 of 3 runs"], table.caption
        notes = " ".join(table.notes)
        assert f"[{mark}]: " in notes and "dflash-k5, humaneval, 8 streams, T=0, run 1:" in notes
        assert said in notes and NVML not in notes
    html = pytest.importorskip("specrepro.analysis.render.show").html_table(
        tables.by_streams(f.cells).frame)
    assert f"[{mark} in 1 of 3 runs]" in html
    res, healthy = faster_at_8(f), faster_at_8(finding(rows()))
    assert res.outcome == healthy.outcome != "not testable here"  # said, never dropped
    assert res.reason == (f"{healthy.reason}; it rests on marked cells (see the tables' "
                          f"notes): dflash-k5 at 8 streams: {mark} in 1 of 3 runs")


def test_a_healthy_cell_shows_no_mark_no_note_and_no_word_in_its_check():
    f = finding(rows())
    assert f.cells["health"].to_list() == [[]] * 6
    assert window_health.common_warnings(f.cells) == [NVML]  # the report's header says it
    for table in (tables.by_streams(f.cells), tables.per_arm(f.cells, ["agg_tok_s"]),
                  tables.change_by_streams(f.cells, "mtp-k3"),
                  tables.spread_table(f.cells)):
        assert flags(table) == [] and not any("[window" in n or "[warned]" in n
                                              for n in table.notes), table.caption
    res = faster_at_8(f)
    assert res.outcome != "not testable here" and "marked" not in res.reason


def test_the_harness_words_its_window_warnings_as_window_health_reads_them():
    """A not-steady window's warnings (harness/steady.window_fields) are its window mark,
    not a warning of its own: both modules agree on how they are worded."""
    records = [RequestRecord(request_idx=i, prompt_id="p", seed=0, stream=0, started=i,
                             e2e_s=1.0, finish_reason="length") for i in range(4)]
    for r in records:
        r.add_chunk(r.started + 0.5, 1)
    res = LoadResult(records, 3.0, load_start=0.0, start_at=(0.4, 0.6), end_at=(3.4, 3.6))
    res.span = (0.5, 3.5)
    warnings: list[str] = []
    row = steady.window_fields(res, 2, Window(turnovers=3), None, None, warnings)
    assert row["window_all_busy"] is False and warnings  # stream 1 never had a token
    assert all(w.startswith(window_health.WINDOW_WORDS) for w in warnings)
    marks = window_health.marks_of({**row, "warnings": warnings}, 3)
    assert marks == ["window not steady", "window cut short"]
