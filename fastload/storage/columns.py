"""Read-side columns of a packed dataset: views into the mapped file, decoded on access.

A column is built from pieces, one per record batch: the piece's Arrow array and the
"base", a uint8 numpy view of the whole mapped file the array lives in. Items of binary
columns are located once, at open, as absolute (start, end) byte positions in their base.
"""

import contextlib
import weakref
from typing import Any

import numpy as np

from fastload._base.protocols import ContiguousBytes, PackedRows, SpannedBytes
from fastload.errors import LoadError
from fastload.obs import is_batch_index, normalize_index

__all__ = ["EncodedColumn", "ItemBytes", "RawArray", "RawColumn", "ScalarArray"]


class Piece:
    """One record batch's array of a column, in the file mapped as ``base``."""

    def __init__(self, array, base, base_id):
        self.array, self.base, self.base_id = array, base, base_id

    def data_start(self, buf):
        """Position of Arrow buffer ``buf`` in the base, or None when it lies elsewhere
        (pyarrow copied it: a compressed file, say)."""
        if buf is None or buf.size == 0:
            return 0
        start = buf.address - self.base.ctypes.data
        return start if 0 <= start and start + buf.size <= self.base.size else None


def locate(pieces):
    """(bases, base_of_piece, starts, ends): absolute byte spans of every item of binary,
    string or fixed-size-binary pieces; a piece whose data is not in its file's map gets
    a base of its own."""
    bases: list[np.ndarray] = []
    base_ids: list[int] = []
    starts: list[Any] = []
    ends: list[Any] = []
    known: dict[Any, int] = {}
    for piece in pieces:
        arr = piece.array
        bufs = arr.buffers()
        width = arr.type.byte_width if _is_fixed_binary(arr.type) else -1
        data_buf = bufs[1] if width > 0 else bufs[2]
        at = piece.data_start(data_buf)
        if at is None:
            base, at, key = np.frombuffer(data_buf, np.uint8), 0, ("own", len(bases))
        else:
            base, key = piece.base, ("file", piece.base_id)
        if key not in known:
            known[key] = len(bases)
            bases.append(base)
        base_ids.append(known[key])
        if width > 0:
            offs = np.arange(arr.offset, arr.offset + len(arr) + 1, dtype=np.int64) * width
        else:
            dtype = np.int64 if arr.type.id in _large_ids() else np.int32
            offs = (
                np.zeros(1, np.int64)
                if bufs[1] is None
                else np.frombuffer(bufs[1], dtype, count=arr.offset + len(arr) + 1)[arr.offset :]
            )
            offs = offs.astype(np.int64)
        starts.append(at + offs[:-1])
        ends.append(at + offs[1:])
    cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64)
    return bases, np.asarray(base_ids, np.int64), cat(starts), cat(ends)


def _is_fixed_binary(typ):
    import pyarrow as pa

    return pa.types.is_fixed_size_binary(typ)


def _large_ids():
    import pyarrow as pa

    return {pa.large_binary().id, pa.large_string().id}


def _pin(column, rows):
    """At a URL, keep the blocks of ``rows`` in memory for good before they are read
    through Python (``RemoteRows.pin``): what is handed out may be a view of them."""
    if column.remote_rows is not None:
        column.remote_rows.pin(rows)


def _holding(column, rows):
    """At a URL, keep the blocks of ``rows`` from being let go while a read through
    Python copies them (``RemoteRows.holding``): between its fetch and its read, a block
    let go would be read as zeros."""
    remote = column.remote_rows
    return remote.holding(rows) if remote is not None else contextlib.nullcontext()


def _check_rows(column, rows):
    """The dataset's checks of ``rows`` (``Dataset.verify_rows``): before they are read,
    their blocks' checksums (``verify="read"``); before what was read is handed out, that
    no file shrank or was rewritten in place under the read."""
    if column.verify_rows is not None:
        column.verify_rows(rows)


class ItemBytes(ContiguousBytes, SpannedBytes, PackedRows):
    """The encoded bytes of a column's items: ``column.encoded[i]`` is a zero-copy,
    read-only memoryview into the file. A container of bytes with ``buffers()``, the
    input a native decoding pipeline takes (``mapobs(Compose([DecodeImage(), ...]),
    ds["image"].encoded)``)."""

    def __init__(self, column):
        self._column = column

    # The column's blocks, file pages and checks (set on the column by its dataset): the
    # column holds this object weakly, so that the two make no cycle.
    @property
    def block_bounds(self):  # type: ignore[override]
        return self._column.block_bounds

    @property
    def file_pages(self):  # type: ignore[override]
        return self._column.file_pages

    @property
    def verify_rows(self):  # type: ignore[override]
        return self._column.verify_rows

    @property
    def remote_rows(self):
        return self._column.remote_rows

    @property
    def row_feed(self):  # type: ignore[override]
        return self._column.row_feed

    def __len__(self) -> int:
        return len(self._column)

    def __getitem__(self, i: "slice | np.typing.ArrayLike"):
        i = normalize_index(i, len(self._column))
        _pin(self, i)
        _check_rows(self, i)
        if is_batch_index(i):
            return [self._column._view(int(j)) for j in i]
        return self._column._view(i)

    @property
    def contiguous(self) -> bool:
        return self._column.contiguous

    def buffers(self) -> tuple[np.ndarray, np.ndarray]:
        """The column's ``buffers()``: these items, located in the mapped file."""
        return self._column.buffers()

    def spans(self) -> tuple[list[np.ndarray], np.ndarray | None, np.ndarray, np.ndarray]:
        """The column's ``spans()``: these items, wherever they are mapped."""
        return self._column.spans()

    def row_source(self, i: int) -> str:
        """The column's ``row_source(i)``: where item ``i`` is, for errors."""
        return self._column.row_source(i)


