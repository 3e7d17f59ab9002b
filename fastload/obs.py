"""The data-container protocol: ``numobs``, ``getobs`` and ``getobs_into``.

A container is anything with a number of observations that can be indexed by position:
numpy arrays and torch tensors (observations along axis 0), tuples and dicts of
containers (members indexed alike), tables (rows; see ``tables.py``), scipy.sparse CSR
matrices (rows; see ``sparse.py``), lists and any object
with ``__len__`` and ``__getitem__``. A type opts in with ``__numobs__``, ``__getobs__``
and ``__getobs_into__``, or by registering implementations with ``numobs.register``,
``getobs.register`` and ``getobs_into.register``.

An index is an int (one observation) or a 1-D integer array, list, range or slice (several).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import singledispatch
from numbers import Integral
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import numpy.typing as npt

from . import sparse, tables, tensors
from ._base.collate import collate
from ._base.tree import map_tree as map_tree
from ._base.tree import members, rebuild
from ._base.tree import tree_leaves as tree_leaves
from .errors import MisfitError, load_error

if TYPE_CHECKING:
    from typing_extensions import TypeIs

# The user's names. The helpers that other modules of fastload import from here
# (copy_into, exact_dtypes, is_batch_index, normalize_index) are not among them; map_tree
# and tree_leaves live in _base/tree.py and stay importable from here as they were.
__all__ = ["Container", "Index", "getobs", "getobs_into", "numobs"]

# A container (see the module docstring) is duck-typed: any object that numobs accepts.
Container: TypeAlias = Any
# An index: a position, or several (a 1-D integer array, list or range, or a slice).
Index: TypeAlias = slice | npt.ArrayLike


def is_batch_index(i: int | npt.NDArray[np.int64]) -> TypeIs[npt.NDArray[np.int64]]:
    """True when ``i`` selects several observations rather than one."""
    return not isinstance(i, (Integral, np.integer))


def normalize_index(i: Index, n: int) -> int | npt.NDArray[np.int64]:
    """Check ``i`` against ``n`` observations and return it as an int or an int64 array.

    Negative positions count from the end, as in Python. Raises ``IndexError`` naming the
    index and the length, ``TypeError`` for something that is not an index.
    """
    if type(i) is not int:  # an int, the common case, is no bool (a bool's type is bool)
        _refuse_bools(i)
        if not isinstance(i, (Integral, np.integer)):
            return _normalize_positions(i, n)
    j = int(i)
    if not -n <= j < n:
        raise IndexError(f"index {j} is out of range for {n} observations")
    return j + n if j < 0 else j


def _normalize_positions(i: Index, n: int) -> npt.NDArray[np.int64]:
    """``normalize_index`` of a slice, or of several positions."""
    if isinstance(i, slice):
        return np.arange(*i.indices(n), dtype=np.int64)
    idx = np.asarray(i)
    if idx.dtype == bool or idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
        raise TypeError(
            f"an index must be an int or a 1-D array of ints, got {type(i).__name__}"
            f" with dtype {idx.dtype} and shape {idx.shape}"
        )
    idx = idx.astype(np.int64, copy=False)
    if idx.size:
        lo, hi = int(idx.min()), int(idx.max())
        if lo < -n or hi >= n:
            bad = lo if lo < -n else hi
            raise IndexError(f"index {bad} is out of range for {n} observations")
        if lo < 0:
            idx = np.where(idx < 0, idx + n, idx)
    return idx


def _refuse_bools(i: Index) -> None:
    """Raise ``TypeError`` for a bool, or a list or tuple holding one: numpy would make
    ``[1, True]`` the positions ``[1, 1]``, and ``True`` is an ``Integral``."""
    if isinstance(i, (bool, np.bool_)):
        raise TypeError(f"an index must be an int or a 1-D array of ints, not a bool ({i})")
    if isinstance(i, (list, tuple)):
        place = next((k for k, v in enumerate(i) if isinstance(v, (bool, np.bool_))), None)
        if place is not None:
            raise TypeError(
                f"an index must be an int or a 1-D array of ints: it holds the bool "
                f"{i[place]} at place {place}"
            )


@singledispatch
def numobs(data: Container) -> int:
    """The number of observations in ``data``. Raises ``TypeError`` for a non-container."""
    if hasattr(data, "__numobs__"):
        return int(data.__numobs__())
    if tensors.is_tensor(data):
        if data.dim() == 0:
            raise TypeError("a 0-d tensor is not a data container")
        return int(data.shape[0])
    if tables.is_table(data):
        return tables.table_numobs(data)
    if sparse.is_sparse(data):
        return sparse.sparse_numobs(data)
    if hasattr(data, "__len__") and hasattr(data, "__getitem__"):
        return len(data)
    raise TypeError(
        f"{type(data).__name__} is not a data container: it has no "
        f"__numobs__ and no __len__/__getitem__"
    )


@numobs.register
def _(data: np.ndarray) -> int:
    if data.ndim == 0:
        raise TypeError("a 0-d array is not a data container")
    return data.shape[0]


def _numobs_members(data: tuple[Any, ...] | dict[Any, Any]) -> int:
    sizes = {key: numobs(member) for key, member in members(data)}
    if not sizes:
        raise ValueError(f"an empty {type(data).__name__} is not a data container")
    if len(set(sizes.values())) > 1:
        raise ValueError(
            f"the members of a {type(data).__name__} must hold the same number"
            f" of observations, got {sizes}"
        )
    return next(iter(sizes.values()))


numobs.register(tuple, _numobs_members)
numobs.register(dict, _numobs_members)


def getobs(data: Container, i: Index | None = None) -> Any:
    """Observation ``i`` of ``data``, the observations at the positions ``i``, or all of
    them as one batch when ``i`` is None.

    For arrays and tensors several observations come back as one array or tensor (one
    gather); for tuples and dicts as a container of the same kind; for tables as a dict of
    columns; for lists and other sequences collated (``_base/collate.py``: arrays and numbers
    stacked, through tuples and dicts; anything else as a list). Raises ``IndexError``
    naming the index and the length when ``i`` is out of range.

    ``getobs.register(MyType, f)`` (or as a decorator) registers an implementation
    ``f(data, i)`` for containers of ``MyType``.
    """
    return _getobs(data, slice(None) if i is None else i)


@singledispatch
def _getobs(data: Container, i: Index) -> Any:
    if hasattr(data, "__getobs__"):
        return data.__getobs__(normalize_index(i, numobs(data)))
    i = normalize_index(i, numobs(data))
    if tensors.is_tensor(data):
        return tensors.take(data, i)
    if tables.is_table(data):
        return tables.table_getobs(data, i)
    if sparse.is_sparse(data):
        return sparse.sparse_getobs(data, i)
    if is_batch_index(i):
        return collate([_item(data, int(j)) for j in i])
    return _item(data, i)


# getobs is a plain function that registers with _getobs: mypy cannot type attributes set
# on a function.
getobs.register = _getobs.register  # type: ignore[attr-defined]
getobs.dispatch = _getobs.dispatch  # type: ignore[attr-defined]
getobs.registry = _getobs.registry  # type: ignore[attr-defined]


def _item(data: Container, j: int) -> Any:
    """``data[j]``; what the container raises becomes a LoadError naming ``j``."""
    try:
        return data[j]
    except Exception as error:
        raise load_error(j, error) from error


@_getobs.register
def _(data: np.ndarray, i: Index) -> Any:
    i = normalize_index(i, numobs(data))
    return data[i]


def _getobs_members(data: tuple[Any, ...] | dict[Any, Any], i: Index) -> Any:
    i = normalize_index(i, numobs(data))
    return rebuild(data, [getobs(member, i) for _, member in members(data)])


_getobs.register(tuple, _getobs_members)
_getobs.register(dict, _getobs_members)


@singledispatch
def _getobs_into(data: Container, buffer: Any, i: Index) -> Any:
    if hasattr(data, "__getobs_into__"):
        return data.__getobs_into__(buffer, normalize_index(i, numobs(data)))
    if tensors.is_tensor(data):
        view = tensors.numpy_view(data)
        target = tensors.numpy_view(buffer) if tensors.is_tensor(buffer) else buffer
        if view is not None and isinstance(target, np.ndarray):
            getobs_into(target, view, i)  # the gather of arrays, on the same memory
            return buffer
    value = getobs(data, i)
    if sparse.is_sparse(value) and isinstance(buffer, np.ndarray):
        value = value.toarray().reshape(value.shape)  # a dense buffer takes the rows dense
    return copy_into(buffer, value)


def getobs_into(buffer: Any, data: Container, i: Index | None = None) -> Any:
    """Fill ``buffer`` with ``getobs(data, i)`` (all observations when ``i`` is None) and
    return the filled buffer.

    For arrays and tuples/dicts of arrays nothing is allocated. Any other container
    falls back to ``getobs`` plus a copy into the buffer; a list buffer takes a batch of
    values (strings, say) item by item; a buffer of another kind (None, a string) cannot
    be filled in place and ``getobs(data, i)`` is returned instead. Raises ``MisfitError``
    (a ``ValueError``) when the buffer's shape does not fit, or when the observations'
    dtype would lose information in the buffer's (see ``copy_into``).

    ``getobs_into.register(MyType, f)`` (or as a decorator) registers an implementation
    ``f(buffer, data, i)`` for containers of ``MyType``; dispatch is on the container.
    """
    return _getobs_into.dispatch(type(data))(data, buffer, slice(None) if i is None else i)


def _register_into(cls: type, func: Callable[..., Any] | None = None) -> Any:
    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        _getobs_into.register(cls, lambda data, buffer, i: f(buffer, data, i))
        return f

    return decorate if func is None else decorate(func)


getobs_into.register = _register_into  # type: ignore[attr-defined]  # as getobs.register


@_getobs_into.register
def _(data: np.ndarray, buffer: Any, i: Index) -> Any:
    i = normalize_index(i, numobs(data))
    if not isinstance(buffer, np.ndarray):
        view = tensors.numpy_view(buffer) if tensors.is_tensor(buffer) else None
        if view is None:
            return copy_into(buffer, getobs(data, i))  # a list is filled, None is not
        getobs_into(view, data, i)
        return buffer
    expected = (len(i),) + data.shape[1:] if is_batch_index(i) else data.shape[1:]
    if buffer.shape != expected:
        raise MisfitError(
            "shape", f"buffer of shape {buffer.shape} does not fit observations of shape {expected}"
        )
    _check_dtype(data.dtype, buffer.dtype)
    if is_batch_index(i) and data.dtype == buffer.dtype:
        # The range is checked above; mode="clip" lets numpy write straight into `out`
        # where mode="raise" would buffer the whole result first.
        np.take(data, i, axis=0, out=buffer, mode="clip")
    else:  # one observation, or a cast numpy calls safe (which np.take's `out` refuses)
        buffer[...] = data[i]
    return buffer


def _getobs_into_members(data: tuple[Any, ...] | dict[Any, Any], buffer: Any, i: Index) -> Any:
    i = normalize_index(i, numobs(data))
    if not isinstance(buffer, type(data)) or len(buffer) != len(data):
        return copy_into(buffer, getobs(data, i))
    filled = [getobs_into(buffer[key], member, i) for key, member in members(data)]
    if all(f is buffer[key] for f, (key, _) in zip(filled, members(data))):
        return buffer  # every member filled in place: the buffer itself, as given
    return rebuild(data, filled)


_getobs_into.register(tuple, _getobs_into_members)
_getobs_into.register(dict, _getobs_into_members)


_local = threading.local()  # .exact: this thread fills a loader's batch (exact_dtypes)


class exact_dtypes:
    """Within this block, on this thread, ``getobs_into`` and ``copy_into`` take only
    observations of the buffer's own dtype: a loader fills the batch buffers that
    observation 0 declared, and a batch must be what ``np.stack`` of its observations
    gives, so another dtype (even a narrower one) is refused rather than cast."""

    def __enter__(self) -> None:
        self.previous = getattr(_local, "exact", False)
        _local.exact = True

    def __exit__(self, *exc: object) -> None:
        _local.exact = self.previous


def _fits(dtype: np.dtype[Any], buffer_dtype: np.dtype[Any]) -> bool:
    """True when values of ``dtype`` go into a buffer of ``buffer_dtype`` unchanged: a
    cast numpy calls safe (int8 to int16, int32 to float64, bool to int), or a string no
    longer than the buffer's; only the same dtype within ``exact_dtypes``."""
    if getattr(_local, "exact", False):
        return dtype == buffer_dtype
    if dtype.kind in "USV" or buffer_dtype.kind in "USV":
        return dtype.kind == buffer_dtype.kind and dtype.itemsize <= buffer_dtype.itemsize
    return np.can_cast(dtype, buffer_dtype, "safe")


