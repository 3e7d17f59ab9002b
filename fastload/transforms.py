"""Image transforms as specs: parameters and declared output shape; pixels are touched in C.

A `Compose` validates its chain once and compiles it into one fused native pipeline
(crop, resize, flip, colour ops, normalize, layout, erasing: one pass per item), the same
code the parallel engine runs without the GIL. Random draws are keyed by (seed, epoch, index, op),
where op is the transform's position in the chain, so an item's output never depends on
threads or order.

    >>> train = Compose([DecodeImage(), RandomResizedCrop(224), RandomHorizontalFlip(),
    ...                  Normalize(IMAGENET_MEAN, IMAGENET_STD), ToCHW()])
    >>> train.output_shape, train.output_dtype
    ((3, 224, 224), dtype('float32'))
"""

import inspect
import numbers
import os
import warnings
from typing import Any

import numpy as np

from . import _core, limits
from ._base.randomness import Purpose, generator
from ._images import codecs
from ._images.chains import ImageChain
from ._images.codecs import image_size
from ._images.mixing import CutMix, MixUp
from .errors import CoreError, Status

__all__ = [
    "CenterCrop",
    "ColorJitter",
    "Compose",
    "CutMix",
    "DecodeImage",
    "GaussianBlur",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "Lambda",
    "MixUp",
    "Normalize",
    "RandomCrop",
    "RandomErasing",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "ToCHW",
    "image_size",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _size2(size, what):
    """(h, w) from an int or a pair of positive ints."""
    if isinstance(size, numbers.Integral):
        size = (size, size)
    size = tuple(size)
    if len(size) != 2 or not all(isinstance(s, numbers.Integral) and int(s) > 0 for s in size):
        raise ValueError(f"{what}: size must be a positive int or (height, width), got {size}")
    return int(size[0]), int(size[1])


def _range2(pair, what, name):
    lo, hi = (float(v) for v in pair)
    if not (0 < lo <= hi):
        raise ValueError(f"{what}: {name} must be (lo, hi) with 0 < lo <= hi, got {pair}")
    return lo, hi


class Transform:
    """Base of the transform specs; `kind` groups them for the chain rules of Compose."""

    kind: str | None = None

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class DecodeImage(Transform):
    """Decodes image file bytes to uint8 HWC with `channels` channels (1 gray, 3 RGB,
    4 RGBA). Must come first.

    JPEG decodes in C without the GIL: only the rows and columns the crop reads, and at a
    reduced DCT scale (1/2, 1/4, 1/8) when a later resize shrinks by at least that much.
    `exact=True` turns the reduced scale off, for evaluation where the output must match a
    full-size decode (PIL's) within one gray level. QOI (the lossless encoding of packed
    datasets) decodes in C; PNG, BMP, GIF (first frame), WebP and TIFF through Pillow, with
    the GIL (see docs/images.md for their speed)."""

    kind = "decode"

    def __init__(self, channels: int = 3, exact: bool = False) -> None:
        if channels not in codecs.COLORSPACES:
            raise ValueError(f"DecodeImage: channels must be 1, 3 or 4, got {channels!r}")
        self.channels = channels
        self.exact = bool(exact)


class RandomResizedCrop(Transform):
    """torchvision's RandomResizedCrop: a random area fraction in `scale` and aspect ratio
    (log-uniform) in `ratio`, resized (antialiased bilinear) to `size`."""

    kind = "crop"

    def __init__(
        self,
        size: int | tuple[int, int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
    ) -> None:
        self.size = _size2(size, "RandomResizedCrop")
        self.scale = _range2(scale, "RandomResizedCrop", "scale")
        self.ratio = _range2(ratio, "RandomResizedCrop", "ratio")


class RandomCrop(Transform):
    """A uniformly placed `size` crop of the image zero-padded by `padding` pixels on every
    side; an image smaller than the crop (after padding) raises ValueError."""

    kind = "crop"

    def __init__(self, size: int | tuple[int, int], padding: int = 0) -> None:
        self.size = _size2(size, "RandomCrop")
        if not isinstance(padding, numbers.Integral) or int(padding) < 0:
            raise ValueError(f"RandomCrop: padding must be an int >= 0, got {padding!r}")
        self.padding: int = int(padding)


class CenterCrop(Transform):
    """The central `size` crop (torchvision's offsets); zero padding where the image is
    smaller."""

    kind = "crop"

    def __init__(self, size: int | tuple[int, int]) -> None:
        self.size = _size2(size, "CenterCrop")


class Resize(Transform):
    """Resizes (antialiased bilinear, as PIL's BILINEAR): an int sets the shorter side
    (aspect kept, as torchvision), a (height, width) pair the exact size."""

    kind = "resize"
    size: int | tuple[int, int]

    def __init__(self, size: int | tuple[int, int]) -> None:
        if isinstance(size, numbers.Integral):
            if size <= 0:
                raise ValueError(f"Resize: the shorter side must be > 0, got {size}")
            self.size = int(size)
        else:
            self.size = _size2(size, "Resize")


class RandomHorizontalFlip(Transform):
    """Mirrors left-right with probability p."""

    kind = "flip"

    def __init__(self, p: float = 0.5) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"RandomHorizontalFlip: p must be in [0, 1], got {p!r}")
        self.p = float(p)


class Normalize(Transform):
    """(x / 255 - mean[c]) / std[c] as float32; mean and std on the 0..1 scale (torchvision's
    convention), one value per channel or one for all."""

    kind = "normalize"

    def __init__(
        self,
        mean: "np.typing.ArrayLike",
        std: "np.typing.ArrayLike",
        dtype: "np.typing.DTypeLike" = "float32",
    ) -> None:
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
            warnings.warn(
                f"Normalize(mean={self.mean}, std={self.std}): values above 1 look "
                f"like the 0..255 scale; pixels are divided by 255 first "
                f"(torchvision's convention), so mean and std are on the 0..1 scale, "
                f"as IMAGENET_MEAN and IMAGENET_STD",
                UserWarning,
                stacklevel=2,
            )


class ToCHW(Transform):
    """Channels-first output (C, H, W). Must come last (RandomErasing may follow it)."""

    kind = "layout"


def _jitter_range(value, name, center, bound):
    """torchvision's ColorJitter range: a number v means [center - v, center + v] (the low
    end clipped at 0 for the factors), a (min, max) pair is taken as is; None when the
    range is the single point `center` (the adjustment is off)."""
    if value is None:
        return None
    if isinstance(value, numbers.Real):
        if value < 0:
            raise ValueError(f"ColorJitter: {name} as one number must be >= 0, got {value}")
        lo, hi = center - float(value), center + float(value)
        if center == 1.0:
            lo = max(lo, 0.0)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        lo, hi = float(value[0]), float(value[1])
    else:
        raise ValueError(
            f"ColorJitter: {name} must be a number or a (min, max) pair, got {value!r}"
        )
    if not bound[0] <= lo <= hi <= bound[1]:
        raise ValueError(
            f"ColorJitter: {name} must give min <= max within [{bound[0]}, "
            f"{bound[1]}], got ({lo}, {hi})"
        )
    return None if lo == hi == center else (lo, hi)


class ColorJitter(Transform):
    """torchvision's ColorJitter on the uint8 image: brightness, contrast, saturation and
    hue adjusted in a random order drawn per item, each factor uniform in its range.

    A number b gives factors in [max(0, 1 - b), 1 + b] (hue h: shifts in [-h, h] turns,
    h <= 0.5); a (min, max) pair is taken as is (hue within [-0.5, 0.5]); 0 or None turns
    the adjustment off. With x a channel value and results rounded half up (floor(v + 0.5),
    clamped to 0..255), each step computes in double:
    brightness round(f x); contrast round(f x + (1 - f) m), m the mean luma (ITU-R 601,
    (19595 r + 38470 g + 7471 b + 32768) >> 16) of the image; saturation
    round(f x + (1 - f) l), l the pixel's luma; hue: H + h (mod 1) in HSV, the middle
    channel rounded. One-channel images get brightness and contrast only (as torchvision);
    an alpha channel is left as it is.
    """

    kind = "colour"

    def __init__(
        self,
        brightness: float | tuple[float, float] | None = 0,
        contrast: float | tuple[float, float] | None = 0,
        saturation: float | tuple[float, float] | None = 0,
        hue: float | tuple[float, float] | None = 0,
    ) -> None:
        self.brightness = _jitter_range(brightness, "brightness", 1.0, (0.0, float("inf")))
        self.contrast = _jitter_range(contrast, "contrast", 1.0, (0.0, float("inf")))
        self.saturation = _jitter_range(saturation, "saturation", 1.0, (0.0, float("inf")))
        self.hue = _jitter_range(hue, "hue", 0.0, (-0.5, 0.5))

    def _pixel_op(self, op: int) -> dict[str, object]:
        return {
            "kind": "jitter",
            "op": op,
            "ranges": (self.brightness, self.contrast, self.saturation, self.hue),
        }


class RandomGrayscale(Transform):
    """With probability p, each pixel's colour becomes its luma (ITU-R 601, rounded), the
    channel count kept (alpha left as it is; a one-channel image is unchanged)."""

    kind = "colour"

    def __init__(self, p: float = 0.1) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"RandomGrayscale: p must be in [0, 1], got {p!r}")
        self.p = float(p)

    def _pixel_op(self, op: int) -> dict[str, object]:
        return {"kind": "grayscale", "op": op, "p": self.p}