class EncodedColumn(ContiguousBytes, SpannedBytes, PackedRows):
    """A binary-backed field (jpeg, qoi, smart, ndarray, bytes, str, ...): ``col[i]``
    decodes item ``i``; ``col[idx]`` gives a list. ``col.encoded[i]`` is the stored bytes.
    Auxiliary columns (``height``, ``width``, ``format``, ``shape``) are in ``col.parts``
    (and ``col.height``, ``col.width`` for images).

    Raises ``LoadError`` naming the row and the file (and the row's source file, when the
    dataset records it) when an item cannot be decoded.
    """

    # The Str column of the rows' source files, when the dataset has one (set by it).
    sources = None

    def __init__(self, name, codec, pieces, parts, piece_rows, sources):
        self.name, self.codec, self.encoding = name, codec, codec.name
        self.parts = parts
        self._bases, base_of_piece, self._starts, self._ends = locate(pieces)
        counts = np.diff(piece_rows)
        self._base_of_row = np.repeat(base_of_piece, counts) if len(self._bases) > 1 else None
        # sources: the file of each piece; kept per row only when there are several.
        self._sources = sources
        self._source_of_row = (
            np.repeat(np.arange(len(sources)), counts) if len(set(sources)) > 1 else None
        )
        self._encoded: weakref.ref[ItemBytes] | None = None
        self._offsets = None

    @property
    def encoded(self) -> ItemBytes:
        """The stored bytes of the items (``ItemBytes``): one object while any holds it."""
        items = self._encoded() if self._encoded is not None else None
        if items is None:
            items = ItemBytes(self)
            self._encoded = weakref.ref(items)
        return items

    def __len__(self) -> int:
        return len(self._starts)

    def __repr__(self) -> str:
        return f"<{self.encoding} column {self.name!r}: {len(self)} items, {self.codec!r}>"

    def __getattr__(self, attr: str):
        parts = self.__dict__.get("parts", {})
        if attr in parts:
            return parts[attr]
        raise AttributeError(f"{type(self).__name__} {self.name!r} has no attribute {attr!r}")

    @property
    def contiguous(self) -> bool:
        """True when ``buffers()`` is available: one file, items back to back (every
        file fastload writes; a foreign file with one record batch)."""
        if self._offsets is None:
            self._offsets = self._global_offsets()
        return not isinstance(self._offsets, str)

    def buffers(self) -> tuple[np.ndarray, Any]:
        """(data, offsets): item i is ``data[offsets[i]:offsets[i + 1]]``; ``data`` is a
        uint8 view of the whole mapped file, ``offsets`` int64 of length n + 1 (computed
        once). Zero copy. Raises ValueError when the column spans several files (use
        ``dataset.file_datasets``) or its items are not back to back (several record batches)."""
        if not self.contiguous:
            raise ValueError(f"column {self.name!r}: {self._offsets}")
        return self._bases[0], self._offsets

    def spans(self) -> tuple[list[np.ndarray], np.ndarray | None, np.ndarray, np.ndarray]:
        """(bases, base_of, starts, ends): item i is ``bases[base_of[i]][starts[i]:ends[i]]``
        (``base_of`` None: every item is in ``bases[0]``), where ``bases`` are uint8 views of
        the mapped files: the form of a column that spans several files. Zero copy."""
        return list(self._bases), self._base_of_row, self._starts, self._ends

    def _global_offsets(self):
        """The n + 1 offsets, or a str saying why there are none."""
        if len(self._bases) != 1:
            return (
                f"spans {len(self._bases)} mapped buffers (several files); "
                f"call buffers() on each of dataset.file_datasets"
            )
        if not np.array_equal(self._starts[1:], self._ends[:-1]):
            return "its items are not back to back (a file with several record batches)"
        offsets = np.empty(len(self) + 1, np.int64)
        offsets[:-1] = self._starts
        offsets[-1] = self._ends[-1] if len(self) else 0
        return offsets

    def _view(self, i):
        base = self._bases[0] if self._base_of_row is None else self._bases[self._base_of_row[i]]
        return memoryview(base[self._starts[i] : self._ends[i]])

    def row_source(self, i: int) -> str:
        """Where row ``i`` is, for errors: ``"train.arrow, row 7"``, and ``" (from
        cat/3.jpg)"`` when the dataset records the rows' source files."""
        where = f"{self._sources[0 if self._source_of_row is None else self._source_of_row[i]]}"
        where += f", row {i}"
        if self.sources is not None and self.sources is not self:
            try:
                where += f" (from {self.sources[i]})"
            except LoadError:
                pass  # the source column is damaged too: the row and file still say where
        return where

    def _decode(self, i):
        try:
            return self.codec.decode(self._view(i), *(p[i] for p in self.parts.values()))
        except Exception as exc:
            where = self.row_source(i)
            raise LoadError(
                f"{where}: cannot decode field {self.name!r} ({self.encoding}): {exc}",
                index=i,
                source=where,
            ) from exc

    def __getitem__(self, i: "slice | np.typing.ArrayLike"):
        i = normalize_index(i, len(self))
        if not self.codec.copies:
            _pin(self, i)
        with _holding(self, i):
            _check_rows(self, i)
            try:
                items = [self._decode(int(j)) for j in i] if is_batch_index(i) else self._decode(i)
            except LoadError:
                _check_rows(self, i)  # bytes that do not decode: read past a file's new end?
                raise
        _check_rows(self, i)
        return items


