"""Which (seed, epoch) the observation being loaded on this thread belongs to.

Random transforms draw from (seed, epoch, index, op) alone; the loader says which seed
and epoch apply while it calls into a container, so a transform deep inside a user's
container gets the same draws sequentially, on any thread, and in any order.
"""

from __future__ import annotations

import threading
from contextlib import ContextDecorator

__all__ = ["current", "loading"]

_local = threading.local()


class loading(ContextDecorator):
    """Within this block, ``current()`` on this thread is ``(seed, epoch)``. A class rather
    than a generator: a loader enters it around every item it loads. The keys it covers
    are kept per thread, so one ``loading`` decorating a function serves every thread."""

    def __init__(self, seed: int, epoch: int) -> None:
        self.key = (seed, epoch)

    def __enter__(self) -> None:
        outer = getattr(_local, "outer", None)
        if outer is None:
            outer = _local.outer = []
        outer.append(getattr(_local, "key", None))
        _local.key = self.key

    def __exit__(self, *exc: object) -> None:
        _local.key = _local.outer.pop()


def current() -> tuple[int, int]:
    """The (seed, epoch) being loaded on this thread; (0, 0) outside a loader."""
    return getattr(_local, "key", None) or (0, 0)
