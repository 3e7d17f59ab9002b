"""The worker side of the process transport (``processes.py``): what a forked worker runs.

A worker holds the container it inherited at the fork (the root) and the ring. Per epoch
it gets the schedule's fields and builds the same plan as the consumer; per job it fills
a slot of the ring in place and replies with what does not fit there.
"""

import os
import pickle
import signal
import traceback
from typing import Any

import numpy as np

from . import _core
from .context import loading
from .obs import getobs_into
from .plan import make_plan
from .schedule import Schedule
from .tree import LeafKind

__all__ = ["WorkerError", "carve_ring", "describe_error", "worker_main"]

_PARENT_CHECK_S = 1.0  # how often an idle worker checks that the consumer is alive
_ALIGN = 64
_HEADER = _ALIGN  # the generation word, then the slots


class WorkerError(Exception):
    """The traceback text of an exception raised in a worker process."""


def carve_ring(mapping, plan, slots):
    """The ring: ``slots`` sets of destinations of ``plan``, laid out in ``mapping`` after
    the header (with ``mapping=None``: only the bytes needed)."""
    offset = _HEADER

    def allocate(shape, dtype):
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


_CHAIN = 8  # most exceptions of a __cause__ chain sent to the consumer


def describe_error(exc):
    """(message, traceback text, pickled exceptions) of ``exc``, for the consumer: the
    exception and its ``__cause__`` chain, each pickled on its own (None where it does not
    pickle), since pickling an exception drops its cause."""
    message = f"{type(exc).__name__}: {exc}"
    text = "".join(traceback.format_exception(exc))
    chain: list[bytes | None] = []
    while exc is not None and len(chain) < _CHAIN:
        try:
            chain.append(pickle.dumps(exc))
        except Exception:
            chain.append(None)
        exc = exc.__cause__
    return message, text, chain


class _Worker:
    """The loop of one worker process: epochs and jobs in, replies out."""

    def __init__(self, conn, root, ring, control):
        self.conn = conn
        self.root = root
        self.ring = ring
        self.control = control
        self.skip = False
        self.gen = None
        self.plan: Any = None
        self.setup_error = None
        self.init_error = None  # what ``init`` raised: every job fails with it

    def start(self, worker_id, init):
        """Run ``init(worker_id)`` once, before any job; what it raises is kept for the
        replies, so that the consumer raises it."""
        if init is None:
            return
        try:
            init(worker_id)
        except Exception as exc:
            self.init_error = exc

    def serve(self):
        parent = os.getppid()
        while True:
            if not self.conn.poll(_PARENT_CHECK_S):
                if os.getppid() != parent:
                    return  # the consumer died
                continue
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                return
            if message[0] == "stop":
                return
            if message[0] == "epoch":
                self._epoch(*message[1:])
                continue
            reply = self._job(*message[1:])
            try:
                self.conn.send(reply)
            except (BrokenPipeError, ConnectionResetError):
                return  # the consumer is gone: nobody wants the reply

    def _epoch(
        self, gen, seed, epoch, order, batch_size, drop_last, collate, skip, signature, bounds
    ):
        self.gen, self.seed, self.epoch, self.skip = gen, seed, epoch, skip
        self.plan = self.setup_error = None
        self.stats = _core.Stats()
        try:
            schedule = Schedule(
                order,
                batch_size,
                drop_last=drop_last,
                collate=collate,
                seed=seed,
                epoch=epoch,
                bounds=bounds,
            )
            self.schedule = schedule
            plan = make_plan(self.root, schedule, skip=skip, stats=self.stats)
            if plan.signature != signature:
                raise RuntimeError(
                    f"the worker planned {plan.signature}, the consumer "
                    f"{signature}: the container changed after the fork"
                )
            self.plan = plan
        except Exception as exc:
            self.setup_error = exc

    def _job(self, gen, step, slot):
        if gen != self.gen or self.control[0] != gen:
            return ("cancelled", gen, step)
        if self.init_error is not None:
            return ("init-error", gen, step) + describe_error(self.init_error)
        if self.setup_error is not None:
            return ("error", gen, step, None, None, None) + describe_error(self.setup_error)
        plan = self.plan
        idx = np.asarray([step]) if plan.whole_steps else self.schedule.positions(step)
        dests = self.ring[slot]
        objects = plan.new_objects()
        failed = np.zeros(len(idx), bool)
        first = None
        skipped_before = self.stats.skipped
        with loading(self.seed, self.epoch):
            for field, (kind, _) in enumerate(plan.fields):
                if kind is LeafKind.GATHER:
                    getobs_into(dests[field][: len(idx)], plan.leaves[field].container, idx)
                    continue
                for pos, index in enumerate(idx.tolist()):
                    if self.control[0] != gen:
                        return ("cancelled", gen, step)
                    if failed[pos]:
                        continue
                    try:
                        if kind is LeafKind.IMAGE:
                            getobs_into(dests[field][pos], plan.leaves[field].container, index)
                        else:
                            plan.fill(dests, objects, field, pos, index)
                    except Exception as exc:
                        if not self.skip or plan.whole_steps:
                            return ("error", gen, step, pos, field, index) + describe_error(exc)
                        failed[pos] = True
                        first = first or exc
        keep = ~failed if first is not None else None
        return ("done", gen, step, len(idx), objects, keep, self.stats.skipped - skipped_before)


def worker_main(conn, root, ring, control, others, worker_id=0, init=None):
    """A worker's life: ``init(worker_id)`` once (when given), then jobs until told to
    stop or the consumer is gone."""
    # Ctrl-C in a terminal reaches the whole process group: the consumer handles it and
    # stops the workers; a worker killed by it would only turn it into a second error.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for other in others:
        other.close()  # so that a worker sees EOF when the consumer's end closes
    worker = _Worker(conn, root, ring, control)
    worker.start(worker_id, init)
    worker.serve()
