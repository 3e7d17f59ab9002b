"""Subsets of a container, after MLUtils: splits, folds, chunks, filters, groups and
resampling.

Every subset is an ``obsview`` (positions into the container), so subsets compose with the
other views and a loader folds them into its order: over arrays they still load natively.
Random ones draw from ``seed=`` alone (``randomness.generator``), never from global state.

Labels (``classes=``, ``stratified=``) are a container with one label per observation (an
array, a list, a pandas Series, a tuple member...); groups keep the order in which their
label first appears.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from numbers import Integral, Real
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt

from ._base.arguments import is_size
from ._base.keywords import refuse_unknown_keywords
from ._base.randomness import Purpose, generator
from .obs import Container, getobs, numobs
from .views import ObsView

__all__ = [
    "chunk",
    "filterobs",
    "group_counts",
    "groupobs",
    "kfolds",
    "leavepout",
    "oversample",
    "splitobs",
    "timeseries_kfolds",
    "undersample",
]


def _positions(data: Container | int) -> tuple[Container, bool]:
    """(the container, whether ``data`` was a number of observations): an int ``n``
    stands for the positions ``0..n-1``, and its subsets come back as positions."""
    if is_size(data):
        if data < 0:
            raise ValueError(f"a number of observations must be >= 0, got {data}")
        return np.arange(int(data), dtype=np.int64), True
    return data, False


def _as_positions(view: ObsView) -> range | npt.NDArray[np.int64]:
    """The positions a subset of ``0..n-1`` holds: a range when they are consecutive."""
    idx = view.indices
    if len(idx) and np.array_equal(idx, np.arange(idx[0], idx[0] + len(idx))):
        return range(int(idx[0]), int(idx[0]) + len(idx))
    return idx if len(idx) else range(0)


def _hashable(x: Any) -> Hashable:
    """``x`` as a value a dict can be keyed by: numpy scalars as Python scalars, arrays and
    lists as tuples."""
    if isinstance(x, np.ndarray):
        x = x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (list, tuple)):
        return tuple(_hashable(v) for v in x)
    return x


def _label_values(labels: Container, n: int | None = None) -> list[Hashable]:
    """The labels of ``labels`` (a container) as a list of hashable values; ``n``, when
    given, is the number of observations they must label."""
    count = numobs(labels)
    if n is not None and count != n:
        raise ValueError(f"the labels hold {count} values for {n} observations")
    values = getobs(labels)
    if hasattr(values, "detach"):  # a tensor
        values = values.detach().cpu().numpy()
    return [_hashable(v) for v in (values.tolist() if isinstance(values, np.ndarray) else values)]


def _groups(values: Iterable[Hashable]) -> dict[Hashable, npt.NDArray[np.int64]]:
    """``{label: int64 positions}``, in the order labels first appear."""
    groups: dict[Hashable, list[int]] = {}
    for position, value in enumerate(values):
        groups.setdefault(value, []).append(position)
    return {label: np.asarray(p, np.int64) for label, p in groups.items()}


def group_counts(x: Container) -> dict[Hashable, int]:
    """``{value: count}`` of the observations of ``x`` (a container), in the order values
    first appear.

    >>> group_counts(["a", "b", "b"])
    {'a': 1, 'b': 2}
    """
    return {label: len(p) for label, p in _groups(_label_values(x)).items()}


def filterobs(f: Callable[[Any], object], data: Container) -> ObsView:
    """A view of the observations ``x`` of ``data`` for which ``f(x)`` is true. ``f`` is
    called on every observation once, here."""
    keep = [i for i in range(numobs(data)) if f(getobs(data, i))]
    return ObsView(data, np.asarray(keep, np.int64))


def groupobs(f: Callable[[Any], Hashable], data: Container) -> dict[Hashable, ObsView]:
    """``{f(x): view}``: the observations of ``data`` grouped by the value of ``f`` on them
    (numpy scalars as Python scalars), groups in the order they first appear."""
    keys = [_hashable(f(getobs(data, i))) for i in range(numobs(data))]
    return {key: ObsView(data, positions) for key, positions in _groups(keys).items()}


def _parts(at: float | Sequence[float], n: int) -> tuple[float, ...]:
    """``at`` as a tuple of fractions or of counts; raises ``ValueError`` otherwise."""
    parts = tuple(at) if isinstance(at, (tuple, list)) else (at,)
    counts = all(isinstance(p, Integral) and not isinstance(p, bool) for p in parts)
    fractions = all(isinstance(p, Real) and not isinstance(p, (bool, Integral)) for p in parts)
    if parts and counts and all(p >= 0 for p in parts) and sum(parts) <= n:
        return parts
    if parts and fractions and all(0 <= p <= 1 for p in parts) and sum(parts) <= 1 + 1e-9:
        return tuple(float(p) for p in parts)
    raise ValueError(
        f"splitobs needs at: a fraction in [0, 1], a count of observations in "
        f"[0, {n}], or a non-empty tuple of either (fractions summing to at "
        f"most 1, counts to at most {n}), got {at!r}"
    )


def _split_sizes(n: int, parts: Sequence[float]) -> list[int]:
    """The sizes of the ``len(parts) + 1`` subsets of ``n`` observations. Counts are taken
    as they are; fractions are rounded as MLUtils does: the first subset has
    ``round(at[0] * n)`` observations (half to even), and the remaining fractions apply,
    rescaled, to what is left."""
    if isinstance(parts[0], Integral):
        return list(parts) + [n - sum(parts)]
    sizes, fractions = [], list(parts)
    while fractions:
        first = min(max(round(fractions[0] * n), 0), n)
        sizes.append(first)
        rest = n - first
        fractions = [f * n / rest if rest else 0.0 for f in fractions[1:]]
        n = rest
    return sizes + [n]


def splitobs(
    data: Container | int,
    at: float | Sequence[float] = 0.8,
    shuffle: bool = False,
    seed: int | None = None,
    *,
    stratified: Container | None = None,
    **unknown: NoReturn,
) -> tuple[Any, ...]:
    """Split ``data`` into ``len(at) + 1`` consecutive views (two for a single ``at``).

    ``at`` is a fraction (the share of the first view), an int (its number of
    observations) or a tuple of either, one per view but the last, which holds the rest.
    Fractions round as in MLUtils (``splitobs`` of 15 observations at ``(0.2, 0.3)`` gives
    3, 4 and 8). With ``shuffle=True`` the observations are permuted first (``seed``).
    ``stratified=labels`` splits each label's observations alike, so every view keeps the
    label proportions; each view keeps the order of the data. Raises ``ValueError`` for
    a bad ``at``. For an int ``data`` (a number of observations, as in MLUtils) the
    subsets are positions: ranges (index arrays once shuffled or stratified).

    >>> train, test = splitobs(np.arange(10), at=0.8)
    >>> numobs(train), numobs(test)
    (8, 2)
    >>> splitobs(10, at=0.7)
    (range(0, 7), range(7, 10))
    """
    refuse_unknown_keywords("splitobs", unknown)
    data, positions = _positions(data)
    views = _split(data, at, shuffle, seed, stratified)
    if positions:
        return tuple(_as_positions(v) for v in views)
    return views


def _order(n: int, shuffle: bool, seed: int | None) -> npt.NDArray[np.int64]:
    """The positions a split or folds cut: shuffled as ``shuffleobs`` shuffles, or in order."""
    if shuffle:
        return generator(seed, Purpose.VIEW_ORDER).permutation(n)
    return np.arange(n, dtype=np.int64)


def _split(
    data: Container,
    at: float | Sequence[float],
    shuffle: bool,
    seed: int | None,
    stratified: Container | None,
) -> tuple[ObsView, ...]:
    n = numobs(data)
    parts = _parts(at, n)
    order = _order(n, shuffle, seed)
    if stratified is None:
        bounds = np.cumsum([0] + _split_sizes(n, parts))
        return tuple(ObsView(data, order[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:]))
    labels = _label_values(stratified, n)
    fractions = tuple(p / n for p in parts) if isinstance(parts[0], Integral) and n else parts
    pieces: list[list[npt.NDArray[np.int64]]] = [[] for _ in range(len(parts) + 1)]
    for positions in _groups([labels[j] for j in order]).values():
        bounds = np.cumsum([0] + _split_sizes(len(positions), fractions))
        for piece, lo, hi in zip(pieces, bounds[:-1], bounds[1:]):
            piece.append(positions[lo:hi])
    return tuple(ObsView(data, order[_sorted_union(piece)]) for piece in pieces)


def _sorted_union(arrays: Sequence[npt.NDArray[np.int64]]) -> npt.NDArray[np.int64]:
    """The positions of ``arrays`` (disjoint int64 arrays) in increasing order."""
    return np.sort(np.concatenate(arrays)) if arrays else np.zeros(0, np.int64)


def _fold_bounds(n: int, k: int) -> npt.NDArray[np.int64]:
    """Bounds of ``k`` consecutive folds of ``n``: the first ``n % k`` one larger."""
    sizes = [n // k + 1] * (n % k) + [n // k] * (k - n % k)
    return np.cumsum([0] + sizes)


def kfolds(
    data: Container | int,
    k: int = 5,
    *,
    shuffle: bool = False,
    seed: int | None = None,
    stratified: Container | None = None,
    **unknown: NoReturn,
) -> list[tuple[Any, Any]]:
    """``k`` pairs ``(train, validation)`` of views: fold ``j`` validates on the j-th of
    ``k`` consecutive parts (the first ``n % k`` one observation larger) and trains on the
    rest, in the order of the data. ``shuffle=True`` permutes the observations first
    (``seed``); ``stratified=labels`` makes the folds of each label separately, so every
    validation view keeps the label proportions (each label needs ``k`` observations).
    For an int ``data`` (a number of observations) the pairs hold positions. Raises
    ``ValueError`` unless ``2 <= k <= numobs(data)``."""
    refuse_unknown_keywords("kfolds", unknown)
    data, positions = _positions(data)
    folds = _folds(data, k, shuffle, seed, stratified)
    if positions:
        return [(_as_positions(train), _as_positions(check)) for train, check in folds]
    return folds


def _folds(
    data: Container, k: int, shuffle: bool, seed: int | None, stratified: Container | None
) -> list[tuple[ObsView, ObsView]]:
    n = numobs(data)
    if not isinstance(k, Integral) or isinstance(k, bool) or not 2 <= k <= n:
        raise ValueError(f"kfolds needs 2 <= k <= {n} (the number of observations), got {k!r}")
    order = _order(n, shuffle, seed)
    if stratified is None:
        bounds = _fold_bounds(n, k)
        validations = [np.arange(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])]
    else:
        labels = _label_values(stratified, n)
        validations = [[] for _ in range(k)]
        for label, positions in _groups([labels[j] for j in order]).items():
            if len(positions) < k:
                raise ValueError(
                    f"stratified kfolds needs k={k} observations of each "
                    f"label; label {label!r} has {len(positions)}"
                )
            bounds = _fold_bounds(len(positions), k)
            for fold, lo, hi in zip(validations, bounds[:-1], bounds[1:]):
                fold.append(positions[lo:hi])
        validations = [_sorted_union(fold) for fold in validations]
    everything = np.arange(n)
    return [
        (ObsView(data, order[np.setdiff1d(everything, v)]), ObsView(data, order[v]))
        for v in validations
    ]


def leavepout(data: Container | int, p: int = 1) -> list[tuple[Any, Any]]:
    """``kfolds(data, numobs(data) // p)``: folds whose validation views hold ``p``
    observations (a few ``p + 1`` when ``p`` does not divide the number). ``p=1`` is
    leave-one-out; an int ``data`` gives positions. Raises ``ValueError`` unless
    ``1 <= p <= numobs(data) // 2``."""
    n = data if is_size(data) else numobs(data)
    if not isinstance(p, Integral) or isinstance(p, bool) or not 1 <= p <= n // 2:
        raise ValueError(f"leavepout needs 1 <= p <= {n // 2} (half the observations), got {p!r}")
    return kfolds(data, n // p)


def timeseries_kfolds(
    data: Container | int,
    k: int = 5,
    *,
    test_size: int | None = None,
    gap: int = 0,
    max_train_size: int | None = None,
) -> list[tuple[Any, Any]]:
    """``k`` pairs ``(train, validation)`` for ordered data (a time series): validation
    ``j`` is the j-th of the last ``k`` blocks of ``test_size`` observations
    (``n // (k + 1)`` by default) and training is everything before it, so the training
    windows grow and never look ahead. ``gap`` observations are left out between the two
    (against leakage from overlapping windows); ``max_train_size`` keeps only the latest
    ones. Views in the order of the data; positions (ranges) for an int ``data``. Raises
    ``ValueError`` when the first training window would be empty.

    >>> [(list(train), list(check)) for train, check in timeseries_kfolds(6, 2)]
    [([0, 1], [2, 3]), ([0, 1, 2, 3], [4, 5])]
    """
    data, positions = _positions(data)
    n = numobs(data)
    if not is_size(k) or k < 1:
        raise ValueError(f"timeseries_kfolds needs an int k >= 1, got {k!r}")
    size = n // (k + 1) if test_size is None else test_size
    if not is_size(size) or size < 1 or not is_size(gap) or gap < 0:
        raise ValueError(
            f"timeseries_kfolds needs test_size >= 1 and gap >= 0 (ints), got "
            f"test_size={size!r} (of {n} observations), gap={gap!r}"
        )
    if max_train_size is not None and (not is_size(max_train_size) or max_train_size < 1):
        raise ValueError(f"max_train_size must be an int >= 1 or None, got {max_train_size!r}")
    first = n - k * size
    if first - gap < 1:
        raise ValueError(
            f"timeseries_kfolds of {n} observations into k={k} blocks of {size} with a gap "
            f"of {gap} leaves no observation to train the first fold on"
        )
    folds = []
    for start in range(first, n, size):
        end = start - gap
        begin = 0 if max_train_size is None else max(0, end - max_train_size)
        folds.append(
            (ObsView(data, np.arange(begin, end)), ObsView(data, np.arange(start, start + size)))
        )
    if positions:
        return [(_as_positions(train), _as_positions(check)) for train, check in folds]
    return folds


def chunk(
    data: Container, n: int | None = None, *, size: int | Sequence[int] | None = None
) -> list[ObsView]:
    """Consecutive views of ``data``: ``n`` parts of ``ceil(numobs / n)`` observations
    (the last one smaller, and fewer parts when they run out, as in MLUtils), parts of
    ``size`` observations, or parts of the sizes in the sequence ``size`` (summing to
    ``numobs(data)``). Raises ``ValueError`` for anything else.

    >>> [getobs(part).tolist() for part in chunk(np.arange(1, 11), 3)]
    [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]
    """
    total = numobs(data)
    if (n is None) == (size is None):
        raise ValueError("chunk needs either a number of parts n or a size")
    if n is not None:
        if not isinstance(n, Integral) or isinstance(n, bool) or n < 1:
            raise ValueError(f"chunk needs a positive number of parts, got {n!r}")
        size = -(-total // n)
    if isinstance(size, Integral) and not isinstance(size, bool):
        if size < 1:
            raise ValueError(f"chunk needs a positive size, got {size!r}")
        sizes = [min(size, total - start) for start in range(0, total, size)]
    else:
        # A sequence: not None (checked above), not an int (mypy's int is no Integral).
        sizes = list(size)  # type: ignore[arg-type]
        if any(not isinstance(s, Integral) or s < 0 for s in sizes) or sum(sizes) != total:
            raise ValueError(f"chunk sizes must be counts summing to {total}, got {size!r}")
    bounds = np.cumsum([0] + sizes)
    return [ObsView(data, np.arange(lo, hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]


def _last_member(data: Container) -> Container | None:
    """The last member of a tuple container, through ``obsview``s of it; else None."""
    if isinstance(data, tuple):
        return data[-1]
    if isinstance(data, ObsView):
        inner = _last_member(data.data)
        return None if inner is None else ObsView(inner, data.indices)
    return None


def _classes(
    data: Container, classes: Container | None, name: str
) -> dict[Hashable, npt.NDArray[np.int64]]:
    """``{label: positions}`` of ``classes``, or of the labels ``data`` carries last."""
    if classes is None:
        classes = _last_member(data)
        if classes is None:
            raise ValueError(
                f"{name} needs classes=, or a tuple of containers (or a view of "
                f"one) whose last holds the labels"
            )
    return _groups(_label_values(classes, numobs(data)))


def oversample(
    data: Container,
    classes: Container | None = None,
    *,
    fraction: float = 1,
    shuffle: bool = True,
    seed: int | None = None,
    **unknown: NoReturn,
) -> ObsView:
    """A view of ``data`` in which every class has at least ``round(fraction * m)``
    observations, ``m`` being the size of the largest class: a smaller class is repeated
    whole as often as fits, then topped up with a random sample of it without
    replacement. ``classes`` holds a label per observation; without it, ``data`` is a
    tuple (or a view of one) whose last member holds them. Unshuffled, the added
    observations follow the original ones, class by class. Raises ``ValueError`` without
    labels."""
    refuse_unknown_keywords("oversample", unknown)
    groups = _classes(data, classes, "oversample")
    draw = generator(seed, Purpose.RESAMPLING)
    target = round(fraction * max((len(g) for g in groups.values()), default=0))
    indices = [np.arange(numobs(data), dtype=np.int64)]
    for positions in groups.values():
        needed = target - len(positions)
        while needed > len(positions):
            indices.append(positions)
            needed -= len(positions)
        if needed > 0:
            indices.append(draw.choice(positions, needed, replace=False))
    indices = np.concatenate(indices)
    return ObsView(data, draw.permutation(indices) if shuffle else indices)


def undersample(
    data: Container,
    classes: Container | None = None,
    *,
    shuffle: bool = True,
    seed: int | None = None,
    **unknown: NoReturn,
) -> ObsView:
    """A view of ``data`` with as many observations of every class as the smallest class
    has, drawn at random without replacement. ``classes`` as for ``oversample``.
    Unshuffled, the observations keep their order in ``data``."""
    refuse_unknown_keywords("undersample", unknown)
    groups = _classes(data, classes, "undersample")
    draw = generator(seed, Purpose.RESAMPLING)
    smallest = min((len(g) for g in groups.values()), default=0)
    kept = [draw.choice(positions, smallest, replace=False) for positions in groups.values()]
    indices = _sorted_union(kept)
    return ObsView(data, draw.permutation(indices) if shuffle else indices)
