"""Tables as containers of rows (fastload.tables): pandas, pyarrow and a stand-in for a
Hugging Face ``datasets.Dataset``; every column type converts to an array or a list, or
fails naming the column."""

import datetime
import decimal
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from helpers import assert_tree_equal, copy_tree

from fastload import DataLoader, getobs, getobs_into, numobs, splitobs
from fastload._base.tree import LeafKind
from fastload._loading.plan import ItemPlan, make_plan
from fastload._loading.schedule import schedule_of
from fastload.tables import columns
from fastload.views import batchview

N = 10
X = np.arange(N * 2, dtype=np.float32).reshape(N, 2)
WORDS = [f"w{i}" for i in range(N)]


def arrow_table():
    return pa.table(
        {
            "x": pa.array(np.arange(N, dtype=np.float64)),
            "v": pa.FixedSizeListArray.from_arrays(pa.array(X.ravel()), 2),
            "label": pa.array(np.arange(N) % 3),
            "word": WORDS,
        }
    )


def expected_rows(idx):
    idx = np.asarray(idx)
    return {
        "x": np.arange(N, dtype=np.float64)[idx],
        "v": X[idx],
        "label": (np.arange(N) % 3)[idx],
        "word": [WORDS[i] for i in idx],
    }


def loaded(data, **options):
    return [copy_tree(b) for b in DataLoader(data, 4, **options)]


GATHER = LeafKind.GATHER


def native_leaves(view):
    plan = make_plan(*schedule_of(batchview(view, 4)))
    assert isinstance(plan, ItemPlan)
    return [leaf.kind for leaf in plan.leaves]


class FakeDataset:
    """What fastload uses of ``datasets.Dataset``'s documented API (2.x-3.x): ``__len__``,
    ``column_names``, ``format`` (a dict of "type", "format_kwargs", "columns" and
    "output_all_columns"), ``with_format``/``set_format`` and ``__getitem__`` (rows as
    dicts, or a pyarrow Table in the "arrow" format), with an optional indices mapping as
    ``select``/``shuffle`` make. Only the "arrow" and custom formats are applied here:
    fastload reads the others through "arrow" and applies them itself."""

    def __init__(self, table, indices=None, fmt=None):
        self._table = table
        self._indices = np.arange(table.num_rows) if indices is None else np.asarray(indices)
        self._format = fmt or {
            "type": None,
            "format_kwargs": {},
            "columns": None,
            "output_all_columns": False,
        }

    @property
    def column_names(self):
        return self._table.column_names

    @property
    def format(self):
        fmt = dict(self._format)
        fmt["columns"] = fmt["columns"] or self.column_names
        return fmt

    def with_format(self, type=None, columns=None, output_all_columns=False, **format_kwargs):
        return FakeDataset(
            self._table,
            self._indices,
            {
                "type": type,
                "format_kwargs": format_kwargs,
                "columns": columns,
                "output_all_columns": output_all_columns,
            },
        )

    def set_format(self, type=None, columns=None, output_all_columns=False, **format_kwargs):
        self._format = self.with_format(type, columns, output_all_columns, **format_kwargs)._format

    def set_transform(self, transform):
        self._format = {
            "type": "custom",
            "format_kwargs": {"transform": transform},
            "columns": None,
            "output_all_columns": False,
        }

    def select(self, indices):
        return FakeDataset(self._table, self._indices[list(indices)], self._format)

    def __len__(self):
        return len(self._indices)

    def __getitem__(self, key):
        rows = (
            self._indices[key]
            if isinstance(key, slice)
            else self._indices[np.atleast_1d(np.asarray(key, np.int64))]
        )
        table = self._table.take(pa.array(rows)).select(self.format["columns"])
        if self._format["type"] == "arrow":
            return table
        batch = table.to_pydict()
        if self._format["type"] == "custom":
            batch = self._format["format_kwargs"]["transform"](batch)
        if isinstance(key, (int, np.integer)):
            return {name: values[0] for name, values in batch.items()}
        return batch


