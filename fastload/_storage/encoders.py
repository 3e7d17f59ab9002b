"""Encoding rows for the writer, a slab of rows at a time, on threads.

The writer spills rows in order; it takes them as ``Slab``s: rows [first, stop) of the
container, each column's values (the bytes of a byte column back to back, with their
lengths; numbers as an array; shapes as a list) and the ``LoadError``s of the rows left
out (``on_error="skip"``). ``thread_slabs`` encodes them on encoder threads, a slab per
task (JPEG and QOI encoding release the GIL; a container's Python code holds it);
``encoder_processes.py`` in forked worker processes.
"""

import collections
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from fastload.errors import LoadError
from fastload.obs import getobs
from fastload.views import source_of

__all__ = [
    "ByteValues",
    "Slab",
    "as_bytes",
    "at_row",
    "column_values",
    "encode_row",
    "encode_rows",
    "encode_slab",
    "is_byte_kind",
    "observation",
    "thread_slabs",
]


class ByteValues:
    """A byte column's values in a slab: ``data`` (bytes-like) holds them back to back,
    ``lengths`` (int64) gives their sizes."""

    __slots__ = ("data", "lengths")

    def __init__(self, data, lengths):
        self.data, self.lengths = data, lengths


class Slab:
    """Rows [first, stop) encoded: ``columns`` (one per column, in schema order) hold the
    rows written; ``errors`` the ``LoadError`` of each row left out, in row order."""

    __slots__ = ("columns", "errors", "first", "stop")

    def __init__(self, first, stop, columns, errors):
        self.first, self.stop, self.columns, self.errors = first, stop, columns, errors


def is_byte_kind(kind):
    return kind in ("binary", "string") or kind.startswith("fixed:")


# One row


def at_row(i, field, fn, data):
    """``fn()``, with any exception re-raised as a LoadError naming row ``i`` (and the
    file it comes from, when ``data`` says)."""
    try:
        return fn()
    except LoadError as exc:
        if exc.index == i:
            raise  # getobs already named the row
        raise _row_error(i, field, exc, data) from exc
    except Exception as exc:
        raise _row_error(i, field, exc, data) from exc


def _row_error(i, field, exc, data):
    source = source_of(data, i)
    where = (
        f"row {i}" + (f" ({source})" if source else "") + (f", field {field!r}" if field else "")
    )
    return LoadError(
        f"cannot write {where}: {type(exc).__name__}: {exc}", index=i, source=source or field
    )


def observation(data, i, names):
    """Observation ``i`` as a dict with the ``names`` fields."""

    def get():
        obs = getobs(data, i)
        if isinstance(obs, dict):
            missing = [k for k in names if k not in obs]
            if missing:
                raise KeyError(f"observation has no field(s) {missing}; it has {list(obs)}")
            return obs
        if isinstance(obs, (tuple, list)):
            if len(obs) != len(names):
                raise ValueError(
                    f"observation is a {type(obs).__name__} of {len(obs)} values "
                    f"for {len(names)} fields {names}"
                )
            return dict(zip(names, obs))
        raise TypeError(f"an observation must be a dict or tuple, got {type(obs).__name__}")

    return at_row(i, None, get, data)


def encode_row(data, i, encodings, skip=False):
    """Row ``i`` encoded, field by field; with ``skip``, its LoadError instead of raising."""
    try:
        obs = observation(data, i, list(encodings))
        return [
            at_row(i, k, lambda enc=enc, k=k: enc.encode(obs[k]), data)
            for k, enc in encodings.items()
        ]
    except LoadError as exc:
        if not skip:
            raise
        return exc


def encode_rows(data, first, stop, encodings, skip):
    """Rows [first, stop) encoded: (one list of values per column, the LoadErrors of the
    rows left out). Raises the first row's LoadError unless ``skip``."""
    columns: list[list[Any]] | None
    columns, errors = None, []
    for i in range(first, stop):
        row = encode_row(data, i, encodings, skip)
        if isinstance(row, LoadError):
            errors.append(row)
            continue
        values = [v for parts in row for v in parts]
        if columns is None:
            columns = [[] for _ in values]
        for column, value in zip(columns, values):
            column.append(value)
    return columns, errors


def encode_slab(data, first, stop, encodings, kinds, skip):
    """Rows [first, stop) encoded as a ``Slab``."""
    columns, errors = encode_rows(data, first, stop, encodings, skip)
    columns = columns or [[] for _ in kinds]
    return Slab(
        first, stop, [_column(values, kind) for values, kind in zip(columns, kinds)], errors
    )


def _column(values, kind):
    if is_byte_kind(kind):
        data = [as_bytes(v) for v in values]
        return ByteValues(b"".join(data), np.fromiter(map(len, data), np.int64, len(data)))
    return column_values(values, kind)


def as_bytes(value):
    return value.encode("utf-8") if isinstance(value, str) else value


def column_values(values, kind):
    """A column of numbers as an array, of shapes as a list."""
    return values if kind == "shape" else np.asarray(values, dtype=np.dtype(kind))


def thread_slabs(data, n, encodings, kinds, threads, skip, slab_rows):
    """The slabs of rows [0, n) in order, encoded on ``threads`` threads, at most
    2 * threads slabs in flight (bounded memory)."""
    starts = range(0, n, slab_rows)
    if threads == 1:
        for first in starts:
            yield encode_slab(data, first, min(n, first + slab_rows), encodings, kinds, skip)
        return
    pool = ThreadPoolExecutor(threads, thread_name_prefix="fastload-write")
    pending: collections.deque[Future[Any]] = collections.deque()
    try:
        for first in starts:
            pending.append(
                pool.submit(
                    encode_slab, data, first, min(n, first + slab_rows), encodings, kinds, skip
                )
            )
            if len(pending) >= 2 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        # On an error or Ctrl-C: drop queued slabs, wait only for the running ones.
        pool.shutdown(wait=True, cancel_futures=True)
