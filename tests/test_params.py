"""params/: wrong keys and values fail naming file and key; include and override merging;
every shipped params file validates and resolves."""

from __future__ import annotations

import datetime
import textwrap
from pathlib import Path

import pytest

from specrepro import params
from specrepro.params import ParamsError

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params"

PROFILE = """
engine: embedded
command: [python, -m, specrepro.embedded.serve]
model: {id: models/embedded, revision: null, served_name: embedded}
flags: {max-num-seqs: 8, device: cpu}
speculative: {method: dflash, num_speculative_tokens: 7}
"""

STUDY = """
name: 01_drafter_block_sweep
notebook: 01_drafter_block_sweep
arms:
  - {name: a, profile: p}
  - name: b
    profile: p
    overrides: {speculative: {num_speculative_tokens: 5}}
baseline: a
workloads:
  - {name: gsm8k, n: 4, max_tokens: 32}
concurrency: [1, 2]
"""

SUITE = """
name: t
run_id: r
results_dir: results
binds: listed
notebooks:
  01_drafter_block_sweep:
    study: studies/01.yaml
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A params directory with one profile 'p', one study and one suite."""
    write(tmp_path / "profiles/p.yaml", PROFILE)
    write(tmp_path / "studies/01.yaml", STUDY)
    write(tmp_path / "suite.yaml", SUITE)
    return tmp_path


def error_of(fn, *args) -> str:
    with pytest.raises(ParamsError) as info:
        fn(*args)
    return str(info.value)


# ------------------------------------------------------------------ wrong keys and values


def test_unknown_top_level_key_names_file_key_and_suggestion(tree: Path):
    write(tree / "studies/01.yaml", STUDY + "concurency: [4]\n")
    msg = error_of(params.load_study, tree / "studies/01.yaml")
    assert "studies/01.yaml: concurency: unknown key 'concurency'" in msg
    assert "did you mean 'concurrency'" in msg


def test_unknown_nested_key_names_dotted_path(tree: Path):
    write(tree / "studies/01.yaml", STUDY.replace("overrides:", "overides:"))
    msg = error_of(params.load_study, tree / "studies/01.yaml")
    assert "arms[1].overides: unknown key 'overides' (did you mean 'overrides'?)" in msg


def test_bad_type_says_expected_and_found(tree: Path):
    write(tree / "studies/01.yaml", STUDY.replace("concurrency: [1, 2]", "concurrency: [1, eight]"))
    msg = error_of(params.load_study, tree / "studies/01.yaml")
    assert (
        "studies/01.yaml: concurrency: expected a list of positive integers, found [1, 'eight']"
        in msg
    )


def test_string_number_is_not_coerced(tree: Path):
    write(tree / "studies/01.yaml", STUDY.replace("n: 4", "n: '4'"))
    msg = error_of(params.load_study, tree / "studies/01.yaml")
    assert "workloads[0].n: expected a valid integer, found '4'" in msg


def test_sampling_bounds(tree: Path):
    write(tree / "studies/01.yaml", STUDY + "sampling: [{temperature: 0.7, top_p: 0, top_k: 0}]\n")
    msg = error_of(params.load_study, tree / "studies/01.yaml")
    assert "sampling[0].top_p: expected a number in (0, 1], found 0" in msg
    assert "sampling[0].top_k: expected -1 (off) or an integer >= 1, found 0" in msg


@pytest.mark.parametrize(
    "schedule, expected",
    [
        ("[[2, 8, 3]]", "expected the first range to start at 1, found [2, 8, 3]"),
        ("[[1, 8, 7], [6, 32, 3]]", "do not overlap, found [1, 8, 7] and [6, 32, 3]"),
        ("[[1, 8, -1]]", "expected k >= 0, found [1, 8, -1]"),
        ("[[1, 8]]", "speculative.num_speculative_tokens_per_batch_size"),
    ],
)
def test_bad_schedule(tree: Path, schedule: str, expected: str):
    text = PROFILE.replace(
        "num_speculative_tokens: 7}",
        f"num_speculative_tokens: 7, num_speculative_tokens_per_batch_size: {schedule}}}",
    )
    write(tree / "profiles/p.yaml", text)
    msg = error_of(params.load_profile, tree / "profiles/p.yaml")
    assert "profiles/p.yaml: speculative.num_speculative_tokens_per_batch_size" in msg
    assert expected in msg


def test_good_schedule_and_draft_length_lookup():
    spec = params.SpeculativeConfig(
        method="dflash",
        num_speculative_tokens=7,
        num_speculative_tokens_per_batch_size=[[1, 12, 7], [16, 32, 3], [33, 64, 9]],
    )
    # covering range, gap takes the previous range's k, tail likewise, capped at 7
    assert [spec.draft_tokens_at(b) for b in (1, 12, 14, 16, 40, 100)] == [7, 7, 7, 3, 7, 7]


def test_missing_profile_names_study_file_and_key(tree: Path):
    write(tree / "studies/01.yaml", STUDY.replace("profile: p}", "profile: q}"))
    suite = params.load_suite(tree / "suite.yaml")
    msg = error_of(params.resolve_study, suite, "01_drafter_block_sweep")
    assert "studies/01.yaml: arms[0].profile: expected a profile in" in msg
    assert "found 'q'" in msg


def test_bad_baseline_names_the_arms(tree: Path):
    write(tree / "studies/01.yaml", STUDY.replace("baseline: a", "baseline: c"))
    msg = error_of(params.load_study, tree / "studies/01.yaml")
    assert "studies/01.yaml: baseline: expected an arm name among ['a', 'b'], found 'c'" in msg


def test_gate_references_are_checked(tree: Path):
    gate = """
gates:
  - {name: g, metric: agg_toks, workload: essays, concurrency: 3, arm: b, op: ">=",
     threshold: 3, kind: relative_pct}
"""
    write(tree / "studies/01.yaml", STUDY + gate)
    msg = error_of(params.load_study, tree / "studies/01.yaml")
    assert "gates[0].metric: expected a cells column" in msg and "'agg_tok_s'" in msg
    assert "gates[0].workload: expected a workload among ['gsm8k'], found 'essays'" in msg
    assert "gates[0].concurrency: expected a concurrency level among [1, 2], found 3" in msg
    assert "gates[0].reference_arm: expected a reference arm" in msg


def test_profile_rules(tree: Path):
    write(tree / "profiles/p.yaml", PROFILE.replace("engine: embedded", "engine: attach"))
    msg = error_of(params.load_profile, tree / "profiles/p.yaml")
    assert "profiles/p.yaml: url: expected the URL of a running engine" in msg
    assert "command: expected null for attach" in msg
    write(tree / "profiles/p.yaml", PROFILE.replace("engine: embedded", "engine: sglang"))
    msg = error_of(params.load_profile, tree / "profiles/p.yaml")
    assert "return_spec_details: expected true for sglang, found None" in msg


def test_unknown_notebook_id_in_suite(tree: Path):
    write(tree / "suite.yaml", SUITE.replace("01_drafter_block_sweep:", "01_drafter_sweep:"))
    msg = error_of(params.load_suite, tree / "suite.yaml")
    assert "suite.yaml: notebooks.01_drafter_sweep: expected" in msg
    assert "'01_drafter_block_sweep'" in msg


