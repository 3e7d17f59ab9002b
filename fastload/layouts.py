"""The layout of a container's observations, compared across the sources of a mix
(``fastload.mix``): one batch holds observations of one layout, so sources that differ
are refused up front, naming the difference, rather than failing (or collating into
something else) mid-epoch.

A source's layout is its structure (a tuple's arity, a dict's keys, nested) and, per
member: an array's dtype and row shape; a packed dataset's fields and their encodings'
kind, dtype and shape; for any other container, its observation 0's structure and its
arrays' dtypes and dimensions (not their shapes: images vary in size).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from . import tables
from ._base.tree import TreeDef, flatten
from .obs import Container, getobs, numobs

__all__ = ["check_layouts", "layout", "members"]


def _lowered(data: Any) -> Any:
    return tables.columns(data) if tables.is_table(data) else data


def members(source: Container) -> tuple[list[Any], TreeDef]:
    """The members of ``source`` (``tree.flatten``; a table's columns) and its structure."""
    return flatten(source, lower=_lowered)


def _paths(tree: Any, lower: Any = None) -> list[str]:
    return ["".join(f"[{key!r}]" for key in path) for path in flatten(tree, lower=lower)[1].paths()]


def _value(value: Any) -> str:
    """An observation's leaf in words: an array's dtype and dimensions, else its type."""
    if isinstance(value, (np.ndarray, np.generic)):
        return f"{value.dtype}, {np.ndim(value)}-d"
    if isinstance(value, (bool, int, float, str)):
        return type(value).__name__
    return "bytes" if isinstance(value, (bytes, memoryview)) else type(value).__name__


def _encoding(encoding: Any) -> str:
    parts = [type(encoding).__name__]
    for attribute in ("dtype", "shape"):
        found = getattr(encoding, attribute, None)
        if found is not None:
            parts.append(f"{attribute} {np.dtype(found) if attribute == 'dtype' else found}")
    return " ".join(parts)


def _member(member: Container, path: str) -> dict[str, str]:
    """The layout of one member of a source (a leaf of its structure)."""
    if isinstance(member, np.ndarray) and member.ndim >= 1:
        return {path: f"{member.dtype}, rows of shape {member.shape[1:]}"}
    fields = getattr(member, "fields", None)
    if isinstance(fields, Mapping):  # a packed dataset: its fields' encodings
        return {f"{path}[{name!r}]": _encoding(enc) for name, enc in fields.items()}
    if not numobs(member):
        return {path: "empty"}
    first = getobs(member, 0)
    leaves, _ = flatten(first)
    return {path + sub: _value(v) for sub, v in zip(_paths(first), leaves)}


def layout(source: Container) -> dict[str, str]:
    """Path of each member of an observation -> its layout in words (module docstring)."""
    found: dict[str, str] = {}
    for member, path in zip(members(source)[0], _paths(source, _lowered)):
        found.update(_member(member, path))
    return found


def check_layouts(names: Sequence[str], sources: Sequence[Container]) -> None:
    """Raise ``ValueError`` naming the first difference between the layout of the first
    source and another's."""
    first = layout(sources[0])
    for name, source in zip(names[1:], sources[1:]):
        other = layout(source)
        if list(other) != list(first):
            raise ValueError(
                f"mix: source {name!r} has other fields than source {names[0]!r}: "
                f"{list(other) or ['(one value)']} vs {list(first) or ['(one value)']}; "
                f"give every source the same fields (mapobs can rename or drop them)"
            )
        for path, want in first.items():
            if other[path] != want and "empty" not in (other[path], want):
                raise ValueError(
                    f"mix: field {path or '(the observation)'} of source {name!r} is "
                    f"{other[path]}, of source {names[0]!r} {want}: one batch holds one "
                    f"layout; convert one of them (mapobs with a cast, say)"
                )
