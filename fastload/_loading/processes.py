"""The process transport: steps loaded in worker processes, for GIL-bound Python containers.

``WorkerPool`` forks ``count`` workers (the 'fork' start method, so lambdas and local
functions in a container work as written and the container is never pickled); each
inherits the container and the ring once, when it starts, and keeps them across epochs.
Per epoch a worker receives the schedule (an ``Epoch``; ``workers.py`` builds the same plan
from it), per job a step number, a slot and the rows to load (a ``Job``). A step of r rows
is split into contiguous parts, one per worker (part p: rows [p*r//k, (p+1)*r//k) with
k = min(n, r), to worker p), as the thread backend spreads a step's items over its
threads: no worker idles at the end of an epoch while another loads a whole step. The
values do not depend on which worker loads an item (the draws are keyed by the
observation's index). Whole steps go to one worker (step k to worker k mod n) where a
caller relies on that (``split_steps=False``: a worker's own random state, seeded per
worker, gives what it loads) and for plans that load a step as one item (``plan.whole_steps``).
A worker loads its part into the slot in place, by the engine's inline native run; only
observations that are not arrays (a plan's "object" leaves) travel back pickled. The
consumer hands a step out once all its parts replied. The messages are the frozen
dataclasses of ``workers.py``.
The engine's delivery loop (``_core.Iteration``) calls ``next(release)`` of the
per-iteration ``_Transport`` (a ``seams.Transport``).

The ring is one anonymous shared mapping (``mmap`` MAP_SHARED) made before the fork: it
never has a name in ``/dev/shm``, so nothing is left behind whatever ends the run (a
SIGKILL included), and it is not bound by the size of ``/dev/shm`` (64 MB in Docker).

Concurrency invariants (kept by the consumer):
- a slot is free, in a worker's job queue or being filled, held by the consumer, or lent
  to the caller (``lend``: its step was handed out as arrays over it); a lent slot comes
  back only once its lease says every array over it was dropped, and only the consumer
  takes it back (``_SharedRing``);
- whole steps (not split in parts) are sent without a slot: the worker takes one when
  it starts the job, a spare first, else the lowest free one (``workers.SlotClaims``, a
  word per slot in the ring's header, taken under a lock only workers hold); the
  consumer counts the free slots (spares included) and sends no more such jobs than
  that, frees a slot's word or makes it a spare once its step is released (a lease does
  so as it is dropped), and resets the words but the spares' when an iteration begins,
  no job being out then;
- every job sent to a worker gets exactly one reply; ``Pipes.outstanding`` counts the
  replies due per worker, and a slot is reused only once the replies of all its step's
  parts arrived, so no worker writes into a slot the consumer reads;
- the word at the head of the mapping holds the live generation: a worker abandons a
  job of another generation between items, so stopping an iteration is prompt;
- every wait is a timed wait on the pipes and the process sentinels together
  (``children.Pipes``): a worker that dies raises in the consumer at once, Ctrl-C
  always gets through, and a step that does not come within ``timeout`` raises
  ``TimeoutError`` then (the workers are killed first: they hold on to their jobs);
- a worker dies with the consumer, even stuck in an item (``children.py``, which forks
  the workers with their pipes and carries their errors back).

A worker runs ``worker_init(worker_id)`` (when given) once, after the fork and before any
job: where a caller seeds a worker's random state or sets what its code reads. What
``worker_init`` raises is raised in the consumer at its next step, as the worker raised it.
"""

from __future__ import annotations

import collections
import itertools
import mmap
import multiprocessing
import os
import time
import weakref
from collections.abc import Sequence
from multiprocessing.process import BaseProcess
from numbers import Integral
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from .._base.children import Pipes, WorkerDied, WorkerError, fork_workers, remote_error
from .._base.tree import map_tree
from .engine_options import ProcessOptions
from .schedule import Schedule
from .seams import Dests, Failure, Objects, Plan, Reply
from .workers import (
    Cancelled,
    Done,
    Epoch,
    InitError,
    InitFailed,
    ItemFailed,
    Job,
    JobReply,
    SlotClaims,
    WorkerFailed,
    carve_ring,
    ring_header,
    worker_main,
)

# The errors of the transport (``InitError``, ``WorkerDied``, ``WorkerError``) live where
# they are raised (``workers.py``, ``children.py``); they are named here for its callers.
__all__ = ["InitError", "WorkerDied", "WorkerError", "WorkerPool"]

