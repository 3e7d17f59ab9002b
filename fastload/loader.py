"""``DataLoader`` and ``eachobs``: epochs, order, shuffling, resumable state, delivery.

A loader is a view plus an iteration strategy: each epoch it builds
``batchview(obsview(data, order), ...)`` (or just the ordered view for ``eachobs``) and
iterates it sequentially, or in parallel on the native pool (``parallel.py``).
"""
import os
import secrets
import time
import warnings
from numbers import Integral

import numpy as np

from .context import loading
from .errors import LoadError
from .obs import getobs, getobs_into, map_tree, numobs, tree_leaves
from .order import quasi_random_order
from .parallel import Engine
from .processes import ProcessEngine
from .sharding import resolve_shard, shard_order, shard_size
from .views import MappedObs, batchview, obsview

__all__ = ["DataLoader", "eachobs"]

_SHUFFLES = (False, True, "quasi")


def _empty_batch_like(batch, rows):
    """A buffer for batches shaped like ``batch`` with ``rows`` rows (``rows=None``: the
    shape of ``batch`` itself); None when ``batch`` is not arrays."""
    if not all(isinstance(leaf, np.ndarray) for leaf in tree_leaves(batch)):
        return None
    return map_tree(lambda a: np.empty(a.shape if rows is None else (rows,) + a.shape[1:],
                                       a.dtype), batch)


class Stats:
    """Throughput of a loader and where the consumer's time went, in seconds."""

    def __init__(self):
        self.items = 0
        self.batches = 0
        self.wait_s = 0.0      # consumer blocked in next(), waiting for data
        self.compute_s = 0.0   # consumer busy between batches (the training step)
        self.skipped = 0       # observations dropped by on_error="skip"

    def as_dict(self):
        total = self.wait_s + self.compute_s
        return {"items": self.items, "batches": self.batches,
                "items_per_s": self.items / total if total > 0 else 0.0,
                "wait_s": self.wait_s, "compute_s": self.compute_s,
                "wait_fraction": self.wait_s / total if total > 0 else 0.0,
                "skipped": self.skipped}

    def __repr__(self):
        d = self.as_dict()
        return (f"{d['items']} items in {d['batches']} batches, {d['items_per_s']:.0f} items/s; "
                f"waited for data {d['wait_s']:.3f} s ({100 * d['wait_fraction']:.0f}%), "
                f"between batches {d['compute_s']:.3f} s")


def _chunk_bounds(data):
    """Chunk boundaries of the packed dataset under ``data``, or None."""
    if hasattr(data, "chunk_bounds"):
        return data.chunk_bounds
    if isinstance(data, (tuple, dict)):
        for member in (data.values() if isinstance(data, dict) else data):
            bounds = _chunk_bounds(member)
            if bounds is not None:
                return bounds
    if isinstance(data, MappedObs):
        return _chunk_bounds(data.data)
    return None


