"""Tables as containers of rows: pandas, pyarrow and Hugging Face ``datasets``.

A table's observations are its rows, as a Tables.jl table's are in MLUtils:
``getobs(table, i)`` is a dict of the row's values (``{column: value}``), several rows a
dict of column batches. A column (pandas ``Series``, pyarrow ``ChunkedArray`` or
``Array``) is a container of its values. The position is what counts: a pandas index is
not used.

Each column converts by its type, never silently losing information:

- numbers, booleans, dates, datetimes and durations: a numpy array (for pyarrow, a view of
  the Arrow buffer when the column is one chunk without nulls; for pandas, of its numpy
  values); Arrow fixed-size lists of numbers: an array of shape ``(rows, size, ...)``;
- strings, bytes, variable-size lists, structs, maps, decimals, times of day and Python
  objects: a list of Python values;
- missing values: NaN in float columns, NaT in date and time columns, None in lists (a
  missing string or object is None from pandas, whether it held NaN or NA, as from
  pyarrow); an integer or boolean column with missing values raises ``ValueError``
  naming it (numpy has no missing integer: fill them first);
- anything else (an extension type, a time zone numpy would drop, an interval or a
  sparse pandas column) raises ``TypeError`` naming the column and its type.

The engine loads a table as the dict of those columns (``columns(table)``): its numpy
columns gather natively. A ``datasets.Dataset`` is read through its Arrow data (the
columns of its format) and its format is kept: with none (or "python", "arrow") its
columns convert as above; the "numpy" and "torch" formats give, for their columns,
integers as int64 and floats as float32 (or their ``dtype=``), as arrays or tensors, and
lists of numbers as arrays where every row of the dataset has the same shape; any other
format (or format keyword) raises ``TypeError``. One whose format has a transform
(``set_transform``) is read row by row through ``__getitem__`` instead, like any sequence.

None of these libraries is imported by ``import fastload``: a table is recognised by the
module and name of its type, and the library is imported where one is met.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["columns", "is_table", "table_getobs", "table_numobs"]

_KINDS = {
    ("pandas", "DataFrame"): "pandas",
    ("pandas", "Series"): "pandas-column",
    ("pyarrow", "Table"): "arrow",
    ("pyarrow", "RecordBatch"): "arrow",
    ("pyarrow", "ChunkedArray"): "arrow-column",
    ("pyarrow", "Array"): "arrow-column",
    ("datasets", "Dataset"): "datasets",
}
_kind_of_type: dict[type, str | None] = {}
# (id(table), what) -> (weak reference, key, value) for what is computed once per table
# that does not change in place (its columns; a dataset's list shapes); the entry goes when
# the table does (pyarrow objects cannot be dict keys).
_remembered: dict[tuple[int, str], tuple[weakref.ref[Any], Any, Any]] = {}
# A datasets.Dataset's format type (and its aliases) -> how fastload reads it: "python"
# (fastload's own conversion, as for a pyarrow Table), "numpy" or "torch" (as the format
# gives them: int64 and float32 arrays or tensors, lists of one length as arrays).
_DATASETS_FORMATS = {
    None: "python",
    "python": "python",
    "arrow": "python",
    "pa": "python",
    "pyarrow": "python",
    "numpy": "numpy",
    "np": "numpy",
    "torch": "torch",
    "pt": "torch",
    "pytorch": "torch",
}


def _kind(data: Any) -> str | None:
    """ "pandas", "pandas-column", "arrow", "arrow-column", "datasets" or None."""
    cls = type(data)
    kind: Any = _kind_of_type.get(cls, False)  # False: a type not looked up yet
    if kind is False:
        kind = next(
            (
                _KINDS[c.__module__.split(".")[0], c.__name__]
                for c in cls.__mro__
                if (c.__module__.split(".")[0], c.__name__) in _KINDS
            ),
            None,
        )
        _kind_of_type[cls] = kind
    if kind == "datasets" and data.format.get("type") == "custom":
        return None  # a transform only __getitem__ applies: read it as a sequence
    return kind


def is_table(data: object) -> bool:
    """True for a table or a column of one of the supported libraries."""
    return _kind(data) is not None


def table_numobs(data: Any) -> int:
    """The rows of a table, or the values of a column."""
    return data.num_rows if _kind(data) == "arrow" else len(data)


def columns(data: Any) -> Any:
    """A table as a dict ``{name: numpy array or list}`` of its whole columns, or a column
    as one array or list (converted as the module docstring says). Raises ``TypeError``
    or ``ValueError`` naming a column that cannot convert."""
    kind = _kind(data)
    if kind in ("pandas", "pandas-column"):
        return _convert(data, kind, None)  # mutable: converted each time (views mostly)
    key = _format_key(data) if kind == "datasets" else None
    return _remember(data, "columns", key, lambda: _convert(data, kind, None))


def _remember(data: Any, what: str, key: Any, compute: Callable[[], Any]) -> Any:
    """``compute()``, computed once for ``data`` while ``key`` stays the same."""
    slot = (id(data), what)
    cached = _remembered.get(slot)
    if cached is not None and cached[0]() is data and cached[1] == key:
        return cached[2]
    value = compute()
    _remembered[slot] = (weakref.ref(data, _forget(slot)), key, value)
    return value


def _forget(slot: tuple[int, str]) -> Callable[[object], object]:
    """The callback that drops the entry ``slot`` of ``_remembered`` when its table goes."""
    return lambda _: _remembered.pop(slot, None)


def table_getobs(data: Any, i: int | npt.NDArray[np.int64]) -> Any:
    """Row ``i`` (an int) as a dict of values, or rows ``i`` (an int64 array) as a dict of
    column batches; for a column, one value or a batch. ``i`` is already checked."""
    kind = _kind(data)
    positions = np.array([i], np.int64) if isinstance(i, int) else i
    values = _convert(data, kind, positions)
    if not isinstance(i, int):
        return values
    if isinstance(values, dict):
        return {name: column[0] for name, column in values.items()}
    return values[0]


def _convert(data: Any, kind: str | None, positions: npt.NDArray[np.int64] | None) -> Any:
    """The columns of ``data`` (all rows, or those at ``positions``), converted."""
    if kind == "pandas":
        _check_names(list(data.columns))
        return {
            name: _pandas_values(data.iloc[:, k], name, positions)
            for k, name in enumerate(data.columns)
        }
    if kind == "pandas-column":
        return _pandas_values(data, data.name, positions)
    if kind == "datasets":
        return _datasets_values(data, positions)
    if kind == "arrow-column":
        return _arrow_values(data, None, positions)
    names = data.schema.names
    _check_names(names)
    return {name: _arrow_values(data.column(k), name, positions) for k, name in enumerate(names)}


def _check_names(names: Iterable[str]) -> None:
    seen = set()
    for name in names:
        if name in seen:
            raise ValueError(
                f"the table has two columns named {name!r}: its rows cannot be dicts; rename one"
            )
        seen.add(name)


def _format_key(dataset: Any) -> tuple[str, ...]:
    """What a ``datasets.Dataset``'s columns depend on that can change in place
    (``set_format``)."""
    fmt = dataset.format
    return (
        repr(fmt.get("type")),
        repr(fmt.get("format_kwargs")),
        repr(fmt.get("columns")),
        repr(bool(fmt.get("output_all_columns"))),
        repr(len(dataset)),
    )


def _datasets_rows(dataset: Any, rows: Any, names: list[str] | None = None) -> Any:
    """The ``rows`` (a slice, or an int64 array of positions) of a ``datasets.Dataset`` as
    a pyarrow Table with the columns of its format (or ``names``)."""
    if names is None:
        fmt = dataset.format
        # In the "arrow" format, output_all_columns is refused: the columns are named.
        names = list(dataset.column_names) if fmt.get("output_all_columns") else fmt["columns"]
    table = dataset.with_format("arrow", columns=names)
    return table[rows.tolist() if isinstance(rows, np.ndarray) else rows]


def _datasets_values(dataset: Any, positions: npt.NDArray[np.int64] | None) -> dict[str, Any]:
    """The columns of a ``datasets.Dataset`` (all rows, or those at ``positions``) as its
    format gives them: fastload's conversion, then for the columns a "numpy" or "torch"
    format names, numbers as int64 or float32 arrays (or tensors) and lists of numbers of
    one length throughout the dataset as arrays ``(rows, length, ...)``."""
    style, dtype = _datasets_format(dataset.format)
    table = _datasets_rows(dataset, slice(None) if positions is None else positions)
    names = table.schema.names
    _check_names(names)
    formatted = set(dataset.format.get("columns") or names) if style != "python" else set()
    shapes = _list_shapes(dataset, formatted) if formatted else {}
    values: dict[str, Any] = {}
    for k, name in enumerate(names):
        shape = shapes.get(name)
        column = table.column(k)
        value = _nested_array(column, shape) if shape is not None else _arrow_values(column, name)
        values[name] = _formatted(value, style, dtype, name) if name in formatted else value
    return values


def _datasets_format(fmt: dict[str, Any]) -> tuple[str, Any]:
    """How fastload reads a dataset of format ``fmt`` ("python", "numpy" or "torch") and
    the ``dtype`` of its ``format_kwargs`` (None when not given). Raises ``TypeError`` for a
    format, or a format keyword, that fastload cannot give as the dataset would."""
    style = _DATASETS_FORMATS.get(fmt.get("type"))
    if style is None:
        raise TypeError(
            f"a datasets.Dataset in the {fmt.get('type')!r} format: fastload gives its rows "
            f"as numpy arrays or torch tensors (with_format('numpy') or 'torch'); use one of "
            f"those (fastload.jax puts batches on JAX devices), or set_transform to make "
            f"the rows yourself"
        )
    kwargs = dict(fmt.get("format_kwargs") or {})
    dtype = kwargs.pop("dtype", None)
    if kwargs or (dtype is not None and style == "python"):
        extra = kwargs or {"dtype": dtype}
        raise TypeError(
            f"a datasets.Dataset in the {fmt.get('type')!r} format with format_kwargs "
            f"{extra!r}: fastload applies only dtype=, of the 'numpy' and 'torch' formats; "
            f"cast the columns first (Dataset.cast) or use set_transform"
        )
    return style, dtype


def _list_shapes(dataset: Any, names: set[str]) -> dict[str, tuple[int, ...] | None]:
    """The shape every row has in each list column of numbers among ``names`` (None for
    a column of lists of several lengths, or with a missing value), decided over the
    whole dataset so that every batch of a column is alike; computed once per dataset."""

    def compute() -> dict[str, tuple[int, ...] | None]:
        import pyarrow as pa

        schema = _datasets_rows(dataset, slice(0, 0)).schema
        lists = [
            field.name
            for field in schema
            if field.name in names
            and (pa.types.is_list(field.type) or pa.types.is_large_list(field.type))
        ]
        if not lists:
            return {}
        table = _datasets_rows(dataset, slice(None), lists)
        return {name: _uniform_shape(table.column(name)) for name in lists}

    shapes: dict[str, tuple[int, ...] | None] = _remember(
        dataset, "list shapes", _format_key(dataset), compute
    )
    return shapes


def _uniform_shape(column: Any) -> tuple[int, ...] | None:
    """The shape of every row of a pyarrow column of (lists of) numbers, or None when the
    rows differ in length, something is missing, or the values are no numbers."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t, typ = pa.types, column.type
    if column.null_count:
        return None
    if t.is_integer(typ) or t.is_floating(typ) or t.is_boolean(typ):
        return ()
    if t.is_fixed_size_list(typ):
        size = typ.list_size
    elif (t.is_list(typ) or t.is_large_list(typ)) and len(column):
        bounds = pc.min_max(pc.list_value_length(column))
        size = bounds["min"].as_py()
        if size != bounds["max"].as_py():
            return None
    else:
        return None
    inner = _uniform_shape(pc.list_flatten(column))
    return None if inner is None else (size, *inner)