_WAIT_S = 0.5  # one timed wait on the pipes and sentinels
# Slots lent to the consumer at once: the batch it is handed, and the one before, which
# its loop variable still holds while it asks for the next.
_LEND_LIMIT = 2
_STOP_S = 30.0  # most time to let workers abandon their jobs before killing them


class WorkerPool:
    """``count`` forked worker processes holding a container and a shared ring.

    The workers are forked at the first iteration and hold the container from then on:
    changes made to it later are not seen (``close()`` restarts them at the next
    iteration). Needs the 'fork' start method (Linux). A worker that dies makes the
    consumer raise ``WorkerDied`` (a ``RuntimeError``) naming the process.

    ``options`` (``ProcessOptions``): ``worker_init(worker_id)``, when given, runs once in
    each worker after it is forked (ids 0 to count - 1); it is never pickled (workers are
    forked), so a closure will do. ``timeout``: the most seconds to wait for a step (None:
    no limit); past it the workers are stopped and the next iteration starts new ones.
    ``split_steps``: spread each step's rows over the workers (False: step k to worker k
    mod n, for a caller whose workers' own random state decides what they load). ``lend``:
    hand a whole step to the consumer as the slot itself, with no copy
    (``_Transport.lend``): the slot is reused only once every array of it is dropped.
    ``lean``: give a slot's pages back to the system when the consumer releases it (when
    it copied the step out, ``buffer=False``, or dropped the step lent to it), so that the
    ring holds memory only for the steps in flight, as a loader that makes a new shared
    buffer per batch does; a worker filling it again faults the pages back in, zeroed
    (some 4 µs a page on a virtual machine: 5% of a worker's time for 150 KB images).
    Where whole steps go to one worker, the worker takes its slot when it starts a job
    (``workers.SlotClaims``), and a released slot keeps its pages, as a spare that the
    next job takes first, while no more slots hold pages than a steady state uses at
    once: one being filled per worker and those lent to the consumer (the batch it works
    on, and the one before, which its loop holds while it asks for the next). Only a
    slot beyond those (a batch waiting for an earlier one, say) gives its pages back. On
    ``bench/torch_dropin.py``'s PIL dataset (2 workers, so 4 slots) that takes a third
    of the faults of keeping only the first slot's pages, at the same peak memory;
    keeping the pages of a fifth left almost no faults, but held a slot more than PyTorch's
    loader.
    """

    count: int
    options: ProcessOptions
    lean: bool
    gen: int  # the live iteration's generation
    # Set when the workers are forked (``ring``), None before and after ``stop``.
    pipes: Pipes | None
    slots: list[Dests] | None
    control: Any
    root: Any  # the container the workers hold
    key: Any  # the plan's signature and the ring's slots
    _finalizer: Any

    def __init__(
        self,
        count: int,
        options: ProcessOptions,
        lean: bool = False,
    ) -> None:
        if not isinstance(count, Integral) or count < 1:
            raise ValueError(
                f"the process backend needs a positive number of workers, got {count!r}"
            )
        if "fork" not in multiprocessing.get_all_start_methods():
            raise RuntimeError(
                "the process backend needs the 'fork' start method (Linux); "
                "use the thread backend on this platform"
            )
        self.count = int(count)
        self.options, self.lean = options, lean
        self.shared: _SharedRing | None = None  # the ring's memory, made by ``ring``
        self.gen = 0
        self.pipes = self.slots = self.control = None
        self.root = self.key = self._finalizer = None

    @property
    def procs(self) -> list[BaseProcess] | None:
        """The worker processes, None when none runs."""
        return None if self.pipes is None else self.pipes.procs

    def ring(self, data: Any, plan: Plan, count: int) -> list[Dests]:
        """The ring of ``count`` slots for ``plan``, with workers that hold ``data``:
        the running ones when they already hold both, else newly forked ones."""
        key = (plan.signature, count, self.splits(plan))
        if (
            self.pipes is not None
            and self.slots is not None
            and self.root is data
            and self.key == key
            and all(proc.is_alive() for proc in self.pipes.procs)
        ):
            return self.slots
        self.drain()
        self.stop(graceful=True)
        _, size = carve_ring(None, plan, count)
        mapping = mmap.mmap(-1, size)  # anonymous, shared with the forked children
        slots, _ = carve_ring(mapping, plan, count)
        # Whole steps: each job's worker takes its slot when it starts it (``SlotClaims``),
        # so that the slots in use keep their pages; parts of a step share the slot the
        # consumer chose, which goes back to the system after its step with ``lean``.
        claims = None
        if not self.splits(plan):
            words = np.frombuffer(mapping, np.int64, count, 8)
            claims = SlotClaims(words, multiprocessing.get_context("fork").Lock())
        # A new ring: what was lent of the old one stays the caller's (its arrays keep the
        # old mapping alive) and goes back to the old ``_SharedRing``, which nobody reads.
        limit = min(_LEND_LIMIT, count - 1) if self.options.lend else 0
        # With ``lean``, the slots that keep their pages when released: none where the
        # consumer chooses the slots, else as many as are in use at once in a steady state.
        keep = count
        if self.lean:
            keep = 0 if claims is None else min(count, self.count + max(1, limit))
        self.shared = _SharedRing(mapping, _slot_pages(plan, count), limit, keep, claims)
        control = np.frombuffer(mapping, np.int64, 1, 0)
        control[0] = 0
        self.pipes = fork_workers(
            self.count,
            worker_main,
            "fastload-worker",
            lambda k: (data, slots, control, k, self.options.worker_init, claims),
            "the iteration",
        )
        self._finalizer = weakref.finalize(self, self.pipes.close, False, os.getpid())
        self.root, self.key = data, key
        self.slots, self.control = slots, control
        return slots

    def splits(self, plan: Plan) -> bool:
        """Whether ``plan``'s steps are spread over the workers in parts (see the module
        docstring), rather than loaded whole by one."""
        return self.options.split_steps and self.count > 1 and not plan.whole_steps

    def give_back(self, slot: int) -> None:
        """Return the whole pages of ``slot`` to the system (see ``_SharedRing``)."""
        assert self.shared is not None, "no ring to give back"
        self.shared.give_back(slot)

    def stop(self, graceful: bool) -> None:
        if self.pipes is None:
            return
        self.control[0] = 0
        self._finalizer.detach()
        self.pipes.close(graceful)
        self.pipes = self.slots = self.control = self.root = None

    def close(self) -> None:
        """Stop the workers and release the ring. Idempotent; the next iteration starts
        new workers."""
        self.gen += 1
        self.stop(graceful=True)

    def receive(self, wait: float | None = _WAIT_S) -> list[tuple[int, JobReply]]:
        """Replies that arrived within one timed wait of ``wait`` seconds, as (worker,
        message); raises ``WorkerDied`` (the workers stopped) when a worker died."""
        assert self.pipes is not None, "no workers to hear from"
        try:
            return self.pipes.receive(wait)
        except WorkerDied:
            self.stop(graceful=False)
            raise

    def drain(self) -> None:
        """Cancel the live jobs and wait for their replies, so that no worker writes into
        the ring afterwards; stop the workers when that takes too long or fails."""
        if self.pipes is None:
            return
        self.control[0] = 0
        deadline = time.monotonic() + _STOP_S
        try:
            while any(self.pipes.outstanding):
                if time.monotonic() > deadline:
                    self.stop(graceful=False)
                    return
                self.receive()
        except BaseException:
            self.stop(graceful=False)
            raise

    def send(self, worker: int, message: Epoch | Job) -> None:
        """Send ``message`` to ``worker`` (a ``Job``: one reply due); raises
        ``WorkerDied`` (the workers stopped) when the worker died."""
        assert self.pipes is not None, "no workers to send to"
        try:
            if isinstance(message, Job):
                self.pipes.request(worker, message)
            else:
                self.pipes.send(worker, message)
        except WorkerDied:
            self.stop(graceful=False)
            raise

    def begin(
        self, schedule: Schedule, plan: Plan, ordered: bool, skip: bool, stats: Any
    ) -> _Transport:
        """Start an iteration over ``schedule`` on the workers (after ``ring``); any
        earlier iteration of this pool stops. Returns its transport."""
        self.drain()
        if self.pipes is None:  # drain stopped workers that would not give up their jobs
            raise RuntimeError(
                f"the worker processes did not stop their earlier jobs within {_STOP_S:.0f} s "
                f"and were stopped; iterate again to start new ones"
            )
        self.gen += 1
        self.control[0] = self.gen
        # A callable collate runs in the consumer (in plan.assemble): workers collect lists.
        theirs = schedule.replaced(collate=schedule.collate.in_workers(), start=0)
        for worker in range(self.count):
            self.send(worker, Epoch(self.gen, theirs, skip, plan.signature))
        return _Transport(self, self.gen, schedule, plan, ordered, stats)


