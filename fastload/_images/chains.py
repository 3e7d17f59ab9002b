"""What the image sources read of a chain of image transforms, declared below both.

``fastload.transforms.Compose`` is the one kind of chain; the planner's image sources
(``imagesources``) test for this class instead of importing the transforms, so that the
engine's planner reaches no transform (tests/test_architecture.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ImageChain"]


class ImageChain:
    """A chain of image transforms as C runs it: ``native`` when it is one ``pipeline`` (a
    ``_core.Pipeline``; a chain with a Lambda is not), ``decodes`` when its input is the
    bytes of an image file, decoded to ``channels``; ``output_shape`` is the shape of every
    output (None when it varies with the input's), ``output_dtype`` their dtype."""

    native: bool
    decodes: bool
    channels: int | None
    pipeline: Any
    output_shape: tuple[int, ...] | None
    output_dtype: np.dtype[Any]

    @property
    def exact_decode(self) -> bool:
        """Whether the chain decodes at full scale (``DecodeImage(exact=True)``)."""
        raise NotImplementedError

    def output_shape_for(self, shape: tuple[int, ...]) -> tuple[int, int, int]:
        """The output shape for an input image of ``shape`` (HW or HWC)."""
        raise NotImplementedError
