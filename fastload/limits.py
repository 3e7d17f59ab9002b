"""Limits that keep a hostile or broken file from taking the machine's memory.

Like Pillow's ``Image.MAX_IMAGE_PIXELS``, these are module settings: change them before
building a loader (a loader reads them each epoch, when it plans its native image
fields) or decoding, e.g. ``fastload.limits.MAX_IMAGE_PIXELS = 400_000_000``.

- ``MAX_IMAGE_PIXELS``: an encoded image whose header declares more pixels (height x
  width) is refused before any memory is set aside for it (a few hundred bytes of JPEG
  header can declare 16384 x 16384). Default 89,478,485, Pillow's.
- ``MAX_FILE_BYTES``: an image file larger than this is refused before it is read (a
  file is read whole into memory, once per loading thread). Default 256 MiB.
"""

from __future__ import annotations

import os

__all__ = ["MAX_FILE_BYTES", "MAX_IMAGE_PIXELS", "check_file_bytes", "check_pixels"]

MAX_IMAGE_PIXELS = 89_478_485
MAX_FILE_BYTES = 256 << 20


def check_pixels(h: int, w: int) -> None:
    """Raise ValueError when an h x w image is over ``MAX_IMAGE_PIXELS``."""
    if h * w > MAX_IMAGE_PIXELS:
        raise ValueError(
            f"a {h}x{w} image is over the limit of {MAX_IMAGE_PIXELS:,} pixels "
            f"(fastload.limits.MAX_IMAGE_PIXELS)"
        )


def check_file_bytes(size: int, path: str | os.PathLike[str]) -> None:
    """Raise ValueError when a file of ``size`` bytes is over ``MAX_FILE_BYTES``."""
    if size > MAX_FILE_BYTES:
        raise ValueError(
            f"{path}: a file of {size:,} bytes is over the limit of "
            f"{MAX_FILE_BYTES:,} bytes (fastload.limits.MAX_FILE_BYTES)"
        )
