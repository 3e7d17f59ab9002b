"""``DataLoader``, ``eachobs`` and ``eachobs_parallel``: epochs, order, state.

A loader composes, then hands over: each epoch it draws the order (shuffled from
(seed, epoch), sharded), makes it a ``Schedule`` (``schedule.py``) and hands that with the
container to its ``Engine`` (``engine.py``), which loads and delivers the steps. As in
MLUtils, ``DataLoader(data, ...)`` is ``eachobs_parallel(batchview(data, ...))`` with
epochs on top: ``eachobs_parallel`` loads any container, views included.
"""
import secrets
import threading
import warnings
import weakref
from numbers import Integral

import numpy as np

from . import _core
from .engine import Engine
from .obs import numobs
from .order import quasi_random_order
from .schedule import Schedule, schedule_of
from .sharding import resolve_shard, shard_order, shard_size
from .views import MappedObs

__all__ = ["DataLoader", "eachobs", "eachobs_parallel"]

_SHUFFLES = (False, True, "quasi")
_DRAW_AHEAD_FROM = 1 << 16   # observations from which the next epoch's order is drawn ahead


class _Ahead:
    """``order(epoch)`` drawn on a thread of its own, for the loader's next epoch."""

    def __init__(self, order, seed, epoch):
        self.key = (seed, epoch)
        self.box = []
        self.thread = threading.Thread(target=lambda: self.box.append(order(epoch)),
                                       name="fastload-order-ahead", daemon=True)
        self.thread.start()

    def result(self, seed, epoch):
        """The order, or None when it was drawn for another (seed, epoch) or did not
        finish (a forked child does not have the thread)."""
        if self.key != (seed, epoch):
            return None
        self.thread.join()
        return self.box[0] if self.box else None


class StatsReport(dict):
    """Throughput of a loader and where the consumer's time went, as a dict (times in
    seconds) that prints as one short line."""

    def __init__(self, stats):
        total = stats.wait_s + stats.compute_s
        super().__init__(items=stats.items, batches=stats.batches,
                         items_per_s=stats.items / total if total > 0 else 0.0,
                         wait_s=stats.wait_s, compute_s=stats.compute_s,
                         wait_fraction=stats.wait_s / total if total > 0 else 0.0,
                         skipped=stats.skipped)

    def __str__(self):
        skipped = f", {self['skipped']:,} skipped" if self["skipped"] else ""
        return (f"{self['items']:,} items in {self['batches']:,} batches{skipped}: "
                f"{self['items_per_s']:,.0f} items/s, waited for data "
                f"{100 * self['wait_fraction']:.0f}% of the time")


def _found(data, name):
    """The attribute ``name`` (when not None) of ``data``, else of the containers under it
    (through tuples, dicts and ``mapobs``), in order: how the loader finds what a packed
    dataset offers (its chunks, checksums, file pages) under columns and views of it."""
    found = getattr(data, name, None)
    if found is not None:
        return [found]
    if isinstance(data, (tuple, dict)):
        members = data.values() if isinstance(data, dict) else data
        return [v for member in members for v in _found(member, name)]
    if isinstance(data, MappedObs):
        return _found(data.data, name)
    return []


def _chunk_bounds(data):
    """Chunk boundaries of the packed dataset under ``data``, or None."""
    found = _found(data, "chunk_bounds")
    return found[0] if found else None


def _verifiers(data):
    """The ``verify_rows`` of the packed datasets under ``data`` opened with
    ``verify="read"``: they check a step's chunks before the loader hands it out."""
    return _found(data, "verify_rows")


def _file_pages(data):
    """The ``FilePages`` of the memory-mapped packed datasets under ``data``, each once."""
    found = {}
    for pages in _found(data, "file_pages"):
        found.setdefault(id(pages), pages)
    return list(found.values())


def _warn_random_reads(pages):
    """Warn when a packed dataset read in random order does not fit in memory."""
    for p in pages:
        if not p.fits_in_memory():
            warnings.warn(f"shuffle=True reads a packed dataset of {p.nbytes / 2**30:.1f} GiB "
                          f"in random order, but it is larger than the memory this process "
                          f"may use (its memory cgroup's limit, or the RAM): the page cache "
                          f"cannot hold it, so each epoch reads the files at random from "
                          f"disk, hundreds of times slower than in order. Use "
                          f"shuffle='quasi' (chunks in random order, shuffled a window at a "
                          f"time), which reads at about the disk's sequential rate",
                          UserWarning, stacklevel=4)
            return


