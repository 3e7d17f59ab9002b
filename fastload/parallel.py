"""Parallel delivery on the native pool: ``eachobs_parallel`` and the loader's engine.

Concurrency invariants (kept by ``Engine.iterate``, the only code touching a ring):
- a slot is in exactly one place: free, in flight (its job is running), or held by the
  consumer (its value was yielded and ``next()`` was not called again);
- a job is joined (its tasks have all returned) before its slot is reused, and before the
  iteration ends for any reason, so no native thread writes into freed memory;
- every wait is a bounded timed wait in a loop, so Ctrl-C and errors always get through.
"""
import atexit
import collections
import threading
import weakref
from numbers import Integral

import numpy as np

from . import _core
from .context import loading
from .errors import LoadError
from .obs import numobs
from .plan import make_plan
from .views import source_of

__all__ = ["Engine", "eachobs_parallel"]

_WAIT_S = 0.05
_live_groups = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit():
    """Cancel running iterations and join the pool while Python can still serve the GIL
    to tasks that are inside a Python callback."""
    for group in list(_live_groups):
        group.cancel()
    _core.shutdown_pool()


class Engine:
    """Loads the steps of a container on the pool into a ring of reused slots.

    ``buffered``: yield views into a ring slot (valid until the next ``next()``) instead of
    fresh arrays. ``ordered``: yield step ``k`` before ``k+1``. ``prefetch``: steps in
    flight (default 2 for batches, twice the threads for single observations).
    ``num_threads``: threads that work on one step (default: the pool's size).
    ``on_error``: "raise", or "skip" to drop failed observations from their batch.
    ``allocator(shape, dtype)`` makes the ring's arrays (np.empty by default; an
    integration may allocate pinned or shared memory instead).
    """

    def __init__(self, *, buffered=True, ordered=True, prefetch=None, num_threads=None,
                 on_error="raise", allocator=np.empty):
        if num_threads is not None and (not isinstance(num_threads, Integral) or num_threads < 1):
            raise ValueError(f"num_threads must be a positive int or None, got {num_threads!r}")
        if prefetch is not None and (not isinstance(prefetch, Integral) or prefetch < 1):
            raise ValueError(f"prefetch must be a positive int or None, got {prefetch!r}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.buffered = buffered
        self.ordered = ordered
        self.prefetch = prefetch
        self.num_threads = num_threads
        self.on_error = on_error
        self.allocator = allocator
        self.skipped = 0
        self._ring = None
        self._ring_signature = None
        self._ring_busy = False
        self._ring_lock = threading.Lock()   # guards _ring and _ring_busy
        self._groups = weakref.WeakSet()

    def _threads(self):
        if self.num_threads is None:
            return _core.pool_size()
        _core.reserve_threads(self.num_threads)
        return self.num_threads

    def _slots(self, plan, count):
        """The ring for ``plan``: allocated once, reused while the plan's layout is the same.
        An iteration that starts while another still runs gets a ring of its own."""
        with self._ring_lock:
            if self._ring_busy:
                return [plan.allocate(self.allocator) for _ in range(count)]
            if self._ring is None or self._ring_signature != (plan.signature, count):
                self._ring = [plan.allocate(self.allocator) for _ in range(count)]
                self._ring_signature = (plan.signature, count)
            self._ring_busy = True
            return self._ring

    def iterate(self, steps, start=0, *, epoch=0, seed=0):
        """Yield ``getobs(steps, k)`` for k from ``start`` on, loaded in parallel."""
        plan = make_plan(steps)
        threads = self._threads()
        prefetch = self.prefetch or (2 if plan.rows else 2 * threads)
        group = _core.Group()
        _live_groups.add(group)
        self._groups.add(group)
        ring = self._slots(plan, prefetch + 1) if self.buffered else None
        jobs = [_core.Job(group, _core.Plan(plan.fields, plan.row_bytes))
                for _ in range(prefetch + 1)]
        return self._run(plan, steps, start, epoch, seed, group, ring, jobs, threads, prefetch)

    def _run(self, plan, steps, start, epoch, seed, group, ring, jobs, threads, prefetch):
        free = collections.deque(range(len(jobs)))
        inflight = collections.deque()       # (step, slot, dests, objects)
        held = None
        next_step, total = start, numobs(steps)
        skip = self.on_error == "skip"
        try:
            while True:
                if held is not None:
                    free.append(held)
                    held = None
                while next_step < total and len(inflight) < prefetch:
                    slot = free.popleft()
                    inflight.append(self._submit(plan, next_step, slot, ring, jobs[slot],
                                                 epoch, seed, threads, skip))
                    next_step += 1
                if not inflight:
                    return
                entry = self._wait(group, inflight, jobs)
                if group.cancelled:
                    raise RuntimeError("the loader was closed while this iteration ran")
                step, slot, dests, objects = entry
                value = self._finish(plan, steps, step, jobs[slot], dests, objects)
                if self.buffered:
                    held = slot
                else:
                    free.append(slot)
                yield value
        finally:
            group.cancel()
            for _, slot, _, _ in inflight:
                jobs[slot].join()
            _live_groups.discard(group)
            with self._ring_lock:
                if ring is self._ring:
                    self._ring_busy = False

    def _submit(self, plan, step, slot, ring, job, epoch, seed, threads, skip):
        idx = plan.positions(step)
        dests = ring[slot] if ring is not None else plan.allocate()
        objects = [[None] * len(idx) if leaf is None else None for leaf in dests]
        if plan.has_python:
            fill = plan.filler(dests, objects)

            def filler(field, pos, index):
                with loading(seed, epoch):
                    fill(field, pos, index)
            job.filler = filler
        # Cheap native items are claimed in chunks so threads do not contend per item.
        chunk = 1 if plan.expensive else max(1, -(-len(idx) // (4 * threads)))
        job.submit(idx, plan.core_destinations(dests), seed, epoch, threads, skip, chunk)
        return step, slot, dests, objects

    def _wait(self, group, inflight, jobs):
        """Remove and return the next in-flight entry to deliver, once its job finished."""
        while True:
            if self.ordered:
                if jobs[inflight[0][1]].wait(_WAIT_S):
                    return inflight.popleft()
            else:
                found = _core.wait_any(group, [jobs[e[1]] for e in inflight], _WAIT_S)
                if found >= 0:
                    entry = inflight[found]
                    del inflight[found]
                    return entry

    def _finish(self, plan, steps, step, job, dests, objects):
        job.join()
        failure = job.failure
        keep = None
        if failure is not None:
            pos, field, message = failure
            index = int(job.indices[pos])
            if job.fatal:
                cause = job.error[1] if job.error is not None else None
                if isinstance(cause, LoadError):
                    raise cause
                if plan.whole_steps:
                    raise LoadError(f"could not load step {step}: {message}") from cause
                raise LoadError(f"could not load observation {index}: {message}", index=index,
                                source=source_of(plan.leaves[field].container, index)) from cause
            keep = job.failed_items == 0
            self.skipped += int(len(keep) - keep.sum())
        return plan.assemble(dests, objects, job.n, keep)

    def close(self):
        """Stop the running iterations, if any, and release the ring. Idempotent."""
        for group in list(self._groups):
            group.cancel()
        with self._ring_lock:
            self._ring = None
            self._ring_busy = False


class _ParallelIterable:
    def __init__(self, data, engine):
        self.data = data
        self.engine = engine

    def __len__(self):
        return numobs(self.data)

    def __iter__(self):
        return self.engine.iterate(self.data)


def eachobs_parallel(data, *, buffered=True, num_threads=None, ordered=True, prefetch=None):
    """Iterate the observations of any container, loaded in parallel on the native pool.

    Pass a ``batchview`` to iterate batches. ``ordered=True`` yields in index order
    whatever finished first; ``ordered=False`` in completion order (the same set).
    With ``buffered=True`` **each value is a view into a reused slot, valid until the next
    value is requested**; with ``buffered=False`` the caller owns it.

    Arrays (and tuples/dicts of them) load natively with no Python work per item. Any
    other container is read by Python code that holds the GIL per item: it runs in
    parallel only as far as that code releases the GIL (numpy, simplejpeg, PIL do).
    Raises ``fastload.LoadError`` naming the index when an observation fails to load.
    """
    return _ParallelIterable(data, Engine(buffered=buffered, ordered=ordered,
                                          prefetch=prefetch, num_threads=num_threads))
