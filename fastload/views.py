"""Lazy views of data containers. Views copy nothing, compose, and pass ``getobs_into``
buffers through to the container underneath."""
from numbers import Integral, Real

import numpy as np

from .context import current
from .errors import load_error
from .obs import (copy_into, getobs, getobs_into, is_batch_index, map_tree, normalize_index,
                  numobs, tree_leaves)

__all__ = ["BatchView", "JoinedObs", "MappedObs", "ObsView", "batchview", "collate_batch",
           "joinobs", "kfolds", "mapobs", "obsview", "randobs", "shuffleobs", "source_of",
           "splitobs"]


def _rng(seed):
    """A numpy Generator for ``seed``; ``None`` draws fresh entropy from the OS."""
    return np.random.Generator(np.random.PCG64(seed))


class _View:
    """Base of the views: the sequence protocol on top of the container protocol."""

    def __len__(self):
        return self.__numobs__()

    def __getitem__(self, i):
        return self.__getobs__(normalize_index(i, len(self)))

    def __iter__(self):
        for i in range(len(self)):
            yield self.__getobs__(i)


class ObsView(_View):
    """The observations of ``data`` at ``indices``, in that order (see ``obsview``)."""

    def __init__(self, data, indices):
        self.data = data
        self.indices = normalize_index(np.arange(numobs(data))[indices]
                                       if isinstance(indices, slice) else indices,
                                       numobs(data))
        if not is_batch_index(self.indices):
            raise TypeError("obsview needs several indices (an array, list, range or slice)")

    def __numobs__(self):
        return len(self.indices)

    def __getobs__(self, i):
        return getobs(self.data, self.indices[normalize_index(i, len(self.indices))])

    def __getobs_into__(self, buffer, i):
        return getobs_into(buffer, self.data, self.indices[normalize_index(i, len(self.indices))])

    def __repr__(self):
        return f"obsview({type(self.data).__name__}, {len(self.indices)} observations)"


def obsview(data, indices=None):
    """A lazy view of the observations of ``data`` at ``indices`` (all when None)."""
    return ObsView(data, np.arange(numobs(data)) if indices is None else indices)


def shuffleobs(data, seed=None):
    """A lazy view of ``data`` in a random order drawn from ``seed`` (fresh when None)."""
    return ObsView(data, _rng(seed).permutation(numobs(data)))


def randobs(data, seed=None):
    """One observation of ``data`` drawn at random from ``seed`` (fresh when None).
    Raises ``ValueError`` for an empty container."""
    n = numobs(data)
    if n == 0:
        raise ValueError("randobs needs a container with at least one observation")
    return getobs(data, int(_rng(seed).integers(n)))


def splitobs(data, at=0.8, shuffle=False, seed=None):
    """Split ``data`` into consecutive views: ``at`` is a fraction (two views) or a tuple
    of fractions (one view more than fractions), each the share of observations of the
    view it opens. With ``shuffle=True`` the observations are permuted first (``seed``).

    >>> train, test = splitobs(np.arange(10), at=0.8)
    >>> numobs(train), numobs(test)
    (8, 2)
    """
    fractions = (at,) if isinstance(at, Real) else tuple(at)
    if not fractions or any(not 0 < f < 1 for f in fractions) or sum(fractions) > 1 + 1e-9:
        raise ValueError(f"splitobs needs fractions in (0, 1) that sum to at most 1, got {at!r}")
    n = numobs(data)
    order = _rng(seed).permutation(n) if shuffle else np.arange(n)
    ends = [int(round(n * f)) for f in np.cumsum(fractions)] + [n]
    starts = [0] + ends[:-1]
    return tuple(ObsView(data, order[s:e]) for s, e in zip(starts, ends))


def kfolds(data, k=5):
    """``k`` pairs ``(train, validation)`` of views: fold ``j`` validates on the j-th of
    ``k`` consecutive, nearly equal parts and trains on the rest. Raises ``ValueError``
    unless ``2 <= k <= numobs(data)``."""
    n = numobs(data)
    if not isinstance(k, Integral) or not 2 <= k <= n:
        raise ValueError(f"kfolds needs 2 <= k <= {n} (the number of observations), got {k!r}")
    bounds = np.linspace(0, n, k + 1).round().astype(np.int64)
    everything = np.arange(n)
    return [(ObsView(data, np.concatenate([everything[:lo], everything[hi:]])),
             ObsView(data, everything[lo:hi]))
            for lo, hi in zip(bounds[:-1], bounds[1:])]