def _nested_array(column: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A pyarrow column whose every row is (lists of) numbers of ``shape``, as an array
    ``(rows, *shape)``."""
    array = _take(column, None)
    flat = array
    for _ in shape:
        flat = flat.flatten()
    return flat.to_numpy(zero_copy_only=False).reshape((len(array), *shape))


def _formatted(values: Any, style: str, dtype: Any, name: str) -> Any:
    """A converted column as the dataset's "numpy" or "torch" format gives it: integers
    as int64 and floats as float32 (or ``dtype``), booleans as they are, as arrays or
    tensors; lists (strings, objects, lists of several lengths) stay lists."""
    if not isinstance(values, np.ndarray):
        return values
    kind = values.dtype.kind
    if kind in "iuf":
        target = np.int64 if kind in "iu" else np.float32
        values = values.astype(dtype if dtype is not None and style == "numpy" else target)
    if style == "numpy":
        return values
    import torch

    if kind in "mM":
        raise TypeError(
            f"{_label(name)} has type {values.dtype}, which has no torch tensor: leave it "
            f"out of the format's columns (with_format('torch', columns=[...]))"
        )
    tensor = torch.from_numpy(values if values.flags.writeable else values.copy())
    return tensor if dtype is None or kind not in "iuf" else tensor.to(dtype)


def _label(name: str | None) -> str:
    return "the column" if name is None else f"column {name!r}"


def _missing(name: str | None, count: int) -> ValueError:
    return ValueError(
        f"{_label(name)} has {count} missing value(s), which an integer or "
        f"boolean numpy array cannot hold: fill them first (pandas: fillna; "
        f"pyarrow: pyarrow.compute.fill_null) or make the column float"
    )


def _unsupported(name: str | None, dtype: object, why: str = "numpy has no such type") -> TypeError:
    return TypeError(
        f"{_label(name)} has type {dtype}, which fastload does not convert "
        f"({why}); convert the column first"
    )


# pyarrow ------------------------------------------------------------------------------


def _take(column: Any, positions: npt.NDArray[np.int64] | None) -> Any:
    """The rows of a pyarrow column at ``positions`` (all when None), as one Array."""
    if positions is not None:
        column = column.take(positions)
    if hasattr(column, "num_chunks"):
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column


def _arrow_kind(typ: Any, name: str | None) -> str:
    """How a pyarrow column of type ``typ`` converts: "exact" (numpy, no missing values
    allowed), "numpy" (numpy, missing values as NaN or NaT), "fixed" (fixed-size lists)
    or "list". Raises ``TypeError`` for a type that does not convert."""
    import pyarrow as pa

    t = pa.types
    if t.is_dictionary(typ):
        return _arrow_kind(typ.value_type, name)
    if isinstance(typ, pa.BaseExtensionType):
        raise _unsupported(name, typ, "an extension type")
    if t.is_integer(typ) or t.is_boolean(typ):
        return "exact"
    if t.is_timestamp(typ) and typ.tz is not None:
        raise _unsupported(name, typ, "its time zone would be lost in numpy")
    if t.is_floating(typ) or t.is_timestamp(typ) or t.is_date(typ) or t.is_duration(typ):
        return "numpy"
    if t.is_fixed_size_list(typ):
        return "fixed"
    if (
        t.is_string(typ)
        or t.is_large_string(typ)
        or t.is_binary(typ)
        or t.is_large_binary(typ)
        or t.is_fixed_size_binary(typ)
        or t.is_list(typ)
        or t.is_large_list(typ)
        or t.is_struct(typ)
        or t.is_map(typ)
        or t.is_decimal(typ)
        or t.is_time(typ)
        or t.is_null(typ)
        or _is_view(t, typ)
    ):
        return "list"
    raise _unsupported(name, typ)


def _arrow_values(
    column: Any, name: str | None, positions: npt.NDArray[np.int64] | None = None
) -> np.ndarray | list[Any]:
    """A pyarrow column (an Array or ChunkedArray; its rows at ``positions``, all when
    None) as a numpy array or a list (see the module docstring)."""
    kind = _arrow_kind(column.type, name)
    array = _take(column, positions)
    if hasattr(array, "dictionary_decode"):
        array = array.dictionary_decode()
    if kind == "exact" and array.null_count:
        raise _missing(name, array.null_count)
    if kind in ("exact", "numpy"):
        return array.to_numpy(zero_copy_only=False)
    if kind == "fixed":
        values = _fixed_size_values(array, name)
        if values is not None:
            return values
    return array.to_pylist()


def _is_view(t: ModuleType, typ: Any) -> bool:
    """True for the string, binary and list view types of newer pyarrow versions."""
    return any(
        getattr(t, check, lambda _: False)(typ)
        for check in ("is_string_view", "is_binary_view", "is_list_view", "is_large_list_view")
    )


def _fixed_size_values(array: Any, name: str | None) -> np.ndarray | None:
    """A fixed-size list column of numbers without nulls as an array ``(rows, size, ...)``,
    or None when it holds something else."""
    import pyarrow as pa

    t = pa.types
    value_type = array.type.value_type
    if array.null_count or not (
        t.is_integer(value_type)
        or t.is_floating(value_type)
        or t.is_boolean(value_type)
        or t.is_fixed_size_list(value_type)
    ):
        return None
    flat = array.flatten()
    values = (
        _fixed_size_values(flat, name)
        if t.is_fixed_size_list(value_type)
        else None
        if flat.null_count
        else flat.to_numpy(zero_copy_only=False)
    )
    if values is None:
        return None
    return values.reshape((len(array), array.type.list_size) + values.shape[1:])


# pandas -------------------------------------------------------------------------------


def _pandas_values(
    series: Any, name: str | None, positions: npt.NDArray[np.int64] | None
) -> np.ndarray | list[Any]:
    """A pandas Series (the rows at ``positions``, all when None) as a numpy array or a
    list (see the module docstring)."""
    import pandas as pd

    dtype = series.dtype
    if isinstance(dtype, np.dtype) and dtype.kind != "O":
        values = series.to_numpy()
        if positions is not None:
            values = values[positions]
        if dtype.kind in "biufcmM":
            return values
        raise _unsupported(name, dtype)
    if positions is not None:
        series = series.iloc[positions]
    if isinstance(dtype, np.dtype):  # object: the other numpy kinds are handled above
        return _python_values(series)
    if isinstance(dtype, pd.CategoricalDtype):
        category = dtype.categories.dtype
        if series.hasnans and isinstance(category, np.dtype) and category.kind in "biu":
            raise _missing(name, int(series.isna().sum()))
        return _pandas_values(series.astype(category), name, None)
    if isinstance(dtype, pd.StringDtype):
        return _python_values(series)
    if type(dtype).__name__ == "ArrowDtype":
        import pyarrow as pa

        return _arrow_values(pa.array(series.array), name)
    if isinstance(dtype, pd.DatetimeTZDtype):
        raise _unsupported(name, dtype, "its time zone would be lost in numpy")
    numpy_dtype = getattr(dtype, "numpy_dtype", None)
    if numpy_dtype is not None and numpy_dtype.kind in "biuf":  # Int64, Float32, boolean
        if series.hasnans and numpy_dtype.kind != "f":
            raise _missing(name, int(series.isna().sum()))
        if series.hasnans:
            return series.to_numpy(dtype=numpy_dtype, na_value=np.nan)
        return series.to_numpy(dtype=numpy_dtype)
    raise _unsupported(name, dtype)


def _python_values(series: Any) -> list[Any]:
    """A column of strings or objects as a list, its missing values (None, NaN, NA or NaT
    as pandas sees them) None, as pyarrow gives them: a string column's missing value would
    otherwise be NaN or NA by the pandas version and dtype, a number in a list of strings."""
    values: list[Any] = series.to_numpy(dtype=object, na_value=None).tolist()
    return values
