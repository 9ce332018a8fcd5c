"""Loading: params files into validated models, and a notebook's study resolved.

Design:
- `load_profile` / `load_study` / `load_suite(path)` read a file with its includes merged
  and validate it; a profile's `name` defaults to its file's stem. A suite binds every
  finding it does not exclude (`Suite.bind_every_finding`), each to its own study
  (`findings/<id>/study.yaml`) unless its binding names another file.
- `resolve_study(suite, notebook_id, overrides=None)` gives the study one notebook runs:
  the study file, the suite's `window`, the suite's `defaults` (a finding's study only; their
  `workloads` merged into each workload), the suite's overrides for that notebook (then a
  notebook's own `overrides` parameter on top), the suite's profile map applied (a notebook's
  own map over the suite-wide one; a mapped profile's overrides merged into the profile before
  the arm's), and every arm's profile loaded with the arm's overrides merged
  in and validated. Each step validates with provenance, so an error names the study,
  suite, profile or notebook parameter that set the key.
- Relative paths inside a file (includes, a suite's study files, profiles directory and
  results_dir) are relative to the file that names them, never to the working directory.
- `check_notebook_params(params, papermill_inspect_output)` fails on a parameter a
  notebook does not declare (papermill only warns).
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from specrepro import findings
from specrepro.params.errors import ParamsError, Problem, one_of
from specrepro.params.schema import NOTEBOOK_IDS, MappedProfile, Profile, ResolvedStudy, Suite
from specrepro.params.study import Arm, Study
from specrepro.params.tree import Provenance, Tree, deep_merge, display_file, lookup, read_tree
from specrepro.params.validation import located, validate


def load_profile(path: Path | str) -> Profile:
    """Read and validate one profile file; `name` defaults to the file's stem."""
    tree = read_tree(path)
    tree.data.setdefault("name", Path(path).stem)
    profile = validate(Profile, tree)
    profile._source = display_file(path)
    return profile


def load_study(path: Path | str) -> Study:
    """Read and validate one study file (its arms' profiles are not loaded)."""
    return validate(Study, read_tree(path))


def load_suite(path: Path | str) -> Suite:
    """Read and validate a suite file; resolve_study() then gives each notebook's study."""
    path = Path(path)
    tree = read_tree(path)
    suite = validate(Suite, tree)
    suite._path = path.resolve()
    suite._tree = tree
    suite.bind_every_finding()
    for nb in [*suite.notebooks, *suite.studies]:
        if not suite.study_path(nb).is_file():
            file, key = located(tree, (suite.section(nb), nb, "study"))
            raise ParamsError(
                [
                    Problem(
                        file,
                        key,
                        f"expected a study file, found nothing at "
                        f"{display_file(suite.study_path(nb))}",
                    )
                ]
            )
    return suite


def resolve_study(suite: Suite, notebook_id: str, overrides: Mapping[str, Any] | None = None
                  ) -> ResolvedStudy:
    """The study of one notebook with the suite's overrides and profile map applied and
    every arm's profile loaded, overridden and validated. `overrides` (a notebook's
    parameter) merge on top of the suite's own, the same way (mappings key by key, lists
    replace); an error in them names "notebook parameter 'overrides' of <notebook>"."""
    if overrides:
        suite = _with_overrides(suite, notebook_id, overrides)
    if notebook_id not in suite.notebooks and notebook_id not in suite.studies:
        file, _ = located(suite._tree, ()) if suite._tree else (str(suite.path), "")
        known = [*suite.notebooks, *suite.studies]
        raise ParamsError(
            [Problem(file, "notebooks", one_of("a notebook or study id", known, notebook_id))]
        )
    binding = suite.binding(notebook_id)
    section = suite.section(notebook_id)
    tree = read_tree(suite.study_path(notebook_id))
    _suite_window(tree, suite)
    if section == "notebooks":
        _suite_defaults(tree, suite)
    deep_merge(tree, suite._tree, (), (section, notebook_id, "overrides"))
    kind = "notebook" if section == "notebooks" else "study"
    context = f"resolving {kind} {notebook_id} of suite {display_file(suite.path)}"
    study = validate(Study, tree, context)
    mapping = {**suite.profile_map, **binding.profiles}
    used = {a.profile for a in [*study.arms, *study.probes]}
    for key in binding.profiles:
        if key not in used:
            file, where = located(suite._tree, (section, notebook_id, "profiles", key))
            raise ParamsError(
                [
                    Problem(
                        file,
                        where,
                        one_of("a profile used by the study's arms", sorted(used), key),
                    )
                ],
                context,
            )
    arms = [
        _resolve_arm(suite, notebook_id, tree, i, arm, mapping, context)
        for i, arm in enumerate(study.arms)
    ]
    probes = [
        _resolve_arm(suite, notebook_id, tree, i, probe, mapping, context, part="probes")
        for i, probe in enumerate(study.probes)
    ]
    data = study.model_dump() | {
        "arms": arms,
        "probes": probes,
        "notebook_id": notebook_id,
        "source": tree.prov.locate(())[0],
    }
    study = ResolvedStudy.model_validate(data, strict=False)
    study._tree = tree
    problems = study.api_problems()  # across the study and its arms' profiles
    if problems:
        raise ParamsError(problems, context)
    return study


