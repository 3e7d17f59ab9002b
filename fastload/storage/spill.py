"""Column spill files: the writer appends each column's encoded values to disk as rows
arrive, then maps the files back as the buffers of one Arrow record batch.

One record batch per file keeps every column contiguous in the file: a Raw column reads
as one (n, *shape) array and a binary column as one data buffer with n + 1 offsets.
Memory stays bounded: byte columns go through the page cache; only numbers (8 bytes per
row) and NDArray shapes stay in RAM until the end.
"""
import builtins
import os
from array import array

import numpy as np

from fastload.storage.arrow_types import arrow_type

__all__ = ["ColumnSpill"]

BYTE_KINDS = ("binary", "string")


class ColumnSpill:
    """One column being written: ``append`` each row's value, then ``to_arrow``."""

    def __init__(self, path, kind):
        self.path, self.kind = path, kind
        self.rows = 0
        self._file = None
        if kind in BYTE_KINDS or kind.startswith("fixed:"):
            self._file = builtins.open(path, "wb")
            self._offsets = array("q", [0])
        else:
            self._values = []

    def append(self, value):
        """Adds one row; returns the number of bytes it takes."""
        self.rows += 1
        if self._file is None:
            self._values.append(value)
            return 8 * (len(value) if isinstance(value, list) else 1)
        data = value.encode("utf-8") if isinstance(value, str) else value
        self._file.write(data)
        if self.kind in BYTE_KINDS:
            self._offsets.append(self._offsets[-1] + len(data))
        return len(data)

    def to_arrow(self, pa):
        """The column as one Arrow array; byte data is a read-only map of the spill file."""
        typ = arrow_type(pa, self.kind)
        if self._file is None:
            if self.kind == "shape":
                return pa.array(self._values, typ)
            return pa.array(np.asarray(self._values, dtype=np.dtype(self.kind)), typ)
        self._file.close()
        data = _map(pa, self.path)
        if self.kind.startswith("fixed:"):
            return pa.Array.from_buffers(typ, self.rows, [None, data])
        offsets = pa.py_buffer(np.frombuffer(self._offsets, np.int64))
        return pa.Array.from_buffers(typ, self.rows, [None, offsets, data])

    def close(self):
        """Closes and deletes the spill file (idempotent)."""
        if self._file is not None:
            self._file.close()
            if os.path.exists(self.path):
                os.remove(self.path)


def _map(pa, path):
    if os.path.getsize(path) == 0:
        return pa.py_buffer(b"")
    return pa.memory_map(path, "r").read_buffer()
