# The declarations of qoi.h that the binding uses.
from libc.stdint cimport uint8_t

cdef extern from "qoi.h" nogil:
    int fl_qoi_header(const uint8_t *buf, size_t n, int *w, int *h, int *channels)
    int fl_qoi_plausible(size_t n, int w, int h)
    size_t fl_qoi_max_size(int w, int h, int channels)
    long fl_qoi_encode(const uint8_t *pixels, int w, int h, int channels,
                       uint8_t *out, size_t cap)
    int fl_qoi_decode(const uint8_t *buf, size_t n, uint8_t *out, int w, int h,
                      int out_channels)