# ------------------------------------------- every finding bound, and what a suite says of it


def suite_of_every_finding(tmp_path: Path, body: str = "") -> Path:
    """A suite binding every finding of the registry as its study stands (the project's
    profiles), plus `body`."""
    head = f"name: t\nrun_id: r\nresults_dir: results\nprofiles: {PARAMS / 'profiles'}\n"
    return write(tmp_path / "suite.yaml", head + textwrap.dedent(body))


def test_a_suite_binds_every_finding_to_its_own_study_but_those_it_excludes(tmp_path: Path):
    from specrepro import findings

    *kept, left = params.NOTEBOOK_IDS
    path = suite_of_every_finding(tmp_path, f"excluded: {{{left}: not measured on this setup}}\n")
    suite = params.load_suite(path)  # no `notebooks:`: still a suite (its run_id says so)
    assert list(suite.notebooks) == kept and suite.excluded == {left: "not measured on this setup"}
    assert all(suite.study_path(nb) == findings.study_path(nb) for nb in kept)
    assert [st.notebook for st, _, _ in params.resolve_file(path)] == kept
    assert "excluded (not measured on this setup)" in params.summarize(path)
    with pytest.raises(ParamsError, match="a notebook or study id"):
        params.resolve_study(suite, left)


def test_an_excluded_finding_is_not_bound_too_and_says_why(tmp_path: Path):
    nb = params.NOTEBOOK_IDS[0]
    path = suite_of_every_finding(tmp_path, f"excluded: {{{nb}: a reason}}\n"
                                            f"notebooks: {{{nb}: {{overrides: {{repeats: 1}}}}}}\n")
    msg = error_of(params.load_suite, path)
    assert f"suite.yaml: excluded.{nb}: expected a finding not bound under notebooks:" in msg
    write(path, path.read_text().split("excluded:")[0] + f"excluded: {{{nb}: ''}}\n")
    assert f"excluded.{nb}: expected the reason, in words, found none" in error_of(
        params.load_suite, path)
    write(path, path.read_text().split("excluded:")[0]
          + f"binds: listed\nexcluded: {{{nb}: a reason}}\n")
    assert "excluded: expected none with `binds: listed`" in error_of(params.load_suite, path)


def test_a_suites_defaults_reach_every_findings_study_before_its_own_overrides(tmp_path: Path):
    first, second, *_ = params.NOTEBOOK_IDS
    path = suite_of_every_finding(tmp_path, f"""
        defaults:
          repeats: 1
          workloads: {{n: 2, max_tokens: 16}}
        notebooks:
          {second}: {{overrides: {{repeats: 2, seeds: [1, 2]}}}}
    """)
    suite = params.load_suite(path)
    own = params.load_study(suite.study_path(first))
    one = params.resolve_study(suite, first)
    assert one.repeats == 1 and [(w.name, w.n, w.max_tokens) for w in one.workloads] == [
        (w.name, 2, 16) for w in own.workloads]
    assert [w.form for w in one.workloads] == [w.form for w in own.workloads]  # not said: kept
    assert params.resolve_study(suite, second).repeats == 2  # its own override wins
    write(path, path.read_text().replace("repeats: 1\n", "repeats: 0\n", 1))
    msg = error_of(params.resolve_study, params.load_suite(path), first)
    assert "suite.yaml: defaults.repeats: " in msg  # located in the suite that set it


def test_a_suites_defaults_take_sizes_and_settings_only(tmp_path: Path):
    path = suite_of_every_finding(tmp_path, """
        defaults:
          arms: []
          workloads: {name: essays}
    """)
    msg = error_of(params.load_suite, path)
    assert "suite.yaml: defaults.arms: expected one of workloads, concurrency" in msg
    assert "defaults.workloads.name: expected one of n, form, shots, max_tokens, stop" in msg
    write(path, path.read_text().replace("arms: []\n", "").replace(
        "workloads: {name: essays}", "workloads: [{name: essays}]"))
    assert "defaults.workloads: expected a mapping merged into each workload" in error_of(
        params.load_suite, path)


def test_a_profile_map_entry_derives_the_arm_with_its_overrides(tree: Path):
    write(tree / "suite.yaml", SUITE + textwrap.dedent("""
        profile_map:
          p: {profile: p, overrides: {port: 8101, speculative: {num_speculative_tokens: 3}}}
    """))
    suite = params.load_suite(tree / "suite.yaml")
    a, b = params.resolve_study(suite, "01_drafter_block_sweep").arms
    # the map's overrides first, then the arm's own: b keeps its 5 drafts
    assert (a.resolved.port, a.resolved.speculative.num_speculative_tokens) == (8101, 3)
    assert (b.resolved.port, b.resolved.speculative.num_speculative_tokens) == (8101, 5)
    assert a.resolved.name == "p" and a.overrides == {}  # the arm as the study declares it
    write(tree / "suite.yaml", (tree / "suite.yaml").read_text().replace("8101", "eighty"))
    msg = error_of(params.resolve_study, params.load_suite(tree / "suite.yaml"),
                   "01_drafter_block_sweep")
    assert "suite.yaml: profile_map.p.overrides.port: expected" in msg


def test_a_findings_own_study_resolves_against_the_projects_profiles():
    from specrepro import findings

    nb = params.NOTEBOOK_IDS[0]
    assert params.profiles_beside(findings.study_path(nb)) == PARAMS / "profiles"
    (study, results, run_id), = params.resolve_file(findings.study_path(nb))
    assert study.notebook_id == nb and results == ROOT / "results" and run_id == "standalone"
    assert "profiles not resolved" not in params.summarize(findings.study_path(nb))


def test_suite_override_error_points_at_the_suite(tree: Path):
    write(tree / "suite.yaml", SUITE + "    overrides: {concurency: [1]}\n")
    suite = params.load_suite(tree / "suite.yaml")
    msg = error_of(params.resolve_study, suite, "01_drafter_block_sweep")
    assert "suite.yaml: notebooks.01_drafter_block_sweep.overrides.concurency: unknown key" in msg


def test_arm_override_error_points_at_the_study(tree: Path):
    write(
        tree / "studies/01.yaml",
        STUDY.replace("num_speculative_tokens: 5", "num_speculative_tokens: 0"),
    )
    suite = params.load_suite(tree / "suite.yaml")
    msg = error_of(params.resolve_study, suite, "01_drafter_block_sweep")
    assert (
        "studies/01.yaml: arms[1].overrides.speculative.num_speculative_tokens: "
        "expected a positive integer, found 0"
    ) in msg


# ----------------------------------------------------------------------- merging


def test_include_merges_mappings_replaces_lists_later_wins(tmp_path: Path):
    write(tmp_path / "a.yaml", "x: {p: 1, q: 1}\nl: [1, 2]\ns: a\n")
    write(tmp_path / "b.yaml", "x: {q: 2, r: 2}\ns: b\n")
    write(tmp_path / "c.yaml", "include: [a.yaml, b.yaml]\nl: [3]\nx: {r: 3}\n")
    tree = params.read_tree(tmp_path / "c.yaml")
    assert tree.data == {"x": {"p": 1, "q": 2, "r": 3}, "l": [3], "s": "b"}
    assert tree.prov.locate(("x", "p"))[0].endswith("a.yaml")
    assert tree.prov.locate(("x", "q"))[0].endswith("b.yaml")
    assert tree.prov.locate(("l",))[0].endswith("c.yaml")


