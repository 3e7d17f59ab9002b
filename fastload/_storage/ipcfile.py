"""An Arrow IPC file of one record batch whose first column is written in place.

The writer streams the bytes of the file's first column straight into the file, at a
place reserved after the header, instead of spilling them and copying them at the end:
the largest column (the images, typically) is written to disk once. The rest of the file
is laid out around it at the end::

    0        "ARROW1\\0\\0"
    8        schema message                  (pyarrow's, with the final metadata)
             record batch message metadata   (pyarrow's for the same schema, its lengths
             zero padding up to ``header``    and offsets set to this batch's)
    header   body: the columns' buffers, 64-byte aligned, in Arrow's order; the first
             column's data at ``header + lead`` (written while rows came)
             end-of-stream marker, footer (pyarrow's, its block set to this batch),
             footer size, "ARROW1"

The framing comes from a file pyarrow writes for the first row alone (``template``): its
record batch metadata and footer are flatbuffers whose row counts, buffer offsets and
lengths are fixed-size fields, found by reading the flatbuffer tables and set in place.
Metadata padded past the flatbuffer and gaps between buffers (a reserved place left
partly empty when rows were skipped) are within the format: readers locate the metadata
by its length and every buffer by its offset.
"""

import io
import os
import struct
import threading

__all__ = ["InPlaceFile", "body_lead"]

ALIGN = 64
FLUSH_BYTES = 256 << 20
_CONTINUATION = b"\xff\xff\xff\xff"
_MAGIC = b"ARROW1"


def _aligned(x):
    return -(-x // ALIGN) * ALIGN


def body_lead(kind, rows):
    """Bytes before the first column's data in the body: its offsets, for ``rows`` rows at
    most, when it has variable-size values."""
    return _aligned((rows + 1) * 8) if kind in ("binary", "string") else 0


class InPlaceFile:
    """The file at ``path``, with ``header`` bytes reserved before the body and, when
    ``lead`` is not None, the first column's data streamed in at ``header + lead``
    through ``write``; ``finish`` lays out the rest."""

    def __init__(self, path, header, lead):
        self.path, self.header, self.lead = path, header, lead
        self.size = 0  # bytes of the first column's data written
        self._file = open(path, "w+b")
        if lead is not None:
            self._file.seek(header + lead)
        self._flusher = _Flusher(self._file.fileno())

    def write(self, data):
        """Append to the first column's data."""
        self._file.write(data)
        self.size += len(data)
        self._flusher.wrote(len(data))

    def data(self, pa):
        """The first column's data written, mapped from the file (zero copy)."""
        self._file.flush()
        if self.size == 0:
            return pa.py_buffer(b"")
        start = self.header + self.lead
        return pa.memory_map(self.path, "r").read_buffer()[start : start + self.size]

    def close(self):
        """Stop flushing and close the file; raises what a flush met (a full disk)."""
        try:
            self._flusher.stop()
        finally:
            self._file.close()

    def finish(self, pa, batch):
        """Write the file of ``batch`` around the first column's data (when it was
        streamed in, ``batch``'s first column maps it): header, the other buffers, footer.
        Returns False, having written nothing, when the header does not fit in the
        reserved bytes."""
        template = _template(pa, batch)
        schema_end, meta_len = _framing(template)
        if schema_end + 8 + meta_len > self.header:
            return False
        buffers = [b for column in batch.columns for b in column.buffers()]
        streamed = len(batch.column(0).buffers()) - 1 if self.lead is not None else -1
        layout, body = [], 0
        for k, buf in enumerate(buffers):
            if k == streamed:
                body = self.lead
            layout.append((body, 0 if buf is None else buf.size))
            body = _aligned(body + layout[-1][1])
        f = self._file
        for k, ((offset, size), buf) in enumerate(zip(layout, buffers)):
            if size and k != streamed:
                f.seek(self.header + offset)
                f.write(memoryview(buf))
        nodes = [node for column in batch.columns for node in _nodes(pa, column)]
        meta = _batch_metadata(template, schema_end, meta_len, layout, nodes, batch.num_rows, body)
        f.seek(0)
        f.write(template[:schema_end])
        f.write(_CONTINUATION + struct.pack("<i", self.header - schema_end - 8))
        f.write(meta + bytes(self.header - schema_end - 8 - len(meta)))
        f.seek(self.header + body)
        f.write(_CONTINUATION + b"\x00\x00\x00\x00")
        f.write(_footer(template, schema_end, self.header - schema_end, body))
        f.truncate()
        f.flush()
        return True


class _Flusher:
    """Writes the file's data to disk on a thread of its own every ``FLUSH_BYTES`` written
    (``fdatasync``), so that the disk works while rows are encoded, the final ``fsync``
    has little left to do and the dirty pages never pile up. A flush that fails raises at
    ``stop()``: the error is not reported twice by the system."""

    def __init__(self, fd):
        self.fd, self.pending, self.error = fd, 0, None
        self.wake = threading.Event()
        self.stopping = False
        self.thread = None

    def wrote(self, size):
        self.pending += size
        if self.pending >= FLUSH_BYTES:
            self.pending = 0
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, daemon=True, name="fastload-write-flush"
                )
                self.thread.start()
            self.wake.set()

    def _run(self):
        while True:
            self.wake.wait()
            self.wake.clear()
            if self.stopping:
                return
            try:
                (os.fdatasync if hasattr(os, "fdatasync") else os.fsync)(self.fd)
            except OSError as exc:
                self.error = exc
                return

    def stop(self):
        if self.thread is not None:
            self.stopping = True
            self.wake.set()
            self.thread.join()
        if self.error is not None:
            raise self.error


