"""Reading a packed dataset ahead of a loader, block by block, in the order the loader
will read it (``shuffle="quasi"``), and letting go of what it read.

Left to page faults, a wave of blocks read in random order costs one synchronous read
per fault (the kernel reads ``read_ahead_kb`` around it), a few in flight at a time: about
half the disk's sequential rate. Instead, the loader tells ``ReadAhead`` each step it
delivers, and two threads work ahead of it (``filepages.py`` says how)::

    steps delivered   ...|==== wave k (read from the page cache) ======|
    reader                  |== wave k+1, block after block (sequential reads) ==>
    releaser            <- wave k-1, let go once its last step was delivered

- the reader reads the blocks in the order of their first step, whole, while the blocks
  held (read, not yet let go) fit in the budget, or when a step the engine may be loading
  needs one;
- the releaser lets go of a block in two parts, so that the step that ends one wave and
  starts the next does not hold the whole finished wave while the next one is read:
  all of it but the rows of its last step once the steps before that one were delivered,
  and those rows once that step was.

- the checker checks each block the reader read whole against its checksum
  (``verify="read"``) while the reader reads the next: the first step of a wave reads
  all of its blocks, and checking them there, one after the other, would keep the loader
  waiting with the disk idle.

Blocks are let go only when the files are larger than the memory this process may use
(``memory.py``): files that fit stay in the page cache for the next epoch. How many bytes
the blocks held may take (the budget, ``wave_bytes``) is measured, not set: before each
block, the memory still free (``memory_room``: the cgroup's limit less its usage, the
system's ``MemAvailable``) less an eighth of the limit for slack, and the rates measured
so far, of the disk (bytes the reader read per second spent reading) and of the loader
(bytes its steps used per second). The budget holds the working set (the most bytes the
order reads at once: a wave of the quasi-random order) and as much of the next wave
as keeps the disk busy until the current one is used, twice that for noise, all of it
while no rate is measured yet; never more than the memory free allows, never less than
the working set.
"""

import atexit
import heapq
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from fastload._storage.blockuses import BlockUses, Delivered
from fastload._storage.memory import memory_room

__all__ = ["ReadAhead", "wave_bytes"]

_AHEAD_ROWS = 4096  # rows past the last delivered step that the engine may be loading
_REMEASURE_S = 0.05  # how often a reader waiting for memory measures it again

_running: "weakref.WeakSet[ReadAhead]" = weakref.WeakSet()


def _stop_all_at_exit() -> None:
    """Stop reading ahead and wait for the threads while Python still runs: a daemon thread
    that runs Python code during the interpreter's finalization is ended where it stands,
    and ended inside a C++ destructor (pyarrow's, letting go of a mapped file) it aborts
    the process. Registered again whenever threads start, so that it runs first among
    the exit functions (they run last registered first): before the finalizers of the
    datasets close the files that the threads check."""
    for ahead in list(_running):
        ahead.close()
    for ahead in list(_running):
        ahead.join(timeout=10)