def test_error_in_included_file_names_that_file(tree: Path):
    write(tree / "profiles/base.yaml", PROFILE.replace("flags:", "flgs:"))
    write(tree / "profiles/p.yaml", "include: [base.yaml]\ndescription: child\n")
    msg = error_of(params.load_profile, tree / "profiles/p.yaml")
    assert "profiles/base.yaml: flgs: unknown key 'flgs' (did you mean 'flags'?)" in msg


def test_invalid_yaml_names_the_file_and_shows_the_line_with_a_caret(tmp_path: Path):
    # parsed with libyaml where PyYAML has it; the message is the pure-Python parser's,
    # which quotes the faulty line
    write(tmp_path / "a.yaml", "x: {p: 1}\nl: [1, 2\ns: a\n")
    msg = error_of(params.read_tree, tmp_path / "a.yaml")
    assert "a.yaml" in msg and "expected valid YAML" in msg
    assert "line 2" in msg and "l: [1, 2\n" in msg and "^" in msg
    write(tmp_path / "b.yaml", "x: {p: 1}\nl: [1, 2]\ns: 2026-12-01\nt: yes\nu: 1e3\n")
    assert params.read_tree(tmp_path / "b.yaml").data == {
        "x": {"p": 1}, "l": [1, 2], "s": datetime.date(2026, 12, 1), "t": True,
        "u": "1e3"}


def test_include_cycle_fails(tmp_path: Path):
    write(tmp_path / "a.yaml", "include: [b.yaml]\n")
    write(tmp_path / "b.yaml", "include: [a.yaml]\n")
    assert "include cycle" in error_of(params.read_tree, tmp_path / "a.yaml")


def test_resolution_merges_suite_and_arm_overrides_and_maps_profiles(tree: Path):
    write(tree / "profiles/p-gpu.yaml", PROFILE.replace("device: cpu", "device: cuda"))
    write(
        tree / "suite.yaml",
        SUITE
        + textwrap.indent(
            textwrap.dedent("""
        overrides: {concurrency: [1, 4, 8]}
        profiles: {p: p-gpu}
    """),
            "    ",
        ),
    )
    suite = params.load_suite(tree / "suite.yaml")
    study = params.resolve_study(suite, "01_drafter_block_sweep")
    assert study.concurrency == [1, 4, 8]
    a, b = study.arms
    assert a.resolved.name == "p-gpu" and a.resolved.flags["device"] == "cuda"
    assert a.resolved.speculative.num_speculative_tokens == 7
    assert b.resolved.speculative.num_speculative_tokens == 5
    assert b.resolved.speculative.method == "dflash"  # untouched keys survive the merge
    assert suite.results_path == (tree / "results").resolve()


def test_unused_profile_substitution_fails(tree: Path):
    write(tree / "suite.yaml", SUITE + "    profiles: {nope: p}\n")
    suite = params.load_suite(tree / "suite.yaml")
    msg = error_of(params.resolve_study, suite, "01_drafter_block_sweep")
    assert "notebooks.01_drafter_block_sweep.profiles.nope" in msg


def test_cells_respect_skip_and_seeds(tree: Path):
    write(
        tree / "studies/01.yaml",
        STUDY
        + textwrap.dedent("""
        repeats: 2
        seeds: [11, 22]
        skip: [{arm: b, concurrency: [2]}]
    """),
    )
    study = params.load_study(tree / "studies/01.yaml")
    cells = [(c.arm.name, c.concurrency, c.repeat, c.seed) for c in study.cells()]
    assert cells == [
        ("a", 1, 0, 11),
        ("a", 1, 1, 22),
        ("a", 2, 0, 11),
        ("a", 2, 1, 22),
        ("b", 1, 0, 11),
        ("b", 1, 1, 22),
    ]
    write(tree / "studies/01.yaml", STUDY + "repeats: 2\nseeds: [11]\n")
    assert "seeds: expected one seed per repeat (2), found 1" in error_of(
        params.load_study, tree / "studies/01.yaml"
    )


def test_a_skip_of_some_repeats_measures_the_combination_fewer_times(tree: Path):
    write(tree / "studies/01.yaml", STUDY + textwrap.dedent("""
        repeats: 3
        skip: [{arm: b, repeat: [1, 2]}, {arm: a, concurrency: [2], repeat: [2, 7]}]
    """))
    study = params.load_study(tree / "studies/01.yaml")
    cells = [(c.arm.name, c.concurrency, c.repeat, c.seed) for c in study.cells()]
    assert cells == [("a", 1, 0, 0), ("a", 1, 1, 1), ("a", 1, 2, 2), ("a", 2, 0, 0),
                     ("a", 2, 1, 1), ("b", 1, 0, 0), ("b", 2, 0, 0)]
    # the combination itself is measured: only its repeats are skipped
    assert not study.skipped("b", "gsm8k", 1) and study.skipped("b", "gsm8k", 1, 1)
    write(tree / "studies/01.yaml", STUDY + "repeats: 3\nskip: [{arm: b, repeat: [-1]}]\n")
    msg = error_of(params.load_study, tree / "studies/01.yaml")
    assert "01.yaml" in msg and "skip[0].repeat" in msg


def test_placement_is_a_validated_setting(tree: Path):
    assert params.load_study(tree / "studies/01.yaml").placement == "auto"
    write(tree / "studies/01.yaml", STUDY + "placement: none\n")
    assert params.load_study(tree / "studies/01.yaml").placement == "none"
    write(tree / "studies/01.yaml", STUDY + "placement: pinned\n")
    msg = error_of(params.load_study, tree / "studies/01.yaml")
    assert "01.yaml" in msg and "placement" in msg and "'auto'" in msg and "pinned" in msg
    # how the machine was used is not what a cell measured: the cell ids stay
    from specrepro.identity import measurement

    write(tree / "studies/01.yaml", STUDY + "placement: none\n")
    pinned_off = params.load_study(tree / "studies/01.yaml")
    assert measurement(pinned_off) == measurement(pinned_off.model_copy(
        update={"placement": "auto"}))


def test_gate_passes():
    gate = params.Gate(
        name="g",
        metric="agg_tok_s",
        workload="essays",
        concurrency=1,
        arm="b",
        reference_arm="a",
        op=">=",
        threshold=3.0,
        kind="relative_pct",
    )
    assert gate.passes(103.5, 100.0) and not gate.passes(102.0, 100.0)


def test_check_notebook_params():
    allowed = {"params_file": {}, "notebook_id": {}, "replay": {}}
    params.check_notebook_params({"params_file": "x", "replay": True}, allowed)
    with pytest.raises(ParamsError, match="unknown parameter 'replya' .did you mean 'replay'"):
        params.check_notebook_params({"replya": True}, allowed)


# ----------------------------------------------------------------- shipped files


SHIPPED = sorted(PARAMS.glob("profiles/*.yaml")) + sorted(PARAMS.glob("studies/*.yaml"))
SUITES = [p for p in sorted(PARAMS.glob("*.yaml")) if p.name != "base.yaml"]