class ShapeList:
    """The per-row shapes of an NDArray field: ``shapes[i]`` is a tuple of ints."""

    def __init__(self, values, offsets):
        self._values, self._offsets = values, offsets

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i: int) -> tuple[int, ...]:
        return tuple(int(s) for s in self._values[self._offsets[i] : self._offsets[i + 1]])


def shape_list(chunked):
    """A ShapeList from a chunked list<int64> column (copied: small)."""
    values, offsets, total = [], [np.zeros(1, np.int64)], 0
    for arr in chunked.chunks:
        offs = np.asarray(arr.offsets, dtype=np.int64)
        values.append(np.asarray(arr.values, dtype=np.int64)[offs[0] : offs[-1]])
        offsets.append(offs[1:] - offs[0] + total)
        total += int(offs[-1] - offs[0])
    return ShapeList(
        np.concatenate(values) if values else np.zeros(0, np.int64), np.concatenate(offsets)
    )


class RawArray(np.ndarray, PackedRows):
    """A Raw field read as one zero-copy array of shape (n, *shape) (read-only)."""

    encoding = "raw"


class ScalarArray(np.ndarray, PackedRows):
    """A scalar field read as a 1-D array."""

    encoding = "scalar"


class RawColumn(PackedRows):
    """A Raw field stored in several record batches (a file not written by fastload, say,
    re-batched by pyarrow): one read-only array per batch, in
    ``chunks``; ``col[i]`` is an item view, ``col[idx]`` a gathered array,
    ``np.asarray(col)`` concatenates (a copy)."""

    encoding = "raw"

    def __init__(self, name, codec, pieces, piece_rows):
        self.name, self.codec = name, codec
        self.chunks = []
        for piece in pieces:
            arr = piece.array
            nb = codec.nbytes
            flat = np.frombuffer(arr.buffers()[1], np.uint8)[arr.offset * nb :]
            flat = flat[: len(arr) * nb]
            self.chunks.append(flat.view(codec.dtype).reshape((len(arr),) + codec.shape))
        self._bounds = np.asarray(piece_rows, np.int64)
        self.shape = (int(self._bounds[-1]),) + codec.shape
        self.dtype = codec.dtype

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return (
            f"<raw column {self.name!r}: shape {self.shape}, {self.dtype}, "
            f"{len(self.chunks)} chunks>"
        )

    def _item(self, i):
        c = int(np.searchsorted(self._bounds, i, side="right")) - 1
        return self.chunks[c][i - self._bounds[c]]

    def __getitem__(self, i: "slice | np.typing.ArrayLike") -> np.ndarray:
        i = normalize_index(i, len(self))
        if not is_batch_index(i):  # an item is a view of the block
            _pin(self, i)
            _check_rows(self, i)
            return self._item(i)
        out = np.empty((len(i),) + self.codec.shape, self.dtype)
        with _holding(self, i):  # a gather copies
            _check_rows(self, i)
            for k, j in enumerate(i):
                out[k] = self._item(int(j))
        _check_rows(self, i)
        return out

    def __array__(
        self, dtype: "np.typing.DTypeLike | None" = None, copy: bool | None = None
    ) -> np.ndarray:
        with _holding(self, np.arange(len(self))):
            if self.remote_rows is not None:  # at a URL: every block, fetched first
                self.remote_rows.ensure(np.arange(len(self)))
            out = np.concatenate(self.chunks) if self.chunks else np.zeros(self.shape, self.dtype)
        return out if dtype is None else out.astype(dtype)
