"""The worker side of the process transport (``processes.py``): what a forked worker runs,
and the messages between it and the consumer (the loop, the stop message, the generation
tag and the errors' travel are ``children.py``'s).

A worker holds the container it inherited at the fork (the root) and the ring. Per epoch
(``Epoch``) it builds the same plan as the consumer; per job (``Job``: a step and a slot)
it runs that step, or the part of its rows the job names, as an inline native run over
the slot, the run the sequential loader runs in its own thread
(``_core.Iteration.start_run`` with ``parallel=0``; a part: a run over the part's
positions alone, writing into views of the slot's rows, so any row range of a slot can
be filled by any worker, each draw being keyed by the observation's index): gathers and
native image leaves in C, Python leaves through the plan's fill, failures, skips and
cancellation (the ring's generation word) in the engine's code. It replies with what does
not fit in the slot (``Done``) or what failed. An inline run starts no pool thread, so a
worker forked while the consumer's pool runs never uses the pool's copy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Container
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from .. import _core
from .._base.children import Tagged, WorkerError, describe_error, serve
from .._base.tree import fed_under, map_tree
from ..context import loading
from .plan import make_plan
from .schedule import Schedule
from .seams import Dests, Failure, Objects, Plan

__all__ = [
    "Cancelled",
    "Done",
    "Epoch",
    "InitError",
    "InitFailed",
    "ItemFailed",
    "Job",
    "JobReply",
    "SlotClaims",
    "WorkerFailed",
    "carve_ring",
    "ring_header",
    "worker_main",
]

_ALIGN = 64


# Requests, from the consumer to a worker (``children.Stop`` ends it). Every message
# carries the generation of its iteration (``children.Tagged``).


@dataclass(frozen=True, slots=True)
class Epoch(Tagged):
    """The iteration of generation ``gen`` loads ``schedule`` (its collate None, True or
    False: a callable one runs in the consumer); ``signature``: the consumer's plan's."""

    schedule: Schedule
    skip: bool
    signature: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Job(Tagged):
    """Load step ``step`` of generation ``gen`` into slot ``slot`` of the ring (-1: the
    one the worker takes when it starts the job, ``SlotClaims.take``): its
    rows ``[first, end)`` as part ``part`` (the whole step when ``end`` is None)."""

    step: int
    slot: int
    part: int = 0
    first: int = 0
    end: int | None = None


# Replies, one per Job, naming its step and part.


@dataclass(frozen=True, slots=True)
class Done(Tagged):
    """The step is in slot ``slot``: ``rows`` observations, ``keep`` their kept flags
    after skips (None: all kept), ``objects`` the lists of its object leaves (None: it
    has none), ``skipped`` observations the plan itself dropped (a whole step's
    retries)."""

    step: int
    part: int
    slot: int
    rows: int
    keep: npt.NDArray[np.bool_] | None
    objects: Objects | None
    skipped: int


@dataclass(frozen=True, slots=True)
class ItemFailed(Tagged):
    """Observation ``index`` failed in ``field`` (None: unknown), loading into slot
    ``slot``; ``message`` as the thread backend words it; ``text`` and ``chain``
    (``describe_error``) the Python exception's traceback and pickled causes, None when
    native code failed."""

    step: int
    part: int
    slot: int
    field: int | None
    index: int
    message: str
    text: str | None
    chain: list[bytes | None] | None


@dataclass(frozen=True, slots=True)
class WorkerFailed(Tagged):
    """The worker could not ``what`` (planning the epoch, running the step)."""

    step: int
    part: int
    what: str
    message: str
    text: str
    chain: list[bytes | None]


@dataclass(frozen=True, slots=True)
class InitFailed(Tagged):
    """``init(worker)`` raised an exception of type ``name``: every job of the worker
    fails with it."""

    step: int
    part: int
    worker: int
    name: str
    text: str
    chain: list[bytes | None]


@dataclass(frozen=True, slots=True)
class Cancelled(Tagged):
    """The job's generation is no longer live: its slot holds nothing."""

    step: int
    part: int


