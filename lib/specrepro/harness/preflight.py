"""What a run can know is wrong before an engine starts or a file is written, and
`specrepro check`, which says it for a params file.

Design:
- `problems(studies, chosen)` checks the resolved studies' chosen arms and the cells they
  would measure, each problem a `params.Problem` naming the file and key that set the value
  (the resolved study's and profile's `locate`: the study file, the suite's overrides, a
  profile or an arm's overrides):
  - each workload built as the runner builds it (workloads.build_workload): `n` past the
    prompts a workload has (`TooFewPrompts`), a spec it cannot build; a data file that is
    missing or malformed is a `DataError` (data.read_gsm8k names its line) and is raised;
  - a cell timed by its requests (every prompt once, no steady window) whose concurrency
    is above its workload's prompts: the streams past them never send one, and the cell
    would be stored at a concurrency no request saw;
  - per arm, its engine's facts (its adapter's, harness/engines/): flags that must be a
    positive integer (request slots, context), a draft count past the engine's bound, a
    model or drafter folder without `config.json` (and, with `here`, a model folder the
    engine needs and this machine lacks);
  - each workload's `max_tokens` (with a prefill workload's longest prompt) against the
    arm's context length: the profile's context flag, else the engine's default, else
    the model folder's config.json `max_position_embeddings`, whichever is smallest.
- `results_problem(folder, stores)` says why a results folder, or a store in it, cannot be
  written (not a folder, not writable by this user), before the first write.
- `main` is `specrepro check FILE...`: params/cli.summarize (validation with file and key),
  then, for a suite or a study, `problems`; data that no source has here is said as a
  note (the check is of the params), data that is malformed is an error. Exit status 2 on
  any error, else 0.
"""
from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from specrepro.data import DataError, DataMalformed
from specrepro.harness import engines
from specrepro.params import ParamsError, Problem, ResolvedStudy, resolve_study
from specrepro.workloads import TooFewPrompts, WorkloadError, WorkloadSpec, build_workload


def problems(studies: Sequence[ResolvedStudy], chosen: Sequence[set[str]] | None = None, *,
             here: bool = True) -> list[Problem]:
    """Every problem of the chosen arms (all where `chosen` is None) and their cells that
    shows before an engine starts (module docstring). DataError where a workload's data is
    missing or malformed."""
    out: list[Problem] = []
    for i, study in enumerate(studies):
        arms = {a.name for a in study.arms} if chosen is None else chosen[i]
        cells = [c for c in study.cells() if c.arm.name in arms]
        used = {c.workload.name for c in cells}
        sizes: dict[int, int] = {}
        for w_i, w in enumerate(study.workloads):
            if w.name not in used:
                continue
            try:
                sizes[w_i] = len(build_workload(w))
            except TooFewPrompts as err:
                out.append(Problem(*study.locate("workloads", w_i, "n"),
                                   f"expected at most {err.available} (the prompts workload "
                                   f"{w.name} has), found {w.n}"))
            except WorkloadError as err:
                out.append(Problem(*study.locate("workloads", w_i), str(err)))
        out += _concurrency(study, cells, sizes)
        chosen_arms = [a for a in study.arms if a.name in arms]
        for arm in chosen_arms:
            out += arm_problems(arm, here)
        out += _context(study, chosen_arms)
    return _unique(out)


def _context(study: ResolvedStudy, arms) -> list[Problem]:
    """Each workload's output cap (with a prefill workload's longest prompt) against the
    arms' context lengths, one problem a workload naming the arms it does not fit."""
    out = []
    contexts = [(arm, *context_of(arm.resolved, engines.engine(arm.resolved.engine)))
                for arm in arms]
    for w_i, w in enumerate(study.workloads):
        prompt, cap = max(w.prefill_tokens or [1]), WorkloadSpec.of(w).output_cap
        short = [(n, why, arm.name) for arm, n, why in contexts
                 if n is not None and cap + prompt > n]
        if not short:
            continue
        n, why, _ = min(short)
        names = ", ".join(repr(name) for _, _, name in short)
        whose = f"the context of arm{'s' if len(short) > 1 else ''} {names}: {n} tokens, {why}"
        if prompt >= n:  # the prompt alone fills the context
            out.append(Problem(*study.locate("workloads", w_i, "prefill_tokens"),
                               f"expected prompt lengths below {n} ({whose}), found {prompt}"))
            continue
        key = ["max_tokens"] if w.max_tokens is not None else []
        out.append(Problem(*study.locate("workloads", w_i, *key),
                           f"expected at most {n - prompt} output tokens ({whose}; a "
                           f"request's prompt takes {prompt}+ of them), found {cap}"))
    return out


