"""Image kernels, batch mixes and compiled pipelines: the binding of image.h and augment.h.
Numpy arrays in, numpy arrays out; no pixel work here. Every call that touches pixels
releases the GIL. Arrays are 8-bit HWC with contiguous pixels (row stride free)."""
cimport cython
from libc.limits cimport INT_MAX
from libc.math cimport isfinite
from libc.stdint cimport uint8_t, uint64_t

from augment cimport *
from image cimport *
from rng cimport fl_rng, fl_rng_for
from status cimport *


CROP_KINDS = {None: FL_CROP_NONE, "center": FL_CROP_CENTER, "random": FL_CROP_RANDOM,
              "random_resized": FL_CROP_RANDOM_RESIZED}
RESIZE_KINDS = {None: FL_RESIZE_NONE, "shorter": FL_RESIZE_SHORTER, "exact": FL_RESIZE_EXACT}


cdef int _check(int err, str what) except -1:
    """Raises for a code of status.h: a bug of fastload's for a scratch too small, a
    CoreError (a ValueError) carrying the code and naming `what` for anything else."""
    if err == FL_OK:
        return 0
    if err == FL_ESCRATCH:
        raise RuntimeError(f"{what}: scratch buffer too small (a fastload bug)")
    if err == FL_ENOMEM:
        raise MemoryError(what)
    raise _CoreError(err, f"{what}: {fl_strerror(err).decode()}")


cdef fl_image _view(cnp.ndarray a) except *:
    """An fl_image over an array made by as_image (uint8 HWC, pixels contiguous)."""
    cdef int c = <int>a.shape[2]
    if c < 1 or c > 4:
        raise ValueError(f"expected 1 to 4 channels, got {c}")
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"empty image of shape {(<object>a).shape}")
    return fl_image_of(<uint8_t *>cnp.PyArray_DATA(a), <int>a.shape[0], <int>a.shape[1], c,
                       a.strides[0])


cdef tuple _items(value, Py_ssize_t n, str what):
    """``value`` as a tuple of its n items; a ValueError naming ``what`` for anything that
    is not a sequence of n items (C reads exactly n: fewer would be read past their end)."""
    try:
        items = tuple(value)
    except TypeError:
        items = None
    if items is None or len(items) != n or isinstance(value, (str, bytes, dict)):
        raise ValueError(f"{what} must be a sequence of {n} values, got {value!r}")
    return items


cdef double _finite(value, str what) except? -1:
    """``value`` as a finite float; a ValueError naming ``what`` for NaN or an infinity,
    which C would turn into an arbitrary integer or a picture of NaNs."""
    cdef double x = value
    if not isfinite(x):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return x


cdef tuple _reals(value, Py_ssize_t n, str what):
    """``value`` as a tuple of its n items, each a finite float (see _items, _finite)."""
    return tuple([_finite(x, what) for x in _items(value, n, what)])


cdef int _kind(dict kinds, value, str what) except -1:
    """The C code of a stage kind named by ``value``; a ValueError naming the choices."""
    try:
        return kinds[value]
    except (KeyError, TypeError):
        raise ValueError(f"{what} must be one of {list(kinds)}, got {value!r}") from None


cdef int _positive(double value, str what) except -1:
    """Refuses a parameter of a Gamma draw that is not a finite number > 0: the sampler
    would never stop (or recurse without end) on one, or draw NaN."""
    if not (value > 0 and isfinite(value)):
        raise ValueError(f"{what} must be a finite number > 0, got {value}")
    return 0


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


def resize_area_scratch_bytes(int h, int w, int c, int height, int width):
    """The bytes of scratch ``resize_area`` needs to shrink an h x w x c image to height x
    width (0: not a shrink it does)."""
    if h < 1 or w < 1 or c < 1 or c > 4:
        return 0
    return fl_resize_area_scratch_bytes(h, w, height, width, c)


