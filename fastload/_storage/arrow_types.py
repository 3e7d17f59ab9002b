"""Arrow types for the column kinds of ``fields.py``, and the lazy pyarrow import.

pyarrow is imported by ``import_pyarrow`` only, called where a file is written or opened,
so that ``import fastload`` never loads it.
"""

import numpy as np


def import_pyarrow():
    """The pyarrow module; raises ImportError saying how to install it."""
    try:
        import pyarrow
        import pyarrow.ipc
    except ImportError:
        raise ImportError("packed datasets need pyarrow: pip install pyarrow") from None
    return pyarrow


def arrow_type(pa, kind):
    """The Arrow type of a column kind ("binary", "string", "fixed:N", "shape", dtype).
    Byte columns use 64-bit offsets: one record batch holds a whole file."""
    if kind == "binary":
        return pa.large_binary()
    if kind == "string":
        return pa.large_string()
    if kind == "shape":
        return pa.list_(pa.int64())
    if kind.startswith("fixed:"):
        return pa.binary(int(kind[6:]))
    return pa.from_numpy_dtype(np.dtype(kind))
