"""What a ``fastload.torch.DataLoader`` hands out: batches as ``default_collate`` gives
them, pinned when asked, counted for ``stats()``, one epoch at a time."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

__all__ = ["Counts", "Delivered", "Mapped", "as_collated"]


class Counts:
    """What ``StatsReport`` reads: items and batches delivered, the consumer's time."""

    def __init__(self) -> None:
        self.items = self.batches = self.skipped = 0
        self.wait_s = self.compute_s = 0.0


def as_collated(batch: Any) -> Any:
    """A native batch as ``default_collate`` gives it: arrays as tensors, tuples as lists
    (namedtuples and dicts kept)."""
    if isinstance(batch, np.ndarray):
        return torch.from_numpy(batch) if batch.dtype != object else list(batch)
    if isinstance(batch, dict):
        return {k: as_collated(v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(as_collated(v) for v in batch))
    if isinstance(batch, (tuple, list)):
        return [as_collated(v) for v in batch]
    return batch


def _pinned(batch: Any) -> Any:
    """``batch`` in page-locked memory, as PyTorch pins: tensors, and any object with a
    ``pin_memory()`` method (a custom batch, a ``PackedSequence``), through containers."""
    if isinstance(batch, (str, bytes)):
        return batch
    if hasattr(batch, "pin_memory"):
        return batch.pin_memory()
    if isinstance(batch, dict):
        return {k: _pinned(v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_pinned(v) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(_pinned(v) for v in batch)
    return batch


class Mapped:
    """``f`` of each value of ``values``: an iterator class, not a generator, so that an
    exception in one step leaves the next ones to come, as in PyTorch."""

    def __init__(self, f: Callable[[Any], Any], values: Iterator[Any]) -> None:
        self.f = f
        self.values = values

    def __iter__(self) -> Mapped:
        return self

    def __next__(self) -> Any:
        return self.f(next(self.values))


class Deferred:
    """The iterator that ``make()`` returns, made on the first ``next()``. PyTorch's
    single-process iterator draws its batch sampler then, not in ``iter()``: a sampler's
    ``set_epoch`` between the two counts (Lightning calls it there when it resumes)."""

    def __init__(self, make: Callable[[], Iterator[Any]]) -> None:
        self.make: Callable[[], Iterator[Any]] | None = make
        self.values: Iterator[Any] = iter(())

    def __iter__(self) -> Deferred:
        return self

    def __next__(self) -> Any:
        if self.make is not None:
            make, self.make = self.make, None
            self.values = make()
        return next(self.values)


class Delivered:
    """The batches of one epoch, counted, and pinned when asked. ``_workers``: the worker
    processes that load them (empty on the other paths)."""

    def __init__(self, batches: Iterator[Any], counts: Counts, pin: bool) -> None:
        self.batches = batches
        self.counts = counts
        self.pin = pin
        self.ready = time.perf_counter()
        self._workers: list[Any] = []
        # Batches yielded: a one-item list the loader keeps for its state_dict() without
        # keeping the iteration (dropping it stops its workers).
        self.tally = [0]
        self.expected: int | None = None  # an iterable dataset's len(), once asked
        self.what = ""
        self.in_workers = False

    def __iter__(self) -> Delivered:
        return self

    @property
    def yielded(self) -> int:
        return self.tally[0]

    def __next__(self) -> Any:
        counts = self.counts
        start = time.perf_counter()
        counts.compute_s += start - self.ready
        try:
            batch = next(self.batches)
        finally:
            self.ready = time.perf_counter()
            counts.wait_s += self.ready - start
        if self.pin:
            batch = _pinned(batch)
        counts.batches += 1
        counts.items += _items(batch)
        self.tally[0] += 1
        if self.expected is not None and self.yielded > self.expected:
            self._warn_length()
        return batch

    def _warn_length(self) -> None:
        message = (
            f"Length of {self.what} was reported to be {self.expected} (when accessing "
            f"len(dataloader)), but {self.yielded} samples have been fetched. "
        )
        if self.in_workers:
            message += (
                "For multiprocessing data-loading, this could be caused by not properly "
                "configuring the IterableDataset replica at each worker (see "
                "torch.utils.data.get_worker_info)."
            )
        warnings.warn(message, UserWarning, stacklevel=3)


def _items(batch: Any) -> int:
    """Observations in a batch: the length of its first tensor or list, else 1."""
    while isinstance(batch, (dict, list, tuple)) and len(batch):
        if isinstance(batch, list) and not isinstance(batch[0], (torch.Tensor, list, dict)):
            return len(batch)
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return int(batch.shape[0]) if isinstance(batch, torch.Tensor) and batch.dim() else 1
