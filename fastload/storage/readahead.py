"""Reading a packed dataset ahead of a loader, chunk by chunk, in the order the loader
will read it (``shuffle="quasi"``), and letting go of what it read.

Left to page faults, a window of chunks read in random order costs one synchronous read
per fault (the kernel reads ``read_ahead_kb`` around it), a few in flight at a time: about
half the disk's sequential rate. Instead, the loader tells ``ReadAhead`` each step it
delivers, and two threads work ahead of it (``filepages.py`` says how)::

    steps delivered   ...|==== window k (read from the page cache) ====|
    reader                  |== window k+1, chunk after chunk (sequential reads) ==>
    releaser            <- window k-1, let go once its last step was delivered

- the reader reads the chunks in the order of their first step, whole, while the chunks
  held (read, not yet let go) fit in the budget, or when a step the engine may be loading
  needs one;
- the releaser lets go of a chunk in two parts, so that the step that ends one window and
  starts the next does not hold the whole finished window while the next one is read:
  all of it but the rows of its last step once the steps before that one were delivered,
  and those rows once that step was.

Chunks are let go only when the files are larger than the memory this process may use
(``memory.py``): files that fit stay in the page cache for the next epoch. The budget is
that memory, less the process's own and an eighth of it for slack, between one and two
working sets (the most bytes the order reads at once: a window of the quasi-random
order): the current window plus as much of the next as fits.
"""

import atexit
import heapq
import os
import threading
import weakref
from typing import Any

import numpy as np

__all__ = ["ReadAhead"]

_AHEAD_ROWS = 4096  # rows past the last delivered step that the engine may be loading

_running: "weakref.WeakSet[ReadAhead]" = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit():
    """Stop reading ahead and wait for the threads while Python still runs: a daemon thread
    that runs Python code during the interpreter's finalization is ended where it stands,
    and ended inside a C++ destructor (pyarrow's, letting go of a mapped file) it aborts
    the process."""
    for ahead in list(_running):
        ahead.close()
    for ahead in list(_running):
        ahead.join(timeout=10)


