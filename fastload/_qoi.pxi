"""QOI lossless image codec: the binding of qoi.h. The C calls run without the GIL."""
from libc.stdint cimport uint8_t

from qoi cimport *
from status cimport FL_ETRUNCATED, fl_strerror


cdef _error(int code, what):
    return _CoreError(code, f"{what}: {fl_strerror(code).decode()}")


def qoi_header(data):
    """Parses a QOI header; returns (height, width, channels) of the stored image.

    `data` is any bytes-like object. Raises ValueError when it is not a QOI stream.
    """
    cdef const uint8_t[::1] buf = memoryview(data).cast("B")
    cdef int w = 0, h = 0, c = 0
    cdef int err = fl_qoi_header(&buf[0] if buf.shape[0] else NULL, buf.shape[0], &w, &h, &c)
    if err:
        raise _error(err, "QOI header")
    return h, w, c


def qoi_encode(image):
    """Encodes a uint8 array of shape (height, width, 3 or 4) as QOI; returns bytes.

    Raises ValueError for another dtype or shape.
    """
    arr = np.asarray(image)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] not in (3, 4):
        raise ValueError(
            f"QOI encode needs a uint8 array of shape (h, w, 3|4), got {arr.dtype} {arr.shape}")
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"QOI encode needs a non-empty image, got shape {arr.shape}")
    cdef const uint8_t[:, :, ::1] px = np.ascontiguousarray(arr)
    cdef int h = px.shape[0], w = px.shape[1], c = px.shape[2]
    cdef size_t cap = fl_qoi_max_size(w, h, c)
    if cap == 0:
        raise ValueError(f"QOI encode: image too large ({h} x {w})")
    out = bytearray(cap)
    cdef uint8_t[::1] dst = out
    cdef long n
    with nogil:
        n = fl_qoi_encode(&px[0, 0, 0], w, h, c, &dst[0], cap)
    if n < 0:
        raise _error(<int>n, "QOI encode")
    del dst
    del out[n:]
    return bytes(out)


def qoi_decode(data, channels=None, out=None):
    """Decodes a QOI stream into a uint8 array of shape (height, width, channels).

    `channels` is 3 or 4 (default: as stored). `out`, when given, is a C-contiguous uint8
    array of that shape to decode into; it is returned. Raises ValueError for a truncated
    or corrupt stream, or an `out` of the wrong shape.
    """
    cdef const uint8_t[::1] buf = memoryview(data).cast("B")
    cdef int w = 0, h = 0, c = 0
    cdef int err = fl_qoi_header(&buf[0] if buf.shape[0] else NULL, buf.shape[0], &w, &h, &c)
    if err:
        raise _error(err, "QOI decode")
    if not fl_qoi_plausible(buf.shape[0], w, h):
        # Too short for that many pixels: fail before allocating what a hostile header
        # asks for.
        raise _error(FL_ETRUNCATED, "QOI decode")
    if channels is not None:
        if channels not in (3, 4):
            raise ValueError(f"channels must be 3 or 4, got {channels!r}")
        c = channels
    if out is None:
        out = np.empty((h, w, c), dtype=np.uint8)
    elif (not isinstance(out, np.ndarray) or out.dtype != np.uint8 or
          out.shape != (h, w, c) or not out.flags.c_contiguous):
        raise ValueError(f"out must be a C-contiguous uint8 array of shape {(h, w, c)}")
    cdef uint8_t[:, :, ::1] dst = out
    with nogil:
        err = fl_qoi_decode(&buf[0], buf.shape[0], &dst[0, 0, 0], w, h, c)
    if err:
        raise _error(err, "QOI decode")
    return out
