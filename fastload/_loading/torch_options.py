"""The arguments of PyTorch's ``DataLoader`` as PyTorch checks them (the same exception
types and messages) and its defaults: the sampler, the batch sampler, the start method."""

from __future__ import annotations

import multiprocessing
import os
import warnings
from collections.abc import Iterator
from typing import Any

import torch.utils.data as tud

from ..mixtures import mixture_of

__all__ = [
    "check_counts",
    "check_worker_count",
    "context_of",
    "prefetch_of",
    "samplers",
]


def check_counts(num_workers: int, timeout: float, persistent_workers: bool) -> None:
    """``ValueError`` for a negative ``num_workers`` or ``timeout``, and for persistent
    workers without workers."""
    if num_workers < 0:
        raise ValueError(
            "num_workers option should be non-negative; use num_workers=0 to disable "
            "multiprocessing."
        )
    if timeout < 0:
        raise ValueError("timeout option should be non-negative")
    if persistent_workers and num_workers == 0:
        raise ValueError("persistent_workers option needs num_workers > 0")


def samplers(
    dataset: Any,
    batch_size: int | None,
    shuffle: Any,
    sampler: Any,
    batch_sampler: Any,
    drop_last: bool,
    generator: Any,
) -> tuple[int | None, bool, Any, Any]:
    """``(batch_size, drop_last, sampler, batch_sampler)`` as PyTorch settles them:
    ``batch_sampler`` None means no automatic batching. Raises ``ValueError`` for the
    combinations PyTorch refuses."""
    iterable = isinstance(dataset, tud.IterableDataset)
    if iterable:
        _check_iterable(shuffle, sampler, batch_sampler)
    shuffle = bool(shuffle)
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError(
                "batch_sampler option is mutually exclusive with batch_size, shuffle, "
                "sampler, and drop_last"
            )
        batch_size, drop_last = None, False
    elif batch_size is None and drop_last:
        raise ValueError(
            "batch_size=None option disables auto-batching and is mutually exclusive with drop_last"
        )
    if sampler is None and batch_sampler is None and mixture_of(dataset) is not None:
        raise ValueError(
            "a fastload.mix draws its order each epoch, which PyTorch's samplers do not: "
            "pass sampler=mixed.sampler(seed) (and call its set_epoch(epoch) each epoch), "
            "or load it with fastload.DataLoader(mixed, batch_size, shard=...)"
        )
    if sampler is None:
        sampler = _default_sampler(dataset, iterable, shuffle, generator)
    if batch_size is not None and batch_sampler is None:
        batch_sampler = tud.BatchSampler(sampler, batch_size, drop_last)
    return batch_size, drop_last, sampler, batch_sampler


def prefetch_of(prefetch_factor: int | None, num_workers: int) -> int | None:
    """Batches in flight per worker: ``prefetch_factor``, 2 by default with workers, None
    without (where giving one is a ``ValueError``)."""
    if num_workers == 0 and prefetch_factor is not None:
        raise ValueError(
            "prefetch_factor option could only be specified in multiprocessing."
            "let num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor "
            "to None."
        )
    if num_workers > 0 and prefetch_factor is None:
        return 2
    if prefetch_factor is not None and prefetch_factor < 0:
        raise ValueError("prefetch_factor option should be non-negative")
    return prefetch_factor


def _check_iterable(shuffle: Any, sampler: Any, batch_sampler: Any) -> None:
    if shuffle not in {False, None}:
        raise ValueError(
            "DataLoader with IterableDataset: expected unspecified shuffle option, but got "
            f"shuffle={shuffle}"
        )
    if sampler is not None:
        raise ValueError(
            "DataLoader with IterableDataset: expected unspecified sampler option, but got "
            f"sampler={sampler}"
        )
    if batch_sampler is not None:
        raise ValueError(
            "DataLoader with IterableDataset: expected unspecified batch_sampler option, "
            f"but got batch_sampler={batch_sampler}"
        )


class _Endless:
    """The sampler of an iterable dataset: no positions, as many steps as it gives."""

    def __iter__(self) -> Iterator[None]:
        return iter(lambda: None, 0)


def _default_sampler(dataset: Any, iterable: bool, shuffle: bool, generator: Any) -> Any:
    if iterable:
        return _Endless()
    if shuffle:
        return tud.RandomSampler(dataset, generator=generator)
    return tud.SequentialSampler(dataset)


def context_of(value: Any, num_workers: int) -> Any:
    """``multiprocessing_context`` checked as PyTorch checks it; a context or None."""
    if value is None:
        return None
    if num_workers == 0:
        raise ValueError(
            "multiprocessing_context can only be used with multi-process loading "
            f"(num_workers > 0), but got num_workers={num_workers}"
        )
    if isinstance(value, str):
        methods = multiprocessing.get_all_start_methods()
        if value not in methods:
            raise ValueError(
                f"multiprocessing_context option should specify a valid start method in "
                f"{methods!r}, but got multiprocessing_context={value!r}"
            )
        value = multiprocessing.get_context(value)
    if not isinstance(value, multiprocessing.context.BaseContext):
        raise TypeError(
            "multiprocessing_context option should be a valid context object or a "
            f"string specifying the start method, but got multiprocessing_context={value!r}"
        )
    return value


def check_worker_count(num_workers: int) -> None:
    """Warn, as PyTorch does, when there are more workers than CPUs to run them."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if cpus and num_workers > cpus:
        warnings.warn(
            f"This DataLoader will create {num_workers} worker processes in total. The "
            f"suggested max number of workers on this system is {cpus}, which is smaller "
            f"than what this DataLoader is going to create. Please be aware that excessive "
            f"worker creation might get DataLoader running slow or even freeze, lower the "
            f"worker number to avoid potential slowness/freeze if necessary.",
            UserWarning,
            stacklevel=3,
        )