class GaussianBlur(Transform):
    """torchvision's GaussianBlur: a kernel_size Gaussian with sigma uniform in
    `sigma` (one draw per item, both axes).

    kernel_size is an odd positive int or a (kx, ky) pair, width first as torchvision's;
    sigma a number > 0 or a (min, max) range with 0 < min <= max. Taps at
    x = -(k-1)/2 .. (k-1)/2 weigh exp(-x^2 / (2 sigma^2)), normalized; edges are mirrored
    without repeating the edge pixel (torch's "reflect", repeated when the kernel is wider
    than the image, where torch raises); float32 sums, rounded half up to uint8.
    """

    kind = "colour"

    def __init__(
        self, kernel_size: int | tuple[int, int], sigma: float | tuple[float, float] = (0.1, 2.0)
    ) -> None:
        ks = kernel_size
        if isinstance(ks, numbers.Integral):
            ks = (ks, ks)
        ks = tuple(ks) if isinstance(ks, (tuple, list)) else ()
        if len(ks) != 2 or not all(
            isinstance(k, numbers.Integral) and k > 0 and k % 2 == 1 for k in ks
        ):
            raise ValueError(
                f"GaussianBlur: kernel_size must be an odd positive int or a "
                f"(kx, ky) pair of them, got {kernel_size!r}"
            )
        self.kernel_size = (int(ks[0]), int(ks[1]))
        pair = sigma if isinstance(sigma, tuple | list | np.ndarray) else (sigma, sigma)
        try:
            lo, hi = (float(s) for s in pair)
        except (TypeError, ValueError):
            lo = hi = float("nan")  # refused below, with what was given
        if not 0 < lo <= hi:
            raise ValueError(
                f"GaussianBlur: sigma must be > 0, or (min, max) with 0 < min <= max, got {sigma!r}"
            )
        self.sigma = (lo, hi)

    def _pixel_op(self, op: int) -> dict[str, object]:
        kx, ky = self.kernel_size
        return {"kind": "blur", "op": op, "kernel": (ky, kx), "sigma": self.sigma}


