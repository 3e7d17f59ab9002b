# The declarations of imagesource.h that the binding uses. A source is an opaque handle.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t

from engine cimport fl_field, fl_scratch
from image cimport fl_image, fl_pipeline
from jpeg cimport fl_alloc_fn, fl_jpeg_decode_fn

cdef extern from "imagesource.h" nogil:
    ctypedef int (*fl_decode_fn)(void *ctx, const uint8_t *data, size_t n, int scale_denom,
                                 int channels, int h, int w, uint8_t *out, char *message)
    ctypedef int (*fl_decode_other_fn)(void *ctx, const uint8_t *data, size_t n, int channels,
                                       int64_t max_pixels, fl_alloc_fn alloc, void *alloc_ctx,
                                       fl_image *out, char *message)
    ctypedef struct fl_image_source:
        pass
    fl_image_source *fl_image_source_create(const fl_pipeline *pipeline, int channels,
                                            int exact, const char *name, int64_t max_pixels,
                                            int64_t max_file_bytes,
                                            fl_jpeg_decode_fn libjpeg_decode,
                                            fl_decode_fn fallback_decode_jpeg,
                                            fl_decode_other_fn decode_other, void *decode_ctx)
    void fl_image_source_destroy(fl_image_source *src)
    void fl_image_source_buffers(fl_image_source *src, int64_t count,
                                 const uint8_t *const *ptrs, const int64_t *lens)
    void fl_image_source_offsets(fl_image_source *src, int64_t count, const uint8_t *base,
                                 const int64_t *offsets)
    void fl_image_source_files(fl_image_source *src, int64_t count, const char *const *paths)
    void fl_image_source_pixels(fl_image_source *src, int64_t count,
                                const uint8_t *const *ptrs, const int32_t *dims,
                                const int64_t *row_strides)
    void fl_image_source_field(fl_field *fields, int f, const fl_image_source *src,
                               int64_t row_bytes)
    int fl_jpeg_size(const uint8_t *data, size_t n, int *h, int *w)

    ctypedef struct fl_decoded:
        fl_image part
        int y, x, src_h, src_w, denom
    int fl_image_source_decode(const fl_image_source *src, const uint8_t *data, size_t n,
                               uint64_t seed, uint64_t epoch, uint64_t index,
                               int64_t dst_bytes, fl_scratch *scratch, fl_decoded *out,
                               char *message)
    int fl_image_source_run(const fl_image_source *src, const uint8_t *data, size_t n,
                            uint64_t seed, uint64_t epoch, uint64_t index, char *dst,
                            int64_t dst_bytes, fl_scratch *scratch, char *message)