FakeDataset.__module__ = "datasets.arrow_dataset"
FakeDataset.__name__ = FakeDataset.__qualname__ = "Dataset"


def test_an_arrow_table_is_a_container_of_rows():
    table = arrow_table()
    assert numobs(table) == N
    assert_tree_equal(getobs(table, 3), {k: v[0] for k, v in expected_rows([3]).items()})
    assert_tree_equal(getobs(table, [9, 0, 4]), expected_rows([9, 0, 4]))
    assert_tree_equal(getobs(table, slice(8, None)), expected_rows([8, 9]))
    assert_tree_equal(getobs(table), expected_rows(range(N)))
    with pytest.raises(IndexError):
        getobs(table, N)


@pytest.mark.parametrize("parallel", [False, 2])
def test_a_loader_over_an_arrow_table_gives_dict_batches_of_arrays(parallel):
    batches = loaded(arrow_table(), parallel=parallel)
    assert len(batches) == 3
    for batch, rows in zip(batches, [range(4), range(4, 8), range(8, 10)]):
        assert_tree_equal(batch, expected_rows(list(rows)))
    assert native_leaves(arrow_table()) == [GATHER, GATHER, GATHER, LeafKind.OBJECT]


def test_numeric_arrow_columns_are_views_of_the_arrow_buffers():
    table = pa.Table.from_batches([pa.record_batch({"x": np.arange(N, dtype=np.int32)})])
    converted = columns(table)["x"]
    assert np.shares_memory(converted, table.column("x").chunk(0).to_numpy())
    assert columns(table) is not None and columns(table)["x"] is converted  # converted once


def test_a_table_of_several_chunks_and_a_record_batch_load_alike():
    table = arrow_table()
    chunked = pa.concat_tables([table.slice(0, 3), table.slice(3)])
    assert chunked.column("x").num_chunks == 2
    batch = table.to_batches()[0]
    for data in (chunked, batch):
        assert_tree_equal(loaded(data), loaded(table))
        assert_tree_equal(getobs(data, [2, 3]), expected_rows([2, 3]))


def test_arrow_columns_are_containers_of_values():
    column = pa.chunked_array([[1, 2], [3]])
    assert numobs(column) == 3 and getobs(column, 2) == 3
    assert_tree_equal(getobs(column, [2, 0]), np.array([3, 1]))
    assert getobs(pa.array(["a", "b"]), [1, 0]) == ["b", "a"]


def test_a_pandas_dataframe_is_a_container_of_rows_by_position():
    frame = pd.DataFrame(
        {"x": np.arange(N, dtype=np.float64), "label": np.arange(N) % 3, "word": WORDS},
        index=np.arange(N) * 10 + 5,
    )
    expected = {k: v for k, v in expected_rows(range(N)).items() if k != "v"}
    assert numobs(frame) == N
    assert_tree_equal(getobs(frame, 0), {k: v[0] for k, v in expected.items()})
    assert_tree_equal(getobs(frame, [1, 2]), {k: v[1:3] for k, v in expected.items()})
    sequential, parallel = (
        loaded(frame, shuffle=True, seed=3),
        loaded(frame, shuffle=True, seed=3, parallel=2),
    )
    assert_tree_equal(parallel, sequential)
    assert sorted(np.concatenate([b["x"] for b in sequential]).tolist()) == list(range(N))
    assert set(sequential[0]) == {"x", "label", "word"}
    assert isinstance(sequential[0]["label"], np.ndarray)


def test_a_pandas_series_is_a_container_of_values():
    series = pd.Series(np.arange(5) * 2, index=list("abcde"))
    assert numobs(series) == 5 and getobs(series, 4) == 8
    assert_tree_equal(getobs(series, [3, 1]), np.array([6, 2]))
    assert getobs(pd.Series(["p", "q"]), [1, 0]) == ["q", "p"]


