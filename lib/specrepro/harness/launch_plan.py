"""Which arms a run measures and which engine start serves them (runner.py runs the plan).

Design:
- `chosen_arms`: per study, the arms named with `--arm` (all where none is) whose profile
  runs on an engine named with `--engine` (any where none is: the engines staged on this
  machine); unknown names fail first, naming what there is.
- `launch_groups`: the arms of every study of a command grouped by the engine they need,
  one group per resolved profile and placement policy, so one engine start serves every
  arm that resolves to it (a start is 1-2 minutes on a fresh GPU machine). Each study's
  baseline group comes before its other groups (their cells compare outputs with the
  baseline's stored ones). The runner walks the groups once per round of repeats
  (runner.py, engine_pool.py).
- An A/A twin (an arm declared `noise_of: <arm>`, params/study.py) is its arm started
  again and measured again: twins never ride on their arm's start. They form groups of
  their own (one per resolved profile: the twins of several studies share that second
  start) placed after every other group of the round, so a twin's cells come a whole
  round of other engines after its arm's, and the A/A difference holds what an engine
  start and the time between them change.
- Duck-typed on the runner's per-study state (`study`, `arms()`), so it imports nothing
  of the runner.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specrepro import identity
from specrepro.params import ParamsError, Problem, ResolvedArm, ResolvedStudy

_Run = Any  # runner._Run: a study of the run, its arms to run (`arms()`: baseline first)


def chosen_arms(studies: Sequence[ResolvedStudy], arms: Sequence[str] = (),
                engines_: Sequence[str] = ()) -> list[set[str]]:
    """Per study, the arms a run measures: those named (--arm; all where none is) whose
    profile runs on an engine named (--engine; any where none is); names checked first.
    With several studies a name need only be an arm of one of them (06's `static-k7` and
    07's `mtp-control` in one command); a study none of whose arms is named runs none."""
    if len(studies) == 1:
        check_arms(studies[0], arms)
    else:
        have = {a.name for study in studies for a in study.arms}
        unknown = [a for a in arms if a not in have]
        if unknown:
            names = ", ".join(st.name for st in studies)
            raise ParamsError([Problem("--arm", "arms", f"--arm: expected an arm of one of "
                                       f"{names} ({', '.join(sorted(have))}), found "
                                       f"{unknown[0]!r}")])
    check_engines(studies, engines_)
    return [{a.name for a in study.arms if (not arms or a.name in arms)
             and (not engines_ or a.resolved.engine in engines_)} for study in studies]


def check_arms(study: ResolvedStudy, arms: Sequence[str]) -> None:
    """ParamsError naming the first of `arms` (--arm) the study does not have."""
    names = [a.name for a in study.arms]
    unknown = [a for a in arms if a not in names]
    if unknown:
        raise ParamsError([Problem(study.source, "arms", f"--arm: expected an arm of study "
                                   f"{study.name} ({', '.join(names)}), found {unknown[0]!r}")])


def check_engines(studies: Sequence[ResolvedStudy], engines_: Sequence[str]) -> None:
    """ParamsError naming the first of `engines_` (--engine) that no arm of the studies
    runs on, with the engines they do run on."""
    have = sorted({a.resolved.engine for st in studies for a in st.arms})
    unknown = [e for e in engines_ if e not in have]
    if unknown:
        names = ", ".join(st.name for st in studies)
        raise ParamsError([Problem(studies[0].source if len(studies) == 1 else "--engine",
                                   "arms", f"--engine: expected an engine the arms of {names} "
                                   f"run on ({', '.join(have)}), found {unknown[0]!r}")])


def launch_groups(ctxs: Sequence[_Run]) -> list[list[tuple[_Run, ResolvedArm]]]:
    """The arms of every study grouped by the engine they need: one group per resolved
    profile (profile_hash: flags, env, port, models and their content) and placement
    policy. One engine start serves a group's arms one after another (a start is 1-2
    minutes on a fresh GPU machine; a cell is seconds), so a command's studies that share a
    profile share its start; the cells run exactly as they would on a start of their own.
    Order: each study's baseline group before the study's other groups (its arms are
    compared with the baseline's stored outputs), otherwise in order of first appearance;
    where studies' baselines contradict each other (A's baseline is B's other arm and back)
    the first appearance decides."""
    keyed: dict[tuple[str, str, bool], list[tuple[_Run, ResolvedArm]]] = {}
    for ctx in ctxs:
        for arm in ctx.arms():  # baseline first
            twin = getattr(arm, "noise_of", None) is not None  # its own start (docstring)
            key = (identity.profile_hash(arm.resolved), ctx.study.placement, twin)
            keyed.setdefault(key, []).append((ctx, arm))
    groups = list(keyed.values())
    twins = {i for i, key in enumerate(keyed) if key[2]}
    where = {(id(ctx), arm.name): i for i, g in enumerate(groups) for ctx, arm in g}
    after: dict[int, set[int]] = {i: set() for i in range(len(groups))}  # i runs after these
    for ctx in ctxs:
        arms = ctx.arms()
        if arms and arms[0].name == ctx.study.baseline:
            first = where[(id(ctx), arms[0].name)]
            for arm in arms[1:]:
                if where[(id(ctx), arm.name)] != first:
                    after[where[(id(ctx), arm.name)]].add(first)
    order: list[int] = []
    while len(order) < len(groups):
        left = [i for i in range(len(groups)) if i not in order]
        if len(twins & set(left)) < len(left):  # every other group before any twin's
            left = [i for i in left if i not in twins]
        ready = [i for i in left if after[i] <= set(order)]
        order.append(min(ready or left))
    return [groups[i] for i in order]
