"""Image transforms as specs: parameters and declared output shape; pixels are touched in C.

A `Compose` validates its chain once and compiles it into one fused native pipeline
(crop, resize, flip, normalize, layout in a single pass per item), the same code the
parallel engine runs without the GIL. Random draws are keyed by (seed, epoch, index, op),
where op is the transform's position in the chain, so an item's output never depends on
threads or order.

    >>> train = Compose([DecodeJPEG(), RandomResizedCrop(224), RandomHorizontalFlip(),
    ...                  Normalize(IMAGENET_MEAN, IMAGENET_STD), ToCHW()])
    >>> train.output_shape, train.output_dtype
    ((3, 224, 224), dtype('float32'))
"""
import numbers
import os
import warnings

import numpy as np
import simplejpeg

from . import _image, _qoi, limits

__all__ = ["CenterCrop", "Compose", "DecodeJPEG", "IMAGENET_MEAN", "IMAGENET_STD",
           "Normalize", "RandomCrop", "RandomHorizontalFlip", "RandomResizedCrop", "Resize",
           "ToCHW", "decode_jpeg_header"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_COLORSPACES = {1: "GRAY", 3: "RGB", 4: "RGBA"}


def _size2(size, what):
    """(h, w) from an int or a pair of positive ints."""
    if isinstance(size, numbers.Integral):
        size = (size, size)
    size = tuple(size)
    if len(size) != 2 or not all(isinstance(s, numbers.Integral) and s > 0 for s in size):
        raise ValueError(f"{what}: size must be a positive int or (height, width), got {size}")
    return int(size[0]), int(size[1])


def _range2(pair, what, name):
    lo, hi = (float(v) for v in pair)
    if not (0 < lo <= hi):
        raise ValueError(f"{what}: {name} must be (lo, hi) with 0 < lo <= hi, got {pair}")
    return lo, hi


class Transform:
    """Base of the transform specs; `kind` groups them for the chain rules of Compose."""
    kind = None

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class DecodeJPEG(Transform):
    """Decodes JPEG bytes to uint8 HWC with `channels` channels (1 gray, 3 RGB, 4 RGBA),
    at a reduced DCT scale when a later resize allows. Must come first. QOI bytes (the
    lossless encoding of packed datasets) are decoded too."""
    kind = "decode"

    def __init__(self, channels=3):
        if channels not in _COLORSPACES:
            raise ValueError(f"DecodeJPEG: channels must be 1, 3 or 4, got {channels!r}")
        self.channels = channels


class RandomResizedCrop(Transform):
    """torchvision's RandomResizedCrop: a random area fraction in `scale` and aspect ratio
    (log-uniform) in `ratio`, resized (antialiased bilinear) to `size`."""
    kind = "crop"

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
        self.size = _size2(size, "RandomResizedCrop")
        self.scale = _range2(scale, "RandomResizedCrop", "scale")
        self.ratio = _range2(ratio, "RandomResizedCrop", "ratio")


class RandomCrop(Transform):
    """A uniformly placed `size` crop of the image zero-padded by `padding` pixels on every
    side; an image smaller than the crop (after padding) raises ValueError."""
    kind = "crop"

    def __init__(self, size, padding=0):
        self.size = _size2(size, "RandomCrop")
        if not isinstance(padding, numbers.Integral) or padding < 0:
            raise ValueError(f"RandomCrop: padding must be an int >= 0, got {padding!r}")
        self.padding = int(padding)


class CenterCrop(Transform):
    """The central `size` crop (torchvision's offsets); zero padding where the image is
    smaller."""
    kind = "crop"

    def __init__(self, size):
        self.size = _size2(size, "CenterCrop")


class Resize(Transform):
    """Resizes (antialiased bilinear, as PIL's BILINEAR): an int sets the shorter side
    (aspect kept, as torchvision), a (height, width) pair the exact size."""
    kind = "resize"

    def __init__(self, size):
        if isinstance(size, numbers.Integral):
            if size <= 0:
                raise ValueError(f"Resize: the shorter side must be > 0, got {size}")
            self.size = int(size)
        else:
            self.size = _size2(size, "Resize")


class RandomHorizontalFlip(Transform):
    """Mirrors left-right with probability p."""
    kind = "flip"

    def __init__(self, p=0.5):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"RandomHorizontalFlip: p must be in [0, 1], got {p!r}")
        self.p = float(p)


class Normalize(Transform):
    """(x / 255 - mean[c]) / std[c] as float32; mean and std on the 0..1 scale (torchvision's
    convention), one value per channel or one for all."""
    kind = "normalize"

    def __init__(self, mean, std, dtype="float32"):
        self.mean = tuple(float(m) for m in np.atleast_1d(mean))
        self.std = tuple(float(s) for s in np.atleast_1d(std))
        if not 1 <= len(self.mean) <= 4 or len(self.std) != len(self.mean):
            raise ValueError("Normalize: mean and std need the same length, 1 to 4")
        if not all(s > 0 for s in self.std):
            raise ValueError(f"Normalize: std must be > 0, got {self.std}")
        if np.dtype(dtype) != np.float32:
            raise ValueError(f"Normalize: only dtype float32 is supported, got {dtype!r}")
        self.dtype = "float32"
        if max(self.mean) > 1 or max(self.std) > 1:
            warnings.warn(f"Normalize(mean={self.mean}, std={self.std}): values above 1 look "
                          f"like the 0..255 scale; pixels are divided by 255 first "
                          f"(torchvision's convention), so mean and std are on the 0..1 scale, "
                          f"as IMAGENET_MEAN and IMAGENET_STD", UserWarning, stacklevel=2)


