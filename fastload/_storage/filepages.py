"""Where the blocks of a packed dataset lie in its memory-mapped files, and what the
kernel is told about them: read this block now, let go of that one.

A block's rows take one byte range in each column's buffers (a few ranges per record
batch it overlaps). ``load`` reads a piece of it into the page cache without copying it
into the process (the kernel asked to read it and the next piece exactly, then
``sendfile`` to ``/dev/null`` waiting for it: sequential, at the disk's rate, nothing read
past the block, and blocking only the caller, without the GIL); ``drop`` unmaps it from this process
(``madvise(MADV_DONTNEED)``, so it leaves the resident memory) and drops it from the page
cache (``posix_fadvise(DONTNEED)``; pages another process maps stay). Both are hints: a
page let go is read again at its next access, so what is read never depends on them.

A page at the border of two blocks belongs to both: it is read with either and let go
with neither, since a page let go too early is read again with the kernel's read-around
(``read_ahead_kb``, up to megabytes) around it.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from fastload._storage.arrow_types import import_pyarrow
from fastload._storage.memory import memory_limit
from fastload._storage.readahead import ReadAhead
from fastload.errors import LoadError

__all__ = ["FilePages"]

_PAGE = mmap.PAGESIZE
_PIECE = 8 << 20
# The kernel reads at most its read-ahead size (128 KiB by default, or the device's
# largest request when larger) for one ask.
_ASK = 128 << 10

# A byte range of a file of the dataset: (the file's index, start, stop), stop excluded.
Span = tuple[int, int, int]


class MappedFile(Protocol):
    """What ``FilePages`` reads of an opened file (``storage.reader``'s)."""

    @property
    def path(self) -> str: ...

    @property
    def mapping(self) -> mmap.mmap | None: ...

    @property
    def base(self) -> npt.NDArray[np.uint8]: ...

    @property
    def batches(self) -> list[Any]: ...


class FilePages:
    """The blocks of a dataset in its files. ``opened``: the opened files (each with
    ``path``, ``mapping``: its mmap, ``base``: a uint8 numpy view of it, ``batches``);
    ``block_bounds``: the dataset's block boundaries (rows); ``check_block(k)``: checks
    block k against its checksum once, raising ``LoadError`` when it does not match (None:
    nothing to check). ``nbytes``: the files' size."""

    def __init__(
        self,
        opened: Sequence[MappedFile],
        block_bounds: npt.NDArray[np.int64],
        check_block: Callable[[int], object] | None = None,
    ) -> None:
        self._opened = opened
        self._check_block = check_block
        self.block_bounds = block_bounds
        self.nbytes = sum(s.base.size for s in opened)
        # Record batches as (first row, file, batch), to find a row's batch.
        starts: list[int] = []
        self._pieces: list[tuple[int, int, Any]] = []
        row = 0
        for k, file in enumerate(opened):
            for batch in file.batches:
                starts.append(row)
                self._pieces.append((row, k, batch))
                row += batch.num_rows
        self._piece_starts = np.asarray(starts, np.int64)
        self._spans: list[list[Span]] | None = (
            None  # per block: [(file, start, stop)], sorted, merged
        )
        self._lock = threading.Lock()

    def fits_in_memory(self) -> bool:
        """False when the files are larger than the memory this process may use."""
        limit = memory_limit()
        return limit is None or self.nbytes <= limit

    def spans(self) -> list[list[Span]]:
        """Per block, the byte ranges ``(file, start, stop)`` its rows take in the files
        (every column; computed once)."""
        with self._lock:
            if self._spans is None:
                bounds = self.block_bounds
                self._spans = [
                    _merged(self._rows_spans(int(bounds[c]), int(bounds[c + 1])))
                    for c in range(len(bounds) - 1)
                ]
            return self._spans

    def block_nbytes(self) -> npt.NDArray[np.int64]:
        """The bytes each block takes in the files (int64, one per block)."""
        return np.array(
            [sum(stop - start for _, start, stop in spans) for spans in self.spans()], np.int64
        )

    def pieces(self, block: int) -> list[Span]:
        """The page-aligned ranges ``(file, start, stop)`` that ``load`` reads for
        ``block``, at most 8 MiB each (a reader can attend to other work between two)."""
        return [
            (file, at, min(at + _PIECE, stop))
            for file, start, stop in _pages(self.spans()[block], outward=True)
            for at in range(start, stop, _PIECE)
        ]

    def load(self, piece: Span, then: Span | None = None) -> None:
        """Read ``piece`` (one of ``pieces``) into the page cache; returns when it is
        read. The kernel is asked first to read it and the piece ``then`` (the next one
        to load, if any) exactly (``_ask``), so that the disk has that much in flight and
        nothing past them is read; ``sendfile`` then waits for ``piece``. Where
        ``sendfile`` is not available, the call returns once the kernel was asked."""
        file, start, stop = piece
        fd = os.open(self._opened[file].path, os.O_RDONLY)
        try:
            _ask(fd, start, stop)
            if then is not None and then[0] == file:
                _ask(fd, then[1], then[2])
            _read_through(fd, start, stop)
        finally:
            os.close(fd)

    def check(self, block: int) -> bool:
        """Check ``block`` against its checksum ahead of the loader, which then finds it
        checked; True when it matches or there is nothing to check. A block that does not
        match stays unchecked: the loader checks it again before it hands out its rows,
        and raises there, naming them."""
        if self._check_block is None:
            return True
        try:
            self._check_block(block)
        except LoadError:
            return False
        return True

    def drop(self, block: int, keep: npt.ArrayLike = ()) -> None:
        """Let go of ``block`` but the pages of the rows ``keep``."""
        pages = _pages(self.spans()[block], outward=False)
        kept = np.asarray(keep, np.int64)
        if kept.size:
            pages = _subtract(pages, _pages(self._row_spans(kept), outward=True))
        self._let_go(pages)

    def drop_rows(self, block: int, rows: npt.ArrayLike) -> None:
        """Let go of the pages of ``rows`` (rows of ``block``) that lie inside the block."""
        self._let_go(
            _intersect(
                _pages(self._row_spans(rows), outward=True),
                _pages(self.spans()[block], outward=False),
            )
        )

    def read_ahead(self, order: npt.ArrayLike, rows: int, start: int = 0) -> ReadAhead:
        """A ``ReadAhead`` (not started) for loading ``order`` (rows of the dataset,
        ``rows`` a step) from step ``start``, within the memory this process may use."""
        return ReadAhead(self, order, rows, start, memory_limit())

    def _let_go(self, pages: list[Span]) -> None:
        for file in sorted({p[0] for p in pages}):
            mapping = self._opened[file].mapping
            fd = os.open(self._opened[file].path, os.O_RDONLY)
            try:
                for _, start, stop in (p for p in pages if p[0] == file):
                    if mapping is not None and hasattr(mmap, "MADV_DONTNEED"):
                        mapping.madvise(mmap.MADV_DONTNEED, start, stop - start)
                    _fadvise(fd, start, stop - start, "POSIX_FADV_DONTNEED")
            finally:
                os.close(fd)

    def _row_spans(self, rows: npt.ArrayLike) -> list[Span]:
        """The byte ranges of the single ``rows`` (global), sorted and merged."""
        return _merged(
            [span for row in np.unique(rows) for span in self._rows_spans(int(row), int(row) + 1)]
        )

    def _rows_spans(self, lo: int, hi: int) -> list[Span]:
        """The byte ranges ``(file, start, stop)`` of rows [lo, hi) in every column of the
        record batches they lie in (unsorted)."""
        pa = import_pyarrow()
        found: list[Span] = []
        k = max(int(np.searchsorted(self._piece_starts, lo, side="right")) - 1, 0)
        for first, file, batch in self._pieces[k:]:
            if first >= hi:
                break
            a, b = max(lo, first), min(hi, first + batch.num_rows)
            if a >= b:
                continue
            mapped = self._opened[file].base
            for column in batch.columns:
                for address, size in _column_spans(pa, column, a - first, b - a):
                    at = address - mapped.ctypes.data
                    if size > 0 and 0 <= at and at + size <= mapped.size:
                        found.append((file, at, at + size))
        return found


def _read_through(fd: int, start: int, stop: int) -> bool:
    """Read bytes [start, stop) of ``fd`` into the page cache and discard them (``sendfile``
    to ``/dev/null``); False where that is not available."""
    if not hasattr(os, "sendfile"):
        return False
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return False
    try:
        while start < stop:
            sent = os.sendfile(null, fd, start, min(stop - start, 1 << 30))
            if sent <= 0:
                break
            start += sent
    except OSError:
        return False
    finally:
        os.close(null)
    return True


def _ask(fd: int, start: int, stop: int) -> None:
    """Ask the kernel to read bytes [start, stop) of ``fd`` (``posix_fadvise(WILLNEED)``),
    in steps of ``_ASK`` bytes: it reads no more than its read-ahead size for one call,
    and asked this way it reads ahead of nothing (reading a file, its read-ahead goes
    past the end of what is read, by up to ``read_ahead_kb``: megabytes on some
    machines, a fifth more than a 64 MiB block)."""
    for at in range(start, stop, _ASK):
        _fadvise(fd, at, min(_ASK, stop - at), "POSIX_FADV_WILLNEED")


def _fadvise(fd: int, start: int, length: int, advice: str) -> None:
    if hasattr(os, "posix_fadvise") and length > 0:
        os.posix_fadvise(fd, start, length, getattr(os, advice))


def _column_spans(pa: Any, array: Any, first: int, n: int) -> Iterator[tuple[int, int]]:
    """(address, bytes) of the buffers that rows [first, first + n) of ``array`` take (as
    ``checksums._row_bytes`` reads them)."""
    t, start, buffers = array.type, array.offset + first, array.buffers()
    if pa.types.is_fixed_size_binary(t) or pa.types.is_integer(t) or pa.types.is_floating(t):
        yield buffers[1].address + start * t.byte_width, n * t.byte_width
    elif pa.types.is_boolean(t):
        yield buffers[1].address + start // 8, -(-(start + n) // 8) - start // 8
    elif (
        pa.types.is_binary(t)
        or pa.types.is_string(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_large_string(t)
        or pa.types.is_list(t)
        or pa.types.is_large_list(t)
    ):
        large = (
            pa.types.is_large_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_list(t)
        )
        width = 8 if large else 4
        offsets = np.frombuffer(buffers[1], np.int64 if large else np.int32)
        lo, hi = int(offsets[start]), int(offsets[start + n])
        yield buffers[1].address + start * width, (n + 1) * width
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            yield from _column_spans(pa, array.values, lo, hi - lo)
        else:
            yield buffers[2].address + lo, hi - lo


def _merged(spans: Sequence[Span]) -> list[Span]:
    """Sorted, with overlapping or touching ranges joined."""
    out: list[Span] = []
    for file, start, stop in sorted(spans):
        if out and out[-1][0] == file and start <= out[-1][2]:
            out[-1] = (file, out[-1][1], max(out[-1][2], stop))
        else:
            out.append((file, start, stop))
    return out


def _pages(spans: Sequence[Span], outward: bool) -> list[Span]:
    """Byte ranges aligned to pages: every page they touch (``outward``), or only the
    pages they cover entirely; merged."""
    out: list[Span] = []
    for file, start, stop in spans:
        if outward:
            start, stop = start // _PAGE * _PAGE, -(-stop // _PAGE) * _PAGE
        else:
            start, stop = -(-start // _PAGE) * _PAGE, stop // _PAGE * _PAGE
        if stop > start:
            out.append((file, start, stop))
    return _merged(out)


def _subtract(ranges: Sequence[Span], holes: Sequence[Span]) -> list[Span]:
    """``ranges`` less ``holes`` (both sorted and merged)."""
    out: list[Span] = []
    for file, start, stop in ranges:
        for h_file, h_start, h_stop in holes:
            if h_file != file or h_stop <= start or h_start >= stop:
                continue
            if h_start > start:
                out.append((file, start, h_start))
            start = max(start, h_stop)
        if stop > start:
            out.append((file, start, stop))
    return out


def _intersect(ranges: Sequence[Span], other: Sequence[Span]) -> list[Span]:
    """The parts of ``ranges`` inside ``other`` (both sorted and merged)."""
    return [
        (file, max(start, o_start), min(stop, o_stop))
        for file, start, stop in ranges
        for o_file, o_start, o_stop in other
        if o_file == file and max(start, o_start) < min(stop, o_stop)
    ]
