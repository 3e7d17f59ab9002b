"""``DataLoader``, ``eachobs`` and ``eachobs_parallel``: epochs, order, state.

A loader composes, then hands over: each epoch it draws the order (shuffled from
(seed, epoch), or from a sampler; sharded) and makes it a ``Schedule`` (``_loading/epochs.py``,
``_loading/schedule.py``), which it hands with the container to its ``Engine``
(``_loading/engine.py``) to load and deliver the steps. As in MLUtils, ``DataLoader(data, ...)`` is
``eachobs_parallel(batchview(data, ...))`` with epochs on top: ``eachobs_parallel`` loads
any container, views included. A stream (no length, no positions) is read a round of
records at a time, each round loaded by the engine as a container (``_loading/rounds.py``).

This module is the loaders' public surface. What a loader is made of and how it iterates
lives in ``_loading/iteration.py``, its state and resume in ``_loading/resume.py``, its
options (each keyword once: name, type, default, meaning) in ``_loading/options.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NoReturn, TypeVar

import numpy as np
import numpy.typing as npt

from ._base.arguments import check_flag
from ._base.collate import Collate
from ._base.keywords import (
    documented_fields,
    init_keywords_of,
    keywords_of,
    refuse_unknown_keywords,
    taken_keywords,
)
from ._loading.engine import Engine
from ._loading.engine_options import Allocator, EngineOptions
from ._loading.iteration import StatsReport
from ._loading.options import LoaderOptions
from ._loading.resume import ResumableLoader
from ._loading.schedule import Schedule, schedule_of
from .obs import Container, getobs, is_batch_index
from .views import collate_batch

__all__ = ["DataLoader", "EpochLoader", "StatsReport", "eachobs", "eachobs_parallel"]

_Loader = TypeVar("_Loader", bound="EpochLoader")

# The two spellings of buffering, each refused where the other is the name: the loaders
# take MLUtils' buffer= (a flag, or arrays of your own), eachobs_parallel takes
# DataLoaders.jl's buffered= (a flag: the values are views into its ring).
_LOADER_HINTS = {
    "buffered": "use buffer=True (or buffer=arrays of your own); buffered= is eachobs_parallel's",
}
_PARALLEL_HINTS = {
    "buffer": "use buffered=True or False; buffer= (which also takes arrays of your "
    "own) is DataLoader's and eachobs'",
}
# The options a loader's attributes read (``loader.batch_size``): every keyword but those
# it keeps as its own attributes (the seed it drew, its allocator).
_ATTRIBUTES = frozenset(LoaderOptions.__dataclass_fields__) - {"engine", "seed", "allocator"}


class EpochLoader(ResumableLoader):
    """What ``eachobs`` returns, and the base of ``DataLoader``: epochs, order, state, and
    the engine, made from one ``LoaderOptions`` (``batch_size=None``: each step one
    observation). Made by ``eachobs`` and ``DataLoader``, not called directly.

    Each option the loader was made with is an attribute of the same name
    (``loader.batch_size``, ``loader.shuffle``, ...; ``loader.buffer`` is True also for
    arrays of the user's, ``loader.collate`` a ``Collate``). An attribute may be assigned,
    which changes what it reads, not how the loader loads."""

    def __getattr__(self, name: str) -> Any:
        # Called only for a name the loader does not hold itself: an option's.
        options = self.__dict__.get("options")
        if options is None or name not in _ATTRIBUTES:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return options.engine.buffer if name == "buffer" else getattr(options, name)

    @property
    def allocator(self) -> Allocator:
        """``allocator(shape, dtype) -> array``: how the batch buffers of the ring are made
        (``numpy.empty`` by default; ``fastload.torch.TorchLoader(..., pin_memory=True)``
        sets one that allocates page-locked memory). Setting it drops the current ring:
        the next epoch allocates its buffers with it."""
        return self._engine.allocator

    @allocator.setter
    def allocator(self, allocator: Allocator) -> None:
        if not callable(allocator):
            raise TypeError(
                f"allocator must be callable as allocator(shape, dtype), got {allocator!r}"
            )
        for engine in self._engines:
            engine.close()
            engine.allocator = allocator

    def order(self, epoch: int) -> npt.NDArray[np.int64]:
        """The observations this rank loads in ``epoch``, in order: an int64 array that
        depends only on (seed, epoch, rank, world_size)."""
        if self._stream is not None:
            raise TypeError("a stream has no order drawn up front")
        return self._epochs.order(self.seed, epoch)  # type: ignore[union-attr]

    def __len__(self) -> int:
        """Steps per epoch (of the epoch being iterated, else of the next one: a sampler's
        epochs may differ). Raises ``TypeError`` for a stream, which has no length."""
        if self._stream is not None:
            raise TypeError(
                "a stream has no length: its number of batches is known only once it was read"
            )
        live = self._live_position()
        return self._steps(self.seed, live[0] if live else self._epoch)

    def __numobs__(self) -> int:
        """The steps of the epoch the next iteration starts: a loader over a container is
        itself a container of its steps (MLUtils' ``getobs(loader, i)``), so views such as
        ``mapobs`` apply to it. Raises ``TypeError`` for a stream."""
        if self._stream is not None:
            raise TypeError("a stream has no steps known up front: it is not a container")
        return self._steps(self.seed, self._epoch)

    def __getobs__(self, i: int | npt.NDArray[np.int64]) -> Any:
        """Step ``i`` of the epoch the next iteration starts (a list of those steps for
        several ``i``), formed as the loader forms it and owned by the caller."""
        schedule = self.schedule(self._epoch)
        if is_batch_index(i):
            return [self._step(schedule, int(j)) for j in i]
        return self._step(schedule, i)

    def _step(self, schedule: Schedule, step: int) -> Any:
        positions = schedule.positions(step)
        if self.options.batch_size is None and self.options.batch_sampler is None:
            return getobs(self.data, int(positions[0]))
        return collate_batch(self.data, positions, Collate.of(self.options.collate))

    def __bool__(self) -> bool:
        """True: a loader is one also when it has no length (a stream)."""
        return True

    def close(self) -> None:
        """Stop background work and release the batch buffers. Idempotent."""
        self._stop_read_ahead()
        if self._stream is not None:
            self._stream.stop()
            for engine in self._stream.engines:
                engine.close()
        self._engine.close()

    def __enter__(self: _Loader) -> _Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        """``with DataLoader(...) as loader:`` closes the loader at the end of the block."""
        self.close()


_EpochLoader = EpochLoader  # the name of 0.2 and before


class DataLoader(EpochLoader):
    """Iterates batches of ``data``, epoch after epoch.

    ``data`` is a container, or a stream (an iterable without a length: a generator, a
    PyTorch ``IterableDataset``, a Hugging Face streaming dataset, ``fastload.FileStream``;
    see ``fastload._loading.rounds``).

    Its options (keywords), as ``LoaderOptions`` holds them:

    {options}

    Raises ``ValueError`` for a ``batch_size`` that is not an int ``>= 1`` (a bool is
    not) or an unknown option value, ``TypeError`` for a flag that is not a bool, and
    one ``TypeError`` for all the keywords it does not take: for PyTorch's
    (``num_workers``, ``collate_fn``, ``pin_memory``, ...) and MLUtils' (``batchsize``,
    ``partial``, ``rng``) the message says what to write instead.
    """

    @init_keywords_of(LoaderOptions)
    def __init__(self, data: Container, batch_size: int = 1, **options: Any) -> None:
        taken = taken_keywords("DataLoader", LoaderOptions, options, _LOADER_HINTS)
        if batch_size is None:
            raise ValueError(
                "batch_size must be a positive int, got None (single "
                "observations: use fastload.eachobs)"
            )
        super().__init__(data, LoaderOptions(batch_size=batch_size, **taken))

    @classmethod
    def _of(cls, data: Container, options: LoaderOptions) -> DataLoader:
        """A loader of ``data`` with ``options`` (validated when they were made)."""
        loader = cls.__new__(cls)
        EpochLoader.__init__(loader, data, options)
        return loader

    def __repr__(self) -> str:
        size = "a stream" if self._stream is not None else f"{self._n} observations"
        steps = "" if self._stream is not None else f", {len(self)} batches"
        return (
            f"DataLoader({size}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"parallel={self.parallel}{steps})"
        )


@keywords_of(LoaderOptions)
def eachobs(data: Container, **options: Any) -> EpochLoader:
    """Iterates ``data`` (a container or a stream), epoch after epoch: one observation at a
    time, or with ``batch_size`` (or ``batch_sampler``) batches, as ``DataLoader`` with the
    same arguments does (MLUtils' ``eachobs`` takes its ``DataLoader``'s arguments: see
    ``DataLoader`` for each). One observation at a time, ``drop_last`` and
    ``collate=True/False`` have nothing to act on.

    ``buffer=`` may be an array (or a tuple/dict of them) shaped like one step: each step
    is then copied into it and the buffer itself is yielded (the first rows of it for a
    shorter last batch), as MLUtils' ``getobs!`` with a buffer of your own. Raises
    ``ValueError`` when such a buffer does not fit the steps (shape, structure or dtype),
    and for a collate function without a batch size (it would never be called).
    """
    taken = taken_keywords("eachobs", LoaderOptions, options, _LOADER_HINTS)
    loader_options = LoaderOptions(**taken)
    if loader_options.batch_size is None and loader_options.batch_sampler is None:
        return EpochLoader(data, loader_options.one_at_a_time())
    return DataLoader._of(data, loader_options)


# The options' list in DataLoader's docstring is made from the fields that define them.
DataLoader.__doc__ = (DataLoader.__doc__ or "").replace(
    "{options}", documented_fields(LoaderOptions, DataLoader.__init__).strip()
)


class _ParallelIterable:
    """The observations of a container, loaded by one engine each time it is iterated."""

    def __init__(self, data: Container, engine: Engine) -> None:
        self.data, self.schedule = schedule_of(data)
        self.engine = engine

    def __len__(self) -> int:
        return self.schedule.steps

    def __iter__(self) -> Iterator[Any]:
        return self.engine.iterate(self.data, self.schedule)


def eachobs_parallel(
    data: Container,
    *,
    buffered: bool = True,
    parallel: bool | int = True,
    ordered: bool = True,
    prefetch: int | None = None,
    **unknown: NoReturn,
) -> _ParallelIterable:
    """Iterate the observations of any container, loaded in parallel on the native pool.

    Pass a ``batchview`` to iterate batches: ``eachobs_parallel(batchview(data, 64))``
    is what ``DataLoader(data, 64, parallel=True, buffer=True)`` does each epoch.
    ``parallel``: True (the pool's threads) or a number of threads (0 or False: the
    caller's thread). ``ordered=True`` yields in index order whatever finished first;
    ``ordered=False`` in completion order (the same set). With ``buffered=True`` **each
    value is a view into a reused slot, valid until the next value is requested**; with
    ``buffered=False`` the caller owns it.

    Arrays (and tuples/dicts of them) load natively with no Python work per item. Any
    other container is read by Python code that holds the GIL per item: it runs in
    parallel only as far as that code releases the GIL (numpy, simplejpeg, PIL do).
    Raises ``fastload.LoadError`` naming the index when an observation fails to load, and
    ``TypeError`` for a keyword it does not take (``buffer=`` is ``DataLoader``'s).
    """
    refuse_unknown_keywords("eachobs_parallel", unknown, _PARALLEL_HINTS)
    options = EngineOptions(
        parallel=parallel,
        buffer=check_flag("buffered", buffered),
        ordered=ordered,
        prefetch=prefetch,
    )
    return _ParallelIterable(data, Engine(options))
