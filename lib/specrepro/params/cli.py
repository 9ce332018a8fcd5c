"""The validation half of `specrepro check FILE...` (the command is harness/preflight.py,
which adds what a run would meet before its engines start): a params file of any kind
validated and described.

Design:
- The kind is read from the merged tree: `notebooks:` is a suite, `arms:` a study,
  `engine:` (or a file in a `profiles/` folder) a profile. A suite is resolved notebook by
  notebook (cells and arms listed, and the findings it excludes with their reasons); a
  finding's study, or a study beside `params/profiles`, is resolved against that folder
  (`resolve.profiles_beside`); a profile is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from specrepro.params.errors import ParamsError, Problem
from specrepro.params.resolve import (
    is_suite,
    load_profile,
    load_study,
    load_suite,
    profiles_beside,
    resolve_study,
    standalone_suite,
)
from specrepro.params.schema import NOTEBOOK_IDS, ResolvedStudy
from specrepro.params.tree import Tree, display_file, read_tree


def _kind(tree: Tree, path: Path) -> str:
    if is_suite(tree.data):
        return "suite"
    if "arms" in tree.data:
        return "study"
    if "engine" in tree.data or path.parent.name == "profiles":
        return "profile"
    return "unknown"


def summarize(path: Path | str, resolved: Mapping[str, ResolvedStudy] | None = None) -> str:
    """Validate one file of any kind and describe it in a few lines (`resolved`: a suite's
    or a study file's studies by id, where the caller has resolved them already)."""
    path = Path(path)
    kind = _kind(read_tree(path), path)
    if kind == "suite":
        suite = load_suite(path)
        lines = [
            (
                f"{path}: suite {suite.name!r}, run_id {suite.run_id!r}, "
                f"results in {display_file(suite.results_path)}"
            )
        ]
        for nb in [*suite.notebooks, *suite.studies]:
            st = resolved[nb] if resolved else resolve_study(suite, nb)
            n_cells = sum(1 for _ in st.cells())
            arms = ", ".join(f"{a.name}={a.resolved.name}" for a in st.arms)
            kind = "" if nb in suite.notebooks else " (study, no notebook)"
            probes = "; probes " + ", ".join(f"{p.name}={p.resolved.name}"
                                             for p in st.probes) if st.probes else ""
            lines.append(f"  {nb}{kind}: {n_cells} cells; arms {arms}{probes}")
        lines += [f"  {nb}: excluded ({why})" for nb, why in suite.excluded.items()]
        return "\n".join(lines)
    if kind == "study":
        st = load_study(path)
        profiles = profiles_beside(path)
        given = resolved.get(st.notebook) if resolved else None
        resolved = given is not None or (st.notebook in NOTEBOOK_IDS and profiles.is_dir())
        if given is not None:
            st = given
        elif resolved:  # a study beside params/profiles: check its arms' profiles too
            st = resolve_study(standalone_suite(path, st.notebook, profiles), st.notebook)
        return (
            f"{path}: study {st.name!r}, {len(st.arms)} arms, "
            f"{len(st.workloads)} workloads, concurrency {st.concurrency}, "
            f"{sum(1 for _ in st.cells())} cells"
            + ("" if resolved else " (profiles not resolved outside a suite)")
        )
    if kind == "profile":
        pr = load_profile(path)
        return f"{path}: profile {pr.name!r}, engine {pr.engine}, method {pr.method}"
    raise ParamsError(
        [
            Problem(
                display_file(path),
                "",
                "expected a suite (notebooks:), a study "
                "(arms:) or a profile (engine:), found "
                f"keys {sorted(read_tree(path).data)}",
            )
        ]
    )