def _suite_window(study: Tree, suite: Suite) -> None:
    """The suite's `window:` on a study that declares one (params/window.py), before the
    notebook's own overrides: a mapping sizes it for the suite's substrate, null switches it
    off (a suite whose stored cells were measured without one). A study that declares no
    window gets none from its suite."""
    if suite._tree is None or "window" not in suite._tree.data or study.data.get("window") is None:
        return
    if suite._tree.data["window"] is None:
        study.data["window"] = None
        study.prov.set(("window",), suite._tree.prov.locate(("window",)))
    else:
        deep_merge(study, suite._tree, ("window",), ("window",))


def _suite_defaults(study: Tree, suite: Suite) -> None:
    """The suite's `defaults:` merged into a finding's study, before its own overrides: each
    key as an override would be, `workloads` (a mapping) into each workload of the study."""
    defaults = lookup(suite._tree.data, ("defaults",)) if suite._tree is not None else None
    if not defaults:
        return
    rest = {k: v for k, v in defaults.items() if k != "workloads"}
    deep_merge(study, Tree({"defaults": rest}, suite._tree.prov), (), ("defaults",))
    if isinstance(defaults.get("workloads"), dict):
        for i, w in enumerate(study.data.get("workloads") or []):
            if isinstance(w, dict):
                deep_merge(study, suite._tree, ("workloads", i), ("defaults", "workloads"))


def _resolve_arm(
    suite: Suite, notebook_id: str, study_tree: Tree, i: int, arm: Arm, mapping: dict, context: str,
    part: str = "arms",
) -> dict:
    """An arm's (or a probe's: part "probes") profile loaded with its overrides merged in:
    the profile the suite maps the arm's to (with the mapping's overrides), else its own."""
    entry = mapping.get(arm.profile, arm.profile)
    name = entry.profile if isinstance(entry, MappedProfile) else entry
    path = suite.profiles_path / f"{name}.yaml"
    if not path.is_file():
        available = sorted(p.stem for p in suite.profiles_path.glob("*.yaml"))
        file, key = located(study_tree, (part, i, "profile"))
        for where in ((suite.section(notebook_id), notebook_id, "profiles"), ("profile_map",)):
            if name != arm.profile and arm.profile in (lookup(suite._tree.data, where) or {}):
                file, key = located(suite._tree, (*where, arm.profile))
                break
        msg = one_of(f"a profile in {display_file(suite.profiles_path)}", available, name)
        raise ParamsError([Problem(file, key, msg)], context)
    profile_tree = read_tree(path)
    profile_tree.data.setdefault("name", name)
    if isinstance(entry, MappedProfile):  # the suite's derivation of the arm, then the arm's
        binding = suite.binding(notebook_id).profiles
        where = ((suite.section(notebook_id), notebook_id, "profiles", arm.profile)
                 if arm.profile in binding else ("profile_map", arm.profile))
        deep_merge(profile_tree, suite._tree, (), (*where, "overrides"))
    deep_merge(profile_tree, study_tree, (), (part, i, "overrides"))
    what = "arm" if part == "arms" else "probe"
    profile = validate(Profile, profile_tree, f"{context}, {what} {arm.name!r}")
    profile._source = display_file(path)
    profile._tree = profile_tree
    return arm.model_dump() | {"resolved": profile}