class ToCHW(Transform):
    """Channels-first output (C, H, W). Must come last."""
    kind = "layout"


def _validate(ops):
    seen = []
    for k, op in enumerate(ops):
        if not isinstance(op, Transform) or op.kind is None:
            raise ValueError(f"Compose: op {k} ({op!r}) is not a fastload transform; Compose "
                             f"runs fastload's image transforms natively. Apply a function of "
                             f"your own with mapobs: mapobs(f, mapobs(Compose([...]), images))")
        if op.kind == "decode" and k != 0:
            raise ValueError(f"Compose: {op!r} (op {k}) must be the first op")
        if seen and seen[-1] == "layout":
            raise ValueError(f"Compose: {op!r} (op {k}) comes after ToCHW, which must be last")
        if op.kind == "crop" and "crop" in seen:
            raise ValueError(f"Compose: {op!r} (op {k}) is a second crop; use one crop")
        if op.kind == "resize" and "resize" in seen:
            raise ValueError(f"Compose: {op!r} (op {k}) is a second Resize")
        rrc = any(isinstance(o, RandomResizedCrop) for o in ops[:k])
        if op.kind == "resize" and rrc or isinstance(op, RandomResizedCrop) and "resize" in seen:
            raise ValueError(f"Compose: {op!r} (op {k}): RandomResizedCrop already resizes; "
                             "drop the Resize")
        if op.kind in ("flip", "normalize") and op.kind in seen:
            raise ValueError(f"Compose: {op!r} (op {k}) repeats an earlier op")
        late = [type(o).__name__ for o in ops[:k] if o.kind in ("flip", "normalize")]
        if op.kind in ("crop", "resize", "flip") and late:
            raise ValueError(f"Compose: {op!r} (op {k}) must come before {' and '.join(late)}")
        seen.append(op.kind)


