# The declarations of augment.h that the binding uses.
from libc.stdint cimport uint64_t

from image cimport fl_image, fl_rect
from rng cimport fl_rng

cdef extern from "augment.h" nogil:
    void fl_color_jitter(fl_image *img, const double *factor, int present, const int *order)
    void fl_grayscale(fl_image *img)
    size_t fl_gaussian_blur_scratch_bytes(int w, int c, int kh, int kw)
    int fl_gaussian_blur(fl_image *img, int kh, int kw, double sigma_y, double sigma_x,
                         void *scratch, size_t scratch_bytes)
    int fl_erasing_params(fl_rng *rng, double prob, double scale_lo, double scale_hi,
                          double ratio_lo, double ratio_hi, int h, int w, fl_rect *box)
    double fl_rng_normal(fl_rng *r)
    double fl_rng_beta(fl_rng *r, double a, double b)
    double fl_mixup_lambda(double alpha, uint64_t seed, uint64_t epoch, uint64_t step)
    double fl_cutmix_params(double alpha, uint64_t seed, uint64_t epoch, uint64_t step, int h,
                            int w, fl_rect *box)
    double fl_cutmix_box(double lam, int cy, int cx, int h, int w, fl_rect *box)
    int fl_mixup(void *batch, int dtype, int n, size_t item_elems, double lam, void *scratch)
    int fl_cutmix(void *batch, int dtype, int n, int h, int w, int c, int chw,
                  const fl_rect *box, void *scratch)
