# The declarations of jpeg.h that the bindings use: fastload._jpeg the decoder's symbols,
# fastload._core the pointer type it holds them by.
from image cimport fl_image, fl_rect

cdef extern from "jpeg.h" nogil:
    const char *FL_JPEG_CAPSULE_NAME
    ctypedef void *(*fl_alloc_fn)(void *ctx, size_t bytes)
    ctypedef int (*fl_jpeg_decode_fn)(const unsigned char *data, size_t n, int channels,
                                      int denom, const fl_rect *want, fl_alloc_fn alloc,
                                      void *alloc_ctx, fl_image *out, int *out_y, int *out_x,
                                      char *message, size_t message_bytes)
    int fl_jpeg_library_version()
    int fl_jpeg_decode(const unsigned char *data, size_t n, int channels, int denom,
                       const fl_rect *want, fl_alloc_fn alloc, void *alloc_ctx, fl_image *out,
                       int *out_y, int *out_x, char *message, size_t message_bytes)
    int fl_jpeg_part(const unsigned char *data, size_t n, int denom, const fl_rect *want,
                     unsigned char **part, size_t *part_n, int *dy, int *dx)
    int fl_jpeg_encode(const fl_image *img, int quality, int h_samp, int v_samp, int span,
                       unsigned char **out, size_t *out_n, char *message, size_t message_bytes)
    int fl_jpeg_add_restarts(const unsigned char *data, size_t n, int span, unsigned char **out,
                             size_t *out_n, char *message, size_t message_bytes)
