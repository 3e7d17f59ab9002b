"""Native image fields: the binding of imagesource.h, with libjpeg's decoder when it loads."""
import importlib
import os

from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memcpy

from engine cimport fl_scratch, fl_scratch_init, fl_scratch_release
from image cimport fl_image, fl_image_of
from imagesource cimport *
from jpeg cimport FL_JPEG_CAPSULE_NAME, fl_alloc_fn, fl_jpeg_decode_fn
from status cimport *


cdef extern from "Python.h":
    object PyMemoryView_FromMemory(char *mem, Py_ssize_t size, int flags)
    int PyBUF_READ


cdef int _fallback_decode_jpeg(void *ctx, const uint8_t *data, size_t n, int scale_denom,
                               int channels, int h, int w, uint8_t *out,
                               char *message) noexcept nogil:
    """Decodes a JPEG through simplejpeg (``ctx``: the module ``fastload._images.codecs``) on
    bytes owned by C, into C memory. The GIL is held around the call only; simplejpeg
    releases it while it decodes."""
    cdef cnp.npy_intp dims[3]
    dims[0] = (h + scale_denom - 1) // scale_denom
    dims[1] = (w + scale_denom - 1) // scale_denom
    dims[2] = channels
    with gil:
        try:
            view = PyMemoryView_FromMemory(<char *>data, n, PyBUF_READ)
            target = cnp.PyArray_SimpleNewFromData(3, dims, cnp.NPY_UINT8, out)
            (<object>ctx).decode_jpeg_into(view, target, scale_denom, channels)
            return FL_OK
        except BaseException as exc:
            _write_message(message, exc)
            return FL_EFAILED if isinstance(exc, Exception) else FL_EINTERRUPT


cdef int _decode_other(void *ctx, const uint8_t *data, size_t n, int channels,
                       int64_t max_pixels, fl_alloc_fn alloc, void *alloc_ctx, fl_image *out,
                       char *message) noexcept nogil:
    """Decodes an image of another format (PNG, BMP, ...) through Pillow, with the GIL,
    into C memory from ``alloc``."""
    cdef uint8_t *pixels
    cdef const uint8_t[:, :, ::1] decoded
    with gil:
        try:
            view = PyMemoryView_FromMemory(<char *>data, n, PyBUF_READ)
            decoded = (<object>ctx).decode_pillow(view, channels, max_pixels)
            pixels = <uint8_t *>alloc(alloc_ctx, decoded.shape[0] * decoded.shape[1] * channels)
            if pixels == NULL:
                raise MemoryError("out of memory")
            memcpy(pixels, &decoded[0, 0, 0], decoded.shape[0] * decoded.shape[1] * channels)
            out[0] = fl_image_of(pixels, <int>decoded.shape[0], <int>decoded.shape[1], channels,
                                 decoded.shape[1] * channels)
            return FL_OK
        except BaseException as exc:
            _write_message(message, exc)
            return FL_EFAILED if isinstance(exc, Exception) else FL_EINTERRUPT


cdef object _bytes_of(base, str what):
    """``base``, a uint8 array (any shape) or bytes-like object, as flat C-contiguous bytes;
    a ValueError for an array of another type, whose values a cast would change."""
    a = np.asarray(base)
    if a.dtype != np.uint8:
        raise ValueError(f"{what} must be a uint8 array or a bytes-like object, got {a.dtype}")
    return np.ascontiguousarray(a).reshape(-1)


cdef object _positions(values, str what):
    """``values`` as a 1-D int64 array; a ValueError for anything but 1-D integers (a
    float would be truncated, a 2-D array paired up the wrong way)."""
    a = np.asarray(values)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise ValueError(f"{what} must be a 1-D sequence of integers, got {a.dtype} of shape "
                         f"{a.shape}")
    return a.astype(np.int64)


# libjpeg's decoder lives in fastload._jpeg, the one module that links libjpeg, so that this
# one loads without it. Set once, here, while the module is imported: read-only afterwards.
cdef fl_jpeg_decode_fn _libjpeg_decode = NULL
cdef int _jpeg_version = 0