class _EpochLoader:
    """What ``DataLoader`` and ``eachobs`` share: epochs, order, state, and the engine.
    ``batch_size=None`` makes each step one observation."""

    def __init__(self, data, batch_size=None, *, shuffle=False, drop_last=False,
                 collate=None, buffer=False, parallel=False, seed=None, ordered=True,
                 prefetch=None, shard=None, on_error="raise", backend="thread"):
        if shuffle not in _SHUFFLES:
            raise ValueError(f"shuffle must be False, True or 'quasi', got {shuffle!r}")
        if seed is not None and not isinstance(seed, Integral):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        self._engine = Engine(parallel=parallel, buffer=bool(buffer), ordered=bool(ordered),
                              prefetch=prefetch, on_error=on_error, backend=backend)
        self.data = data
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = bool(drop_last)
        self.collate = collate
        self.buffer = bool(buffer)
        self.parallel = parallel
        self.seed = int(seed) if seed is not None else secrets.randbits(63)
        self.ordered = ordered
        self.on_error = on_error
        self.rank, self.world_size = resolve_shard(shard)
        self._n = numobs(data)
        self._per_rank = shard_size(self._n, self.world_size, drop_last)
        self._chunk_bounds = _chunk_bounds(data) if shuffle == "quasi" else None
        if shuffle == "quasi" and self._chunk_bounds is None:
            raise ValueError("shuffle='quasi' reads a packed dataset chunk by chunk; this "
                             "data has no chunks (use shuffle=True)")
        pages = _file_pages(data)
        if shuffle is True:
            _warn_random_reads(pages)
        # Read ahead in the quasi-random order: the pages of the dataset it follows.
        self._pages = next((p for p in pages if p.chunk_bounds is self._chunk_bounds), None)
        self._read_ahead = None
        self._epoch = 0          # the epoch the next iter() starts
        self._resume_at = 0      # the step it starts at (after load_state_dict)
        self._progress = None    # epoch and steps delivered of the latest iteration
        self._stats = _core.Stats()
        self._warned_skips = False
        self._ahead = None       # the next epoch's order, being drawn

    def order(self, epoch):
        """The observations this rank loads in ``epoch``, in order: an int64 array that
        depends only on (seed, epoch, rank, world_size)."""
        if not self.shuffle:
            order = np.arange(self._n, dtype=np.int64)
        elif self.shuffle == "quasi":
            order = quasi_random_order(self._n, self._chunk_bounds, self.seed, epoch)
        else:
            order = np.random.Generator(np.random.PCG64([self.seed, epoch])).permutation(self._n)
        return shard_order(order, self.rank, self.world_size, self.drop_last)

    def schedule(self, epoch, start=0):
        """The ``Schedule`` of ``epoch`` from step ``start``: what the engine loads."""
        return Schedule(self._order_ahead(epoch), self.batch_size, drop_last=self.drop_last,
                        collate=self.collate, seed=self.seed, epoch=epoch, start=start)

    def _order_ahead(self, epoch):
        """``order(epoch)``, drawn ahead during the previous epoch when it was the next one.
        A permutation of a million observations takes tens of milliseconds in one thread:
        drawn ahead, it overlaps loading instead of delaying the epoch's first batch."""
        ahead, self._ahead = self._ahead, None
        order = ahead.result(self.seed, epoch) if ahead is not None else None
        if order is None:
            order = self.order(epoch)
        if self.shuffle is True and self._n >= _DRAW_AHEAD_FROM:
            self._ahead = _Ahead(self.order, self.seed, epoch + 1)
        return order

    def __len__(self):
        n, size = self._per_rank, self.batch_size or 1
        return n // size if self.drop_last else -(-n // size)

    def __iter__(self):
        epoch, start = self._epoch, self._resume_at
        self._epoch, self._resume_at = epoch + 1, 0
        self._progress = _core.Progress(epoch, start)
        schedule = self.schedule(epoch, start)
        self._stop_read_ahead()
        if self._pages is not None:
            self._read_ahead = self._pages.read_ahead(schedule.order, schedule.rows,
                                                      schedule.start)
        reading = self._read_ahead
        iteration = self._engine.iterate(self.data, schedule, stats=self._stats,
                                         progress=self._progress, on_end=self._epoch_done,
                                         verify_rows=_verifiers(self.data),
                                         delivered=reading and reading.delivered)
        if reading is not None:
            # Started once the engine runs (worker processes are forked by then); stopped
            # at the end of the epoch, by the next one, or when the iteration is dropped.
            reading.start()
            weakref.finalize(iteration, reading.close)
        return iteration

    def _stop_read_ahead(self):
        ahead, self._read_ahead = self._read_ahead, None
        if ahead is not None:
            ahead.close()

    def _epoch_done(self):
        self._stop_read_ahead()
        # The next epoch's order is finished within this epoch: no thread of the loader
        # works on between epochs (its time counts in this epoch's, where it belongs).
        if self._ahead is not None:
            self._ahead.thread.join()
        if self._stats.skipped and not self._warned_skips:
            self._warned_skips = True
            warnings.warn(f"skipped {self._stats.skipped} observations that failed to load "
                          f"(on_error='skip'); loader.stats()['skipped'] keeps the count",
                          RuntimeWarning, stacklevel=2)

    def stats(self):
        """Items/s and where the time went since the loader was made: a dict with
        ``items``, ``batches``, ``items_per_s``, ``wait_s`` (consumer waiting for data),
        ``compute_s`` (consumer busy between batches), ``wait_fraction`` and ``skipped``.
        A large ``wait_fraction`` means training is input-bound. It prints as one line::

            12,800 items in 50 batches: 9,850 items/s, waited for data 3% of the time
        """
        return StatsReport(self._stats)

    def state_dict(self):
        """The position to resume from: restore it with ``load_state_dict`` on a loader
        built the same way, and iteration continues with the next step of that epoch."""
        live = self._progress
        if live is not None and live.step < len(self):
            epoch, step = live.epoch, live.step
        else:
            epoch, step = self._epoch, self._resume_at
        return {"seed": self.seed, "epoch": epoch, "step": step, "steps": len(self),
                "rank": self.rank, "world_size": self.world_size}

    def load_state_dict(self, state):
        """Resume from ``state`` (from ``state_dict``): the next ``iter()`` continues at the
        saved step of the saved epoch. Raises ``ValueError`` if the state belongs to a
        loader with a different number of steps per epoch."""
        missing = {"seed", "epoch", "step", "steps"} - set(state)
        if missing:
            raise ValueError(f"not a loader state: missing {sorted(missing)}")
        if state.get("world_size", 1) != self.world_size or state.get("rank", 0) != self.rank:
            raise ValueError(f"the state is for rank {state.get('rank', 0)} of "
                             f"{state.get('world_size', 1)}, this loader is rank {self.rank} "
                             f"of {self.world_size}")
        if state["steps"] != len(self):
            raise ValueError(f"the state is for a loader with {state['steps']} steps per "
                             f"epoch, this one has {len(self)}")
        if not 0 <= state["step"] <= len(self):
            raise ValueError(f"step {state['step']} is out of range for {len(self)} steps")
        self.seed = int(state["seed"])
        self._epoch = int(state["epoch"])
        self._resume_at = int(state["step"])
        self._progress = None

    def close(self):
        """Stop background work and release the batch buffers. Idempotent."""
        self._stop_read_ahead()
        self._engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        """``with DataLoader(...) as loader:`` closes the loader at the end of the block."""
        self.close()


