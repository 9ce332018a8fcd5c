"""A study's steady window (params/window.py): which cells it covers, what of it enters a
cell's identity, how a suite sizes or switches it off, and what a bad one says."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from specrepro import identity
from specrepro.params import ParamsError, load_suite, resolve_study

PROFILE = """
engine: embedded
command: [python, -m, specrepro.embedded.serve]
model: {id: models/embedded, revision: null, served_name: embedded}
flags: {max-num-seqs: 8, device: cpu}
"""

PEER = """
engine: transformers
model: {id: models/embedded, revision: null}
"""

STUDY = """
name: 03_target_precision
notebook: 03_target_precision
arms:
  - {name: a, profile: p}
  - {name: peer, profile: q}
workloads:
  - {name: essays, n: 4, form: completion, max_tokens: 32}
  - {name: gsm8k, n: 4, form: completion, max_tokens: 32}
concurrency: [1, 2, 8]
repeats: 2
window: {workloads: [essays]}
"""

SUITE = """
name: t
run_id: r
results_dir: results
binds: listed
notebooks:
  03_target_precision:
    study: studies/03.yaml
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def study(tmp_path: Path, suite_extra: str = "", study_text: str = STUDY):
    write(tmp_path / "profiles/p.yaml", PROFILE)
    write(tmp_path / "profiles/q.yaml", PEER)
    write(tmp_path / "studies/03.yaml", study_text)
    write(tmp_path / "suite.yaml", SUITE + suite_extra)
    return resolve_study(load_suite(tmp_path / "suite.yaml"), "03_target_precision")


def test_the_window_covers_multi_stream_speed_cells_of_an_engine_with_counters(tmp_path):
    st = study(tmp_path)
    covered = {(c.arm.name, c.workload.name, c.concurrency)
               for c in st.cells() if st.windowed(c)}
    # essays at 2 and 8 streams on the served engine; not 1 stream, not GSM8K (counted
    # whole), not the in-process peer (no counters)
    assert covered == {("a", "essays", 2), ("a", "essays", 8)}
    assert st.window.skip_s == 10.0 and st.window.window_s == 40.0  # article A's, on a GPU
    assert st.interleave == "auto"


def test_only_the_covered_cells_change_identity(tmp_path):
    st = study(tmp_path)
    plain = study(tmp_path / "plain", study_text=STUDY.replace(
        "window: {workloads: [essays]}\n", ""))
    for mine, theirs in zip(st.cells(), plain.cells()):
        same = identity.cell_id(st, mine, "v") == identity.cell_id(plain, theirs, "v")
        assert same is not st.windowed(mine)
    # the window's timing is part of a covered cell's identity; its selectors are not
    sized = study(tmp_path / "sized", "window: {window_s: 5.0}\n")
    listed = study(tmp_path / "listed", study_text=STUDY.replace(
        "window: {workloads: [essays]}", "window: {workloads: [essays], min_concurrency: 2}"))
    cell = next(c for c in st.cells() if st.windowed(c))
    assert identity.cell_id(sized, cell, "v") != identity.cell_id(st, cell, "v")
    assert identity.cell_id(listed, cell, "v") == identity.cell_id(st, cell, "v")


def test_a_suite_sizes_a_declared_window_switches_it_off_and_adds_none(tmp_path):
    sized = study(tmp_path / "sized", "window: {skip_s: 1.0, window_s: 3.0}\n")
    assert (sized.window.skip_s, sized.window.window_s) == (1.0, 3.0)
    assert sized.window.workloads == ["essays"]  # the study's selectors kept
    off = study(tmp_path / "off", "window: null\n")
    assert off.window is None and not any(off.windowed(c) for c in off.cells())
    without = study(tmp_path / "without", "window: {window_s: 3.0}\n",
                    study_text=STUDY.replace("window: {workloads: [essays]}\n", ""))
    assert without.window is None


