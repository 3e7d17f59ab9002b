"""Loading a stream with the engine, a round of records at a time, in bounded memory.

A stream has no length and no positions, so the engine cannot claim its items in an order
drawn up front. Instead a reader thread reads the rank's records (``streams.py``), passes
them through a seeded shuffle buffer and cuts what comes out into rounds of ``round_size``
records (a whole number of batches). Each round is a list, that is a container: the
loader's views of the stream (``mapobs``, tuples, dicts) are made views of the round, and
the engine loads it as any container, per-item work on the pool::

    reader thread                          consumer (next())
    -------------                          -----------------
    records -> shuffle buffer -> rounds    round w:    Engine.iterate -> its batches
       (queue of 2 rounds ahead)           round w+1:  started on a second engine
                                                       while w is delivered

Record ``k`` of the epoch (after the shuffle buffer) is item ``k % round_size`` of round
``k // round_size``, loaded with the seed derived from (seed, round number): random
transforms draw from (seed, epoch, k) alone. Memory: the shuffle buffer, two rounds read
ahead and two being loaded.

State: a stream has no positions to seek to, so a loader resumes by replaying: the reader
reads the epoch's records from the start again and passes them through the shuffle
buffer (which draws the same), but nothing is loaded until the round of the saved step.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._base.arguments import renamed_attribute, renamed_keywords
from .._base.collate import Collate
from .._base.randomness import Purpose, derived_seed, generator
from ..obs import Container
from ..streams import check_ranks, is_one_shot, rank_records, substitute
from .schedule import Schedule

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["ShuffleBuffer", "StreamEpochs", "round_size"]

ROUND_RECORDS = 1024  # records a round holds at least (a whole number of batches)
DEFAULT_BUFFER = 1024  # records in the shuffle buffer for shuffle=True
_AHEAD = 2  # rounds the reader keeps ready
_WAIT_S = 0.1  # longest wait between two checks that the other side is alive


def round_size(batch_size: int | None) -> int:
    """Records a round holds: ``ROUND_RECORDS`` rounded up to whole batches."""
    rows = batch_size or 1
    return -(-ROUND_RECORDS // rows) * rows


class ShuffleBuffer:
    """A seeded shuffle of a stream through ``size`` records: once full, each record
    that comes in takes the place of one drawn at random, which goes out; at the end the
    rest goes out in a random order. What goes out depends only on the records, in the
    order they came, the seed and the epoch (records are pushed in the same groups)."""

    def __init__(self, size: int, seed: int, epoch: int) -> None:
        self.size = size
        self.records: list[Any] = []
        self.rng = generator(seed, Purpose.SHUFFLE_BUFFER, epoch)

    def push(self, records: list[Any]) -> list[Any]:
        """The records that go out as ``records`` come in."""
        room = self.size - len(self.records)
        self.records.extend(records[:room])
        rest = records[room:]
        if not rest:
            return []
        out = []
        buffer = self.records
        for record, j in zip(rest, self.rng.integers(0, self.size, len(rest)).tolist()):
            out.append(buffer[j])
            buffer[j] = record
        return out

    def drain(self) -> list[Any]:
        """What is left, in a random order."""
        records, self.records = self.records, []
        return [records[k] for k in self.rng.permutation(len(records))]


class _Reader:
    """The thread that reads one epoch of a rank's records into rounds (a queue of
    ``("round", number, records)``, then ``("end",)`` or ``("error", exception)``).
    Rounds before ``first`` are read and shuffled but not queued (a replay).

    Invariants: only the thread touches the records iterator and the shuffle buffer;
    every wait on the queue, on either side, is timed and checks whether the other side
    stopped, so that closing (or a reader that died) never leaves anyone waiting."""

    def __init__(
        self, records: Iterable[Any], round_size: int, buffer: ShuffleBuffer | None, first: int
    ) -> None:
        self.records, self.round_size, self.buffer, self.first = records, round_size, buffer, first
        self.queue: queue.Queue[tuple[Any, ...]] = queue.Queue(maxsize=_AHEAD)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="fastload-stream-reader", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            number, pending = 0, []
            for part in self._parts():
                pending.extend(self.buffer.push(part) if self.buffer else part)
                while len(pending) >= self.round_size and not self.stopped.is_set():
                    number = self._emit(number, pending[: self.round_size])
                    del pending[: self.round_size]
            if self.buffer is not None:
                pending.extend(self.buffer.drain())
            for first in range(0, len(pending), self.round_size):
                number = self._emit(number, pending[first : first + self.round_size])
            self._put(("end",))
        except BaseException as exc:  # the consumer raises it, with its traceback
            self._put(("error", exc))

    def _parts(self) -> Iterator[list[Any]]:
        records = iter(self.records)
        while not self.stopped.is_set():
            part = []
            for record in records:
                part.append(record)
                if len(part) == self.round_size or self.stopped.is_set():
                    break
            if part:
                yield part
            if len(part) < self.round_size:
                return

    def _emit(self, number: int, records: list[Any]) -> int:
        if number >= self.first:
            self._put(("round", number, records))
        return number + 1

    def _put(self, item: tuple[Any, ...]) -> None:
        while not self.stopped.is_set():
            try:
                self.queue.put(item, timeout=_WAIT_S)
                return
            except queue.Full:
                continue

    def get(self, block: bool = True) -> tuple[Any, ...] | None:
        """The next item, or None when ``block`` is False and none is ready."""
        while True:
            try:
                return self.queue.get(block=block, timeout=_WAIT_S if block else None)
            except queue.Empty:
                if not block:
                    return None
                if not self.thread.is_alive() and self.queue.empty():
                    raise RuntimeError("the stream's reader thread stopped") from None

    def close(self) -> None:
        """Stop reading (the thread exits after the record it is reading). Idempotent."""
        self.stopped.set()


class _SkippedFiles:
    """Files of a ``FileStream`` that failed and were left out (``on_error="skip"``): counted by
    the reader thread, taken into the loader's stats by the consumer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    def add(self, path: str, error: Exception) -> None:
        with self._lock:
            self._count += 1

    def take(self) -> int:
        """The files skipped since the last call."""
        with self._lock:
            count, self._count = self._count, 0
        return count