class DataLoader(_EpochLoader):
    """Iterates batches of ``data``, epoch after epoch.

    - ``batch_size``: observations per batch; the last batch is partial unless
      ``drop_last``. ``len(loader)`` is the number of batches per epoch.
    - ``shuffle=True`` draws a new order every epoch from (``seed``, epoch) alone;
      ``seed=None`` draws a seed once, at construction. ``shuffle="quasi"`` reads packed
      datasets larger than RAM chunk by chunk, reading the coming chunks ahead (see
      ``fastload.storage.readahead``); ``shuffle=True`` over a memory-mapped packed
      dataset larger than the memory this process may use warns (UserWarning) once.
    - ``collate``: as in ``batchview`` (None: ``getobs(data, indices)``; True: stack;
      False: list of observations; a callable: applied to that list).
    - ``buffer=True`` fills preallocated buffers in place and yields them: **a yielded
      batch is valid only until the next batch is requested**; copy what you keep.
    - ``parallel``: False (the consumer's thread), True (all CPUs of the native pool) or a
      number of threads. Output is identical for every value.
    - ``ordered=False`` (parallel only) yields batches as they complete: the same batches
      per epoch, in an order that depends on timing. ``prefetch``: batches in flight.
    - ``backend="process"`` (with ``parallel=n``) loads in n worker processes instead of
      threads, for GIL-bound Python containers (see ``fastload.processes``).
    - ``shard=(rank, world_size)`` or ``"auto"``: this process loads its own block of each
      epoch; all ranks get the same number of batches (see ``fastload.sharding``).
    - ``on_error="skip"`` drops observations that fail to load from their batch (the batch
      is shorter), counts them in ``stats()["skipped"]`` and warns once; the default
      ``"raise"`` raises ``fastload.LoadError`` naming the index.

    Raises ``ValueError`` for ``batch_size < 1`` or an unknown option value.
    """

    def __init__(self, data, batch_size=1, *, shuffle=False, drop_last=False, collate=None,
                 buffer=False, parallel=False, seed=None, ordered=True, prefetch=None,
                 shard=None, on_error="raise", backend="thread"):
        if not isinstance(batch_size, Integral) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not (collate is None or isinstance(collate, bool) or callable(collate)):
            raise TypeError(f"collate must be None, True, False or a callable, got {collate!r}")
        super().__init__(data, int(batch_size), shuffle=shuffle, drop_last=drop_last,
                         collate=collate, buffer=buffer, parallel=parallel, seed=seed,
                         ordered=ordered, prefetch=prefetch, shard=shard, on_error=on_error,
                         backend=backend)

    def __repr__(self):
        return (f"DataLoader({self._n} observations, batch_size={self.batch_size}, "
                f"shuffle={self.shuffle}, parallel={self.parallel}, {len(self)} batches)")


