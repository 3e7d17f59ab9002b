"""One partition's rows written as part files (``parts.write_part``'s work in a task): cut
into files of about ``file_bytes`` of input, each written by ``write`` on the caller's
thread (the same bytes as ``write`` gives for the same rows) and put in place under its
part name."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fastload._storage.prefixes import Prefix
from fastload.errors import LoadError
from fastload.storage.writer import write

__all__ = ["Skipped", "part_files"]

Skipped = tuple[int | None, str | None, str]  # a row left out: (row, source, message)


def part_files(
    rows: Iterable[Any],
    name: Callable[[int], str],
    folder: Prefix,
    fields: dict[str, Any],
    file_bytes: int,
    options: dict[str, Any],
) -> tuple[list[str], int, list[Skipped]]:
    """Write ``rows`` (dicts, tuples in the order of ``fields``, or records with
    ``asDict()``) into ``folder`` as files named ``name(0)``, ``name(1)``, ...: a new
    file after each ``file_bytes`` of input, each ``write(..., **options)``. Returns the
    names written, the rows they hold, and the rows left out with
    ``on_error="skip"`` (their index among ``rows``). Raises what ``write`` and the
    folder raise."""
    files: list[str] = []
    skipped: list[Skipped] = []
    total = first = 0
    with tempfile.TemporaryDirectory(prefix="fastload-part-") as work:
        for chunk in _chunks(rows, file_bytes):
            file = name(len(files))
            # A local folder's part is written in place (write renames it in whole);
            # a store's is written here, then uploaded.
            local = folder.local(file) or os.path.join(work, file)
            errors = _write_chunk(local, chunk, fields, options)
            skipped += [(_at(e.index, first), e.source, str(e)) for e in errors]
            first += len(chunk)
            if len(errors) < len(chunk):
                if folder.remote:
                    folder.put(local, file)
                files.append(file)
                total += len(chunk) - len(errors)
    return files, total, skipped


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
