"""What the engine and the loader ask of storage, declared once as protocols.

The planner reads encoded images natively from an object that offers its items as one
buffer (``ContiguousBytes``), as spans of mapped files (``SpannedBytes``) or as files
(``FilePaths``); the loader reads a container block by block (``Blockwise``), checks its
rows (``CheckedRows``) and reads ahead in its files (``PagedFiles``): a packed dataset and
its columns are all three (``PackedRows``). Storage classes inherit the protocols they implement, so
that mypy checks their signatures against these; callers test ``isinstance(x, Protocol)``
rather than probing attribute names. Nothing here imports the rest of fastload.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = [
    "Blockwise",
    "CheckedRows",
    "ContiguousBytes",
    "FilePages",
    "FedRows",
    "FeedSource",
    "FetchedRows",
    "FilePaths",
    "PackedRows",
    "PagedFiles",
    "SpannedBytes",
]

Spans = tuple[list[np.ndarray], np.ndarray | None, np.ndarray, np.ndarray]


@runtime_checkable
class ContiguousBytes(Protocol):
    """Encoded items that may lie back to back in one buffer: when ``contiguous``,
    ``buffers()`` gives ``(base, offsets)``, item i being ``base[offsets[i]:offsets[i + 1]]``
    (``base`` uint8, ``offsets`` int64 of n + 1)."""

    @property
    def contiguous(self) -> bool: ...

    def buffers(self) -> tuple[np.ndarray, Any]: ...


@runtime_checkable
class SpannedBytes(Protocol):
    """Encoded items in several buffers: ``spans()`` gives ``(bases, base_of, starts,
    ends)``, item i being ``bases[base_of[i]][starts[i]:ends[i]]`` (``base_of`` None: all
    in ``bases[0]``)."""

    def spans(self) -> Spans: ...


@runtime_checkable
class FilePaths(Protocol):
    """Items that are the bytes of files: item i is the content of ``paths[i]``."""

    paths: Sequence[str]


class FilePages(Protocol):
    """Where a packed dataset's blocks lie in its files: what the loader asks to warn about
    random reads of data larger than memory and to read ahead block by block."""

    block_bounds: npt.NDArray[np.int64]
    nbytes: int

    def fits_in_memory(self) -> bool: ...


@runtime_checkable
class Blockwise(Protocol):
    """A container read block by block (``shuffle="quasi"``): ``block_bounds``, the blocks'
    row boundaries (int64, from 0 to its length), or None when it has none."""

    block_bounds: npt.NDArray[np.int64] | None


@runtime_checkable
class PagedFiles(Protocol):
    """A container whose rows lie in memory-mapped files: ``file_pages`` (None when not
    mapped), read ahead in a quasi-random order, and sized against the memory."""

    file_pages: FilePages | None


@runtime_checkable
class CheckedRows(Protocol):
    """A container with checks to run on a step's rows before it is handed out:
    ``verify_rows(rows)`` (None when there are none)."""

    verify_rows: Callable[[int | npt.NDArray[np.int64]], None] | None


@runtime_checkable
class FetchedRows(Protocol):
    """A container whose rows are fetched from object storage before they are read:
    ``remote_rows`` (``fastload._storage.remotefiles.RemoteRows``: ``ensure(rows)``
    fetches their blocks; ``present``, ``bounds``), None when they are local."""

    remote_rows: Any


class FeedSource(Protocol):
    """What a container offers the engine to feed an iteration over it (a packed
    dataset's checks and, at a URL, the fetching of its blocks)."""

    def feed(
        self,
        order: npt.NDArray[np.int64],
        start: int,
        first_step: int,
        step_end: Callable[[int], int],
        slack: int,
        together: Sequence[FeedSource],
    ) -> Any:
        """One iteration's ``_loading.seams.Feed`` over ``order[start:]`` (rows of this
        container) for itself and the sources ``together`` (of its own type, itself
        among them): steps from ``first_step`` on, ``step_end(step)`` the position past
        the last row of a step, ``slack`` positions that the run may load ahead of what
        was delivered."""
        ...

    def ensure(self, rows: int | npt.NDArray[np.int64]) -> None:
        """Bring in the data of ``rows`` now (what a worker process calls before it loads
        them natively)."""
        ...

    def holding(self, rows: int | npt.NDArray[np.int64]) -> AbstractContextManager[None]:
        """Keep the data of ``rows`` from being let go while it is read (a worker
        process's native read, from its ``ensure`` to the end of the load)."""
        ...


@runtime_checkable
class FedRows(Protocol):
    """A container fed to the engine (``row_feed``, None when it has nothing to feed)."""

    row_feed: FeedSource | None


@runtime_checkable
class PackedRows(Blockwise, PagedFiles, CheckedRows, FetchedRows, FedRows, Protocol):
    """Rows of a packed dataset (the dataset, or a column of it): its blocks, file pages,
    checks and fetching, each None where it has none, as on a slice of a column, whose
    rows are not the dataset's."""

    block_bounds: npt.NDArray[np.int64] | None = None
    file_pages: FilePages | None = None
    verify_rows: Callable[[int | npt.NDArray[np.int64]], None] | None = None
    remote_rows: Any = None
    row_feed: FeedSource | None = None