def _concurrency(study: ResolvedStudy, cells, sizes: dict[int, int]) -> list[Problem]:
    """Levels above a requests-timed cell's prompts, once per level and workload."""
    out, seen = [], set()
    for cell in cells:
        w_i = study.workloads.index(cell.workload)
        n = sizes.get(w_i)
        if n is None or cell.concurrency <= n or study.windowed(cell):
            continue
        if (cell.concurrency, w_i) in seen:
            continue
        seen.add((cell.concurrency, w_i))
        c_i = study.concurrency.index(cell.concurrency)
        many = "s" if n != 1 else ""
        out.append(Problem(*study.locate("concurrency", c_i),
                           f"expected at most {n} stream{many} for workload "
                           f"{cell.workload.name} ({n} prompt{many}: a cell timed by its "
                           "requests sends each once, so streams past them never send one "
                           "and the cell would be stored at a concurrency no request saw; "
                           "raise its n or give the study a steady window), found "
                           f"{cell.concurrency}"))
    return out


def arm_problems(arm, here: bool = True) -> list[Problem]:
    """An arm's profile against its engine's facts (its adapter's)."""
    profile = arm.resolved
    adapter = engines.engine(profile.engine)
    out = []
    for name in adapter.positive_flags:
        found = adapter.flag(profile, name)
        if found is not None and found[1] is not None and not (
                isinstance(found[1], int) and not isinstance(found[1], bool) and found[1] >= 1):
            out.append(Problem(*profile.locate("flags", found[0]),
                               f"expected a positive integer for {name} ({adapter.what} "
                               f"refuses anything else at start), found {found[1]!r}"))
    spec = profile.speculative
    bound = adapter.max_draft_tokens
    k = spec.num_speculative_tokens if spec is not None else None
    if k is not None and bound is not None and k > bound:  # a schedule's k are capped at k
        out.append(Problem(*profile.locate("speculative", "num_speculative_tokens"),
                           f"expected at most {bound} drafts ({adapter.what}'s bound), "
                           f"found {k}"))
    out += _folders(profile, adapter, here)
    return out


def context_of(profile, adapter) -> tuple[int | None, str]:
    """The arm's context length in tokens, and where it comes from; (None, "") unknown."""
    found = []
    flag = adapter.flag(profile, adapter.context_flag) if adapter.context_flag else None
    if flag is not None and isinstance(flag[1], int) and flag[1] >= 1:
        found.append((flag[1], f"its profile's {flag[0]}"))
    elif (default := adapter.default_context()) is not None:
        found.append((default, f"{adapter.what}'s default {adapter.context_flag}"))
    config = model_config(profile.model.id)
    if isinstance((n := (config or {}).get("max_position_embeddings")), int):
        found.append((n, f"{profile.model.id}/config.json max_position_embeddings"))
    return min(found) if found else (None, "")


def model_config(folder: str) -> dict | None:
    """A local model folder's config.json, or None (a hub id, or no such file)."""
    path = Path(folder) / "config.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None


def _folders(profile, adapter, here: bool) -> list[Problem]:
    """A local model or drafter folder without config.json; with `here`, the model folder
    an engine that loads only local folders needs and this machine lacks."""
    out = []
    named = [(("model", "id"), profile.model.id)]
    if profile.drafter is not None:
        named.append((("drafter", "id"), profile.drafter.id))
    if profile.speculative is not None and profile.speculative.model:
        named.append((("speculative", "model"), profile.speculative.model))
    for key, folder in named:
        path = Path(folder)
        if path.is_dir() and not (path / "config.json").is_file():
            out.append(Problem(*profile.locate(*key),
                               f"expected a model folder holding config.json, found "
                               f"{folder} without one ({_listing(path)})"))
        elif here and adapter.local_model and key == ("model", "id") and not path.is_dir():
            out.append(Problem(*profile.locate(*key),
                               f"expected a local model folder ({adapter.what} loads no hub "
                               f"id), found no folder {folder} (from {os.getcwd()})"))
    return out


