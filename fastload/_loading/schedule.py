"""The schedule: what the loader hands the engine for one epoch, as one plain value.

A schedule says which observations of a container are loaded, in which order, and how
they form steps: ``order`` (int64 positions in the container, already shuffled and
sharded), ``batch_size`` (None: each step is one observation), ``drop_last``,
``collate``, and the ``seed``, ``epoch`` and first step (``start``) the engine loads with.
Batches of different sizes (a batch sampler's) are steps cut at ``bounds``: offsets into
the order, one per step and one for the end; ``batch_size`` is then the size of a slot,
at least the largest step.
The engine never looks at views to learn this: ``schedule_of`` turns a view (a
``batchview`` over ``obsview``/``shuffleobs`` layers) into a container and a schedule
once, at the boundary, for ``eachobs_parallel``; the loader folds the ``obsview`` layers
at the top of its data into each epoch's order (``folded_views``, ``Schedule.through``),
so that the engine loads the container under them item by item.
"""

from __future__ import annotations

from numbers import Integral
from typing import Any

import numpy as np
import numpy.typing as npt

from .._base.collate import Collate, CollateOption
from ..obs import Container, numobs
from ..views import BatchView, ObsView, steps

__all__ = ["Schedule", "folded_views", "schedule_of"]


class Schedule:
    """One epoch of loading (see the module docstring). Raises ``ValueError`` for a
    ``batch_size`` below 1, ``bounds`` that do not cut the order into steps of 1 to
    ``batch_size`` observations, or a ``start`` outside ``[0, steps]``."""

    __slots__ = (
        "batch_size",
        "bounds",
        "collate",
        "drop_last",
        "epoch",
        "order",
        "seed",
        "start",
    )
    order: npt.NDArray[np.int64]
    batch_size: int | None
    drop_last: bool
    collate: Collate
    seed: int
    epoch: int
    start: int
    bounds: npt.NDArray[np.int64] | None

    def __init__(
        self,
        order: npt.ArrayLike,
        batch_size: int | None = None,
        *,
        drop_last: bool = False,
        collate: CollateOption | Collate = None,
        seed: int = 0,
        epoch: int = 0,
        start: int = 0,
        bounds: npt.ArrayLike | None = None,
    ) -> None:
        order = np.ascontiguousarray(order, dtype=np.int64)
        if order.ndim != 1:
            raise ValueError(f"a schedule's order is 1-D, got shape {order.shape}")
        if batch_size is not None and (not isinstance(batch_size, Integral) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
        self.order = order
        self.batch_size = None if batch_size is None else int(batch_size)
        self.drop_last = bool(drop_last)
        self.bounds = (
            None if bounds is None else _checked_bounds(bounds, len(order), self.batch_size)
        )
        self.collate = Collate.of(collate)
        self.seed = int(seed)
        self.epoch = int(epoch)
        self.start = int(start)
        if not 0 <= self.start <= self.steps:
            raise ValueError(f"start {start} is outside the {self.steps} steps of the schedule")

    @property
    def rows(self) -> int:
        """Observations in a whole step, the size of a slot (1 for single observations)."""
        return self.batch_size or 1

    @property
    def steps(self) -> int:
        """Steps in the epoch: batches (the last one partial unless ``drop_last``) or
        observations."""
        if self.bounds is not None:
            return len(self.bounds) - 1
        return steps(len(self.order), self.rows, self.drop_last)

    def first(self, step: int) -> int:
        """The position in ``order`` of the first item of ``step``."""
        return int(self.bounds[step]) if self.bounds is not None else step * self.rows

    def positions(self, step: int) -> npt.NDArray[np.int64]:
        """The container positions that ``step`` loads (a view of ``order``)."""
        if self.bounds is not None:
            return self.order[self.bounds[step] : self.bounds[step + 1]]
        first = self.first(step)
        return self.order[first : min(first + self.rows, len(self.order))]

    def replaced(self, **changes: Any) -> Schedule:
        """This schedule with the fields named in ``changes`` replaced (checked anew)."""
        fields = {name: getattr(self, name) for name in self.__slots__} | changes
        order, batch_size = fields.pop("order"), fields.pop("batch_size")
        return Schedule(order, batch_size, **fields)

    def through(self, indices: npt.NDArray[np.int64] | None) -> Schedule:
        """The same schedule over the container that ``indices`` index (``folded_views``):
        its order mapped through them. ``self`` when ``indices`` is None."""
        return self if indices is None else self.replaced(order=indices[self.order])

    def __repr__(self) -> str:
        cut = "" if self.bounds is None else f", {self.steps} steps of different sizes"
        return (
            f"Schedule({len(self.order)} observations, batch_size={self.batch_size}"
            f"{cut}, drop_last={self.drop_last}, seed={self.seed}, epoch={self.epoch}, "
            f"start={self.start})"
        )


def _checked_bounds(bounds: npt.ArrayLike, n: int, batch_size: int | None) -> npt.NDArray[np.int64]:
    bounds = np.ascontiguousarray(bounds, dtype=np.int64)
    if batch_size is None:
        raise ValueError("steps of different sizes are batches: give the batch_size of a slot")
    sizes = np.diff(bounds) if bounds.ndim == 1 else None
    if (
        sizes is None
        or len(bounds) < 1
        or bounds[0] != 0
        or bounds[-1] != n
        or (sizes < 1).any()
        or (sizes > batch_size).any()
    ):
        raise ValueError(f"bounds must go from 0 to {n} in steps of 1 to {batch_size} observations")
    return bounds


def schedule_of(
    data: Container, *, seed: int = 0, epoch: int = 0, start: int = 0
) -> tuple[Container, Schedule]:
    """``(container, schedule)`` for iterating the observations of ``data``: a
    ``batchview`` becomes batches of its container, and ``obsview`` layers under it (or
    at the top) fold into the order."""
    batch_size, drop_last, collate = None, False, None
    if isinstance(data, BatchView):
        batch_size, drop_last, collate = data.batch_size, data.drop_last, data.collate
        data = data.data
    data, order = folded_views(data)
    if order is None:
        order = np.arange(numobs(data), dtype=np.int64)
    return data, Schedule(
        order, batch_size, drop_last=drop_last, collate=collate, seed=seed, epoch=epoch, start=start
    )


def folded_views(data: Container) -> tuple[Container, npt.NDArray[np.int64] | None]:
    """``(container, indices)``: the ``obsview`` layers at the top of ``data`` (``obsview``,
    ``shuffleobs``, ``splitobs``' parts) folded into one index array, observation ``i`` of
    ``data`` being observation ``indices[i]`` of ``container``; ``(data, None)`` when
    there is no such layer."""
    indices = None
    while isinstance(data, ObsView):
        layer = np.asarray(data.indices, dtype=np.int64)
        indices = layer if indices is None else layer[indices]
        data = data.data
    return data, indices
