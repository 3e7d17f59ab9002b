"""JAX integration: batches put on device ahead of the training step.

    >>> from fastload.jax import prefetch_to_device
    >>> for images, labels in prefetch_to_device(loader, size=2):
    ...     state = train_step(state, images, labels)

Importing this module imports jax; ``import fastload`` does not.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator
from numbers import Integral
from typing import Any

import jax
import numpy as np

__all__ = ["prefetch_to_device"]


def prefetch_to_device(
    loader: Iterable[Any], size: int = 2, sharding: jax.sharding.Sharding | jax.Device | None = None
) -> Iterator[Any]:
    """Yield the batches of ``loader`` as ``jax.Array``s, ``size`` batches ahead: up to
    ``size`` batches are on their way to the device while the step works on one.

    ``sharding``: a ``jax.sharding.Sharding`` or device for ``jax.device_put`` (None: the
    default device). Numpy arrays are put through tuples, dicts and lists (any pytree);
    other leaves pass through. Raises ``ValueError`` for ``size < 1``.

    A ``buffer=True`` loader reuses its slots, and ``device_put`` may read (on CPU even
    keep) the host memory after it returns; so the arrays of a buffered loader (any
    loader without ``buffer=False``) are first copied to host arrays jax owns.
    """
    if not isinstance(size, Integral) or size < 1:
        raise ValueError(f"size must be a positive int, got {size!r}")
    owned = getattr(loader, "buffer", True) is False

    def put(leaf: Any) -> Any:
        if not isinstance(leaf, np.ndarray):
            return leaf
        return jax.device_put(leaf if owned else np.array(leaf), sharding)

    queue: collections.deque[Any] = collections.deque()
    for batch in loader:
        queue.append(jax.tree_util.tree_map(put, batch))
        if len(queue) > size:
            yield queue.popleft()
    while queue:
        yield queue.popleft()