@pytest.mark.parametrize("path", SHIPPED + SUITES, ids=lambda p: str(p.relative_to(PARAMS)))
def test_shipped_params_validate(path: Path):
    assert params.summarize(path)


@pytest.mark.parametrize("name", ["smoke.yaml", "default.yaml"])
def test_shipped_suites_cover_every_notebook(name: str):
    suite = params.load_suite(PARAMS / name)
    assert set(suite.notebooks) == set(params.NOTEBOOK_IDS)
    for nb, study in params.resolve_all(suite).items():
        assert study.notebook_id == nb and any(True for _ in study.cells())
        assert all(a.resolved.engine in ("embedded", "transformers") for a in study.arms)


def test_the_default_suite_repeats_every_speed_cell_three_times():
    """Greedy acceptance and correctness repeat exactly; speed does not. Only cells read for
    acceptance or correctness alone (03's GSM8K and code, 05's GSM8K identity gate) may run
    fewer times."""
    from collections import Counter

    once_allowed = {("03_target_precision", "gsm8k"), ("03_target_precision", "humaneval"),
                    ("05_fp8_drafter_gates", "gsm8k")}
    for nb, study in params.resolve_all(params.load_suite(PARAMS / "default.yaml")).items():
        runs = Counter((c.arm.name, c.workload.name, c.concurrency, c.sampling.temperature)
                       for c in study.cells())
        for (arm, workload, level, temp), n in runs.items():
            assert n >= 3 or (nb, workload) in once_allowed, (nb, arm, workload, level, temp, n)
        assert {c.seed for c in study.cells()} == {study.seed_for(r) for r in
                                                   range(study.repeats)}


def test_smoke_is_tiny():
    suite = params.load_suite(PARAMS / "smoke.yaml")
    for study in params.resolve_all(suite).values():
        assert all(w.n <= 4 and w.max_tokens <= 32 for w in study.workloads)
        assert max(study.concurrency) <= 2


def test_check_command(tree: Path, capsys):
    from specrepro.cli import main

    assert main(["check", str(tree / "suite.yaml")]) == 0
    assert "suite 't'" in capsys.readouterr().out
    write(tree / "studies/01.yaml", STUDY + "bogus: 1\n")
    assert main(["check", str(tree / "suite.yaml")]) == 2
    assert "bogus: unknown key 'bogus'" in capsys.readouterr().err


def test_resolved_profiles_remember_their_file(tree: Path):
    suite = params.load_suite(tree / "suite.yaml")
    study = params.resolve_study(suite, "01_drafter_block_sweep")
    assert study.arms[0].resolved.source.endswith("profiles/p.yaml")
    assert params.load_profile(tree / "profiles/p.yaml").source.endswith("profiles/p.yaml")


def test_workload_stop_is_left_out_of_the_identity_when_unset():
    from specrepro.params import Workload

    unset = Workload(name="humaneval", n=2).model_dump(mode="json")
    assert "stop" not in unset
    assert Workload(name="humaneval", n=2, stop=[]).model_dump(mode="json")["stop"] == []


# ------------------------------------------------- the real engines on the H200

ENGINE_PROFILES = {"vllm": ("vllm-0.26-", "0.26.0"), "sglang": ("sglang-0.5.14-", "0.5.14")}
H200_PROFILES = [p for prefix, _ in ENGINE_PROFILES.values()
                 for p in sorted(PARAMS.glob(f"profiles/{prefix}*.yaml"))]
# What changes the numbers, stated in every profile rather than left to the engine's default
# (docs/engines.md, "The H200 profiles"): precision, context, memory, request slots, the
# batch or prefill budget, CUDA graphs, the seed; prefix caching and the bundle's facts below.
STATED = {"vllm": ("dtype", "max-model-len", "gpu-memory-utilization", "max-num-seqs",
                   "max-num-batched-tokens", "compilation-config", "kv-cache-dtype", "seed"),
          "sglang": ("dtype", "context-length", "mem-fraction-static", "max-running-requests",
                     "chunked-prefill-size", "cuda-graph-backend-decode",
                     "cuda-graph-max-bs-decode", "random-seed")}
DRAFTERS = {"eagle": "build/engine-drafters/{engine}/mtp",
            "dflash": "build/engine-drafters/{engine}/dflash",
            "draft_model": "models/embedded/draft_model", "ngram": None}