def test_splits_of_a_table_stay_index_views_that_load_natively():
    train, test = splitobs(arrow_table(), at=0.7)
    assert native_leaves(train) == [GATHER, GATHER, GATHER, LeafKind.OBJECT]
    assert_tree_equal(loaded(test), [expected_rows([7, 8, 9])])
    buffer = {
        "x": np.zeros(2),
        "v": np.zeros((2, 2), np.float32),
        "label": np.zeros(2, np.int64),
        "word": [],
    }
    assert_tree_equal(getobs_into(buffer, train, [0, 6])["v"], X[[0, 6]])


def test_arrow_column_types_convert_to_arrays_or_lists():
    n = 3
    stamps = np.array(["2024-01-01T00:00", "2024-01-02T12:00", "NaT"], "datetime64[ms]")
    table = pa.table(
        {
            "f16": pa.array(np.arange(n, dtype=np.float16)),
            "flag": [True, False, True],
            "float_with_null": pa.array([1.5, None, 2.5]),
            "when": pa.array(stamps),
            "day": pa.array([datetime.date(2024, 1, d) for d in (1, 2, 3)]),
            "wait": pa.array(np.array([1, 2, 3], "timedelta64[s]")),
            "category": pa.array(["x", "y", "x"]).dictionary_encode(),
            "text_with_null": ["a", None, "c"],
            "blob": [b"\x00", b"\x01", b""],
            "tokens": [[1, 2, 3], [], [4]],
            "point": [{"a": 1, "b": "p"}, {"a": 2, "b": "q"}, {"a": 3, "b": "r"}],
            "price": pa.array([decimal.Decimal("1.10"), decimal.Decimal("2.20"), None]),
            "clock": pa.array([datetime.time(1, 2), datetime.time(3, 4), None]),
            "grid": pa.array([[[1, 2], [3, 4]]] * n, pa.list_(pa.list_(pa.int16(), 2), 2)),
            "ragged_fixed": pa.array([[1, None], [2, 3], [4, 5]], pa.list_(pa.int64(), 2)),
        }
    )
    got = getobs(table, [0, 1, 2])
    assert got["f16"].dtype == np.float16 and got["flag"].tolist() == [True, False, True]
    assert np.isnan(got["float_with_null"][1]) and got["float_with_null"][2] == 2.5
    assert got["when"].dtype == stamps.dtype and got["when"].tolist() == stamps.tolist()
    assert got["day"].dtype.kind == "M" and got["wait"].dtype == np.dtype("timedelta64[s]")
    assert got["category"] == ["x", "y", "x"]
    assert got["text_with_null"] == ["a", None, "c"] and got["blob"] == [b"\x00", b"\x01", b""]
    assert got["tokens"] == [[1, 2, 3], [], [4]]
    assert got["point"][1] == {"a": 2, "b": "q"}
    assert got["price"][:2] == [decimal.Decimal("1.10"), decimal.Decimal("2.20")]
    assert got["clock"][0] == datetime.time(1, 2)
    assert got["grid"].shape == (3, 2, 2) and got["grid"].dtype == np.int16
    assert got["ragged_fixed"] == [[1, None], [2, 3], [4, 5]]  # a null: kept as a list
    row = getobs(table, 1)
    assert row["text_with_null"] is None and row["tokens"] == [] and row["grid"].shape == (2, 2)


def test_pandas_column_types_convert_to_arrays_or_lists():
    frame = pd.DataFrame(
        {
            "nullable": pd.array([1, 2, 3], dtype="Int64"),
            "nullable_float": pd.array([1.0, None, 3.0], dtype="Float64"),
            "boolean": pd.array([True, False, True], dtype="boolean"),
            "category": pd.Categorical(["b", "a", "b"]),
            "int_category": pd.Categorical([3, 1, 3]),
            "when": pd.to_datetime(["2024-01-01", "2024-01-02", None]),
            "objects": [np.zeros(2), np.ones(2), np.full(2, 2.0)],
            "arrow_ints": pd.array([4, 5, 6], dtype="int64[pyarrow]"),
        }
    )
    got = getobs(frame, [0, 1, 2])
    assert_tree_equal(got["nullable"], np.array([1, 2, 3]))
    assert np.isnan(got["nullable_float"][1]) and got["nullable_float"].dtype == np.float64
    assert got["boolean"].dtype == bool and got["category"] == ["b", "a", "b"]
    assert_tree_equal(got["int_category"], np.array([3, 1, 3]))
    assert got["when"].dtype.kind == "M" and np.isnat(got["when"][2])
    assert_tree_equal(got["arrow_ints"], np.array([4, 5, 6]))
    batch = next(iter(DataLoader(frame, 3)))
    assert_tree_equal(batch["objects"], np.stack(frame["objects"].tolist()))  # collated


