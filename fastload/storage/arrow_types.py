"""Arrow types and arrays for the column kinds of ``fields.py``.

pyarrow is imported by ``import_pyarrow`` only, called where a file is written or opened,
so that ``import fastload`` never loads it.
"""
import numpy as np


def import_pyarrow():
    """The pyarrow module; raises ImportError saying how to install it."""
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401  (submodule used by reader and writer)
    except ImportError:
        raise ImportError("packed datasets need pyarrow: pip install pyarrow") from None
    return pyarrow


def arrow_type(pa, kind):
    """The Arrow type of a column kind ("binary", "string", "fixed:N", "shape", dtype)."""
    if kind == "binary":
        return pa.binary()
    if kind == "string":
        return pa.string()
    if kind == "shape":
        return pa.list_(pa.int64())
    if kind.startswith("fixed:"):
        return pa.binary(int(kind[6:]))
    return pa.from_numpy_dtype(np.dtype(kind))


def build_array(pa, kind, values):
    """An Arrow array of ``kind`` from a list of encoded values (one per row)."""
    typ = arrow_type(pa, kind)
    if kind.startswith("fixed:"):
        if typ.byte_width == 0:
            return pa.array([b""] * len(values), typ)
        data = pa.py_buffer(b"".join(values))
        return pa.FixedSizeBinaryArray.from_buffers(typ, len(values), [None, data])
    if kind in ("binary", "string", "shape"):
        return pa.array(values, typ)
    return pa.array(np.asarray(values, dtype=np.dtype(kind)), typ)


def value_nbytes(value):
    """Approximate size of one encoded value, to cut record batches near chunk_bytes."""
    if isinstance(value, (bytes, str)):
        return len(value)
    if isinstance(value, list):
        return 8 * len(value)
    return 8