@pytest.mark.parametrize("path", H200_PROFILES, ids=lambda p: p.stem)
def test_h200_engine_profiles_state_what_changes_the_numbers(path: Path):
    p = params.load_profile(path)
    prefix, version = ENGINE_PROFILES[p.engine]
    assert p.name.startswith(prefix) and p.engine_version == version
    # a target quantized at load (the same bf16 checkpoint) says so right after the version
    if "quantization" in p.flags:
        assert p.name.startswith(f"{prefix}{p.flags['quantization']}-")
    # the stand-in's profiles (issue 29) serve build/standin, the embedded target inflated
    standin = "-standin-" in p.name
    assert p.model.id == ("build/standin/target" if standin else "models/embedded")
    assert p.hardware.gpu == "NVIDIA H200"
    assert [f for f in STATED[p.engine] if f not in p.flags] == []
    # the machine's facts: the bundle's environment script, its sampler and attention
    assert f"/var/tmp/specrepro-gpu/{p.engine}/site/env.sh" in p.command[2]
    if p.engine == "vllm":
        assert p.flags["enable-prefix-caching"] is False
        assert p.flags["compilation-config"]["cudagraph_mode"] == "FULL_AND_PIECEWISE"
        assert p.env == {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
    else:
        assert p.flags["disable-radix-cache"] is True
        assert p.flags["cuda-graph-backend-decode"] == "full"
        assert p.flags["cuda-graph-max-bs-decode"] == p.flags["max-running-requests"]
        assert (p.flags["attention-backend"], p.flags["sampling-backend"]) == ("triton", "pytorch")
    spec = p.speculative
    if spec is None:
        assert p.drafter is None and p.name.endswith("-none")
        return
    assert spec.rejection_sample_method == "standard"
    # vLLM drafts greedily unless told; SGLang has no such key (its adapter refuses it)
    assert spec.draft_sample_method == ("greedy" if p.engine == "vllm" else None)
    want = DRAFTERS[spec.method]
    if standin and want:
        want = want.replace("engine-drafters", "standin")
    if p.name.endswith("-fp8-drafter") and spec.quantization is None:
        want += "-fp8"  # an FP8 checkpoint of the drafter (export-fp8-drafter), not a flag
    assert (p.drafter.id if p.drafter else None) == (want and want.format(engine=p.engine))
    # a quantized drafter says so after its draft count (the target's precision: below)
    suffix = (f"-{spec.quantization}-drafter" if spec.quantization
              else "-fp8-drafter" if p.drafter and p.drafter.id.endswith("-fp8") else "")
    if p.name.endswith("-schedule"):  # article B's schedule, its top the profile's slots
        top = p.flags["max-num-seqs"]
        assert spec.num_speculative_tokens_per_batch_size == [[1, 12, 7], [13, top, 3]]
        assert top == (128 if standin else 32)  # the stand-in's: the suite's top level
        assert spec.draft_tokens_at(top) == 3
    else:  # the draft count the name says
        assert p.name.endswith(f"-k{spec.num_speculative_tokens}{suffix}")
        assert spec.num_speculative_tokens_per_batch_size is None
    if p.engine == "sglang" and spec.method == "ngram":  # SGLang's own NGRAM, named as such
        assert "-ngram-trie-" in p.name and p.flags["speculative-ngram-match-type"] == "BFS"


def test_h200_engine_profiles_cover_every_method_and_draft_count():
    """One profile per engine, method, draft count and precision (the target's, quantized
    at load, and the drafter's): bf16 for every method and count, and the quantized arms of
    notebooks 03 (FP8 target) and 05 (FP8 drafter: SGLang's arm, vLLM's two probes)."""
    have, standin = {}, set()
    for path in H200_PROFILES:
        p = params.load_profile(path)
        if "-standin-" in p.name:  # the stand-in's arms (issue 29), beside the small target's
            standin.add(p.name)
            continue
        key = (p.engine, p.method, "schedule" if p.name.endswith("-schedule") else
               p.speculative.num_speculative_tokens if p.speculative else None,
               p.flags.get("quantization"), p.speculative and p.speculative.quantization)
        assert key not in have, f"{path.name} repeats {have.get(key)}"
        have[key] = path.name
    want = {(e, "none", None, None, None) for e in ENGINE_PROFILES} | {
        (e, method, k, None, None) for e in ENGINE_PROFILES
        for method, ks in (("eagle", [3]), ("dflash", [3, 4, 5, 7, 9]),
                           ("draft_model", [3, 5, 7]), ("ngram", [3, 5, 7]))
        for k in ks} | {("vllm", "dflash", "schedule", None, None),
                        ("vllm", "dflash", 7, "fp8", None),
                        ("vllm", "dflash", 7, None, "fp8"),
                        ("vllm", "dflash", 7, None, "fp8_per_tensor"),
                        ("sglang", "dflash", 7, None, "fp8")}
    assert set(have) == want
    assert standin == {"vllm-0.26-standin-none", "vllm-0.26-standin-dummy-none",
                       "vllm-0.26-standin-dflash-k7", "vllm-0.26-standin-eagle-k3",
                       "sglang-0.5.14-standin-none", "sglang-0.5.14-standin-dflash-k7",
                       "sglang-0.5.14-standin-eagle-k3",
                       # issue 31's suite (params/h200-standin.yaml): 01's and 06's draft
                       # counts and schedule, 03's FP8 target, 05's FP8 drafter
                       "vllm-0.26-standin-dflash-k3", "vllm-0.26-standin-dflash-k4",
                       "vllm-0.26-standin-dflash-k5", "vllm-0.26-standin-dflash-schedule",
                       "vllm-0.26-fp8-standin-dflash-k7",
                       "sglang-0.5.14-standin-dflash-k7-fp8-drafter",
                       # 05's FP8 drafter from its FP8 checkpoint (vLLM); SGLang's is kept
                       # unbound, the record of why not SGLang
                       "vllm-0.26-standin-dflash-k7-fp8-drafter"}


@pytest.mark.parametrize("name, target, drafter", [
    ("vllm-0.26-fp8-dflash-k7", "fp8", None),
    ("vllm-0.26-dflash-k7-fp8-drafter", None, "fp8"),
    ("sglang-0.5.14-dflash-k7-fp8-drafter", None, "fp8"),
    ("vllm-nvfp4-0.26-dflash-k7", None, None),  # NVFP4 is in the checkpoint, not a flag
    # the stand-in's (params/h200-standin.yaml), against the stand-in's BF16 arm
    ("vllm-0.26-fp8-standin-dflash-k7", "fp8", None),
    ("sglang-0.5.14-standin-dflash-k7-fp8-drafter", None, "fp8"),
    ("vllm-nvfp4-0.26-standin-dflash-k7", None, None),
])
def test_h200_quantized_arms_render_their_precision_and_nothing_else(name, target, drafter):
    """The precision arms of notebooks 03 and 05 reach the engine's command line as the one
    thing they change: the target's `--quantization`, or the drafter's (vLLM's speculative
    config key, SGLang's --speculative-draft-model-quantization), on the BF16 arm's flags."""
    import json

    from specrepro.harness.engines import adapter_for

    p = params.load_profile(PARAMS / "profiles" / f"{name}.yaml")
    standin = "-standin-" in name
    bf16 = {"vllm": "vllm-0.26-dflash-k7", "sglang": "sglang-0.5.14-dflash-k7"}[p.engine]
    if standin:
        bf16 = bf16.replace("-dflash-", "-standin-dflash-")
    base = params.load_profile(PARAMS / "profiles" / f"{bf16}.yaml")
    argv, base_argv = adapter_for(p).render_argv(p), adapter_for(base).render_argv(base)
    flag = lambda a, f: a[a.index(f) + 1] if f in a else None
    assert flag(argv, "--quantization") == target
    if p.engine == "vllm":
        spec = json.loads(flag(argv, "--speculative-config"))
        assert spec.get("quantization") == drafter
        assert spec.get("model") == base.drafter.id
        spec.pop("quantization", None)
        assert spec == json.loads(flag(base_argv, "--speculative-config"))
    else:
        assert flag(argv, "--speculative-draft-model-quantization") == drafter
    assert p.flags | {"quantization": None} == base.flags | {"quantization": None}
    assert p.hardware == base.hardware and p.command == base.command and p.env == base.env
    nvfp4 = "build/standin-nvfp4" if standin else "build/nvfp4-target"
    assert (p.model.id == nvfp4) == name.startswith("vllm-nvfp4-")
    if not name.startswith("vllm-nvfp4-"):
        assert p.model == base.model


def test_the_standin_fp8_drafter_arm_changes_only_the_drafter_it_reads():
    """05's FP8 drafter on vLLM is a checkpoint, not a flag: its command line is the BF16
    arm's with the speculative config's model moved to the FP8 export, and no quantization
    key anywhere (vLLM 0.26.0 takes the drafter's precision from its config.json)."""
    import json

    from specrepro.harness.engines import adapter_for

    p = params.load_profile(PARAMS / "profiles" / "vllm-0.26-standin-dflash-k7-fp8-drafter.yaml")
    base = params.load_profile(PARAMS / "profiles" / "vllm-0.26-standin-dflash-k7.yaml")
    argv, base_argv = adapter_for(p).render_argv(p), adapter_for(base).render_argv(base)
    i, j = argv.index("--speculative-config"), base_argv.index("--speculative-config")
    spec, base_spec = json.loads(argv[i + 1]), json.loads(base_argv[j + 1])
    assert spec == base_spec | {"model": "build/standin/vllm/dflash-fp8"}
    assert "quantization" not in spec and "--quantization" not in argv
    assert argv[:i] + argv[i + 2:] == base_argv[:j] + base_argv[j + 2:]
    assert p.model == base.model and p.flags == base.flags and p.hardware == base.hardware


def bound(suite: params.Suite) -> list[str]:
    """The findings a suite binds, read from the registry: all but those it excludes."""
    return [nb for nb in params.NOTEBOOK_IDS if nb not in suite.excluded]


def subset(measured: dict, expected: dict) -> dict:
    """`measured` for the findings `expected` names (a finding added later has its own)."""
    return {nb: measured[nb] for nb in expected}


def test_the_h200_engines_suite_binds_every_notebook_and_its_studies():
    suite = params.load_suite(PARAMS / "h200-engines.yaml")
    assert suite.results_path == (ROOT / "results" / "h200-engines").resolve()
    studies = params.resolve_all(suite)
    assert list(studies) == bound(suite)
    # 04: vLLM (engine A) against SGLang (engine B), the same block drafter at 7 drafts, each
    # with its no-speculation row; the vLLM arms on other notebooks' profiles unchanged
    st = studies.pop("04_engine_comparison")
    assert {a.name: a.resolved.name for a in st.arms} == {
        "engine-a-none": "vllm-0.26-none", "engine-a-spec": "vllm-0.26-dflash-k7",
        "engine-b-none": "sglang-0.5.14-none", "engine-b-spec": "sglang-0.5.14-dflash-k7"}
    spec = {a.name: a.resolved.speculative for a in st.arms if a.resolved.speculative}
    assert {(s.method, s.num_speculative_tokens) for s in spec.values()} == {("dflash", 7)}
    assert {a.resolved.api for a in st.arms} == {"openai"} and st.concurrency == [1, 8]
    assert sum(1 for _ in st.cells()) == 4 * 3 * 3
    st = studies["01_drafter_block_sweep"]
    assert st.baseline == "mtp-k3"
    assert {a.name: a.resolved.name for a in st.arms} == {
        "mtp-k3": "vllm-0.26-eagle-k3", "dflash-k4": "vllm-0.26-dflash-k4",
        "dflash-k5": "vllm-0.26-dflash-k5", "dflash-k7": "vllm-0.26-dflash-k7"}
    assert st.concurrency == [1, 2, 4, 8, 16] and [s.temperature for s in st.sampling] == [0.0]
    assert [(w.name, w.n) for w in st.workloads] == [("humaneval", 32)]
    assert sum(1 for _ in st.cells()) == 4 * 5 * st.repeats
    assert [s.temperature for s in studies["02_temperature_spread"].sampling] == [0.7, 1.0]
    assert studies["02_temperature_spread"].repeats == 4
    assert studies["06_draft_schedule_under_load"].concurrency == [1, 8, 32]
    # 05 moved to SGLang once vLLM 0.26.0's online-FP8 drafter did not start (its probes)
    st = studies.pop("05_fp8_drafter_gates")
    assert {a.resolved.engine for a in st.arms} == {"sglang"}
    assert {p.name: (p.resolved.engine, p.resolved.speculative.quantization)
            for p in st.probes} == {"vllm-online-fp8": ("vllm", "fp8"),
                                    "vllm-online-fp8-per-tensor": ("vllm", "fp8_per_tensor")}
    assert all(a.resolved.engine == "vllm" for s in studies.values() for a in s.arms)
    assert list(suite.studies) == ["parity-vllm", "parity-sglang", "peer-vllm", "peer-sglang"]
    sglang = params.resolve_study(suite, "parity-sglang")
    assert {a.resolved.api for a in sglang.arms} == {"native"}
    assert len({a.resolved.port for a in sglang.arms}) == len(sglang.arms)  # side by side


def test_the_h200_engines_article_b_arms():
    """03 and 07 on vLLM 0.26.0, 05 on SGLang 0.5.14: the studies' arm names and baselines
    (claims and gates read them), BF16 arms on their profiles unchanged (one engine shared
    across notebooks), one drafter and one memory setting in every arm, article B's levels
    and sizes."""
    suite = params.load_suite(PARAMS / "h200-engines.yaml")
    studies = {nb: params.resolve_study(suite, nb)
               for nb in ("03_target_precision", "05_fp8_drafter_gates", "07_the_bill")}
    profiles = {nb: {a.name: a.resolved.name for a in st.arms} for nb, st in studies.items()}
    assert profiles == {
        "03_target_precision": {"target-bf16": "vllm-0.26-dflash-k7",
                                "target-nvfp4": "vllm-nvfp4-0.26-dflash-k7",
                                "target-fp8": "vllm-0.26-fp8-dflash-k7"},
        "05_fp8_drafter_gates": {"drafter-bf16": "sglang-0.5.14-dflash-k7",
                                 "drafter-fp8": "sglang-0.5.14-dflash-k7-fp8-drafter"},
        "07_the_bill": {"none": "vllm-0.26-none", "mtp-control": "vllm-0.26-eagle-k3",
                        "dflash-k7": "vllm-0.26-dflash-k7"}}
    assert [st.baseline for st in studies.values()] == ["target-bf16", "drafter-bf16", "none"]
    # the article's pair is the one the notebook's paired tables judge (its first challenger)
    assert studies["03_target_precision"].arms[1].name == "target-nvfp4"
    memory = {"vllm": ("gpu-memory-utilization", "max-num-seqs", "max-model-len",
                       "kv-cache-dtype", "max-num-batched-tokens"),
              "sglang": ("mem-fraction-static", "max-running-requests", "context-length",
                         "kv-cache-dtype")}
    for nb, st in studies.items():
        assert all(a.overrides == {} for a in st.arms), nb  # profiles as they are
        (engine,) = {a.resolved.engine for a in st.arms}
        assert len({tuple(a.resolved.flags.get(k) for k in memory[engine])
                    for a in st.arms}) == 1, nb
        assert {a.resolved.engine_version for a in st.arms} == {
            "vllm": {"0.26.0"}, "sglang": {"0.5.14"}}[engine], nb
        assert {w.form for w in st.workloads} == {"completion"} and st.reasoning_effort is None
        assert all(w.n >= 32 for w in st.workloads), nb
        assert [s.temperature for s in st.sampling] == [0.0] and st.repeats == 3, nb
        sizes = {w.name: (w.max_tokens, w.stop) for w in st.workloads}
        assert sizes["essays"] == (512, None), nb
        assert sizes.get("humaneval", (256, []))[1] == [], nb  # no Codex stop sequences
    for nb in ("03_target_precision", "05_fp8_drafter_gates"):  # one drafter throughout
        spec = {(a.resolved.drafter.id, a.resolved.speculative.method,
                 a.resolved.speculative.num_speculative_tokens) for a in studies[nb].arms}
        engine = "sglang" if nb == "05_fp8_drafter_gates" else "vllm"
        assert spec == {(f"build/engine-drafters/{engine}/dflash", "dflash", 7)}, nb
    precision = {a.name: (a.resolved.flags.get("quantization"), a.resolved.model.id,
                          a.resolved.speculative.quantization)
                 for a in studies["03_target_precision"].arms if a.noise_of is None}
    assert precision == {"target-bf16": (None, "models/embedded", None),
                         "target-nvfp4": (None, "build/nvfp4-target", None),
                         "target-fp8": ("fp8", "models/embedded", None)}
    gates = studies["05_fp8_drafter_gates"]
    assert [a.resolved.speculative.quantization for a in gates.arms] == [None, "fp8"]
    # the article's two speed gates as it declared them, then the acceptance substitute and
    # the token-identity substitute for the GSM8K gate (as h200-embedded declares it)
    assert [(g.metric, g.workload, g.concurrency, g.op, g.threshold, g.kind, g.reference_arm)
            for g in gates.gates] == [
        ("agg_tok_s", "essays", 1, ">=", 3.0, "relative_pct", "drafter-bf16"),
        ("agg_tok_s", "essays", 32, ">=", -2.0, "relative_pct", "drafter-bf16"),
        ("acceptance_length", "gsm8k", 8, ">=", -5.0, "relative_pct", "drafter-bf16"),
        ("identical_to_baseline", "gsm8k", 8, ">=", 0.9, "absolute", None)]
    assert {c.concurrency for c in gates.cells() if c.workload.name == "gsm8k"} == {8}
    cells = {nb: sum(1 for _ in st.cells()) for nb, st in studies.items()}
    assert cells == {"03_target_precision": 3 * (2 * 3 + 1 + 1),
                     "05_fp8_drafter_gates": 2 * (3 * 3 + 1),
                     "07_the_bill": 3 * 3 * 3}
    assert [st.concurrency for st in studies.values()] == [[1, 8], [1, 8, 32], [1, 8, 32]]


def test_the_h200_standin_suite_binds_every_notebook_to_the_standin():
    """Issue 31's suite (prepared, not measured): all seven notebooks on the stand-in
    (build/standin) as params/h200-engines.yaml binds them on the small target, vLLM 0.26.0
    but for 04's engine B (SGLang 0.5.14), the articles' temperatures and levels and
    beyond to the crossover, at least 32 prompts, one steady window sized for the card."""
    suite = params.load_suite(PARAMS / "h200-standin.yaml")
    assert suite.results_path == (ROOT / "results" / "h200-standin").resolve()
    assert suite.substrate is not None and "22.54 GB" in suite.substrate.summary
    assert {e: b.share for e, b in suite.substrate.busy.items()} == {
        "vllm": 0.98, "sglang": 1.0, "embedded": 0.93}
    for busy in suite.substrate.busy.values():
        assert (ROOT / busy.source).is_file(), busy.source
    studies = params.resolve_all(suite)
    # every finding but those it excludes (the step-cost one reads the stand-in's stored
    # cells itself; its own cells are the CPU suite's: `excluded:` says so)
    assert list(studies) == bound(suite) and suite.excluded
    for nb, st in studies.items():
        for a in st.arms:
            p = a.resolved
            assert p.model.id in ("build/standin/target", "build/standin-nvfp4"), (nb, a.name)
            assert p.drafter is None or p.drafter.id.startswith("build/standin/"), (nb, a.name)
            assert p.engine_version == {"vllm": "0.26.0", "sglang": "0.5.14"}[p.engine]
        assert all(w.n >= 32 for w in st.workloads), nb
        # the suite's window on every notebook (02 and 05 restate it), one stream included
        # (issue 37: speed over counter windows at every level)
        assert st.window is not None and st.window.timing() == {
            "skip_s": 3.0, "window_s": 8.0, "turnovers": 3, "max_window_s": 30.0,
            "cap_spread": 0.5}, nb
        assert st.window.min_concurrency == 1, nb
        # one round: the A/A twins measure what a start changes; 02's runs differ by seed,
        # all four on one start of each arm
        assert (st.repeats, st.rounds) == ((4, 1) if nb == "02_temperature_spread" else (1, 1)), nb
    engines = {nb: {a.name: a.resolved.engine for a in st.arms if a.noise_of is None}
               for nb, st in studies.items()}
    assert engines.pop("04_engine_comparison") == {
        "engine-a-none": "vllm", "engine-a-spec": "vllm",
        "engine-b-none": "sglang", "engine-b-spec": "sglang"}
    # 05 on vLLM: SGLang 0.5.14 cannot serve an FP8 block drafter, vLLM reads an FP8
    # checkpoint of it (vllm-0.26-standin-dflash-k7-fp8-drafter)
    assert {a.name: a.resolved.name for a in studies["05_fp8_drafter_gates"].arms
            if a.noise_of is None} == {
        "drafter-bf16": "vllm-0.26-standin-dflash-k7",
        "drafter-fp8": "vllm-0.26-standin-dflash-k7-fp8-drafter"}
    assert all(set(e.values()) == {"vllm"} for e in engines.values())
    levels = {nb: st.concurrency for nb, st in studies.items()}
    LEVELS = {"01_drafter_block_sweep": [1, 2, 4, 8, 16, 32, 64, 128],
                      "02_temperature_spread": [1], "03_target_precision": [1, 8],
                      "04_engine_comparison": [1, 8], "05_fp8_drafter_gates": [1, 8, 32],
                      "06_draft_schedule_under_load": [1, 8, 32, 64, 128],
                      "07_the_bill": [1, 8, 32, 128]}
    assert subset(levels, LEVELS) == LEVELS
    temperatures = {nb: [s.temperature for s in st.sampling] for nb, st in studies.items()}
    assert temperatures.pop("01_drafter_block_sweep") == [0.7]  # article A's
    assert temperatures.pop("02_temperature_spread") == [0.7, 1.0]
    assert all(t == [0.0] for t in temperatures.values())  # article B's greedy
    cells = {nb: sum(1 for _ in st.cells()) for nb, st in studies.items()}
    # one round, and A/A twins of two arms at the lowest and the highest level (03: the
    # BF16 arm's essays; 04: every arm at one stream, where its checks are; 05: both arms
    # at the gates' 1 and 32 streams)
    CELLS = {"01_drafter_block_sweep": 4 * 8 + 2 * 2, "02_temperature_spread": 4 * 2 * 4,
                     "03_target_precision": 3 * (2 + 1 + 1) + 2,
                     "04_engine_comparison": 4 * 3 + 4, "05_fp8_drafter_gates": 2 * (3 + 1) + 2 * 2,
                     "06_draft_schedule_under_load": 6 * 5 + 2 * 2,
                     "07_the_bill": 3 * 4 + 2 * 2}
    assert subset(cells, CELLS) == CELLS
    windowed = {nb: sum(st.windowed(c) for c in st.cells()) for nb, st in studies.items()}
    # every speed cell, one stream included; GSM8K and HumanEval in 03 and GSM8K in 05
    # stay every prompt once (their outputs are graded or compared whole)
    WINDOWED = {"01_drafter_block_sweep": 4 * 8 + 2 * 2, "02_temperature_spread": 4 * 2 * 4,
                        "03_target_precision": 3 * 2 + 2, "04_engine_comparison": 4 * 3 + 4,
                        "05_fp8_drafter_gates": 2 * 3 + 2 * 2,
                        "06_draft_schedule_under_load": 6 * 5 + 2 * 2,
                        "07_the_bill": 3 * 4 + 2 * 2}
    assert subset(windowed, WINDOWED) == WINDOWED
    # and for every finding: each workload's cells windowed but GSM8K and HumanEval, which
    # send every prompt once where the study lists its window's workloads
    for nb, st in studies.items():
        for c in st.cells():
            assert st.windowed(c) == (st.window.workloads is None
                                      or c.workload.name in st.window.workloads), (nb, c)
    # the arms are h200-engines' arms by name and baseline, so claims and gates read alike
    engines_suite = params.resolve_all(params.load_suite(PARAMS / "h200-engines.yaml"))
    for nb, st in studies.items():
        theirs = [a.name for a in engines_suite[nb].arms]
        assert [a.name for a in st.arms][:len(theirs)] == theirs, nb
        assert st.baseline == engines_suite[nb].baseline, nb
        assert st.gates == engines_suite[nb].gates, nb
    # 03: one drafter, three precisions of the stand-in; 05: the drafter and its FP8 checkpoint
    precision = {a.name: (a.resolved.flags.get("quantization"), a.resolved.model.id,
                          a.resolved.drafter.id, a.resolved.speculative.num_speculative_tokens)
                 for a in studies["03_target_precision"].arms if a.noise_of is None}
    assert precision == {
        "target-bf16": (None, "build/standin/target", "build/standin/vllm/dflash", 7),
        "target-nvfp4": (None, "build/standin-nvfp4", "build/standin/vllm/dflash", 7),
        "target-fp8": ("fp8", "build/standin/target", "build/standin/vllm/dflash", 7)}
    assert [(a.resolved.drafter.id, a.resolved.speculative.quantization)
            for a in studies["05_fp8_drafter_gates"].arms if a.noise_of is None] == [
        ("build/standin/vllm/dflash", None), ("build/standin/vllm/dflash-fp8", None)]
    # 07: the KV pool of each arm at one memory setting (the slots set graphs, not the pool)
    memory = {tuple(a.resolved.flags.get(k) for k in ("gpu-memory-utilization",
                                                      "max-model-len", "kv-cache-dtype"))
              for a in studies["07_the_bill"].arms}
    assert memory == {(0.6, 4096, "auto")}
    # 06: every level within every arm's request slots, and each schedule's k at each level
    six = studies["06_draft_schedule_under_load"]
    assert all(a.resolved.flags["max-num-seqs"] >= max(six.concurrency) for a in six.arms)
    drafts = {a.name: [a.resolved.speculative.draft_tokens_at(c) if a.resolved.speculative
                       else 0 for c in six.concurrency] for a in six.arms}
    assert drafts == {"none": [0] * 5, "static-k3": [3] * 5, "static-k7": [7] * 5,
                      "schedule": [7, 7, 3, 3, 3], "schedule-zero-tail": [7, 7, 0, 0, 0],
                      "schedule-crossover": [7, 7, 7, 7, 0],
                      "none-aa": [0] * 5, "static-k7-aa": [7] * 5}
    # the twins: their arms again, at the lowest and the highest level only
    for nb, twins in (("06_draft_schedule_under_load", {"none-aa": "none",
                                                        "static-k7-aa": "static-k7"}),
                      ("07_the_bill", {"none-aa": "none", "dflash-k7-aa": "dflash-k7"})):
        st = studies[nb]
        assert {a.name: a.noise_of for a in st.arms if a.noise_of} == twins, nb
        for twin in twins:
            assert sorted({c.concurrency for c in st.cells() if c.arm.name == twin}) == [
                min(st.concurrency), max(st.concurrency)], (nb, twin)
    # 06 and 07 share their common cells: the same seed, window and one round
    six, seven = studies["06_draft_schedule_under_load"], studies["07_the_bill"]
    assert (six.seed, six.repeats, six.window) == (seven.seed, seven.repeats, seven.window)
    # the peer studies, run only when named: each engine alone, windowed like the notebooks
    assert list(suite.studies) == ["peer-vllm", "peer-sglang", "peer-embedded"]
    for sid, engine in (("peer-vllm", "vllm"), ("peer-sglang", "sglang"),
                        ("peer-embedded", "embedded")):
        st = params.resolve_study(suite, sid)
        assert {a.resolved.engine for a in st.arms} == {engine}, sid
        assert st.concurrency == [1, 8, 32, 128] and st.window is not None, sid
        assert all(a.resolved.model.id == "build/standin/target" for a in st.arms), sid


def test_the_h200_engines_results_are_not_git_ignored():
    import shutil
    import subprocess

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")

    def ignored(path: str) -> bool:  # git check-ignore: 0 ignored, 1 not
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT,
                              check=False).returncode == 0

    assert not ignored("results/h200-engines/01_drafter_block_sweep/h200-engines/manifest.json")
    assert not ignored("results/default/01_drafter_block_sweep/default/manifest.json")
    assert not ignored("results/h200-embedded/01_drafter_block_sweep/h200-embedded/manifest.json")
    assert ignored("results/rtx-pro-6000/01_drafter_block_sweep/rtx-pro-6000/manifest.json")