class MappedObs(_View):
    """``f`` applied to each observation of ``data`` on access (see ``mapobs``).

    A random transform (one with ``wants_index = True``, like ``transforms.Compose``) is
    called as ``f(x, index=i, seed=seed, epoch=epoch)`` so that its draws depend only on
    those; the seed and epoch are the loader's (0 and 0 outside a loader).

    Several observations come back stacked into arrays when ``f`` returns arrays or
    numbers (or tuples/dicts of them) of one shape, and as a list otherwise."""

    def __init__(self, f, data):
        if not callable(f):
            raise TypeError(f"mapobs needs a callable, got {type(f).__name__}")
        self.f = f
        self.data = data

    def __numobs__(self):
        return numobs(self.data)

    def _apply(self, i):
        x = getobs(self.data, i)
        try:
            if getattr(self.f, "wants_index", False):
                seed, epoch = current()
                return self.f(x, index=i, seed=seed, epoch=epoch)
            return self.f(x)
        except Exception as error:
            raise load_error(i, error, source_of(self.data, i)) from error

    def __getobs__(self, i):
        i = normalize_index(i, numobs(self.data))
        if is_batch_index(i):
            return stack_if_arrays([self._apply(int(j)) for j in i])
        return self._apply(i)

    def __getobs_into__(self, buffer, i):
        i = normalize_index(i, numobs(self.data))
        if not is_batch_index(i):
            return copy_into(buffer, self._apply(i))
        if not _is_buffer(buffer):
            return self.__getobs__(i)
        for k, j in enumerate(i):
            copy_into(_row(buffer, k), self._apply(int(j)))
        return buffer

    def __repr__(self):
        return f"mapobs({getattr(self.f, '__name__', type(self.f).__name__)}, {type(self.data).__name__})"


def source_of(data, i):
    """The file that observation ``i`` of ``data`` is read from, when the container says
    (a ``paths`` attribute, through ``mapobs``); else None."""
    while isinstance(data, MappedObs):
        data = data.data
    paths = getattr(data, "paths", None)
    return None if paths is None else str(paths[i])


def mapobs(f, data):
    """A lazy view of ``data`` with ``f`` applied to each observation when it is read."""
    return MappedObs(f, data)


class JoinedObs(_View):
    """The concatenation of several containers (see ``joinobs``). Several observations
    come back stacked like those of ``mapobs``."""

    def __init__(self, *datas):
        if not datas:
            raise ValueError("joinobs needs at least one container")
        self.datas = datas
        self.offsets = np.cumsum([0] + [numobs(d) for d in datas])

    def __numobs__(self):
        return int(self.offsets[-1])

    def _locate(self, i):
        part = int(np.searchsorted(self.offsets, i, side="right")) - 1
        return part, i - int(self.offsets[part])

    def __getobs__(self, i):
        i = normalize_index(i, len(self))
        if not is_batch_index(i):
            part, j = self._locate(i)
            return getobs(self.datas[part], j)
        return stack_if_arrays([self.__getobs__(int(j)) for j in i])

    def __getobs_into__(self, buffer, i):
        i = normalize_index(i, len(self))
        if not is_batch_index(i):
            part, j = self._locate(i)
            return getobs_into(buffer, self.datas[part], j)
        if not _is_buffer(buffer):
            return self.__getobs__(i)
        for k, j in enumerate(i):
            self.__getobs_into__(_row(buffer, k), int(j))
        return buffer


def joinobs(*datas):
    """A lazy view of the containers ``datas`` one after another."""
    return JoinedObs(*datas)


def _stack(observations):
    """Stack observations into arrays with a new leading axis, through tuples and dicts."""
    first = observations[0]
    if isinstance(first, dict):
        return {key: _stack([o[key] for o in observations]) for key in first}
    if isinstance(first, tuple):
        stacked = [_stack([o[j] for o in observations]) for j in range(len(first))]
        return type(first)(*stacked) if hasattr(first, "_fields") else tuple(stacked)
    return np.stack([np.asarray(o) for o in observations])


