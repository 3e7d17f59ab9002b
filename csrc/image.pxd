# The declarations of image.h that the binding uses. A pipeline is an opaque handle built
# with the setters; images and rectangles are small values.
from libc.stdint cimport uint8_t, uint64_t

from rng cimport fl_rng

cdef extern from "image.h" nogil:
    ctypedef struct fl_image:
        uint8_t *data
        int h, w, c
        Py_ssize_t stride
    fl_image fl_image_of(uint8_t *data, int h, int w, int c, Py_ssize_t stride)
    ctypedef struct fl_rect:
        int y, x, h, w
    fl_rect fl_rect_of(int y, int x, int h, int w)

    enum:
        FL_CROP_NONE
        FL_CROP_CENTER
        FL_CROP_RANDOM
        FL_CROP_RANDOM_RESIZED
        FL_RESIZE_NONE
        FL_RESIZE_SHORTER
        FL_RESIZE_EXACT
        FL_DTYPE_UINT8
        FL_DTYPE_FLOAT32
        FL_MAX_PIXEL_OPS

    size_t fl_resize_scratch_bytes(int sh, int sw, int dh, int dw, int c)
    int fl_resize(const fl_image *src, fl_image *dst, void *scratch, size_t scratch_bytes)
    size_t fl_resize_area_scratch_bytes(int sh, int sw, int dh, int dw, int c)
    int fl_resize_area(const fl_image *src, fl_image *dst, void *scratch, size_t scratch_bytes)
    int fl_set_simd(int on)
    void fl_flip_horizontal(fl_image *img)
    void fl_normalize_u8(const fl_image *src, float *dst, const float *mean,
                         const float *std, int chw)
    int fl_convert_channels(const fl_image *src, fl_image *dst)
    int fl_rrc_params(fl_rng *rng, int h, int w, double scale_lo, double scale_hi,
                      double ratio_lo, double ratio_hi, int *y, int *x, int *ch, int *cw)
    void fl_center_crop_params(int h, int w, int th, int tw, int *y, int *x)
    int fl_random_crop_params(fl_rng *rng, int h, int w, int th, int tw, int padding,
                              int *y, int *x)

    ctypedef struct fl_pipeline:
        pass
    fl_pipeline *fl_pipeline_create()
    void fl_pipeline_destroy(fl_pipeline *p)
    int fl_pipeline_set_channels(fl_pipeline *p, int channels)
    int fl_pipeline_set_crop(fl_pipeline *p, int kind, int op, int after_resize, int h, int w,
                             int padding, double scale_lo, double scale_hi, double ratio_lo,
                             double ratio_hi)
    int fl_pipeline_set_resize(fl_pipeline *p, int kind, int h, int w)
    int fl_pipeline_set_flip(fl_pipeline *p, double prob, int op)
    int fl_pipeline_set_normalize(fl_pipeline *p, const float *mean, const float *std, int n)
    void fl_pipeline_set_chw(fl_pipeline *p, int chw)
    int fl_pipeline_add_jitter(fl_pipeline *p, int op, int present, const double *lo,
                               const double *hi)
    int fl_pipeline_add_grayscale(fl_pipeline *p, int op, double prob)
    int fl_pipeline_add_blur(fl_pipeline *p, int op, int kh, int kw, double sigma_lo,
                             double sigma_hi)
    int fl_pipeline_set_erasing(fl_pipeline *p, int op, double prob, double scale_lo,
                                double scale_hi, double ratio_lo, double ratio_hi, int random,
                                const float *value, int n_values)
    int fl_pipeline_output_shape(const fl_pipeline *p, int h, int w, int c,
                                 int *oh, int *ow, int *oc)
    int fl_pipeline_prepare(const fl_pipeline *p, int h, int w, uint64_t seed,
                            uint64_t epoch, uint64_t index, fl_rect *crop, int *scale_denom)
    size_t fl_pipeline_scratch_bytes(const fl_pipeline *p, int h, int w, int c)
    int fl_pipeline_run_scaled(const fl_pipeline *p, const fl_image *decoded, int src_h,
                               int src_w, int scale_denom, uint64_t seed, uint64_t epoch,
                               uint64_t index, void *out, void *scratch,
                               size_t scratch_bytes)
