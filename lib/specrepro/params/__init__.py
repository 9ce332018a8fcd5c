"""Parameters: YAML profiles, studies and suites, validated on load into typed objects.

Design:
- Three kinds of file: a **Profile** is one engine configuration (`params/profiles/*.yaml`),
  a **Study** is what one finding's notebook measures (`findings/<id>/study.yaml`; a study no
  notebook renders, such as parity, in `params/studies/`), a **Suite** binds every finding
  to its study and to one setup's profiles and sizes (`params/default.yaml`,
  `params/smoke.yaml`, the GPU suites), saying only what differs there (schema.py).
- Any file may start with `include: [a.yaml, ...]`; includes and overrides deep-merge
  (mappings key by key, the rest replaced, later wins) and every merged value remembers
  the file and key path that set it, so a validation error names the file the user must
  edit, the dotted key path, what was expected and what was found.
- Strict pydantic v2 models (`extra="forbid"`, no coercion): an unknown key, a string where
  a number belongs, a draft schedule vLLM would reject, an arm naming a missing profile or
  a baseline naming a missing arm all fail before anything runs.
- API: load_profile / load_study / load_suite(path); resolve_study(suite, notebook_id,
  overrides=None) -> ResolvedStudy whose arms carry `.resolved` Profiles; study.cells()
  enumerates the cells (skips applied, one seed per repeat), whose results-store identity
  is `specrepro.identity.cell_id(study, cell, engine_version)`;
  check_notebook_params(params, papermill_inspect_output); `specrepro check FILE...`.
- Modules: `tree` (YAML include/merge with provenance), `errors` (Problem, ParamsError),
  `validation` (pydantic errors located in files), `strict` (the models' base), `study`
  (the study models and cells), `window` (a study's steady window), `substrate` (a suite's
  `substrate:`), `plan` (a suite's `plan:`: the planner's priors and order), `schema`
  (profiles, suites, resolved studies), `resolve` (loading and resolving), `cli`
  (what `specrepro check` says of a valid file). Import order, no cycle: errors, tree, validation, strict, window,
  substrate, study, plan, schema, resolve, cli.
"""

from specrepro.params.cli import summarize
from specrepro.params.errors import ParamsError, Problem
from specrepro.params.plan import (
    ByStreams,
    EnginePriors,
    Export,
    Figure,
    FirstStart,
    Plan,
    Step,
)
from specrepro.params.resolve import (
    check_notebook_params,
    is_suite,
    load_profile,
    load_study,
    load_suite,
    profiles_beside,
    resolve_all,
    resolve_file,
    resolve_study,
    standalone_suite,
)
from specrepro.params.schema import (
    NOTEBOOK_IDS,
    DrafterRef,
    Hardware,
    MappedProfile,
    ModelRef,
    NotebookBinding,
    Parallel,
    Profile,
    ResolvedArm,
    ResolvedProbe,
    ResolvedStudy,
    SpeculativeConfig,
    StudyBinding,
    Suite,
)
from specrepro.params.strict import Strict
from specrepro.params.study import (
    GATE_OPS,
    WORKLOADS,
    Arm,
    Cell,
    Gate,
    Probe,
    Sampling,
    Skip,
    Study,
    Workload,
)
from specrepro.params.tree import read_tree

__all__ = [
    "GATE_OPS", "NOTEBOOK_IDS", "WORKLOADS", "Arm", "ByStreams", "Cell", "DrafterRef",
    "EnginePriors", "Export", "Figure", "FirstStart", "Gate", "Hardware", "MappedProfile",
    "ModelRef", "NotebookBinding", "Parallel", "ParamsError", "Plan", "Probe", "Problem",
    "Profile", "ResolvedArm", "ResolvedProbe", "ResolvedStudy", "Sampling", "Skip",
    "SpeculativeConfig", "Step", "Strict", "Study", "StudyBinding", "Suite", "Workload",
    "check_notebook_params", "is_suite", "load_profile", "load_study", "load_suite",
    "profiles_beside", "read_tree", "resolve_all", "resolve_file", "resolve_study",
    "standalone_suite", "summarize",
]
