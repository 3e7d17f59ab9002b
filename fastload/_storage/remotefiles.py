"""Packed datasets at a URL: each object mirrored in this process's memory, its bulk
fetched block by block as the rows are read.

``open(url)`` reads, per object, what Arrow needs to parse the file (the footer, the
messages' metadata) and every buffer but the bulk ones (the values of binary columns,
the data of fixed-size columns): offsets, labels, shapes, a few bytes per row. The bulk
is fetched by **block** (the format's unit), one ranged request per column and block::

    RemoteFile (one object)            shared map of the object's size (mirror.Mirror:
      |                                a file in the disk cache's directory, else memory)
      |-- at open: footer, metadata, small buffers   (parsed by pyarrow, as a file)
      '-- bulk of block k: fetched when its rows are asked for (RemoteRows.ensure), or
            ahead of a loader (Prefetch): from the BlockCache on disk when there, else
            ranged GETs; its CRC-32 checked before a byte lands in the map (fetched
            again once, then LoadError naming the URL and block); then marked present

The map is shared with worker processes forked later, and so are the marks: a block
fetched by one of them is there for all. What reads the map waits for the marks:
``ensure`` before a row is read through Python (the columns call it), the engine's gate
before a native run claims an item (``Prefetch.gate``: the first position of the order
whose block is not there yet), and a worker process's ``ensure`` before it loads its part
of a step. A block is written once, whole and checked, and never changes after: readers
never see a torn one.

Memory. A dataset whose bulk fits in ``memory_bytes`` (``open``'s; default: half the
memory this process may use) keeps every block it fetched while it is open. A larger one
is read with bounded memory: each loader iteration lets go of a block once the last step
that reads it was delivered (its pages returned to the system, ``MADV_REMOVE``; its mark
cleared), and fetches ahead only while what is held fits ``memory_bytes`` (over it, only
the block the loader is about to wait for). What a step copies into its batch needs its
blocks only until the step is delivered; a view handed to Python does not: a block read
through Python as a view (a raw item, ``encoded[i]``) is **pinned** (marked before it
is read) and never let go, so that no value handed out ever changes; a read that copies
**holds** its blocks while it reads; an iteration **needs** the blocks its gate passed,
or its next steps read, until those steps are delivered. What may be done with a block
when, and under which locks, is one table's (``blocktable.BlockTable``), which every
process shares. A block let go is fetched again when it is next needed (from the disk
cache when it is there), checked again::

    positions  |== delivered ==|== being loaded ==|gate|== fetched ahead ==|
    blocks      let go (last use delivered)  held      held (within memory_bytes)

An object that is not an Arrow IPC file (a stream, ``.arrows``), or whose batches are
compressed, is fetched whole at open.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import contextvars
import mmap
import os
import shutil
import struct
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from fastload._storage.arrow_types import import_pyarrow
from fastload._storage.blockcache import BlockCache
from fastload._storage.blocktable import BlockTable
from fastload._storage.blockuses import BlockUses, Delivered
from fastload._storage.checksums import block_checksums, file_checksums
from fastload._storage.framing import framing_of
from fastload._storage.memory import memory_limit, readable_bytes
from fastload._storage.mirror import Mirror
from fastload._storage.remote import MAX_CONCURRENCY, RemoteObject, resolve_urls
from fastload.errors import LoadError

__all__ = [
    "RemoteFile",
    "RemoteRows",
    "Prefetch",
    "default_cache",
    "open_objects",
    "reads_copied",
]

_MAGIC = b"ARROW1"
_PIECE = 8 << 20  # the largest range fetched in one request at open
_GAP = 64 << 10  # small buffers this close are fetched in one range
AHEAD_BLOCKS = 16  # blocks a loader's prefetch keeps in flight or fetched ahead
DEFAULT_CACHE_BYTES = 50 << 30  # at most; never more than half the disk's free space
# Returns a shared map's pages to the system, a hole punched in a file's (Linux); elsewhere
# blocks are kept.
_MADV_REMOVE = getattr(mmap, "MADV_REMOVE", None)


# True within ``reads_copied``: the reads of this thread pin nothing.
_COPIED = contextvars.ContextVar("fastload_reads_copied", default=False)


@contextlib.contextmanager
def reads_copied() -> Any:
    """Within it, the reads of this thread through Python pin no block
    (``RemoteRows.pin``): for a caller that holds the blocks while it reads
    (``RemoteRows.holding``) and keeps nothing of what it was handed, only a copy (a
    decode of stored bytes, as a mix's image chain does)."""
    token = _COPIED.set(True)
    try:
        yield
    finally:
        _COPIED.reset(token)


def can_let_go() -> bool:
    """Whether fetched blocks can be let go of on this platform (``MADV_REMOVE``)."""
    return _MADV_REMOVE is not None


def default_memory(memory_bytes: int | None) -> int | None:
    """The bytes of fetched blocks a dataset at a URL keeps in memory: ``memory_bytes``,
    or half the memory this process may use (None: unknown, all kept). Raises
    ValueError for a negative or non-integer value."""
    if memory_bytes is None:
        limit = memory_limit()
        return None if limit is None else limit // 2
    if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int) or memory_bytes < 0:
        raise ValueError(f"memory_bytes must be an int >= 0 (bytes), got {memory_bytes!r}")
    return memory_bytes