def _with_overrides(suite: Suite, notebook_id: str, overrides: Mapping[str, Any]) -> Suite:
    """A copy of the suite whose tree has a notebook's overrides merged into its own."""
    suite = copy.copy(suite)
    tree = copy.deepcopy(suite._tree)
    patch = Tree({suite.section(notebook_id): {notebook_id: {"overrides": copy.deepcopy(overrides)}}},
                 Provenance.of_file(f"notebook parameter 'overrides' of {notebook_id}"))
    deep_merge(tree, patch)
    suite._tree = tree
    return suite


def standalone_suite(study_path: Path | str, notebook_id: str, profiles: Path | str) -> Suite:
    """A suite of one study file as it stands, bound to a profiles directory."""
    study_path = Path(study_path).resolve()
    # a study no notebook renders (parity) is bound as a suite's `studies:` entry
    section = "notebooks" if notebook_id in NOTEBOOK_IDS else "studies"
    data = {
        "name": "standalone",
        "run_id": "standalone",
        "binds": "listed",
        "profiles": str(Path(profiles).resolve()),
        "notebooks": {},
        section: {notebook_id: {"study": str(study_path)}},
    }
    suite = Suite.model_validate(data)
    suite._path = study_path
    suite._tree = Tree(data, Provenance.of_file(display_file(study_path)))
    return suite


def is_suite(data: Mapping) -> bool:
    """Whether a params file's merged keys are a suite's (a study has `arms:`)."""
    return "notebooks" in data or "run_id" in data


def profiles_beside(study_path: Path | str) -> Path:
    """The profiles folder a study file outside a suite resolves against: a finding's study
    (findings/<id>/study.yaml) the checkout's params/profiles, another study the `profiles/`
    folder beside its own folder (params/studies/ -> params/profiles)."""
    study_path = Path(study_path).resolve()
    if study_path.parent.parent == findings.FOLDER:
        return findings.FOLDER.parent / "params" / "profiles"
    return study_path.parent.parent / "profiles"


def resolve_all(suite: Suite) -> dict[str, ResolvedStudy]:
    return {nb: resolve_study(suite, nb) for nb in suite.notebooks}


def check_notebook_params(
    params: Mapping[str, Any],
    allowed: Mapping[str, Any] | Iterable[str],
    where: str = "notebook parameters",
) -> None:
    """Fail on keys a notebook does not declare (papermill only warns about them).

    allowed: papermill.inspect_notebook(path) output (name -> info) or a list of names.
    """
    names = list(allowed.keys() if isinstance(allowed, Mapping) else allowed)
    problems = []
    for key in params:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(
                Problem(
                    where,
                    key,
                    f"unknown parameter {key!r}{hint}; expected one of: {', '.join(names)}",
                )
            )
    if problems:
        raise ParamsError(problems)


def resolve_file(path: Path | str, notebooks: Sequence[str] = ()
                 ) -> list[tuple[ResolvedStudy, Path, str]]:
    """(study, results dir, run id) for a suite (its notebooks, or the notebooks and
    studies named) or a study file (its arms' profiles from `profiles_beside` it)."""
    path = Path(path)
    tree = read_tree(path)
    if is_suite(tree.data):
        suite = load_suite(path)
        chosen = list(notebooks) or list(suite.notebooks)
        return [(resolve_study(suite, nb), suite.results_path, suite.run_id) for nb in chosen]
    if "arms" in tree.data:
        nb = tree.data.get("notebook")
        profiles = profiles_beside(path)
        suite = standalone_suite(path, nb, profiles)
        return [(resolve_study(suite, nb), path.resolve().parents[2] / "results",
                 suite.run_id)]
    raise ParamsError([Problem(str(path), "", "expected a suite (notebooks:) or a study "
                                              f"(arms:), found keys {sorted(tree.data)}")])
