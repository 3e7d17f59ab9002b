# cython: language_level=3
"""libjpeg-turbo's region decoder (csrc/jpeg.c), in a module of its own: the only one that
links libjpeg. ``fastload._core`` takes the decoder from here when it loads; where this
module is missing (a build without libjpeg's headers) or cannot be loaded (the library is
gone), the core decodes JPEG through simplejpeg instead, and ``import fastload`` works."""
from cpython.pycapsule cimport PyCapsule_New
from libc.stdlib cimport free, malloc

from image cimport fl_image, fl_rect
from jpeg cimport (FL_JPEG_CAPSULE_NAME, fl_jpeg_add_restarts, fl_jpeg_decode,
                  fl_jpeg_decode_fn, fl_jpeg_encode, fl_jpeg_library_version, fl_jpeg_part)
from status cimport FL_ENOMEM, FL_EUNSUPPORTED, FL_OK

cdef fl_jpeg_decode_fn _decode = fl_jpeg_decode


def library_version():
    """The libjpeg-turbo version number this module links, e.g. 2001005 for 2.1.5."""
    return fl_jpeg_library_version()


def decoder():
    """fl_jpeg_decode's address, in a capsule named FL_JPEG_CAPSULE_NAME (jpeg.h), for the
    C core."""
    return PyCapsule_New(<void *>&_decode, FL_JPEG_CAPSULE_NAME, NULL)


def add_restarts(const unsigned char[::1] data, int span=32):
    """``data`` (baseline JPEG bytes) with a restart marker after every interval of MCUs
    that spans at most ``span`` pixels across (one MCU at least) and divides the MCU row,
    losslessly (the same coefficients, libjpeg's standard Huffman tables): a crop of the
    result entropy-decodes only its own intervals. Returns the new bytes; ``data``
    unchanged for a progressive, arithmetic-coded or 12-bit stream. Raises ValueError for
    bytes that do not decode."""
    cdef unsigned char *out = NULL
    cdef size_t out_n = 0
    cdef char message[256]
    cdef int rc
    message[0] = 0
    if data.shape[0] == 0:
        raise ValueError("empty JPEG")
    with nogil:
        rc = fl_jpeg_add_restarts(&data[0], data.shape[0], span, &out, &out_n, message,
                                  sizeof(message))
    if rc == FL_EUNSUPPORTED:
        return bytes(data)
    return _taken(rc, out, out_n, message)


cdef bytes _taken(int rc, unsigned char *out, size_t out_n, const char *message):
    """The bytes C malloc'd in ``out`` (freed here) when ``rc`` is FL_OK, else the error
    its ``message`` gives: MemoryError for FL_ENOMEM, ValueError otherwise."""
    if rc != FL_OK:
        raise (MemoryError if rc == FL_ENOMEM else ValueError)(message.decode(errors="replace"))
    try:
        return bytes(out[:out_n])
    finally:
        free(out)


# Chroma subsampling by name: the sampling factors (horizontal, vertical) of luma.
_SAMPLING = {"420": (2, 2), "422": (2, 1), "444": (1, 1)}


