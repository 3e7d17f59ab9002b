"""``fastload.torch.DataLoader``: PyTorch's ``DataLoader``, signature and semantics, on
fastload's engine. Switching is one line::

    from fastload.torch import DataLoader   # instead of torch.utils.data's

Each epoch the batches of indices are drawn as PyTorch draws them (its samplers, its
batch sampler, the same draws from ``generator`` or the global generator), then loaded
by one of four paths, which ``loader.path`` and ``loader.stats()["path"]`` name:

- ``"native"``: a container fastload loads without Python code (numpy arrays, CPU
  tensors, ``TensorDataset``, fastload's containers and views: ``fastload.files``,
  ``mapobs`` with fastload transforms, packed datasets, ``obsview((images, labels))``),
  also under ``Subset`` and ``random_split``, with the default ``collate_fn`` and no
  ``worker_init_fn``: the batch sampler's batches become one ``Schedule`` handed to the
  engine, which loads them on ``num_workers`` native threads without the GIL (0: in the
  caller's thread). A plain tuple, list or dict is a sequence of observations, as in
  PyTorch (``obsview`` makes a tuple of containers one container);
- ``"process-ring"``: a Python map-style dataset with ``num_workers > 0``, the default
  ``collate_fn``, batches from a batch sampler with a length, and observations of arrays,
  tensors and numbers (``torch_ring.py``): fastload's worker processes fill a
  shared-memory ring in place, under PyTorch's worker contract;
- ``"process"``: any other dataset with ``num_workers > 0``: worker processes under
  PyTorch's worker contract, batches through multiprocessing queues (``torch_workers.py``);
- ``"inline"``: any other dataset with ``num_workers=0``: fetched in the caller's process.

Batches are what ``default_collate`` makes (tensors; tuples as lists, dicts and
namedtuples kept; strings as lists).

The class is a subclass of ``torch.utils.data.DataLoader``, so that frameworks that take a
PyTorch loader apart and build it anew with a distributed sampler (Lightning's
``use_distributed_sampler``) see one: its attributes are its ``__init__`` arguments, and
those left to their defaults (``collate_fn``, ``prefetch_factor``) are attributes only once
given, so that a loader built anew from them takes the same path as the first.
"""

from __future__ import annotations

import multiprocessing
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import torch
import torch.utils.data as tud

from ..views import ObsView, steps
from .engine import Engine
from .engine_options import EngineOptions, ProcessOptions
from .iteration import StatsReport
from .plan import make_plan
from .schedule import Schedule
from .torch_batches import Counts, Deferred, Delivered, Mapped, as_collated
from .torch_frameworks import follow
from .torch_options import check_counts, check_worker_count, context_of, prefetch_of, samplers
from .torch_ring import FirstKnown, RingBatches, fits_ring, per_item, probe_first
from .torch_state import StatefulTorchLoader
from .torch_workers import Fetcher, QueueWorkers, WorkerIteration, base_seed, worker_setup

__all__ = ["DataLoader"]

_FROZEN = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")
# Attributes that decide how batches are loaded: set after __init__, the path is decided anew.
_PATH_SHAPING = ("num_workers", "collate_fn", "worker_init_fn", "multiprocessing_context")
_warned_no_cuda = False


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


T_co = TypeVar("T_co", covariant=True)


class _Resolved:
    """An ``__init__`` argument that PyTorch keeps as an attribute with its default filled
    in (``collate_fn``, ``prefetch_factor``). Read, it is the value given (or set later)
    when there is one, else the default the loader settled on (the attribute ``default``).
    Only a given value is an instance attribute: a framework that builds the loader anew
    from ``vars(loader)`` then passes what the user gave, and nothing the loader filled
    in (``collate_fn=default_collate`` would take another path than no ``collate_fn``)."""

    def __init__(self, default: str) -> None:
        self.default = default

    def __get__(self, loader: Any, owner: type | None = None) -> Any:
        if loader is None:
            return self
        return getattr(loader, self.default)