@pytest.mark.parametrize("suite_file", ["h200-standin.yaml", "h100-standin.yaml"])
def test_the_standin_vllm_profiles_capture_graphs_for_the_suites_levels_only(suite_file):
    """Issue 37: request slots at the suite's top level, and CUDA graphs captured for the
    batch sizes its cells run at (each level times 1 + the arm's drafts there), so an
    engine start captures no graph a cell never uses and every level has its own."""
    suite = params.load_suite(PARAMS / suite_file)
    studies = params.resolve_all(suite)
    levels = sorted({c for st in studies.values() for c in st.concurrency})
    assert levels == [1, 2, 4, 8, 16, 32, 64, 128]
    seen = 0
    for nb, st in studies.items():
        for arm in st.arms:
            p = arm.resolved
            if p.engine != "vllm":
                continue
            seen += 1
            assert p.flags["max-num-seqs"] == max(levels), (nb, arm.name)
            graphs = p.flags["compilation-config"]
            assert graphs["cudagraph_mode"] == "FULL_AND_PIECEWISE", (nb, arm.name)
            spec = p.speculative
            need = {c * (1 + (spec.draft_tokens_at(c) if spec else 0)) for c in levels}
            captured = set(graphs["cudagraph_capture_sizes"])
            assert need <= captured, (nb, arm.name, sorted(need - captured))
            if not (spec and spec.num_speculative_tokens_per_batch_size):
                assert captured == need, (nb, arm.name)  # nothing else
    assert seen  # the vLLM arms of 01-04, 06 and 07


