"""Native image sources: ``mapobs(Compose([...]), images)`` run in C, item by item.

The planner asks one question, ``native_images(view)``: can C load the observations of
this view (decode, crop, resize, ... into a slot row, without the GIL), and if so with
which ``_core.ImageSource`` and into what shape and dtype. C reads images given as
encoded bytes in one buffer (``ContiguousBytes``), in spans of mapped files
(``SpannedBytes``), as files (``FilePaths``), as a list of ``bytes``, or decoded uint8
arrays when the chain does not decode.

A source is made once per view and kept while the view lives; it is made again when what
it was built from changed: the chain, the container, the items of a list (or the paths
of files), or the size limits of ``fastload.limits``.
"""

from __future__ import annotations

import operator
import weakref
from typing import Any, NamedTuple, TypeAlias, cast

import numpy as np

from .. import _core, limits
from .._base.protocols import ContiguousBytes, FilePaths, SpannedBytes
from ..views import MappedObs
from . import codecs
from .chains import ImageChain

__all__ = ["NativeImages", "is_image_chain", "native_images"]


class NativeImages(NamedTuple):
    """How C loads the observations of a view: ``source`` runs the chain on item i into a
    row of ``shape`` and ``dtype``."""

    source: _core.ImageSource
    shape: tuple[int, ...]
    dtype: np.dtype[Any]


def is_image_chain(data: object) -> bool:
    """True for ``mapobs(Compose([...]), images)``, native or not."""
    return isinstance(data, MappedObs) and isinstance(data.f, ImageChain)


# What a source was built from: the chain, the container, its items or paths (None for
# other containers), and the bounds of the limits.
_Snapshot: TypeAlias = tuple[Any, Any, list[Any] | None, tuple[int, int]]

_sources: weakref.WeakKeyDictionary[MappedObs, tuple[_Snapshot, NativeImages | None]] = (
    weakref.WeakKeyDictionary()
)


def native_images(view: MappedObs) -> NativeImages | None:
    """How C loads the observations of ``view``, or None when they load through Python:
    a chain with a Lambda (it runs item by item through ``Compose.__call__``), a batched
    ``mapobs``, images in a form only Python reads, or outputs whose shape varies."""
    if not isinstance(view.f, ImageChain) or not view.f.native or view.batched:
        return None
    cached = _sources.get(view)
    if cached is None or not _still_holds(cached[0], view):
        cached = _sources[view] = (_snapshot(view), _native(view))
    return cached[1]


def _native(view: MappedObs) -> NativeImages | None:
    output = _output_spec(view)
    if output is None:
        return None
    source = _image_source(view)
    return None if source is None else NativeImages(source, *output)


def _pixel_images(images: Any) -> list[np.ndarray] | None:
    """The decoded uint8 HWC (or HW) images whose rows are packed pixels, as a list, or None.
    Works for one (N, H, W[, C]) array or a list of arrays of one channel count."""
    arrays = list(images) if isinstance(images, (np.ndarray, list, tuple)) else []
    if not arrays or (isinstance(images, np.ndarray) and images.ndim not in (3, 4)):
        return None
    channels = None
    for a in arrays:
        if not (isinstance(a, np.ndarray) and a.dtype == np.uint8 and a.ndim in (2, 3)):
            return None
        c = a.shape[2] if a.ndim == 3 else 1
        if (
            a.strides[0] < c * a.shape[1]
            or a.strides[1] != c
            or (a.ndim == 3 and a.strides[2] != 1)
            or channels not in (None, c)
        ):
            return None  # every image must give the slot's channel count
        channels = c
    return arrays


def _image_source(view: MappedObs) -> _core.ImageSource | None:
    """An ``_core.ImageSource`` that runs ``view.f`` (a Compose) natively over
    ``view.data``, or None when the images are in a form only Python can read."""
    compose, images = cast(ImageChain, view.f), view.data  # a Compose: see native_images

    def source(**where: Any) -> _core.ImageSource:
        return _core.ImageSource(
            compose.pipeline,
            channels=compose.channels or 3,
            name=type(images).__name__,
            decoder=codecs,
            max_pixels=limits.MAX_IMAGE_PIXELS,
            max_file_bytes=limits.MAX_FILE_BYTES,
            exact=compose.exact_decode,
            **where,
        )

    if not compose.decodes:
        pixels = _pixel_images(images)
        return None if pixels is None else source(pixels=pixels)
    if isinstance(images, ContiguousBytes) and images.contiguous:
        return source(offsets=images.buffers())  # one file: n + 1 offsets into its map
    if isinstance(images, SpannedBytes):
        return source(spans=images.spans())  # several files: a span per item
    if isinstance(images, FilePaths):
        return source(paths=list(images.paths))
    if isinstance(images, (list, tuple)) and all(isinstance(b, bytes) for b in images):
        return source(buffers=images)
    return None


def _output_spec(view: MappedObs) -> tuple[tuple[int, ...], np.dtype[Any]] | None:
    """(shape, dtype) of every output of ``mapobs(compose, images)``, or None when it
    varies."""
    compose = cast(ImageChain, view.f)  # a Compose: see native_images
    if compose.output_shape is not None:
        return tuple(compose.output_shape), np.dtype(compose.output_dtype)
    images = view.data
    if compose.decodes or not isinstance(images, (np.ndarray, list, tuple)) or not len(images):
        return None
    # Decoded images: one array gives one input shape; a list, one per image.
    shapes = (
        {images.shape[1:]}
        if isinstance(images, np.ndarray)
        else {np.shape(image) for image in images}
    )
    if any(len(shape) < 2 for shape in shapes):
        return None
    outputs = set()
    for shape in shapes:
        try:
            outputs.add(compose.output_shape_for(shape))
        except ValueError:
            pass  # this image cannot go through the chain: its item fails when loaded
    if len(outputs) != 1:
        return None  # the output size follows the input's: no fixed slot
    return tuple(outputs.pop()), np.dtype(compose.output_dtype)


def _snapshot(view: MappedObs) -> _Snapshot:
    """What the native source of ``view`` was built from: the pipeline, the container, and
    for a list its items or for files their paths, to see whether it still holds."""
    images = view.data
    if isinstance(images, (list, tuple)):
        items = list(images)
    elif isinstance(images, FilePaths):
        items = list(images.paths)
    else:
        items = None
    return view.f, images, items, (limits.MAX_IMAGE_PIXELS, limits.MAX_FILE_BYTES)


def _still_holds(snapshot: _Snapshot, view: MappedObs) -> bool:
    f, images, items, bounds = snapshot
    if view.f is not f or view.data is not images:
        return False
    if bounds != (limits.MAX_IMAGE_PIXELS, limits.MAX_FILE_BYTES):
        return False
    if items is None:
        return True
    now = images if isinstance(images, (list, tuple)) else images.paths
    return len(now) == len(items) and all(map(operator.is_, now, items))
