"""Packed datasets at a URL: each object mirrored in this process's memory, its bulk
fetched block by block as the rows are read.

``open(url)`` reads, per object, what Arrow needs to parse the file (the footer, the
messages' metadata) and every buffer but the bulk ones (the values of binary columns,
the data of fixed-size columns): offsets, labels, shapes, a few bytes per row. The bulk
is fetched by **block** (the format's unit), one ranged request per column and block::

    RemoteFile (one object)            anonymous shared map of the object's size
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

An object that is not an Arrow IPC file (a stream, ``.arrows``), or whose batches are
compressed, is fetched whole at open.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import mmap
import os
import shutil
import struct
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from fastload._storage.arrow_types import import_pyarrow
from fastload._storage.blockcache import BlockCache
from fastload._storage.checksums import block_checksums, file_checksums
from fastload._storage.framing import framing_of
from fastload._storage.remote import MAX_CONCURRENCY, RemoteObject, resolve_urls
from fastload.errors import LoadError

__all__ = ["RemoteFile", "RemoteRows", "Prefetch", "default_cache", "open_objects"]

_MAGIC = b"ARROW1"
_PIECE = 8 << 20  # the largest range fetched in one request at open
_GAP = 64 << 10  # small buffers this close are fetched in one range
_LOCKS = 64  # per-block locks, striped
AHEAD_BLOCKS = 16  # blocks a loader's prefetch keeps in flight or fetched ahead
DEFAULT_CACHE_BYTES = 50 << 30  # at most; never more than half the disk's free space


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
    """One object (``RemoteObject``) mirrored in memory: ``mapping`` (an anonymous shared
    map of its size) and ``base`` (a uint8 view of it), filled by ``fill`` at open and by
    ``RemoteRows.fetch`` block by block. ``whole``: the object was fetched whole at
    open."""

    def __init__(self, obj: RemoteObject) -> None:
        self.obj, self.url = obj, obj.url
        self.key = f"{obj.url}#{obj.version}"  # cached blocks of two versions never mix
        self.mapping = mmap.mmap(-1, max(obj.size, 1))
        self.base = np.frombuffer(self.mapping, np.uint8)[: obj.size]
        self.whole = False
        self.opened: Any = None  # the reader's _OpenedFile, once parsed

    def fill(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Fetch the byte ``ranges`` into the map (at most ``_PIECE`` per request)."""
        pieces = [
            (at, min(at + _PIECE, end)) for start, end in ranges for at in range(start, end, _PIECE)
        ]
        for (start, end), data in zip(pieces, self.obj.read_ranges(pieces)):
            self.mapping[start:end] = data

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
    as it arrives."""

    def __init__(
        self,
        files: Sequence[RemoteFile],
        opened: Sequence[Any],
        bounds: npt.NDArray[np.int64],
        per_file: Sequence[npt.NDArray[np.int64]],
        cache: BlockCache,
        verify: bool,
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
        # Marks shared with worker processes forked later (an anonymous shared map).
        self._marks_map = mmap.mmap(-1, max(len(self.blocks), 1))
        self.present = np.frombuffer(self._marks_map, np.uint8)[: len(self.blocks)]
        self.present[:] = [not b.parts for b in self.blocks]
        # Told each block this process fetched and checked (the dataset's checks).
        self.checked: Callable[[int], None] | None = None
        self._pid = -1
        self._after_fork()

    def _after_fork(self) -> None:
        """Locks and threads of this process: in a worker process forked while the parent
        fetched, the parent's locks may be held by threads that are not there."""
        if self._pid != os.getpid():
            self._locks = [threading.Lock() for _ in range(_LOCKS)]
            self._pool: concurrent.futures.ThreadPoolExecutor | None = None
            self._pool_lock = threading.Lock()
            self._pid = os.getpid()

    def block_nbytes(self) -> npt.NDArray[np.int64]:
        """The bulk bytes of each block (what fetching it downloads)."""
        return np.array([b.nbytes for b in self.blocks], np.int64)

    def blocks_of(self, rows: int | npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The blocks of ``rows`` (a row, an array of them), each once."""
        return np.unique(np.searchsorted(self.bounds, np.atleast_1d(rows), side="right") - 1)

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
            for future in [self.pool().submit(self.fetch, int(k)) for k in missing]:
                future.result()

    def fetch(self, k: int) -> None:
        """Fetch block ``k`` unless it is there (one thread at a time per block)."""
        if self.present[k]:
            return
        with self._locks[k % _LOCKS]:
            if self.present[k]:
                return
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
                remote.mapping[start:end] = view[at : at + end - start]
                at += end - start
            self.present[k] = 1
        if self.checked is not None and self._sums[block.file] is not None:
            self.checked(k)

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
    them, ``AHEAD_BLOCKS`` in flight or fetched ahead of the first one missing.

    ``gate[0]``: the first position of ``order`` whose blocks are not all there yet
    (``len(order)`` once all are), from which the engine's native run claims no item.
    When fetching fails for good, the gate opens and ``check(rows)``, run on each step
    before it is handed out, raises what failed for a step the run may have read before
    its blocks were there. ``close()`` stops it."""

    def __init__(
        self, remotes: Sequence[RemoteRows], order: npt.NDArray[np.int64], start: int
    ) -> None:
        self.remotes = list(remotes)
        rows = np.asarray(order, np.int64)[start:]
        needs, firsts, owners = [], [], []
        for r, remote in enumerate(self.remotes):
            blocks = np.searchsorted(remote.bounds, rows, side="right") - 1
            need, first = np.unique(blocks, return_index=True)
            needs.append(need)
            firsts.append(first)
            owners.append(np.full(len(need), r, np.int64))
        first = np.concatenate(firsts)
        by_first = np.argsort(first, kind="stable")
        self._need = np.concatenate(needs)[by_first]
        self._owner = np.concatenate(owners)[by_first]
        self._first = first[by_first] + start
        self._rows, self._start, self._end = rows, start, len(order)
        self.gate = np.zeros(1, np.int64)
        self.error: BaseException | None = None
        self._failed_at = self._end
        self._stopped = threading.Event()
        self._advance(0)

    def start(self) -> Prefetch:
        """Start fetching, on a thread of its own (once)."""
        threading.Thread(target=self._run, daemon=True, name="fastload-prefetch").start()
        _running.add(self)
        return self

    def close(self) -> None:
        """Stop fetching ahead (what is in flight lands). Idempotent, never blocks."""
        self._stopped.set()

    def check(self, rows: npt.NDArray[np.int64]) -> None:
        """Raise what made the fetching fail when ``rows`` (a step's) may have been read
        before their blocks were there: at a position past the gate when it failed."""
        if self.error is None:
            return
        late = self._rows[self._failed_at - self._start :]
        if np.isin(rows, late).any() or any(
            (r.present[r.blocks_of(rows)] == 0).any() for r in self.remotes
        ):
            raise self.error

    def _present(self, i: int) -> bool:
        return bool(self.remotes[self._owner[i]].present[self._need[i]])

    def _advance(self, i: int) -> int:
        """The index in ``_need`` of the first block missing from ``i`` on; sets the gate."""
        while i < len(self._need) and self._present(i):
            i += 1
        self.gate[0] = self._first[i] if i < len(self._need) else self._end
        return i

    def _run(self) -> None:
        running: dict[int, concurrent.futures.Future[None]] = {}
        i = 0
        try:
            while not self._stopped.is_set():
                i = self._advance(i)
                if i >= len(self._need):
                    return
                for j in range(i, min(i + AHEAD_BLOCKS, len(self._need))):
                    if j not in running and not self._present(j):
                        remote = self.remotes[self._owner[j]]
                        running[j] = remote.pool().submit(remote.fetch, int(self._need[j]))
                done, _ = concurrent.futures.wait(
                    list(running.values()), 0.1, concurrent.futures.FIRST_COMPLETED
                )
                for j in [j for j, f in running.items() if f in done]:
                    running.pop(j).result()
        except BaseException as exc:  # what it could not fetch fails where it is read
            self._failed_at = int(self.gate[0])
            self.error = exc
            self.gate[0] = self._end
        finally:
            for future in running.values():
                future.cancel()


def open_objects(
    url: str,
    storage_options: Mapping[str, Any] | None,
    timeout: float,
    parse: Callable[[RemoteFile, str], None],
) -> list[RemoteFile]:
    """The objects ``url`` names (``resolve_urls``), each mirrored with its skeleton
    fetched and then ``parse(file, kind)`` called (kind: ``"file"`` or ``"stream"``),
    several objects at once."""
    files = [RemoteFile(obj) for obj in resolve_urls(url, storage_options, timeout=timeout)]

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