def _listing(path: Path) -> str:
    names = sorted(p.name for p in path.iterdir())
    return "it holds " + (", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
                          if names else "nothing")


def _unique(items: Iterable[Problem]) -> list[Problem]:
    seen, out = set(), []
    for p in items:
        if (p.file, p.key, p.message) not in seen:
            seen.add((p.file, p.key, p.message))
            out.append(p)
    return out


# ------------------------------------------------------------------ the results folder


def results_problem(folder: Path, stores: Sequence[Path] = ()) -> str | None:
    """Why the results folder, or one of these stores in it, cannot be written by this
    user: a path that is not a folder (a file, a device), a folder without write access,
    or a missing one whose nearest existing parent is either; None where it can."""
    for path in [Path(folder), *stores]:
        probe = path
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        mode = probe.stat().st_mode
        if not stat.S_ISDIR(mode):
            kind = ("a character device" if stat.S_ISCHR(mode) else "a block device"
                    if stat.S_ISBLK(mode) else "a file" if stat.S_ISREG(mode) else "not a folder")
            return f"{probe} is {kind}, not a folder to keep results in"
        if not os.access(probe, os.W_OK | os.X_OK):
            return (f"{probe} is not writable by this user ({_why(probe)})"
                    + (f", so {path} cannot be made" if probe != path else ""))
        for sub in ("cells", "requests", "logs") if probe == path and path in stores else ():
            d = path / sub
            if d.is_dir() and not os.access(d, os.W_OK | os.X_OK):
                return f"{d} is not writable by this user ({_why(d)})"
    return None


def _why(folder: Path) -> str:
    """A folder's mode and owner, or what else refuses writes (a read-only mount, an
    immutable folder) where the mode would allow them."""
    st = folder.stat()
    mode = f"mode {stat.S_IMODE(st.st_mode):o}, owner uid {st.st_uid}"
    if os.geteuid() == 0 or (st.st_uid == os.geteuid() and st.st_mode & stat.S_IWUSR):
        return f"{mode}: a read-only file system or an immutable folder"
    return mode


# ------------------------------------------------------------------ specrepro check


def main(argv: list[str] | None = None) -> int:
    """`specrepro check FILE...`: validate params files (suite, study or profile), then what
    a run of each would meet before its engines start; exit 2 on any error."""
    from specrepro.params.cli import summarize

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: specrepro check FILE... (suite, study or profile YAML): each file "
              "validated, then a suite's or study's workloads, levels, engines' bounds and "
              "model folders, as `specrepro run` checks them before an engine starts")
        return 0 if argv else 2
    status = 0
    for file in argv:  # a file's summary once it passes; its errors alone where it does not
        note = ""
        try:
            studies = _studies(file)
            summary = summarize(file, studies)
            try:
                found = problems(list(studies.values()), here=False)
            except DataMalformed:  # the data a run would read: refused as a run does
                raise
            except DataError as err:  # no data here: the params themselves are checked
                found, note = [], f"\n  note: workload sizes not checked: {err}"
            if found:
                raise ParamsError(found)
        except (ParamsError, DataMalformed) as err:
            print(f"error: {err}", file=sys.stderr)
            status = 2
            continue
        print(summary + note)
    return status


def _studies(file: str) -> dict[str, ResolvedStudy]:
    """The resolved studies of a suite (its notebooks and its `studies:`) or of a study
    file beside a profiles folder, by id; none for a profile or a study standing alone."""
    from specrepro.params import is_suite, load_suite, profiles_beside, read_tree
    from specrepro.params import resolve_file as resolve

    data = read_tree(file).data
    if is_suite(data):
        suite = load_suite(file)
        return {nb: resolve_study(suite, nb) for nb in [*suite.notebooks, *suite.studies]}
    if "arms" in data and profiles_beside(file).is_dir():
        return {study.notebook: study for study, _, _ in resolve(file)}
    return {}