class DataLoader(StatefulTorchLoader, tud.DataLoader[T_co]):
    """PyTorch's ``torch.utils.data.DataLoader`` (same arguments, checks, attributes,
    ``len`` and batches) loading on fastload's engine; see the module docstring for
    which path a dataset takes.

    Raises ``ValueError`` (and ``TypeError`` for a ``multiprocessing_context`` of the wrong
    type) for the combinations PyTorch refuses. In worker processes, an exception in the
    dataset is raised in the caller with its original type and the worker's traceback in
    its message (on the ``"process-ring"`` path it ends the epoch); a worker that dies, or
    no batch within ``timeout`` seconds (0: no limit), raises ``RuntimeError``. On the
    ``"process-ring"`` path, an observation whose structure, shape or dtype differs from
    observation 0's raises ``fastload.LoadError``. ``state_dict()`` / ``load_state_dict()``
    save and restore the position mid-epoch, as torchdata's ``StatefulDataLoader``
    (``torch_state.py``).
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
        check_counts(num_workers, timeout, persistent_workers)
        self._prefetch_given = prefetch_factor
        prefetch = prefetch_of(prefetch_factor, num_workers)
        batch_size, drop_last, sampler, batch_sampler = samplers(
            dataset, batch_size, shuffle, sampler, batch_sampler, drop_last, generator
        )
        self.dataset = dataset
        self.num_workers = num_workers
        self._prefetch_default = prefetch
        if prefetch_factor is not None:
            self.prefetch_factor = prefetch
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = context_of(multiprocessing_context, num_workers)
        self.in_order = in_order
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        self.persistent_workers = persistent_workers
        self._iterable = isinstance(dataset, tud.IterableDataset)
        self._dataset_kind = 1 if self._iterable else 0  # PyTorch's _DatasetKind
        if collate_fn is not None:
            self.collate_fn = collate_fn
        self._collate_default = tud.default_collate if self._auto_collation else tud.default_convert
        self._engine: Engine | None = None
        self._pool: QueueWorkers | None = None
        self._ring_engine: Engine | None = None  # with persistent workers
        self._decide_path()
        self._counts = Counts()
        self._IterableDataset_len_called: int | None = None  # type: ignore[assignment]
        check_worker_count(num_workers)
        self._initialized = True
        follow(self)

    dataset: Any  # any dataset PyTorch's loader takes, not only a Dataset
    collate_fn = _Resolved("_collate_default")
    prefetch_factor = _Resolved("_prefetch_default")

    def __setattr__(self, name: str, value: Any) -> None:
        initialized = getattr(self, "_initialized", False)
        if initialized and name in _FROZEN:
            raise ValueError(
                f"{name} attribute should not be set after {type(self).__name__} is initialized"
            )
        super().__setattr__(name, value)
        if initialized and name in _PATH_SHAPING:
            self._decide_path()

    def _decide_path(self) -> None:
        """Settle (again) what decides the path from the arguments: the native container,
        or none; the ring path is decided on first use. Workers and engines of an earlier
        decision are stopped."""
        self.close()
        self._default_collate = "collate_fn" not in self.__dict__
        self._positions: npt.NDArray[np.int64] | None = None
        self._native = self._native_data()
        self._ring: FirstKnown | bool | None = None  # None: not decided yet; False: no ring

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self) -> Any:
        return self.batch_sampler if self._auto_collation else self.sampler

    @property
    def path(self) -> str:
        """How batches are loaded: ``"native"`` (fastload's engine, native threads),
        ``"process-ring"`` (fastload's worker processes and shared-memory ring, PyTorch's
        contract), ``"process"`` (worker processes, PyTorch's contract, batches through
        queues) or ``"inline"`` (the caller's process). The first time it is asked (or the
        loader iterated), a ``"process-ring"`` candidate's observation 0 is read in a
        forked process."""
        if self._native is not None:
            return "native"
        if self.num_workers == 0:
            return "inline"
        return "process-ring" if self._ring_data() is not None else "process"

    def _ring_data(self) -> FirstKnown | None:
        """What the ring path loads (the dataset with its observation 0), or None when the
        dataset takes the queue-based path; decided once."""
        if self._ring is None:
            probed = self._probed() if self._ring_candidate() else None
            self._ring = probed if probed is not None else False
        return self._ring if isinstance(self._ring, FirstKnown) else None

    def _ring_candidate(self) -> bool:
        """What the arguments and the dataset's type allow: PyTorch's default batching of
        a map-style dataset item by item, in forked workers."""
        context = self.multiprocessing_context
        return (
            self.num_workers > 0
            and not self._iterable
            and self._default_collate
            and self._auto_collation
            and _has_len(self._index_sampler)
            and "fork" in multiprocessing.get_all_start_methods()
            and (context is None or context.get_start_method() == "fork")
            and per_item(self.dataset)
            and _has_len(self.dataset)
            and len(self.dataset) > 0
        )

    def _probed(self) -> FirstKnown | None:
        read, first = probe_first(self.dataset)
        return FirstKnown(self.dataset, first) if read and fits_ring(first) else None

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
                length = steps(length, self.batch_size, self.drop_last)
            return length
        return len(self._index_sampler)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # not PyTorch's iterator
        tasks = self._start_epoch(self._tasks)
        # Drawn after the sampler's iterator is made, as PyTorch does (persistent workers
        # keep their first epoch's seed), so seeded scripts draw the same orders.
        reused = self._live_pool() is not None or self._live_ring() is not None
        seed = 0 if reused else base_seed(self.generator)
        if self._native is not None:
            batches = self._native_batches(tasks, seed)
        elif self.num_workers == 0:
            batches = self._inline_batches(tasks)
        elif self._ring_data() is not None:
            batches = self._ring_batches(tasks, seed)
        else:
            batches = self._worker_batches(tasks, seed)
        return self._delivered(batches)

    def _tasks(self) -> Iterator[Any]:
        if self._iterable:
            return iter(lambda: None, 0)  # no indices: the workers iterate the dataset
        return iter(self._index_sampler)

    def _schedule(
        self, tasks: Iterator[Any], seed: int, positions: npt.NDArray[np.int64] | None
    ) -> Schedule | None:
        """The batch sampler's batches of one epoch, drawn whole, as one schedule (None:
        no batches); ``positions`` maps the sampler's indices to the container's."""
        steps = [np.asarray(list(batch), dtype=np.int64) for batch in tasks]
        sizes = np.array([len(step) for step in steps], dtype=np.int64)
        if not len(steps):
            return None
        if sizes.min() == 0:
            empty = int(np.argmin(sizes))
            raise ValueError(f"the batch sampler gave an empty batch (batch {empty})")
        order = np.concatenate(steps)
        if positions is not None:
            order = positions[order]
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        return Schedule(order, int(sizes.max()), bounds=bounds, seed=seed & (2**63 - 1))

    def _native_batches(self, tasks: Iterator[Any], seed: int) -> Iterator[Any]:
        if self.num_workers == 0:  # PyTorch draws the sampler on the first next() then
            return Deferred(lambda: self._native_steps(tasks, seed))
        return self._native_steps(tasks, seed)

    def _native_steps(self, tasks: Iterator[Any], seed: int) -> Iterator[Any]:
        schedule = self._schedule(tasks, seed, self._positions)
        if schedule is None:
            return iter(())
        if self._engine is None:
            # PyTorch's prefetch_factor when given; else the engine sizes its own ring.
            workers, factor = self.num_workers, self._prefetch_given
            prefetch = max(1, factor * workers) if workers and factor else None
            options = EngineOptions(parallel=workers, prefetch=prefetch, ordered=self.in_order)
            self._engine = Engine(options)
        return Mapped(as_collated, self._engine.iterate(self._native, schedule))

    def _live_ring(self) -> Engine | None:
        """The persistent workers of the ring path, while they run."""
        engine = self._ring_engine
        return engine if engine is not None and engine.worker_processes else None

    def _ring_batches(self, tasks: Iterator[Any], seed: int) -> Iterator[Any]:
        data = self._ring_data()
        schedule = self._schedule(tasks, seed, None)
        if schedule is None:
            return iter(())
        engine = self._live_ring()
        if engine is None:
            if self._ring_engine is not None:  # persistent workers, one of which died
                self._ring_engine.close()
            setup = worker_setup(self.dataset, self.num_workers, seed, self.worker_init_fn)
            options = EngineOptions(
                parallel=self.num_workers,
                backend="process",
                prefetch=max(1, (self.prefetch_factor or 1) * self.num_workers),
                ordered=self.in_order,
                lean=True,  # memory for the batches in flight only, as PyTorch's
            )
            processes = ProcessOptions(
                worker_init=setup,
                timeout=self.timeout or None,
                split_steps=False,  # PyTorch's contract: batch k from worker k mod n
                lend=True,  # a batch is its slot, reused once the caller drops it
            )
            engine = Engine(options, processes)
            if self.persistent_workers:
                self._ring_engine = engine
                weakref.finalize(self, engine.close)
        on_end = (lambda: None) if self.persistent_workers else engine.close
        batches = RingBatches(engine.iterate(data, schedule), engine, self.timeout, on_end)
        if not self.persistent_workers:
            weakref.finalize(batches, engine.close)  # an epoch left before its end
        return batches

    def _inline_batches(self, tasks: Iterator[Any]) -> Iterator[Any]:
        fetch = Fetcher(
            self.dataset,
            self._iterable,
            self._auto_collation,
            self.batch_size,
            self.drop_last,
            self.collate_fn,
        )
        return Mapped(fetch, tasks)

    def _live_pool(self) -> QueueWorkers | None:
        """The persistent workers, while they run (after one died, the next epoch starts
        new ones)."""
        pool = self._pool
        return pool if pool is not None and pool.procs else None

    def _worker_batches(self, tasks: Iterator[Any], seed: int) -> Iterator[Any]:
        pool = self._live_pool()
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
            pool = QueueWorkers(self.dataset, spec, seed, context, self.num_workers)
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

    def _delivered(self, batches: Iterator[Any]) -> Delivered:
        delivered = Delivered(batches, self._counts, self._pins())
        self._follow(delivered)
        if isinstance(batches, WorkerIteration):
            delivered._workers = list(batches.pool.procs)
        elif isinstance(batches, RingBatches):
            delivered._workers = batches.engine.worker_processes
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
        report["path"] = self.path
        return report

    def close(self) -> None:
        """Stop persistent workers and release the engine's buffers. Idempotent."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
        ring, self._ring_engine = self._ring_engine, None
        if ring is not None:
            ring.close()
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()

    def __repr__(self) -> str:
        return (
            f"fastload.torch.DataLoader({type(self.dataset).__name__}, "
            f"batch_size={self.batch_size}, num_workers={self.num_workers}, path={self.path!r})"
        )


def _has_len(sampler: Any) -> bool:
    try:
        len(sampler)
    except TypeError:
        return False
    return True