def resize_area(img, int height, int width, out=None, scratch=None):
    """img (uint8 HWC) shrunk to height x width by exact area averaging (each output pixel
    the mean of the area it covers, rounded half up); ValueError unless it shrinks.
    ``out``: a writable uint8 (height, width, c) array with contiguous pixels to write
    into (returned), else a new one; ``scratch``: a writable contiguous uint8 array of at
    least ``resize_area_scratch_bytes`` bytes to work in, else one of its own (a caller
    that shrinks many images reuses both: no allocation, no page faults per image)."""
    cdef cnp.ndarray src = as_image(img)
    cdef fl_image s = _view(src)
    cdef size_t n = fl_resize_area_scratch_bytes(s.h, s.w, height, width, s.c)
    if n == 0:
        raise ValueError(
            f"resize_area only shrinks, asked {(s.h, s.w)} -> {(height, width)}"
        )
    cdef cnp.ndarray dst
    if out is None:
        dst = np.empty((height, width, s.c), np.uint8)
    else:
        if not isinstance(out, np.ndarray):
            raise TypeError(f"resize_area's out must be a numpy array, got {type(out).__name__}")
        dst = out
        if (
            dst.dtype != np.uint8 or dst.ndim != 3 or not dst.flags.writeable
            or (<object>dst).shape != (height, width, s.c)
            or dst.strides[1] != s.c or dst.strides[2] != 1 or dst.strides[0] < 0
        ):
            raise ValueError(
                f"resize_area's out must be a writable uint8 array of shape "
                f"{(height, width, s.c)} with contiguous pixels, got {out.dtype} of shape "
                f"{out.shape}"
            )
    cdef fl_image d = _view(dst)
    cdef cnp.ndarray room
    if scratch is None:
        room = np.empty(n, np.uint8)
    else:
        if not isinstance(scratch, np.ndarray):
            raise TypeError(
                f"resize_area's scratch must be a numpy array, got {type(scratch).__name__}"
            )
        room = scratch
        if (
            room.dtype != np.uint8 or not room.flags.writeable
            or not room.flags.c_contiguous or <size_t>room.nbytes < n
        ):
            raise ValueError(
                f"resize_area's scratch must be a writable contiguous uint8 array of at "
                f"least {n} bytes, got {scratch.dtype} of {scratch.nbytes} bytes"
            )
    cdef void *sp = cnp.PyArray_DATA(room)
    cdef int err
    with nogil:
        err = fl_resize_area(&s, &d, sp, n)
    _check(err, "resize_area")
    return dst


def set_simd(bint on):
    """Turns the resampler's AVX2 kernel on (where the CPU has it) or off; returns whether
    it was on. For tests, which compare both: call it while nothing resamples."""
    return bool(fl_set_simd(on))


def flip_horizontal(img):
    """Mirrors img (uint8 HWC, writable) left-right in place and returns it."""
    cdef cnp.ndarray a = as_image(img)
    if not a.flags.writeable:
        raise ValueError("flip_horizontal needs a writable array")
    cdef fl_image im = _view(a)
    with nogil:
        fl_flip_horizontal(&im)
    return a


cdef tuple _means_and_stds(mean, std, str what):
    """(mean, std) as tuples of 1 to 4 finite floats each, as many stds as means, none 0."""
    mean, std = tuple(mean), tuple(std)
    if not 1 <= len(mean) <= 4 or len(std) != len(mean):
        raise ValueError(f"{what}: 1 to 4 means and as many stds, got {len(mean)} and "
                         f"{len(std)}")
    mean = _reals(mean, len(mean), f"{what}: mean")
    std = _reals(std, len(std), f"{what}: std")
    if 0.0 in std:
        raise ValueError(f"{what}: a std of 0 divides by 0, got {std}")
    return mean, std


def normalize(img, mean, std, bint chw=False):
    """float32 (x/255 - mean[c]) / std[c] of img (uint8 HWC), HWC or CHW."""
    cdef cnp.ndarray a = as_image(img)
    cdef fl_image im = _view(a)
    cdef float m[4]
    cdef float s[4]
    mean, std = _means_and_stds(mean, std, "normalize")
    if len(mean) != im.c:
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
    scale_lo, scale_hi = _reals(scale, 2, "rrc_params: scale")
    ratio_lo, ratio_hi = _reals(ratio, 2, "rrc_params: ratio")
    _check(fl_rrc_params(&rng, h, w, scale_lo, scale_hi, ratio_lo, ratio_hi,
                         &y, &x, &ch, &cw), "rrc_params")
    return y, x, ch, cw


def center_crop_params(int h, int w, int th, int tw):
    """CenterCrop's (y, x) offset; negative when the image is smaller (zero padding)."""
    cdef int y, x
    if h < 1 or w < 1 or th < 1 or tw < 1:
        raise ValueError(f"center_crop_params: a {th} x {tw} crop of a {h} x {w} image: "
                         "sizes are at least 1")
    fl_center_crop_params(h, w, th, tw, &y, &x)
    return y, x


