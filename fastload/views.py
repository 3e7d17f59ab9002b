"""Lazy views of data containers. Views copy nothing, compose, and pass ``getobs_into``
buffers through to the container underneath. Subsets (splits, folds, filters, resampling)
are ``obsview``s: see ``subsets.py``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from numbers import Integral
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypeAlias, overload

import numpy as np
import numpy.typing as npt

from ._base.arguments import check_flag, check_size, is_flag
from ._base.collate import Collate, CollateOption, collate
from ._base.keywords import refuse_unknown_keywords
from ._base.randomness import Purpose, generator
from ._base.tree import head, map_tree, row, tree_leaves, unwrap
from .context import current
from .errors import load_error
from .obs import (
    Container,
    Index,
    copy_into,
    getobs,
    getobs_into,
    is_batch_index,
    normalize_index,
    numobs,
)

# The user's names; collate_batch, source_of and steps serve the loader and the storage.
__all__ = [
    "BatchView",
    "Batched",
    "JoinedObs",
    "MappedObs",
    "ObsView",
    "SlidingWindow",
    "batchview",
    "joinobs",
    "mapobs",
    "obsview",
    "randobs",
    "shuffleobs",
    "slidingwindow",
]


# How mapobs calls f: per observation (False), per batch (True), or as it is read ("auto").
Batched: TypeAlias = bool | Literal["auto"]


class _View:
    """Base of the views: the sequence protocol on top of the container protocol."""

    if TYPE_CHECKING:  # what each view defines

        def __numobs__(self) -> int: ...

        def __getobs__(self, i: Index) -> Any: ...

    def __len__(self) -> int:
        return self.__numobs__()

    def __getitem__(self, i: Index) -> Any:
        return self.__getobs__(normalize_index(i, len(self)))

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self.__getobs__(i)


class ObsView(_View):
    """The observations of ``data`` at ``indices``, in that order (see ``obsview``)."""

    def __init__(self, data: Container, indices: Index) -> None:
        self.data = data
        positions = normalize_index(
            np.arange(numobs(data))[indices] if isinstance(indices, slice) else indices,
            numobs(data),
        )
        if not is_batch_index(positions):
            raise TypeError("obsview needs several indices (an array, list, range or slice)")
        self.indices = positions

    def __numobs__(self) -> int:
        return len(self.indices)

    def __getobs__(self, i: Index) -> Any:
        return getobs(self.data, self.indices[normalize_index(i, len(self.indices))])

    def __getobs_into__(self, buffer: Any, i: Index) -> Any:
        return getobs_into(buffer, self.data, self.indices[normalize_index(i, len(self.indices))])

    def __repr__(self) -> str:
        return f"obsview({type(self.data).__name__}, {len(self.indices)} observations)"


def obsview(data: Container, indices: Index | None = None) -> ObsView:
    """A lazy view of the observations of ``data`` at ``indices`` (all when None)."""
    return ObsView(data, np.arange(numobs(data)) if indices is None else indices)


def shuffleobs(data: Container, seed: int | None = None, **unknown: NoReturn) -> ObsView:
    """A lazy view of ``data`` in a random order drawn from ``seed`` (fresh when None)."""
    refuse_unknown_keywords("shuffleobs", unknown)
    return ObsView(data, generator(seed, Purpose.VIEW_ORDER).permutation(numobs(data)))


def randobs(
    data: Container, n: int | None = None, *, seed: int | None = None, **unknown: NoReturn
) -> Any:
    """One observation of ``data`` drawn at random from ``seed`` (fresh when None), or a
    batch of ``n`` drawn with replacement. Raises ``ValueError`` for an empty container."""
    refuse_unknown_keywords("randobs", unknown)
    count = numobs(data)
    if count == 0:
        raise ValueError("randobs needs a container with at least one observation")
    if n is None:
        return getobs(data, int(generator(seed, Purpose.RESAMPLING).integers(count)))
    if not isinstance(n, Integral) or n < 0:
        raise ValueError(f"randobs needs a number of observations n >= 0, got {n!r}")
    return getobs(data, generator(seed, Purpose.RESAMPLING).integers(count, size=int(n)))


class MappedObs(_View):
    """``f`` applied to the observations of ``data`` on access (see ``mapobs``).

    A random transform (one with ``wants_index = True``, like ``transforms.Compose``) is
    called as ``f(x, index=i, seed=seed, epoch=epoch)`` so that its draws depend only on
    those; the seed and epoch are the loader's (0 and 0 outside a loader).

    Several observations come back collated (``_base/collate.py``): stacked into arrays when
    ``f`` returns arrays or numbers (or tuples/dicts of them) of one shape. With
    ``batched=True``, ``f`` takes and returns a whole batch instead; with
    ``batched="auto"``, whatever it is given: a batch for several indices, the
    observation for one."""

    keeps_indices = True  # observation i is f of observation i of data (tree.children)

    def __init__(self, f: Callable[..., Any], data: Container, batched: Batched = False) -> None:
        if not callable(f):
            raise TypeError(f"mapobs needs a callable, got {type(f).__name__}")
        if not (is_flag(batched) or (isinstance(batched, str) and batched == "auto")):
            raise ValueError(f"batched must be False, True or 'auto', got {batched!r}")
        if batched is not False and getattr(f, "wants_index", False):
            raise TypeError("a random transform draws per observation: use it with batched=False")
        self.f = f
        self.data = data
        self.batched: Batched = batched if batched == "auto" else bool(batched)

    def __numobs__(self) -> int:
        return numobs(self.data)

    def over(self, data: Container) -> MappedObs:
        """The same ``f`` (and ``batched``) applied to the observations of ``data``."""
        return MappedObs(self.f, data, self.batched)

    def _apply(self, i: int | npt.NDArray[np.int64]) -> Any:
        x = getobs(self.data, i)
        try:
            if getattr(self.f, "wants_index", False):
                seed, epoch = current()
                return self.f(x, index=i, seed=seed, epoch=epoch)
            return self.f(x)
        except Exception as error:
            # An empty batch has no observation to name (and no file to look up).
            first = (int(i[0]) if len(i) else None) if is_batch_index(i) else i
            raise load_error(
                first, error, None if first is None else source_of(self.data, first)
            ) from error

    def __getobs__(self, i: Index) -> Any:
        i = normalize_index(i, numobs(self.data))
        if self.batched == "auto":
            return self._apply(i)
        if self.batched:
            return (
                self._apply(i)
                if is_batch_index(i)
                else getobs(self._apply(np.array([i], np.int64)), 0)
            )
        if is_batch_index(i):
            return collate([self._apply(int(j)) for j in i])
        return self._apply(i)

    def __getobs_into__(self, buffer: Any, i: Index) -> Any:
        i = normalize_index(i, numobs(self.data))
        if self.batched or not is_batch_index(i):
            return copy_into(buffer, self.__getobs__(i))
        if not _is_buffer(buffer):
            return self.__getobs__(i)
        for k, j in enumerate(i):
            copy_into(row(buffer, k), self._apply(int(j)))
        return buffer

    def __repr__(self) -> str:
        name = getattr(self.f, "__name__", type(self.f).__name__)
        batched = f", batched={self.batched!r}" if self.batched is not False else ""
        return f"mapobs({name}, {type(self.data).__name__}{batched})"


def source_of(data: Container, i: int) -> str | None:
    """The file that observation ``i`` of ``data`` is read from, when the container says
    (a ``paths`` attribute, or a ``row_source(i)`` method as a packed dataset's columns
    have, through ``mapobs``); else None."""
    data = unwrap(data)
    paths = getattr(data, "paths", None)
    if paths is not None:
        return str(paths[i])
    row_source = getattr(data, "row_source", None)
    return None if row_source is None else str(row_source(i))


@overload
def mapobs(
    f: tuple[Callable[..., Any], ...], data: Container, *, batched: Batched = False
) -> tuple[MappedObs, ...]: ...


@overload
def mapobs(
    f: dict[str, Callable[..., Any]], data: Container, *, batched: Batched = False
) -> dict[str, MappedObs]: ...


@overload
def mapobs(f: Callable[..., Any], data: Container, *, batched: Batched = False) -> MappedObs: ...


def mapobs(
    f: Callable[..., Any] | tuple[Callable[..., Any], ...] | dict[str, Callable[..., Any]],
    data: Container,
    *,
    batched: Batched = False,
) -> MappedObs | tuple[MappedObs, ...] | dict[str, MappedObs]:
    """A lazy view of ``data`` with ``f`` applied to each observation when it is read.

    ``f`` may also be a tuple of functions (a tuple of views, one per function) or a dict
    of them (a dict of views: each observation is ``{name: f(x)}`` and ``view[name]`` is
    one of them). With ``batched=True``, ``f`` is vectorised: it is called once on each
    batch ``getobs(data, indices)`` and returns the batch (a single observation is row 0
    of the batch of one). With ``batched="auto"`` (MLUtils' ``:auto``), ``f`` gets what
    is read: the batch for several indices, the observation for one. Raises
    ``TypeError`` when ``f`` is not callable, ``ValueError`` for another ``batched``.

    >>> features = mapobs({"x": np.sqrt, "y": np.log}, np.arange(1.0, 11.0))
    >>> sorted(getobs(features, 9)), float(getobs(features["x"], 3))
    (['x', 'y'], 2.0)
    """
    if isinstance(f, tuple):
        return tuple(MappedObs(g, data, batched) for g in f)
    if isinstance(f, dict):
        return {name: MappedObs(g, data, batched) for name, g in f.items()}
    return MappedObs(f, data, batched)


def locate_part(offsets: Any, i: int) -> tuple[int, int]:
    """(part, index within it) of position ``i`` of parts one after another, which start
    at ``offsets`` (their cumulative sizes from 0)."""
    part = int(np.searchsorted(offsets, i, side="right")) - 1
    return part, i - int(offsets[part])


class JoinedObs(_View):
    """The concatenation of several containers (see ``joinobs``). Several observations
    come back collated like those of ``mapobs``."""

    def __init__(self, *datas: Container) -> None:
        if not datas:
            raise ValueError("joinobs needs at least one container")
        self.datas = datas
        self.offsets = np.cumsum([0] + [numobs(d) for d in datas])

    def __numobs__(self) -> int:
        return int(self.offsets[-1])

    def _locate(self, i: int) -> tuple[int, int]:
        return locate_part(self.offsets, i)

    def __getobs__(self, i: Index) -> Any:
        i = normalize_index(i, len(self))
        if not is_batch_index(i):
            part, j = self._locate(i)
            return getobs(self.datas[part], j)
        return collate([self.__getobs__(int(j)) for j in i])

    def __getobs_into__(self, buffer: Any, i: Index) -> Any:
        i = normalize_index(i, len(self))
        if not is_batch_index(i):
            part, j = self._locate(i)
            return getobs_into(buffer, self.datas[part], j)
        if not _is_buffer(buffer):
            return self.__getobs__(i)
        for k, j in enumerate(i):
            self.__getobs_into__(row(buffer, k), int(j))
        return buffer


def joinobs(*datas: Container) -> JoinedObs:
    """A lazy view of the containers ``datas`` one after another."""
    return JoinedObs(*datas)


class SlidingWindow(_View):
    """Windows of ``size`` consecutive observations of ``data``, ``stride`` apart (see
    ``slidingwindow``). Over arrays (and tuples/dicts of them) the windows are one strided
    numpy view, ``windows``, which the engine gathers natively; else None."""

    def __init__(self, data: Container, size: int, stride: int = 1) -> None:
        n = numobs(data)
        for name, value in (("size", size), ("stride", stride)):
            if not isinstance(value, Integral) or value < 1:
                raise ValueError(f"slidingwindow needs a positive int {name}, got {value!r}")
        if size > n:
            raise ValueError(f"a window of {size} observations does not fit in {n}")
        self.data, self.size, self.stride = data, int(size), int(stride)
        self._n = (n - self.size) // self.stride + 1
        self.windows = _strided_windows(data, self.size, self.stride)

    def __numobs__(self) -> int:
        return self._n

    def _positions(self, w: int) -> npt.NDArray[np.int64]:
        start = w * self.stride
        return np.arange(start, start + self.size, dtype=np.int64)

    def __getobs__(self, i: Index) -> Any:
        i = normalize_index(i, self._n)
        if self.windows is not None:
            return getobs(self.windows, i)
        if is_batch_index(i):
            return collate([getobs(self.data, self._positions(int(w))) for w in i])
        return getobs(self.data, self._positions(i))

    def __getobs_into__(self, buffer: Any, i: Index) -> Any:
        i = normalize_index(i, self._n)
        if self.windows is not None:
            return getobs_into(buffer, self.windows, i)
        if not is_batch_index(i):
            return getobs_into(buffer, self.data, self._positions(i))
        if not _is_buffer(buffer):
            return self.__getobs__(i)
        for k, w in enumerate(i):
            self.__getobs_into__(row(buffer, k), int(w))
        return buffer

    def __repr__(self) -> str:
        return (
            f"slidingwindow({type(self.data).__name__}, size={self.size}, "
            f"stride={self.stride}, {self._n} windows)"
        )


def _strided_windows(data: Container, size: int, stride: int) -> Any:
    """The windows of an array (or tuple/dict of arrays) as a read-only strided view
    ``(windows, size, ...)``, or None for other containers."""
    if isinstance(data, np.ndarray) and data.ndim >= 1:
        view = np.lib.stride_tricks.sliding_window_view(data, size, axis=0)
        return np.moveaxis(view, -1, 1)[::stride]
    if isinstance(data, (tuple, dict)) and len(data):
        parts = map_tree(lambda member: _strided_windows(member, size, stride), data)
        return None if any(part is None for part in tree_leaves(parts)) else parts
    return None


def slidingwindow(data: Container, size: int, stride: int = 1) -> SlidingWindow:
    """A lazy container whose observation ``i`` is the window of ``size`` consecutive
    observations of ``data`` starting at ``i * stride``; only whole windows are included.
    Raises ``ValueError`` for a size or stride below 1, or a size above ``numobs(data)``.

    >>> [w.tolist() for w in slidingwindow(np.arange(11, 31), size=6, stride=3)][:2]
    [[11, 12, 13, 14, 15, 16], [14, 15, 16, 17, 18, 19]]
    """
    return SlidingWindow(data, size, stride)


def _is_buffer(buffer: Any) -> bool:
    """True for an array, or a tuple/dict of arrays: something rows can be filled into."""
    leaves = tree_leaves(buffer)
    return bool(leaves) and all(isinstance(leaf, np.ndarray) for leaf in leaves)


class BatchView(_View):
    """A container of batches of ``data`` (see ``batchview``)."""

    data: Container
    batch_size: int
    drop_last: bool
    collate: Collate
    _n: int

    def __init__(
        self,
        data: Container,
        batch_size: int,
        drop_last: bool = False,
        collate: CollateOption = None,
    ) -> None:
        check_size("batch_size", batch_size)
        self.collate = Collate.of(collate)
        self.data = data
        self.batch_size = int(batch_size)
        self.drop_last = check_flag("drop_last", drop_last)
        self._n = steps(numobs(data), self.batch_size, self.drop_last)

    def __numobs__(self) -> int:
        return self._n

    def batch_indices(self, b: int) -> npt.NDArray[np.int64]:
        """The observation indices of batch ``b`` (an int64 array)."""
        start = b * self.batch_size
        return np.arange(start, min(start + self.batch_size, numobs(self.data)), dtype=np.int64)

    def _batch(self, b: int) -> Any:
        return collate_batch(self.data, self.batch_indices(b), self.collate)

    def __getobs__(self, b: Index) -> Any:
        b = normalize_index(b, self._n)
        if is_batch_index(b):
            return [self._batch(int(j)) for j in b]
        return self._batch(b)

    def __getobs_into__(self, buffer: Any, b: Index) -> Any:
        b = normalize_index(b, self._n)
        if is_batch_index(b):
            return self.__getobs__(b)
        idx = self.batch_indices(b)
        if self.collate.by_getobs:
            return getobs_into(head(buffer, len(idx)), self.data, idx)
        if self.collate.stacks:
            part = head(buffer, len(idx))
            for k, j in enumerate(idx):
                getobs_into(row(part, k), self.data, int(j))
            return part
        return copy_into(buffer, self._batch(b))

    def __repr__(self) -> str:
        return (
            f"batchview({type(self.data).__name__}, batch_size={self.batch_size}, "
            f"drop_last={self.drop_last}, {self._n} batches)"
        )


def steps(n: int, rows: int, drop_last: bool) -> int:
    """The steps of ``rows`` observations that ``n`` observations make: the last one
    partial, or dropped with ``drop_last``."""
    return n // rows if drop_last else -(-n // rows)


def collate_batch(data: Container, indices: npt.NDArray[np.int64], how: Collate) -> Any:
    """The batch of ``data`` at ``indices`` formed as ``how`` says (see ``batchview``)."""
    if how.by_getobs:
        return getobs(data, indices)
    return how.form([getobs(data, int(j)) for j in indices])


def batchview(
    data: Container,
    batch_size: int | None = None,
    drop_last: bool = False,
    collate: CollateOption = None,
    **unknown: NoReturn,
) -> BatchView:
    """A lazy container whose observations are batches of ``batch_size`` observations of
    ``data``; the last one is partial unless ``drop_last``.

    ``collate`` says how a batch is formed: ``None`` is ``getobs(data, indices)`` (one
    gather for arrays, tensors and tables; for other containers the observations
    collated: arrays and numbers stacked, through tuples and dicts, strings and other
    values as lists), ``True`` stacks every leaf into arrays with a new leading axis,
    ``False`` gives the list of observations, and a callable is applied to that list.
    Raises ``ValueError`` for ``batch_size < 1``, ``TypeError`` for a keyword it does not
    take (MLUtils' ``batchsize=`` and ``partial=`` say what fastload calls them).
    """
    refuse_unknown_keywords("batchview", unknown)
    return BatchView(data, check_size("batch_size", batch_size), drop_last, collate)