def _is_stackable(obs):
    if isinstance(obs, (np.ndarray, np.generic, int, float, bool)):
        return True
    if isinstance(obs, (tuple, dict)):
        return all(_is_stackable(v) for v in (obs.values() if isinstance(obs, dict) else obs))
    return False


def stack_if_arrays(observations):
    """The observations stacked like ``_stack`` when they are arrays or numbers (through
    tuples and dicts); the list itself otherwise. Raises ``ValueError`` when they are
    arrays of different shapes (collect those with ``collate=False``)."""
    if not observations or not all(_is_stackable(o) for o in observations):
        return observations
    try:
        return _stack(observations)
    except ValueError as error:
        raise ValueError(f"observations of different shapes cannot form one batch ({error});"
                         f" use collate=False to get them as a list") from None


def _is_buffer(buffer):
    """True for an array, or a tuple/dict of arrays: something rows can be filled into."""
    leaves = tree_leaves(buffer)
    return bool(leaves) and all(isinstance(leaf, np.ndarray) for leaf in leaves)


def _slice_buffer(buffer, m):
    """The first ``m`` rows of a batch buffer (an array, or a tuple/dict of them)."""
    return map_tree(lambda array: array[:m], buffer)


def _row(buffer, k):
    """Row ``k`` of a batch buffer (an array, or a tuple/dict of them), as views: even for
    1-D arrays, where ``array[k]`` would be a copy."""
    return map_tree(lambda array: array[k, ...], buffer)


class BatchView(_View):
    """A container of batches of ``data`` (see ``batchview``)."""

    def __init__(self, data, batch_size, drop_last=False, collate=None):
        if not isinstance(batch_size, Integral) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not (collate is None or isinstance(collate, bool) or callable(collate)):
            raise TypeError(f"collate must be None, True, False or a callable, got {collate!r}")
        self.data = data
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        self.collate = collate
        n = numobs(data)
        self._n = n // self.batch_size if drop_last else -(-n // self.batch_size)

    def __numobs__(self):
        return self._n

    def batch_indices(self, b):
        """The observation indices of batch ``b`` (an int64 array)."""
        start = b * self.batch_size
        return np.arange(start, min(start + self.batch_size, numobs(self.data)), dtype=np.int64)

    def _batch(self, b):
        return collate_batch(self.data, self.batch_indices(b), self.collate)

    def __getobs__(self, b):
        b = normalize_index(b, self._n)
        if is_batch_index(b):
            return [self._batch(int(j)) for j in b]
        return self._batch(b)

    def __getobs_into__(self, buffer, b):
        b = normalize_index(b, self._n)
        if is_batch_index(b):
            return self.__getobs__(b)
        idx = self.batch_indices(b)
        if self.collate is None:
            return getobs_into(_slice_buffer(buffer, len(idx)), self.data, idx)
        if self.collate is True:
            part = _slice_buffer(buffer, len(idx))
            for k, j in enumerate(idx):
                getobs_into(_row(part, k), self.data, int(j))
            return part
        return copy_into(buffer, self._batch(b))

    def __repr__(self):
        return (f"batchview({type(self.data).__name__}, batch_size={self.batch_size}, "
                f"drop_last={self.drop_last}, {self._n} batches)")


def collate_batch(data, indices, collate):
    """The batch of ``data`` at ``indices`` formed as ``collate`` says (see ``batchview``)."""
    if collate is None:
        return getobs(data, indices)
    observations = [getobs(data, int(j)) for j in indices]
    if collate is True:
        return _stack(observations)
    if collate is False:
        return observations
    return collate(observations)


def batchview(data, batch_size, drop_last=False, collate=None):
    """A lazy container whose observations are batches of ``batch_size`` observations of
    ``data``; the last one is partial unless ``drop_last``.

    ``collate`` says how a batch is formed: ``None`` gathers with ``getobs(data, indices)``
    (one gather for arrays), ``True`` stacks the observations into arrays with a new
    leading axis (through tuples and dicts), ``False`` gives the list of observations, and
    a callable is applied to that list. Raises ``ValueError`` for ``batch_size < 1``.
    """
    return BatchView(data, batch_size, drop_last, collate)
