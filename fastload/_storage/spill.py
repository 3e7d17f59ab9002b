"""Column spill files: the writer appends each column's encoded values to disk as slabs
of rows arrive, then maps the files back as the buffers of one Arrow record batch.

One record batch per file keeps every column contiguous in the file: a Raw column reads
as one (n, *shape) array and a binary column as one data buffer with n + 1 offsets.
Memory stays bounded: byte columns go through the page cache; only numbers (8 bytes per
row) and NDArray shapes stay in RAM until the end.
"""

import builtins
import os

import numpy as np

from fastload._storage.arrow_types import arrow_type

__all__ = ["ColumnSpill"]

BYTE_KINDS = ("binary", "string")


class ColumnSpill:
    """One column being written: ``extend`` it with each slab's values, then
    ``to_arrow``. A byte column's bytes go to a spill file at ``path``, or straight into
    the file being written when ``into`` (an ``ipcfile.InPlaceFile``) is given."""

    def __init__(self, path, kind, into=None):
        self.path, self.kind, self.into = path, kind, into
        self.rows = 0
        self._file = None
        self._values = []  # numbers: one array per slab; shapes: one list per row
        if kind in BYTE_KINDS or kind.startswith("fixed:"):
            self._file = into if into is not None else builtins.open(path, "wb")
            self._lengths = []  # one int64 array per slab

    def extend(self, values):
        """Adds a slab's values: a ``ByteValues`` for a byte column, an array of numbers,
        or a list of shapes. Returns the bytes each row takes (int64): stored bytes, or 8
        per number."""
        if self._file is not None:
            self._file.write(values.data)
            self._lengths.append(values.lengths)
            self.rows += len(values.lengths)
            return values.lengths
        self.rows += len(values)
        if self.kind == "shape":
            self._values.extend(values)
            return np.fromiter((8 * len(v) for v in values), np.int64, len(values))
        self._values.append(values)
        return np.full(len(values), 8, np.int64)

    def to_arrow(self, pa):
        """The column as one Arrow array; byte data is a read-only map of the spill file."""
        typ = arrow_type(pa, self.kind)
        if self._file is None:
            if self.kind == "shape":
                return pa.array(self._values, typ)
            values = (
                np.concatenate(self._values) if self._values else np.zeros(0, np.dtype(self.kind))
            )
            return pa.array(values, typ)
        if self.into is not None:
            data = self.into.data(pa)
        else:
            self._file.close()
            data = _map(pa, self.path)
        if self.kind.startswith("fixed:"):
            return pa.Array.from_buffers(typ, self.rows, [None, data])
        offsets = np.zeros(self.rows + 1, np.int64)
        if self.rows:
            np.cumsum(np.concatenate(self._lengths), out=offsets[1:])
        return pa.Array.from_buffers(typ, self.rows, [None, pa.py_buffer(offsets), data])

    def close(self):
        """Closes and deletes the spill file (idempotent)."""
        if self._file is not None and self.into is None:
            self._file.close()
            if os.path.exists(self.path):
                os.remove(self.path)


def _map(pa, path):
    if os.path.getsize(path) == 0:
        return pa.py_buffer(b"")
    return pa.memory_map(path, "r").read_buffer()