def eachobs(data, *, shuffle=False, buffer=False, parallel=False, seed=None, ordered=True,
            prefetch=None, shard=None, on_error="raise", backend="thread"):
    """Iterates the observations of ``data`` one at a time, with the options of
    ``DataLoader`` (shuffling per epoch, buffers, parallel loading, sharding, resumable
    state)."""
    return _EpochLoader(data, shuffle=shuffle, buffer=buffer, parallel=parallel, seed=seed,
                        ordered=ordered, prefetch=prefetch, shard=shard, on_error=on_error,
                        backend=backend)


class _ParallelIterable:
    """The observations of a container, loaded by one engine each time it is iterated."""

    def __init__(self, data, engine):
        self.data, self.schedule = schedule_of(data)
        self.engine = engine

    def __len__(self):
        return self.schedule.steps

    def __iter__(self):
        return self.engine.iterate(self.data, self.schedule, verify_rows=_verifiers(self.data))


def eachobs_parallel(data, *, buffer=True, parallel=True, ordered=True, prefetch=None):
    """Iterate the observations of any container, loaded in parallel on the native pool.

    Pass a ``batchview`` to iterate batches: ``eachobs_parallel(batchview(data, 64))``
    is what ``DataLoader(data, 64, parallel=True, buffer=True)`` does each epoch.
    ``parallel``: True (the pool's threads) or a number of threads. ``ordered=True``
    yields in index order whatever finished first; ``ordered=False`` in completion order
    (the same set). With ``buffer=True`` **each value is a view into a reused slot, valid
    until the next value is requested**; with ``buffer=False`` the caller owns it.

    Arrays (and tuples/dicts of them) load natively with no Python work per item. Any
    other container is read by Python code that holds the GIL per item: it runs in
    parallel only as far as that code releases the GIL (numpy, simplejpeg, PIL do).
    Raises ``fastload.LoadError`` naming the index when an observation fails to load.
    """
    return _ParallelIterable(data, Engine(parallel=parallel, buffer=buffer, ordered=ordered,
                                          prefetch=prefetch))