class ReadAhead:
    """One epoch of read-ahead over ``order`` (rows of the dataset whose ``FilePages`` is
    ``pages``, ``rows`` a step) from step ``start``; ``limit``: the memory this process
    may use (None: unknown). ``start()`` starts the reader and releaser threads;
    ``delivered(step)`` is called by the consumer with each step it hands out (in any
    order); ``close()`` stops reading and lets go of what is held.

    Invariants (kept under ``_cond``): ``_low`` is the first step not yet delivered; no
    rows that a step from ``_low`` on reads are let go; ``_nbytes`` counts the chunks
    read or being read and not yet handed to the releaser.
    """

    def __init__(self, pages, order, rows, start, limit):
        self.pages, self.rows, self.limit = pages, int(rows), limit
        self.order = np.asarray(order, np.int64)
        self.drop = limit is not None and pages.nbytes > limit
        self.ahead = max(1, -(-_AHEAD_ROWS // self.rows))
        self.queue: Any = None  # chunks in the order they are read (``_plan``)
        self._start = start
        self._low = start
        self._delivered = set()
        self._next = 0  # the position in ``queue`` of the next chunk to read
        self._reading = -1  # the position of the chunk being read
        self._held = []  # heap of (step due, queue position, part)
        self._nbytes = 0
        self._release = []  # (queue position, part) for the releaser
        self._closed = False
        self._cond = threading.Condition()
        self._threads = []

    def start(self):
        """Start the threads (once)."""
        for target, name in ((self._read, "reader"), (self._let_go, "releaser")):
            thread = threading.Thread(
                target=_hinting, args=(target,), daemon=True, name=f"fastload-read-ahead-{name}"
            )
            thread.start()
            self._threads.append(thread)
        _running.add(self)
        return self

    def delivered(self, step):
        """The consumer handed out ``step``."""
        with self._cond:
            if step != self._low:
                if step > self._low:
                    self._delivered.add(step)
                return
            self._low += 1
            while self._low in self._delivered:
                self._delivered.discard(self._low)
                self._low += 1
            if self._due():
                self._cond.notify_all()

    def close(self):
        """Stop reading ahead; the releaser lets go of what is held and ends. Idempotent,
        never blocks."""
        with self._cond:
            self._closed = True
            self._due()
            self._cond.notify_all()

    def join(self, timeout=None):
        """Wait for the threads to end (after ``close()``)."""
        for thread in self._threads:
            thread.join(timeout)

    def plan(self):
        """Which chunks the order reads and when: sets ``queue`` (the chunks by first
        step), ``first`` and ``last`` (their first and last steps), ``sizes`` (bytes),
        ``working_set`` and ``budget`` (bytes). Runs on the reader thread, not the
        consumer's: it takes a sort of the order."""
        order = self.order[self._start * self.rows :]
        chunk = np.searchsorted(self.pages.chunk_bounds, order, side="right") - 1
        used, first = np.unique(chunk, return_index=True)
        _, from_end = np.unique(chunk[::-1], return_index=True)
        first_step = self._start + first // self.rows
        last_step = self._start + (len(chunk) - 1 - from_end) // self.rows
        by_first = np.lexsort((used, first_step))
        self.first, self.last = first_step[by_first], last_step[by_first]
        self.sizes = self.pages.chunk_nbytes()[used[by_first]]
        self.working_set = _working_set(self.first, self.last, self.sizes)
        self.budget = _budget(self.limit, self.working_set)
        self.queue = used[by_first]

    def _due(self):
        """Hand the parts whose steps were delivered (all, once closed) to the releaser;
        True when there were some. Under ``_cond``."""
        found = False
        while self._held and (self._held[0][0] <= self._low or self._closed):
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

    def _readable(self):
        """The position of the next chunk to read now, or None. Under ``_cond``."""
        while self._next < len(self.queue) and self.last[self._next] < self._low:
            self._next += 1  # its steps were delivered already: not worth reading
        k = self._next
        if self._closed or k >= len(self.queue):
            return None
        fits = self._nbytes + self.sizes[k] <= self.budget
        return k if fits or self.first[k] <= self._low + self.ahead else None

    def _read(self):
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
                    self._cond.wait()
            self.pages.load(pieces.pop(0))

    def _let_go(self):
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

    def _let_go_part(self, q, part, closed):
        chunk = int(self.queue[q])
        if part == 0 and closed:
            self.pages.drop(chunk)
            return
        last = int(self.last[q])
        rows = self.order[last * self.rows : (last + 1) * self.rows]
        bounds = self.pages.chunk_bounds
        rows = rows[(rows >= bounds[chunk]) & (rows < bounds[chunk + 1])]
        if part == 0:
            self.pages.drop(chunk, keep=rows)
        else:
            self.pages.drop_rows(chunk, rows)


def _hinting(target):
    try:
        target()
    except OSError:
        # A hint that fails (a file removed under its map, say) only ends the reading
        # ahead: the loader reads every row through the map, with or without it.
        pass


def _working_set(first, last, sizes):
    """The most bytes that the chunks in use at one step (from their first step up to,
    not including, their last) take; at least the largest chunk."""
    if not len(sizes):
        return 0
    steps = np.concatenate([first, last])
    change = np.concatenate([sizes, -sizes])
    by_step = np.lexsort((change, steps))  # at one step, let go before taking
    return int(max(np.max(np.cumsum(change[by_step])), np.max(sizes)))


def _budget(limit, working_set):
    """Bytes the chunks held may take: the memory this process may use less what it
    holds already and an eighth of the limit, between one and two working sets."""
    if limit is None:
        return 2 * working_set
    free = limit - _resident() - limit // 8
    return int(max(working_set, min(2 * working_set, free)))


def _resident():
    """Bytes of this process's resident memory (Linux; else 0): its own and the libraries
    it maps, when an epoch starts (the dataset's pages of the last one were let go)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
