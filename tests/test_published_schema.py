"""The published CSVs load with their schema, name only declared things, and keep both
values wherever an article prints two for one thing."""

import shutil
from importlib import resources

import polars as pl
import pytest

from specrepro.published import (
    ARMS_SCHEMA,
    GATES_SCHEMA,
    PUBLISHED_SCHEMA,
    PublishedError,
    load_arms,
    load_gates,
    load_published,
)


@pytest.fixture(scope="module")
def published():
    return load_published()


def test_schema_and_size(published):
    assert published.schema == pl.Schema(PUBLISHED_SCHEMA)
    assert load_arms().schema == pl.Schema(ARMS_SCHEMA)
    assert load_gates().schema == pl.Schema(GATES_SCHEMA)
    counts = dict(published.group_by("article").len().iter_rows())
    assert counts["A"] >= 100 and counts["B"] >= 150, counts
    assert load_published("A").height == counts["A"]


def test_every_arm_is_declared_and_used(published):
    declared = set(load_arms()["arm"])
    named = set(published["arm"]) | set(published["baseline_arm"].drop_nulls())
    assert named <= declared
    assert declared - named == set(), "arms.csv declares arms no row names"


def test_findings_are_covered(published):
    a = published.filter(pl.col("article") == "A", pl.col("metric") == "agg_tok_s")
    for arm in ("mtp3_0280", "dflash2_k4_0280", "dflash2_k5_0280", "dflash2_k7_0280"):
        levels = set(a.filter(pl.col("arm") == arm, pl.col("temperature") == 0.7)["concurrency"])
        assert {1, 2, 4, 8, 16} <= levels, arm
    positions = published.filter(pl.col("metric").str.starts_with("acceptance_rate_pos"))
    assert positions.filter(pl.col("arm") == "dflash2_k7_0280").height == 7
    repeats = a.filter(pl.col("temperature") == 1.0, pl.col("repeat").is_not_null())
    assert sorted(repeats.filter(pl.col("arm") == "dflash2_k7_0280")["repeat"]) == [1, 2, 3, 4]


def _values(published, **key):
    rows = published.filter(*[pl.col(k) == v for k, v in key.items()])
    return {value: set(rows.filter(pl.col("value") == value)["source"]) for value in rows["value"]}


# (arm, workload, concurrency, temperature, metric): the two values the articles print
DUPLICATES = [
    (("dflash2_bf16_0330", "essays", 1, 0.0, "agg_tok_s"), {153.4, 155.2}),
    (("dflash2_fp8_0330", "essays", 1, 0.0, "agg_tok_s"), {162.6, 148.9}),
    (("dflash2_k7_0280", "code_probe", 1, 0.7, "acceptance_length"), {3.16, 3.40}),
    (("ar_control_0320", "essays", 32, 0.0, "agg_tok_s"), {1361.4, 1366.7}),
]


@pytest.mark.parametrize(("key", "values"), DUPLICATES)
def test_duplicates_keep_both_values_with_distinct_sources(published, key, values):
    columns = ("arm", "workload", "concurrency", "temperature", "metric")
    found = _values(published, **dict(zip(columns, key, strict=True)))
    assert values <= set(found), found
    first, second = (found[v] for v in sorted(values))
    assert first.isdisjoint(second)


def test_derived_sum_of_positions(published):
    k7 = published.filter(pl.col("arm") == "dflash2_k7_0280", pl.col("concurrency") == 1)
    rates = k7.filter(pl.col("metric").str.starts_with("acceptance_rate_pos"))["value"]
    derived = k7.filter(pl.col("stat") == "derived", pl.col("metric") == "acceptance_length")
    assert derived["value"].to_list() == [pytest.approx(1 + rates.sum() / 100)]


def test_published_values_meet_the_published_gates(published):
    """Article B says all four gates passed; its own numbers must say so too."""
    for gate in load_gates().iter_rows(named=True):
        rows = published.filter(
            pl.col("arm") == gate["arm"],
            pl.col("metric") == gate["metric"],
            pl.col("source").str.starts_with("table: confirmation"),
        )
        for column in ("workload", "concurrency"):
            if gate[column] is not None:
                rows = rows.filter(pl.col(column) == gate[column])
        (value,) = rows["value"]
        ok = {">=": value >= gate["threshold"], "<=": value <= gate["threshold"]}[gate["op"]]
        assert ok == (gate["published_outcome"] == "pass"), gate["gate"]


@pytest.fixture
def copy_dir(tmp_path):
    src = resources.files("specrepro.published")
    for name in ("article_a.csv", "article_b.csv", "arms.csv", "gates.csv", "vocabulary.csv"):
        with resources.as_file(src / name) as path:
            shutil.copy(path, tmp_path / name)
    return tmp_path


def _corrupt(path, old, new) -> int:
    """Replace the first occurrence of `old`; return its 1-based line number."""
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return text[: text.index(old)].count("\n") + 1


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (",agg_tok_s,value,62.0,", ",agg_tok_per_s,value,62.0,", "column 'metric'"),
        (",agg_tok_s,value,62.0,tok/s", ",agg_tok_s,value,62.0,tok/min", "column 'unit'"),
        (",agg_tok_s,value,62.0,", ",agg_tok_s,value,sixty-two,", "column 'value'"),
        ("ar_ref_0271,vllm,0.27.1,essays,1", "ar_reff_0271,vllm,0.27.1,essays,1", "column 'arm'"),
        (
            "ar_ref_0271,vllm,0.27.1,essays,1",
            "ar_ref_0271,vllm,0.32.0,essays,1",
            "column 'engine_version'",
        ),
    ],
)
def test_errors_name_file_line_and_column(copy_dir, old, new, message):
    line = _corrupt(copy_dir / "article_b.csv", old, new)
    with pytest.raises(PublishedError, match=f"article_b.csv, line {line}, ") as err:
        load_published(directory=copy_dir)
    assert message in str(err.value)


def test_gate_with_undeclared_metric_is_refused(copy_dir):
    line = _corrupt(copy_dir / "gates.csv", ",peak_mem_mib,", ",peak_memory,")
    with pytest.raises(PublishedError, match=f"gates.csv, line {line}, column 'metric'"):
        load_gates(directory=copy_dir)