class ReadAhead:
    """One epoch of read-ahead over ``order`` (rows of the dataset whose ``FilePages`` is
    ``pages``, ``rows`` a step) from step ``start``; ``limit``: the memory this process
    may use (None: unknown). ``start()`` starts the reader, releaser and checker threads;
    ``delivered(step)`` is called by the consumer with each step it hands out (in any
    order); ``close()`` stops reading and lets go of what is held.

    Invariants (kept under ``_cond``): ``_delivered.low`` is the first step not yet
    delivered; no rows that a step from it on reads are let go; ``_nbytes`` counts the blocks
    read or being read and not yet handed to the releaser; ``_loaded`` holds the blocks
    read whole and not checked yet; ``_read_bytes`` and ``_read_s`` only grow.
    """

    def __init__(
        self, pages: Any, order: npt.ArrayLike, rows: int, start: int, limit: int | None
    ) -> None:
        self.pages, self.rows, self.limit = pages, int(rows), limit
        self.order = np.asarray(order, np.int64)
        self.drop = limit is not None and pages.nbytes > limit
        self.ahead = max(1, -(-_AHEAD_ROWS // self.rows))
        self.queue: Any = None  # blocks in the order they are read (``_plan``)
        self._start = start
        self._delivered = Delivered(start)
        self._next = 0  # the position in ``queue`` of the next block to read
        self._reading = -1  # the position of the block being read
        self._held: list[tuple[int, int, int]] = []  # heap of (step due, queue position, part)
        self._nbytes = 0
        self._release: list[tuple[int, int]] = []  # (queue position, part) for the releaser
        self._loaded: list[int] = []  # queue positions read whole, for the checker
        self._read_bytes, self._read_s = 0, 0.0  # what the reader read, and how long
        self._began: float | None = None  # when the first step after ``start`` was delivered
        self._closed = False
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []

    # As a feed of the engine (``_loading.seams.Feed``): no gate (the pages are read through
    # the map whatever it reads ahead), nothing to check or to bring in first.
    gate = None

    def check(self, rows: npt.NDArray[np.int64]) -> None:
        """Nothing to check: a page read ahead or not reads the same."""

    def ensure(self, rows: npt.NDArray[np.int64]) -> None:
        """Nothing to bring in: the map reads what was not read ahead."""

    def start(self, gated: bool = False) -> "ReadAhead":
        """Start the threads (once); ``gated`` is the engine's (not used: no gate)."""
        for target, name in (
            (self._read, "reader"),
            (self._let_go, "releaser"),
            (self._check, "checker"),
        ):
            thread = threading.Thread(
                target=_hinting, args=(target,), daemon=True, name=f"fastload-read-ahead-{name}"
            )
            thread.start()
            self._threads.append(thread)
        _running.add(self)
        atexit.unregister(_stop_all_at_exit)
        atexit.register(_stop_all_at_exit)
        return self

    def delivered(self, step: int) -> None:
        """The consumer handed out ``step``."""
        with self._cond:
            if self._began is None:
                self._began = time.monotonic()
            if self._delivered.add(step) and self._due():
                self._cond.notify_all()

    def close(self) -> None:
        """Stop reading ahead; the releaser lets go of what is held and ends. Idempotent,
        never blocks."""
        with self._cond:
            self._closed = True
            self._due()
            self._cond.notify_all()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the threads to end (after ``close()``)."""
        for thread in self._threads:
            thread.join(timeout)

    def plan(self) -> None:
        """Which blocks the order reads and when: sets ``queue`` (the blocks by first
        step), ``first`` and ``last`` (their first and last steps), ``sizes`` (bytes),
        ``working_set`` (bytes) and ``step_bytes`` (the bytes of blocks a step uses, on
        average). Runs on the reader thread, not the consumer's: it takes a sort of the
        order."""
        start = self._start * self.rows
        uses = BlockUses(self.pages.block_bounds, self.order[start:], start)
        first, last = uses.steps(self.rows)
        by_step = np.lexsort((uses.blocks, first))  # within a step, by block
        self.first, self.last, self.queue = first[by_step], last[by_step], uses.blocks[by_step]
        self.sizes = self.pages.block_nbytes()[self.queue]
        self.working_set = _working_set(self.first, self.last, self.sizes)
        steps = max(1, -(-(len(self.order) - start) // self.rows))
        self.step_bytes = float(self.sizes.sum()) / steps

    def _due(self) -> bool:
        """Hand the parts whose steps were delivered (all, once closed) to the releaser;
        True when there were some. Under ``_cond``."""
        found = False
        while self._held and (self._held[0][0] <= self._delivered.low or self._closed):
            step, q, part = heapq.heappop(self._held)
            if part == 0:
                self._nbytes -= int(self.sizes[q])
                if not self._closed:
                    heapq.heappush(self._held, (step + 1, q, 1))
            if q == self._reading:
                self._reading = -1  # the reader stops reading what is let go
            self._release.append((q, part))
            found = True
        return found

    def _readable(self) -> int | None:
        """The position of the next block to read now, or None. Under ``_cond``."""
        while self._next < len(self.queue) and self.last[self._next] < self._delivered.low:
            self._next += 1  # its steps were delivered already: not worth reading
        k = self._next
        if self._closed or k >= len(self.queue):
            return None
        if self.first[k] <= self._delivered.low + self.ahead:
            return k
        return k if self._nbytes + self.sizes[k] <= self.budget() else None

    def budget(self) -> int:
        """Bytes the blocks held may take now (``wave_bytes`` of what is measured now).
        Under ``_cond``."""
        room = None
        if self.limit is not None:
            free = memory_room(self._nbytes)
            if free is not None:
                room = self._nbytes + free - self.limit // 8
        return wave_bytes(self.working_set, room, *self._rates())

    def _rates(self) -> tuple[float | None, float | None]:
        """(disk, use): the bytes per second the reader read, and that the loader's
        steps used since the first was delivered; None where not measured yet. Under
        ``_cond``."""
        disk = self._read_bytes / self._read_s if self._read_s > 0 else None
        use = None
        if self._began is not None and self._delivered.low > self._start + 1:
            elapsed = time.monotonic() - self._began
            if elapsed > 0:
                use = (self._delivered.low - self._start - 1) * self.step_bytes / elapsed
        return disk, use

    def _read(self) -> None:
        self.plan()
        pieces: list[Any] = []
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    if pieces and self._reading >= 0:
                        break
                    k = self._readable()
                    if k is not None:
                        self._next, self._reading = k + 1, k
                        heapq.heappush(self._held, (int(self.last[k]), k, 0))
                        self._nbytes += int(self.sizes[k])
                        pieces = self.pages.pieces(int(self.queue[k]))
                        break
                    # Memory that others let go of tells no one: measure it again soon.
                    self._cond.wait(_REMEASURE_S if self._next < len(self.queue) else None)
            piece = pieces.pop(0)
            began = time.monotonic()
            self.pages.load(piece, pieces[0] if pieces else None)
            with self._cond:
                self._read_bytes += piece[2] - piece[1]
                self._read_s += time.monotonic() - began
                if not pieces and self._reading >= 0:
                    self._loaded.append(self._reading)
                    self._cond.notify_all()

    def _check(self) -> None:
        while True:
            with self._cond:
                while not self._loaded and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                q = self._loaded.pop(0)
                if self.last[q] < self._delivered.low:
                    continue  # delivered already: the loader checked it
            self.pages.check(int(self.queue[q]))

    def _let_go(self) -> None:
        while True:
            with self._cond:
                while not self._release and not (self._closed and not self._held):
                    self._cond.wait()
                work, self._release = self._release, []
                closed = self._closed
            if not work and closed:
                return
            if self.drop:
                for q, part in work:
                    self._let_go_part(q, part, closed)

    def _let_go_part(self, q: int, part: int, closed: bool) -> None:
        block = int(self.queue[q])
        if part == 0 and closed:
            self.pages.drop(block)
            return
        last = int(self.last[q])
        rows = self.order[last * self.rows : (last + 1) * self.rows]
        bounds = self.pages.block_bounds
        rows = rows[(rows >= bounds[block]) & (rows < bounds[block + 1])]
        if part == 0:
            self.pages.drop(block, keep=rows)
        else:
            self.pages.drop_rows(block, rows)


def _hinting(target: Callable[[], None]) -> None:
    try:
        target()
    except OSError:
        # A hint that fails (a file removed under its map, say) only ends the reading
        # ahead: the loader reads every row through the map, with or without it.
        pass


def _working_set(
    first: npt.NDArray[np.int64], last: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]
) -> int:
    """The most bytes that the blocks in use at one step (from their first step up to,
    not including, their last) take; at least the largest block."""
    if not len(sizes):
        return 0
    steps = np.concatenate([first, last])
    change = np.concatenate([sizes, -sizes])
    by_step = np.lexsort((change, steps))  # at one step, let go before taking
    return int(max(np.max(np.cumsum(change[by_step])), np.max(sizes)))


def wave_bytes(
    working_set: int,
    room: int | None = None,
    disk_rate: float | None = None,
    use_rate: float | None = None,
) -> int:
    """Bytes the blocks read ahead may take: the working set (bytes) and as much of the
    next wave as the disk must have read by the time the loader has used the current
    one to stay busy all along (the working set x ``disk_rate / use_rate``, both bytes
    per second), twice that for noise, the whole next wave while a rate is unknown
    (None); within ``room`` (bytes of memory free to hold blocks; None: unknown), but at
    least the working set, without which the loader would wait on every step."""
    ahead = working_set
    if disk_rate and use_rate:
        ahead = min(working_set, int(2 * working_set * disk_rate / use_rate))
    wanted = working_set + ahead
    if room is not None:
        wanted = min(wanted, int(room))
    return int(max(working_set, wanted))