def random_crop_params(int h, int w, int th, int tw, int padding=0, uint64_t seed=0,
                       uint64_t epoch=0, uint64_t index=0, uint64_t op=0):
    """RandomCrop's (y, x) in source pixels (negative inside the padding)."""
    cdef fl_rng rng = fl_rng_for(seed, epoch, index, op)
    cdef int y, x
    _check(fl_random_crop_params(&rng, h, w, th, tw, padding, &y, &x), "random_crop_params")
    return y, x


def color_jitter(img, factors, order=(0, 1, 2, 3)):
    """A copy of img (uint8 HWC) with ColorJitter's adjustments applied in `order`:
    factors is (brightness, contrast, saturation, hue), None where an adjustment is off."""
    cdef cnp.ndarray out = np.array(as_image(img), copy=True)
    cdef fl_image im = _view(out)
    cdef double f[4]
    cdef int o[4]
    cdef int present = 0
    if len(factors) != 4 or sorted(order) != [0, 1, 2, 3]:
        raise ValueError("color_jitter: 4 factors and a permutation of 0..3 as the order")
    for k in range(4):
        f[k] = 0.0 if factors[k] is None else _finite(factors[k], "color_jitter: a factor")
        present |= (factors[k] is not None) << k
        o[k] = order[k]
    with nogil:
        fl_color_jitter(&im, f, present, o)
    return out


def grayscale(img):
    """A copy of img (uint8 HWC) with every pixel's colour channels set to its luma."""
    cdef cnp.ndarray out = np.array(as_image(img), copy=True)
    cdef fl_image im = _view(out)
    with nogil:
        fl_grayscale(&im)
    return out


def gaussian_blur(img, int kh, int kw, double sigma_y, double sigma_x):
    """A copy of img (uint8 HWC) blurred by a kh x kw Gaussian (reflected edges)."""
    cdef cnp.ndarray out = np.array(as_image(img), copy=True)
    cdef fl_image im = _view(out)
    cdef size_t n = fl_gaussian_blur_scratch_bytes(im.w, im.c, kh, kw)
    cdef cnp.ndarray scratch = np.empty(max(<Py_ssize_t>n, 1), np.uint8)
    cdef void *sp = cnp.PyArray_DATA(scratch)
    cdef int err
    with nogil:
        err = fl_gaussian_blur(&im, kh, kw, sigma_y, sigma_x, sp, n)
    _check(err, "gaussian_blur")
    return out


def erasing_params(int h, int w, double p, scale, ratio, uint64_t seed=0, uint64_t epoch=0,
                   uint64_t index=0, uint64_t op=0):
    """RandomErasing's (y, x, h, w) box for an h x w output from the given key, or None."""
    cdef fl_rng rng = fl_rng_for(seed, epoch, index, op)
    cdef fl_rect b
    _finite(p, "erasing_params: p")
    scale_lo, scale_hi = _reals(scale, 2, "erasing_params: scale")
    ratio_lo, ratio_hi = _reals(ratio, 2, "erasing_params: ratio")
    if not fl_erasing_params(&rng, p, scale_lo, scale_hi, ratio_lo, ratio_hi, h, w, &b):
        return None
    return b.y, b.x, b.h, b.w


@cython.boundscheck(False)
def normal_draws(Py_ssize_t n, uint64_t seed=0):
    """n standard normal draws of one stream (the sampler RandomErasing uses)."""
    cdef fl_rng rng = fl_rng_for(seed, 0, 0, 0)
    cdef cnp.ndarray out = np.empty(n, np.float64)
    cdef double[::1] o = out
    for i in range(n):
        o[i] = fl_rng_normal(&rng)
    return out


@cython.boundscheck(False)
def beta_draws(double a, double b, Py_ssize_t n, uint64_t seed=0):
    """n Beta(a, b) draws of one stream (the sampler MixUp and CutMix use)."""
    _positive(a, "beta_draws: a")
    _positive(b, "beta_draws: b")
    cdef fl_rng rng = fl_rng_for(seed, 0, 0, 0)
    cdef cnp.ndarray out = np.empty(n, np.float64)
    cdef double[::1] o = out
    for i in range(n):
        o[i] = fl_rng_beta(&rng, a, b)
    return out


