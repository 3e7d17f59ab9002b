"""The engine: loads the steps of a schedule into a ring of reused slots and delivers them.

::

    DataLoader / eachobs / eachobs_parallel          (loader.py: epochs, order, state)
        | container + Schedule(order, batch_size, drop_last, collate, seed, epoch, start,
        |                       bounds: the steps' offsets when batches differ in size)
        v
    Engine.iterate                                   (this module: options, ring, transport)
        | make_plan(container, schedule)             (plan.py: per leaf a LeafKind)
        v
    _core.Iteration.__next__                         (_core.pyx: the one delivery loop)
        | native run: fl_run_next                    (csrc/engine.c: claim, fill, complete)
        |   parallel=0: items load in the caller's thread
        |   parallel=n: n pool threads claim items  (csrc/pool.c)
        | or worker processes                        (processes.py, workers.py)
        v
    a filled slot -> its cached array views (buffer=True) or a copy (buffer=False)

Slot invariants: a slot is free, loading (only the tasks of its step write into it),
ready, or held by the consumer (its value was handed out and ``next()`` was not called
again; with ``buffer=True`` also the step before, until the next ``next()`` checks that
nothing refers to it any more); a slot is reused only after the consumer released it, and
an iteration waits for its tasks before its ring can be freed.
"""

from __future__ import annotations

import atexit
import mmap
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import numpy as np

from .. import _core, tensors
from .._base.protocols import FeedSource
from .._base.tree import fed_under, map_tree
from ..context import loading
from ..obs import Container
from .engine_options import Allocator, EngineOptions, ProcessOptions, worker_options
from .plan import make_plan
from .processes import WorkerPool
from .schedule import Schedule
from .seams import Dests, Feed, Objects, Plan, Reply, Transport

__all__ = ["Engine"]

# ``filler(slot, field, pos, index)``: loads an item of a Python field (``_core.Iteration``).
_Filler: TypeAlias = Callable[[int, int, int, int], None]

_RING_BYTES = 32 << 20  # the most a ring of cheap (gathered) steps takes by default
# An iteration of cheap native steps on the pool measures whether the caller's thread
# would load them faster (``_core.Iteration.start_run``'s adaptive); after two iterations
# measured, the engine keeps their answer (the caller's thread when both said so, else the
# pool) for the plan's next iterations, and measures again after _REMEASURE of them.
_REMEASURE = 8
# Steps this small (values copied, bytes) cost less to copy than any hand-over between
# threads: they load in the caller's thread without being measured. (A batch of one row,
# or of 16 rows of an array and a label, costs 1-3 us to gather; on the pool such steps
# loaded at 0.55x and 0.7x the caller's thread: bench/parallel.py, its batch of one and
# ``--only arrays --batch 16``.)
_TINY_VALUES = 96
_TINY_BYTES = 16 << 10
_live: weakref.WeakSet[_core.Iteration] = (
    weakref.WeakSet()
)  # iterations that may still have tasks running


@atexit.register
def _stop_all_at_exit() -> None:
    """Cancel running iterations and join the pool while Python can still serve the GIL
    to tasks that are inside a Python callback."""
    for iteration in list(_live):
        iteration.cancel()
    _core.shutdown_pool()