def _load_jpeg():
    """Takes the decoder from fastload._jpeg; returns why JPEG goes through simplejpeg
    instead, or "" when it does not."""
    global _libjpeg_decode, _jpeg_version
    try:
        _jpeg = importlib.import_module("fastload._jpeg")
    except ModuleNotFoundError as exc:
        if exc.name != "fastload._jpeg":
            raise
        return "built without libjpeg's headers"
    except ImportError as exc:
        return f"libjpeg-turbo could not be loaded: {exc}"
    capsule = _jpeg.decoder()
    if not PyCapsule_IsValid(capsule, FL_JPEG_CAPSULE_NAME):
        raise ImportError(
            f"{_jpeg.__file__} was built from other sources than fastload._core: rebuild both "
            "(python setup.py build_ext --inplace, or reinstall fastload)")
    _libjpeg_decode = (<fl_jpeg_decode_fn *>PyCapsule_GetPointer(capsule, FL_JPEG_CAPSULE_NAME))[0]
    _jpeg_version = _jpeg.library_version()
    return ""


JPEG_FALLBACK_REASON = _load_jpeg()


def jpeg_library_version():
    """The libjpeg-turbo version number the JPEG decoder in C links (e.g. 2001005), or 0
    when JPEG decodes through simplejpeg (``JPEG_FALLBACK_REASON`` says why)."""
    return _jpeg_version


def jpeg_size(data):
    """(height, width) from a JPEG's frame header; ValueError if it has none."""
    cdef const unsigned char[::1] view = memoryview(data).cast("B")
    cdef int h = 0, w = 0
    cdef int rc = FL_ETRUNCATED
    if view.shape[0] != 0:
        rc = fl_jpeg_size(&view[0], view.shape[0], &h, &w)
    if rc != FL_OK:
        raise _CoreError(rc, "not a JPEG, or its header is truncated or corrupt")
    return h, w