class RandomErasing(Transform):
    """torchvision's RandomErasing, on the final output (after Normalize and ToCHW, in
    its units and layout). Must be the last op.

    With probability p: up to 10 tries of an area fraction uniform in `scale` and an
    aspect ratio log-uniform in `ratio`, h = round(sqrt(area * ratio)),
    w = round(sqrt(area / ratio)), kept when smaller than the image, at a uniform offset;
    nothing is erased when no try fits. `value` is a number, one per channel, or "random":
    a standard normal draw per erased element (float32 output) or uniform 0..255 (uint8).
    On uint8 output the values must be whole numbers in 0..255.
    """

    kind = "erase"

    def __init__(
        self,
        p: float = 0.5,
        scale: tuple[float, float] = (0.02, 0.33),
        ratio: tuple[float, float] = (0.3, 3.3),
        value: float | tuple[float, ...] | str = 0,
    ) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"RandomErasing: p must be in [0, 1], got {p!r}")
        self.p = float(p)
        lo, hi = (float(s) for s in scale)
        if not 0.0 <= lo <= hi <= 1.0:
            raise ValueError(
                f"RandomErasing: scale must be (min, max) within [0, 1], got {scale!r}"
            )
        self.scale = (lo, hi)
        self.ratio = _range2(ratio, "RandomErasing", "ratio")
        self.value = self._values(value)

    @staticmethod
    def _values(value):
        if isinstance(value, str):
            if value != "random":
                raise ValueError(
                    f"RandomErasing: value must be a number, a tuple of them "
                    f"or 'random', got {value!r}"
                )
            return value
        values = (value,) if isinstance(value, numbers.Real) else tuple(value)
        if not 1 <= len(values) <= 4 or not all(isinstance(v, numbers.Real) for v in values):
            raise ValueError(
                f"RandomErasing: value must be a number, a tuple of 1 to 4 "
                f"numbers or 'random', got {value!r}"
            )
        return tuple(float(v) for v in values)

    def _spec(self, op):
        return {
            "op": op,
            "p": self.p,
            "scale": self.scale,
            "ratio": self.ratio,
            "value": self.value,
        }