def _slot_pages(plan: Plan, count: int) -> list[tuple[int, int]]:
    """(start, length) of the whole pages inside each slot of the ring ``carve_ring``
    lays out: slots are the same size and follow one another after the header."""
    header = ring_header(count)
    size = (carve_ring(None, plan, count)[1] - header) // max(1, count)
    spans = []
    for slot in range(count):
        start = -(-(header + slot * size) // mmap.PAGESIZE) * mmap.PAGESIZE
        end = (header + (slot + 1) * size) // mmap.PAGESIZE * mmap.PAGESIZE
        spans.append((start, max(0, end - start)))
    return spans


class _Transport:
    """The steps of one iteration on a ``WorkerPool``: submits steps into free slots,
    ``prefetch`` (the ring's slots) at most in flight, each as one job or one job per part
    (see the module docstring), and hands over finished ones."""

    def __init__(
        self,
        pool: WorkerPool,
        gen: int,
        schedule: Schedule,
        plan: Plan,
        ordered: bool,
        stats: Any,
    ) -> None:
        self.pool, self.gen, self.plan = pool, gen, plan
        self.schedule, self.ordered, self.stats = schedule, ordered, stats
        self.split_steps = pool.splits(plan)
        assert pool.shared is not None and pool.slots is not None, "an iteration begins on a ring"
        self.shared = pool.shared
        self.shared.returned()  # settle the lent slots: those still lent stay out
        lent = self.shared.lent
        self.free = collections.deque(s for s in range(len(pool.slots)) if s not in lent)
        # With claims, ``free`` only counts the free slots (spares included): a job's worker
        # takes one (no job is out now: ``begin`` drained them).
        self.claims = self.shared.claims
        if self.claims is not None:
            self.claims.reset(lent)
        self.inflight: dict[int, int] = {}  # step -> slot (-1: its worker's choice)
        self.parts: dict[int, list[JobReply | None]] = {}  # step -> [reply or None, a part]
        # step -> the replies of all its parts, not yet delivered
        self.arrived: dict[int, list[JobReply]] = {}
        self.next_step = self.expected = schedule.start
        self.total = schedule.steps

    def next(self, release: int) -> Reply | None:
        """The ``Reply`` of the next step, None at the end."""
        if release >= 0:
            if self.claims is not None:
                self.shared.release(release)
            self.free.append(release)
        self._check()
        # A lent slot's lease freed its word as it was dropped: a worker may hold it
        # already, so it is only counted here.
        self.free.extend(self.shared.returned())
        while self.next_step < self.total and self.free:
            self._submit(self.next_step, self.free.popleft())
            self.next_step += 1
        if not self.inflight:
            return None
        step = self._wait()
        replies = self.arrived.pop(step)
        slot = self.inflight.pop(step)
        self.expected += 1
        unpacked = self._unpack(step, replies)
        if slot < 0:  # the worker's choice (a Done or an ItemFailed: others raised)
            slot = cast(Done | ItemFailed, replies[0]).slot
        return Reply(slot, step, *unpacked)

    def _submit(self, step: int, slot: int) -> None:
        pool = self.pool
        if self.claims is not None:
            slot = -1  # its worker takes a slot when it starts (``SlotClaims.take``)
        jobs = [(step % pool.count, Job(self.gen, step, slot))]
        if self.split_steps:
            rows = len(self.schedule.positions(step))
            k = min(pool.count, rows)
            cuts = [p * rows // k for p in range(k + 1)]
            jobs = [(p, Job(self.gen, step, slot, p, cuts[p], cuts[p + 1])) for p in range(k)]
        for worker, job in jobs:
            pool.send(worker, job)
        self.inflight[step] = slot
        self.parts[step] = [None] * len(jobs)

    def lend(self, slot: int, value: Any) -> Any:
        """``value``, the whole step held in ``slot``, as arrays over the slot itself, with
        no copy; the slot stays out of the ring until the consumer drops every one of them
        (and every view of them). None when the pool does not lend, or has lent its limit:
        the consumer copies the step then."""
        lease = self.shared.lend(slot)
        return None if lease is None else map_tree(lambda leaf: _lent(leaf, lease), value)

    def copied(self, slot: int) -> None:
        """The consumer copied the step out of ``slot`` (``buffer=False``): its memory can go
        back to the system now, while the consumer works on the copy, rather than stay
        until the slot is released at the next step (where workers take the slots, the
        release decides: ``_SharedRing.release``)."""
        if self.claims is None and not self.shared.keep:
            self.pool.give_back(slot)

    def _check(self) -> None:
        if self.pool.gen != self.gen:
            raise RuntimeError(
                "this iteration was stopped: a newer iteration of the same "
                "engine started, or the engine was closed"
            )

    def _wait(self) -> int:
        """The step to deliver next, once the replies of all its parts arrived;
        ``TimeoutError`` when none came within the pool's ``timeout``: the workers, which
        hold on to their jobs (stuck in an item, say), are stopped then, at once."""
        timeout = self.pool.options.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._check()
            if self.ordered and self.expected in self.arrived:
                return self.expected
            if not self.ordered and self.arrived:
                return next(iter(self.arrived))
            wait = _WAIT_S
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    self.pool.stop(graceful=False)  # not _STOP_S to give their jobs up
                    raise TimeoutError(f"no step came from the worker processes in {timeout} s")
            for _, reply in self.pool.receive(wait):
                parts = self.parts.get(reply.step) if reply.gen == self.gen else None
                if parts is None:
                    continue
                parts[reply.part] = reply
                if all(part is not None for part in parts):
                    self.arrived[reply.step] = cast(list[JobReply], self.parts.pop(reply.step))

    def _unpack(
        self, step: int, replies: list[JobReply]
    ) -> tuple[int, Failure | None, npt.NDArray[np.bool_] | None, Objects | None]:
        """``(rows, failure, keep, objects)`` of a step from the replies of its parts, in
        order: the first part that failed decides (the first failing position, as the
        thread backend reports it where it can tell); raises what a worker could not do."""
        for reply in replies:
            if isinstance(reply, ItemFailed):
                cause = None if reply.text is None else remote_error(reply.text, reply.chain)
                return 0, Failure(step, reply.field, reply.index, reply.message, cause), None, None
            if isinstance(reply, WorkerFailed):
                cause = remote_error(reply.text, reply.chain)
                raise RuntimeError(f"a worker could not {reply.what}: {reply.message}") from cause
            if isinstance(reply, InitFailed):
                remote = InitError(reply.text, reply.worker, reply.name)
                raise remote_error(reply.text, reply.chain, remote)  # as worker_init raised it
            if isinstance(reply, Cancelled):
                raise RuntimeError(f"step {step} was cancelled")
        done = cast(list[Done], replies)  # every other reply returned or raised above
        self.stats.skipped += sum(reply.skipped for reply in done)
        if len(done) == 1:
            return done[0].rows, None, done[0].keep, done[0].objects
        return sum(reply.rows for reply in done), None, _keep(done), _objects(done)

    def close(self) -> None:
        if self.pool.gen == self.gen:
            self.pool.drain()


class _SharedRing:
    """The memory of one ring: its anonymous shared ``mapping``, the whole pages of each
    slot (``spans``, which ``give_back`` returns to the system), and what is lent of it.
    ``lent`` maps each slot lent to the consumer to its lease's token, ``limit`` slots at
    most; a lease ``release``s its slot when it is dropped (in any thread), then puts
    ``(slot, token)`` on ``returns`` (a deque append). ``keep``: where the consumer
    chooses the slots (no ``claims``), 0 gives a released slot's pages back, anything
    else keeps them; where workers take them, a released slot keeps its pages (a spare)
    while no more than ``keep`` slots hold pages, counting it. Only the consumer
    (``lend``, ``returned``) changes ``lent``. A return counts only while its token is
    the slot's: a lease that outlives its turn (kept by a traceback, say) can never free
    the slot of a later one."""

    def __init__(
        self,
        mapping: mmap.mmap,
        spans: list[tuple[int, int]],
        limit: int,
        keep: int,
        claims: SlotClaims | None = None,
    ) -> None:
        self.mapping, self.spans, self.claims = mapping, spans, claims
        self.limit, self.keep = limit, keep
        self.lent: dict[int, int] = {}  # slot -> its lease's token
        self.returns: collections.deque[tuple[int, int]] = collections.deque()
        self.tokens = itertools.count()
        self.pid = os.getpid()

    def lend(self, slot: int) -> _Lease | None:
        """A lease on ``slot``, or None when ``limit`` slots are lent already."""
        if len(self.lent) >= self.limit:
            return None
        lease = _Lease(self, slot, next(self.tokens))
        self.lent[slot] = lease.token
        return lease

    def returned(self) -> list[int]:
        """The lent slots whose batches were dropped since the last call: free again."""
        slots = []
        while self.returns:
            slot, token = self.returns.popleft()
            if self.lent.get(slot) == token:
                del self.lent[slot]
                slots.append(slot)
        return slots

    def release(self, slot: int) -> None:
        """Slot ``slot``, which nobody else touches now, is free again (see ``keep``). The
        count of slots holding pages is read while workers take slots: it may be one off,
        which can only keep one spare more or fewer."""
        claims = self.claims
        if claims is None:
            if not self.keep:
                self.give_back(slot)
        elif claims.holding() > self.keep:
            self.give_back(slot)
            claims.give(slot)
        else:
            claims.spare(slot)  # a worker may take it before ``returned``

    def give_back(self, slot: int) -> None:
        """Return the whole pages of ``slot`` to the system (the next write maps zeroed
        ones): an anonymous shared mapping is shmem, which ``MADV_REMOVE`` frees."""
        start, length = self.spans[slot]
        if length:
            self.mapping.madvise(mmap.MADV_REMOVE, start, length)


class _Lease:
    """A slot lent to the consumer, until the last array over it is dropped. Then the slot
    is released at once (``_SharedRing.release``: with ``lean``, its pages may go back to
    the system while the caller works on its next batch, not at its next ``next()``), and
    goes on ``returns``.
    Only in the process that lent it, and only while the slot is still this lease's: a
    forked child's copy of a lease never touches the shared pages."""

    __slots__ = ("ring", "slot", "token")
    _getpid = staticmethod(os.getpid)  # here: a lease may be dropped as Python exits

    def __init__(self, ring: _SharedRing, slot: int, token: int) -> None:
        self.ring, self.slot, self.token = ring, slot, token

    def __del__(self) -> None:
        ring = self.ring
        try:
            if ring.lent.get(self.slot) == self.token and self._getpid() == ring.pid:
                ring.release(self.slot)
        except Exception:  # at exit, say: only memory is at stake (the pages stay mapped)
            pass
        finally:
            ring.returns.append((self.slot, self.token))


class _LentArray:
    """A lent array's ``base``: numpy's view of ``array``'s memory (its
    ``__array_interface__``), keeping ``array`` (and with it the ring's mapping) and the
    slot's lease alive."""

    __slots__ = ("__array_interface__", "array", "lease")

    def __init__(self, array: np.ndarray, lease: _Lease) -> None:
        self.__array_interface__ = array.__array_interface__
        self.array, self.lease = array, lease


def _lent(leaf: Any, lease: _Lease) -> Any:
    if not isinstance(leaf, np.ndarray):
        return leaf
    array = np.asarray(_LentArray(leaf, lease))
    # The interface spells a padded structured dtype with filler fields: view it as it was.
    return array if array.dtype == leaf.dtype else array.view(leaf.dtype)


def _keep(replies: Sequence[Done]) -> npt.NDArray[np.bool_] | None:
    """The kept flags of a step's rows from those of its parts (None: all kept)."""
    if all(reply.keep is None for reply in replies):
        return None
    return np.concatenate(
        [np.ones(reply.rows, bool) if reply.keep is None else reply.keep for reply in replies]
    )


def _objects(replies: Sequence[Done]) -> Objects | None:
    """The object lists of a step from those of its parts, by position (None: it has
    none)."""
    if replies[0].objects is None:
        return None
    return [
        None if lists[0] is None else [obj for part in lists for obj in part]
        for lists in zip(*(reply.objects for reply in replies))
    ]
