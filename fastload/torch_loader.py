"""``fastload.torch.DataLoader``: PyTorch's ``DataLoader``, signature and semantics, on
fastload's engine. Switching is one line::

    from fastload.torch import DataLoader   # instead of torch.utils.data's

Each epoch the batches of indices are drawn as PyTorch draws them (its samplers, its
batch sampler, the same draws from ``generator`` or the global generator), then loaded
by one of three paths, which ``loader.path`` and ``loader.stats()["path"]`` name:

- ``"native"``: a container fastload loads without Python code (numpy arrays, CPU
  tensors, ``TensorDataset``, fastload's containers and views: ``fastload.files``,
  ``mapobs`` with fastload transforms, packed datasets, ``obsview((images, labels))``),
  also under ``Subset`` and ``random_split``, with the default ``collate_fn`` and no
  ``worker_init_fn``: the batch sampler's batches become one ``Schedule`` handed to the
  engine, which loads them on ``num_workers`` native threads without the GIL (0: in the
  caller's thread). A plain tuple, list or dict is a sequence of observations, as in
  PyTorch (``obsview`` makes a tuple of containers one container);
- ``"process"``: any other dataset with ``num_workers > 0``: worker processes under
  PyTorch's worker contract (``torch_workers.py``);
- ``"inline"``: any other dataset with ``num_workers=0``: fetched in the caller's process.

Batches are what ``default_collate`` makes (tensors; tuples as lists, dicts and
namedtuples kept; strings as lists).
"""

from __future__ import annotations

import multiprocessing
import os
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from math import ceil
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.utils.data as tud

from .engine import Engine
from .loader import StatsReport
from .plan import make_plan
from .schedule import Schedule
from .torch_workers import Fetcher, WorkerIteration, WorkerPool, base_seed
from .views import ObsView

__all__ = ["DataLoader"]

_FROZEN = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")
_warned_no_cuda = False


class _Counts:
    """What ``StatsReport`` reads: items and batches delivered, the consumer's time."""

    def __init__(self) -> None:
        self.items = self.batches = self.skipped = 0
        self.wait_s = self.compute_s = 0.0


def _folded(dataset: Any) -> tuple[Any, npt.NDArray[np.int64] | None, bool]:
    """``(dataset, positions, in_view)``: the ``Subset`` and ``obsview`` layers on top of
    ``dataset`` folded into positions in the dataset under them (None: no layer), and
    whether one of them was an ``obsview``."""
    positions, in_view = None, False
    while isinstance(dataset, (tud.Subset, ObsView)):
        indices = np.asarray(dataset.indices, dtype=np.int64)
        positions = indices if positions is None else indices[positions]
        in_view = in_view or isinstance(dataset, ObsView)
        dataset = dataset.dataset if isinstance(dataset, tud.Subset) else dataset.data
    return dataset, positions, in_view


def _native_container(dataset: Any, in_view: bool) -> Any:
    """What the engine loads for ``dataset`` when it is a container fastload loads
    natively (no Python code per item), else None. A plain tuple or dict is a sequence
    of observations, as in PyTorch, unless it is the container of an ``obsview``
    (``in_view``): then its members are indexed alike, as in fastload."""
    if isinstance(dataset, tud.TensorDataset):
        data: Any = tuple(dataset.tensors)
    elif isinstance(dataset, (np.ndarray, torch.Tensor)):
        data = dataset
    elif type(dataset).__module__.startswith("fastload.") or (
        in_view and isinstance(dataset, (tuple, dict))
    ):
        data = dataset
    else:
        return None
    tensors = data if isinstance(data, tuple) else (data,)
    if any(isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in tensors):
        return None
    try:
        plan = make_plan(data, Schedule(np.zeros(1, np.int64), 1))
    except (TypeError, ValueError, IndexError):
        return None  # not a container fastload reads: PyTorch's way then
    return None if plan.has_python or getattr(plan, "whole_steps", False) else data


def _as_collated(batch: Any) -> Any:
    """A native batch as ``default_collate`` gives it: arrays as tensors, tuples as lists
    (namedtuples and dicts kept)."""
    if isinstance(batch, np.ndarray):
        return torch.from_numpy(batch) if batch.dtype != object else list(batch)
    if isinstance(batch, dict):
        return {k: _as_collated(v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_as_collated(v) for v in batch))
    if isinstance(batch, (tuple, list)):
        return [_as_collated(v) for v in batch]
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


def _context(value: Any, num_workers: int) -> Any:
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