def test_the_h100_suite_is_the_h200s_with_its_own_crossover_schedule():
    """The H100 suite measures the H200 suite's studies arm for arm on its own card, except
    06's third schedule, placed at the H100's measured crossover (62 streams) under its own
    arm name, so no cell of the schedule at 64 is ever mixed with it."""
    h200 = params.resolve_all(params.load_suite(PARAMS / "h200-standin.yaml"))
    h100 = params.resolve_all(params.load_suite(PARAMS / "h100-standin.yaml"))
    assert list(h100) == list(h200)
    for nb in h200:
        if nb != "06_draft_schedule_under_load":
            assert [a.name for a in h100[nb].arms] == [a.name for a in h200[nb].arms], nb
            def cells(st):
                return [(c.arm.name, c.workload.name, c.concurrency, c.sampling.temperature,
                         c.repeat, c.seed) for c in st.cells()]
            assert cells(h100[nb]) == cells(h200[nb]), nb
    six = h100["06_draft_schedule_under_load"]
    drafts = {a.name: [a.resolved.speculative.draft_tokens_at(c) if a.resolved.speculative
                       else 0 for c in six.concurrency] for a in six.arms}
    assert drafts.pop("schedule-crossover-62") == [7, 7, 7, 0, 0]   # 1, 8, 32 | 64, 128
    assert "schedule-crossover" not in drafts
    assert {a.name: (a.profile, a.overrides) for a in six.arms if a.name in drafts} == {
        a.name: (a.profile, a.overrides) for a in h200["06_draft_schedule_under_load"].arms
        if a.name in drafts}