class Engine:
    """Loads the steps of a schedule into a ring of reused slots and delivers them.

    ``options`` (``EngineOptions``): ``parallel``: False (the caller's thread), True (the
    pool's threads, or as many worker processes as ``FASTLOAD_NUM_THREADS`` or the CPUs
    say) or a number of threads (processes with ``backend="process"``). ``buffer``: yield
    views into a ring slot (valid until the next ``next()``) instead of arrays the caller
    owns. ``ordered``: yield step ``k`` before ``k+1``. ``prefetch``: steps in flight.
    ``on_error``: "raise", or "skip" to drop failed observations from their batch.
    ``lean``: with ``buffer=False``, hold memory only for the steps in flight and those the
    caller holds, as a loader that makes a new shared buffer per batch does: a slot's pages
    go back to the system as soon as its step is copied out, or dropped when it was lent
    (worker processes), and each copy is a map of its own, returned to the system when the
    caller drops it (a freed copy would stay in the allocator's heap), at the cost of
    faulting pages in again each step (worker processes loading whole steps keep the
    pages of as many slots as a steady state uses at once: ``WorkerPool``).

    ``processes`` (``ProcessOptions``, with ``backend="process"``; its defaults when
    None): ``worker_init(worker_id)`` runs once in each worker process after it is forked
    (ids 0 to n - 1), where it may seed the worker's random state; what it raises is
    raised by the iteration. ``split_steps``: spread each step's rows over the workers in
    contiguous parts (part p to worker p), as threads share a step's items, so that no
    worker idles while fewer steps than workers remain; False: whole steps, step k loaded
    by worker k mod n (for code whose random state is seeded per worker in
    ``worker_init``). fastload's own draws are keyed by the observation: both give the
    same values. ``timeout``: the most seconds to wait for a step from the workers
    (``TimeoutError``; None: no limit). ``lend`` (``buffer=False``): hand each whole step
    out as arrays over its slot, with no copy, and reuse the slot only once the caller
    dropped every array of it (and every view, tensor or slice of them); the caller owns
    them as it owns a copy. Two steps are lent at most: past that (a caller that keeps its
    batches) steps are copied, so the ring always cycles; a step some of whose
    observations were skipped, or a shorter last one, is copied too.

    ``allocator(shape, dtype)`` makes the ring's arrays (``numpy.empty`` when None; an
    integration may allocate pinned memory instead; ``engine.allocator`` may be set
    between iterations). Raises ``ValueError`` for process options on threads and for
    ``lend=True`` with ``buffer=True`` (see ``worker_options``).
    """

    def __init__(
        self,
        options: EngineOptions,
        processes: ProcessOptions | None = None,
        *,
        allocator: Allocator | None = None,
    ) -> None:
        self.options = options
        self.processes = worker_options(options, processes)
        self.allocator: Allocator = np.empty if allocator is None else allocator
        # (signature, slots, values, watches) reused across iterations
        self._ring: tuple[Any, list[Dests], list[Any], list[_core.SlotWatch] | None] | None = None
        # (slots, values, watches) of the worker processes' ring, while it is the same
        self._worker_ring_values: (
            tuple[list[Dests], list[Any], list[_core.SlotWatch] | None] | None
        ) = None
        # A weak reference to the iteration using the ring, or to the engine itself while
        # the iteration that took the ring is being made.
        self._ring_owner: weakref.ref[Any] | None = None
        self._lock = threading.Lock()
        # Per plan signature: (whether its steps loaded faster in the caller's thread than
        # on the pool when last measured, whether the measure before said the same,
        # iterations since).
        self._adapted: dict[Any, tuple[bool, bool, int]] = {}
        self._iterations: weakref.WeakSet[_core.Iteration] = weakref.WeakSet()
        self._workers: WorkerPool | None = None
        if self.processes is not None:
            parallel = options.parallel
            count = _core.default_pool_size() if parallel is True else int(parallel)
            self._workers = WorkerPool(
                count, self.processes, lean=options.lean and not options.buffer
            )

    @property
    def ring(self) -> list[Dests] | None:
        """The slots of the ring kept across iterations (each a list of destination arrays
        per leaf), or None before the first iteration and after ``close()``."""
        return None if self._ring is None else self._ring[1]

    @property
    def worker_processes(self) -> list[Any]:
        """The worker processes (``multiprocessing.Process``, worker id k at k) while they
        run; empty before the first iteration, after ``close()`` and without them."""
        workers = self._workers
        return list(workers.procs) if workers is not None and workers.procs else []

    def _parallel(self) -> int:
        """Pool threads that work for one iteration (0: the caller's thread)."""
        if self.options.parallel is False:
            return 0
        if self.options.parallel is True:
            return _core.pool_size()
        _core.reserve_threads(self.options.parallel)
        return int(self.options.parallel)

    def _slots(self, plan: Plan, parallel: int) -> int:
        """Slots of the ring: ``prefetch`` steps in flight and those held by the consumer
        (with ``buffer``, two: the last step, and the one before it while its references
        are checked; lending, two: the last step, and the one before it until the next
        ``next()`` takes its slot back)."""
        lends = self.processes is not None and self.processes.lend
        return self._in_flight(plan, parallel) + (2 if self.options.buffer or lends else 1)

    def _in_flight(self, plan: Plan, parallel: int) -> int:
        if self._workers is not None:
            return self.options.prefetch or 2 * self._workers.count
        if parallel == 0:
            return 0
        if self.options.prefetch:
            return self.options.prefetch
        if plan.expensive:
            return 2 if plan.batch_size else 2 * parallel
        # Cheap steps: enough of them in flight that a wake-up pays for many.
        prefetch = max(2, min(128, -(-4096 // plan.rows)))
        slot_bytes = max(1, sum(plan.row_bytes) * plan.rows)
        while prefetch > 2 and (prefetch + 1) * slot_bytes > _RING_BYTES:
            prefetch //= 2
        return prefetch

    def _ring_for(
        self, plan: Plan, count: int
    ) -> tuple[list[Dests], list[Any], list[_core.SlotWatch] | None, bool]:
        """Slots for ``plan``: the engine's ring, made once and reused while its layout is
        the same; an iteration that starts while another uses it gets a ring of its own."""
        key = (plan.signature, count)
        with self._lock:
            owner = self._ring_owner() if self._ring_owner is not None else None
            busy = owner is self or (owner is not None and not owner.done)
            if not busy:
                self._ring_owner = weakref.ref(self)  # until the iteration that uses it exists
                if self._ring is not None and self._ring[0] == key:
                    return self._ring[1], self._ring[2], self._ring[3], True
        slots = [plan.allocate(self.allocator) for _ in range(count)]
        values = [plan.whole_value(slot) for slot in slots]
        watches = self._watch(slots, values)
        if not busy:
            self._ring = (key, slots, values, watches)
        return slots, values, watches, not busy

    def _worker_ring(
        self, workers: WorkerPool, data: Container, plan: Plan, count: int
    ) -> tuple[list[Dests], list[Any], list[_core.SlotWatch] | None]:
        """The worker processes' ring for ``plan`` (made before they fork), its values and
        watches, kept while the workers keep it."""
        slots = workers.ring(data, plan, count)
        if self._worker_ring_values is None or self._worker_ring_values[0] is not slots:
            values = [plan.whole_value(slot) for slot in slots]
            self._worker_ring_values = (slots, values, self._watch(slots, values))
        return self._worker_ring_values

    def _watch(self, slots: list[Dests], values: list[Any]) -> list[_core.SlotWatch] | None:
        """What tells, with ``buffer``, that the consumer kept a batch of a slot about to be
        reused (``_core.SlotWatch``); counted now, while nothing outside holds the ring."""
        return _core.watch_ring(slots, values) if self.options.buffer else None

    def iterate(
        self,
        data: Container,
        schedule: Schedule,
        *,
        stats: Any = None,
        progress: Any = None,
        on_end: Callable[[], None] | None = None,
        feeds: Sequence[Feed] = (),
    ) -> _core.Iteration:
        """An iterator over the steps of ``schedule`` loaded from the container ``data``
        (a ``_core.Iteration``). ``stats`` and ``progress`` (``_core.Stats``,
        ``_core.Progress``) are updated as steps are delivered; ``on_end()`` is called
        when the last one was. ``feeds`` (``seams.Feed``), and the feed of the data under
        ``data`` (``feeds_of``), are started once the run is, close when it ends (before
        ``on_end``), fails to start or is dropped, check each step's rows before it is
        handed out and are then told that it is; a native run claims no item at a position
        from a feed's ``gate[0]`` on (what holds the run back while the data of the next
        items is fetched; worker processes ``ensure`` it themselves). Raises
        ``fastload.LoadError`` naming the observation that failed to load; ValueError,
        before anything starts, for a native run given more than one gated feed.
        """
        stats = stats if stats is not None else _core.Stats()
        progress = (
            progress if progress is not None else _core.Progress(schedule.epoch, schedule.start)
        )
        skip = self.options.on_error == "skip"
        feeds = [*feeds, *feeds_of(data, schedule)]

        def ended() -> None:
            _close(feeds)
            if on_end is not None:
                on_end()

        try:
            if self._workers is None and sum(feed.gate is not None for feed in feeds) > 1:
                raise ValueError("an iteration takes one gated feed at most")
            plan = _plan(data, schedule, skip, stats, feeds)
            iteration = self._iteration(data, schedule, plan, stats, progress, ended, feeds)
        except BaseException:
            _close(feeds)
            raise
        weakref.finalize(iteration, _close, feeds)
        return iteration

    def _iteration(
        self,
        data: Container,
        schedule: Schedule,
        plan: Plan,
        stats: Any,
        progress: Any,
        on_end: Callable[[], None] | None,
        feeds: list[Feed],
    ) -> _core.Iteration:
        """The iteration of ``plan``, started, and its ``feeds`` with it."""
        parallel = 0 if self._workers is None and _tiny(plan) else self._parallel()
        count = self._slots(plan, parallel)
        if self._workers is not None:
            # An earlier iteration's jobs end first: workers that would not give them up
            # are stopped there, and the ring below starts new ones.
            self._workers.drain()
            ring, values, watches = self._worker_ring(self._workers, data, plan, count)
            shared = False
        else:
            ring, values, watches, shared = self._ring_for(plan, count)
        try:
            iteration = _core.Iteration(
                plan,
                ring=ring,
                values=values,
                objects=[plan.new_objects() for _ in ring],
                rows=plan.rows,
                buffer=self.options.buffer,
                stats=stats,
                progress=progress,
                on_end=on_end,
                count_values=plan.whole_steps and schedule.batch_size is not None,
                check=_checker(schedule, feeds),
                watches=watches,
                copier=_mapped_copy if self.options.lean and not self.options.buffer else None,
            )
        except BaseException:
            if shared:
                self._ring_owner = None
            raise
        if shared:
            self._ring_owner = weakref.ref(iteration)
        self._iterations.add(iteration)
        if self._workers is not None:
            skip = self.options.on_error == "skip"
            transport = self._workers.begin(schedule, plan, self.options.ordered, skip, stats)
            iteration.start_transport(_Rechecked(transport, feeds) if feeds else transport)
        else:
            self._start_run(iteration, plan, ring, schedule, parallel)
            gates = [feed.gate for feed in feeds if feed.gate is not None]
            if gates and not plan.whole_steps:  # a whole step reads through Python
                iteration.gate(gates[0])
            _live.add(iteration)
        for feed in feeds:
            feed.start(iteration.is_gated)
        return iteration

    def _start_run(
        self,
        iteration: _core.Iteration,
        plan: Plan,
        ring: list[Dests],
        schedule: Schedule,
        parallel: int,
    ) -> None:
        """Start ``iteration`` loading natively: in the caller's thread, or on ``parallel``
        pool threads."""
        filler = _filler(plan, ring, iteration.objects, schedule) if plan.has_python else None
        # Cheap items are claimed several at a time so threads do not contend per item.
        claim_size = 1 if plan.expensive else max(16, -(-plan.rows // (4 * max(parallel, 1))))
        parallel, adaptive = self._adapt(plan, parallel, filler, iteration)
        # A whole-step plan loads step s as its item s: one row a step, whatever the bounds.
        bounds = None if plan.whole_steps else schedule.bounds
        iteration.start_run(
            _core.Fields(plan.fields, plan.row_bytes),
            order=plan.order(schedule),
            bounds=bounds,
            first_step=schedule.start,
            end_step=schedule.steps,
            seed=schedule.seed,
            epoch=schedule.epoch,
            parallel=parallel,
            claim_size=claim_size,
            ordered=self.options.ordered,
            skip_errors=self.options.on_error == "skip",
            release_gil=plan.expensive,
            filler=filler,
            adaptive=adaptive,
        )

    def _adapt(
        self,
        plan: Plan,
        parallel: int,
        filler: _Filler | None,
        iteration: _core.Iteration,
    ) -> tuple[int, bool]:
        """``(parallel, adaptive)`` for an iteration of ``plan``: cheap native steps (gathers:
        arrays, tables) can cost less to load in the caller's thread than to hand over from
        a pool thread. Such an iteration measures which is faster for its caller (the time
        spent in ``next()``, where a training step's work between two batches counts for the
        pool); after two measured iterations, the caller's thread (0 threads) if both said
        so, else the pool, for the plan's next iterations, until ``_REMEASURE``."""
        if parallel == 0 or plan.expensive or filler is not None:
            return parallel, False
        key = plan.signature
        known = self._adapted.get(key)
        if known is not None and known[1] and known[2] < _REMEASURE:
            self._adapted[key] = (known[0], True, known[2] + 1)
            return (0 if known[0] else parallel), False

        def adapted(
            inline: bool, adapted: dict[Any, tuple[bool, bool, int]] = self._adapted
        ) -> None:
            before = adapted.get(key)
            if before is None:
                adapted[key] = (inline, False, 0)  # measured once: measure again
            else:  # two measures that disagree are a tie: the pool, as asked
                adapted[key] = (inline and before[0], True, 0)

        iteration.on_adapted = adapted
        return parallel, True

    def close(self) -> None:
        """Stop the running iterations, if any, stop worker processes and release the
        ring. Idempotent; the next iteration starts afresh."""
        for iteration in list(self._iterations):
            iteration.cancel()
        if self._workers is not None:
            self._workers.close()
        with self._lock:
            self._ring = self._ring_owner = self._worker_ring_values = None


def _tiny(plan: Plan) -> bool:
    """Whether the steps of ``plan`` are plain gathers of so few values and bytes that
    they load in the caller's thread, whatever ``parallel`` says (``_TINY_VALUES``)."""
    return (
        not plan.expensive
        and not plan.has_python
        and plan.rows * len(plan.fields) <= _TINY_VALUES
        and plan.rows * sum(plan.row_bytes) <= _TINY_BYTES
    )


def feeds_of(data: Container, schedule: Schedule) -> list[Feed]:
    """The feeds of the sources under ``data`` (``fed_under``) for ``schedule``: one per
    kind of source, made by one of them for all of that kind."""
    kinds: dict[type, list[FeedSource]] = {}
    for source in fed_under(data):
        kinds.setdefault(type(source), []).append(source)
    start = schedule.first(schedule.start)

    def step_end(step: int) -> int:
        return schedule.first(step) + len(schedule.positions(step))

    made = [
        sources[0].feed(
            schedule.order,
            start,
            first_step=schedule.start,
            step_end=step_end,
            slack=2 * schedule.rows,  # over memory_bytes: two steps ahead of the consumer
            together=sources,
        )
        for sources in kinds.values()
    ]
    return [feed for feed in made if feed is not None]


def _plan(
    data: Container, schedule: Schedule, skip: bool, stats: Any, feeds: Sequence[Feed]
) -> Plan:
    """``make_plan``; when it fails, the feeds' checks first (a probe that read past a
    file's new end says so)."""
    try:
        return make_plan(data, schedule, skip=skip, stats=stats)
    except Exception:
        _recheck(feeds)
        raise


def _recheck(feeds: Sequence[Feed]) -> None:
    """Run each feed's ``check`` on no rows: what it checks whatever the rows (a file that
    shrank under a read, in this process or a worker) raises its own error."""
    for feed in feeds:
        feed.check(np.zeros(0, np.int64))


def _close(feeds: Sequence[Feed]) -> None:
    for feed in feeds:
        feed.close()


class _Rechecked:
    """A worker transport whose failures (a worker's plan that differs from the
    consumer's, say) are preceded by ``_recheck``: when a worker read past the new end of
    a file that shrank, the error names the file rather than what the zeros it read did."""

    def __init__(self, transport: Transport, feeds: Sequence[Feed]) -> None:
        self.transport, self.feeds = transport, feeds

    def next(self, release: int) -> Reply | None:
        try:
            return self.transport.next(release)
        except Exception:
            _recheck(self.feeds)
            raise

    def lend(self, slot: int, value: Any) -> Any:
        return self.transport.lend(slot, value)

    def copied(self, slot: int) -> None:
        self.transport.copied(slot)

    def close(self) -> None:
        self.transport.close()


def _mapped_copy(value: Any) -> Any:
    """``value`` with each array (or CPU tensor) copied into an anonymous map of its own,
    unmapped when the copy (and every view of it) is dropped."""

    def mapped(array: np.ndarray) -> np.ndarray:
        # Private: its pages fault in for less than shared memory's do.
        pages = mmap.mmap(-1, max(1, array.nbytes), flags=mmap.MAP_PRIVATE)
        out = np.frombuffer(pages, array.dtype, array.size).reshape(array.shape)
        out[...] = array
        return out

    def copy(leaf: Any) -> Any:
        if isinstance(leaf, np.ndarray):
            return mapped(leaf)
        view = tensors.numpy_view(leaf) if tensors.is_tensor(leaf) else None
        return leaf if view is None else tensors.from_numpy(mapped(view))

    return map_tree(copy, value)


def _checker(schedule: Schedule, feeds: Sequence[Feed]) -> Callable[[int], None] | None:
    """``check(step)``: each feed checks the step's positions, then is told it was
    delivered; None without feeds."""
    if not feeds:
        return None

    def check(step: int) -> None:
        positions = schedule.positions(step)
        for feed in feeds:
            feed.check(positions)
        for feed in feeds:
            feed.delivered(step)

    return check


def _filler(plan: Plan, ring: list[Dests], objects: list[Objects], schedule: Schedule) -> _Filler:
    """The callback that loads an item of a Python leaf: ``filler(slot, field, pos,
    index)``, with ``context.current()`` giving the schedule's seed and epoch."""
    seed, epoch = schedule.seed, schedule.epoch

    def filler(slot: int, field: int, pos: int, index: int) -> None:
        with loading(seed, epoch):
            plan.fill(ring[slot], objects[slot], field, pos, index)

    return filler