class _EpochLoader:
    """What ``DataLoader`` and ``eachobs`` share: epochs, order, state and delivery."""

    def __init__(self, data, *, shuffle, buffer, parallel, seed, ordered, prefetch,
                 drop_last=False, shard=None, on_error="raise", backend="thread"):
        if shuffle not in _SHUFFLES:
            raise ValueError(f"shuffle must be False, True or 'quasi', got {shuffle!r}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if backend not in ("thread", "process"):
            raise ValueError(f"backend must be 'thread' or 'process', got {backend!r}")
        if backend == "process" and parallel is False:
            raise ValueError("backend='process' needs parallel=True or a number of workers")
        if parallel is not False and not (parallel is True or (
                isinstance(parallel, Integral) and parallel >= 1)):
            raise ValueError(f"parallel must be False, True or a number of threads >= 1, "
                             f"got {parallel!r}")
        if seed is not None and not isinstance(seed, Integral):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        self.data = data
        self.shuffle = shuffle
        self.buffer = bool(buffer)
        self.parallel = parallel
        self.seed = int(seed) if seed is not None else secrets.randbits(63)
        self.ordered = ordered
        self.on_error = on_error
        self._drop_remainder = bool(drop_last)
        self.rank, self.world_size = resolve_shard(shard)
        self._n = numobs(data)
        self._per_rank = shard_size(self._n, self.world_size, drop_last)
        self._chunk_bounds = _chunk_bounds(data) if shuffle == "quasi" else None
        if shuffle == "quasi" and self._chunk_bounds is None:
            raise ValueError("shuffle='quasi' reads a packed dataset chunk by chunk; this "
                             "data has no chunks (use shuffle=True)")
        self._epoch = 0          # the epoch the next iter() starts
        self._resume_at = 0      # the step it starts at (after load_state_dict)
        self._live = None        # [epoch, steps delivered] of the running iterator
        self._buffer = None
        self._stats = Stats()
        self._engine = None
        if parallel is not False:
            workers = None if parallel is True else int(parallel)
            if backend == "process":
                self._engine = ProcessEngine(workers=workers or len(os.sched_getaffinity(0)),
                                             buffered=self.buffer, ordered=ordered,
                                             prefetch=prefetch, on_error=on_error)
            else:
                self._engine = Engine(buffered=self.buffer, ordered=ordered,
                                      prefetch=prefetch, num_threads=workers,
                                      on_error=on_error)
        self._warned_skips = False

    def order(self, epoch):
        """The observations this rank loads in ``epoch``, in order: an int64 array that
        depends only on (seed, epoch, rank, world_size)."""
        if not self.shuffle:
            order = np.arange(self._n, dtype=np.int64)
        elif self.shuffle == "quasi":
            order = quasi_random_order(self._n, self._chunk_bounds, self.seed, epoch)
        else:
            order = np.random.Generator(np.random.PCG64([self.seed, epoch])).permutation(self._n)
        return shard_order(order, self.rank, self.world_size, self._drop_remainder)

    def _ordered_data(self, epoch):
        if self.shuffle or self.world_size > 1:
            return obsview(self.data, self.order(epoch))
        return self.data

    def _steps(self, epoch):
        """The container whose observations are this loader's steps in ``epoch``."""
        raise NotImplementedError

    def __len__(self):
        raise NotImplementedError

    def __iter__(self):
        epoch, start = self._epoch, self._resume_at
        self._epoch, self._resume_at = epoch + 1, 0
        steps = self._steps(epoch)
        live = self._live = [epoch, start]
        if self._engine is not None:
            source = self._engine.iterate(steps, start, epoch=epoch, seed=self.seed)
        else:
            source = self._sequential(steps, start, epoch)
        return self._deliver(source, live)

    def _deliver(self, source, live):
        stats = self._stats
        before = time.perf_counter()
        try:
            while True:
                try:
                    step = next(source)
                except StopIteration:
                    self._report_skips()
                    return
                got = time.perf_counter()
                stats.wait_s += got - before
                stats.batches += 1
                stats.items += self._count(step)
                live[1] += 1
                yield step
                before = time.perf_counter()
                stats.compute_s += before - got
        finally:
            source.close()

    def _count(self, step):
        return 1

    def _report_skips(self):
        if self._engine is not None:
            self._stats.skipped = self._engine.skipped
        if self._stats.skipped and not self._warned_skips:
            self._warned_skips = True
            warnings.warn(f"skipped {self._stats.skipped} observations that failed to load "
                          f"(on_error='skip'); loader.stats()['skipped'] keeps the count",
                          RuntimeWarning, stacklevel=3)

    def _sequential(self, steps, start, epoch):
        for k in range(start, numobs(steps)):
            with loading(self.seed, epoch):
                try:
                    step = self._load(steps, k)
                except Exception as error:
                    if self.on_error == "skip":
                        step = self._load_skipping(steps, k)
                    elif isinstance(error, (LoadError, IndexError)):
                        raise
                    else:
                        raise LoadError(f"could not load step {k}: "
                                        f"{type(error).__name__}: {error}") from error
            if step is not None:
                yield step

    def _load(self, steps, k):
        if self.buffer and self._buffer is None and self._bufferable():
            step = getobs(steps, k)
            self._buffer = _empty_batch_like(step, self._rows())
            return step
        if self._buffer is not None:
            return getobs_into(self._buffer, steps, k)
        return getobs(steps, k)

    def _load_skipping(self, steps, k):
        """Step ``k`` without the observations that fail to load (None if none loads)."""
        ordered = steps.data if hasattr(steps, "batch_indices") else steps
        positions = steps.batch_indices(k) if hasattr(steps, "batch_indices") else [k]
        kept = []
        for p in positions:
            try:
                getobs(ordered, int(p))
                kept.append(int(p))
            except Exception:
                self._stats.skipped += 1
        if not kept:
            return None
        survivors = obsview(ordered, kept)
        if hasattr(steps, "batch_indices"):
            return getobs(batchview(survivors, len(kept), collate=steps.collate), 0)
        return getobs(survivors, 0)
    def _rows(self):
        return None

    def _bufferable(self):
        """Whether steps are arrays that can be filled in place."""
        return True

    def stats(self):
        """Items/s and where the time went since the loader was made: a dict with
        ``items``, ``batches``, ``items_per_s``, ``wait_s`` (consumer waiting for data),
        ``compute_s`` (consumer busy between batches), ``wait_fraction`` and ``skipped``.
        A large ``wait_fraction`` means training is input-bound."""
        return self._stats.as_dict()

    def state_dict(self):
        """The position to resume from: restore it with ``load_state_dict`` on a loader
        built the same way, and iteration continues with the next step of that epoch."""
        live = self._live
        if live is not None and live[1] < len(self):
            epoch, step = live
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
        self._live = None

    def close(self):
        """Stop background work and release the batch buffers. Idempotent."""
        if self._engine is not None:
            self._engine.close()


class DataLoader(_EpochLoader):
    """Iterates batches of ``data``, epoch after epoch.

    - ``batch_size``: observations per batch; the last batch is partial unless
      ``drop_last``. ``len(loader)`` is the number of batches per epoch.
    - ``shuffle=True`` draws a new order every epoch from (``seed``, epoch) alone;
      ``seed=None`` draws a seed once, at construction. ``shuffle="quasi"`` reads packed
      datasets larger than RAM chunk by chunk (see ``fastload.storage``).
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
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        self.collate = collate
        super().__init__(data, shuffle=shuffle, buffer=buffer, parallel=parallel, seed=seed,
                         ordered=ordered, prefetch=prefetch, drop_last=drop_last, shard=shard,
                         on_error=on_error, backend=backend)

    def __len__(self):
        n = self._per_rank
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _steps(self, epoch):
        return batchview(self._ordered_data(epoch), self.batch_size, self.drop_last, self.collate)

    def _rows(self):
        return self.batch_size

    def _bufferable(self):
        # A collate function or collate=False builds values of its own choosing.
        return self.collate is None or self.collate is True

    def _count(self, batch):
        while isinstance(batch, (tuple, dict)) and len(batch):
            batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
        if isinstance(batch, np.ndarray):
            return batch.shape[0] if batch.ndim else 1
        return len(batch) if hasattr(batch, "__len__") else 1

    def __repr__(self):
        return (f"DataLoader({self._n} observations, batch_size={self.batch_size}, "
                f"shuffle={self.shuffle}, parallel={self.parallel}, {len(self)} batches)")


class _ObsLoader(_EpochLoader):
    """Single observations, epoch after epoch (see ``eachobs``)."""

    def __len__(self):
        return self._per_rank

    def _steps(self, epoch):
        return self._ordered_data(epoch)


def eachobs(data, *, shuffle=False, buffer=False, parallel=False, seed=None, ordered=True,
            prefetch=None, shard=None, on_error="raise", backend="thread"):
    """Iterates the observations of ``data`` one at a time, with the options of
    ``DataLoader`` (shuffling per epoch, buffers, parallel loading, sharding, resumable
    state)."""
    return _ObsLoader(data, shuffle=shuffle, buffer=buffer, parallel=parallel, seed=seed,
                      ordered=ordered, prefetch=prefetch, shard=shard, on_error=on_error,
                      backend=backend)