def default_cache(cache_dir: str | os.PathLike[str] | None, cache_bytes: int | None) -> BlockCache:
    """The block cache ``open`` uses: ``cache_dir`` (default ``$XDG_CACHE_HOME/fastload``,
    else ``~/.cache/fastload``) holding at most ``cache_bytes`` (default: 50 GiB, or half
    the free space of its disk when less; 0: no cache, nothing written to disk)."""
    if cache_dir is None:
        root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        cache_dir = os.path.join(root, "fastload")
    directory = os.fspath(cache_dir)
    if cache_bytes is None:
        try:
            free = shutil.disk_usage(_existing_parent(directory)).free
        except OSError:
            free = DEFAULT_CACHE_BYTES
        cache_bytes = min(DEFAULT_CACHE_BYTES, free // 2)
    return BlockCache(directory, cache_bytes)


def _existing_parent(path: str) -> str:
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


class RemoteFile:
    """One object (``RemoteObject``) mirrored in this process: ``mapping`` (a shared map
    of its size, ``mirror.Mirror``'s: an unlinked file in ``directory``, pages the kernel
    may reclaim, else anonymous memory) and ``base`` (a uint8 view of it), filled by
    ``fill`` at open and by ``RemoteRows.fetch`` block by block (``write``). ``whole``:
    the object was fetched whole at open."""

    def __init__(self, obj: RemoteObject, directory: str | None = None) -> None:
        self.obj, self.url = obj, obj.url
        self.key = f"{obj.url}#{obj.version}"  # cached blocks of two versions never mix
        self.mirror = Mirror(obj.size, directory)
        self.mapping = self.mirror.mapping
        self.base = np.frombuffer(self.mapping, np.uint8)[: obj.size]
        self.whole = False
        self.opened: Any = None  # the reader's _OpenedFile, once parsed

    def fill(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Fetch the byte ``ranges`` into the map (at most ``_PIECE`` per request)."""
        pieces = [
            (at, min(at + _PIECE, end)) for start, end in ranges for at in range(start, end, _PIECE)
        ]
        for (start, _), data in zip(pieces, self.obj.read_ranges(pieces)):
            self.write(start, data)

    def write(self, start: int, data: bytes | memoryview) -> None:
        """Put ``data`` at ``start`` in the map. Raises LoadError naming the directory
        when the disk under a file-backed map has no room for it."""
        self.mirror.reserve(start, start + len(data), self.url)
        self.mapping[start : start + len(data)] = data

    def skeleton(self) -> str:
        """Fetch what parsing the object needs (its head, footer and messages' metadata),
        or the whole object when it is not an uncompressed Arrow IPC file; returns its
        kind, ``"file"`` or ``"stream"``. Raises ``LoadError`` naming the URL for an object
        that is not Arrow IPC, after reading its first and last bytes."""
        size = self.obj.size
        self.fill([(0, min(8, size)), (max(0, size - 10), size)])
        kind = framing_of(lambda n, at: bytes(self.mapping[at : min(at + n, size)]), size, self.url)
        if kind == "file":
            (length,) = struct.unpack_from("<i", self.mapping, size - 10)
            self.fill([(size - 10 - length, size - 10)])
            blocks = _footer_blocks(self.mapping, size - 10 - length, length)
            if blocks is not None:
                dictionaries, batches = blocks
                self.fill(
                    [(off, off + meta + body) for off, meta, body in dictionaries]
                    + [(off, off + meta) for off, meta, _ in batches]
                )
                if not any(_compressed(self.mapping, off, meta) for off, meta, _ in batches):
                    return kind
        self.fill([(0, size)])
        self.whole = True
        return kind

    def small_buffers(self, batches: Sequence[Any]) -> None:
        """Fetch every buffer of ``batches`` (parsed from the map) but the bulk ones."""
        address = self.base.ctypes.data
        ranges = []
        for batch in batches:
            for column in batch.columns:
                bulk = _bulk_buffer(column)
                for buf in column.buffers():
                    if buf is not None and buf.size and (bulk is None or buf.address != bulk):
                        start = buf.address - address
                        ranges.append((start, start + buf.size))
        self.fill(_merged(ranges))


class _BlockParts:
    """Where block k of a file keeps its bulk: per (column, record batch) piece, its byte
    range in the file and the rows [lo, hi) of the batch it holds."""

    def __init__(self, file: int, local: int, parts: list[tuple[int, int, int, int, int, int]]):
        self.file, self.local = file, local
        self.parts = parts  # (column, batch, lo, hi, start, end)
        self.ranges = [(start, end) for *_, start, end in parts]
        self.nbytes = sum(end - start for start, end in self.ranges)


class RemoteRows:
    """The remote files of a dataset and its blocks' bulk: ``ensure(rows)`` fetches the
    blocks of ``rows`` that are not there yet; ``present[k]`` marks block k fetched (a
    ``Prefetch`` fetches them ahead of a loader). ``opened``: the dataset's
    ``_OpenedFile``s (over the ``files``' maps); ``bounds``: its block boundaries (rows);
    ``per_file``: each file's own block boundaries; ``verify``: check each block's CRC-32
    as it arrives; ``memory_bytes``: the bytes of blocks to keep in memory (None: all).
    ``bounded``: the bulk is larger than that, so loaders let go of blocks after use
    (``release``); ``pinned[k]`` marks block k read through Python (``pin``), never let
    go. ``within``: (the ``RemoteRows`` of a dataset of several files, the first block of
    these files there) for one of its ``file_datasets``: the maps are the same, so the
    marks, locks, memory and readers are that dataset's (``root``, from ``offset``)."""

    def __init__(
        self,
        files: Sequence[RemoteFile],
        opened: Sequence[Any],
        bounds: npt.NDArray[np.int64],
        per_file: Sequence[npt.NDArray[np.int64]],
        cache: BlockCache,
        verify: bool,
        memory_bytes: int | None = None,
        within: tuple[RemoteRows, int] | None = None,
    ) -> None:
        pa = import_pyarrow()
        self.files, self.cache, self.bounds = list(files), cache, bounds
        self._opened = list(opened)
        self._sums = [
            file_checksums(pa, s.path, s.schema, s.batches, s.rows) if verify else None
            for s in opened
        ]
        self.blocks: list[_BlockParts] = []
        for f, (remote, s, own) in enumerate(zip(files, opened, per_file)):
            for local in range(len(own) - 1):
                parts = (
                    []
                    if remote.whole
                    else _bulk_parts(s, remote, int(own[local]), int(own[local + 1]))
                )
                self.blocks.append(_BlockParts(f, local, parts))
        n = len(self.blocks)
        self.nbytes = self.block_nbytes()
        self.root: RemoteRows = self
        self.offset = 0
        self.memory_bytes: int | None
        self.bounded: bool
        self.table: BlockTable
        if within is not None:
            self.root, self.offset = within[0].root, within[0].offset + within[1]
            self.table = self.root.table
            self.memory_bytes, self.bounded = self.root.memory_bytes, self.root.bounded
        else:
            # The blocks' life cycle, shared with worker processes forked later.
            self.table = BlockTable([not b.parts for b in self.blocks])
            self.memory_bytes = memory_bytes
            self.bounded = (
                memory_bytes is not None and can_let_go() and int(self.nbytes.sum()) > memory_bytes
            )
        mine = slice(self.offset, self.offset + n)
        # This dataset's marks (views of the table's), to read.
        self.present = self.table.present[mine]
        self.pinned = self.table.pinned[mine]
        self.holds = self.table.holds[mine]
        self.needs = self.table.needs[mine]
        # Told each block this process fetched and checked (the dataset's checks).
        self.checked: Callable[[int], None] | None = None
        self._pid = -1
        self._after_fork()

    def _after_fork(self) -> None:
        """Threads of this process: in a worker process forked while the parent fetched,
        the parent's fetching threads are not there."""
        if self._pid != os.getpid():
            self._pool: concurrent.futures.ThreadPoolExecutor | None = None
            self._pool_lock = threading.Lock()
            self._pid = os.getpid()

    def block_nbytes(self) -> npt.NDArray[np.int64]:
        """The bulk bytes of each block (what fetching it downloads)."""
        return np.array([b.nbytes for b in self.blocks], np.int64)

    def blocks_of(self, rows: int | npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The blocks of ``rows`` (a row, an array of them), each once."""
        return np.unique(np.searchsorted(self.bounds, np.atleast_1d(rows), side="right") - 1)

    def held_bytes(self) -> int:
        """The bulk bytes of the blocks in memory now (of all files of ``root``)."""
        return int(self.root.nbytes[self.root.present != 0].sum())

    def pin(self, rows: int | npt.NDArray[np.int64]) -> None:
        """Mark the blocks of ``rows`` as read through Python before they are read: what
        Python holds may be a view of them, so they are never let go (``bounded`` only;
        not within ``reads_copied``)."""
        if not self.bounded or _COPIED.get():
            return
        blocks = self.blocks_of(rows)
        if not self.pinned[blocks].all():
            self.table.pin(blocks + self.offset)

    @contextlib.contextmanager
    def holding(self, rows: int | npt.NDArray[np.int64]) -> Any:
        """Keep the blocks of ``rows`` from being let go while a read through Python
        copies them (between its fetch and its read): counted in ``holds``, which every
        process sees (``bounded`` only)."""
        if not self.bounded:
            yield
            return
        blocks = self.blocks_of(rows) + self.offset
        self.table.hold(blocks, 1)
        try:
            yield
        finally:
            self.table.hold(blocks, -1)

    def release(self, k: int, wait: bool = True) -> bool | None:
        """Let go of block ``k``'s bulk (its pages back to the system, its mark cleared)
        unless it is pinned, held, needed by an iteration or not there
        (``BlockTable.let_go``); it is fetched again when next needed. Returns whether it
        did; None when another thread or process fetches or lets go of it now and
        ``wait`` is False, or another process does: try again later."""
        block = self.blocks[k]
        if not self.bounded or not block.parts:
            return False
        mapping = self.files[block.file].mapping

        def drop() -> None:
            for start, end in block.ranges:  # whole pages only: their ends are shared
                lo = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
                hi = end // mmap.PAGESIZE * mmap.PAGESIZE
                if lo < hi and _MADV_REMOVE is not None:
                    mapping.madvise(_MADV_REMOVE, lo, hi - lo)

        return self.table.let_go(k + self.offset, drop, wait)

    def ensure(self, rows: int | npt.NDArray[np.int64]) -> None:
        """Fetch the blocks of ``rows`` that are not there yet (several at once); returns
        when all are. Raises ``LoadError`` naming the URL (and block) that failed."""
        blocks = self.blocks_of(rows)
        missing = blocks[self.present[blocks] == 0]
        if len(missing):
            self._after_fork()
        if len(missing) == 1:
            self.fetch(int(missing[0]))
        elif len(missing):
            futures = [self.pool().submit(self.fetch, int(k)) for k in missing]
            # The first failure is raised as it comes, not after the fetches listed before it.
            concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
            for future in [f for f in futures if f.done()] + futures:
                future.result()

    def fetch(self, k: int, wanted: Callable[[], bool] | None = None) -> None:
        """Fetch block ``k`` unless it is there (one thread of one process at a time per
        block: ``BlockTable.fetching``), or ``wanted()`` (asked under its lock) says it is
        not needed any more."""
        if self.present[k]:
            return
        with self.table.fetching(k + self.offset, wanted) as mine:
            if mine:
                self._fetch(k)
        if mine and self.checked is not None and self._sums[self.blocks[k].file] is not None:
            self.checked(k)

    def _fetch(self, k: int) -> None:
        """Fetch block ``k`` into the map (this process holds its locks)."""
        block = self.blocks[k]
        remote = self.files[block.file]
        data = self.cache.get(
            remote.key,
            block.local,
            fetch=lambda: b"".join(remote.obj.read_ranges(block.ranges)),
            check=lambda data: self._check(k, data),
        )
        at, view = 0, memoryview(data)
        for start, end in block.ranges:
            remote.write(start, view[at : at + end - start])
            at += end - start

    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        """The threads that fetch blocks (made on first use)."""
        self._after_fork()
        with self._pool_lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    MAX_CONCURRENCY, thread_name_prefix="fastload-blocks"
                )
            return self._pool

    def _check(self, k: int, data: bytes | memoryview) -> None:
        """Raise ``LoadError`` unless the bulk ``data`` of block ``k`` matches its
        checksum (with the small buffers already in the map)."""
        block = self.blocks[k]
        if len(data) != block.nbytes:
            raise LoadError(
                f"{self.files[block.file].url}: block {block.local}: {len(data)} bytes "
                f"for {block.nbytes}",
                source=self.files[block.file].url,
            )
        sums = self._sums[block.file]
        if sums is None:
            return
        pa = import_pyarrow()
        opened = self._opened[block.file]
        a, b = int(sums.bounds[block.local]), int(sums.bounds[block.local + 1])
        columns = _block_columns(pa, opened, block, data, a, b)
        if block_checksums(pa, columns, [0, b - a])[0] != sums.sums[block.local]:
            raise LoadError(
                f"{self.files[block.file].url}: block {block.local} (rows {a}..{b - 1}) does "
                f"not match its checksum: the object is corrupt, or was damaged on its way",
                source=self.files[block.file].url,
            )


_running: weakref.WeakSet[Prefetch] = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    """Stop fetching ahead before the interpreter finalizes (as ``readahead.py`` does)."""
    for prefetch in list(_running):
        prefetch.close()


class Prefetch:
    """Fetching ahead of one loader iteration over ``order[start:]`` (rows of the datasets
    of ``remotes``, each a ``RemoteRows``): their blocks in the order the rows first need
    them, ``AHEAD_BLOCKS`` in flight or fetched ahead of the first one missing (of a
    ``bounded`` dataset, only while what it holds fits its ``memory_bytes``; the first
    one missing always).

    ``gate[0]``: the first position of ``order`` whose blocks are not all there yet
    (``len(order)`` once all are), from which the engine's native run claims no item.
    When fetching fails for good, the gate opens and ``check(rows)``, run on each step
    before it is handed out, raises what failed for a step the run may have read before
    its blocks were there. ``delivered(step)`` (steps from ``first_step`` on, in any
    order; ``step_end(step)``: the position past its last item) lets go of the blocks of
    a bounded dataset whose last step was delivered, unless another iteration still
    reads them. Over the budget, the first block missing is fetched only once the gate
    is within ``slack`` positions of what was delivered (the loader would wait for it):
    a slow consumer does not let the gate walk the epoch. ``close()`` stops it."""

    def __init__(
        self,
        remotes: Sequence[RemoteRows],
        order: npt.NDArray[np.int64],
        start: int,
        first_step: int = 0,
        step_end: Callable[[int], int] | None = None,
        slack: int = 0,
    ) -> None:
        self.remotes = list(remotes)
        rows = np.asarray(order, np.int64)[start:]
        uses = [BlockUses(remote.bounds, rows, start) for remote in self.remotes]
        self._last_of = []  # per remote, the last position that reads each block (-1: none)
        self._index_of = []  # per remote, each block's place in ``_need`` (-1: none)
        for remote, used in zip(self.remotes, uses):
            last_of = np.full(len(remote.blocks), -1, np.int64)
            last_of[used.blocks] = used.last
            self._last_of.append(last_of)
        # The blocks of all of them by first use (of two at one position, the first
        # remote's first).
        first = np.concatenate([u.first for u in uses])
        by_first = np.argsort(first, kind="stable")
        self._need = np.concatenate([u.blocks for u in uses])[by_first]
        self._owner = np.concatenate([np.full(len(u), r, np.int64) for r, u in enumerate(uses)])
        self._owner = self._owner[by_first]
        self._first = first[by_first]
        self._last = np.concatenate([u.last for u in uses])[by_first]
        for r, remote in enumerate(self.remotes):
            index_of = np.full(len(remote.blocks), -1, np.int64)
            mine = np.flatnonzero(self._owner == r)
            index_of[self._need[mine]] = mine
            self._index_of.append(index_of)
        self._passed = 0  # the blocks before it in ``_need`` were there when the gate passed
        self._rows, self._start, self._end = rows, start, len(order)
        self.gate = np.zeros(1, np.int64)
        self.error: BaseException | None = None
        self._failed_at = self._end
        self._stopped = threading.Event()
        self._wake = threading.Event()
        # What was delivered: every position before ``_done`` (steps before its ``low``).
        self._step_end, self._done = step_end, start
        self._delivered = Delivered(first_step)
        self._slack = slack
        self._by_last = np.argsort(self._last, kind="stable")
        self._let_go = 0  # blocks in ``_by_last`` before it were let go (or kept)
        self._busy: list[int] = []  # blocks (in ``_need``) to let go whose locks were taken
        self._lock = threading.Lock()
        self.gated = False  # whether the engine waits at the gate (the loader says)
        self._bounded = any(r.bounded for r in self.remotes)
        if self._bounded:
            self._warn_when_over()
        # The blocks (in ``_need``) this iteration counts as needed in their tables, their
        # places there, and up to where (in ``_need``) the steps about to be loaded were
        # counted (``_want_soon``); taken back when it closes or is dropped.
        self._at = self._need + np.array([r.offset for r in self.remotes], np.int64)[self._owner]
        self._needing = np.zeros(len(self._need), bool)
        self._wanted_to = 0
        self._needs_lock = threading.Lock()
        self._drop_needs = weakref.finalize(
            self,
            _drop_needs,
            [r.table for r in self.remotes],
            self._owner,
            self._at,
            self._needing,
            self._needs_lock,
        )
        self._advance(0)

    def start(self, gated: bool | None = None) -> Prefetch:
        """Start fetching, on a thread of its own (once); ``gated``: whether the engine
        waits at the gate (None: as set before)."""
        if gated is not None:
            self.gated = gated
        if self._bounded:
            self._let_go_of_others()
            self._want_soon()
        threading.Thread(target=self._run, daemon=True, name="fastload-prefetch").start()
        _running.add(self)
        return self

    def close(self) -> None:
        """Stop fetching ahead (what is in flight lands) and take back what this
        iteration counted as needed. Idempotent; waits for no fetch."""
        self._stopped.set()
        self._wake.set()
        self._drop_needs()

    def check(self, rows: npt.NDArray[np.int64]) -> None:
        """Raise what made the fetching fail when ``rows`` (a step's) may have been read
        before their blocks were there: at a position past the gate when it failed."""
        if self.error is not None:
            late = self._rows[self._failed_at - self._start :]
            if np.isin(rows, late).any() or any(
                (r.present[r.blocks_of(rows)] == 0).any() for r in self.remotes
            ):
                raise self.error
        elif (
            self._bounded
            and self.gated
            and any((r.present[r.blocks_of(rows)] == 0).any() for r in self.remotes)
        ):
            # A native run reads a step only past its blocks' ``admit``, and they stay
            # needed until it is delivered: a block missing now breaks the table's rule.
            # Reads without a gate held their blocks while they read (``holding``).
            # What the step read is not handed out. Its blocks fetched again say why, when
            # the store does: the object changed or is gone (the documented LoadError).
            for remote in self.remotes:
                remote.ensure(rows)
            raise RuntimeError(
                "a block of a dataset at a URL was let go while a step read it; the step is "
                "not handed out (please report this)"
            )

    def delivered(self, step: int) -> None:
        """The consumer handed out ``step``: let go of the blocks of bounded datasets that
        no step from the first one not delivered yet reads, unless another iteration
        still reads them."""
        if not self._bounded or self._step_end is None:
            return
        with self._lock:
            if not self._delivered.add(step):
                return
            self._done = min(self._step_end(self._delivered.low - 1), self._end)
            due, self._busy = self._busy, []
            while self._let_go < len(self._by_last):
                j = int(self._by_last[self._let_go])
                if self._last[j] >= self._done:
                    break
                self._let_go += 1
                due.append(j)
            # The consumer does not wait for a fetch to let go of a block of its stripe: a
            # busy block is let go at a later step, or at the last one, waiting.
            last = self._done >= self._end
            self._unneed(due)
            for j in due:
                if self.remotes[self._owner[j]].release(int(self._need[j]), wait=last) is None:
                    self._busy.append(j)
        self._want_soon()
        self._wake.set()

    def _admit(self, i: int) -> bool:
        """The gate passes block ``_need[i]`` if it is there: counted as needed by this
        iteration until its last step is delivered (``BlockTable.admit``). False when it is
        not there, or this iteration stopped."""
        remote, k = self.remotes[self._owner[i]], int(self._need[i])
        if not self._bounded:
            return bool(remote.present[k])
        with self._needs_lock:
            if self._stopped.is_set():
                return False
            if self._needing[i]:
                return bool(remote.present[k])
            self._needing[i] = remote.table.admit(int(self._at[i]))
            return bool(self._needing[i])

    def _want_soon(self) -> None:
        """Without a gate (steps read through Python or by worker processes, which hold
        their blocks while they read them), count the blocks of the steps about to be
        loaded as needed, so that no other iteration lets go of what they are about to
        read: up to ``_soon()``, as it moves on with each delivered step."""
        if self.gated or not self._bounded:
            return
        with self._needs_lock:
            if self._stopped.is_set():
                return
            j, soon = self._wanted_to, self._soon()
            while j < len(self._need) and self._first[j] <= soon:
                j += 1
            new = np.arange(self._wanted_to, j)
            new = new[~self._needing[new] & (self._last[new] >= self._done)]
            self._wanted_to = j
            self._needing[new] = True
            for r, remote in enumerate(self.remotes):
                mine = new[self._owner[new] == r]
                if len(mine):
                    remote.table.need(self._at[mine])

    def _unneed(self, due: list[int]) -> None:
        """Take back the needs of the blocks ``due`` (in ``_need``), whose last steps were
        delivered."""
        with self._needs_lock:
            for j in due:
                if self._needing[j]:
                    self._needing[j] = False
                    self.remotes[self._owner[j]].table.unneed(int(self._at[j]))

    def _soon(self) -> int:
        """The last position of the steps about to be loaded: the window past what was
        delivered within which the gate passes blocks (bounded) and blocks are kept for
        steps read without a gate."""
        return self._done + 2 * self._slack

    def _let_go_of_others(self) -> None:
        """Let go of the blocks of bounded datasets held from before (an iteration
        dropped midway) that this one does not read soon (among the first
        ``AHEAD_BLOCKS`` past its gate) and that no iteration may read now."""
        for r, remote in enumerate(self.remotes):
            if not remote.bounded:
                continue
            soon = self._index_of[r] < self._passed + AHEAD_BLOCKS
            soon &= self._index_of[r] >= 0
            for k in np.flatnonzero((remote.present != 0) & (remote.pinned == 0) & ~soon):
                remote.release(int(k))

    def _warn_when_over(self) -> None:
        """Warn when the order reads more bytes of a bounded dataset at once (the blocks
        read both before and after some position: a wave) than its ``memory_bytes``."""
        for r, remote in enumerate(self.remotes):
            mine = self._owner == r
            if not remote.bounded or not mine.any():
                continue
            sizes = remote.nbytes[self._need[mine]]
            at = np.concatenate([self._first[mine], self._last[mine] + 1])
            change = np.concatenate([sizes, -sizes])
            count = np.concatenate([np.ones_like(sizes), -np.ones_like(sizes)])
            by = np.lexsort((change, at))  # at one position, what ends before what starts
            held = np.cumsum(change[by])
            peak = int(held.max())
            if peak > int(remote.memory_bytes or 0):
                blocks = int(np.cumsum(count[by])[int(held.argmax())])
                warnings.warn(
                    _over_message(remote, peak, blocks, len(sizes)), UserWarning, stacklevel=2
                )
                return

    def _wanted(self, r: int, k: int) -> Callable[[], bool]:
        """Whether block ``k`` of remote ``r`` is still to be read by this iteration (a
        fetch queued ahead may start after the steps that read it were delivered)."""
        last_of = self._last_of[r]
        return lambda: not self._stopped.is_set() and last_of[k] >= self._done

    def _present(self, i: int) -> bool:
        return bool(self.remotes[self._owner[i]].present[self._need[i]])

    def _advance(self, i: int) -> int:
        """The index in ``_need`` of the first block missing from ``i`` on; sets the gate.
        Each block is passed through ``_admit``, so that ``release`` sees it needed or the
        gate sees it gone; a block being fetched is not there yet: the gate does not wait
        for one fetch while others land."""
        while i < len(self._need):
            # Bounded: a block passed is kept for this iteration until its last step is
            # delivered, so the gate passes only the blocks of the steps about to be loaded
            # (what another iteration fetched ahead is not kept for this one's far future).
            if self._bounded and self._first[i] > self._soon():
                break
            # Its steps all delivered (read ahead of the gate by worker processes or
            # through Python, and let go since): nothing to keep.
            if self._last[i] >= self._done and not self._admit(i):
                break
            i += 1
            self._passed = i
        self.gate[0] = self._first[i] if i < len(self._need) else self._end
        return i

    def _room(self, running: Mapping[int, Any]) -> list[int | None]:
        """Per remote, the bytes it may still fetch within its ``memory_bytes`` (None: no
        bound), what is in flight counted as held."""
        room: list[int | None] = []
        for r, remote in enumerate(self.remotes):
            if not remote.bounded:
                room.append(None)
                continue
            flying = sum(int(remote.nbytes[self._need[j]]) for j in running if self._owner[j] == r)
            room.append(int(remote.memory_bytes or 0) - remote.held_bytes() - flying)
        return room

    def _run(self) -> None:
        running: dict[int, concurrent.futures.Future[None]] = {}
        i = self._passed  # the gate never moves back: what it passed may be read now
        try:
            while not self._stopped.is_set():
                i = self._advance(i)
                if i >= len(self._need):
                    return
                room = self._room(running) if self._bounded else []
                for j in range(i, min(i + AHEAD_BLOCKS, len(self._need))):
                    if j in running or self._present(j):
                        continue
                    owner = int(self._owner[j])
                    remote = self.remotes[owner]
                    left = room[owner] if room else None
                    if left is not None:
                        size = int(remote.nbytes[self._need[j]])
                        # Over the budget, only the block the loader is about to wait for.
                        if size > left and (j > i or self._first[i] > self._done + self._slack):
                            break
                        room[owner] = left - size
                    k = int(self._need[j])
                    running[j] = remote.pool().submit(remote.fetch, k, self._wanted(owner, k))
                    running[j].add_done_callback(lambda _: self._wake.set())
                # Until a fetch ends or a step is delivered (room, when held back by memory);
                # what ends from the clear on wakes the next wait.
                self._wake.wait(0.1)
                self._wake.clear()
                for j in [j for j, f in running.items() if f.done()]:
                    running.pop(j).result()
        except BaseException as exc:  # what it could not fetch fails where it is read
            self._failed_at = int(self.gate[0])
            self.error = exc
            self.gate[0] = self._end
        finally:
            for future in running.values():
                future.cancel()


def _drop_needs(
    tables: Sequence[BlockTable],
    owner: npt.NDArray[np.int64],
    at: npt.NDArray[np.int64],
    needing: npt.NDArray[np.bool_],
    lock: threading.Lock,
) -> None:
    """Take back an iteration's needs (``needing``: its blocks counted; ``at``: their
    places in the table of ``tables[owner]``), once: when it closes, or is dropped."""
    with lock:
        for r, table in enumerate(tables):
            mine = needing & (owner == r)
            if mine.any():
                table.unneed(at[mine])
        needing[:] = False


def _over_message(remote: RemoteRows, peak: int, blocks: int, used: int) -> str:
    """What to do about an order that holds ``peak`` bytes (``blocks`` blocks of the
    ``used`` that it reads) of ``remote`` at once, over its ``memory_bytes``."""
    limit = int(remote.memory_bytes or 0)
    largest = readable_bytes(int(remote.nbytes.max()))
    head = (
        f"{remote.files[0].url}: this order reads a wave of {blocks} blocks (up to "
        f"{largest} each, {readable_bytes(peak)} in all) at once, more than "
        f"memory_bytes={limit:,} ({readable_bytes(limit)}): the blocks of a wave stay "
        f"until its last step that reads them was delivered, so the loader holds more "
        f"than memory_bytes. "
    )
    if blocks >= used > 8:
        return head + (
            "A random order (shuffle=True) reads every block all epoch: use "
            "shuffle='quasi' (blocks in random order, shuffled a wave at a time)"
        )
    return head + (
        f"Open it with memory_bytes of at least {readable_bytes(peak)} (twice that for "
        f"full speed), or write it with smaller blocks (block_bytes)"
    )


def open_objects(
    url: str,
    storage_options: Mapping[str, Any] | None,
    timeout: float,
    parse: Callable[[RemoteFile, str], None],
    directory: str | None = None,
) -> list[RemoteFile]:
    """The objects ``url`` names (``resolve_urls``), each mirrored (in files in
    ``directory`` when given: ``RemoteFile``) with its skeleton fetched and then
    ``parse(file, kind)`` called (kind: ``"file"`` or ``"stream"``), several objects at
    once."""
    objects = resolve_urls(url, storage_options, timeout=timeout)
    files = [RemoteFile(obj, directory) for obj in objects]

    def opened(f: RemoteFile) -> RemoteFile:
        parse(f, f.skeleton())
        return f

    if len(files) == 1:
        return [opened(files[0])]
    with concurrent.futures.ThreadPoolExecutor(MAX_CONCURRENCY) as pool:
        return list(pool.map(opened, files))


# -- the Arrow file's footer and messages ----------------------------------------------------


def _table_field(buf: Any, table: int, field: int) -> int | None:
    """The position of field ``field`` of the flatbuffer table at ``table``, or None."""
    (soffset,) = struct.unpack_from("<i", buf, table)
    vtable = table - soffset
    vsize, _ = struct.unpack_from("<HH", buf, vtable)
    if 4 + 2 * field + 2 > vsize:
        return None
    (offset,) = struct.unpack_from("<H", buf, vtable + 4 + 2 * field)
    return table + offset if offset else None


def _deref(buf: Any, at: int) -> int:
    return at + struct.unpack_from("<I", buf, at)[0]


def _footer_blocks(
    buf: Any, start: int, length: int
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]] | None:
    """The (offset, metadata length, body length) of the dictionary and record batch
    blocks the footer at ``buf[start : start + length]`` lists, or None when it cannot
    be read as one."""
    try:
        footer = memoryview(buf)[start : start + length]
        table = _deref(footer, 0)
        found = []
        for field in (2, 3):  # Footer.dictionaries, Footer.recordBatches
            at = _table_field(footer, table, field)
            blocks = []
            if at is not None:
                vector = _deref(footer, at)
                (count,) = struct.unpack_from("<I", footer, vector)
                for n in range(count):
                    off, meta, _, body = struct.unpack_from("<qiiq", footer, vector + 4 + 24 * n)
                    blocks.append((off, meta, body))
            found.append(blocks)
        return found[0], found[1]
    except struct.error:
        return None


def _compressed(buf: Any, offset: int, meta: int) -> bool:
    """Whether the record batch message at ``offset`` (``meta`` bytes of metadata) says its
    buffers are compressed (``RecordBatch.compression``); True when it cannot be read."""
    try:
        message = memoryview(buf)[offset : offset + meta]
        at = 8 if struct.unpack_from("<I", message, 0)[0] == 0xFFFFFFFF else 4
        body = message[at:]
        table = _deref(body, 0)
        header = _table_field(body, table, 2)  # Message.header
        if header is None:
            return True
        return _table_field(body, _deref(body, header), 3) is not None  # .compression
    except struct.error:
        return True


# -- the bulk of a block ---------------------------------------------------------------------


def _bulk_buffer(column: Any) -> int | None:
    """The address of the bulk buffer of a column (the values of a binary column, the data
    of a fixed-size binary one, without nulls), or None: its buffers are all small."""
    pa = import_pyarrow()
    t, buffers = column.type, column.buffers()
    if buffers[0] is not None or column.offset:
        return None
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return buffers[2].address if buffers[2] is not None else None
    if pa.types.is_fixed_size_binary(t):
        return buffers[1].address if buffers[1] is not None else None
    return None


def _row_range(column: Any, lo: int, hi: int) -> tuple[int, int]:
    """The byte range of rows [lo, hi) in the bulk buffer of ``column``."""
    pa = import_pyarrow()
    t, buffers = column.type, column.buffers()
    if pa.types.is_fixed_size_binary(t):
        return lo * t.byte_width, hi * t.byte_width
    dtype = np.int64 if pa.types.is_large_binary(t) else np.int32
    offsets = np.frombuffer(buffers[1], dtype)
    return int(offsets[lo]), int(offsets[hi])


def _bulk_parts(
    opened: Any, remote: RemoteFile, a: int, b: int
) -> list[tuple[int, int, int, int, int, int]]:
    """The bulk pieces of rows [a, b) of a file: (column, batch, lo, hi, start, end)."""
    address, parts, row = remote.base.ctypes.data, [], 0
    for n, batch in enumerate(opened.batches):
        lo, hi = max(a, row) - row, min(b, row + batch.num_rows) - row
        if lo < hi:
            for c, column in enumerate(batch.columns):
                bulk = _bulk_buffer(column)
                if bulk is not None:
                    first, last = _row_range(column, lo, hi)
                    parts.append((c, n, lo, hi, bulk - address + first, bulk - address + last))
        row += batch.num_rows
    parts.sort(key=lambda p: (p[0], p[1]))
    return parts


def _block_columns(
    pa: Any, opened: Any, block: _BlockParts, data: Any, a: int, b: int
) -> list[Any]:
    """Rows [a, b) of each column of a file, the bulk ones rebuilt from ``data`` (the
    block's bulk, in ``block.parts`` order), the others sliced from the map."""
    view, at = memoryview(data), 0
    bulk: dict[int, list[Any]] = {}
    for c, n, lo, hi, start, end in block.parts:
        part = view[at : at + end - start]
        at += end - start
        bulk.setdefault(c, []).append(_rebuilt(pa, opened.batches[n].column(c), lo, hi, part))
    columns, row = [], 0
    for c in range(len(opened.schema)):
        if c in bulk:
            pieces = bulk[c]
        else:
            pieces, row = [], 0
            for batch in opened.batches:
                lo, hi = max(a, row) - row, min(b, row + batch.num_rows) - row
                if lo < hi:
                    pieces.append(batch.column(c).slice(lo, hi - lo))
                row += batch.num_rows
        columns.append(pieces[0] if len(pieces) == 1 else pa.concat_arrays(pieces))
    return columns


def _rebuilt(pa: Any, column: Any, lo: int, hi: int, part: memoryview) -> Any:
    """Rows [lo, hi) of a bulk ``column`` over the bytes ``part`` instead of its buffer."""
    t = column.type
    if pa.types.is_fixed_size_binary(t):
        return pa.Array.from_buffers(t, hi - lo, [None, pa.py_buffer(part)])
    dtype = np.int64 if pa.types.is_large_binary(t) else np.int32
    offsets = np.frombuffer(column.buffers()[1], dtype)[lo : hi + 1]
    rebased = (offsets - offsets[0]).astype(dtype)
    return pa.Array.from_buffers(t, hi - lo, [None, pa.py_buffer(rebased), pa.py_buffer(part)])


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` sorted, those closer than ``_GAP`` joined."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1] + _GAP:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