TEXT = [None, "a", "bb", None, "c", "dd"]
TEXT_COLUMNS = {
    "pandas-default-str": lambda: pd.DataFrame({"s": TEXT}),
    "pandas-object": lambda: pd.DataFrame({"s": pd.Series(TEXT, dtype=object)}),
    "pandas-object-nan": lambda: pd.DataFrame(
        {"s": pd.Series([np.nan if t is None else t for t in TEXT], dtype=object)}
    ),
    "pandas-string-NA": lambda: pd.DataFrame({"s": pd.Series(TEXT, dtype="string")}),
    "pandas-category": lambda: pd.DataFrame({"s": pd.Categorical(TEXT)}),
    "pandas-arrow-str": lambda: pd.DataFrame({"s": pd.Series(TEXT, dtype="string[pyarrow]")}),
    "arrow-string": lambda: pa.table({"s": TEXT}),
    "arrow-dictionary": lambda: pa.table({"s": pa.array(TEXT).dictionary_encode()}),
}


@pytest.mark.parametrize("make", TEXT_COLUMNS.values(), ids=TEXT_COLUMNS.keys())
@pytest.mark.parametrize("parallel", [False, 2])
def test_text_columns_load_in_every_order_with_none_for_missing(make, parallel):
    table = make()
    row = np.arange(6)
    table = (
        table.assign(row=row)
        if isinstance(table, pd.DataFrame)
        else table.append_column("row", [row])
    )
    assert getobs(table, 0)["s"] is None and getobs(table, [3, 1])["s"] == [None, "a"]
    for seed in range(6):  # some orders start with a missing value, some do not
        for batch in loaded(table, shuffle=True, seed=seed, parallel=parallel):
            assert batch["s"] == [TEXT[i] for i in batch["row"]]
    first = next(iter(DataLoader(table, 2, sampler=[3, 0])))
    assert first["s"] == [None, None]


def test_a_column_of_objects_loads_as_getobs_gives_it_whatever_comes_first():
    frame = pd.DataFrame({"o": pd.Series([7, "x", None, 3.5], dtype=object)})
    for order in ([0, 1, 2, 3], [2, 0, 3, 1]):
        batch = next(iter(DataLoader(frame, 4, sampler=order)))
        assert batch["o"] == getobs(frame, order)["o"] == [[7, "x", None, 3.5][i] for i in order]


@pytest.mark.parametrize(
    "column, error, words",
    [
        (pa.array([1, None, 3]), ValueError, "missing"),
        (pa.array([True, None, False]), ValueError, "missing"),
        (pa.array(np.arange(3), pa.timestamp("s", tz="UTC")), TypeError, "time zone"),
        (pa.RunEndEncodedArray.from_arrays([2, 3], [1, 5]), TypeError, "run_end_encoded"),
        (pd.array([1, None, 3], dtype="Int64"), ValueError, "missing"),
        (
            pd.Series(pd.to_datetime(["2024-01-01"] * 3)).dt.tz_localize("UTC"),
            TypeError,
            "time zone",
        ),
        (pd.period_range("2024-01", periods=3, freq="M"), TypeError, "period"),
        (pd.arrays.SparseArray([0, 1, 0]), TypeError, "Sparse"),
    ],
    ids=[
        "arrow-int-nulls",
        "arrow-bool-nulls",
        "arrow-tz",
        "arrow-run-end",
        "pandas-Int64-NA",
        "pandas-tz",
        "pandas-period",
        "pandas-sparse",
    ],
)
def test_a_column_that_cannot_convert_without_loss_raises_naming_it(column, error, words):
    table = (
        pa.table({"fine": [1.0, 2.0, 3.0], "bad": column})
        if isinstance(column, pa.Array)
        else pd.DataFrame({"fine": [1.0, 2.0, 3.0], "bad": column})
    )
    with pytest.raises(error, match=r"(?s)'bad'.*" + words):
        getobs(table, [0, 1, 2])
    with pytest.raises(error, match="'bad'"):
        list(DataLoader(table, 2))