def _takes_rng(f):
    try:
        parameters = inspect.signature(f).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    rng = parameters.get("rng")
    return rng is not None and rng.kind in (rng.POSITIONAL_OR_KEYWORD, rng.KEYWORD_ONLY)


class Lambda(Transform):
    """A Python function of your own in a chain, among the colour ops: f(image) -> image,
    a uint8 HWC array in and one of the same shape out.

    When f takes a keyword `rng`, it gets a numpy.random.Generator seeded from the item's
    key (seed, epoch, index, op), so its draws are as reproducible as the native ones.
    A chain with a Lambda runs its native parts in C and f with the GIL, between them; the
    loader runs such a chain item by item through Python (see docs/images.md for the cost).

        >>> def posterize(image, rng):
        ...     return image & np.uint8(0xF0 if rng.random() < 0.5 else 0xFF)
        >>> chain = Compose([RandomResizedCrop(64), Lambda(posterize), Normalize(0.5, 0.5)])
    """

    kind = "lambda"

    def __init__(self, f: object) -> None:
        if not callable(f):
            raise ValueError(f"Lambda: f must be callable, got {f!r}")
        self.f = f
        self.wants_rng = _takes_rng(f)

    def __call__(
        self, image: np.ndarray, *, seed: int = 0, epoch: int = 0, index: int = 0, op: int = 0
    ) -> np.ndarray:
        """f(image), with a Generator keyed by (seed, epoch, index, op) when f takes `rng`;
        ValueError unless it returns a uint8 image of the input's shape."""
        if self.wants_rng:
            out = self.f(image, rng=generator(seed, Purpose.TRANSFORM, epoch, index, op))
        else:
            out = self.f(image)
        out = np.asarray(out)
        if out.ndim == 2 and image.shape[2] == 1:
            out = out[:, :, None]
        if out.dtype != np.uint8 or out.shape != image.shape:
            raise ValueError(
                f"{self!r} returned {out.dtype} of shape {out.shape} for a uint8 "
                f"image of shape {image.shape}: a Lambda must return a uint8 "
                f"image of the same shape (it runs among the colour ops)"
            )
        return out

    def __repr__(self) -> str:
        return f"Lambda({getattr(self.f, '__qualname__', self.f)!r})"


