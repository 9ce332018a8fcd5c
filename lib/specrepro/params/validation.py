"""Pydantic's validation errors, told in the params files' words.

Design:
- `validate(model, tree)` validates a merged tree into a model; on failure each pydantic
  error becomes a `Problem`: its location is walked through the model's types (`_walk`:
  union tags dropped, the deepest field with an `Expect` marker found, the model that owns
  an unknown key found), then located in the file that set it through the tree's
  provenance. An unknown key suggests the closest valid one and lists them all (a key the
  model retired says what replaced it: `Strict.RETIRED`); a bad value says what was
  expected and what was found.
- After the types, the model's `cross_checks()` (checks across fields, as key path and
  message) are located the same way, so a baseline naming a missing arm fails with the
  study file and key too.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Annotated, Any, Union

from pydantic import BaseModel, ValidationError

from specrepro.params.errors import Expect, ParamsError, Problem, dotted, shown
from specrepro.params.tree import Tree, lookup


def _unwrap(tp: Any) -> list[Any]:
    """The alternatives of a type: Optional[X] / X | Y -> [X, Y] (None dropped)."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return [a for arg in typing.get_args(tp) if arg is not type(None) for a in _unwrap(arg)]
    return [tp]


def _marks(tp: Any) -> list[Any]:
    """Annotated metadata inside a union such as Annotated[int, Expect(...)] | None."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return list(tp.__metadata__)
    if origin in (Union, types.UnionType):
        return [m for arg in typing.get_args(tp) for m in _marks(arg)]
    return []


def _walk(model: type[BaseModel], loc: tuple) -> tuple[tuple, tuple | None, str | None, Any]:
    """Follow a pydantic error location through the model's types.

    Returns (location without union tags, location of the deepest field carrying an
    Expect marker or None, its text, the model class that owns the last key).
    """
    clean: tuple = ()
    marked: tuple | None = None
    text: str | None = None
    current: list[Any] = [model]
    owner: Any = model
    for part in loc:
        if part == "[key]":  # pydantic's marker for an invalid mapping key
            continue
        models = [t for t in current if isinstance(t, type) and issubclass(t, BaseModel)]
        if isinstance(part, str) and models and any(part in m.model_fields for m in models):
            owner = next(m for m in models if part in m.model_fields)
            info = owner.model_fields[part]
            clean += (part,)
            marks = [m for m in (*info.metadata, *_marks(info.annotation)) if isinstance(m, Expect)]
            if marks:
                marked, text = clean, marks[0].text
            current = _unwrap(info.annotation)
            continue
        containers = [t for t in current if typing.get_origin(t) in (list, dict, tuple)]
        if containers and (isinstance(part, int) or typing.get_origin(containers[0]) is dict):
            clean += (part,)
            args = typing.get_args(containers[0])
            current = _unwrap(args[-1] if args else Any)
            continue
        if isinstance(part, str) and models:  # an unknown key of a model
            owner = models[0]
            clean += (part,)
            current = [Any]
            continue
        # anything else is a union tag such as 'list[int]' or 'function-after[...]'
    return clean, marked, text, owner


def _problems_from(err: ValidationError, model: type[BaseModel], tree: Tree) -> list[Problem]:
    problems: list[Problem] = []
    seen: set[tuple[str, str]] = set()
    for item in err.errors():
        clean, marked, expect_text, owner = _walk(model, tuple(item["loc"]))
        kind, msg = item["type"], item["msg"]
        if kind == "extra_forbidden":
            key = clean[-1]
            valid = list(owner.model_fields) if isinstance(owner, type) else []
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            message = f"unknown key {key!r}{hint}; expected one of: {', '.join(valid)}"
            retired = getattr(owner, "RETIRED", {}).get(str(key))
            if retired:  # a key the model took once: say what replaced it
                message = f"key {key!r} is retired: {retired}"
            path = clean
        elif kind == "missing":
            path, message = clean, "expected a value, found the key missing"
        elif kind.startswith("value_error") or kind == "assertion_error":
            path = clean
            message = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        else:
            path = marked if marked is not None else clean
            expected = expect_text or msg.removeprefix("Input should be ").removeprefix(
                "input should be "
            )
            for words, sign in (
                ("greater than or equal to ", ">= "),
                ("less than or equal to ", "<= "),
                ("greater than ", "> "),
                ("less than ", "< "),
            ):
                expected = expected.replace(words, sign)
            found = clean[-1] if "[key]" in item["loc"] else lookup(tree.data, path)
            message = f"expected {expected}, found {shown(found)}"
        file, key = tree.prov.locate(path)
        if (dotted(key), message) not in seen:
            seen.add((dotted(key), message))
            problems.append(Problem(file, dotted(key), message))
    return problems


def validate(model: type[BaseModel], tree: Tree, context: str = "") -> Any:
    try:
        obj = model.model_validate(tree.data)
    except ValidationError as err:
        raise ParamsError(_problems_from(err, model, tree), context) from None
    problems = [Problem(*located(tree, path), message) for path, message in obj.cross_checks()]
    if problems:
        raise ParamsError(problems, context)
    return obj


def located(tree: Tree, path: tuple) -> tuple[str, str]:
    file, key = tree.prov.locate(path)
    return file, dotted(key)