@pytest.mark.parametrize("window, expected", [
    ("{workloads: [prose]}", "window.workloads[0]: expected a workload of the study (essays, "
                             "gsm8k), found 'prose'"),
    ("{window_s: 10.0, max_window_s: 5.0}", "window.max_window_s: expected at least "
                                            "window_s (10), found 5"),
    ("{cap_spread: 1.0}", "window.cap_spread"),
    ("{turnover: 3}", "unknown key 'turnover'"),
])
def test_a_bad_window_names_the_key(tmp_path, window, expected):
    text = STUDY.replace("window: {workloads: [essays]}", f"window: {window}")
    with pytest.raises(ParamsError) as info:
        study(tmp_path, study_text=text)
    assert expected in str(info.value) and "studies/03.yaml" in str(info.value)


def test_a_suites_bad_window_names_the_suite(tmp_path):
    with pytest.raises(ParamsError) as info:
        study(tmp_path, "window: {skip: 1.0}\n")
    assert "suite.yaml" in str(info.value) and "unknown key 'skip'" in str(info.value)


def test_the_shipped_suites_window_what_they_should():
    root = Path(__file__).resolve().parents[1] / "params"
    default = load_suite(root / "default.yaml")
    six = resolve_study(default, "06_draft_schedule_under_load")
    assert (six.window.skip_s, six.window.window_s, six.window.turnovers) == (1.0, 3.0, 3)
    assert sum(six.windowed(c) for c in six.cells()) == 63  # 7 arms x 3 levels x 3 repeats
    three = resolve_study(default, "03_target_precision")
    assert {c.workload.name for c in three.cells() if three.windowed(c)} == {"essays"}
    for name in ("smoke", "h200-engines", "h200-embedded"):  # stored before windows
        suite = load_suite(root / f"{name}.yaml")
        for nb in suite.notebooks:
            assert resolve_study(suite, nb).window is None, (name, nb)


@pytest.mark.parametrize("where, keys", [
    ("study", "mode: window\nwindow_s: 40.0\n"),
    ("suite", "    overrides: {mode: window, window_s: 40.0}\n"),
])
def test_the_retired_fixed_window_fails_naming_the_file_the_key_and_the_window_block(
        tmp_path, where, keys):
    """`mode: window` with `window_s` timed every cell over a fixed span from the load's
    start; it is retired for the steady window, and a file that still says it fails with
    where and what to write instead, in a study file or a suite's overrides alike."""
    with pytest.raises(ParamsError) as info:
        if where == "study":
            study(tmp_path, study_text=STUDY + keys)
        else:
            study(tmp_path, keys)
    msg = str(info.value)
    file, at = (("studies/03.yaml", "") if where == "study"
                else ("suite.yaml", "notebooks.03_target_precision.overrides."))
    for key in ("mode", "window_s"):
        assert f"{file}: {at}{key}: key {key!r} is retired" in msg
    assert "`window:` block" in msg and "delete `mode` and `window_s`" in msg
    with pytest.raises(ParamsError, match="key 'mode' is retired"):  # requests too: no key
        study(tmp_path / "requests", study_text=STUDY + "mode: requests\n")


def test_a_cells_id_is_the_one_it_had_before_the_fixed_window_was_retired(tmp_path):
    """The ids of a study's cells, windowed or not, computed before the fixed window was
    retired (the commit before it, on this very study): the retired settings stay in every
    identity at the values every stored cell hashed (identity.RETIRED_MEASUREMENT)."""
    write(tmp_path / "profiles/p.yaml", PROFILE.replace("models/embedded", "org/target"))
    write(tmp_path / "profiles/q.yaml", PEER.replace("models/embedded", "org/target"))
    write(tmp_path / "studies/03.yaml", STUDY)
    write(tmp_path / "suite.yaml", SUITE)
    st = resolve_study(load_suite(tmp_path / "suite.yaml"), "03_target_precision")
    ids = {c.concurrency: identity.cell_id(st, c, "v") for c in st.cells()
           if (c.arm.name, c.workload.name, c.repeat) == ("a", "essays", 0)}
    assert ids == {1: "2cac1da6d73e5371", 2: "d097adb997d7aec0", 8: "474e9cdc1c1dbeb8"}
    assert identity.measurement(st)["mode"] == "requests"
    assert identity.measurement(st)["window_s"] is None
