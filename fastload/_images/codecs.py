"""Image decoding done in Python: what the decoders in C leave to it.

JPEG decodes in C through libjpeg (only the rows and columns a crop reads, without the GIL)
and QOI in C. This module holds the rest, called by the native image field with the GIL:
simplejpeg for JPEG where libjpeg is not there (and for CMYK JPEGs), and Pillow for PNG,
BMP, GIF, WebP, TIFF and PNM. ``decoder_name()`` says which JPEG decoder a build uses.
"""

import io

import numpy as np
import simplejpeg

from .. import _core
from .._base.version import __version__

# A JPEG stream opens with its start-of-image marker, FF D8, and the FF of the marker
# after it: two bytes alone also start files that are not JPEG.
JPEG_MAGIC = b"\xff\xd8\xff"
QOI_MAGIC = b"qoif"
COLORSPACES = {1: "GRAY", 3: "RGB", 4: "RGBA"}  # simplejpeg's colour space per channel count
PILLOW_MODES = {1: "L", 3: "RGB", 4: "RGBA"}

# Pillow modes of more than 8 bits per sample that map to 8 bits exactly by a shift.
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")


def decoder_name() -> str:
    """Which JPEG decoder runs on pool threads, e.g. ``"libjpeg-turbo 2.1.5"``, or
    ``"simplejpeg"`` when fastload was built without libjpeg's headers or its libjpeg
    could not be loaded (``build_info()`` says which)."""
    version = _core.jpeg_library_version()
    if not version:
        return "simplejpeg"
    major, minor, patch = version // 1000000, version // 1000 % 1000, version % 1000
    return f"libjpeg-turbo {major}.{minor}.{patch}"


def build_info() -> dict[str, str]:
    """What this build decodes with: ``{"version", "jpeg_decoder", "other_formats"}``, e.g.
    ``jpeg_decoder: "libjpeg-turbo 2.1.5"`` (in C, the crop only, without the GIL) or
    ``"simplejpeg (built without libjpeg's headers)"`` (the whole image, with the GIL taken
    per call; the words in brackets say why, e.g. a libjpeg that could not be loaded).
    Also ``python -m fastload info``."""
    try:
        import PIL

        other = f"Pillow {PIL.__version__} (PNG, BMP, GIF, WebP, TIFF, PNM; with the GIL)"
    except ImportError:
        other = "none: pip install pillow to decode PNG, BMP, GIF, WebP, TIFF and PNM"
    jpeg = decoder_name()
    if _core.JPEG_FALLBACK_REASON:
        jpeg = f"{jpeg} ({_core.JPEG_FALLBACK_REASON})"
    return {"version": __version__, "jpeg_decoder": jpeg, "other_formats": other}


def is_jpeg(data: bytes | bytearray | memoryview) -> bool:
    """True when the bytes-like ``data`` starts like a JPEG stream (``JPEG_MAGIC``)."""
    return bytes(data[:3]) == JPEG_MAGIC


def is_qoi(data: bytes | bytearray | memoryview) -> bool:
    """True when the bytes-like ``data`` starts like a QOI stream (``QOI_MAGIC``)."""
    return bytes(data[:4]) == QOI_MAGIC


def image_size(data: bytes | bytearray | memoryview) -> tuple[int, int]:
    """(height, width) of encoded image bytes from their header; ValueError when they are
    not an image file fastload reads."""
    if is_jpeg(data):
        try:
            return _core.jpeg_size(data)
        except ValueError:
            raise ValueError("corrupt or truncated JPEG header") from None
    if is_qoi(data):
        return _core.qoi_header(data)[:2]
    if _format_name(data) == "image":
        raise ValueError(
            "not an image file fastload reads (JPEG, PNG, BMP, GIF, WebP, TIFF, PNM or QOI)"
        )
    try:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as img:
            return img.height, img.width
    except ImportError:
        raise ValueError(
            "decoding PNG, BMP, GIF, WebP or TIFF needs Pillow: pip install pillow"
        ) from None
    except Exception as exc:  # Pillow raises many kinds for bad input
        raise ValueError(f"cannot read this {_format_name(data)} image: {_reason(exc)}") from None


