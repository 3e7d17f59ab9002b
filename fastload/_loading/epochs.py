"""What each epoch of a container loads on this rank, and in which steps.

For (seed, epoch) the order is all positions in order, a permutation (``shuffle=True``),
the quasi-random order of a packed dataset (``shuffle="quasi"``), or what a sampler
draws; it is then sharded (``sharding.py``) and cut into steps: ``batch_size`` at a time,
or a batch sampler's batches, of any sizes, cut at offsets (``Schedule.bounds``)::

    (seed, epoch) -> order (shuffle / quasi / sampler)  -> this rank's block -> Schedule
                  -> batches (batch sampler)             -> this rank's batches -> Schedule(bounds)

Everything is a pure function of (seed, epoch, rank, world_size), so every rank draws
alike and a restored loader draws what the interrupted one did.

Batches of different sizes stay on the native path: the schedule carries the offsets
where its steps start, the engine finds an item's step from them and sizes the slots to
the largest batch. Single-observation steps regrouped in Python would add Python work per
item; a schedule per batch would drain the pipeline at every batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Literal, TypeAlias

import numpy as np
import numpy.typing as npt

from .._base.collate import Collate
from .._base.randomness import Purpose, generator
from ..order import (
    DEFAULT_PARTITIONS,
    partitions_misfit,
    quasi_partition_order,
    quasi_partition_rows,
    quasi_partition_steps,
    quasi_random_order,
    quasi_shard_order,
)
from ..samplers import BatchSampler, Sampler, draw_batches, draw_order
from ..views import steps
from .schedule import Schedule
from .sharding import shard_batch_blocks, shard_batches, shard_blocks, shard_elastic, shard_size

__all__ = ["Epochs", "Layout", "Partitions", "Shuffle"]

# How an epoch's order is shared out among the ranks: "elastic" (each global batch cut in
# rank order, the same sequence on every world size) or "blocks" (a contiguous block per
# rank, as fastload drew it before 0.3.0: kept for their states). See sharding.py.
Layout: TypeAlias = Literal["elastic", "blocks"]

# ``shuffle=``: False, True, "quasi" (packed datasets), or an int: the old spelling of a
# stream's ``shuffle=True, shuffle_buffer=n`` (it warns; ``LoaderOptions.for_stream``).
Shuffle: TypeAlias = bool | int | Literal["quasi"]

# ``partitions=`` of ``shuffle="quasi"``: an int, "auto" (DEFAULT_PARTITIONS where it fits,
# else None) or None (the blocks shared out per world size, ``quasi_shard_order``).
Partitions: TypeAlias = int | Literal["auto"] | None

_DRAW_AHEAD_FROM = 1 << 16  # observations from which the next epoch's order is drawn ahead

# This rank's positions of an epoch, and the offsets where its batches start (or None).
_Drawn = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64] | None]
# What the samplers draw for an epoch: positions, or a batch sampler's batches.
_Global = npt.NDArray[np.int64] | list[npt.NDArray[np.int64]]


class _Ahead:
    """``order(seed, epoch)`` drawn on a thread of its own, for the next epoch."""

    def __init__(
        self, order: Callable[[int, int], npt.NDArray[np.int64]], seed: int, epoch: int
    ) -> None:
        self.key = (seed, epoch)
        self.box: list[npt.NDArray[np.int64]] = []
        self.thread = threading.Thread(
            target=lambda: self.box.append(order(seed, epoch)),
            name="fastload-order-ahead",
            daemon=True,
        )
        self.thread.start()

    def result(self, seed: int, epoch: int) -> npt.NDArray[np.int64] | None:
        """The order, or None when it was drawn for another (seed, epoch) or did not
        finish (a forked child does not have the thread)."""
        if self.key != (seed, epoch):
            return None
        self.thread.join()
        return self.box[0] if self.box else None


class Epochs:
    """The epochs of ``n`` observations for rank ``rank`` of ``world``: their order and
    steps, as a loader's options say (``block_bounds``: a packed dataset's blocks, for
    ``shuffle="quasi"``; ``partitions``: how its epochs deal them, ``Partitions``).
    Raises ``ValueError`` for an int ``partitions`` that cannot give the elastic order
    (``order.partitions_misfit``)."""

    def __init__(
        self,
        n: int,
        batch_size: int | None,
        *,
        shuffle: Shuffle,
        sampler: Sampler | None,
        batch_sampler: BatchSampler | None,
        drop_last: bool,
        collate: Collate,
        rank: int,
        world: int,
        block_bounds: npt.NDArray[np.int64] | None,
        partitions: Partitions = None,
    ) -> None:
        self.n, self.batch_size, self.shuffle = n, batch_size, shuffle
        self.sampler, self.batch_sampler = sampler, batch_sampler
        self.drop_last, self.collate = drop_last, collate
        self.rank, self.world, self.block_bounds = rank, world, block_bounds
        self.sampled = sampler is not None or batch_sampler is not None
        self.layout: Layout = "elastic"
        self._per_rank = shard_size(n, world, drop_last)
        self._ahead: _Ahead | None = None  # the next epoch's order, being drawn
        # (seed, epoch) -> what the samplers drew; (seed, epoch, layout) -> this rank's
        self._globals: dict[tuple[int, int], _Global] = {}
        self._drawn: dict[tuple[int, int, str], _Drawn] = {}
        self._rows = 1  # slots for a batch sampler's batches: the largest so far
        # shuffle="quasi" dealt to partitions (elastic), or None; (seed, epoch) -> rows of each
        self.fitted = self._fitted(partitions)  # as asked for; ``partitions``: as drawn
        self.partitions = self.fitted
        self._partition_rows: dict[tuple[int, int], npt.NDArray[np.int64]] = {}

    def _fitted(self, partitions: Partitions) -> int | None:
        """The partitions of the quasi order, or None for the order of each world size
        (``partitions=None``, another order than ``"quasi"``, or ``"auto"`` in one process
        or where the default does not fit). Raises ``ValueError`` for an int that does
        not fit."""
        if self.shuffle != "quasi" or partitions is None:
            return None
        if partitions == "auto" and self.world == 1:
            return None  # every row once an epoch, no partition padded
        size = DEFAULT_PARTITIONS if partitions == "auto" else int(partitions)
        bounds = self.block_bounds
        misfit = partitions_misfit(size, self.world, self.global_batch(), self.n, bounds)  # type: ignore[arg-type]
        if misfit is None:
            return size
        if partitions == "auto":
            return None
        raise ValueError(f"shuffle='quasi' with partitions={partitions}: {misfit}")

    def set_partitions(self, partitions: int | None) -> None:
        """Deal the quasi order to ``partitions`` from now on (None: the order of each
        world size, which a state of format 3 or earlier resumes in)."""
        if self.shuffle == "quasi" and partitions != self.partitions:
            self.partitions, self._partition_rows = partitions, {}

    def order(self, seed: int, epoch: int) -> npt.NDArray[np.int64]:
        """This rank's positions in ``epoch``, in order (int64)."""
        if self.sampled:
            return self._draw(seed, epoch)[0]
        if not self.shuffle:
            order = np.arange(self.n, dtype=np.int64)
        elif self.shuffle == "quasi" and self.partitions is not None:
            return quasi_partition_order(
                self.n,
                self.block_bounds,  # type: ignore[arg-type]
                seed,
                epoch,
                self.rank,
                self.world,
                self.global_batch(),
                self.partitions,
                self.drop_last,
            )
        elif self.shuffle == "quasi" and self.world > 1:
            # Shared out by blocks: the ranks read disjoint blocks.
            return quasi_shard_order(
                self.n,
                self.block_bounds,  # type: ignore[arg-type]
                seed,
                epoch,
                self.rank,
                self.world,
                self._per_rank,
            )
        elif self.shuffle == "quasi":
            # shuffle="quasi" comes with block bounds (the loader checks).
            order = quasi_random_order(
                self.n,
                self.block_bounds,  # type: ignore[arg-type]
                seed,
                epoch,
            )
        else:
            order = generator(seed, Purpose.EPOCH_ORDER, epoch).permutation(self.n)
        return self._shard(order)

    def _shard(self, order: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """This rank's positions of the epoch's ``order``, in this loader's layout."""
        if self.layout == "blocks":
            return shard_blocks(order, self.rank, self.world, self.drop_last)
        batch = self.batch_size or 1
        return shard_elastic(order, self.rank, self.world, batch, self.drop_last)

    def set_layout(self, layout: Layout) -> None:
        """Share the epochs out as ``layout`` says from now on (a state of fastload 0.3
        resumes in the order it was saved in)."""
        if layout != self.layout:
            self.finish_ahead()
            self.layout, self._ahead = layout, None

    def global_batch(self) -> int:
        """Observations a step loads over all ranks (a batch sampler's: batches)."""
        return (self.batch_size or 1) * self.world if self.batch_sampler is None else self.world

    def units(self, seed: int, epoch: int) -> int:
        """The length of ``epoch``'s order before it is sharded: observations (a batch
        sampler's: batches)."""
        return len(self._global_draw(seed, epoch)) if self.sampled else self.n

    def _global_draw(self, seed: int, epoch: int) -> _Global:
        """What the samplers draw for ``epoch``, before it is sharded: the positions, or
        the batches of a batch sampler. Kept for the latest two epochs: ``len()``, the
        state and the iteration draw each once (an iterable sampler may draw anew each
        time it is iterated)."""
        key = (seed, epoch)
        if key not in self._globals:
            if self.batch_sampler is not None:
                drawn: _Global = draw_batches(self.batch_sampler, self.n, seed, epoch)
            else:
                drawn = draw_order(self.sampler, self.n, seed, epoch)  # type: ignore[arg-type]
            while len(self._globals) >= 2:
                del self._globals[next(iter(self._globals))]
            self._globals[key] = drawn
        return self._globals[key]

    def _draw(self, seed: int, epoch: int) -> _Drawn:
        """``(order, bounds)`` of ``epoch`` from the samplers: this rank's positions, and
        where its batches start when a batch sampler forms them (else None), in this
        loader's layout."""
        key = (seed, epoch, self.layout)
        if key not in self._drawn:
            drawn = self._global_draw(seed, epoch)
            if self.batch_sampler is not None:
                shard = shard_batch_blocks if self.layout == "blocks" else shard_batches
                sharded = shard(drawn, self.rank, self.world)  # type: ignore[arg-type]
            else:
                sharded = self._shard(drawn), None  # type: ignore[arg-type]
            while len(self._drawn) >= 2:
                del self._drawn[next(iter(self._drawn))]
            self._drawn[key] = sharded
        return self._drawn[key]

    def steps(self, seed: int, epoch: int) -> int:
        """Steps of ``epoch`` on this rank."""
        if self.batch_sampler is not None:
            # A batch sampler's draw has bounds.
            return len(self._draw(seed, epoch)[1]) - 1  # type: ignore[arg-type]
        if self.partitions is not None:
            return self._partition_steps(seed, epoch)
        n = len(self._draw(seed, epoch)[0]) if self.sampled else self._per_rank
        return steps(n, self.batch_size or 1, self.drop_last)

    def _partition_steps(self, seed: int, epoch: int) -> int:
        """Steps of ``epoch`` of the quasi order dealt to partitions (kept for the latest
        two epochs: the deal loops over the blocks)."""
        key = (seed, epoch)
        if key not in self._partition_rows:
            bounds, parts = self.block_bounds, self.partitions
            rows = quasi_partition_rows(self.n, bounds, seed, epoch, parts)  # type: ignore[arg-type]
            while len(self._partition_rows) >= 2:
                del self._partition_rows[next(iter(self._partition_rows))]
            self._partition_rows[key] = rows
        return quasi_partition_steps(self._partition_rows[key], self.global_batch(), self.drop_last)

    def schedule(self, seed: int, epoch: int, start: int = 0) -> Schedule:
        """The ``Schedule`` of ``epoch`` from step ``start``: what the engine loads."""
        if self.sampled:
            order, bounds = self._draw(seed, epoch)
        else:
            order, bounds = self._order_ahead(seed, epoch), None
        if bounds is None:
            return Schedule(
                order,
                self.batch_size,
                drop_last=self.drop_last,
                collate=self.collate,
                seed=seed,
                epoch=epoch,
                start=start,
            )
        # Slots hold the largest batch drawn so far: the ring grows, never shrinks, so an
        # epoch of smaller batches reuses it.
        self._rows = max(self._rows, int(np.diff(bounds).max(initial=1)))
        return Schedule(
            order,
            self._rows,
            bounds=bounds,
            collate=self.collate,
            seed=seed,
            epoch=epoch,
            start=start,
        )

    def _order_ahead(self, seed: int, epoch: int) -> npt.NDArray[np.int64]:
        """``order(seed, epoch)``, drawn ahead during the previous epoch when it was the
        next one. A permutation of a million observations takes tens of milliseconds in
        one thread: drawn ahead, it overlaps loading instead of delaying the epoch's first
        batch."""
        ahead, self._ahead = self._ahead, None
        order = ahead.result(seed, epoch) if ahead is not None else None
        if order is None:
            order = self.order(seed, epoch)
        if self.shuffle is True and self.n >= _DRAW_AHEAD_FROM:
            self._ahead = _Ahead(self.order, seed, epoch + 1)
        return order

    def finish_ahead(self) -> None:
        """Wait for the next epoch's order being drawn, if any: at the end of an epoch, so
        that no thread of the loader works between epochs."""
        if self._ahead is not None:
            self._ahead.thread.join()