class Compose:
    """A validated chain of transforms, compiled to one native pipeline.

    The chain may start with DecodeJPEG (input: JPEG bytes), else the input is a uint8 HWC
    (or HW) array; then at most one crop and one Resize (in either order; RandomResizedCrop
    counts as both), RandomHorizontalFlip, Normalize and ToCHW, in that order.
    Raises ValueError naming the offending op when the chain does not fit.

    `output_shape` is the shape of every output, or None when it varies with the input
    (a Resize of the shorter side last, no resize at all, or array input of unknown channels);
    `output_shape_for(shape)` gives it for an input of a given shape. `pipeline` is the
    compiled `fastload._image.Pipeline`; its `address` points to the C `fl_pipeline`.
    """

    # Called as f(x, index=..., seed=..., epoch=...) by mapobs, so draws follow the loader.
    wants_index = True

    def __init__(self, ops):
        self.ops = tuple(ops)
        _validate(self.ops)
        self.decodes = bool(self.ops) and isinstance(self.ops[0], DecodeJPEG)
        self.channels = self.ops[0].channels if self.decodes else None
        normalize = self._find(Normalize)
        self.output_dtype = np.dtype(np.float32 if normalize else np.uint8)
        self.pipeline = _image.Pipeline(**self._pipeline_args())
        self.output_shape = self._fixed_shape()

    def _find(self, cls):
        return next((op for op in self.ops if isinstance(op, cls)), None)

    def _index(self, kind):
        return next((k for k, op in enumerate(self.ops) if op.kind == kind), None)

    def _pipeline_args(self):
        args = {"channels": self.channels or 0}
        crop, resize = self._find_kind("crop"), self._find(Resize)
        if crop is not None:
            args.update(crop_op=self._index("crop"), crop_size=crop.size,
                        crop_after_resize=resize is not None and
                        self._index("resize") < self._index("crop"))
        if isinstance(crop, RandomResizedCrop):
            args.update(crop="random_resized", scale=crop.scale, ratio=crop.ratio)
        elif isinstance(crop, RandomCrop):
            args.update(crop="random", padding=crop.padding)
        elif isinstance(crop, CenterCrop):
            args.update(crop="center")
        if resize is not None:
            exact = isinstance(resize.size, tuple)
            args.update(resize="exact" if exact else "shorter",
                        resize_size=resize.size if exact else (resize.size, 0))
        flip = self._find(RandomHorizontalFlip)
        if flip is not None:
            args.update(flip_p=flip.p, flip_op=self._index("flip"))
        normalize = self._find(Normalize)
        if normalize is not None:
            if self.channels and len(normalize.mean) not in (1, self.channels):
                raise ValueError(f"Compose: {normalize!r} has {len(normalize.mean)} values "
                                 f"for {self.channels} channels")
            args.update(mean=normalize.mean, std=normalize.std)
        args["chw"] = self._find(ToCHW) is not None
        return args

    def _find_kind(self, kind):
        return next((op for op in self.ops if op.kind == kind), None)

    def _fixed_shape(self):
        """The output shape when no input can change it, else None."""
        crop, resize = self._find_kind("crop"), self._find(Resize)
        if self.channels is None or crop is None and resize is None:
            return None
        if crop is None and not isinstance(resize.size, tuple):
            return None
        # Any source size gives the same shape; one large enough for every crop.
        side = 1 << 14
        return self.output_shape_for((side, side, self.channels))

    def output_shape_for(self, shape):
        """The output shape for an input image of `shape` (HW or HWC)."""
        h, w = int(shape[0]), int(shape[1])
        c = int(shape[2]) if len(shape) > 2 else 1
        oh, ow, oc = self.pipeline.output_shape(h, w, c)
        return (oc, oh, ow) if self._find(ToCHW) else (oh, ow, oc)

    def __call__(self, x, *, index=0, seed=0, epoch=0):
        """The transformed item: x is JPEG bytes when the chain starts with DecodeJPEG, else
        a uint8 HWC or HW array. Raises ValueError for a corrupt or truncated JPEG."""
        if self.decodes:
            if isinstance(x, np.ndarray) and x.dtype == np.uint8 and x.ndim in (2, 3):
                raise ValueError(f"DecodeJPEG() got a decoded {x.shape} uint8 image, not the "
                                 f"bytes of an encoded one: drop DecodeJPEG() from the chain, "
                                 f"or pass the encoded bytes (of a packed dataset's column: "
                                 f"ds['image'].encoded)")
            return self._run_jpeg(x, index, seed, epoch)
        if isinstance(x, (bytes, bytearray, memoryview, np.bytes_)):
            raise ValueError("the chain got the bytes of an encoded image: start it with "
                             "DecodeJPEG(), which decodes JPEG and QOI")
        img = _image.as_image(x)
        normalize = self._find(Normalize)
        if normalize is not None and len(normalize.mean) not in (1, img.shape[2]):
            raise ValueError(f"{normalize!r} has {len(normalize.mean)} values for an image "
                             f"with {img.shape[2]} channels")
        h, w = img.shape[:2]
        return self._run(img, h, w, 1, seed, epoch, index)

    def _run(self, img, h, w, denom, seed, epoch, index):
        """The pipeline on a decoded image of an h x w source; a crop larger than the
        image says which op and what to do."""
        try:
            return self.pipeline.run(img, h, w, denom, seed, epoch, index)
        except ValueError as error:
            if "smaller than the crop" not in str(error):
                raise
            crop = self._find(RandomCrop) or self._find(CenterCrop)
            raise ValueError(f"{crop!r} is larger than the {h}x{w} image: give the crop "
                             f"padding (RandomCrop(..., padding=...)), or Resize first so "
                             f"that every image covers the crop") from None

    def _run_jpeg(self, data, index, seed, epoch):
        if isinstance(data, (str, os.PathLike)):
            raise ValueError(f"DecodeJPEG() got a path ({os.fspath(data)!r}), not the bytes "
                             f"of an image: give the loader fastload.files(paths), whose "
                             f"observations are the files' bytes")
        if bytes(data[:4]) == b"qoif":   # lossless images from a packed dataset
            limits.check_pixels(*_qoi.header(data)[:2])
            img = _qoi.decode(data, channels=4 if self.channels == 4 else 3)
            if self.channels == 1:
                img = _image.convert_channels(img, 1)
            return self._run(img, img.shape[0], img.shape[1], 1, seed, epoch, index)
        h, w = decode_jpeg_header(data)
        limits.check_pixels(h, w)
        _, denom = self.pipeline.prepare(h, w, seed, epoch, index)
        min_h, min_w = -(-h // denom), -(-w // denom)
        img = _decode(data, self.channels, min_h if denom > 1 else 0, min_w if denom > 1 else 0)
        if img.shape[:2] != (min_h, min_w):  # the decoder picked another scale: use full size
            img, denom = _decode(data, self.channels, 0, 0), 1
        return self._run(img, h, w, denom, seed, epoch, index)

    def __repr__(self):
        inner = ",\n    ".join(repr(op) for op in self.ops)
        return f"Compose([\n    {inner}])"


def decode_jpeg_header(data):
    """(height, width) of JPEG bytes; ValueError when they are not a readable JPEG."""
    try:
        h, w, _, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError as e:
        raise ValueError(f"corrupt or unsupported JPEG: {e}") from None
    return h, w


def _decode(data, channels, min_height, min_width):
    try:
        img = simplejpeg.decode_jpeg(data, colorspace=_COLORSPACES[channels],
                                     min_height=min_height, min_width=min_width)
    except ValueError as e:
        raise ValueError(f"corrupt or truncated JPEG: {e}") from None
    return img
