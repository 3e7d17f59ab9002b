"""Checksums of packed files: a CRC-32 per block, and one of the metadata.

A block's checksum covers the bytes of its rows in every column, in column order: fixed
size values as stored; for variable-size values (bytes, strings, shape lists) their
contents, then their lengths as int64. It depends only on the values, so a file written
in one record batch and the same rows read from any batches give the same checksum.
The metadata checksum covers the fastload fields, blocks and user metadata, so that a
self-consistent edit of the metadata is found too. CRC-32 is zlib's (about 3 GB/s here,
releasing the GIL), stored in the schema metadata under ``fastload.checksums`` as JSON:
``{"crc32": [one per block], "metadata": crc}``. Files without it (written before
checksums existed) open as before and are reported as not verifiable.
"""

import json
import zlib

import numpy as np

from fastload._storage.meta import META_BLOCKS, META_FIELDS, META_USER, read_blocks
from fastload.errors import LoadError

__all__ = [
    "FileChecksums",
    "META_CHECKSUMS",
    "block_checksums",
    "file_checksums",
    "metadata_checksum",
]

META_CHECKSUMS = b"fastload.checksums"


def block_checksums(pa, arrays, bounds):
    """The CRC-32 of each block [bounds[k], bounds[k+1]) of the columns ``arrays`` (one
    pyarrow array per column, in schema order)."""
    sums = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        crc = 0
        for array in arrays:
            for part in _row_bytes(pa, array, int(a), int(b - a)):
                crc = zlib.crc32(part, crc)
        sums.append(crc)
    return sums


def metadata_checksum(fields, blocks, user):
    """The CRC-32 of the fastload metadata values (bytes)."""
    crc = 0
    for value in (fields, blocks, user):
        crc = zlib.crc32(value or b"", crc)
    return crc


def _row_bytes(pa, array, first, n):
    """The bytes of rows [first, first + n) of ``array``, as the checksum reads them."""
    t, start, buffers = array.type, array.offset + first, array.buffers()
    if pa.types.is_boolean(t):
        yield array.slice(first, n).to_numpy(zero_copy_only=False).astype(np.uint8)
    elif pa.types.is_fixed_size_binary(t):
        yield memoryview(buffers[1])[start * t.byte_width : (start + n) * t.byte_width]
    elif (
        pa.types.is_binary(t)
        or pa.types.is_string(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_large_string(t)
    ):
        large = pa.types.is_large_binary(t) or pa.types.is_large_string(t)
        offsets = np.frombuffer(buffers[1], np.int64 if large else np.int32)[start : start + n + 1]
        yield memoryview(buffers[2])[int(offsets[0]) : int(offsets[-1])] if n else b""
        yield np.diff(offsets).astype("<i8")
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        large = pa.types.is_large_list(t)
        offsets = np.frombuffer(buffers[1], np.int64 if large else np.int32)[start : start + n + 1]
        values = array.values  # the whole child array: the offsets index into it
        yield from _row_bytes(pa, values, int(offsets[0]), int(offsets[-1] - offsets[0]))
        yield np.diff(offsets).astype("<i8")
    elif pa.types.is_integer(t) or pa.types.is_floating(t):
        size = t.bit_width // 8
        yield memoryview(buffers[1])[start * size : (start + n) * size]
    else:
        raise ValueError(f"no checksum for Arrow type {t}")


class FileChecksums:
    """The checksums stored in one file, to check its blocks one by one. Raises
    ``LoadError`` at construction when the checksum metadata is unreadable, does not
    describe the file's blocks, or the metadata does not match its own checksum."""

    def __init__(self, pa, path, schema, batches, rows):
        meta = schema.metadata or {}
        try:
            stored = json.loads(meta[META_CHECKSUMS].decode("utf-8"))
            self.sums, meta_sum = list(stored["crc32"]), stored["metadata"]
        except (UnicodeDecodeError, ValueError, TypeError, KeyError):
            raise LoadError(f"{path}: bad checksum metadata", source=path) from None
        if (
            metadata_checksum(meta.get(META_FIELDS), meta.get(META_BLOCKS), meta.get(META_USER))
            != meta_sum
        ):
            raise LoadError(
                f"{path}: the metadata does not match its checksum: the file is corrupt",
                source=path,
            )
        try:
            self.bounds = read_blocks(meta, rows)
        except ValueError as exc:
            raise LoadError(f"{path}: {exc}", source=path) from exc
        if self.bounds is None or len(self.sums) != len(self.bounds) - 1:
            raise LoadError(
                f"{path}: {len(self.sums)} checksums for the file's blocks", source=path
            )
        self.pa, self.path = pa, path
        self._batches, self._ncolumns = batches, len(schema)
        self._starts = np.cumsum([0] + [b.num_rows for b in batches])

    def check(self, k):
        """Raise ``LoadError`` unless block ``k`` matches its checksum."""
        a, b = int(self.bounds[k]), int(self.bounds[k + 1])
        columns = [self._rows(c, a, b) for c in range(self._ncolumns)]
        if block_checksums(self.pa, columns, [0, b - a])[0] != self.sums[k]:
            raise LoadError(
                f"{self.path}: block {k} (rows {a}..{b - 1}) does not match its "
                f"checksum: the file is corrupt",
                source=self.path,
            )

    def _rows(self, column, a, b):
        """Rows [a, b) of ``column``: a slice of the record batch holding them (zero
        copy), or the slices of several joined (a copy of this block's rows alone)."""
        parts = [
            batch.column(column).slice(max(a, start) - start, min(b, start + n) - max(a, start))
            for start, batch, n in zip(self._starts, self._batches, np.diff(self._starts))
            if max(a, start) < min(b, start + n)
        ]
        if len(parts) == 1:
            return parts[0]
        return self.pa.concat_arrays(parts) if parts else self._batches[0].column(column)[:0]


def file_checksums(pa, path, schema, batches, rows):
    """The ``FileChecksums`` of a file, or None when it has none (an older file)."""
    if META_CHECKSUMS not in (schema.metadata or {}):
        return None
    return FileChecksums(pa, path, schema, batches, rows)