def test_an_arrow_extension_column_raises_naming_it():
    class Tagged(pa.ExtensionType):
        def __init__(self):
            super().__init__(pa.int64(), "test.tagged")

        def __arrow_ext_serialize__(self):
            return b""

        @classmethod
        def __arrow_ext_deserialize__(cls, storage_type, serialized):
            return cls()

    column = pa.ExtensionArray.from_storage(Tagged(), pa.array([1, 2]))
    with pytest.raises(TypeError, match="'tagged'.*extension"):
        getobs(pa.table({"tagged": column}), 0)


def test_duplicate_column_names_raise_value_error():
    frame = pd.DataFrame([[1, 2]], columns=["a", "a"])
    with pytest.raises(ValueError, match="two columns named 'a'"):
        getobs(frame, 0)


def test_a_datasets_dataset_is_read_through_its_arrow_rows():
    dataset = FakeDataset(arrow_table()).select([9, 0, 4, 4, 2])
    assert numobs(dataset) == 5
    assert_tree_equal(getobs(dataset, 1), {k: v[0] for k, v in expected_rows([0]).items()})
    assert_tree_equal(getobs(dataset, [0, 3]), expected_rows([9, 4]))
    batches = loaded(dataset, parallel=2)
    assert_tree_equal(batches, [expected_rows([9, 0, 4, 4]), expected_rows([2])])
    assert native_leaves(dataset) == [GATHER, GATHER, GATHER, LeafKind.OBJECT]


def test_a_datasets_dataset_keeps_its_format_columns_and_its_transform():
    dataset = FakeDataset(arrow_table()).with_format("numpy", columns=["label", "word"])
    assert_tree_equal(getobs(dataset, [1, 2]), {"label": np.array([1, 2]), "word": ["w1", "w2"]})
    dataset.set_transform(
        lambda batch: {"upper": [w.upper() for w in batch["word"]], "label": batch["label"]}
    )
    assert getobs(dataset, 3) == {"upper": "W3", "label": 0}
    assert_tree_equal(
        next(iter(DataLoader(dataset, 2))), {"upper": ["W0", "W1"], "label": np.array([0, 1])}
    )


def formats_table():
    return pa.table(
        {
            "x": pa.array(np.arange(N, dtype=np.float64)),
            "label": pa.array(np.arange(N, dtype=np.int32) % 3),
            "flag": pa.array(np.arange(N) % 2 == 0),
            "pair": [[i, -i] for i in range(N)],  # lists of one length: not an Arrow fixed size
            "grid": [[[i, 0], [0, i]] for i in range(N)],
            "ragged": [[i] * (1 + (i == N - 1)) for i in range(N)],  # one longer list, last
            "word": WORDS,
        }
    )