# Colour ops and Lambdas run on the uint8 image between the geometry and Normalize.
_PIXEL_KINDS = ("colour", "lambda")


def _validate(ops):
    seen: list[Any] = []
    for k, op in enumerate(ops):
        if not isinstance(op, Transform) or op.kind is None:
            raise ValueError(
                f"Compose: op {k} ({op!r}) is not a fastload transform; Compose "
                f"runs fastload's image transforms natively. Apply a function of "
                f"your own with mapobs: mapobs(f, mapobs(Compose([...]), images)), "
                f"or in the chain as Lambda(f) (it runs with the GIL)"
            )
        _check_place(ops, k, op, seen)
        seen.append(op.kind)
    colour = [k for k, op in enumerate(ops) if op.kind == "colour"]
    if len(colour) > _core.MAX_PIXEL_OPS:
        k = colour[_core.MAX_PIXEL_OPS]
        raise ValueError(
            f"Compose: {ops[k]!r} (op {k}) is one colour op too many: a chain "
            f"holds at most {_core.MAX_PIXEL_OPS} ColorJitter, RandomGrayscale "
            f"and GaussianBlur ops; merge some (one ColorJitter does brightness, "
            f"contrast, saturation and hue)"
        )


def _check_place(ops, k, op, seen):
    """Raises ValueError when op k of the chain may not follow the kinds in `seen`."""
    where = f"Compose: {op!r} (op {k})"
    if op.kind == "decode" and k != 0:
        raise ValueError(f"{where} must be the first op")
    if "erase" in seen:
        raise ValueError(f"{where} comes after RandomErasing, which must be last")
    if "layout" in seen and op.kind != "erase":
        raise ValueError(
            f"{where} comes after ToCHW, which must be last (only RandomErasing may follow it)"
        )
    if op.kind == "crop" and "crop" in seen:
        raise ValueError(f"{where} is a second crop; use one crop")
    if op.kind == "resize" and "resize" in seen:
        raise ValueError(f"{where} is a second Resize")
    rrc = any(isinstance(o, RandomResizedCrop) for o in ops[:k])
    if (op.kind == "resize" and rrc) or (isinstance(op, RandomResizedCrop) and "resize" in seen):
        raise ValueError(f"{where}: RandomResizedCrop already resizes; drop the Resize")
    if op.kind in ("flip", "normalize") and op.kind in seen:
        raise ValueError(f"{where} repeats an earlier op")
    late = dict.fromkeys(
        type(o).__name__ for o in ops[:k] if o.kind in ("flip", "normalize") + _PIXEL_KINDS
    )
    if op.kind in ("crop", "resize", "flip") and late:
        raise ValueError(f"{where} must come before {' and '.join(late)}")
    if op.kind in _PIXEL_KINDS and ("normalize" in seen or "layout" in seen):
        raise ValueError(f"{where} works on uint8 pixels: put it before Normalize and ToCHW")