def _template(pa, batch):
    """The IPC file pyarrow writes for the first row of ``batch``: the framing to reuse."""
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, batch.schema) as out:
        out.write_batch(batch.slice(0, 1))
    return sink.getvalue()


def _framing(template):
    """(end of the schema message, record batch metadata length) in ``template``."""
    schema_end = 16 + struct.unpack_from("<i", template, 12)[0]
    if template[schema_end : schema_end + 4] != _CONTINUATION:
        raise ValueError("unexpected IPC framing")
    return schema_end, struct.unpack_from("<i", template, schema_end + 4)[0]


def _nodes(pa, array):
    """(length, null count) of ``array`` and its children, in IPC order (pre-order)."""
    found = [(len(array), array.null_count)]
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        found += _nodes(pa, array.values)
    return found


def _field(buf, table, index):
    """Position of field ``index`` of the flatbuffer table at ``table``, or None."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    size = struct.unpack_from("<H", buf, vtable)[0]
    if 4 + 2 * index >= size:
        return None
    offset = struct.unpack_from("<H", buf, vtable + 4 + 2 * index)[0]
    return table + offset if offset else None


def _target(buf, at):
    """Where the reference (table or vector) stored at ``at`` points."""
    return at + struct.unpack_from("<I", buf, at)[0]


def _required(position, what):
    if position is None:
        raise ValueError(f"the template has no {what}")
    return position


def _batch_metadata(template, schema_end, meta_len, layout, nodes, rows, body):
    """The template's record batch metadata (a Message flatbuffer) set to this batch."""
    meta = bytearray(template[schema_end + 8 : schema_end + 8 + meta_len])
    root = struct.unpack_from("<I", meta, 0)[0]
    struct.pack_into("<q", meta, _required(_field(meta, root, 3), "body length"), body)
    batch = _target(meta, _required(_field(meta, root, 2), "record batch"))
    struct.pack_into("<q", meta, _required(_field(meta, batch, 0), "row count"), rows)
    for index, values in ((1, nodes), (2, layout)):
        vector = _target(meta, _required(_field(meta, batch, index), "nodes and buffers"))
        if struct.unpack_from("<I", meta, vector)[0] != len(values):
            raise ValueError("the template's buffers differ from the batch's")
        for k, (a, b) in enumerate(values):
            struct.pack_into("<qq", meta, vector + 4 + 16 * k, a, b)
    return bytes(meta)


def _footer(template, batch_at, meta_size, body):
    """The template's footer, its record batch block set to this batch; with the footer
    size and the closing magic."""
    size = struct.unpack_from("<i", template, len(template) - 10)[0]
    footer = bytearray(template[len(template) - 10 - size : len(template) - 10])
    root = struct.unpack_from("<I", footer, 0)[0]
    blocks = _target(footer, _required(_field(footer, root, 3), "record batch blocks"))
    if struct.unpack_from("<I", footer, blocks)[0] != 1:
        raise ValueError("the template has more than one record batch")
    struct.pack_into("<qi4xq", footer, blocks + 4, batch_at, meta_size, body)
    return bytes(footer) + struct.pack("<i", size) + _MAGIC
