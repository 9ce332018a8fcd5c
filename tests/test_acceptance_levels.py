"""Tokens per step by level against the prompt-to-prompt noise (analysis/finding/acceptance_levels.py),
on constructed cells and requests."""

from __future__ import annotations

import math

import polars as pl
import pytest

from specrepro.analysis.finding.acceptance_levels import agree, levels, per_request, table


def frames(per_level: dict[int, list[list[int]]], counters: dict[int, float]):
    """Cells of arm k7 at each level with the given counters, and per level its requests'
    chunk token counts (the first chunk the prefill's token)."""
    cells = pl.DataFrame({"cell_id": [f"c{c}" for c in per_level], "attempt": [1] * len(per_level),
                          "arm": ["k7"] * len(per_level), "concurrency": list(per_level),
                          "acceptance_length": [counters[c] for c in per_level]})
    rows = [{"cell_id": f"c{c}", "attempt": 1, "error": None, "chunk_tokens": [1, *chunks]}
            for c, reqs in per_level.items() for chunks in reqs]
    rows.append({"cell_id": "c1", "attempt": 1, "error": "timeout", "chunk_tokens": [1, 9, 9, 9, 9]})
    rows.append({"cell_id": "c1", "attempt": 1, "error": None, "chunk_tokens": [1, 8]})  # too short
    return cells, pl.DataFrame(rows)


def test_per_request_tokens_per_step_skip_the_prefill_chunk_errors_and_short_requests():
    cells, reqs = frames({1: [[3, 3, 3, 3], [4, 4, 4, 4]]}, {1: 3.5})
    got = per_request(reqs)
    assert got.height == 2 and got["steps"].to_list() == [4, 4]
    assert got["tokens"].to_list() == [12, 16]
    (x,) = levels(cells, reqs)
    assert x.per_request_mean == pytest.approx(3.5) and x.n_requests == 2
    assert x.per_request_sd == pytest.approx(math.sqrt(0.5))
    assert x.se == pytest.approx(0.5)
    assert x.chunk_vs_counters == pytest.approx(1.0)


def test_levels_agree_inside_two_standard_errors_and_differ_outside():
    spread = [[2, 2, 2, 2], [4, 4, 4, 4], [3, 3, 3, 3], [5, 5, 5, 5], [1, 1, 1, 1]]
    cells, reqs = frames({1: spread, 32: spread}, {1: 3.0, 32: 3.2})
    (row,) = table(cells, reqs, 1, 32)
    # sd 1.58 over 5 requests: se 0.707 a level, 1.0 for the difference: 0.2 is z 0.2
    assert row["delta_pct"] == pytest.approx(100 * 0.2 / 3.0)
    assert row["z"] == pytest.approx(0.2, rel=1e-3) and row["agree"] is True
    tight = [[3, 3, 3, 3]] * 4 + [[3, 3, 3, 4]]
    cells, reqs = frames({1: tight, 32: tight}, {1: 3.0, 32: 3.2})
    (row,) = table(cells, reqs, 1, 32)
    assert row["z"] > 2 and row["agree"] is False
    a, b = levels(cells, reqs)
    assert agree(a, b)[0] == pytest.approx(100 * 0.2 / 3.0)


def test_coalesced_chunks_show_against_the_counters():
    """Chunks holding two steps' tokens read twice the counters: flagged, not hidden."""
    cells, reqs = frames({128: [[6, 6, 6, 6], [6, 6, 6, 6]]}, {128: 3.0})
    (x,) = levels(cells, reqs)
    assert x.chunk_vs_counters == pytest.approx(2.0)
