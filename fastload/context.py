"""Which (seed, epoch) the observation being loaded on this thread belongs to.

Random transforms draw from (seed, epoch, index, op) alone; the loader says which seed
and epoch apply while it calls into a container, so a transform deep inside a user's
container gets the same draws sequentially, on any thread, and in any order.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["current", "loading"]

_local = threading.local()


@contextmanager
def loading(seed: int, epoch: int) -> Iterator[None]:
    """Within this block, ``current()`` on this thread is ``(seed, epoch)``."""
    previous = getattr(_local, "key", None)
    _local.key = (seed, epoch)
    try:
        yield
    finally:
        _local.key = previous


def current() -> tuple[int, int]:
    """The (seed, epoch) being loaded on this thread; (0, 0) outside a loader."""
    return getattr(_local, "key", None) or (0, 0)
