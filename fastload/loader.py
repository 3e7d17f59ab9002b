"""``DataLoader`` and ``eachobs``: epochs, order, shuffling, resumable state, delivery.

A loader is a view plus an iteration strategy: each epoch it builds
``batchview(obsview(data, order), ...)`` (or just the ordered view for ``eachobs``) and
iterates it sequentially, or in parallel on the native pool (``parallel.py``).
"""
import secrets
import time
from numbers import Integral

import numpy as np

from .context import loading
from .obs import getobs, getobs_into, numobs
from .parallel import Engine
from .views import batchview, obsview

__all__ = ["DataLoader", "eachobs"]

_SHUFFLES = (False, True, "quasi")


def _empty_batch_like(batch, rows):
    """A buffer for batches shaped like ``batch`` with ``rows`` rows (``rows=None``: the
    shape of ``batch`` itself); None when ``batch`` is not arrays."""
    if isinstance(batch, dict):
        parts = {k: _empty_batch_like(v, rows) for k, v in batch.items()}
        return None if any(p is None for p in parts.values()) else parts
    if isinstance(batch, tuple):
        parts = [_empty_batch_like(v, rows) for v in batch]
        if any(p is None for p in parts):
            return None
        return type(batch)(*parts) if hasattr(batch, "_fields") else tuple(parts)
    if isinstance(batch, np.ndarray):
        shape = batch.shape if rows is None else (rows,) + batch.shape[1:]
        return np.empty(shape, batch.dtype)
    return None


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


class _EpochLoader:
    """What ``DataLoader`` and ``eachobs`` share: epochs, order, state and delivery."""

    def __init__(self, data, *, shuffle, buffer, parallel, seed, ordered, prefetch):
        if shuffle not in _SHUFFLES:
            raise ValueError(f"shuffle must be False, True or 'quasi', got {shuffle!r}")
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
        self._n = numobs(data)
        self._epoch = 0          # the epoch the next iter() starts
        self._resume_at = 0      # the step it starts at (after load_state_dict)
        self._live = None        # [epoch, steps delivered] of the running iterator
        self._buffer = None
        self._stats = Stats()
        self._engine = None
        if parallel is not False:
            self._engine = Engine(buffered=self.buffer, ordered=ordered, prefetch=prefetch,
                                  num_threads=None if parallel is True else int(parallel))

    def order(self, epoch):
        """The observation order of ``epoch``: an int64 permutation that depends only on
        (seed, epoch), or ``arange`` when not shuffling."""
        if not self.shuffle:
            return np.arange(self._n, dtype=np.int64)
        if self.shuffle == "quasi":
            from .storage.order import quasi_random_order
            return quasi_random_order(self.data, self.seed, epoch)
        return np.random.Generator(np.random.PCG64([self.seed, epoch])).permutation(self._n)

    def _ordered_data(self, epoch):
        return obsview(self.data, self.order(epoch)) if self.shuffle else self.data

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

    def _sequential(self, steps, start, epoch):
        for k in range(start, numobs(steps)):
            with loading(self.seed, epoch):
                if self.buffer and self._buffer is None:
                    step = getobs(steps, k)
                    self._buffer = _empty_batch_like(step, self._rows())
                elif self._buffer is not None:
                    step = getobs_into(self._buffer, steps, k)
                else:
                    step = getobs(steps, k)
            yield step

    def _rows(self):
        return None

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
            epoch, step = self._epoch, 0
        return {"seed": self.seed, "epoch": epoch, "step": step, "steps": len(self)}

    def load_state_dict(self, state):
        """Resume from ``state`` (from ``state_dict``): the next ``iter()`` continues at the
        saved step of the saved epoch. Raises ``ValueError`` if the state belongs to a
        loader with a different number of steps per epoch."""
        missing = {"seed", "epoch", "step", "steps"} - set(state)
        if missing:
            raise ValueError(f"not a loader state: missing {sorted(missing)}")
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

    Raises ``ValueError`` for ``batch_size < 1`` or an unknown option value.
    """

    def __init__(self, data, batch_size=1, *, shuffle=False, drop_last=False, collate=None,
                 buffer=False, parallel=False, seed=None, ordered=True, prefetch=None):
        if not isinstance(batch_size, Integral) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        self.collate = collate
        super().__init__(data, shuffle=shuffle, buffer=buffer, parallel=parallel, seed=seed,
                         ordered=ordered, prefetch=prefetch)

    def __len__(self):
        return self._n // self.batch_size if self.drop_last else -(-self._n // self.batch_size)

    def _steps(self, epoch):
        return batchview(self._ordered_data(epoch), self.batch_size, self.drop_last, self.collate)

    def _rows(self):
        return self.batch_size

    def _count(self, batch):
        while isinstance(batch, (tuple, dict)) and len(batch):
            batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
        return len(batch) if hasattr(batch, "__len__") else 1

    def __repr__(self):
        return (f"DataLoader({self._n} observations, batch_size={self.batch_size}, "
                f"shuffle={self.shuffle}, parallel={self.parallel}, {len(self)} batches)")


class _ObsLoader(_EpochLoader):
    """Single observations, epoch after epoch (see ``eachobs``)."""

    def __len__(self):
        return self._n

    def _steps(self, epoch):
        return self._ordered_data(epoch)


def eachobs(data, *, shuffle=False, buffer=False, parallel=False, seed=None, ordered=True,
            prefetch=None):
    """Iterates the observations of ``data`` one at a time, with the options of
    ``DataLoader`` (shuffling per epoch, buffers, parallel loading, resumable state)."""
    return _ObsLoader(data, shuffle=shuffle, buffer=buffer, parallel=parallel, seed=seed,
                      ordered=ordered, prefetch=prefetch)
