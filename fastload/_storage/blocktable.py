"""The blocks of a dataset at a URL and their life cycle: one table, in memory shared with
the worker processes forked after it was made, changed only through the operations
below (``remotefiles.RemoteRows`` fetches and lets go of the bytes; this module keeps
what may be done with them when)::

    absent --claim--> claimed --landed--> present --let_go--> absent
                         '----abandon----> absent  (the fetch failed)

    present, counted:  needs n  iterations that will read it before their next steps are
                                delivered (a gate passed it: ``admit``; or their next
                                steps read it: ``need``), until those are (``unneed``)
                       holds n  reads through Python copying it now (``hold``)
                       pinned   read through Python as a view: never let go (``pin``)

``let_go`` takes a present block to absent only when it is not pinned, held nor needed,
and not while another thread or process fetches it; a reader marks its need (``admit``,
``hold``, ``pin``) before it reads and reads only a block present then, so that a block
is never let go under a read. Every count is kept here, as state, in shared memory:
every process sees every reader's need, and nothing calls back into the readers.

Locks, always taken in this order, and each only for what it guards:

1. the block's **thread lock** (striped, this process's): one thread fetches or lets go
   of a block at a time;
2. the block's **claim** among processes (a POSIX record lock on byte ``k`` of an
   unlinked file): one process fetches or lets go of it at a time; held for one fetch
   at most;
3. the **marks lock** (this process's thread lock, then the record lock on the byte past
   the blocks): the marks and counts change together, briefly, never during a fetch.

Record locks are polled (taken without waiting, tried again after a millisecond): the
kernel takes two processes whose threads wait for each other's record locks for a
deadlock, though they are not one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator

import numpy as np
import numpy.typing as npt

__all__ = ["BlockTable"]

_STRIPES = 64  # thread locks of blocks, striped
_Blocks = int | npt.NDArray[np.int64]


class BlockTable:
    """The life cycle of ``n`` blocks (indices 0..n-1). ``present``, ``pinned`` (uint8),
    ``holds`` and ``needs`` (int32) are views of the shared marks, to read; they change
    through the methods. ``there``: which blocks are present from the start (those with
    nothing to fetch)."""

    def __init__(self, there: npt.ArrayLike) -> None:
        start = np.asarray(there, dtype=bool)
        n = len(start)
        at = -(-2 * n // 4) * 4
        self._map = mmap.mmap(-1, max(at + 8 * n, 1))
        self.present = np.frombuffer(self._map, np.uint8, n, 0)
        self.pinned = np.frombuffer(self._map, np.uint8, n, n)
        self.holds = np.frombuffer(self._map, np.int32, n, at)
        self.needs = np.frombuffer(self._map, np.int32, n, at + 4 * n)
        self.present[:] = start
        self.n = n
        self._claims = tempfile.TemporaryFile(prefix="fastload-blocks-")
        weakref.finalize(self, self._claims.close)  # closed with it, not by the collector
        self._pid = -1
        self._after_fork()

    def _after_fork(self) -> None:
        """This process's thread locks: in a worker process forked while the parent
        fetched, the parent's may be held by threads that are not there."""
        if self._pid != os.getpid():
            self._stripes = [threading.Lock() for _ in range(_STRIPES)]
            self._marks_lock = threading.Lock()
            self._pid = os.getpid()

    # -- fetching ------------------------------------------------------------------------

    @contextlib.contextmanager
    def fetching(self, k: int, wanted: Callable[[], bool] | None = None) -> Iterator[bool]:
        """Claim absent block ``k`` to fetch it: yields True to the one thread of one
        process that fetches it, which marks it present (``landed``) when the body ends
        normally and leaves it absent (``abandon``) when it raises; yields False when it is
        present (another fetched it meanwhile) or ``wanted()``, asked under the block's
        lock, says it is not needed any more. Waits while another fetches it."""
        with self._thread_lock(k):
            if self.present[k] or (wanted is not None and not wanted()):
                yield False
                return
            while not self._record_lock(k):
                if self.present[k]:  # another process fetched it meanwhile
                    yield False
                    return
                time.sleep(0.001)
            try:
                if self.present[k]:
                    yield False
                    return
                yield True
                with self._marks():
                    self.present[k] = 1
            finally:
                self._record_unlock(k)

    # -- a reader's marks ----------------------------------------------------------------

    def admit(self, k: int) -> bool:
        """A gate passes block ``k``: counted as needed when it is present (True); False,
        and nothing counted, when it is not there (being fetched, or let go)."""
        with self._marks():
            if not self.present[k]:
                return False
            self.needs[k] += 1
            return True

    def need(self, blocks: _Blocks) -> None:
        """Count ``blocks`` as needed by one more iteration (present or not: its reads
        fetch what is not there)."""
        with self._marks():
            np.add.at(self.needs, blocks, 1)

    def unneed(self, blocks: _Blocks) -> None:
        """What ``admit`` or ``need`` counted, taken back (once per block)."""
        with self._marks():
            np.add.at(self.needs, blocks, -1)

    def hold(self, blocks: _Blocks, change: int) -> None:
        """One more read through Python copying ``blocks`` (``change=1``), or one fewer
        (``-1``); the reader fetches what is not there after holding it."""
        with self._marks():
            np.add.at(self.holds, blocks, change)

    def pin(self, blocks: _Blocks) -> None:
        """``blocks`` are read through Python as views: never let go from now on."""
        with self._marks():
            self.pinned[blocks] = 1

    # -- letting go ----------------------------------------------------------------------

    def let_go(self, k: int, drop: Callable[[], None], wait: bool = True) -> bool | None:
        """Take present block ``k`` to absent, then ``drop()`` its bytes (under its
        locks: no fetch of it runs meanwhile), unless it is pinned, held or needed.
        Returns whether it did; None when another thread or process fetches or lets go of
        it now (its thread lock taken and ``wait`` is False, or its claim): try later."""
        lock = self._thread_lock(k)
        if not lock.acquire(blocking=wait):
            return None
        try:
            if not self._record_lock(k):
                return None
            try:
                with self._marks():
                    if not self.present[k] or self.pinned[k] or self.holds[k] or self.needs[k]:
                        return False
                    self.present[k] = 0
                drop()
            finally:
                self._record_unlock(k)
        finally:
            lock.release()
        return True

    # -- locks ---------------------------------------------------------------------------

    def _thread_lock(self, k: int) -> threading.Lock:
        self._after_fork()
        return self._stripes[k % _STRIPES]

    @contextlib.contextmanager
    def _marks(self) -> Iterator[None]:
        """The marks lock: this process's, then among processes (the byte past the
        blocks), polled."""
        self._after_fork()
        with self._marks_lock:
            while not self._record_lock(self.n):
                time.sleep(0.0002)
            try:
                yield
            finally:
                self._record_unlock(self.n)

    def _record_lock(self, k: int) -> bool:
        """Take the record lock of byte ``k`` if no other process holds it."""
        try:
            fcntl.lockf(self._claims, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, k)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            return False
        return True

    def _record_unlock(self, k: int) -> None:
        fcntl.lockf(self._claims, fcntl.LOCK_UN, 1, k)
