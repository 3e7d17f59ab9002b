"""Field encodings: how one field of an observation is stored in the packed format.

An encoding turns a value into one row of one or more Arrow columns and back. The field's
main column carries the field's name; auxiliary columns are named ``"<field>.<part>"``
(``"image.height"``). Column kinds are strings, mapped to Arrow types by ``arrow_types.py``:
``"binary"``, ``"string"``, ``"fixed:<nbytes>"``, ``"shape"`` (a list of int64) or a
numpy scalar dtype name (``"int32"``).

Image encodings take a uint8 array (h, w), (h, w, 1|3|4) or encoded image bytes, and
decode to uint8 (h, w, 3|4) RGB(A). A JPEG field stores RGB (alpha is dropped). JPEG or
QOI bytes that are stored as given are decoded once first (``check=True``, the default),
so that a file that cannot be decoded is refused when written, not met in training.

A parameter added to an encoding after files were written without it has the value those
files were written with in ``written_before``: ``from_meta`` fills it in for them.
"""

import numbers

import numpy as np

from fastload import _core
from fastload._images import codecs
from fastload._images import encoding as images

__all__ = [
    "Bytes",
    "Encoding",
    "JPEG",
    "NDArray",
    "QOI",
    "Raw",
    "Scalar",
    "Smart",
    "Str",
    "as_encoding",
    "from_meta",
]

# Values of the ".format" column of a Smart field.
FORMAT_RAW = 0
FORMAT_JPEG = 1

# JPEG chroma subsampling, in simplejpeg's spelling: 4:4:4 (full-resolution colour), 4:2:2
# (colour at half the width), 4:2:0 (half the width and half the height). 4:2:0 is what
# Pillow, OpenCV (so FFCV), torchvision and libjpeg's cjpeg write at every quality.
SUBSAMPLINGS = ("444", "422", "420")


class Encoding:
    """Base class. Subclasses set ``name`` and ``parts`` ((suffix, kind) pairs after the
    main column's kind ``kind``), and implement ``encode``/``decode``."""

    name: str | None = None
    kind: str = "binary"
    parts: tuple[tuple[str, str], ...] = ()
    # Parameters missing from the metadata of older files: the values they were written with.
    written_before: dict[str, object] = {}
    # Whether ``decode`` always returns new memory (never a view of the stored bytes).
    copies = False

    def bind(self, value):
        """This encoding with whatever the first observation fixes (a shape, a dtype)."""
        return self

    def columns(self, field):
        """(column name, kind) pairs this field stores, main column first."""
        return [(field, self.kind)] + [(f"{field}.{suffix}", kind) for suffix, kind in self.parts]

    def encode(self, value):
        """One row: a tuple with one value per column. Raises ValueError for bad input."""
        raise NotImplementedError

    def decode(self, data, *parts):
        """The value of one row from its main column's bytes and its auxiliary values."""
        raise NotImplementedError

    def params(self):
        """The parameters saved in the file's metadata (JSON-serializable)."""
        return {}

    def to_meta(self, field):
        return {
            "encoding": self.name,
            "columns": [c for c, _ in self.columns(field)],
            **self.params(),
        }

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other):
        return type(self) is type(other) and self.params() == other.params()

    def __hash__(self):
        return hash((type(self), repr(self)))


