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

``Collate.of(option)`` checks a ``collate=`` argument once, where it enters; the
``Collate`` value it gives is what the views, plans and worker processes read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

from ..tensors import is_tensor
from ..tensors import stack as stack_tensors
from .tree import map_across, rebuild

__all__ = ["Collate", "CollateOption", "collate", "stack"]

_NUMERIC_KINDS = frozenset("biufcmM")

# How a batch is formed (``collate=`` of ``batchview`` and ``DataLoader``): None, True,
# False or a callable applied to the list of observations.
CollateOption: TypeAlias = bool | Callable[[list[Any]], Any] | None


@dataclass(frozen=True)
class Collate:
    """How the observations of a batch form it, from a checked ``collate=`` option:

    - ``None``: the container's own ``getobs`` of the batch's indices (observations loaded
      one by one are collated with ``collate``);
    - ``True``: ``stack``; ``False``: the list of observations;
    - a function: applied to that list.
    """

    option: CollateOption = None

    @classmethod
    def of(cls, option: CollateOption | Collate) -> Collate:
        """The ``Collate`` of ``option`` (a ``Collate`` is returned as it is). Raises
        ``TypeError`` for anything but None, True, False or a callable."""
        if isinstance(option, Collate):
            return option
        if not (option is None or isinstance(option, bool) or callable(option)):
            raise TypeError(f"collate must be None, True, False or a callable, got {option!r}")
        return cls(option)

    @property
    def by_getobs(self) -> bool:
        """The container forms the batch itself (``getobs`` of the indices)."""
        return self.option is None

    @property
    def stacks(self) -> bool:
        """Every observation goes into the batch's arrays (``np.stack``)."""
        return self.option is True

    @property
    def whole(self) -> bool:
        """The observations are collected whole, as a list, and then formed (``False`` or
        a function)."""
        return self.option is False or callable(self.option)

    def form(self, observations: list[Any]) -> Any:
        """The batch of ``observations`` (a list, in batch order)."""
        if self.option is None:
            return collate(observations)
        if self.option is True:
            return stack(observations) if observations else observations
        if self.option is False:
            return observations
        return self.option(observations)

    def in_workers(self) -> Collate:
        """What worker processes apply: a function runs in the consumer (it need not
        pickle), so they collect lists for it."""
        return Collate(False) if callable(self.option) else self


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
    return map_across(_stack_leaves, observations)


def _stack_leaves(leaves: Sequence[Any]) -> Any:
    if all(is_tensor(leaf) for leaf in leaves):
        return stack_tensors(leaves)
    return np.stack([np.asarray(leaf) for leaf in leaves])