# The reply to a job: one of the above.
JobReply: TypeAlias = Done | ItemFailed | WorkerFailed | InitFailed | Cancelled


class InitError(WorkerError):
    """The traceback text of an exception of type ``name`` raised by ``init(worker)`` in
    worker process ``worker``."""

    def __init__(self, text: str, worker: int, name: str) -> None:
        super().__init__(text)
        self.worker, self.name = worker, name

    def __reduce__(self) -> tuple[type[InitError], tuple[str, int, str]]:
        return type(self), (self.args[0], self.worker, self.name)


def ring_header(slots: int) -> int:
    """Bytes before the first slot of a ring of ``slots``: the generation word, then one
    claim word per slot (``SlotClaims``)."""
    return -(-(1 + slots) * 8 // _ALIGN) * _ALIGN


def carve_ring(mapping: Any, plan: Plan, slots: int) -> tuple[list[Dests], int]:
    """The ring: ``slots`` sets of destinations of ``plan``, laid out in ``mapping`` after
    the header (with ``mapping=None``: only the bytes needed)."""
    offset = ring_header(slots)

    def allocate(shape: tuple[int, ...], dtype: npt.DTypeLike) -> np.ndarray | None:
        nonlocal offset
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        start = offset
        offset += -(-count * dtype.itemsize // _ALIGN) * _ALIGN
        if mapping is None:
            return None
        return np.frombuffer(mapping, dtype, count, start).reshape(shape)

    ring = [plan.allocate(allocate) for _ in range(slots)]
    return ring, offset


_FREE, _USED, _SPARE = 0, 1, 2  # a SlotClaims word: free, in use, free with its pages


class SlotClaims:
    """Which slots of the ring are in use, for jobs whose worker takes the slot when it
    starts them (``Job.slot`` -1): one word per slot in the ring's header, ``_FREE`` when
    the slot is free, ``_USED`` in use, ``_SPARE`` free with its pages kept. A worker
    takes a spare when there is one, else the lowest free slot (under ``lock``, which
    only workers hold), and gives it back when the job ends without a step in it; the
    consumer frees a slot, or makes it a spare, once the caller is done with its step
    (``_SharedRing.release``), and sends no more such jobs than there are free slots, so
    a worker always finds one.

    Taking a slot when the work starts, rather than when the job is queued, keeps a
    ring's slots in use, and so the pages ever written, only as many as steps were being
    filled or held at once: slots that wait in a worker's queue hold nothing. Taking a
    spare first writes a step into pages already there (a page written anew costs a
    fault and a zeroing, some 4 µs)."""

    def __init__(self, words: npt.NDArray[np.int64], lock: Any) -> None:
        self.words, self.lock = words, lock

    def take(self) -> int:
        """A spare slot, else the lowest free one, now in use (in a worker)."""
        with self.lock:
            spares = np.flatnonzero(self.words == _SPARE)
            free = spares if spares.size else np.flatnonzero(self.words == _FREE)
            if not free.size:
                raise RuntimeError("no free slot in the ring for a job (a consumer's miscount)")
            slot = int(free[0])
            self.words[slot] = _USED
        return slot

    def give(self, slot: int) -> None:
        """Slot ``slot`` is free again."""
        self.words[slot] = _FREE

    def spare(self, slot: int) -> None:
        """Slot ``slot`` is free again, with its pages: the next job takes it first."""
        self.words[slot] = _SPARE

    def holding(self) -> int:
        """The slots in use or spare: those that hold pages."""
        return int(np.count_nonzero(self.words))

    def reset(self, lent: Container[int]) -> None:
        """Every slot free but those ``lent`` to the caller (in the consumer, while no job
        is out), whose words their leases clear when they are dropped, and the spares."""
        for slot in range(len(self.words)):
            if slot not in lent and self.words[slot] != _SPARE:
                self.words[slot] = _FREE


class _Worker:
    """One worker process: epochs and jobs in, replies out (``answer``)."""

    def __init__(
        self,
        root: Any,
        ring: list[Dests],
        control: npt.NDArray[np.int64],
        claims: SlotClaims | None = None,
    ) -> None:
        self.root = root
        self.sources = fed_under(root)  # what brings the rows in (a dataset at a URL)
        self.ring = ring
        self.control = control
        self.claims = claims
        self.epoch: Epoch | None = None
        self.plan: Any = None
        self.fields: Any = None  # the plan's _core.Fields, its order and bounds, per epoch
        self.order: Any = None
        self.bounds: Any = None
        self.setup_error: Exception | None = None
        self.init_error: Exception | None = None  # what ``init`` raised: every job fails
        self.worker_id = 0
        self.stats = _core.Stats()

    def start(self, worker_id: int, init: Callable[[int], None] | None) -> None:
        """Run ``init(worker_id)`` once, before any job; what it raises is kept for the
        replies, so that the consumer raises it."""
        self.worker_id = worker_id
        if init is None:
            return
        try:
            init(worker_id)
        except Exception as exc:
            self.init_error = exc

    def answer(self, message: Epoch | Job) -> JobReply | None:
        """The reply to ``message`` (``children.serve`` sends it): one per job, none to an
        epoch."""
        if isinstance(message, Epoch):
            self._begin(message)
            return None
        return self._reply(message)

    def _begin(self, epoch: Epoch) -> None:
        self.epoch = epoch
        self.plan = self.fields = self.setup_error = None
        self.stats = _core.Stats()
        try:
            plan = make_plan(self.root, epoch.schedule, skip=epoch.skip, stats=self.stats)
            if plan.signature != epoch.signature:
                raise RuntimeError(
                    f"the worker planned {plan.signature}, the consumer "
                    f"{epoch.signature}: the container changed after the fork"
                )
            self.fields = _core.Fields(plan.fields, plan.row_bytes)
            self.order = plan.order(epoch.schedule)
            # A whole-step plan loads step s as its item s, as in the consumer's engine.
            self.bounds = None if plan.whole_steps else epoch.schedule.bounds
            self.plan = plan
        except Exception as exc:
            self.setup_error = exc

    def _reply(self, job: Job) -> JobReply:
        epoch = self.epoch
        if epoch is None or job.gen != epoch.gen or self.control[0] != job.gen:
            return Cancelled(job.gen, job.step, job.part)
        if self.init_error is not None:
            error = self.init_error
            _, text, chain = describe_error(error)
            name = type(error).__name__
            return InitFailed(job.gen, job.step, job.part, self.worker_id, name, text, chain)
        if self.setup_error is not None:
            return _worker_failed(job, "plan the steps", self.setup_error)
        if job.slot >= 0:
            return self._attempt(job, epoch, job.slot)
        assert self.claims is not None, "a job without a slot on a ring without claims"
        try:
            slot = self.claims.take()
        except RuntimeError as exc:
            return _worker_failed(job, "take a slot of the ring", exc)
        reply = self._attempt(job, epoch, slot)
        if not isinstance(reply, (Done, ItemFailed)):
            self.claims.give(slot)  # nothing in it for the consumer
        return reply

    def _attempt(self, job: Job, epoch: Epoch, slot: int) -> JobReply:
        try:
            return self._load(job, epoch, slot)
        except Exception as exc:
            if self.control[0] != job.gen:  # the run stopped for the new generation
                return Cancelled(job.gen, job.step, job.part)
            return _worker_failed(job, f"load step {job.step}", exc)

    def _load(self, job: Job, epoch: Epoch, slot: int) -> Done | ItemFailed:
        """Step ``job.step`` (or its rows ``[job.first, job.end)``) loaded by an inline
        native run into slot ``slot``."""
        plan, schedule = self.plan, epoch.schedule
        dests = self.ring[slot]
        if job.end is None:
            order, bounds, first_step, rows = self.order, self.bounds, job.step, plan.rows
        else:
            # A run of one step over the part's positions, into views of the part's rows.
            positions = schedule.positions(job.step)[job.first : job.end]
            order, bounds, first_step = np.ascontiguousarray(positions), None, 0
            rows = job.end - job.first
            dests = [_rows(dest, job.first, job.end) for dest in dests]
        objects = [None if obj is None else [None] * rows for obj in plan.new_objects()]
        skipped_before = self.stats.skipped
        run = _core.Iteration(
            plan,
            ring=[dests],
            values=[None],
            objects=[objects],
            rows=rows,
            buffer=False,
            stats=_core.Stats(),
            progress=_core.Progress(),
        )
        run.start_run(
            self.fields,
            order=order,
            bounds=bounds,
            first_step=first_step,
            end_step=first_step + 1,
            seed=schedule.seed,
            epoch=schedule.epoch,
            parallel=0,  # inline, in this thread (no pool thread in a forked worker)
            claim_size=rows,  # inline, a claim is the whole step
            ordered=True,
            skip_errors=epoch.skip,
            release_gil=plan.expensive,
            filler=_filler(plan, dests, objects, schedule) if plan.has_python else None,
        )
        run.watch(self.control, job.gen)
        with contextlib.ExitStack() as held:
            if not plan.whole_steps:  # fed data (at a URL: the part's blocks, held), first
                positions = schedule.positions(job.step)[job.first : job.end]
                for source in self.sources:
                    held.enter_context(source.holding(positions))
                    source.ensure(positions)
            loaded = run.load_next()
        if loaded is None:
            raise RuntimeError(f"step {job.step} is past the end of the schedule")
        if loaded.failure is not None:
            return _item_failed(job, slot, loaded.failure)
        objects = objects if plan.has_objects else None
        skipped = self.stats.skipped - skipped_before
        return Done(job.gen, job.step, job.part, slot, loaded.rows, loaded.keep, objects, skipped)


def _rows(dest: Any, first: int, end: int) -> Any:
    """Rows ``[first, end)`` of a slot's destination (an array or a structure of them;
    None for a leaf collected into lists), as views."""
    return None if dest is None else map_tree(lambda array: array[first:end], dest)


def _filler(
    plan: Plan, dests: Dests, objects: Objects, schedule: Schedule
) -> Callable[[int, int, int, int], None]:
    """The callback of the run's Python leaves, as the consumer's engine makes it."""
    seed, epoch = schedule.seed, schedule.epoch

    def filler(slot: int, field: int, pos: int, index: int) -> None:
        with loading(seed, epoch):
            plan.fill(dests, objects, field, pos, index)

    return filler


def _item_failed(job: Job, slot: int, failure: Failure) -> ItemFailed:
    cause = failure.cause
    text, chain = describe_error(cause)[1:] if cause is not None else (None, None)
    return ItemFailed(
        job.gen,
        job.step,
        job.part,
        slot,
        failure.field,
        int(failure.observation),
        failure.message,
        text,
        chain,
    )


def _worker_failed(job: Job, what: str, exc: BaseException) -> WorkerFailed:
    return WorkerFailed(job.gen, job.step, job.part, what, *describe_error(exc))


def worker_main(
    conn: Connection,
    root: Any,
    ring: list[Dests],
    control: npt.NDArray[np.int64],
    worker_id: int = 0,
    init: Callable[[int], None] | None = None,
    claims: SlotClaims | None = None,
) -> None:
    """A worker's life (forked by ``children.fork_workers``): ``init(worker_id)`` once
    (when given), then jobs until told to stop or the consumer is gone. ``claims``: the
    ring's, where jobs come without a slot."""
    worker = _Worker(root, ring, control, claims)
    worker.start(worker_id, init)
    serve(conn, worker.answer)
