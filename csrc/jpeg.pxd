# The declarations of jpeg.h that the binding uses.
cdef extern from "jpeg.h" nogil:
    ctypedef void *(*fl_alloc_fn)(void *ctx, size_t bytes)
    int fl_jpeg_library_version()
