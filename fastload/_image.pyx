# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin binding of csrc/image.c: numpy arrays in, numpy arrays out; no pixel work here.

Every call that touches pixels releases the GIL. Arrays are 8-bit HWC with contiguous
pixels (row stride free).
"""
from libc.stdint cimport uint8_t, uint64_t
from libc.string cimport memset

import numpy as np
cimport numpy as cnp

cnp.import_array()


cdef extern from "image.h" nogil:
    ctypedef struct fl_rng:
        uint64_t state
    fl_rng fl_rng_for(uint64_t seed, uint64_t epoch, uint64_t index, uint64_t op)

    ctypedef struct fl_image:
        uint8_t *data
        int h, w, c
        Py_ssize_t stride
    ctypedef struct fl_plan_rect:
        int y, x, h, w

    int FL_OK, FL_EINVAL, FL_ESCRATCH, FL_ETOOSMALL
    int FL_CROP_NONE, FL_CROP_CENTER, FL_CROP_RANDOM, FL_CROP_RANDOM_RESIZED
    int FL_RESIZE_NONE, FL_RESIZE_SHORTER, FL_RESIZE_EXACT
    int FL_DTYPE_UINT8, FL_DTYPE_FLOAT32

    size_t fl_resize_scratch_bytes(int sh, int sw, int dh, int dw, int c)
    int fl_resize(const fl_image *src, fl_image *dst, void *scratch, size_t scratch_bytes)
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
        int channels
        int crop_kind, crop_op, crop_after_resize, crop_h, crop_w, crop_padding
        double scale_lo, scale_hi, ratio_lo, ratio_hi
        int resize_kind, resize_h, resize_w
        double flip_p
        int flip_op
        int normalize
        float mean[4]
        float std[4]
        int chw, out_dtype
    int fl_pipeline_output_shape(const fl_pipeline *p, int h, int w, int c,
                                 int *oh, int *ow, int *oc)
    int fl_pipeline_prepare(const fl_pipeline *p, int h, int w, uint64_t seed,
                            uint64_t epoch, uint64_t index, fl_plan_rect *crop,
                            int *scale_denom)
    size_t fl_pipeline_scratch_bytes(const fl_pipeline *p, int h, int w, int c)
    int fl_pipeline_run_scaled(const fl_pipeline *p, const fl_image *decoded, int src_h,
                               int src_w, int scale_denom, uint64_t seed, uint64_t epoch,
                               uint64_t index, void *out, void *scratch,
                               size_t scratch_bytes)


CROP_KINDS = {None: FL_CROP_NONE, "center": FL_CROP_CENTER, "random": FL_CROP_RANDOM,
              "random_resized": FL_CROP_RANDOM_RESIZED}
RESIZE_KINDS = {None: FL_RESIZE_NONE, "shorter": FL_RESIZE_SHORTER, "exact": FL_RESIZE_EXACT}


def _check(int err, str what):
    if err == FL_ETOOSMALL:
        raise ValueError(f"{what}: the image (with its padding) is smaller than the crop")
    if err == FL_ESCRATCH:
        raise RuntimeError(f"{what}: scratch buffer too small (a fastload bug)")
    if err != FL_OK:
        raise ValueError(f"{what}: invalid arguments (error {err})")


cdef fl_image _view(cnp.ndarray a) except *:
    """An fl_image over an array made by as_image (uint8 HWC, pixels contiguous)."""
    cdef fl_image im
    im.c = <int>a.shape[2]
    if im.c < 1 or im.c > 4:
        raise ValueError(f"expected 1 to 4 channels, got {im.c}")
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"empty image of shape {(<object>a).shape}")
    im.data = <uint8_t *>cnp.PyArray_DATA(a)
    im.h = <int>a.shape[0]
    im.w = <int>a.shape[1]
    im.stride = a.strides[0]
    return im


def as_image(x):
    """x as a uint8 HWC array with contiguous rows (HW becomes HW1); no copy when possible."""
    a = np.asarray(x)
    if a.ndim == 2:
        a = a[:, :, None]
    if a.ndim != 3 or a.dtype != np.uint8:
        raise ValueError(f"expected a uint8 HW or HWC array, got {a.dtype} of shape {a.shape}")
    if a.strides[1] != a.shape[2] or a.strides[2] != 1 or a.strides[0] < 0:
        a = np.ascontiguousarray(a)
    return a


def resize(img, int height, int width):
    """img (uint8 HWC) resampled to height x width; antialiased when shrinking."""
    cdef cnp.ndarray src = as_image(img)
    cdef fl_image s = _view(src)
    cdef cnp.ndarray out = np.empty((height, width, s.c), np.uint8)
    cdef fl_image d = _view(out)
    cdef size_t n = fl_resize_scratch_bytes(s.h, s.w, height, width, s.c)
    if n == 0:
        raise ValueError(f"resize: bad target size {height}x{width}")
    cdef cnp.ndarray scratch = np.empty(n, np.uint8)
    cdef void *sp = cnp.PyArray_DATA(scratch)
    cdef int err
    with nogil:
        err = fl_resize(&s, &d, sp, n)
    _check(err, "resize")
    return out


def flip_horizontal(img):
    """Mirrors img (uint8 HWC, writable) left-right in place and returns it."""
    cdef cnp.ndarray a = as_image(img)
    if not a.flags.writeable:
        raise ValueError("flip_horizontal needs a writable array")
    cdef fl_image im = _view(a)
    with nogil:
        fl_flip_horizontal(&im)
    return a


def normalize(img, mean, std, bint chw=False):
    """float32 (x/255 - mean[c]) / std[c] of img (uint8 HWC), HWC or CHW."""
    cdef cnp.ndarray a = as_image(img)
    cdef fl_image im = _view(a)
    cdef float m[4]
    cdef float s[4]
    if len(mean) != im.c or len(std) != im.c:
        raise ValueError(f"normalize: need {im.c} means and stds")
    for i in range(im.c):
        m[i] = mean[i]
        s[i] = std[i]
    shape = (im.c, im.h, im.w) if chw else (im.h, im.w, im.c)
    cdef cnp.ndarray out = np.empty(shape, np.float32)
    cdef float *o = <float *>cnp.PyArray_DATA(out)
    with nogil:
        fl_normalize_u8(&im, o, m, s, chw)
    return out


def convert_channels(img, int channels):
    """img (uint8 HWC with 1, 3 or 4 channels) with `channels` channels."""
    cdef cnp.ndarray a = as_image(img)
    cdef fl_image s = _view(a)
    cdef cnp.ndarray out = np.empty((s.h, s.w, channels), np.uint8)
    cdef fl_image d = _view(out)
    cdef int err
    with nogil:
        err = fl_convert_channels(&s, &d)
    _check(err, "convert_channels")
    return out


def rrc_params(int h, int w, scale, ratio, uint64_t seed=0, uint64_t epoch=0,
               uint64_t index=0, uint64_t op=0):
    """RandomResizedCrop's (y, x, h, w) for an h x w image, drawn from the given key."""
    cdef fl_rng rng = fl_rng_for(seed, epoch, index, op)
    cdef int y, x, ch, cw
    _check(fl_rrc_params(&rng, h, w, scale[0], scale[1], ratio[0], ratio[1],
                         &y, &x, &ch, &cw), "rrc_params")
    return y, x, ch, cw


