"""A declarative schema for JSON data (a program file's header) and the one function that checks
data against it, naming the key path of the first value that does not fit.

    >>> check(Record({"shape": ListOf(Int(0, 9))}), {"shape": [2, -1]}, "header")
    Traceback (most recent call last):
    ...
    stagec.errors.ProgramFormatError: header.shape[1] = -1: expected an integer in [0, 9]
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from stagec.errors import ProgramFormatError, StagecError, shown


@dataclass(frozen=True)
class Int:
    """An integer (not a bool, not a float) in [lo, hi]."""
    lo: int
    hi: int


@dataclass(frozen=True)
class Str:
    """A string."""


@dataclass(frozen=True)
class OneOf:
    """One of `values`, of the same type (JSON's 1, 1.0 and true are three different values)."""
    values: tuple


@dataclass(frozen=True)
class Maybe:
    """null or a value that fits `item`."""
    item: object


@dataclass(frozen=True)
class ListOf:
    """A list whose every item fits `item`; with `length_of`, as long as the root's list of that key
    (checked before this one)."""
    item: object
    length_of: str | None = None


@dataclass(frozen=True)
class Record:
    """An object with the `required` keys, any of the `optional` ones and, if `open`, keys of any
    other name holding any JSON value."""
    required: Mapping[str, object]
    optional: Mapping[str, object] = field(default_factory=dict)
    open: bool = False


@dataclass(frozen=True)
class Checked:
    """A value `check` accepts: it raises a StagecError or ValueError that says why not."""
    check: Callable[[object], object]


def check(schema, value, path: str, root=None) -> None:
    """Raise ProgramFormatError naming `path` (e.g. `header.inputs[0].shape[1]`) and the expected
    form of the first part of `value` that does not fit `schema`."""
    root = value if root is None else root
    match schema:
        case Int(lo, hi):
            if type(value) is not int or not lo <= value <= hi:
                raise _mismatch(path, value, f"an integer in [{lo}, {hi}]")
        case Str():
            if type(value) is not str:
                raise _mismatch(path, value, "a string")
        case OneOf(values):
            if not any(type(value) is type(v) and value == v for v in values):
                raise _mismatch(path, value, f"one of {', '.join(map(repr, values))}")
        case Maybe(item):
            if value is not None:
                check(item, value, path, root)
        case ListOf(item, length_of):
            if type(value) is not list:
                raise _mismatch(path, value, "a list")
            if length_of is not None and len(value) != len(root[length_of]):
                raise ProgramFormatError(f"{path} has {len(value)} entries, one per {length_of} "
                                         f"({len(root[length_of])})")
            for i, v in enumerate(value):
                check(item, v, f"{path}[{i}]", root)
        case Record(required, optional, is_open):
            _check_record(required, optional, is_open, value, path, root)
        case Checked(fn):
            try:
                fn(value)
            except (StagecError, ValueError, TypeError) as e:
                raise ProgramFormatError(f"{path}: {e}") from None
        case _:
            raise TypeError(f"not a schema node: {schema!r}")


def _check_record(required, optional, is_open, value, path: str, root) -> None:
    if type(value) is not dict:
        raise _mismatch(path, value, "an object")
    known = {**required, **optional}
    for key in value:
        if key not in known and not is_open:
            near = difflib.get_close_matches(key, known, n=1)
            raise ProgramFormatError(f"{path}: unknown key {key!r}" + (f"; did you mean {near[0]!r}?" if near else ""))
    for key in required:
        if key not in value:
            raise ProgramFormatError(f"{path}: missing key {key!r}")
    for key, node in known.items():
        if key in value:
            check(node, value[key], f"{path}.{key}", root)


def _mismatch(path: str, value, expected: str) -> ProgramFormatError:
    return ProgramFormatError(f"{path} = {shown(value)}: expected {expected}")