def test_a_torch_format_gives_tensors_as_the_dataset_does():
    torch = pytest.importorskip("torch")
    dataset = FakeDataset(formats_table()).select([9, 0, 4, 4, 2]).with_format("torch")
    rows = [9, 0, 4, 4, 2]
    for parallel in (False, 2):
        batch = next(iter(DataLoader(dataset, 4, parallel=parallel)))
        assert batch["x"].dtype == torch.float32 and batch["label"].dtype == torch.int64
        assert torch.equal(batch["x"], torch.tensor([float(i) for i in rows[:4]]))
        assert torch.equal(batch["label"], torch.tensor([i % 3 for i in rows[:4]]))
        assert torch.equal(batch["flag"], torch.tensor([i % 2 == 0 for i in rows[:4]]))
        assert torch.equal(batch["pair"], torch.tensor([[i, -i] for i in rows[:4]]))
        assert batch["grid"].shape == (4, 2, 2) and batch["word"] == ["w9", "w0", "w4", "w4"]
        assert batch["ragged"] == [[9, 9], [0], [4], [4]]
    row = getobs(dataset, 1)
    assert isinstance(row["label"], torch.Tensor) and row["label"].item() == 0
    assert torch.equal(row["pair"], torch.tensor([0, 0]))


def test_a_numpy_format_makes_lists_of_one_length_arrays_in_every_batch():
    dataset = FakeDataset(formats_table()).with_format("numpy")
    batches = loaded(dataset)
    assert batches[0]["x"].dtype == np.float32 and batches[0]["label"].dtype == np.int64
    assert_tree_equal(batches[0]["pair"], np.array([[i, -i] for i in range(4)]))
    assert_tree_equal(
        getobs(dataset, [5, 1])["grid"], np.array([[[5, 0], [0, 5]], [[1, 0], [0, 1]]])
    )
    # Only the last row of "ragged" is longer: every batch keeps lists, not the first two arrays.
    assert [b["ragged"] for b in batches] == [
        [[0], [1], [2], [3]],
        [[4], [5], [6], [7]],
        [[8], [9, 9]],
    ]
    plain = FakeDataset(formats_table())  # the python format: fastload's own conversion
    assert getobs(plain, [0, 1])["pair"] == [[0, 0], [1, -1]]
    assert getobs(plain, [0, 1])["x"].dtype == np.float64


def test_a_format_applies_to_its_columns_with_its_dtype():
    torch = pytest.importorskip("torch")
    dataset = FakeDataset(formats_table()).with_format(
        "torch", columns=["x", "pair"], output_all_columns=True, dtype=torch.float16
    )
    batch = next(iter(DataLoader(dataset, 2)))
    assert batch["x"].dtype == torch.float16 and batch["pair"].dtype == torch.float16
    assert_tree_equal(batch["label"], np.array([0, 1], np.int32))  # not in the format
    assert batch["pair"].tolist() == [[0, 0], [1, -1]] and batch["word"] == ["w0", "w1"]
    dataset.set_format("numpy", columns=["label"])  # in place: read anew
    assert_tree_equal(next(iter(DataLoader(dataset, 2))), {"label": np.array([0, 1])})


@pytest.mark.parametrize(
    "fmt, kwargs, words",
    [
        ("jax", {}, "'jax' format"),
        ("tensorflow", {}, "'tensorflow' format"),
        ("pandas", {}, "'pandas' format"),
        ("numpy", {"copy": False}, "format_kwargs.*copy"),
        (None, {"dtype": np.float32}, "format_kwargs.*dtype"),
    ],
)
def test_a_format_fastload_cannot_give_raises_naming_it(fmt, kwargs, words):
    dataset = FakeDataset(formats_table()).with_format(fmt, **kwargs)
    with pytest.raises(TypeError, match=words):
        getobs(dataset, 0)
    with pytest.raises(TypeError, match=words):
        list(DataLoader(dataset, 2))


def test_a_torch_format_refuses_a_column_torch_cannot_hold():
    pytest.importorskip("torch")
    table = pa.table({"when": pa.array(np.arange(3).astype("datetime64[s]"))})
    dataset = FakeDataset(table).with_format("torch")
    with pytest.raises(TypeError, match="'when'.*datetime64.*torch"):
        list(DataLoader(dataset, 2))
    assert getobs(dataset.with_format("numpy"), [1])["when"].dtype == np.dtype("datetime64[s]")


def test_importing_fastload_imports_no_table_or_tensor_library():
    code = (
        "import sys, fastload; print(sorted({'pandas', 'pyarrow', 'torch', 'datasets'}"
        " & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