class Compose(ImageChain):
    """A validated chain of transforms, compiled to one native pipeline.

    The chain may start with DecodeImage (input: encoded image bytes, JPEG, QOI, PNG, ...),
    else the input is a uint8 HWC (or HW) array; then at most one crop and one Resize (in
    either order; RandomResizedCrop counts as both) and RandomHorizontalFlip; then colour
    ops (ColorJitter, RandomGrayscale, GaussianBlur, Lambda) in any order, each as often as
    wanted (at most 8 that are not Lambdas); then Normalize and ToCHW; RandomErasing last.
    Raises ValueError naming the offending op when the chain does not fit.

    `output_shape` is the shape of every output, or None when it varies with the input
    (a Resize of the shorter side last, no resize at all, or array input of unknown channels);
    `output_shape_for(shape)` gives it for an input of a given shape. `pipeline` is the
    compiled `fastload._core.Pipeline` that native image fields run.
    A chain with a Lambda has no single pipeline (`pipeline` is None, `native` False): it
    runs in native parts with the Lambdas between them, item by item through Python.
    """

    # Called as f(x, index=..., seed=..., epoch=...) by mapobs, so draws follow the loader.
    wants_index = True
    # The whole chain is one native pipeline, which the loader runs without the GIL.
    native = True
    ops: tuple  # of Transforms; the first a DecodeImage when `decodes`

    def __new__(cls, ops: "list[Transform] | tuple[Transform, ...]" = ()) -> "Compose":
        # A chain with a Lambda is a _StagedCompose, as pathlib.Path makes a PosixPath.
        if (
            cls is Compose
            and isinstance(ops, (list, tuple))
            and any(isinstance(op, Lambda) for op in ops)
        ):
            cls = _StagedCompose
        return super().__new__(cls)

    def __init__(self, ops: "list[Transform] | tuple[Transform, ...]") -> None:
        self.ops = tuple(ops)
        _validate(self.ops)
        self.decodes = bool(self.ops) and isinstance(self.ops[0], DecodeImage)
        self.channels = self.ops[0].channels if self.decodes else None
        normalize = self._find(Normalize)
        self.output_dtype = np.dtype(np.float32 if normalize else np.uint8)
        self.pipeline = self._compile()
        self.output_shape = self._fixed_shape()

    def _compile(self):
        """The chain's native pipeline."""
        if self._find(Lambda):  # only a one-shot iterable of ops gets here
            raise ValueError("Compose: give a chain with a Lambda as a list of ops")
        return _core.Pipeline(**self._pipeline_args(range(len(self.ops))))

    def _find(self, cls):
        return next((op for op in self.ops if isinstance(op, cls)), None)

    def _pipeline_args(self, span):
        """The Pipeline arguments of the ops at positions `span` (a range) of the chain;
        each random op keeps its position in the whole chain as the op of its RNG key."""
        part = {k: self.ops[k] for k in span}
        args: dict[str, Any] = {"channels": (self.channels or 0) if span.start == 0 else 0}
        args.update(self._geometry_args(part))
        args["pixel_ops"] = [op._pixel_op(k) for k, op in part.items() if op.kind == "colour"]
        args.update(self._output_args(part))
        return args

    @staticmethod
    def _geometry_args(part):
        """Crop, resize and flip arguments for `part` ({position: op})."""
        first: dict[str, int] = {}
        for k, op in part.items():
            first.setdefault(op.kind, k)
        crop, resize, flip = (part.get(first.get(kind)) for kind in ("crop", "resize", "flip"))
        args: dict[str, Any] = {}
        if crop is not None:
            args.update(
                crop_op=first["crop"],
                crop_size=crop.size,
                crop_after_resize=resize is not None and first["resize"] < first["crop"],
            )
        if isinstance(crop, RandomResizedCrop):
            args.update(crop="random_resized", scale=crop.scale, ratio=crop.ratio)
        elif isinstance(crop, RandomCrop):
            args.update(crop="random", padding=crop.padding)
        elif isinstance(crop, CenterCrop):
            args.update(crop="center")
        if resize is not None:
            exact = isinstance(resize.size, tuple)
            args.update(
                resize="exact" if exact else "shorter",
                resize_size=resize.size if exact else (resize.size, 0),
            )
        if flip is not None:
            args.update(flip_p=flip.p, flip_op=first["flip"])
        return args

    def _output_args(self, part):
        """Normalize, layout and erasing arguments for `part` ({position: op})."""
        args: dict[str, Any] = {"chw": any(op.kind == "layout" for op in part.values())}
        for k, op in part.items():
            if isinstance(op, Normalize):
                if self.channels and len(op.mean) not in (1, self.channels):
                    raise ValueError(
                        f"Compose: {op!r} has {len(op.mean)} values for {self.channels} channels"
                    )
                args.update(mean=op.mean, std=op.std)
            elif isinstance(op, RandomErasing):
                self._check_erasing(op)
                args["erasing"] = op._spec(k)
        return args

    def _check_erasing(self, erasing):
        values = erasing.value
        if values == "random":
            return
        if self.channels and len(values) not in (1, self.channels):
            raise ValueError(
                f"Compose: {erasing!r} has {len(values)} values for "
                f"{self.channels} channels: give one value, or one per channel"
            )
        if self.output_dtype == np.uint8 and not all(
            v.is_integer() and 0 <= v <= 255 for v in values
        ):
            raise ValueError(
                f"Compose: {erasing!r} erases a uint8 output: give whole numbers "
                f"in 0..255, or put Normalize before it for float values"
            )

    def _find_kind(self, kind):
        return next((op for op in self.ops if op.kind == kind), None)

    def _fixed_shape(self):
        """The output shape when no input can change it, else None."""
        crop, resize = self._find_kind("crop"), self._find(Resize)
        if self.channels is None or (crop is None and resize is None):
            return None
        if crop is None and not isinstance(resize.size, tuple):
            return None
        # Any source size gives the same shape; one large enough for every crop.
        side = 1 << 14
        return self.output_shape_for((side, side, self.channels))

    def output_shape_for(self, shape: tuple[int, ...]) -> tuple[int, int, int]:
        """The output shape for an input image of `shape` (HW or HWC)."""
        h, w = int(shape[0]), int(shape[1])
        c = int(shape[2]) if len(shape) > 2 else 1
        oh, ow, oc = self.pipeline.output_shape(h, w, c)
        return (oc, oh, ow) if self._find(ToCHW) else (oh, ow, oc)

    def __call__(
        self,
        x: "bytes | bytearray | memoryview | np.typing.ArrayLike",
        *,
        index: int = 0,
        seed: int = 0,
        epoch: int = 0,
    ) -> np.ndarray:
        """The transformed item: x is the bytes of an image file when the chain starts with
        DecodeImage, else a uint8 HWC or HW array. Raises ValueError for a corrupt or
        truncated image."""
        if self.decodes:
            if isinstance(x, np.ndarray) and x.dtype == np.uint8 and x.ndim in (2, 3):
                raise ValueError(
                    f"DecodeImage() got a decoded {x.shape} uint8 image, not the "
                    f"bytes of an encoded one: drop DecodeImage() from the chain, "
                    f"or pass the encoded bytes (of a packed dataset's column: "
                    f"ds['image'].encoded)"
                )
            return self._run_encoded(x, index, seed, epoch)
        if isinstance(x, (bytes, bytearray, memoryview, np.bytes_)):
            raise ValueError(
                "the chain got the bytes of an encoded image: start it with DecodeImage()"
            )
        img = _core.as_image(x)
        normalize = self._find(Normalize)
        if normalize is not None and len(normalize.mean) not in (1, img.shape[2]):
            raise ValueError(
                f"{normalize!r} has {len(normalize.mean)} values for an image "
                f"with {img.shape[2]} channels"
            )
        h, w = img.shape[:2]
        return self._run(img, h, w, 1, seed, epoch, index)

    def _run(self, img, h, w, denom, seed, epoch, index):
        """The pipeline on a decoded image of an h x w source; a crop larger than the
        image says which op and what to do."""
        try:
            return self.pipeline.run(img, h, w, denom, seed, epoch, index)
        except ValueError as error:
            raise self._explain(error, h, w) from None

    def _explain(self, error, h, w):
        """The error to raise for `error` of the pipeline on an h x w image."""
        if not (isinstance(error, CoreError) and error.code == Status.ETOOSMALL):
            return error
        crop = self._find(RandomCrop) or self._find(CenterCrop)
        return CoreError(
            Status.ETOOSMALL,
            f"{crop!r} is larger than the {h}x{w} image: give the crop "
            f"padding (RandomCrop(..., padding=...)), or Resize first so "
            f"that every image covers the crop",
        )

    def _run_encoded(self, data, index, seed, epoch):
        """The chain on encoded image bytes, decoded by the code a loader runs (in C, only
        the part the crop reads), so that both give the same pixels."""
        if isinstance(data, (str, os.PathLike)):
            raise ValueError(
                f"DecodeImage() got a path ({os.fspath(data)!r}), not the bytes "
                f"of an image: give the loader fastload.files(paths), whose "
                f"observations are the files' bytes"
            )
        h, w = codecs.image_size(data)
        limits.check_pixels(h, w)
        channels = self.ops[0].channels  # the DecodeImage this chain starts with
        try:
            out = np.empty(self.output_shape_for((h, w, channels)), self.output_dtype)
        except ValueError as error:
            raise self._explain(error, h, w) from None
        source = _core.ImageSource(
            self.pipeline,
            channels=channels,
            name="bytes",
            decoder=codecs,
            max_pixels=limits.MAX_IMAGE_PIXELS,
            max_file_bytes=limits.MAX_FILE_BYTES,
            exact=self.exact_decode,
            buffers=(),
        )
        return source.run(data, out, seed, epoch, index)

    @property
    def exact_decode(self) -> bool:
        """Whether the chain decodes at full scale (DecodeImage(exact=True))."""
        return self.decodes and self.ops[0].exact

    def __repr__(self) -> str:
        inner = ",\n    ".join(repr(op) for op in self.ops)
        return f"Compose([\n    {inner}])"