def encode(const unsigned char[:, :, ::1] pixels, int quality=90, str subsampling="420",
           int restart_px=0):
    """``pixels`` (uint8, (h, w, 3), RGB, C-contiguous) as baseline JPEG bytes at
    ``quality`` with chroma ``subsampling`` "420", "422" or "444", and a restart marker
    after every interval of MCUs at most ``restart_px`` pixels across that divides the
    MCU row (0: none), as ``add_restarts`` puts them, in one pass: the accurate integer
    DCT and the standard tables, the bytes Pillow writes at the same settings. Raises
    ValueError for another shape, quality or subsampling."""
    cdef unsigned char *out = NULL
    cdef size_t out_n = 0
    cdef char message[256]
    cdef fl_image img
    cdef int rc, hs, vs
    if subsampling not in _SAMPLING:
        raise ValueError(f"subsampling must be one of {sorted(_SAMPLING)}, got {subsampling!r}")
    hs, vs = _SAMPLING[subsampling]
    if pixels.shape[2] != 3 or pixels.shape[0] < 1 or pixels.shape[1] < 1:
        raise ValueError(f"encode takes RGB pixels of shape (h, w, 3), got {tuple(pixels.shape)[:3]}")
    if not 1 <= quality <= 100:
        raise ValueError(f"quality must be 1..100, got {quality}")
    message[0] = 0
    img.data = <unsigned char *>&pixels[0, 0, 0]
    img.h, img.w, img.c = pixels.shape[0], pixels.shape[1], 3
    img.stride = pixels.strides[0]
    with nogil:
        rc = fl_jpeg_encode(&img, quality, hs, vs, restart_px, &out, &out_n, message,
                            sizeof(message))
    return _taken(rc, out, out_n, message)


def part(const unsigned char[::1] data, int denom, int y, int x, int h, int w):
    """The restart intervals under the rows y..y+h and columns x..x+w (at 1/denom scale,
    with the decoder's one-pixel margin) as JPEG bytes of their own, and where their first
    pixel sits in the scaled image: ``(bytes, dy, dx)``; None where the stream has no such
    part (fl_jpeg_part in csrc/jpeg.h). For tests."""
    cdef fl_rect want
    cdef unsigned char *out = NULL
    cdef size_t out_n = 0
    cdef int dy = 0, dx = 0, rc
    if denom not in (1, 2, 4, 8) or h < 1 or w < 1 or data.shape[0] == 0:
        raise ValueError(f"no part of {data.shape[0]} bytes at 1/{denom} for a {h} x {w} region")
    want.y, want.x, want.h, want.w = y, x, h, w
    rc = fl_jpeg_part(&data[0], data.shape[0], denom, &want, &out, &out_n, &dy, &dx)
    if rc < 0:
        raise MemoryError("out of memory cutting a JPEG's restart intervals")
    if rc == 0:
        return None
    try:
        return bytes(out[:out_n]), dy, dx
    finally:
        free(out)


cdef void *_malloc(void *ctx, size_t n) noexcept nogil:
    (<void **>ctx)[0] = malloc(n if n else 1)
    return (<void **>ctx)[0]


def decode_region(const unsigned char[::1] data, int y, int x, int h, int w, int channels=3,
                  int denom=1):
    """The pixels of rows y..y+h and columns x..x+w (at 1/denom scale) as fl_jpeg_decode
    gives them, cut to exactly that region: ``(bytes, h, w, channels)``, rows packed.
    Raises ValueError with libjpeg's words for data that does not decode. For tests."""
    cdef fl_rect want
    cdef fl_image img
    cdef void *memory = NULL
    cdef int oy = 0, ox = 0, rc
    cdef char message[256]
    message[0] = 0
    if h < 1 or w < 1 or y < 0 or x < 0 or data.shape[0] == 0:
        raise ValueError(f"no region {y}, {x}, {h} x {w} of {data.shape[0]} bytes")
    want.y, want.x, want.h, want.w = y, x, h, w
    with nogil:
        rc = fl_jpeg_decode(&data[0], data.shape[0], channels, denom, &want, _malloc, &memory,
                            &img, &oy, &ox, message, sizeof(message))
    try:
        if rc != FL_OK:
            raise (MemoryError if rc == FL_ENOMEM else ValueError)(
                message.decode(errors="replace"))
        if oy > y or ox > x or oy + img.h < y + h or ox + img.w < x + w:
            raise ValueError(f"the decoded part {oy}, {ox}, {img.h} x {img.w} misses the region")
        rows = [(<unsigned char *>img.data)[(y - oy + r) * img.stride + (x - ox) * channels:
                                            (y - oy + r) * img.stride + (x - ox + w) * channels]
                for r in range(h)]
        return b"".join(rows), h, w, channels
    finally:
        free(memory)