def center_crop_params(int h, int w, int th, int tw):
    """CenterCrop's (y, x) offset; negative when the image is smaller (zero padding)."""
    cdef int y, x
    fl_center_crop_params(h, w, th, tw, &y, &x)
    return y, x


def random_crop_params(int h, int w, int th, int tw, int padding=0, uint64_t seed=0,
                       uint64_t epoch=0, uint64_t index=0, uint64_t op=0):
    """RandomCrop's (y, x) in source pixels (negative inside the padding)."""
    cdef fl_rng rng = fl_rng_for(seed, epoch, index, op)
    cdef int y, x
    _check(fl_random_crop_params(&rng, h, w, th, tw, padding, &y, &x), "random_crop_params")
    return y, x


cdef class Pipeline:
    """A compiled transform chain: an fl_pipeline struct that C code can use directly.

    `address` is the struct's address as an int, valid while this object lives.
    """
    cdef fl_pipeline p

    def __init__(self, *, int channels=0, crop=None, int crop_op=0,
                 bint crop_after_resize=False, crop_size=(0, 0), int padding=0,
                 scale=(0.0, 0.0), ratio=(0.0, 0.0), resize=None, resize_size=(0, 0),
                 double flip_p=0.0, int flip_op=0, mean=None, std=None, bint chw=False):
        memset(&self.p, 0, sizeof(fl_pipeline))
        self.p.channels = channels
        self.p.crop_kind = CROP_KINDS[crop]
        self.p.crop_op = crop_op
        self.p.crop_after_resize = crop_after_resize
        self.p.crop_h, self.p.crop_w = crop_size
        self.p.crop_padding = padding
        self.p.scale_lo, self.p.scale_hi = scale
        self.p.ratio_lo, self.p.ratio_hi = ratio
        self.p.resize_kind = RESIZE_KINDS[resize]
        self.p.resize_h, self.p.resize_w = resize_size
        self.p.flip_p = flip_p
        self.p.flip_op = flip_op
        self.p.normalize = mean is not None
        if mean is not None:
            for i in range(4):
                self.p.mean[i] = mean[i % len(mean)]
                self.p.std[i] = std[i % len(std)]
        self.p.chw = chw
        self.p.out_dtype = FL_DTYPE_FLOAT32 if mean is not None else FL_DTYPE_UINT8

    @property
    def address(self):
        return <Py_ssize_t>&self.p

    def output_shape(self, int h, int w, int c):
        """(oh, ow, oc) of the output for an h x w x c source."""
        cdef int oh, ow, oc
        _check(fl_pipeline_output_shape(&self.p, h, w, c, &oh, &ow, &oc), "output shape")
        return oh, ow, oc

    def prepare(self, int h, int w, uint64_t seed=0, uint64_t epoch=0, uint64_t index=0):
        """((y, x, h, w) crop in source pixels, JPEG scale denominator) for an h x w source."""
        cdef fl_plan_rect r
        cdef int d
        _check(fl_pipeline_prepare(&self.p, h, w, seed, epoch, index, &r, &d), "prepare")
        return (r.y, r.x, r.h, r.w), d

    def run(self, decoded, int src_h, int src_w, int scale_denom=1, uint64_t seed=0,
            uint64_t epoch=0, uint64_t index=0):
        """Runs the chain on `decoded` (the src_h x src_w source at 1/scale_denom)."""
        cdef cnp.ndarray a = as_image(decoded)
        cdef fl_image im = _view(a)
        cdef int oh, ow, oc
        _check(fl_pipeline_output_shape(&self.p, src_h, src_w, im.c, &oh, &ow, &oc), "run")
        shape = (oc, oh, ow) if self.p.chw else (oh, ow, oc)
        cdef cnp.ndarray out = np.empty(shape, np.float32 if self.p.normalize else np.uint8)
        cdef size_t n = fl_pipeline_scratch_bytes(&self.p, src_h, src_w, im.c)
        cdef cnp.ndarray scratch = np.empty(n, np.uint8)
        cdef void *sp = cnp.PyArray_DATA(scratch)
        cdef void *op = cnp.PyArray_DATA(out)
        cdef int err
        with nogil:
            err = fl_pipeline_run_scaled(&self.p, &im, src_h, src_w, scale_denom, seed, epoch,
                                         index, op, sp, n)
        _check(err, "run")
        return out