class DataLoader:
    """PyTorch's ``torch.utils.data.DataLoader`` (same arguments, checks, attributes,
    ``len`` and batches) loading on fastload's engine; see the module docstring for
    which path a dataset takes.

    Raises ``ValueError`` (and ``TypeError`` for a ``multiprocessing_context`` of the wrong
    type) for the combinations PyTorch refuses. In worker processes, an exception in the
    dataset is raised in the caller with its original type and the worker's traceback in
    its message; a worker that dies, or no batch within ``timeout`` seconds (0: no
    limit), raises ``RuntimeError``.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
    ) -> None:
        if num_workers < 0:
            raise ValueError(
                "num_workers option should be non-negative; use num_workers=0 to disable "
                "multiprocessing."
            )
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        self._prefetch_given = prefetch_factor
        prefetch_factor = _prefetch_factor(prefetch_factor, num_workers)
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
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
                "batch_size=None option disables auto-batching and is mutually exclusive "
                "with drop_last"
            )
        if sampler is None:
            sampler = _default_sampler(dataset, iterable, shuffle, generator)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = tud.BatchSampler(sampler, batch_size, drop_last)
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = _context(multiprocessing_context, num_workers)
        self.in_order = in_order
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        self.persistent_workers = persistent_workers
        self._iterable = iterable
        self._default_collate = collate_fn is None
        if collate_fn is None:
            collate_fn = tud.default_collate if self._auto_collation else tud.default_convert
        self.collate_fn = collate_fn
        self._positions: npt.NDArray[np.int64] | None = None
        self._native = self._native_data()
        self._engine: Engine | None = None
        self._pool: WorkerPool | None = None
        self._counts = _Counts()
        self._IterableDataset_len_called: int | None = None
        _check_worker_count(num_workers)
        self._initialized = True

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_initialized", False) and name in _FROZEN:
            raise ValueError(
                f"{name} attribute should not be set after {type(self).__name__} is initialized"
            )
        super().__setattr__(name, value)

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self) -> Any:
        return self.batch_sampler if self._auto_collation else self.sampler

    @property
    def path(self) -> str:
        """How batches are loaded: ``"native"`` (fastload's engine, native threads),
        ``"process"`` (worker processes, PyTorch's contract) or ``"inline"`` (the
        caller's process)."""
        if self._native is not None:
            return "native"
        return "process" if self.num_workers > 0 else "inline"

    def _native_data(self) -> Any:
        if self._iterable or not self._default_collate or self.worker_init_fn is not None:
            return None
        if not self._auto_collation or not _has_len(self._index_sampler):
            return None  # the native path draws an epoch's batches whole, when it starts
        dataset, self._positions, in_view = _folded(self.dataset)
        return _native_container(dataset, in_view)

    def __len__(self) -> int:
        """Batches per epoch (PyTorch's ``len``: for an iterable dataset, its ``len``
        divided by the batch size; ``TypeError`` when it has none)."""
        if self._iterable:
            length = self._IterableDataset_len_called = len(self.dataset)
            if self.batch_size is not None:
                length = (
                    length // self.batch_size if self.drop_last else ceil(length / self.batch_size)
                )
            return length
        return len(self._index_sampler)

    def __iter__(self) -> Iterator[Any]:
        tasks = self._tasks()
        # Drawn after the sampler's iterator is made, as PyTorch does (persistent workers
        # keep their first epoch's seed), so seeded scripts draw the same orders.
        reused = self.persistent_workers and self._pool is not None
        seed = 0 if reused else base_seed(self.generator)
        if self._native is not None:
            batches = self._native_batches(tasks, seed)
        elif self.num_workers == 0:
            batches = self._inline_batches(tasks)
        else:
            batches = self._worker_batches(tasks, seed)
        return self._delivered(batches)

    def _tasks(self) -> Iterator[Any]:
        if self._iterable:
            return iter(lambda: None, 0)  # no indices: the workers iterate the dataset
        return iter(self._index_sampler)

    def _native_batches(self, tasks: Iterator[Any], seed: int) -> Iterator[Any]:
        steps = [np.asarray(list(batch), dtype=np.int64) for batch in tasks]
        sizes = np.array([len(step) for step in steps], dtype=np.int64)
        if not len(steps):
            return iter(())
        if sizes.min() == 0:
            empty = int(np.argmin(sizes))
            raise ValueError(f"the batch sampler gave an empty batch (batch {empty})")
        order = np.concatenate(steps)
        if self._positions is not None:
            order = self._positions[order]
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        schedule = Schedule(order, int(sizes.max()), bounds=bounds, seed=seed & (2**63 - 1))
        if self._engine is None:
            # PyTorch's prefetch_factor when given; else the engine sizes its own ring.
            workers, factor = self.num_workers, self._prefetch_given
            prefetch = max(1, factor * workers) if workers and factor else None
            self._engine = Engine(
                parallel=workers or False, prefetch=prefetch, ordered=self.in_order
            )
        return _Mapped(_as_collated, self._engine.iterate(self._native, schedule))

    def _inline_batches(self, tasks: Iterator[Any]) -> Iterator[Any]:
        fetch = Fetcher(
            self.dataset,
            self._iterable,
            self._auto_collation,
            self.batch_size,
            self.drop_last,
            self.collate_fn,
        )
        return _Mapped(fetch, tasks)

    def _worker_batches(self, tasks: Iterator[Any], seed: int) -> Iterator[Any]:
        pool = self._pool
        if pool is None:
            spec = dict(
                num_workers=self.num_workers,
                worker_init_fn=self.worker_init_fn,
                iterable=self._iterable,
                auto_collation=self._auto_collation,
                batch_size=self.batch_size,
                drop_last=self.drop_last,
                collate_fn=self.collate_fn,
            )
            context = self.multiprocessing_context or multiprocessing.get_context("fork")
            pool = WorkerPool(self.dataset, spec, seed, context, self.num_workers)
            if self.persistent_workers:
                self._pool = pool
                weakref.finalize(self, pool.close)
        on_end = (lambda: None) if self.persistent_workers else pool.close
        iteration = WorkerIteration(
            pool, tasks, max(1, self.prefetch_factor or 1), self.in_order, self.timeout, on_end
        )
        if not self.persistent_workers:
            weakref.finalize(iteration, pool.close)  # an epoch left before its end
        return iteration

    def _delivered(self, batches: Iterator[Any]) -> _Delivered:
        delivered = _Delivered(batches, self._counts, self._pins())
        if isinstance(batches, WorkerIteration):
            delivered._workers = list(batches.pool.procs)
        if self._iterable:
            delivered.expected = self._IterableDataset_len_called
            delivered.what = f"IterableDataset {self.dataset}"
            delivered.in_workers = self.num_workers > 0
        return delivered

    def _pins(self) -> bool:
        global _warned_no_cuda
        if not self.pin_memory:
            return False
        if torch.cuda.is_available():
            return True
        if not _warned_no_cuda:
            warnings.warn("pin_memory=True does nothing: CUDA is not available", stacklevel=3)
            _warned_no_cuda = True
        return False

    def stats(self) -> StatsReport:
        """Items/s and where the consumer's time went since the loader was made (as
        ``fastload.DataLoader.stats()``), and ``path``: how batches are loaded."""
        report = StatsReport(self._counts)
        report["path"] = self.path  # type: ignore[assignment]
        return report

    def close(self) -> None:
        """Stop persistent workers and release the engine's buffers. Idempotent."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
        if self._engine is not None:
            self._engine.close()

    def __repr__(self) -> str:
        return (
            f"fastload.torch.DataLoader({type(self.dataset).__name__}, "
            f"batch_size={self.batch_size}, num_workers={self.num_workers}, path={self.path!r})"
        )


class _Mapped:
    """``f`` of each value of ``values``: an iterator class, not a generator, so that an
    exception in one step leaves the next ones to come, as in PyTorch."""

    def __init__(self, f: Callable[[Any], Any], values: Iterator[Any]) -> None:
        self.f = f
        self.values = values

    def __iter__(self) -> _Mapped:
        return self

    def __next__(self) -> Any:
        return self.f(next(self.values))


class _Delivered:
    """The batches of one epoch, counted, and pinned when asked. ``_workers``: the worker
    processes that load them (empty on the other paths)."""

    def __init__(self, batches: Iterator[Any], counts: _Counts, pin: bool) -> None:
        self.batches = batches
        self.counts = counts
        self.pin = pin
        self.ready = time.perf_counter()
        self._workers: list[Any] = []
        self.yielded = 0
        self.expected: int | None = None  # an iterable dataset's len(), once asked
        self.what = ""
        self.in_workers = False

    def __iter__(self) -> _Delivered:
        return self

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
        self.yielded += 1
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


def _check_worker_count(num_workers: int) -> None:
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


def _items(batch: Any) -> int:
    """Observations in a batch: the length of its first tensor or list, else 1."""
    while isinstance(batch, (dict, list, tuple)) and len(batch):
        if isinstance(batch, list) and not isinstance(batch[0], (torch.Tensor, list, dict)):
            return len(batch)
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return int(batch.shape[0]) if isinstance(batch, torch.Tensor) and batch.dim() else 1


def _has_len(sampler: Any) -> bool:
    try:
        len(sampler)
    except TypeError:
        return False
    return True


def _prefetch_factor(prefetch_factor: int | None, num_workers: int) -> int | None:
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
