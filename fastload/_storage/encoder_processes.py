"""Encoding rows for the writer in forked worker processes (``backend="process"``), for
containers whose Python code holds the GIL.

The workers hold the container (inherited at the fork, never pickled, as with the
loader's process backend). A worker encodes a job's rows (``encoders.encode_rows``),
writes their bytes into a slot of one anonymous shared mapping made before the fork and
replies with their lengths: the bytes cross to the writer once, from the mapping into
the file. A slab larger than its slot travels in the reply instead.

::

    writer thread                       worker k (forked)
      ("job", first, stop, slot) ---->    encode rows [first, stop) -> slot bytes
      <---- ("done", first, stop, lengths, numbers, skipped)  or  ("error", first, ...)
      yield Slab (views of the slot); the slot is free again when the next is asked for

Concurrency invariants (kept by the writer's thread): a slot is free, or holds the job of
one worker, or holds the slab handed out last (reused only once the consumer asks for the
next one); slabs are handed out in row order; every job gets one reply; every wait is a
timed wait on the pipes and the workers' sentinels, so a worker that dies raises at once.
The workers are forked, served, stopped and their errors carried back by the loader's
process toolkit (``fastload._base.children``).
"""

import collections
import mmap
import multiprocessing

import numpy as np

from fastload._base.children import describe_error, fork_workers, remote_error, serve
from fastload._storage.encoders import (
    ByteValues,
    Slab,
    as_bytes,
    column_values,
    encode_rows,
    is_byte_kind,
)

__all__ = ["SLOT_BYTES", "process_slabs"]

SLOT_BYTES = 8 << 20  # a worker's slot; jobs aim at half of it
_WAIT_S = 0.5  # one timed wait on the pipes and sentinels


def process_slabs(data, n, encodings, kinds, count, skip, slab_rows):
    """The slabs of rows [0, n) in order, encoded by ``count`` forked worker processes,
    3 jobs per worker at most in flight. Raises the first failed row's ``LoadError`` (its
    cause and the worker's traceback chained) unless ``skip``, and ``RuntimeError`` when a
    worker dies or fork is not available."""
    if "fork" not in multiprocessing.get_all_start_methods():
        raise RuntimeError(
            "backend='process' needs the 'fork' start method (Linux); use "
            "backend='thread' on this platform"
        )
    nslots = 3 * count
    mapping = mmap.mmap(-1, nslots * SLOT_BYTES)  # anonymous, shared with the children
    pipes = fork_workers(
        count,
        _worker_main,
        "fastload-write",
        lambda k: (data, encodings, kinds, skip, mapping),
        "the write",
    )
    try:
        yield from _Jobs(pipes, mapping, nslots).slabs(n, slab_rows)
    finally:
        pipes.close(graceful=True)


class _Jobs:
    """The writer's side of the workers (``children.Pipes``): jobs out, slabs back in row
    order."""

    def __init__(self, pipes, mapping, nslots):
        self.pipes = pipes
        self.view = memoryview(mapping)
        self.free = collections.deque(range(nslots))
        self.arrived = {}  # first row -> reply
        self.slot_of = {}  # first row -> slot

    def slabs(self, n, slab_rows):
        next_row = expected = 0
        while expected < n:
            while self.free and next_row < n:
                stop = min(n, next_row + slab_rows)
                outstanding = self.pipes.outstanding
                worker = min(range(len(outstanding)), key=outstanding.__getitem__)
                slot = self.free.popleft()
                self.pipes.request(worker, ("job", next_row, stop, slot))
                self.slot_of[next_row] = slot
                next_row = stop
            while expected not in self.arrived:
                for _, reply in self.pipes.receive(_WAIT_S):
                    self.arrived[reply[1]] = reply
            reply = self.arrived.pop(expected)
            slot = self.slot_of.pop(expected)
            slab = self._slab(reply, slot)
            yield slab
            del slab
            self.free.append(slot)
            expected = reply[2]

    def _slab(self, reply, slot):
        if reply[0] == "error":
            raise remote_error(*reply[3:])
        _, first, stop, columns, errors = reply
        at = slot * SLOT_BYTES
        for k, column in enumerate(columns):
            if isinstance(column, tuple):  # (offset in the slot, lengths)
                offset, lengths = column
                size = int(lengths.sum())
                columns[k] = ByteValues(self.view[at + offset : at + offset + size], lengths)
        return Slab(first, stop, columns, [remote_error(*e[1:]) for e in errors])


def _worker_main(conn, data, encodings, kinds, skip, mapping):
    view = memoryview(mapping)

    def answer(message):
        _, first, stop, slot = message
        try:
            columns, errors = encode_rows(data, first, stop, encodings, skip)
            return (
                "done",
                first,
                stop,
                _into_slot(columns, kinds, view, slot),
                [describe_error(e) for e in errors],
            )
        except BaseException as exc:  # raised in the writer, as a thread's would be
            return ("error", first) + describe_error(exc)

    serve(conn, answer)


def _into_slot(columns, kinds, view, slot):
    """The slab's columns for the reply: byte columns copied into the slot, value by
    value, as (offset, lengths) while they fit; the rest as ``Slab`` columns."""
    at, used, out = slot * SLOT_BYTES, 0, []
    for values, kind in zip(columns or [[] for _ in kinds], kinds):
        if not is_byte_kind(kind):
            out.append(column_values(values, kind))
            continue
        data = [as_bytes(v) for v in values]
        lengths = np.fromiter(map(len, data), np.int64, len(data))
        size = int(lengths.sum())
        if used + size > SLOT_BYTES:
            out.append(ByteValues(b"".join(data), lengths))
            continue
        start = at + used
        for value in data:
            view[start : start + len(value)] = value
            start += len(value)
        out.append((used, lengths))
        used += size
    return out