cdef class ImageSource:
    """The state of a native image field: where each image is, the compiled pipeline and
    the decoders, for C to load item by item. Holds every Python object the C side points
    into, for as long as it lives.

    ``pipeline`` is the chain to run; ``channels`` what encoded images decode to; ``name``
    what messages call the images; ``decoder`` the module with the Python decoders
    (``fastload._images.codecs``); images over ``max_pixels`` and files over ``max_file_bytes``
    are refused. Then exactly one of: ``buffers`` (a sequence of bytes-like encoded
    images), ``spans`` (``(bases, base_of, starts, ends)``: image i is
    ``bases[base_of[i]][starts[i]:ends[i]]``, with uint8 arrays as bases; ``base_of`` None
    for one base), ``offsets`` (``(base, offsets)``: image i is
    ``base[offsets[i]:offsets[i + 1]]``), ``paths`` (files) or ``pixels`` (decoded uint8
    HW or HWC arrays whose rows are packed pixels)."""
    cdef fl_image_source *source
    cdef Pipeline pipeline
    cdef readonly int64_t count
    cdef list owners

    def __cinit__(self, Pipeline pipeline not None, *, int channels, str name, decoder,
                  int64_t max_pixels, int64_t max_file_bytes, bint exact=False,
                  buffers=None, spans=None, offsets=None, paths=None, pixels=None):
        given = [w for w in (buffers, spans, offsets, paths, pixels) if w is not None]
        if len(given) != 1:
            raise ValueError("an image source needs exactly one of buffers, spans, offsets, "
                             "paths or pixels")
        self.pipeline = pipeline
        self.owners = [decoder]
        self.source = fl_image_source_create(pipeline.p, channels, exact,
                                             name.encode("utf-8", "replace"), max_pixels,
                                             max_file_bytes, _libjpeg_decode,
                                             _fallback_decode_jpeg, _decode_other,
                                             <void *>decoder)
        if self.source == NULL:
            if channels not in (1, 3, 4):
                raise ValueError(f"an image source decodes to 1, 3 or 4 channels, not {channels}")
            raise MemoryError("out of memory making an image source")
        if buffers is not None:
            self._buffers(buffers)
        elif spans is not None:
            bases, base_of, starts, ends = _items(spans, 4, "spans (bases, base_of, starts, ends)")
            self._spans(bases, base_of, starts, ends)
        elif offsets is not None:
            base, where = _items(offsets, 2, "offsets (base, offsets)")
            self._offsets(base, where)
        elif paths is not None:
            self._paths(paths)
        else:
            self._pixels(pixels)

    def __dealloc__(self):
        fl_image_source_destroy(self.source)

    cdef object _keep(self, values, dtype):
        """``values`` as a C-contiguous array of ``dtype`` (at least one element) that lives
        as long as this source."""
        array = np.ascontiguousarray(values, dtype=dtype)
        if array.size == 0:
            array = np.zeros(1, dtype)
        self.owners.append(array)
        return array

    cdef void *_data(self, array):
        return cnp.PyArray_DATA(<cnp.ndarray>array)

    cdef _buffers(self, buffers):
        cdef const uint8_t[::1] view
        cdef Py_ssize_t i, n = len(buffers)
        # The exports, not just the objects: while one is held, a bytearray cannot be
        # resized nor an mmap closed under the pointer C keeps.
        kept = [memoryview(b).cast("B") for b in buffers]
        self.owners.append(kept)
        ptrs = self._keep(np.zeros(n, np.uintp), np.uintp)
        lens = self._keep(np.zeros(n, np.int64), np.int64)
        cdef size_t[::1] p = ptrs
        cdef int64_t[::1] l = lens
        for i in range(n):
            view = kept[i]
            l[i] = view.shape[0]
            p[i] = <size_t>&view[0] if view.shape[0] else 0
        self.count = n
        fl_image_source_buffers(self.source, n, <const uint8_t *const *>self._data(ptrs),
                                <const int64_t *>self._data(lens))

    cdef _spans(self, bases, base_of, starts, ends):
        cdef Py_ssize_t i, n = len(starts)
        cdef const uint8_t[::1] base
        bases = [_bytes_of(b, "spans: each base") for b in bases]
        self.owners.append(bases)
        where = np.zeros(n, np.int64) if base_of is None else _positions(base_of, "spans: base_of")
        starts, ends = _positions(starts, "spans: starts"), _positions(ends, "spans: ends")
        if where.shape[0] != n or ends.shape[0] != n:
            raise ValueError("spans need a base, a start and an end per image")
        if n and (where.min() < 0 or where.max() >= len(bases)):
            raise ValueError("spans name a base that is not there")
        sizes = np.array([b.shape[0] for b in bases], np.int64)
        if n and ((starts < 0) | (ends < starts) | (ends > sizes[where])).any():
            raise ValueError("spans reach outside their base")
        # Each base's first byte, then each item's: base_of[i]'s plus its start.
        firsts = np.zeros(len(bases), np.uintp)
        for i in range(len(bases)):
            base = bases[i]
            firsts[i] = <size_t>&base[0] if base.shape[0] else 0
        ptrs = self._keep(firsts[where] + starts.astype(np.uintp), np.uintp)
        lens = self._keep(ends - starts, np.int64)
        self.count = n
        fl_image_source_buffers(self.source, n, <const uint8_t *const *>self._data(ptrs),
                                <const int64_t *>self._data(lens))

    cdef _offsets(self, base, offsets):
        base = _bytes_of(base, "offsets: the base")
        offsets = _positions(offsets, "offsets")
        n = offsets.shape[0] - 1
        if n < 0 or offsets[0] < 0 or offsets[n] > base.shape[0] or (np.diff(offsets) < 0).any():
            raise ValueError("offsets must rise from 0 to at most the size of the base")
        base, offsets = self._keep(base, np.uint8), self._keep(offsets, np.int64)
        self.count = n
        fl_image_source_offsets(self.source, n, <const uint8_t *>self._data(base),
                                <const int64_t *>self._data(offsets))

    cdef _paths(self, paths):
        cdef Py_ssize_t i, n = len(paths)
        encoded = [os.fsencode(path) for path in paths]
        self.owners.append(encoded)
        ptrs = self._keep(np.zeros(n, np.uintp), np.uintp)
        cdef size_t[::1] p = ptrs
        for i in range(n):
            p[i] = <size_t><const char *>encoded[i]
        self.count = n
        fl_image_source_files(self.source, n, <const char *const *>self._data(ptrs))

    cdef _pixels(self, images):
        cdef Py_ssize_t i, n = len(images)
        cdef cnp.ndarray a
        kept = list(images)
        self.owners.append(kept)
        ptrs = self._keep(np.zeros(n, np.uintp), np.uintp)
        dims = self._keep(np.zeros((n, 3), np.int32), np.int32)
        strides = self._keep(np.zeros(n, np.int64), np.int64)
        cdef size_t[::1] p = ptrs
        for i in range(n):
            a = kept[i]
            c = a.shape[2] if a.ndim == 3 else 1
            if (a.dtype != np.uint8 or a.ndim not in (2, 3) or a.strides[1] != c
                    or (a.ndim == 3 and a.strides[2] != 1) or a.strides[0] < c * a.shape[1]):
                raise ValueError(f"image {i}: a native source reads uint8 HW or HWC arrays "
                                 f"whose rows are packed pixels")
            p[i] = <size_t>cnp.PyArray_DATA(a)
            dims[i] = (a.shape[0], a.shape[1], c)
            strides[i] = a.strides[0]
        self.count = n
        fl_image_source_pixels(self.source, n, <const uint8_t *const *>self._data(ptrs),
                               <const int32_t *>self._data(dims),
                               <const int64_t *>self._data(strides))

    def run(self, data, out, uint64_t seed=0, uint64_t epoch=0, uint64_t index=0):
        """Decodes the encoded image ``data`` and runs the pipeline on it into ``out`` (a
        writable C-contiguous array sized for this image), as a loader does for item
        ``index``. Raises ValueError naming what is wrong with the image."""
        if (not isinstance(out, np.ndarray) or not out.flags.c_contiguous
                or not out.flags.writeable):
            # Anything else would be reshaped into a copy, and the output lost in it.
            raise ValueError("out must be a writable C-contiguous array")
        cdef const uint8_t[::1] src = memoryview(data).cast("B")
        cdef uint8_t[::1] dst = out.reshape(-1).view(np.uint8)
        cdef fl_scratch scratch
        cdef char message[FL_MESSAGE_BYTES]
        cdef int rc
        cdef const uint8_t *p = &src[0] if src.shape[0] else NULL
        cdef char *d = <char *>&dst[0] if dst.shape[0] else NULL
        fl_scratch_init(&scratch)
        message[0] = 0
        try:
            with nogil:
                rc = fl_image_source_run(self.source, p, src.shape[0], seed, epoch, index,
                                         d, dst.shape[0], &scratch, message)
        finally:
            fl_scratch_release(&scratch)
        if rc != FL_OK:
            raise _CoreError(rc, message.decode("utf-8", "replace"))
        return out

    def decode(self, data, uint64_t seed=0, uint64_t epoch=0, uint64_t index=0):
        """What the loader decodes of ``data`` for item ``index``, without running the rest
        of the pipeline: ``(pixels, (y, x), scale_denom)``, the part of the image at
        1/scale_denom (only the crop's region for a JPEG) and where it sits in it."""
        cdef const uint8_t[::1] src = memoryview(data).cast("B")
        cdef fl_scratch scratch
        cdef fl_decoded d
        cdef uint8_t *dst
        cdef Py_ssize_t row, row_bytes
        cdef char message[FL_MESSAGE_BYTES]
        cdef int rc
        cdef const uint8_t *p = &src[0] if src.shape[0] else NULL
        fl_scratch_init(&scratch)
        try:
            with nogil:
                rc = fl_image_source_decode(self.source, p, src.shape[0], seed, epoch, index,
                                            -1, &scratch, &d, message)
            if rc != FL_OK:
                raise _CoreError(rc, message.decode("utf-8", "replace"))
            pixels = np.empty((d.part.h, d.part.w, d.part.c), np.uint8)
            row_bytes = d.part.w * d.part.c
            dst = <uint8_t *>cnp.PyArray_DATA(pixels)
            for row in range(d.part.h):
                memcpy(dst + row * row_bytes, d.part.data + row * d.part.stride, row_bytes)
        finally:
            fl_scratch_release(&scratch)
        return pixels, (d.y, d.x), d.denom