def _check_dtype(dtype: np.dtype[Any], buffer_dtype: np.dtype[Any]) -> None:
    if not _fits(dtype, buffer_dtype):
        raise MisfitError(
            "dtype", f"buffer of dtype {buffer_dtype} does not fit an observation of dtype {dtype}"
        )


def _copy_array(buffer: npt.NDArray[Any], value: Any) -> npt.NDArray[Any]:
    """``copy_into`` for an array ``buffer``."""
    if type(value) is not np.ndarray:
        if tensors.is_tensor(value):
            value = value.detach().cpu().numpy()
        value = np.asarray(value)
    if value.shape != buffer.shape:
        raise MisfitError(
            "shape",
            f"buffer of shape {buffer.shape} does not fit an observation of shape {value.shape}",
        )
    if value.dtype != buffer.dtype:
        _check_dtype(value.dtype, buffer.dtype)
    buffer[...] = value
    return buffer


def copy_into(buffer: Any, value: Any) -> Any:
    """Copy ``value`` into ``buffer`` (an array; a list, which takes a list or 1-D array
    of values whatever its length; or a tuple/dict of them) and return the filled buffer;
    a buffer of any other kind cannot be filled and ``value`` is returned.
    Raises ``MisfitError`` (a ``ValueError``) when the value's shape differs, or when its
    dtype would lose information in the buffer's (a float into an int buffer, int64 into
    int32, float64 into float32, a longer string)."""
    if isinstance(buffer, np.ndarray):  # the common case first: a row of a batch's buffer
        return _copy_array(buffer, value)
    if tensors.is_tensor(buffer) and tensors.numpy_view(buffer) is not None:
        copy_into(tensors.numpy_view(buffer), value)
        return buffer
    if isinstance(buffer, list) and isinstance(value, (list, np.ndarray)) and np.ndim(value) == 1:
        # A list takes the values in place, resized to hold them as a list would be.
        buffer[:] = value.tolist() if isinstance(value, np.ndarray) else value
        return buffer
    if isinstance(buffer, (tuple, dict)) and isinstance(value, (tuple, dict)):
        if len(buffer) != len(value):
            raise MisfitError(
                "members",
                f"buffer with {len(buffer)} members does not fit an observation with {len(value)}",
            )
        if isinstance(buffer, dict) and (
            not isinstance(value, dict) or buffer.keys() != value.keys()
        ):
            keys = list(value) if isinstance(value, dict) else "positions"
            raise MisfitError(
                "members",
                f"buffer with members {list(buffer)} does not fit an observation with {keys}",
            )
        if type(buffer) is tuple and type(value) is tuple:  # as rebuild makes it, sooner
            return tuple([copy_into(member, part) for member, part in zip(buffer, value)])
        return rebuild(buffer, [copy_into(buffer[key], value[key]) for key, _ in members(buffer)])
    return value
