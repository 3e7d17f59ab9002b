"""Writing a packed dataset in parts, one task per partition, committed whole.

What any engine runs (``fastload.cluster`` wraps it in Ray's, Dask's and Spark's idioms)::

    driver: prepare(prefix)                  the folder made; a committed dataset there
                                             kept unless overwrite=True
    task:   write_part(rows, partition, ...) rows -> part files under a new attempt id,
                                             encoded by ``write`` (the same bytes);
                                             returns a ``Part``, or raises PartitionError
                                             naming the partition and the cause
    driver: commit(prefix, parts, n)         one Part per partition 0..n-1, their files
                                             checked (and a committed dataset there
                                             kept unless overwrite=True), the manifest
                                             published last and at once; the parts of
                                             other attempts removed

Until the manifest is there, ``open(prefix)`` refuses the parts (the write was not
committed); after it, it reads exactly the manifest's files in partition order, so a
retried, duplicated or failed attempt is never read.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from fastload._storage.fields import Encoding
from fastload._storage.manifest import (
    MANIFEST,
    is_part,
    listed_files,
    manifest_bytes,
    new_attempt,
    parse_manifest,
    part_name,
)
from fastload._storage.prefixes import Prefix
from fastload.errors import LoadError
from fastload.storage.writer import DEFAULT_BLOCK_BYTES, DEFAULT_URL_BLOCK_BYTES, write

__all__ = ["Committed", "Part", "PartitionError", "clean", "commit", "prepare", "write_part"]

DEFAULT_FILE_BYTES = 512 << 20  # of input rows buffered per part file


class PartitionError(RuntimeError):
    """A partition of a write in parts failed: ``partition`` names it (None when the
    engine's error did not say which), the message says why."""

    def __init__(self, partition: int | None, message: str) -> None:
        super().__init__(message)
        self.partition = partition

    def __reduce__(self) -> tuple[type[PartitionError], tuple[int | None, str]]:
        return type(self), (self.partition, str(self))


@dataclass(frozen=True)
class Part:
    """What one task wrote: ``partition``'s ``attempt``, its ``files`` (names under the
    prefix) holding ``rows`` rows; ``skipped``: (row in the partition, source, message)
    of each row left out with ``on_error="skip"``."""

    partition: int
    attempt: str
    files: tuple[str, ...]
    rows: int
    skipped: tuple[tuple[int | None, str | None, str], ...] = ()


@dataclass(frozen=True)
class Committed:
    """A committed dataset: its ``prefix``, its ``rows`` and ``files`` (in partition
    order), the ``LoadError`` of each row left out (``skipped``) and the files of other
    attempts that the commit removed (``removed``)."""

    prefix: str
    rows: int
    files: list[str]
    skipped: list[LoadError] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def prepare(
    prefix: str, storage_options: Mapping[str, Any] | None = None, overwrite: bool = False
) -> None:
    """Make the folder ``prefix`` ready for a write in parts. Raises FileExistsError
    when it holds a committed dataset and ``overwrite`` is False (with True, the commit
    replaces it: its manifest first, then its files are removed)."""
    folder = Prefix(prefix, storage_options)
    folder.make()
    if not overwrite and MANIFEST in folder.names():
        raise FileExistsError(
            f"{prefix} holds a committed dataset ({MANIFEST}); pass overwrite=True to replace it"
        )


def write_part(
    rows: Iterable[Any],
    partition: int,
    prefix: str,
    fields: dict[str, Encoding | str | np.dtype[Any]],
    *,
    storage_options: Mapping[str, Any] | None = None,
    file_bytes: int = DEFAULT_FILE_BYTES,
    block_bytes: int | None = None,
    on_error: Literal["raise", "skip"] = "raise",
    metadata: dict[str, Any] | None = None,
    source_field: str | None = None,
) -> Part:
    """Encode the ``rows`` of ``partition`` (dicts, tuples in the order of ``fields``,
    or records with ``asDict()``) into part files under ``prefix`` (a directory or a
    URL), under a new attempt id: a new file after each ``file_bytes`` of input, each
    written by ``write`` (``fields``, ``block_bytes``, ``on_error``, ``metadata``,
    ``source_field``: as ``write`` takes them; ``block_bytes`` by default 4 MiB at a
    URL, 64 MiB in a local folder, as ``write`` picks), on the caller's thread alone.

    Raises PartitionError naming the partition and the cause for anything that fails
    (a row with ``on_error="raise"``, the destination); the files written before stay,
    never read (``clean`` removes them)."""
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise ValueError(f"partition must be an int >= 0, got {partition!r}")
    attempt = new_attempt()
    try:
        folder = Prefix(prefix, storage_options)
        folder.make()
        if block_bytes is None:
            block_bytes = DEFAULT_URL_BLOCK_BYTES if folder.remote else DEFAULT_BLOCK_BYTES
        options: dict[str, Any] = dict(block_bytes=block_bytes, on_error=on_error)
        options.update(metadata=metadata, source_field=source_field)
        return _written(rows, partition, attempt, folder, fields, file_bytes, options)
    except Exception as exc:
        raise PartitionError(partition, failure(partition, attempt, exc)) from exc


def failure(partition: int, attempt: str, exc: BaseException) -> str:
    """The message of partition ``partition``'s failure: the marker that ``engine_error``
    finds in whatever an engine makes of it."""
    return f"fastload partition {partition} failed (attempt {attempt}): {type(exc).__name__}: {exc}"


def _written(
    rows: Iterable[Any],
    partition: int,
    attempt: str,
    folder: Prefix,
    fields: dict[str, Any],
    file_bytes: int,
    options: dict[str, Any],
) -> Part:
    """``write_part``'s work: the rows cut into files, each written and put in place."""
    files: list[str] = []
    skipped: list[tuple[int | None, str | None, str]] = []
    total = first = 0
    with tempfile.TemporaryDirectory(prefix="fastload-part-") as work:
        for chunk in _chunks(rows, file_bytes):
            name = part_name(partition, attempt, len(files))
            # A local folder's part is written in place (write renames it in whole);
            # a store's is written here, then uploaded.
            local = folder.local(name) or os.path.join(work, name)
            errors = _write_chunk(local, chunk, fields, options)
            skipped += [(_at(e.index, first), e.source, str(e)) for e in errors]
            first += len(chunk)
            if len(errors) < len(chunk):
                if folder.remote:
                    folder.put(local, name)
                files.append(name)
                total += len(chunk) - len(errors)
    return Part(partition, attempt, tuple(files), total, tuple(skipped))


def _write_chunk(
    local: str, chunk: list[Any], fields: dict[str, Any], options: dict[str, Any]
) -> list[LoadError]:
    """``write`` of ``chunk`` to ``local``; with ``on_error="skip"``, a chunk whose every
    row fails (which ``write`` refuses: no row to write) gives each row's error."""
    try:
        return write(local, chunk, fields, parallel=False, progress=False, **options)
    except LoadError:
        if options["on_error"] != "skip":
            raise
    errors = []
    for i, row in enumerate(chunk):
        try:
            write(local, [row], fields, parallel=False, progress=False, **options)
        except LoadError as exc:
            errors.append(LoadError(str(exc), index=i, source=exc.source))
    if len(errors) < len(chunk):
        raise RuntimeError("a row of a chunk that failed as a whole wrote alone")
    return errors


def _at(index: int | None, first: int) -> int | None:
    return None if index is None else index + first


def _chunks(rows: Iterable[Any], file_bytes: int) -> Iterable[list[Any]]:
    """Lists of rows (as ``write`` takes them) holding about ``file_bytes`` of input."""
    chunk: list[Any] = []
    size = 0
    for row in rows:
        row = _plain(row)
        chunk.append(row)
        size += _size(row)
        if size >= file_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _plain(row: Any) -> Any:
    """``row`` as ``write`` reads it: a dict or a tuple; a record's ``asDict()`` (a
    Spark ``Row``); bytearray and memoryview values as bytes."""
    if hasattr(row, "asDict"):  # a Spark Row is a tuple, in its schema's order
        row = row.asDict()
    if isinstance(row, Mapping):
        return {k: _value(v) for k, v in row.items()}
    if isinstance(row, (tuple, list)):
        return tuple(_value(v) for v in row)
    return row


def _value(value: Any) -> Any:
    return bytes(value) if isinstance(value, (bytearray, memoryview)) else value


def _size(row: Any) -> int:
    values = row.values() if isinstance(row, dict) else row if isinstance(row, tuple) else [row]
    return sum(len(v) if isinstance(v, (bytes, str)) else getattr(v, "nbytes", 8) for v in values)


def commit(
    prefix: str,
    parts: Iterable[Part],
    partitions: int,
    *,
    storage_options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> Committed:
    """Commit a write in parts: one ``Part`` per partition 0..``partitions``-1 (the first
    given of each, when an engine reports two), their files checked, then the manifest
    published at once; the part files of other attempts are removed after it.

    Raises FileExistsError when ``prefix`` holds a committed dataset (one there at
    ``prepare``, or one committed since) and ``overwrite`` is False, PartitionError
    naming the partitions without a part, or whose files are not there, and ValueError
    for a write of no rows: nothing is committed then."""
    folder = Prefix(prefix, storage_options)
    chosen = _one_per_partition(parts, partitions)
    names = folder.names()
    if not overwrite and MANIFEST in names:
        raise FileExistsError(
            f"nothing was committed at {prefix}: it holds a committed dataset ({MANIFEST}), "
            "committed since the write began; pass overwrite=True to replace it"
        )
    present = set(names)
    for part in chosen:
        missing = [name for name in part.files if name not in present]
        if missing:
            raise PartitionError(
                part.partition,
                f"nothing was committed at {prefix}: partition {part.partition}'s file "
                f"{missing[0]} is not there (removed while the write ran?)",
            )
    rows = sum(part.rows for part in chosen)
    if rows == 0:
        raise ValueError(f"nothing was committed at {prefix}: the write has no rows")
    entries = [(p.partition, p.attempt, p.files, p.rows) for p in chosen]
    folder.publish(MANIFEST, manifest_bytes(entries))
    listed = {name for part in chosen for name in part.files}
    stale = sorted(name for name in names if is_part(name) and name not in listed)
    folder.remove(stale)
    skipped = [_skipped(part.partition, *s) for part in chosen for s in part.skipped]
    files = [name for part in chosen for name in part.files]
    return Committed(folder.where, rows, files, skipped, stale)


def _one_per_partition(parts: Iterable[Part], partitions: int) -> list[Part]:
    chosen: dict[int, Part] = {}
    for part in parts:
        if not isinstance(part, Part):
            raise TypeError(f"commit takes the Parts that write_part returned, got {part!r}")
        chosen.setdefault(part.partition, part)
    missing = [p for p in range(partitions) if p not in chosen]
    extra = [p for p in chosen if not 0 <= p < partitions]
    if missing or extra:
        which = missing or extra
        raise PartitionError(
            which[0],
            f"nothing was committed: partitions {which[:10]} "
            + ("have no part that succeeded" if missing else f"are not among 0..{partitions - 1}"),
        )
    return [chosen[p] for p in range(partitions)]


def _skipped(partition: int, index: int | None, source: str | None, message: str) -> LoadError:
    return LoadError(f"partition {partition}: {message}", index=index, source=source)


def clean(prefix: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """Remove from ``prefix`` the part files that its manifest does not list (failed or
    duplicate attempts); with no manifest, every part file (a write that was not
    committed). Returns the names removed. Run it when no write to ``prefix`` is
    running: a write's parts are not listed until its commit."""
    folder = Prefix(prefix, storage_options)
    names = folder.names()
    listed: set[str] = set()
    if MANIFEST in names:
        listed = set(listed_files(parse_manifest(folder.read(MANIFEST), f"{prefix}/{MANIFEST}")))
    stale = sorted(name for name in names if is_part(name) and name not in listed)
    stale += sorted(name for name in names if _TEMPORARY.fullmatch(name))
    folder.remove(stale)
    return stale


_TEMPORARY = re.compile(r"\." + re.escape(MANIFEST) + r"\.[0-9a-f]{12}\.tmp")


_MARKER = re.compile(r"fastload partition (\d+) failed \(attempt [0-9a-f]+\): ([^\n]*)")


def engine_error(prefix: str, error: BaseException) -> PartitionError:
    """The PartitionError to raise for ``error``, what an engine raised for a write in
    parts: the partition and the cause found in it (through its causes and message),
    saying that nothing was committed."""
    seen: list[BaseException] = []
    at: BaseException | None = error
    while at is not None and at not in seen:
        seen.append(at)
        at = at.__cause__ or at.__context__
    # The marker's line, not the engine's rendering of the error (a traceback, colours).
    match = _MARKER.search("\n".join(str(e) for e in seen))
    if match is not None:
        partition, cause = int(match[1]), match[0]
        return PartitionError(partition, f"nothing was committed at {prefix}: {cause}")
    return PartitionError(
        None, f"nothing was committed at {prefix}: {type(error).__name__}: {error}"
    )