def decode(
    data: bytes | bytearray | memoryview,
    channels: int | None = None,
    min_size: tuple[int, int] | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Image file bytes (JPEG, QOI, or any format Pillow reads) decoded whole to a uint8
    (h, w, channels) array, after checking the header's size against
    ``fastload.limits.MAX_IMAGE_PIXELS``. ``channels`` None: 3, or 4 when the file has an
    alpha channel (QOI's stored channels). ``min_size`` = (h, w) lets a JPEG decode at a
    reduced DCT scale no smaller than that. ``out``: a writable contiguous uint8 array of
    at least h * w * channels bytes a JPEG is decoded into (the result is a view of it),
    else a new array. ValueError when the bytes are not a readable image. (A loader decodes in
    C; this is the one decoder the Python side uses.)"""
    from .. import limits

    data = bytes(data)
    h, w = image_size(data)
    limits.check_pixels(h, w)
    if is_jpeg(data):
        mh, mw = min_size or (0, 0)
        try:
            return simplejpeg.decode_jpeg(
                data,
                colorspace=COLORSPACES[channels or 3],
                min_height=mh,
                min_width=mw,
                buffer=out,
            )
        except ValueError as error:
            raise ValueError(f"corrupt or truncated JPEG: {error}") from None
    if is_qoi(data):
        return _core.qoi_decode(data, channels=channels)
    return decode_pillow(data, channels or _pillow_channels(data), limits.MAX_IMAGE_PIXELS)


def _pillow_channels(data: bytes) -> int:
    """4 when the image has an alpha channel or a transparent colour, else 3."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        alpha = img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info
    return 4 if alpha else 3


def decode_jpeg_into(
    data: bytes | memoryview, out: np.ndarray, scale_denom: int, channels: int
) -> None:
    """Decodes JPEG ``data`` at 1/``scale_denom`` into ``out`` (h, w, channels uint8)
    through simplejpeg. Raises ValueError for a corrupt or truncated JPEG."""
    h, w = out.shape[:2]
    shrink = scale_denom > 1
    try:
        image = simplejpeg.decode_jpeg(
            data,
            colorspace=COLORSPACES[channels],
            min_height=h if shrink else 0,
            min_width=w if shrink else 0,
            min_factor=scale_denom,
            buffer=out,
        )
    except ValueError as error:
        raise ValueError(f"corrupt or truncated JPEG: {error}") from None
    if image.shape[:2] != (h, w):
        raise ValueError(f"the decoder gave {image.shape[:2]} for a {h}x{w} decode")
    if image.ctypes.data != out.ctypes.data:
        out[...] = image.reshape(out.shape)


def decode_pillow(data: bytes | memoryview, channels: int, max_pixels: int) -> np.ndarray:
    """Decodes image file bytes of any format Pillow reads (the first frame of an animated
    one) to a uint8 (h, w, channels) array; 16-bit samples keep their high 8 bits. Raises
    ValueError for bytes Pillow cannot read, pixels that do not fit 8 bits (32-bit integer
    or float images), or an image over ``max_pixels``, found from the header alone."""
    try:
        from PIL import Image
    except ImportError:
        raise ValueError(
            "decoding PNG, BMP, GIF, WebP or TIFF needs Pillow: pip install pillow"
        ) from None
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.width * img.height > max_pixels:
                raise ValueError(
                    f"a {img.height}x{img.width} image is over the limit of "
                    f"{max_pixels} pixels (fastload.limits.MAX_IMAGE_PIXELS)"
                )
            return _eight_bit(img, channels)
    except ValueError:
        raise
    except Exception as exc:  # Pillow raises many kinds for bad input
        raise ValueError(f"cannot decode this {_format_name(data)} image: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    from PIL import UnidentifiedImageError

    if isinstance(exc, UnidentifiedImageError):  # its text names a BytesIO object
        return "corrupt, truncated or of an unsupported kind"
    return str(exc) or type(exc).__name__


def _eight_bit(img, channels):
    if img.mode in _SIXTEEN_BIT:
        gray = (np.asarray(img).astype(np.uint32) >> 8).astype(np.uint8)
        return _channels_of_gray(gray, channels)
    if img.mode in ("I", "F") or img.mode.startswith(("I;", "F;")):
        kind = "32-bit integer" if img.mode[0] == "I" else "floating-point"
        raise ValueError(
            f"a {img.mode!r} image ({kind} pixels) has no 8-bit form fastload "
            f"can pick for you: convert it to 8 bits per sample first"
        )
    return np.ascontiguousarray(
        np.asarray(img.convert(PILLOW_MODES[channels])).reshape(img.height, img.width, channels)
    )


def _channels_of_gray(gray: np.ndarray, channels: int) -> np.ndarray:
    if channels == 1:
        return np.ascontiguousarray(gray[:, :, None])
    out = np.repeat(gray[:, :, None], 3, axis=2)
    if channels == 4:
        out = np.concatenate([out, np.full(gray.shape + (1,), 255, np.uint8)], axis=2)
    return np.ascontiguousarray(out)


def _format_name(data: bytes | bytearray | memoryview) -> str:
    head = bytes(data[:12])
    for magic, name in (
        (b"\x89PNG", "PNG"),
        (b"BM", "BMP"),
        (b"GIF8", "GIF"),
        (b"II*\0", "TIFF"),
        (b"MM\0*", "TIFF"),
    ):
        if head.startswith(magic):
            return name
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WebP"
    if len(head) >= 3 and head[:1] == b"P" and head[1:2] in b"123456" and head[2:3].isspace():
        return "PNM"
    return "image"