def mixup_lambda(double alpha, uint64_t seed, uint64_t epoch, uint64_t step):
    """MixUp's lambda ~ Beta(alpha, alpha) for the batch of (seed, epoch, step)."""
    _positive(alpha, "mixup_lambda: alpha")
    return fl_mixup_lambda(alpha, seed, epoch, step)


def cutmix_params(double alpha, uint64_t seed, uint64_t epoch, uint64_t step, int h, int w):
    """CutMix's (lambda corrected to the box, (y, x, h, w) box) for h x w images."""
    cdef fl_rect b
    _positive(alpha, "cutmix_params: alpha")
    if h < 1 or w < 1:
        raise ValueError(f"cutmix_params: images of {h} x {w} pixels have no box to cut")
    cdef double lam = fl_cutmix_params(alpha, seed, epoch, step, h, w, &b)
    return lam, (b.y, b.x, b.h, b.w)


def cutmix_box(double lam, int cy, int cx, int h, int w):
    """CutMix's (corrected lambda, (y, x, h, w) box) for a drawn lambda and centre."""
    cdef fl_rect b
    if not 0 <= lam <= 1:
        raise ValueError(f"cutmix_box: lam must be in [0, 1], got {lam}")
    if not (0 <= cy < h and 0 <= cx < w):
        raise ValueError(f"cutmix_box: the centre ({cy}, {cx}) is not in a {h} x {w} image")
    cdef double adjusted = fl_cutmix_box(lam, cy, cx, h, w, &b)
    return adjusted, (b.y, b.x, b.h, b.w)


cdef int _batch_dtype(cnp.ndarray a) except -1:
    if not a.flags.c_contiguous or not a.flags.writeable:
        raise ValueError("the batch must be a writable C-contiguous array: it is mixed in "
                         "place (np.ascontiguousarray(batch) makes one)")
    if any(n > INT_MAX for n in (<object>a).shape):
        raise ValueError(f"a batch of shape {(<object>a).shape} is too large to mix")
    if a.dtype == np.float32:
        return FL_DTYPE_FLOAT32
    if a.dtype == np.uint8:
        return FL_DTYPE_UINT8
    raise ValueError(f"the batch must be float32 or uint8, got {a.dtype}")


