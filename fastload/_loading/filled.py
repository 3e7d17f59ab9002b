"""``buffer=`` arrays of the user's: each step a loader yields is copied into them, and the
buffer itself is yielded (its first rows for a shorter last batch), as MLUtils'
``getobs!`` into a buffer of one's own. The buffer must match the steps exactly: its
structure (tuples and dicts of arrays), shapes and dtypes; nothing is cast."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from .._base.tree import head, map_across, map_tree, tree_leaves
from ..obs import copy_into

__all__ = ["filled"]


def _structure(tree: Any) -> Any:
    """The nesting of tuples and dicts of ``tree``, without its leaves."""
    return map_tree(lambda leaf: None, tree)


def _check_dtypes(buffer: Any, value: Any) -> None:
    """Raise ``ValueError`` where an array of ``value`` has another dtype than the array
    of ``buffer`` it goes into (member by member, by key)."""
    map_across(_check_dtype, [buffer, value])


def _check_dtype(pair: Sequence[Any]) -> None:
    array, given = pair
    dtype = getattr(given, "dtype", None)
    if dtype is not None and array.dtype != dtype:
        raise ValueError(
            f"buffer= has dtype {array.dtype} where the steps have {dtype}: make the buffer {dtype}"
        )


def _fill(target: Any, value: Any, batched: bool) -> Any:
    """``value`` (a step: a batch when ``batched``) copied into ``target`` (its first
    rows for a shorter last batch), which is returned. Raises ``ValueError`` when the
    structure, shapes or dtypes differ: the buffer must match the steps exactly."""
    if _structure(target) != _structure(value):
        raise ValueError(
            f"buffer= must have the structure of the steps (tuples and dicts of arrays): "
            f"the buffer is {_structure(target)}, a step is {_structure(value)}"
        )
    part = target
    if batched:
        rows = len(tree_leaves(value)[0])
        if rows < len(tree_leaves(target)[0]):
            part = head(target, rows)  # the shorter last batch
    _check_dtypes(part, value)
    try:
        return copy_into(part, value)
    except ValueError as error:
        raise ValueError(f"buffer= does not fit the batches: {error}") from error


def filled(target: Any, steps: Iterator[Any], batched: bool) -> Iterator[Any]:
    """The steps of ``steps`` each copied into ``target`` in place: ``buffer=`` arrays."""
    for value in steps:
        yield _fill(target, value, batched)