class _StagedCompose(Compose):
    """A chain with Lambdas, run in parts. The ops before the first Lambda (decode,
    geometry, colour ops) are a Compose of their own; each Lambda then runs with the GIL,
    followed by a native pipeline of the ops up to the next Lambda (the last one ends with
    Normalize, ToCHW and RandomErasing). Every op keeps its position in the whole chain as
    the op of its RNG key, so the draws are those of the same ops in a chain without the
    Lambda."""

    native = False

    def _compile(self):
        cuts = [k for k, op in enumerate(self.ops) if isinstance(op, Lambda)]
        self.head = Compose(self.ops[: cuts[0]])
        self.parts = []  # (position, Lambda) and (first position, native Pipeline)
        for k, stop in zip(cuts, cuts[1:] + [len(self.ops)]):
            self.parts.append((k, self.ops[k]))
            if stop > k + 1:
                args = self._pipeline_args(range(k + 1, stop))
                self.parts.append((k + 1, _core.Pipeline(**args)))
        return None

    def output_shape_for(self, shape: tuple[int, ...]) -> tuple[int, int, int]:
        """The output shape for an input image of `shape` (HW or HWC)."""
        oh, ow, oc = self.head.output_shape_for(shape)  # HWC: ToCHW comes after a Lambda
        return (oc, oh, ow) if self._find(ToCHW) else (oh, ow, oc)

    def __call__(
        self,
        x: "bytes | bytearray | memoryview | np.typing.ArrayLike",
        *,
        index: int = 0,
        seed: int = 0,
        epoch: int = 0,
    ) -> np.ndarray:
        """The transformed item, as Compose.__call__."""
        image = self.head(x, index=index, seed=seed, epoch=epoch)
        normalize = self._find(Normalize)
        if normalize is not None and len(normalize.mean) not in (1, image.shape[2]):
            raise ValueError(
                f"{normalize!r} has {len(normalize.mean)} values for an image "
                f"with {image.shape[2]} channels"
            )
        for k, part in self.parts:
            if isinstance(part, Lambda):
                image = part(image, seed=seed, epoch=epoch, index=index, op=k)
            else:
                image = part.run(image, image.shape[0], image.shape[1], 1, seed, epoch, index)
        return image