def mixup_(cnp.ndarray batch not None, double lam):
    """Mixes batch (n items, float32 or uint8, C-contiguous) in place with itself rolled
    by one: x[i] = lam * x[i] + (1 - lam) * x[i - 1]. Returns batch."""
    cdef int dtype = _batch_dtype(batch)
    _finite(lam, "mixup: lam")
    if not 0 <= lam <= 1:
        raise ValueError(f"mixup: lam must be in [0, 1] (a convex mix), got {lam}")
    if batch.ndim == 0:
        raise ValueError("mixup: the batch must have an axis of items, got a 0-D array")
    cdef int n = <int>batch.shape[0]
    if n == 0:
        return batch
    cdef size_t elems = <size_t>(batch.size // n)
    cdef cnp.ndarray scratch = np.empty(max(batch.nbytes // n, 1), np.uint8)
    cdef void *bp = cnp.PyArray_DATA(batch)
    cdef void *sp = cnp.PyArray_DATA(scratch)
    cdef int err
    with nogil:
        err = fl_mixup(bp, dtype, n, elems, lam, sp)
    _check(err, "mixup")
    return batch


def cutmix_(cnp.ndarray batch not None, box, bint chw):
    """Pastes the (y, x, h, w) box of item i - 1 into item i of batch (NCHW when chw, else
    NHWC; float32 or uint8, C-contiguous), in place; item 0 takes item n - 1."""
    cdef int dtype = _batch_dtype(batch)
    if batch.ndim != 4:
        raise ValueError(f"cutmix: the batch must be 4-D (NCHW or NHWC), got {batch.ndim}-D")
    cdef int n = <int>batch.shape[0]
    cdef int c = <int>batch.shape[1 if chw else 3]
    cdef int h = <int>batch.shape[2 if chw else 1]
    cdef int w = <int>batch.shape[3 if chw else 2]
    if n == 0:
        return batch
    y, x, bh, bw = _items(box, 4, "cutmix: box (y, x, h, w)")
    if not (0 <= y and 0 <= x and 0 <= bh and 0 <= bw and y + bh <= h and x + bw <= w):
        raise ValueError(f"cutmix: the box {tuple(box)} is not inside a {h} x {w} image")
    cdef fl_rect b = fl_rect_of(y, x, bh, bw)
    cdef cnp.ndarray scratch = np.empty(max(batch.nbytes // n, 1), np.uint8)
    cdef void *bp = cnp.PyArray_DATA(batch)
    cdef void *sp = cnp.PyArray_DATA(scratch)
    cdef int err
    with nogil:
        err = fl_cutmix(bp, dtype, n, h, w, c, chw, &b, sp)
    _check(err, "cutmix")
    return batch


MAX_PIXEL_OPS = FL_MAX_PIXEL_OPS


cdef class Pipeline:
    """A compiled transform chain: the C pipeline (opaque) that native image fields run.

    Keyword arguments describe the stages (see fastload.transforms.Compose, which makes
    them): ``crop`` (None, "center", "random", "random_resized") with ``crop_size``,
    ``padding``, ``scale``, ``ratio`` and ``crop_after_resize``; ``resize`` (None,
    "shorter", "exact") with ``resize_size``; ``flip_p``; ``pixel_ops``, a list of
    ``{"kind": "jitter"|"grayscale"|"blur", "op", ...}``; ``mean`` and ``std`` (float32
    output); ``chw``; ``erasing``, a dict. ``*_op`` is the stage's position in the chain,
    the ``op`` of its random draws. Raises ValueError for a stage C does not accept."""
    cdef fl_pipeline *p
    cdef readonly bint chw, normalize
    cdef int erasing_values
    cdef bint built

    def __cinit__(self):
        self.p = fl_pipeline_create()
        if self.p == NULL:
            raise MemoryError()

    def __dealloc__(self):
        fl_pipeline_destroy(self.p)

    def __init__(self, *, int channels=0, crop=None, int crop_op=0,
                 bint crop_after_resize=False, crop_size=(0, 0), int padding=0,
                 scale=(0.0, 0.0), ratio=(0.0, 0.0), resize=None, resize_size=(0, 0),
                 double flip_p=0.0, int flip_op=0, pixel_ops=(), mean=None, std=None,
                 bint chw=False, erasing=None):
        cdef float m[4]
        cdef float s[4]
        if self.built:
            raise RuntimeError("a Pipeline is built once: image sources may run it already")
        self.built = True
        _check(fl_pipeline_set_channels(self.p, channels), "channels")
        crop_h, crop_w = _items(crop_size, 2, "crop_size")
        scale_lo, scale_hi = _reals(scale, 2, "scale")
        ratio_lo, ratio_hi = _reals(ratio, 2, "ratio")
        resize_h, resize_w = _items(resize_size, 2, "resize_size")
        _check(fl_pipeline_set_crop(self.p, _kind(CROP_KINDS, crop, "crop"), crop_op,
                                    crop_after_resize, crop_h, crop_w, padding, scale_lo,
                                    scale_hi, ratio_lo, ratio_hi), "crop")
        _check(fl_pipeline_set_resize(self.p, _kind(RESIZE_KINDS, resize, "resize"), resize_h,
                                      resize_w), "resize")
        _check(fl_pipeline_set_flip(self.p, flip_p, flip_op), "flip")
        if len(pixel_ops) > FL_MAX_PIXEL_OPS:
            raise ValueError(f"at most {FL_MAX_PIXEL_OPS} colour ops in one pipeline, "
                             f"got {len(pixel_ops)}")
        for spec in pixel_ops:
            self._add_pixel_op(spec)
        if mean is not None:
            mean, std = _means_and_stds(mean, std, "normalize")
            for i in range(len(mean)):
                m[i], s[i] = mean[i], std[i]
            _check(fl_pipeline_set_normalize(self.p, m, s, len(mean)), "normalize")
        self.normalize = mean is not None
        self.chw = chw
        fl_pipeline_set_chw(self.p, chw)
        if erasing is not None:
            self._set_erasing(erasing)

    cdef _add_pixel_op(self, dict spec):
        """A colour op from {"kind", "op"} and the kind's parameters: jitter `ranges` (4
        pairs, None where off), grayscale `p`, blur `kernel` (kh, kw) and `sigma` (lo, hi)."""
        cdef double lo[4]
        cdef double hi[4]
        cdef int present = 0
        kind = spec["kind"]
        if kind == "jitter":
            ranges = _items(spec["ranges"], 4, "ColorJitter: ranges (brightness, contrast, "
                            "saturation, hue; None where off)")
            for k, pair in enumerate(ranges):
                lo[k], hi[k] = (0.0, 0.0) if pair is None else _reals(pair, 2, "ColorJitter")
                present |= (pair is not None) << k
            _check(fl_pipeline_add_jitter(self.p, spec["op"], present, lo, hi), "ColorJitter")
        elif kind == "grayscale":
            _check(fl_pipeline_add_grayscale(self.p, spec["op"],
                                             _finite(spec["p"], "RandomGrayscale: p")),
                   "RandomGrayscale")
        elif kind == "blur":
            kh, kw = _items(spec["kernel"], 2, "GaussianBlur: kernel")
            sigma_lo, sigma_hi = _reals(spec["sigma"], 2, "GaussianBlur: sigma")
            _check(fl_pipeline_add_blur(self.p, spec["op"], kh, kw, sigma_lo, sigma_hi),
                   "GaussianBlur")
        else:
            raise ValueError(f"unknown colour op {kind!r}")

    cdef _set_erasing(self, dict spec):
        """RandomErasing from {"op", "p", "scale", "ratio", "value"}: value "random" or a
        tuple of 1 or channels numbers."""
        cdef float v[4]
        value = spec["value"]
        values = (0.0,) if value == "random" else tuple(value)
        if not 1 <= len(values) <= 4:
            raise ValueError(f"erasing: 1 to 4 values, got {len(values)}")
        for i, x in enumerate(values):
            v[i] = _finite(x, "RandomErasing: value")
        scale_lo, scale_hi = _reals(spec["scale"], 2, "RandomErasing: scale")
        ratio_lo, ratio_hi = _reals(spec["ratio"], 2, "RandomErasing: ratio")
        p = _finite(spec["p"], "RandomErasing: p")
        _check(fl_pipeline_set_erasing(self.p, spec["op"], p, scale_lo, scale_hi, ratio_lo,
                                       ratio_hi, value == "random", v, len(values)),
               "RandomErasing")
        self.erasing_values = len(values)

    def output_shape(self, int h, int w, int c):
        """(oh, ow, oc) of the output for an h x w x c source."""
        cdef int oh, ow, oc
        _check(fl_pipeline_output_shape(self.p, h, w, c, &oh, &ow, &oc), "output shape")
        return oh, ow, oc

    def prepare(self, int h, int w, uint64_t seed=0, uint64_t epoch=0, uint64_t index=0):
        """((y, x, h, w) crop in source pixels, JPEG scale denominator) for an h x w source."""
        cdef fl_rect r
        cdef int d
        _check(fl_pipeline_prepare(self.p, h, w, seed, epoch, index, &r, &d), "prepare")
        return (r.y, r.x, r.h, r.w), d

    def run(self, decoded, int src_h, int src_w, int scale_denom=1, uint64_t seed=0,
            uint64_t epoch=0, uint64_t index=0):
        """Runs the chain on `decoded` (the src_h x src_w source at 1/scale_denom)."""
        cdef cnp.ndarray a = as_image(decoded)
        cdef fl_image im = _view(a)
        cdef int oh, ow, oc
        _check(fl_pipeline_output_shape(self.p, src_h, src_w, im.c, &oh, &ow, &oc), "run")
        if self.erasing_values not in (0, 1, oc):
            raise ValueError(f"RandomErasing: value has {self.erasing_values} entries for "
                             f"an image with {oc} channels: give one value, or one per channel")
        shape = (oc, oh, ow) if self.chw else (oh, ow, oc)
        cdef cnp.ndarray out = np.empty(shape, np.float32 if self.normalize else np.uint8)
        cdef size_t n = fl_pipeline_scratch_bytes(self.p, src_h, src_w, im.c)
        cdef cnp.ndarray scratch = np.empty(n, np.uint8)
        cdef void *sp = cnp.PyArray_DATA(scratch)
        cdef void *op = cnp.PyArray_DATA(out)
        cdef int err
        with nogil:
            err = fl_pipeline_run_scaled(self.p, &im, src_h, src_w, scale_denom, seed, epoch,
                                         index, op, sp, n)
        _check(err, "run")
        return out
