"""Image helpers for the storage encodings: decoding file bytes, area resize (sniffing a
format is ``fastload._images.codecs``'s: ``is_jpeg``, ``is_qoi``).

Pixels are uint8 arrays of shape (height, width, channels), RGB or RGBA. Decoding is
``fastload._images.codecs.decode``'s (simplejpeg for JPEG, C for QOI, Pillow for the rest).
"""

from __future__ import annotations

import threading

import numpy as np
import numpy.typing as npt

from fastload import _core
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


# The most bytes of one buffer a thread keeps for the next image (``_Reused``): larger
# images are decoded and shrunk into arrays of their own.
REUSED_BYTES = 64 << 20


class _Reused(threading.local):
    """This thread's buffers for the images it encodes one after the other: the decoded
    image, the shrunk one and the shrink's scratch, each grown to the largest asked for
    (up to ``REUSED_BYTES``). A new array of that size per image would be memory mapped
    and faulted in page by page each time, wherever the allocator does not keep it (as
    in Dask's workers, which set ``MALLOC_TRIM_THRESHOLD_``): a third of the encode."""

    def __init__(self) -> None:
        self.slots: dict[str, np.ndarray] = {}

    def take(self, slot: str, nbytes: int) -> np.ndarray:
        """``nbytes`` of the buffer ``slot`` as a uint8 array (overwritten by the next
        ``take`` of it on this thread); a new array when over ``REUSED_BYTES``."""
        if nbytes > REUSED_BYTES:
            return np.empty(nbytes, np.uint8)
        held = self.slots.get(slot)
        if held is None or held.nbytes < nbytes:
            held = self.slots[slot] = np.empty(nbytes, np.uint8)
        return held[:nbytes]


_reused = _Reused()


def fit_pixels(
    value: npt.ArrayLike | bytes | bytearray | memoryview,
    max_side: int | None,
    exact: bool,
    reuse: bool = False,
) -> np.ndarray:
    """``value`` (an array or encoded image bytes) as uint8 (h, w, 3|4) pixels whose longer
    side is at most ``max_side``, shrunk by ``resize_area``.

    ``exact``: JPEG bytes are decoded at full size, so the result is exactly the area
    average of the full decode. Else a JPEG is decoded at 1/2, 1/4 or 1/8 scale (libjpeg's
    DCT scaling, the smallest one no smaller than the result) before the area resize:
    faster on large photos, and a few gray levels off (docs/format.md gives the error).
    ``reuse``: decode and shrink into this thread's buffers, for a caller that is done
    with the result before it calls again on the same thread (an encoder, which copies
    it into bytes): the result may be a view of them. Raises ValueError as ``as_pixels``.
    """
    if isinstance(value, (bytes, bytearray, memoryview)) and codecs.is_jpeg(value):
        h, w = codecs.image_size(value)
        target = fit_size(h, w, max_side)
        min_size = None if exact else dct_scaled_size(h, w, target)
        out = _reused.take("decoded", h * w * 3) if reuse else None
        img = codecs.decode(value, min_size=min_size, out=out)
    else:
        img = as_pixels(value)
        target = fit_size(img.shape[0], img.shape[1], max_side)
    return resize_area(img, target, reuse=reuse)


def dct_scaled_size(h: int, w: int, target: tuple[int, int]) -> tuple[int, int]:
    """The size of an (h, w) JPEG decoded at the smallest of the scales 1, 1/2, 1/4, 1/8
    that is no smaller than ``target`` = (h, w) (libjpeg rounds a scaled size up)."""
    denom = 1
    while denom < 8 and -(-h // (2 * denom)) >= target[0] and -(-w // (2 * denom)) >= target[1]:
        denom *= 2
    return -(-h // denom), -(-w // denom)


def resize_area(img: np.ndarray, size: tuple[int, int], reuse: bool = False) -> np.ndarray:
    """Shrinks ``img`` (h, w, c) uint8 to ``size`` = (h, w) by exact area averaging.

    Each output pixel is the mean of the input area it covers, fractional pixels weighted
    by their overlap (as OpenCV's INTER_AREA), computed in integers and rounded to the
    nearest value (halves up): the result does not depend on float rounding. In C
    (``_core.resize_area``), without the GIL. Only shrinking is supported (ValueError).
    ``reuse``: into this thread's buffers, as ``fit_pixels`` says.
    """
    oh, ow = size
    if (oh, ow) == img.shape[:2]:
        return img
    c = img.shape[2] if img.ndim == 3 else 1
    scratch = _core.resize_area_scratch_bytes(img.shape[0], img.shape[1], c, oh, ow)
    if not reuse or scratch == 0:  # 0: not a shrink, which resize_area refuses
        return _core.resize_area(img, oh, ow)
    out = _reused.take("shrunk", oh * ow * c).reshape(oh, ow, c)
    return _core.resize_area(img, oh, ow, out=out, scratch=_reused.take("scratch", scratch))
