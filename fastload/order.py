"""Quasi-random sample order for datasets larger than RAM.

A fully random order touches the whole file every few steps; reading it from disk
thrashes the page cache. The quasi-random order visits the dataset chunk by chunk: the
chunks are put in a random order, taken ``window`` at a time, and the items of each window
are shuffled together. Memory bound: while one window is consumed, at most ``window``
chunks are being read, so at most ``window * max(chunk bytes)`` of the file needs to be
resident at once.

Distributed training: the loader gives each rank a contiguous slice of the permutation;
since windows are emitted contiguously, each rank's slice spans few windows and stays
chunk-local.
"""

from __future__ import annotations

import numbers

import numpy as np
import numpy.typing as npt

from .randomness import Purpose, generator

__all__ = ["chunk_sizes", "quasi_random_order"]

DEFAULT_WINDOW = 8


def chunk_sizes(n: int, chunks: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Chunk sizes from ``chunks``: either the sizes (summing to ``n``) or the boundaries
    (``0, ..., n``; k + 1 values for k chunks). Raises ValueError when neither fits."""
    c = np.asarray(chunks)
    if c.ndim != 1 or (c.size and c.dtype.kind not in "iu") or np.any(c < 0):
        raise ValueError("chunks must be a 1-D sequence of non-negative ints")
    c = c.astype(np.int64)
    if int(c.sum()) == n:
        return c
    if c.size >= 1 and c[0] == 0 and c[-1] == n and np.all(np.diff(c) >= 0):
        return np.diff(c)
    raise ValueError(f"chunks are neither sizes summing to {n} nor boundaries 0..{n}")


def quasi_random_order(
    n: int, chunks: npt.ArrayLike, seed: int, epoch: int, window: int = DEFAULT_WINDOW
) -> npt.NDArray[np.int64]:
    """A permutation of ``range(n)`` (int64) that is random but chunk-local.

    ``chunks``: chunk sizes or boundaries (see ``chunk_sizes``), e.g. a dataset's
    ``chunk_bounds``. Chunks are drawn in random order; each run of ``window`` consecutive
    drawn chunks is one window, whose items are shuffled together and emitted before the
    next window starts. Every index appears exactly once. The result depends only on
    (n, chunks, seed, epoch, window): a fresh generator of ``Purpose.QUASI_ORDER``
    is used, never global state.

    Raises ValueError for a bad ``chunks``, ``seed``, ``epoch`` or ``window``. Example::

        order = quasi_random_order(len(ds), ds.chunk_bounds, seed=0, epoch=3)
    """
    for name, value, low in (
        ("n", n, 0),
        ("seed", seed, 0),
        ("epoch", epoch, 0),
        ("window", window, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    sizes = chunk_sizes(n, chunks)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    # Empty chunks are dropped first, so sizes and boundaries give the same order.
    keep = sizes > 0
    sizes, starts = sizes[keep], starts[keep]
    rng = generator(seed, Purpose.QUASI_ORDER, epoch)
    picked = rng.permutation(len(sizes))
    out = np.empty(n, np.int64)
    pos = 0
    for w in range(0, len(picked), window):
        group = picked[w : w + window]
        items = np.concatenate(
            [np.arange(starts[c], starts[c] + sizes[c], dtype=np.int64) for c in group]
        )
        rng.shuffle(items)
        out[pos : pos + len(items)] = items
        pos += len(items)
    return out