def _cast(arr: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    """``arr`` as a C-contiguous array of ``dtype``. Raises ValueError when a value would
    change beyond a float's rounding: an integer that wraps or is cut, a bool from other
    than 0 and 1, a float (or a large integer) that overflows to inf."""
    if arr.dtype == dtype:
        return np.asarray(arr, order="C")
    with np.errstate(over="ignore", invalid="ignore"):
        cast = np.asarray(arr, dtype=dtype, order="C")
    if dtype.kind in "biu":
        kept = bool(np.array_equal(cast, arr))
    else:
        kept = bool(np.array_equal(np.isinf(cast), np.isinf(arr)))
    if not kept:
        raise ValueError(
            f"{what} of dtype {dtype} cannot hold these {arr.dtype} values unchanged (an "
            f"integer would wrap, a float overflow to inf): declare a wider dtype, or cast "
            f"the values first"
        )
    return cast


class Scalar(Encoding):
    """One number per observation, of a numpy dtype (bool, int, uint or float)."""

    name = "scalar"

    def __init__(self, dtype: "np.typing.DTypeLike") -> None:
        dt = np.dtype(dtype)
        if dt.kind not in "biuf" or dt.itemsize > 8:
            raise ValueError(f"a scalar field needs a bool, int, uint or float dtype, got {dt}")
        self.dtype = dt
        self.kind = dt.name

    def encode(self, value):
        arr = np.asarray(value)
        if arr.ndim != 0:
            raise ValueError(f"a {self.dtype} scalar field got a value of shape {arr.shape}")
        # Python ints default to int64: accept them for any int or float field, if they fit.
        int_ok = arr.dtype.kind in "biu" and self.dtype.kind in "iuf"
        if not (int_ok or np.can_cast(arr.dtype, self.dtype, casting="same_kind")):
            raise ValueError(f"a {self.dtype} scalar field got {value!r} ({arr.dtype})")
        return (_cast(arr, self.dtype, "a scalar field")[()],)

    def decode(self, value):
        return value

    def params(self):
        return {"dtype": self.dtype.name}


class Raw(Encoding):
    """A fixed-shape array per observation, stored as fixed-size bytes so that the column is
    one contiguous buffer. ``shape`` and ``dtype`` default to the first observation's."""

    name = "raw"

    def __init__(
        self,
        shape: tuple[int, ...] | list[int] | None = None,
        dtype: "np.typing.DTypeLike | None" = None,
    ) -> None:
        self.shape = None if shape is None else tuple(int(s) for s in shape)
        self.dtype = None if dtype is None else np.dtype(dtype)
        if self.dtype is not None and self.dtype.hasobject:
            raise ValueError("a Raw field cannot hold Python objects")

    @property
    def kind(self) -> str:  # type: ignore[override]  # fixed by the shape and dtype
        return f"fixed:{self.nbytes}"

    def _layout(self) -> tuple[tuple[int, ...], np.dtype]:
        """(shape, dtype); ValueError before the field is bound to an observation."""
        if self.shape is None or self.dtype is None:
            raise ValueError(
                "a Raw field without a shape and dtype takes them from the first observation: "
                "bind() it (write() does) before encoding or decoding"
            )
        return self.shape, self.dtype

    @property
    def nbytes(self) -> int:
        shape, dtype = self._layout()
        return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize

    def bind(self, value):
        arr = np.asarray(value)
        return Raw(
            arr.shape if self.shape is None else self.shape,
            arr.dtype if self.dtype is None else self.dtype,
        )

    def encode(self, value):
        shape, dtype = self._layout()
        arr = np.asarray(value)
        if arr.shape != shape:
            raise ValueError(f"a Raw field of shape {shape} got shape {arr.shape}")
        if not np.can_cast(arr.dtype, dtype, casting="same_kind"):
            raise ValueError(f"a Raw field of dtype {dtype} got dtype {arr.dtype}")
        return (_cast(arr, dtype, "a Raw field").tobytes(),)

    def decode(self, data):
        shape, dtype = self._layout()
        return np.frombuffer(data, dtype).reshape(shape)

    def params(self):
        return {
            "shape": None if self.shape is None else list(self.shape),
            "dtype": None if self.dtype is None else self.dtype.str,
        }


class NDArray(Encoding):
    """An array of any shape per observation: its bytes (C order) and its shape. The
    dtype defaults to the first observation's; others are cast to it (same kind only,
    and only values that survive the cast: see ``_cast``)."""

    name = "ndarray"
    parts = (("shape", "shape"),)

    def __init__(self, dtype: "np.typing.DTypeLike | None" = None) -> None:
        self.dtype = None if dtype is None else np.dtype(dtype)

    def bind(self, value):
        return self if self.dtype is not None else NDArray(np.asarray(value).dtype)

    def _bound_dtype(self) -> np.dtype:
        """The dtype; ValueError before the field is bound to an observation."""
        if self.dtype is None:
            raise ValueError(
                "an NDArray field without a dtype takes it from the first observation: "
                "bind() it (write() does) before encoding or decoding"
            )
        return self.dtype

    def encode(self, value):
        dtype = self._bound_dtype()
        arr = np.asarray(value)
        if arr.dtype.hasobject or not np.can_cast(arr.dtype, dtype, casting="same_kind"):
            raise ValueError(f"an NDArray field of dtype {dtype} got dtype {arr.dtype}")
        arr = _cast(arr, dtype, "an NDArray field")
        return arr.tobytes(), list(arr.shape)

    def decode(self, data, shape):
        dtype = self._bound_dtype()
        shape = tuple(int(s) for s in shape)
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if any(s < 0 for s in shape) or size != len(data):
            raise ValueError(f"{len(data)} bytes do not hold a {dtype} array of shape {shape}")
        return np.frombuffer(data, dtype).reshape(shape)

    def params(self):
        return {"dtype": None if self.dtype is None else self.dtype.str}


class Bytes(Encoding):
    """Opaque bytes per observation."""

    name = "bytes"
    copies = True

    def encode(self, value):
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise ValueError(f"a Bytes field needs bytes, got {type(value).__name__}")
        return (bytes(value),)

    def decode(self, data):
        return bytes(data)


class Str(Encoding):
    """A text string per observation (UTF-8)."""

    name = "str"
    kind = "string"
    copies = True

    def encode(self, value):
        if not isinstance(value, str):
            raise ValueError(f"a Str field needs a str, got {type(value).__name__}")
        return (value,)

    def decode(self, data):
        return bytes(data).decode("utf-8")


def _check_quality(quality: int) -> int:
    if (
        isinstance(quality, bool)
        or not isinstance(quality, numbers.Integral)
        or not 1 <= quality <= 100
    ):
        raise ValueError(f"quality must be an int in 1..100, got {quality!r}")
    return int(quality)


def _check_flag(value: bool, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def _check_subsampling(subsampling: str) -> str:
    if subsampling not in SUBSAMPLINGS:
        raise ValueError(
            f'subsampling must be "444", "422" or "420" (chroma 4:4:4, 4:2:2, 4:2:0; '
            f"Pillow's subsampling=0, 1, 2), got {subsampling!r}"
        )
    return subsampling


def _check_max_side(max_side: int | None) -> int | None:
    if max_side is None:
        return None
    if isinstance(max_side, bool) or not isinstance(max_side, numbers.Integral) or max_side < 1:
        raise ValueError(f"max_side must be a positive int or None, got {max_side!r}")
    return int(max_side)


def _check_shape(img, h, w):
    if img.shape[0] != h or img.shape[1] != w:
        raise ValueError(
            f"decoded image is {img.shape[0]} x {img.shape[1]}, the file says {h} x {w}"
        )
    return img


class _Image(Encoding):
    """Common part of image encodings: height and width columns, the max_side cap (area
    averaging, of the full decode when ``exact``: ``encoding.fit_pixels``)."""

    parts: tuple[tuple[str, str], ...] = (("height", "int32"), ("width", "int32"))
    max_side: int | None = None
    check: bool = True
    exact: bool = True
    # Files written before 0.3 decoded JPEG input at a reduced DCT scale before resizing.
    written_before: dict[str, object] = {"exact": False}

    def _as_given(self, value):
        """``value``'s bytes, to be stored as given: decoded first when ``check`` (JPEG at
        its smallest DCT scale, which still reads every byte of the entropy-coded data).
        Raises ValueError for bytes that do not decode."""
        data = bytes(value)
        if self.check:
            images.decode_image_bytes(data, min_size=(1, 1))
        return data

    def _pixels(self, value):
        """``value`` as pixels no larger than max_side, in this thread's buffers: the
        encodings copy them into their bytes before the next image (``fit_pixels``)."""
        return images.fit_pixels(value, self.max_side, self.exact, reuse=True)

    def _needs_resize(self, value):
        h, w = images.image_size(value)
        return images.fit_size(h, w, self.max_side) != (h, w)


def _check_restart_px(restart_px: int | None) -> int | None:
    """``restart_px`` checked; None where markers cannot be written (a build without
    fastload._jpeg, whose libjpeg adds them)."""
    if restart_px is None:
        return None
    if (
        isinstance(restart_px, bool)
        or not isinstance(restart_px, numbers.Integral)
        or not 1 <= restart_px <= 65535
    ):
        raise ValueError(f"restart_px must be an int 1..65535 or None, got {restart_px!r}")
    return int(restart_px) if not _core.JPEG_FALLBACK_REASON else None


def _encode_jpeg(img, quality, subsampling, restart_px):
    """``img``'s RGB as JPEG bytes: in one pass through libjpeg (the accurate DCT, the
    markers as it writes them) where fastload has it, else through simplejpeg (which
    builds without libjpeg write without markers: ``_check_restart_px``)."""
    pixels = np.ascontiguousarray(img[:, :, :3])
    if not _core.JPEG_FALLBACK_REASON:
        from fastload import _jpeg

        return _jpeg.encode(pixels, quality, subsampling, restart_px or 0)
    import simplejpeg

    return simplejpeg.encode_jpeg(
        pixels, quality=quality, colorspace="RGB", colorsubsampling=subsampling
    )


def _stored_jpeg(field, data):
    """JPEG bytes that need no resize as ``field`` (a JPEG or Smart) stores them: with a
    restart marker every ``restart_px`` pixels added losslessly (libjpeg rewrites the same
    coefficients, reading every one of them: bytes that do not decode raise ValueError),
    or as given where ``keep_given`` or ``restart_px=None`` says so, or where markers
    cannot be added (a progressive, arithmetic-coded or 12-bit stream; bytes that do not
    decode when ``check=False``, to be found in training as ``check`` says)."""
    if field.keep_given or field.restart_px is None:
        return field._as_given(data)
    from fastload import _jpeg

    given = bytes(data)
    try:
        marked = _jpeg.add_restarts(given, field.restart_px)
    except ValueError:
        if field.check:
            raise
        return given
    return field._as_given(given) if marked == given else marked


def _decode_jpeg(data):
    return codecs.decode(data, channels=3)


class JPEG(_Image):
    """A JPEG image, encoded by libjpeg-turbo (the accurate integer DCT) at ``quality`` 1..100
    with chroma ``subsampling`` "420" (the default: Pillow's, OpenCV's and so FFCV's at
    every quality), "422" or "444" (full-resolution colour, 25-50% more bytes at
    quality 90). ``max_side``: images whose longer side exceeds it are shrunk by exact
    area averaging of the full decode; ``exact=False`` decodes JPEG input at a reduced
    DCT scale first (faster on large photos, a few gray levels off: docs/format.md).
    ``restart_px``: a restart marker after every run of MCUs at most this many pixels
    across (and dividing the MCU row), so that a crop entropy-decodes only the runs under
    it (about 2% more bytes at the default 32 and 4:2:0; the same pixels); None: no
    markers (None also where fastload was built without libjpeg, which adds them).
    JPEG bytes that need no resize are not re-encoded: they keep their own quality and
    subsampling, and get the markers losslessly (the same coefficients, so the same
    pixels; their APPn and COM segments kept), which reads every coefficient and so
    checks them. ``keep_given=True`` stores them byte for byte instead, once decoded to
    check them unless ``check=False`` (as does a progressive JPEG, which gets no
    markers). Raises ValueError (TypeError for a flag) for a bad parameter."""

    name = "jpeg"
    copies = True
    # Files written before 0.3 were encoded at 4:4:4, without restart markers.
    written_before: dict[str, object] = {
        **_Image.written_before,
        "subsampling": "444",
        "restart_px": None,
        "keep_given": True,
    }

    def __init__(
        self,
        quality: int = 90,
        max_side: int | None = None,
        check: bool = True,
        *,
        subsampling: str = "420",
        exact: bool = True,
        restart_px: int | None = 32,
        keep_given: bool = False,
    ) -> None:
        self.quality = _check_quality(quality)
        self.max_side = _check_max_side(max_side)
        self.check = _check_flag(check, "check")
        self.subsampling = _check_subsampling(subsampling)
        self.exact = _check_flag(exact, "exact")
        self.restart_px = _check_restart_px(restart_px)
        self.keep_given = _check_flag(keep_given, "keep_given")

    def encode(self, value):
        if (
            isinstance(value, (bytes, bytearray, memoryview))
            and codecs.is_jpeg(value)
            and not self._needs_resize(value)
        ):
            h, w = images.image_size(value)
            return _stored_jpeg(self, value), h, w
        img = self._pixels(value)
        jpeg = _encode_jpeg(img, self.quality, self.subsampling, self.restart_px)
        return jpeg, img.shape[0], img.shape[1]

    def decode(self, data, h, w):
        return _check_shape(_decode_jpeg(data), h, w)

    def params(self):
        return {
            "quality": self.quality,
            "max_side": self.max_side,
            "subsampling": self.subsampling,
            "exact": self.exact,
            "restart_px": self.restart_px,
            "keep_given": self.keep_given,
        }


class QOI(_Image):
    """A lossless QOI image (RGB or RGBA), decoded natively. QOI bytes that need no
    resize are stored as given, once decoded to check them unless ``check=False``."""

    name = "qoi"
    copies = True

    def __init__(
        self, max_side: int | None = None, check: bool = True, *, exact: bool = True
    ) -> None:
        self.max_side = _check_max_side(max_side)
        self.check = _check_flag(check, "check")
        self.exact = _check_flag(exact, "exact")

    def encode(self, value):
        if (
            isinstance(value, (bytes, bytearray, memoryview))
            and codecs.is_qoi(value)
            and not self._needs_resize(value)
        ):
            h, w, _ = _core.qoi_header(value)
            return self._as_given(value), h, w
        img = self._pixels(value)
        return _core.qoi_encode(img), img.shape[0], img.shape[1]

    def decode(self, data, h, w):
        return _check_shape(codecs.decode(data), h, w)

    def params(self):
        return {"max_side": self.max_side, "exact": self.exact}


class Smart(_Image):
    """Raw pixels when the (resized) image takes at most ``threshold_bytes``, else JPEG
    (``quality``, ``subsampling``, ``max_side``, ``exact``, ``restart_px``, ``keep_given``
    and JPEG bytes that need no resize as ``JPEG``'s). A ``.format`` column says which,
    per row (0: raw, 1: JPEG). Raw rows decode to read-only views of the file."""

    name = "smart"
    parts = _Image.parts + (("format", "uint8"),)
    threshold_bytes: int
    quality: int
    subsampling: str
    restart_px: int | None
    keep_given: bool
    written_before = JPEG.written_before

    def __init__(
        self,
        threshold_bytes: int,
        quality: int = 90,
        max_side: int | None = None,
        check: bool = True,
        *,
        subsampling: str = "420",
        exact: bool = True,
        restart_px: int | None = 32,
        keep_given: bool = False,
    ) -> None:
        if (
            isinstance(threshold_bytes, bool)
            or not isinstance(threshold_bytes, numbers.Integral)
            or threshold_bytes < 0
        ):
            raise ValueError(f"threshold_bytes must be an int >= 0, got {threshold_bytes!r}")
        self.threshold_bytes = int(threshold_bytes)
        self.quality = _check_quality(quality)
        self.max_side = _check_max_side(max_side)
        self.check = _check_flag(check, "check")
        self.subsampling = _check_subsampling(subsampling)
        self.exact = _check_flag(exact, "exact")
        self.restart_px = _check_restart_px(restart_px)
        self.keep_given = _check_flag(keep_given, "keep_given")

    def encode(self, value):
        if isinstance(value, (bytes, bytearray, memoryview)) and codecs.is_jpeg(value):
            h, w = images.fit_size(*images.image_size(value), self.max_side)
            if h * w * 3 > self.threshold_bytes and not self._needs_resize(value):
                return _stored_jpeg(self, value), h, w, FORMAT_JPEG
        img = self._pixels(value)
        if img.nbytes <= self.threshold_bytes:
            return np.ascontiguousarray(img).tobytes(), img.shape[0], img.shape[1], FORMAT_RAW
        jpeg = _encode_jpeg(img, self.quality, self.subsampling, self.restart_px)
        return jpeg, img.shape[0], img.shape[1], FORMAT_JPEG

    def decode(self, data, h, w, fmt):
        if fmt == FORMAT_JPEG:
            return _check_shape(_decode_jpeg(data), h, w)
        if fmt != FORMAT_RAW or h < 1 or w < 1 or len(data) not in (h * w * 3, h * w * 4):
            raise ValueError(f"bad raw image record: format {fmt}, {h} x {w}, {len(data)} bytes")
        return np.frombuffer(data, np.uint8).reshape(h, w, -1)

    def params(self):
        return {
            "threshold_bytes": self.threshold_bytes,
            "quality": self.quality,
            "max_side": self.max_side,
            "subsampling": self.subsampling,
            "exact": self.exact,
            "restart_px": self.restart_px,
            "keep_given": self.keep_given,
        }


ENCODINGS = {cls.name: cls for cls in (Scalar, Raw, NDArray, Bytes, Str, JPEG, QOI, Smart)}


def as_encoding(spec: "Encoding | str | np.dtype") -> Encoding:
    """An Encoding from an Encoding or a numpy scalar dtype name (``"int64"``).
    Raises TypeError/ValueError naming what was given."""
    if isinstance(spec, Encoding):
        return spec
    if isinstance(spec, type) and issubclass(spec, Encoding):
        raise TypeError(f"give an encoding instance, e.g. {spec.__name__}(), not the class")
    if isinstance(spec, (str, np.dtype)):
        try:
            return Scalar(spec)
        except TypeError:
            raise ValueError(f"unknown field encoding {spec!r}") from None
    raise TypeError(f"a field encoding must be an Encoding or a dtype name, got {spec!r}")


def from_meta(meta):
    """The Encoding described by a field's metadata dict; a parameter the metadata lacks
    (a file written before it existed) has the value in the class's ``written_before``.
    Raises ValueError."""
    try:
        cls = ENCODINGS[meta["encoding"]]
        params = {k: v for k, v in meta.items() if k not in ("encoding", "columns")}
        return cls(**{**cls.written_before, **params})
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"bad field metadata {meta!r}: {exc}") from exc
