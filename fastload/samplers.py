"""Samplers: which observations each epoch loads (``sampler=``) and how they form batches
(``batch_sampler=``).

A sampler is a function ``sampler(epoch, seed)`` that returns the positions to load in
that epoch, in order; a batch sampler ``batch_sampler(epoch, seed)`` returns the batches,
each a sequence of positions, and batches may differ in size. The loader calls them with
its own seed, so what they draw is a pure function of (seed, epoch): the same on every
rank, after a restart, and for any number of threads. The loader then shards what they
return (every rank calls them alike) and cuts it into steps.

Instead of a function, ``sampler=`` also takes any iterable of positions (a list, an
array, a range, a PyTorch sampler) and ``batch_sampler=`` any iterable of batches; they
are iterated once per epoch (after ``set_epoch(epoch)`` when they have one), so they
are deterministic, and a resumed run exact, only as far as iterating them is.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from numbers import Integral
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from ._base.randomness import Purpose, generator

__all__ = [
    "BatchSampler",
    "BucketBatchSampler",
    "Sampler",
    "WeightedSampler",
    "draw_batches",
    "draw_order",
]

# ``sampler=``: ``sampler(epoch, seed) -> positions``, or an iterable of positions.
Sampler: TypeAlias = Callable[[int, int], Iterable[int]] | Iterable[int]
# ``batch_sampler=``: ``batch_sampler(epoch, seed) -> batches``, or an iterable of batches.
BatchSampler: TypeAlias = Callable[[int, int], Iterable[Iterable[int]]] | Iterable[Iterable[int]]

_POOL_BATCHES = 64  # batches' worth of observations that a BucketBatchSampler sorts at once


class WeightedSampler:
    """Draws ``num_samples`` positions an epoch (default: as many as there are weights),
    observation ``i`` with probability ``weights[i] / sum(weights)``: with replacement
    (by default), or without (each position at most once, in a weighted random order:
    ``num_samples`` at most the count of nonzero weights). For class imbalance, give
    each observation the inverse of its class's frequency::

        counts = np.bincount(labels)
        loader = DataLoader(data, 64, sampler=WeightedSampler(1.0 / counts[labels]))

    Raises ``ValueError`` for weights that are not finite, negative, all zero, or too few
    nonzero ones for ``num_samples`` without replacement.
    """

    weights: npt.NDArray[np.float64]
    num_samples: int
    replacement: bool
    _cdf: npt.NDArray[np.float64]
    _last: int

    def __init__(
        self, weights: npt.ArrayLike, num_samples: int | None = None, *, replacement: bool = True
    ) -> None:
        w = np.asarray(weights, dtype=np.float64)
        if w.ndim != 1 or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
            raise ValueError("weights must be a 1-D sequence of finite numbers >= 0, not all 0")
        if num_samples is None:
            num_samples = len(w)
        if (
            not isinstance(num_samples, Integral)
            or isinstance(num_samples, bool)
            or num_samples < 0
        ):
            raise ValueError(f"num_samples must be an int >= 0, got {num_samples!r}")
        if not replacement and num_samples > np.count_nonzero(w):
            raise ValueError(
                f"cannot draw {num_samples} observations without replacement "
                f"from {np.count_nonzero(w)} with a nonzero weight"
            )
        self.weights = w
        self.num_samples = int(num_samples)
        self.replacement = bool(replacement)
        self._cdf = np.cumsum(w / w.sum())
        self._last = int(np.flatnonzero(w)[-1])

    def __call__(self, epoch: int, seed: int) -> npt.NDArray[np.int64]:
        """The int64 positions of ``epoch``, drawn from (seed, epoch) alone."""
        rng = generator(seed, Purpose.SAMPLER, epoch)
        if self.replacement:
            u = rng.random(self.num_samples)
            # The cdf ends at 1 up to rounding: a draw past its end is the last position
            # with a nonzero weight.
            return np.minimum(np.searchsorted(self._cdf, u, side="right"), self._last).astype(
                np.int64
            )
        # Exponential keys E_i / w_i: sorting them gives a weighted random order without
        # replacement (the first num_samples are a weighted sample).
        with np.errstate(divide="ignore"):
            keys = rng.exponential(size=len(self.weights)) / self.weights
        return np.argsort(keys, kind="stable")[: self.num_samples].astype(np.int64)

    def __repr__(self) -> str:
        return (
            f"WeightedSampler({len(self.weights)} weights, num_samples={self.num_samples}, "
            f"replacement={self.replacement})"
        )


class BucketBatchSampler:
    """Batches of observations of similar length, so that padding each batch to its
    longest observation wastes little.

    Each epoch the positions are shuffled (from (seed, epoch); in order with
    ``shuffle=False``), taken ``pool_size`` at a time, sorted by ``lengths`` within each
    pool and cut into batches: ``batch_size`` observations each, or with ``max_tokens``
    as many as fit ``count * longest <= max_tokens`` (an observation longer than that is
    a batch of its own), so batches of short observations are larger. The batches are
    then shuffled. ``pool_size`` defaults to 64 batches' worth. ``drop_last`` drops the
    last batch of the epoch when it holds fewer than ``batch_size``.

    Raises ``ValueError`` unless exactly one of ``batch_size`` and ``max_tokens`` is a
    positive int, or for lengths that are not a 1-D sequence of numbers.
    """

    def __init__(
        self,
        lengths: npt.ArrayLike,
        batch_size: int | None = None,
        *,
        max_tokens: int | None = None,
        shuffle: bool = True,
        pool_size: int | None = None,
        drop_last: bool = False,
    ) -> None:
        lengths = _lengths(lengths)
        if (batch_size is None) == (max_tokens is None):
            raise ValueError("give one of batch_size and max_tokens")
        for name, value in (
            ("batch_size", batch_size),
            ("max_tokens", max_tokens),
            ("pool_size", pool_size),
        ):
            if value is not None and (
                not isinstance(value, Integral) or isinstance(value, (bool, np.bool_)) or value < 1
            ):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if drop_last and batch_size is None:
            raise ValueError(
                "drop_last needs batch_size: batches cut by max_tokens have no full size"
            )
        self.lengths = lengths
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        if pool_size is None:
            typical = max(1.0, float(np.median(lengths))) if lengths.size else 1.0
            # max_tokens is an int when batch_size is None (checked above).
            per_batch = batch_size or max(1, int(max_tokens // typical))  # type: ignore[operator]
            pool_size = _POOL_BATCHES * per_batch
        elif batch_size is not None:
            pool_size = -(-pool_size // batch_size) * batch_size  # whole batches a pool
        self.pool_size = int(pool_size)

    def __call__(self, epoch: int, seed: int) -> list[npt.NDArray[np.int64]]:
        """The batches of ``epoch``: a list of int64 arrays of positions."""
        rng = generator(seed, Purpose.SAMPLER, epoch)
        n = len(self.lengths)
        positions = rng.permutation(n) if self.shuffle else np.arange(n)
        batches = []
        for first in range(0, n, self.pool_size):
            pool = positions[first : first + self.pool_size]
            pool = pool[np.argsort(self.lengths[pool], kind="stable")]
            batches.extend(self._cut(pool))
        # drop_last comes with a batch_size (checked in __init__).
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:  # type: ignore[operator]
            batches.pop()
        if self.shuffle:
            batches = [batches[k] for k in rng.permutation(len(batches))]
        return batches

    def _cut(self, pool: npt.NDArray[np.int64]) -> list[npt.NDArray[np.int64]]:
        """Consecutive batches of ``pool`` (sorted by length)."""
        if self.batch_size is not None:
            return [pool[k : k + self.batch_size] for k in range(0, len(pool), self.batch_size)]
        lengths = self.lengths[pool]
        batches, first = [], 0
        while first < len(pool):
            # count * lengths[first + count - 1] grows with count: the largest count that
            # fits is found by bisection.
            low, high = 1, len(pool) - first
            while low < high:
                mid = (low + high + 1) // 2
                if mid * lengths[first + mid - 1] <= self.max_tokens:
                    low = mid
                else:
                    high = mid - 1
            batches.append(pool[first : first + low])
            first += low
        return batches

    def __repr__(self) -> str:
        size = (
            f"batch_size={self.batch_size}"
            if self.batch_size is not None
            else f"max_tokens={self.max_tokens}"
        )
        return f"BucketBatchSampler({len(self.lengths)} lengths, {size}, shuffle={self.shuffle})"


def _lengths(values: npt.ArrayLike) -> np.ndarray:
    """The lengths of a ``BucketBatchSampler``, checked: one finite number >= 0 per
    observation (a negative or NaN length would sort, and cut batches, at random)."""
    lengths = np.asarray(values)
    if lengths.ndim != 1 or (lengths.size and lengths.dtype.kind not in "iuf"):
        raise ValueError(
            f"lengths must be a 1-D sequence of numbers (not bools), one per observation; "
            f"got an array of shape {lengths.shape} and dtype {lengths.dtype}"
        )
    bad = ~np.isfinite(lengths) | (lengths < 0) if lengths.dtype.kind == "f" else lengths < 0
    if bad.any():
        place = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"lengths must be finite numbers >= 0: lengths[{place}] is {lengths[place].item()!r}"
        )
    return lengths


def _set_epoch(sampler: object, epoch: int) -> None:
    set_epoch = getattr(sampler, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)


def _positions(values: Any, n: int, what: str) -> npt.NDArray[np.int64]:
    """``values`` (an iterable of positions) as int64 positions in ``range(n)``.

    Positions are integers: Python ints, numpy integers or integer tensors, and arrays of
    them, one dimension; never a float, a bool, a string or a nested array (none of them is
    rounded or flattened). Raises ``TypeError`` naming the first value that is no position
    and its place, or ``IndexError`` naming the first outside the data."""
    if hasattr(values, "numpy") and hasattr(values, "dim"):  # a tensor
        values = values.detach().cpu().numpy()
    if isinstance(values, np.ndarray) and values.dtype != object:
        return _array_positions(values, n, what)
    try:
        items = iter(values) if not isinstance(values, (str, bytes)) else None
    except TypeError:
        items = None
    if items is None:
        raise TypeError(f"{what} gave {values!r} where it must give an iterable of int positions")
    positions = []
    for place, value in enumerate(items):
        if type(value) is not int:  # the common case, checked first
            value = _position(value, what, place)
        if not 0 <= value < n:
            raise IndexError(
                f"{what} gave position {value} (at place {place}), outside the {n} observations"
            )
        positions.append(value)
    return np.array(positions, dtype=np.int64)


def _array_positions(values: np.ndarray, n: int, what: str) -> npt.NDArray[np.int64]:
    """An array of positions (of any dtype but object), checked as ``_positions`` says."""
    if values.ndim != 1:
        raise TypeError(
            f"{what} gave an array of shape {values.shape}: positions come as one dimension "
            f"(a batch sampler gives one array per batch)"
        )
    if values.size and values.dtype.kind not in "iu":
        raise TypeError(
            f"{what} gave positions of dtype {values.dtype} ({values[:1].tolist()[0]!r} at "
            f"place 0): positions are ints, not rounded from other values; convert them first"
        )
    bad = (values < 0) | (values >= n)
    if bad.any():
        place = int(np.flatnonzero(bad)[0])
        raise IndexError(
            f"{what} gave position {values[place]} (at place {place}), outside the {n} observations"
        )
    return np.ascontiguousarray(values, dtype=np.int64)


def _position(value: Any, what: str, place: int) -> int:
    """``value`` as a Python int when it is an integer (``__index__``) and no bool."""
    is_bool = isinstance(value, (bool, np.bool_)) or str(getattr(value, "dtype", "")) in (
        "bool",
        "torch.bool",
    )
    if not is_bool:
        try:
            return operator.index(value)
        except TypeError:
            pass  # no integer: refused below, with its place
    raise TypeError(
        f"{what} gave {value!r} (a {type(value).__name__}) at place {place}: positions are "
        f"ints (Python, numpy or tensor integers), not bools, floats or strings, and are not "
        f"rounded; convert them first"
    )


def draw_order(sampler: Sampler, n: int, seed: int, epoch: int) -> npt.NDArray[np.int64]:
    """The int64 positions that ``sampler`` (a function of (epoch, seed) or an iterable)
    gives for ``epoch``, checked against ``n`` observations."""
    if callable(sampler):
        return _positions(sampler(epoch, seed), n, "the sampler")
    _set_epoch(sampler, epoch)
    return _positions(sampler, n, "the sampler")


def draw_batches(
    batch_sampler: BatchSampler, n: int, seed: int, epoch: int
) -> list[npt.NDArray[np.int64]]:
    """The batches that ``batch_sampler`` gives for ``epoch``, as a list of int64 arrays
    of positions; ``ValueError`` for an empty batch."""
    if callable(batch_sampler):
        batches = batch_sampler(epoch, seed)
    else:
        _set_epoch(batch_sampler, epoch)
        batches = batch_sampler
    out = [
        _positions(batch, n, f"the batch sampler's batch {k}") for k, batch in enumerate(batches)
    ]
    empty = next((k for k, batch in enumerate(out) if len(batch) == 0), None)
    if empty is not None:
        raise ValueError(f"the batch sampler gave an empty batch (batch {empty})")
    return out
