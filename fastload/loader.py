"""``DataLoader``, ``eachobs`` and ``eachobs_parallel``: epochs, order, state.

A loader composes, then hands over: each epoch it draws the order (shuffled from
(seed, epoch), or from a sampler; sharded) and makes it a ``Schedule`` (``_loading/epochs.py``,
``_loading/schedule.py``), which it hands with the container to its ``Engine``
(``_loading/engine.py``) to load and deliver the steps. As in MLUtils, ``DataLoader(data, ...)`` is
``eachobs_parallel(batchview(data, ...))`` with epochs on top: ``eachobs_parallel`` loads
any container, views included. A stream (no length, no positions) is read a round of
records at a time, each round loaded by the engine as a container (``_loading/rounds.py``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Generic, NoReturn, TypeVar, cast, overload

import numpy as np
import numpy.typing as npt

from . import _core
from ._base.arguments import check_flag
from ._base.collate import Collate, CollateOption
from ._base.keywords import refuse_unknown_keywords
from ._base.protocols import Blockwise, FilePages, PagedFiles
from ._base.tree import found_under, head, map_across, map_tree, tree_leaves
from ._loading.engine import Engine
from ._loading.engine_options import Allocator, Backend, EngineOptions, OnError
from ._loading.epochs import Epochs, Shuffle
from ._loading.options import BufferOption, LoaderOptions
from ._loading.rounds import DEFAULT_BUFFER, StreamEpochs
from ._loading.schedule import Schedule, folded_views, schedule_of
from ._loading.sharding import Shard, default_seed, resolve_shard
from ._loading.state import LoaderKind, check_state, sampler_kind, state_format
from .obs import Container, copy_into, getobs, is_batch_index, numobs
from .samplers import BatchSampler, Sampler
from .streams import stream_source
from .views import collate_batch

__all__ = ["DataLoader", "EpochLoader", "eachobs", "eachobs_parallel"]

_Loader = TypeVar("_Loader", bound="EpochLoader")
_T = TypeVar("_T")


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


class StatsReport(dict[str, float]):
    """Throughput of a loader and where the consumer's time went, as a dict (times in
    seconds) that prints as one short line."""

    def __init__(self, stats: Any) -> None:
        total = stats.wait_s + stats.compute_s
        super().__init__(
            items=stats.items,
            batches=stats.batches,
            items_per_s=stats.items / total if total > 0 else 0.0,
            wait_s=stats.wait_s,
            compute_s=stats.compute_s,
            wait_fraction=stats.wait_s / total if total > 0 else 0.0,
            skipped=stats.skipped,
        )

    def __str__(self) -> str:
        skipped = f", {self['skipped']:,} skipped" if self["skipped"] else ""
        return (
            f"{self['items']:,} items in {self['batches']:,} batches{skipped}: "
            f"{self['items_per_s']:,.0f} items/s, waited for data "
            f"{100 * self['wait_fraction']:.0f}% of the time"
        )


def _block_bounds(data: Container) -> npt.NDArray[np.int64] | None:
    """Block boundaries of the packed dataset under ``data``, or None."""
    found = found_under(data, lambda d: d.block_bounds if isinstance(d, Blockwise) else None)
    return found[0] if found else None


def _file_pages(data: Container) -> list[FilePages]:
    """The ``FilePages`` of the memory-mapped packed datasets under ``data``, each once."""
    found: dict[int, FilePages] = {}
    for pages in found_under(data, lambda d: d.file_pages if isinstance(d, PagedFiles) else None):
        found.setdefault(id(pages), pages)
    return list(found.values())


def _warn_random_reads(pages: list[FilePages]) -> None:
    """Warn when a packed dataset read in random order does not fit in memory."""
    for p in pages:
        if not p.fits_in_memory():
            warnings.warn(
                f"shuffle=True reads a packed dataset of {p.nbytes / 2**30:.1f} GiB "
                f"in random order, but it is larger than the memory this process "
                f"may use (its memory cgroup's limit, or the RAM): the page cache "
                f"cannot hold it, so each epoch reads the files at random from "
                f"disk, hundreds of times slower than in order. Use "
                f"shuffle='quasi' (blocks in random order, shuffled a wave at a "
                f"time), which reads at about the disk's sequential rate",
                UserWarning,
                stacklevel=4,
            )
            return


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


def _filled(target: Any, steps: Iterator[Any], batched: bool) -> Iterator[Any]:
    """The steps of ``steps`` each copied into ``target`` in place: ``buffer=`` arrays."""
    for value in steps:
        yield _fill(target, value, batched)


class _Option(Generic[_T]):
    """A loader's attribute that reads the option of the same name in ``loader.options``
    (in ``loader.options.engine`` when ``engine``). As an attribute it may be assigned,
    which changes what it reads, not how the loader loads."""

    def __init__(self, engine: bool = False) -> None:
        self.engine = engine

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, loader: None, owner: type) -> _Option[_T]: ...
    @overload
    def __get__(self, loader: EpochLoader, owner: type) -> _T: ...
    def __get__(self, loader: EpochLoader | None, owner: type) -> _Option[_T] | _T:
        if loader is None:
            return self
        options = loader.options.engine if self.engine else loader.options
        return cast(_T, getattr(options, self.name))


class EpochLoader:
    """What ``eachobs`` returns, and the base of ``DataLoader``: epochs, order, state, and
    the engine, made from one ``LoaderOptions`` (``batch_size=None``: each step one
    observation). Made by ``eachobs`` and ``DataLoader``, not called directly."""

    _stream: StreamEpochs | None  # a stream's epochs, or
    _epochs: Epochs | None  # a container's
    _pages: Any  # the FilePages read ahead in the quasi-random order

    # The options the loader was made with, read from ``self.options``.
    batch_size = _Option[int | None]()
    shuffle = _Option[Shuffle]()
    shuffle_buffer = _Option[int | None]()
    sampler = _Option[Sampler | None]()
    batch_sampler = _Option[BatchSampler | None]()
    drop_last = _Option[bool]()
    collate = _Option[Collate]()  # made a Collate by the options
    buffer = _Option[bool](engine=True)  # True also for arrays of the user's
    parallel = _Option[bool | int]()
    ordered = _Option[bool]()
    on_error = _Option[OnError]()
    backend = _Option[Backend]()

    def __init__(self, data: Container, options: LoaderOptions) -> None:
        source = stream_source(data)
        options = options.for_stream() if source is not None else options.for_container()
        self.options = options
        self._target = options.buffers
        self._engine = Engine(options.engine, allocator=options.allocator)
        self._engines = [self._engine]
        self.data = data
        self.rank, self.world_size = resolve_shard(options.shard)
        self.seed = default_seed(options.seed, self.world_size)
        self._epoch = 0  # the epoch the next iter() starts
        self._resume_at = 0  # the step it starts at (after load_state_dict)
        self._progress: _core.Progress | None = (
            None  # of the latest iteration: epoch, steps delivered
        )
        self._stats = _core.Stats()
        self._warned_skips = False
        self._read_ahead = None
        self._stream = self._epochs = self._pages = None
        if source is not None:
            self._open_stream(source)
        else:
            self._open_container(options.sampler, options.batch_sampler)

    def _open_stream(self, source: Any) -> None:
        # Two engines: a round loads on one while the one before it is delivered.
        engines = [self._engine]
        if self.parallel is not False:
            engines.append(Engine(self.options.engine, allocator=self.options.allocator))
        self._engines = engines
        buffer = (self.shuffle_buffer or DEFAULT_BUFFER) if self.shuffle else 0
        self._stream = StreamEpochs(
            self.data,
            source,
            engines,
            self.batch_size,
            shuffle_buffer=buffer,
            drop_last=self.drop_last,
            collate=self.collate,
            rank=self.rank,
            world_size=self.world_size,
            skip=self.on_error == "skip",
        )

    def _open_container(self, sampler: Sampler | None, batch_sampler: BatchSampler | None) -> None:
        data, shuffle = self.data, self.shuffle
        block_bounds = _block_bounds(data) if shuffle == "quasi" else None
        if shuffle == "quasi" and block_bounds is None:
            raise ValueError(
                "shuffle='quasi' reads a packed dataset block by block; this "
                "data has no blocks (use shuffle=True)"
            )
        self._n = numobs(data)
        self._epochs = Epochs(
            self._n,
            self.batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            drop_last=self.drop_last,
            collate=self.collate,
            rank=self.rank,
            world=self.world_size,
            block_bounds=block_bounds,
        )
        pages = _file_pages(data)
        if shuffle is True:
            _warn_random_reads(pages)
        # Read ahead in the quasi-random order: the pages of the dataset it follows.
        self._pages = next((p for p in pages if p.block_bounds is block_bounds), None)

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

    def schedule(self, epoch: int, start: int = 0) -> Schedule:
        """The ``Schedule`` of ``epoch`` from step ``start``: what the engine loads."""
        if self._stream is not None:
            raise TypeError("a stream has no schedule drawn up front")
        return self._epochs.schedule(self.seed, epoch, start)  # type: ignore[union-attr]

    def _steps(self, seed: int, epoch: int) -> int:
        # Called for a container only (a stream has no steps known up front).
        return self._epochs.steps(seed, epoch)  # type: ignore[union-attr]

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
        if self.batch_size is None and self.batch_sampler is None:
            return getobs(self.data, int(positions[0]))
        return collate_batch(self.data, positions, self.collate)

    def __bool__(self) -> bool:
        """True: a loader is one also when it has no length (a stream)."""
        return True

    def __iter__(self) -> Iterator[Any]:
        epoch, start = self._epoch, self._resume_at
        self._epoch, self._resume_at = epoch + 1, 0
        self._progress = _core.Progress(epoch, start)
        if self._stream is not None:
            steps = self._stream.iterate(
                self.seed, epoch, start, self._stats, self._progress, self._epoch_done
            )
        else:
            steps = self._iterate_container(epoch, start)
        if self._target is None:
            return steps
        batched = self.batch_size is not None or self.batch_sampler is not None
        return _filled(self._target, steps, batched)

    def _iterate_container(self, epoch: int, start: int) -> Iterator[Any]:
        # The obsview layers at the top of the data fold into the order: the engine loads
        # the container under them item by item (natively where it can), not whole steps
        # through the views.
        data, indices = folded_views(self.data)
        schedule = self.schedule(epoch, start).through(indices)
        self._stop_read_ahead()
        if self._pages is not None:
            self._read_ahead = self._pages.read_ahead(schedule.order, schedule.rows, schedule.start)
        # Started by the engine once it runs (worker processes are forked by then); stopped
        # at the end of the epoch, by the next one, or when the iteration is dropped.
        reading = self._read_ahead
        return self._engine.iterate(
            data,
            schedule,
            stats=self._stats,
            progress=self._progress,
            on_end=self._epoch_done,
            feeds=() if reading is None else (reading,),
        )

    def _stop_read_ahead(self) -> None:
        ahead, self._read_ahead = self._read_ahead, None
        if ahead is not None:
            ahead.close()

    def _epoch_done(self) -> None:
        self._stop_read_ahead()
        # The next epoch's order is finished within this epoch: no thread of the loader
        # works on between epochs (its time counts in this epoch's, where it belongs).
        if self._epochs is not None:
            self._epochs.finish_ahead()
        if self._stats.skipped and not self._warned_skips:
            self._warned_skips = True
            warnings.warn(
                f"skipped {self._stats.skipped} observations (or files of a stream) that "
                f"failed to load (on_error='skip'); loader.stats()['skipped'] keeps the count",
                RuntimeWarning,
                stacklevel=2,
            )

    def stats(self) -> StatsReport:
        """Items/s and where the time went since the loader was made: a dict with
        ``items``, ``batches``, ``items_per_s``, ``wait_s`` (consumer waiting for data),
        ``compute_s`` (consumer busy between batches), ``wait_fraction`` and ``skipped``.
        A large ``wait_fraction`` means training is input-bound. It prints as one line::

            12,800 items in 50 batches: 9,850 items/s, waited for data 3% of the time
        """
        return StatsReport(self._stats)

    def _live_position(self) -> tuple[int, int] | None:
        """(epoch, step) of the iteration in progress, or None when there is none or it
        delivered its whole epoch."""
        live = self._progress
        if live is None or live.epoch >= self._epoch:
            return None
        if self._stream is not None:
            iteration = self._stream.live()
            finished = iteration is None or iteration.epoch != live.epoch or iteration.finished()
        else:
            finished = live.step >= self._steps(self.seed, live.epoch)
        return None if finished else (live.epoch, live.step)

    def _kind(self) -> LoaderKind:
        return "stream" if self._stream is not None else "container"

    def state_dict(self) -> dict[str, Any]:
        """The position to resume from: restore it with ``load_state_dict`` on a loader
        built the same way, and iteration continues with the next step of that epoch.
        Its ``"format"`` names the kind of loader and the version of the layout; it also
        records the shard and the settings that shape the order (see
        ``fastload._loading.state``). Its values are ints, flags, None and strings."""
        epoch, step = self._live_position() or (self._epoch, self._resume_at)
        state: dict[str, Any] = {
            "format": state_format(self._kind()),
            "seed": self.seed,
            "epoch": epoch,
            "step": step,
        }
        if self._stream is None:
            state["steps"] = self._steps(self.seed, epoch)
        return dict(state, **self._settings())

    def _settings(self) -> dict[str, Any]:
        """What shapes this loader's order, and its shard, as a state records them."""
        settings: dict[str, Any] = {"rank": self.rank, "world_size": self.world_size}
        if self._stream is not None:
            settings["window"] = self._stream.round_size
            settings["shuffle"] = bool(self.shuffle)
            settings["shuffle_buffer"] = self._stream.shuffle_buffer
        else:
            settings["shuffle"] = self.shuffle
            settings["sampler"] = sampler_kind(self.sampler)
            settings["batch_sampler"] = sampler_kind(self.batch_sampler)
        settings["batch_size"] = None if self.batch_size is None else int(self.batch_size)
        settings["drop_last"] = bool(self.drop_last)
        return settings

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state`` (from ``state_dict``): the next ``iter()`` continues at the
        saved step of the saved epoch. Raises ``TypeError`` for something that is not a
        dict or a field of the wrong type (``step=2.5``, ``seed="3"``, ``epoch=True``: a
        bool is not an int; numpy's integers are), and ``ValueError`` if the state has no
        ``"format"``, is of a version this one does not read or of another kind of loader
        (a stream's for a container's), has a field out of range, belongs to another rank,
        to a loader whose settings give another order (``shuffle``, ``sampler``,
        ``batch_sampler``, ``batch_size``, ``drop_last``; a stream's ``shuffle_buffer``),
        or to one with a different number of steps per epoch (for a stream, another round
        of records). Each message names the field or setting."""
        check_state(state, self._kind(), self._settings())
        seed, epoch, step = int(state["seed"]), int(state["epoch"]), int(state["step"])
        if self._stream is None:
            steps = self._steps(seed, epoch)
            if state["steps"] != steps:
                raise ValueError(
                    f"the state is for a loader with {state['steps']} steps per "
                    f"epoch, this one has {steps}"
                )
        self.seed, self._epoch, self._resume_at = seed, epoch, step
        self._progress = None

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

    - ``batch_size``: observations per batch; the last batch is partial unless
      ``drop_last``. ``len(loader)`` is the number of batches per epoch (a stream has no
      length: ``TypeError``).
    - ``shuffle=True`` draws a new order every epoch from (``seed``, epoch) alone;
      ``seed=None`` draws a seed once, at construction (or takes 0 when sharded over
      several ranks, which must agree). A stream is shuffled through a buffer of
      ``shuffle_buffer`` records (default 1,024), and its files in a new order each epoch;
      ``shuffle_buffer`` is for streams only (the old spelling ``shuffle=n`` warns).
    - ``sampler``: the positions to load each epoch instead of all of them in order,
      ``sampler(epoch, seed) -> positions`` or an iterable of positions (see
      ``fastload.samplers``: ``WeightedSampler``). ``batch_sampler``: the batches
      themselves, of any sizes (``BucketBatchSampler``); it excludes ``batch_size``,
      ``shuffle``, ``sampler`` and ``drop_last``. ``shuffle="quasi"`` reads packed
      datasets larger than RAM block by block, reading the coming blocks ahead (see
      ``fastload._storage.readahead``); ``shuffle=True`` over a memory-mapped packed
      dataset larger than the memory this process may use warns (UserWarning) once.
    - ``collate``: as in ``batchview`` (None: ``getobs(data, indices)``; True: stack;
      False: list of observations; a callable: applied to that list).
    - ``buffer=True`` fills preallocated buffers in place and yields them: **a yielded
      batch is valid only until the next batch is requested**; copy what you keep.
      ``buffer=b`` (an array, or a tuple/dict of them, of one batch's shape and dtype)
      fills *your* buffer with each batch and yields it (its first rows for the last
      partial batch), as MLUtils' ``getobs!`` into a buffer of yours.
    - ``parallel``: False or 0 (the consumer's thread), True (all CPUs of the native pool)
      or a number of threads. Output is identical for every value.
    - ``ordered=False`` (parallel only) yields batches as they complete: the same batches
      per epoch, in an order that depends on timing. ``prefetch``: batches in flight.
    - ``backend="process"`` (with ``parallel=n``) loads in n worker processes instead of
      threads, for GIL-bound Python containers (see ``fastload._loading.processes``).
    - ``shard=(rank, world_size)`` or ``"auto"``: this process loads its own block of each
      epoch; all ranks get the same number of batches (see ``fastload._loading.sharding``).
      Without ``shard`` while several ranks are up (torch.distributed, ``WORLD_SIZE``,
      JAX), every rank loads the whole dataset, and a warning says so once;
      ``shard=False`` means that, without the warning.
    - ``on_error="skip"`` drops observations that fail to load from their batch (the batch
      is shorter), counts them in ``stats()["skipped"]`` and warns once; the default
      ``"raise"`` raises ``fastload.LoadError`` naming the index. A file of a ``FileStream``
      that fails to read is left from where it failed and counts as one.
    - ``allocator(shape, dtype) -> array`` makes the batch buffers of the ring
      (``numpy.empty`` by default); ``loader.allocator = f`` changes it for the next
      epoch (``fastload.torch`` pins memory this way).

    Raises ``ValueError`` for a ``batch_size`` that is not an int ``>= 1`` (a bool is
    not) or an unknown option value, ``TypeError`` for a flag that is not a bool, and
    one ``TypeError`` for all the keywords it does not take: for PyTorch's
    (``num_workers``, ``collate_fn``, ``pin_memory``, ...) and MLUtils' (``batchsize``,
    ``partial``, ``rng``) the message says what to write instead.
    """

    def __init__(
        self,
        data: Container,
        batch_size: int = 1,
        *,
        shuffle: Shuffle = False,
        shuffle_buffer: int | None = None,
        sampler: Sampler | None = None,
        batch_sampler: BatchSampler | None = None,
        drop_last: bool = False,
        collate: CollateOption = None,
        buffer: BufferOption = False,
        parallel: bool | int = False,
        seed: int | None = None,
        ordered: bool = True,
        prefetch: int | None = None,
        shard: Shard = None,
        on_error: OnError = "raise",
        backend: Backend = "thread",
        allocator: Allocator | None = None,
        **unknown: NoReturn,
    ) -> None:
        refuse_unknown_keywords("DataLoader", unknown, _LOADER_HINTS)
        if batch_size is None:
            raise ValueError(
                "batch_size must be a positive int, got None (single "
                "observations: use fastload.eachobs)"
            )
        options = LoaderOptions(
            batch_size=batch_size,
            shuffle=shuffle,
            shuffle_buffer=shuffle_buffer,
            sampler=sampler,
            batch_sampler=batch_sampler,
            drop_last=drop_last,
            collate=collate,
            buffer=buffer,
            parallel=parallel,
            seed=seed,
            ordered=ordered,
            prefetch=prefetch,
            shard=shard,
            on_error=on_error,
            backend=backend,
            allocator=allocator,
        )
        super().__init__(data, options)

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


def eachobs(
    data: Container,
    *,
    batch_size: int | None = None,
    shuffle: Shuffle = False,
    shuffle_buffer: int | None = None,
    sampler: Sampler | None = None,
    batch_sampler: BatchSampler | None = None,
    drop_last: bool = False,
    collate: CollateOption = None,
    buffer: BufferOption = False,
    parallel: bool | int = False,
    seed: int | None = None,
    ordered: bool = True,
    prefetch: int | None = None,
    shard: Shard = None,
    on_error: OnError = "raise",
    backend: Backend = "thread",
    allocator: Allocator | None = None,
    **unknown: NoReturn,
) -> EpochLoader:
    """Iterates ``data`` (a container or a stream), epoch after epoch: one observation at a
    time, or with ``batch_size`` (or ``batch_sampler``) batches, as ``DataLoader`` with the
    same arguments does (MLUtils' ``eachobs`` takes its ``DataLoader``'s arguments). One
    observation at a time, ``drop_last`` and ``collate=True/False`` have nothing to act on.

    ``buffer=`` may be an array (or a tuple/dict of them) shaped like one step: each step
    is then copied into it and the buffer itself is yielded (the first rows of it for a
    shorter last batch), as MLUtils' ``getobs!`` with a buffer of your own. Raises
    ``ValueError`` when such a buffer does not fit the steps (shape, structure or dtype),
    and for a collate function without a batch size (it would never be called).
    """
    refuse_unknown_keywords("eachobs", unknown, _LOADER_HINTS)
    options = LoaderOptions(
        batch_size=batch_size,
        shuffle=shuffle,
        shuffle_buffer=shuffle_buffer,
        sampler=sampler,
        batch_sampler=batch_sampler,
        drop_last=drop_last,
        collate=collate,
        buffer=buffer,
        parallel=parallel,
        seed=seed,
        ordered=ordered,
        prefetch=prefetch,
        shard=shard,
        on_error=on_error,
        backend=backend,
        allocator=allocator,
    )
    if options.batch_size is None and options.batch_sampler is None:
        return EpochLoader(data, options.one_at_a_time())
    return DataLoader._of(data, options)


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