class StreamEpochs:
    """How a loader reads a stream: the epochs of ``data`` (views of the stream
    ``source``), cut into steps of ``batch_size`` (None: single records), loaded by
    ``engines`` (two to load a round ahead, or one). ``shuffle_buffer``: records in the
    shuffle buffer (0: no shuffle; the old spelling ``shuffle=`` warns). ``skip``: a file
    of a ``FileStream`` that fails is left out and counted as one skipped item, as an
    observation that fails to load."""

    shuffle = renamed_attribute("shuffle_buffer")  # the name of 0.2

    @renamed_keywords(shuffle="shuffle_buffer")
    def __init__(
        self,
        data: Container,
        source: Any,
        engines: list[Engine],
        batch_size: int | None,
        *,
        shuffle_buffer: int,
        drop_last: bool,
        collate: Collate,
        rank: int,
        world_size: int,
        skip: bool = False,
    ) -> None:
        self.data, self.source, self.engines = data, source, engines
        self.skip = skip
        self.batch_size, self.drop_last, self.collate = batch_size, drop_last, collate
        self.shuffle_buffer = shuffle_buffer
        self.rank, self.world_size = rank, world_size
        check_ranks(source, world_size)
        self.round_size = round_size(batch_size)
        self._started = False
        self._live: weakref.ref[_StreamIteration] | None = None

    def iterate(
        self,
        seed: int,
        epoch: int,
        start: int,
        stats: Any,
        progress: Any,
        on_end: Callable[[], None] | None,
    ) -> _StreamIteration:
        """The iteration of ``epoch`` from step ``start``. Raises ``ValueError`` for a
        second pass over a generator."""
        if is_one_shot(self.source) and self._started:
            raise ValueError(
                "this stream is an iterator (a generator, say): it was read "
                "once and cannot start over for another epoch. Pass an "
                "iterable whose __iter__ starts again (a class with "
                "__iter__, or fastload.FileStream)"
            )
        self._started = True
        rows = self.batch_size or 1
        skipped = _SkippedFiles() if self.skip else None
        records = rank_records(
            self.source,
            self.rank,
            self.world_size,
            seed,
            epoch,
            bool(self.shuffle_buffer),
            None if skipped is None else skipped.add,
        )
        buffer = ShuffleBuffer(self.shuffle_buffer, seed, epoch) if self.shuffle_buffer else None
        reader = _Reader(records, self.round_size, buffer, start * rows // self.round_size)
        iteration = _StreamIteration(
            self,
            reader,
            seed,
            epoch,
            start * rows % self.round_size // rows,
            stats,
            progress,
            on_end,
            skipped,
        )
        self._live = weakref.ref(iteration)
        return iteration

    def live(self) -> _StreamIteration | None:
        """The iteration of the latest epoch, while it exists."""
        return self._live() if self._live is not None else None

    def stop(self) -> None:
        """Stop the epoch being read, if any: its next ``next()`` raises RuntimeError."""
        live = self.live()
        if live is not None:
            live.cancel()

    def load(
        self,
        engine: Engine,
        number: int,
        records: Sequence[Any],
        seed: int,
        epoch: int,
        start: int,
        stats: Any,
        progress: Any,
    ) -> tuple[Any, int] | None:
        """``(iteration, steps)``: the engine's iteration over round ``number`` (its
        ``records``) from step ``start``, and the steps it delivers; None when nothing of
        it is loaded (dropped as a partial batch)."""
        rows = self.batch_size or 1
        if self.drop_last and self.batch_size and len(records) % rows:
            records = records[: len(records) // rows * rows]
        if not records:
            return None
        if engine.allocator is not self.engines[0].allocator:
            # The loader's engine allocates the ring (pinned memory, say): the second one
            # follows it.
            engine.close()
            engine.allocator = self.engines[0].allocator
        schedule = Schedule(
            np.arange(len(records), dtype=np.int64),
            self.batch_size,
            collate=self.collate,
            seed=derived_seed(seed, Purpose.STREAM_ROUND, number),
            epoch=epoch,
            start=start,
        )
        iteration = engine.iterate(
            substitute(self.data, self.source, records), schedule, stats=stats, progress=progress
        )
        iteration.begin()
        return iteration, schedule.steps - start


_END = object()


class _StreamIteration:
    """One epoch of a stream: the batches of its rounds, one engine iteration each; with
    two engines the next round starts on the other one as soon as the reader has it.
    ``current`` and ``ahead`` are (iteration, the progress step at which it is spent)."""

    current: tuple[Any, int] | None
    ahead: tuple[Any, int] | None

    def __init__(
        self,
        epochs: StreamEpochs,
        reader: _Reader,
        seed: int,
        epoch: int,
        start: int,
        stats: Any,
        progress: Any,
        on_end: Callable[[], None] | None,
        skipped: _SkippedFiles | None = None,
    ) -> None:
        self.epochs, self.reader, self.skipped = epochs, reader, skipped
        self.seed, self.epoch, self.start = seed, epoch, start
        self.stats, self.progress, self.on_end = stats, progress, on_end
        self.current = self.ahead = None
        self.turn = 0  # the engine the next round loads on
        self.ended = False  # the reader said the epoch has no more rounds
        self.done = False
        self.cancelled = False
        self._planned = progress.step  # the progress step at which the rounds so far end
        self._finalizer = weakref.finalize(self, reader.close)

    def __iter__(self) -> _StreamIteration:
        return self

    def __next__(self) -> Any:
        if self.cancelled:
            raise RuntimeError("the loader was closed while this iteration ran")
        if self.done:
            raise StopIteration
        try:
            value = self._next()
        except BaseException:
            self.close()
            raise
        if value is _END:
            self.close()
            if self.on_end is not None:
                self.on_end()
            raise StopIteration
        return value

    def _next(self) -> Any:
        while True:
            if self.current is None:
                if self.ahead is None and not self._start(block=True):
                    return _END
                self.current, self.ahead = self.ahead, None
            try:
                # Not None: ahead held a round, or _start() just put one there.
                value = next(self.current[0])  # type: ignore[index]
            except StopIteration:
                self.current = None
                continue
            if self.ahead is None and not self.ended and len(self.epochs.engines) > 1:
                self._start(block=False)
            return value

    def _start(self, block: bool) -> bool:
        """Start the next round as ``ahead``: True when it did, False at the end of the
        epoch (or, without ``block``, when the reader has no round ready)."""
        while not self.ended:
            waited = time.perf_counter()
            item = self.reader.get(block)
            self.stats.wait_s += time.perf_counter() - waited
            if self.skipped is not None:
                self.stats.skipped += self.skipped.take()
            if item is None:
                return False
            if item[0] == "end":
                self.ended = True
                return False
            if item[0] == "error":
                raise item[1]
            _, number, records = item
            start, self.start = self.start, 0
            engine = self.epochs.engines[self.turn]
            loaded = self.epochs.load(
                engine, number, records, self.seed, self.epoch, start, self.stats, self.progress
            )
            if loaded is not None:
                iteration, steps = loaded
                self._planned += steps
                self.ahead = (iteration, self._planned)
                self.turn = (self.turn + 1) % len(self.epochs.engines)
                return True
        return False

    def finished(self) -> bool:
        """Whether every step of the epoch was delivered (asking the reader whether
        another round follows, when that is what decides it)."""
        if self.done:
            return True
        if self.current is not None and self.progress.step < self.current[1]:
            return False
        return self.ahead is None and not self._start(block=True)

    def cancel(self) -> None:
        """Stop reading and loading; the next ``next()`` raises RuntimeError."""
        self.cancelled = True
        self.close()

    def close(self) -> None:
        """Stop reading and loading. Idempotent."""
        self.done = True
        self.reader.close()
        for loaded in (self.current, self.ahead):
            if loaded is not None:
                loaded[0].close()
        self.current = self.ahead = None
