"""Image helpers for the storage encodings: decoding file bytes, area resize (sniffing a
format is ``fastload._images.codecs``'s: ``is_jpeg``, ``is_qoi``).

Pixels are uint8 arrays of shape (height, width, channels), RGB or RGBA. Decoding is
``fastload._images.codecs.decode``'s (simplejpeg for JPEG, C for QOI, Pillow for the rest).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from fastload._images import codecs


def as_pixels(value: npt.ArrayLike | bytes | bytearray | memoryview) -> np.ndarray:
    """``value`` (an array, or encoded image bytes) as a uint8 (h, w, 3|4) array.

    A 2-D or single-channel array becomes RGB. Raises ValueError for another shape or
    dtype, or bytes that cannot be decoded.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        return decode_image_bytes(value)
    arr = np.asarray(value)
    if arr.dtype != np.uint8:
        raise ValueError(f"an image must be a uint8 array, got dtype {arr.dtype}")
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.ndim != 3 or arr.shape[2] not in (1, 3, 4):
        raise ValueError(f"an image must have shape (h, w), (h, w, 1|3|4), got {arr.shape}")
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"an image must not be empty, got shape {arr.shape}")
    if arr.shape[2] == 1:
        arr = np.repeat(arr, 3, axis=2)
    return arr


def image_size(value: npt.ArrayLike | bytes | bytearray | memoryview) -> tuple[int, int]:
    """(height, width) of an array or of encoded image bytes, from the header alone."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return codecs.image_size(value)
    return np.shape(value)[:2]


def decode_image_bytes(
    data: bytes | bytearray | memoryview, min_size: tuple[int, int] | None = None
) -> np.ndarray:
    """Decodes JPEG, QOI or (through Pillow) any other image file bytes to RGB(A)
    (``fastload._images.codecs.decode``). ``min_size`` = (h, w) lets JPEG decode at a reduced
    scale no smaller than that. Raises ValueError when the bytes are not a readable image."""
    return codecs.decode(data, min_size=min_size)


def fit_size(h: int, w: int, max_side: int | None) -> tuple[int, int]:
    """(h, w) scaled so the longer side is at most ``max_side``, keeping the aspect ratio."""
    if max_side is None or max(h, w) <= max_side:
        return h, w
    scale = max_side / max(h, w)
    return max(1, round(h * scale)), max(1, round(w * scale))


def resize_area(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Shrinks ``img`` (h, w, c) uint8 to ``size`` = (h, w) by exact area averaging.

    Each output pixel is the mean of the input area it covers, fractional pixels weighted
    by their overlap (as OpenCV's INTER_AREA). Only shrinking is supported.
    """
    oh, ow = size
    if (oh, ow) == img.shape[:2]:
        return img
    if oh > img.shape[0] or ow > img.shape[1]:
        raise ValueError(f"resize_area only shrinks, asked {img.shape[:2]} -> {size}")
    out = _area_axis(img.astype(np.float64), oh, axis=0)
    out = _area_axis(out, ow, axis=1)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def _area_axis(x: np.ndarray, m: int, axis: int) -> np.ndarray:
    """Area-average ``x`` along ``axis`` down to ``m`` samples, via cumulative sums."""
    n = x.shape[axis]
    if m == n:
        return x
    x = np.moveaxis(x, axis, 0)
    csum = np.concatenate([np.zeros((1,) + x.shape[1:]), np.cumsum(x, axis=0)])
    edges = np.arange(m + 1) * (n / m)
    lo = np.minimum(np.floor(edges).astype(np.int64), n - 1)
    frac = (edges - lo).reshape((-1,) + (1,) * (x.ndim - 1))
    # The integral up to a fractional edge: whole pixels plus part of the next one.
    at_edge = csum[lo] + frac * x[lo]
    out = (at_edge[1:] - at_edge[:-1]) / (n / m)
    return np.moveaxis(out, 0, axis)
