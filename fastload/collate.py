"""How observations form a batch.

``collate(observations)`` is the default (``collate=None`` of ``batchview`` and
``DataLoader``, and ``getobs`` of several observations of any container that does not
define its own batches), as PyTorch's ``default_collate`` is:

- arrays and numbers are stacked into one array with a new leading axis, tensors into one
  tensor;
- tuples (namedtuples too) and dicts of one structure are collated member by member, so a
  batch of ``(image, label)`` pairs is a pair ``(images, labels)``;
- anything else (strings, bytes, lists, None, objects) stays a list.

Arrays of different shapes cannot form one batch: ``ValueError`` (``collate=False`` gives
the observations as a list). Python lists are values, not structures: a batch of lists is
a list of lists (PyTorch would transpose them).

``stack(observations)`` is ``collate=True``: every leaf is stacked with ``np.stack``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeAlias

import numpy as np

from .tensors import is_tensor
from .tensors import stack as stack_tensors
from .tree import rebuild

__all__ = ["CollateOption", "collate", "stack"]

_NUMERIC_KINDS = frozenset("biufcmM")

# How a batch is formed (``collate=`` of ``batchview`` and ``DataLoader``): None, True,
# False or a callable applied to the list of observations.
CollateOption: TypeAlias = bool | Callable[[list[Any]], Any] | None


def _same_structure(observations: Sequence[Any]) -> bool:
    """True when all observations are dicts with the keys of the first, or tuples of its
    type and length."""
    first = observations[0]
    if isinstance(first, dict):
        return all(isinstance(o, dict) and o.keys() == first.keys() for o in observations)
    return all(type(o) is type(first) and len(o) == len(first) for o in observations)


def _numeric(x: object) -> np.ndarray | None:
    """The array of ``x`` when it is an array or a number numpy holds natively, else None."""
    if isinstance(x, np.ndarray):
        return None if x.dtype.hasobject else x
    if isinstance(x, np.generic):
        return np.asarray(x) if x.dtype.kind in _NUMERIC_KINDS else None
    if isinstance(x, (bool, int, float, complex)):
        array = np.asarray(x)
        return None if array.dtype.hasobject else array
    return None


def _stack_same_shape(arrays: Sequence[Any], stack_fn: Callable[[Any], Any]) -> Any:
    shapes = {tuple(a.shape) for a in arrays}
    if len(shapes) > 1:
        raise ValueError(
            f"observations of different shapes cannot form one batch (shapes "
            f"{sorted(shapes)[:4]}); batchview and DataLoader give them as a "
            f"list with collate=False"
        )
    return stack_fn(arrays)


def collate(observations: Iterable[Any]) -> Any:
    """The observations (a list) as one batch, by the rules of the module docstring.
    Raises ``ValueError`` for arrays (or tensors) of different shapes."""
    observations = list(observations)
    if not observations:
        return observations
    first = observations[0]
    if isinstance(first, (tuple, dict)):
        if not _same_structure(observations):
            return observations
        if isinstance(first, dict):
            return {key: collate([o[key] for o in observations]) for key in first}
        return rebuild(first, [collate([o[j] for o in observations]) for j in range(len(first))])
    if is_tensor(first):
        if all(is_tensor(o) for o in observations):
            return _stack_same_shape(observations, stack_tensors)
        return observations
    arrays = [_numeric(o) for o in observations]
    if any(a is None for a in arrays):
        return observations
    return _stack_same_shape(arrays, np.stack)


def stack(observations: Sequence[Any]) -> Any:
    """Every leaf of the observations stacked with a new leading axis, through tuples and
    dicts (``collate=True``): numpy arrays, or tensors when the leaves are tensors."""
    first = observations[0]
    if isinstance(first, dict):
        return {key: stack([o[key] for o in observations]) for key in first}
    if isinstance(first, tuple):
        return rebuild(first, [stack([o[j] for o in observations]) for j in range(len(first))])
    if all(is_tensor(o) for o in observations):
        return stack_tensors(observations)
    return np.stack([np.asarray(o) for o in observations])
