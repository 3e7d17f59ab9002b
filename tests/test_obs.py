"""The container protocol (fastload.obs): numobs, getobs and getobs_into."""

import tracemalloc
from collections import namedtuple

import numpy as np
import pytest
from helpers import assert_tree_equal, leaves
from hypothesis import given
from hypothesis import strategies as st

from fastload import getobs, getobs_into, numobs, obsview

Pair = namedtuple("Pair", "x y")


class Seq:
    """A plain sequence: __len__ and __getitem__ only."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class OptIn:
    """Opts in with __numobs__/__getobs__/__getobs_into__ and records what it was asked."""

    def __init__(self, array):
        self.array = array
        self.calls = []

    def __numobs__(self):
        return len(self.array)

    def __getobs__(self, i):
        self.calls.append(("getobs", i))
        return self.array[i] * 10

    def __getobs_into__(self, buffer, i):
        self.calls.append(("getobs_into", i))
        buffer[...] = self.array[i] * 10
        return buffer


class Registered:
    def __init__(self, n):
        self.n = n


@numobs.register(Registered)
def _numobs_registered(data):
    return data.n


@getobs.register(Registered)
def _getobs_registered(data, i):
    return np.asarray(i) * 3


@getobs_into.register(Registered)
def _getobs_into_registered(buffer, data, i):
    buffer[...] = np.asarray(i) * 3
    return buffer


def _empty_like(x):
    if isinstance(x, dict):
        return {k: _empty_like(v) for k, v in x.items()}
    if isinstance(x, tuple):
        parts = [_empty_like(v) for v in x]
        return type(x)(*parts) if hasattr(x, "_fields") else tuple(parts)
    return np.zeros(np.shape(x), np.asarray(x).dtype)


X = np.arange(24).reshape(6, 4)


@pytest.mark.parametrize(
    "index, expected",
    [
        (2, X[2]),
        (-1, X[5]),
        (-6, X[0]),
        (np.int32(3), X[3]),
        ([4, 0, 4], X[[4, 0, 4]]),
        (np.array([1, -2]), X[[1, 4]]),
        (slice(1, 6, 2), X[1:6:2]),
        (range(3, 0, -1), X[[3, 2, 1]]),
        ([], X[:0]),
    ],
)
def test_array_getobs_selects_rows_for_every_index_kind(index, expected):
    assert numobs(X) == 6
    assert_tree_equal(getobs(X, index), expected)


def test_tuple_namedtuple_and_dict_members_are_indexed_alike():
    y = np.arange(6) * 2
    assert numobs((X, y)) == numobs(Pair(X, y)) == numobs({"x": X, "y": y}) == 6
    assert_tree_equal(getobs((X, y), [1, 3]), (X[[1, 3]], y[[1, 3]]))
    assert_tree_equal(getobs(Pair(X, y), -1), Pair(X[5], y[5]))
    assert_tree_equal(getobs({"x": X, "y": y}, slice(0, 2)), {"x": X[:2], "y": y[:2]})
    assert_tree_equal(getobs((X, (y, {"z": y})), 2), (X[2], (y[2], {"z": y[2]})))


def test_lists_and_sequence_objects_give_lists_for_several_indices():
    items = ["a", "b", "c", "d"]
    for data in (items, Seq(items)):
        assert numobs(data) == 4
        assert getobs(data, -1) == "d"
        assert getobs(data, [2, 0]) == ["c", "a"]
        assert getobs(data, slice(1, 3)) == ["b", "c"]


def test_opt_in_methods_are_used_with_normalized_indices():
    data = OptIn(np.arange(5))
    assert numobs(data) == 5
    assert getobs(data, -1) == 40
    assert_tree_equal(getobs(data, [0, -2]), np.array([0, 30]))
    buffer = np.empty(2, np.int64)
    assert getobs_into(buffer, data, [1, 2]) is buffer
    assert_tree_equal(buffer, np.array([10, 20]))
    assert data.calls[0] == ("getobs", 4)
    assert [name for name, _ in data.calls] == ["getobs", "getobs", "getobs_into"]


def test_registered_implementations_are_dispatched_on_the_container_type():
    data = Registered(7)
    assert numobs(data) == 7
    assert_tree_equal(getobs(data, [1, 2]), np.array([3, 6]))
    buffer = np.zeros(2, np.int64)
    assert getobs_into(buffer, data, [1, 2]) is buffer
    assert_tree_equal(buffer, np.array([3, 6]))


def test_mismatched_member_sizes_raise_value_error_naming_the_sizes():
    with pytest.raises(ValueError, match=r"6.*5|5.*6"):
        numobs((X, np.arange(5)))
    with pytest.raises(ValueError, match=r"6.*3|3.*6"):
        getobs({"x": X, "y": np.arange(3)}, 0)


@pytest.mark.parametrize(
    "data",
    [X, (X, X[:, 0]), {"x": X}, list(range(6)), Seq(list(range(6)))],
    ids=["array", "tuple", "dict", "list", "sequence"],
)
@pytest.mark.parametrize("index, bad", [(6, 6), (-7, -7), ([0, 9], 9), (np.array([-8, 1]), -8)])
def test_out_of_range_raises_index_error_naming_index_and_length(data, index, bad):
    with pytest.raises(IndexError, match=rf"index {bad} .*\b6\b"):
        getobs(data, index)


def test_out_of_range_getobs_into_raises_index_error():
    with pytest.raises(IndexError, match=r"\b6\b"):
        getobs_into(np.empty((1, 4), X.dtype), X, [6])


def test_non_containers_and_bad_indices_raise_type_error():
    with pytest.raises(TypeError):
        numobs(3)
    with pytest.raises(TypeError):
        getobs(X, np.array([True, False] * 3))
    with pytest.raises(TypeError):
        getobs(X, [[0, 1]])


@pytest.mark.parametrize("index", [True, np.bool_(False), [1, True], (np.bool_(True), 0)])
def test_a_bool_is_no_position_even_among_ints(index):
    with pytest.raises(TypeError, match="bool"):
        getobs(X, index)
    with pytest.raises(TypeError, match="bool"):
        getobs(obsview(X, [0, 1, 2]), index)


def test_getobs_into_returns_the_buffer_itself_for_arrays():
    buffer = np.empty((3, 4), X.dtype)
    assert getobs_into(buffer, X, [5, 0, 2]) is buffer
    assert_tree_equal(buffer, X[[5, 0, 2]])
    row = np.empty(4, X.dtype)
    assert getobs_into(row, X, -2) is row
    assert_tree_equal(row, X[4])


@pytest.mark.parametrize("kind", ["tuple", "namedtuple", "dict"])
def test_getobs_into_fills_the_member_buffers_of_tuples_and_dicts(kind):
    y = np.arange(6.0)
    data = {"tuple": (X, y), "namedtuple": Pair(X, y), "dict": {"x": X, "y": y}}[kind]
    buffer = _empty_like(getobs(data, [0, 1, 2]))
    result = getobs_into(buffer, data, [3, 1, 4])
    assert type(result) is type(buffer)
    for got, buf in zip(leaves(result), leaves(buffer)):
        assert got is buf
    assert_tree_equal(result, getobs(data, [3, 1, 4]))


def test_getobs_into_with_a_wrong_shape_raises_value_error():
    with pytest.raises(ValueError, match="shape"):
        getobs_into(np.empty((2, 4)), X, [0, 1, 2])


@pytest.mark.parametrize(
    "data",
    [
        np.full(3, 2**40, np.int64),  # the array gather
        [np.int64(2**40)] * 3,  # getobs, then a copy
    ],
)
@pytest.mark.parametrize("index", [1, [0, 2]])
def test_getobs_into_refuses_a_buffer_that_would_lose_information(data, index):
    shape = () if isinstance(index, int) else (len(index),)
    buffer = np.zeros(shape, np.int32)
    with pytest.raises(ValueError, match="dtype int32 does not fit .* dtype int64"):
        getobs_into(buffer, data, index)
    assert not buffer.any()
    with pytest.raises(ValueError, match="dtype float32 does not fit .* dtype float64"):
        getobs_into(np.zeros(shape, np.float32), np.full(3, 1e300), index)


def test_getobs_into_takes_the_casts_numpy_calls_safe():
    buffer = np.zeros(3, np.float64)
    getobs_into(buffer, np.array([1, 2, 3], np.int32), [2, 1, 0])
    assert buffer.tolist() == [3.0, 2.0, 1.0]
    wide = np.zeros(2, np.int64)
    getobs_into(wide, [True, np.int8(-5)], [0, 1])
    assert wide.tolist() == [1, -5]


class _Items:
    """A sequence container whose observations are (row, label) tuples, as a PyTorch
    dataset gives them."""

    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i], i


def test_copy_into_fills_a_tuple_member_by_member_and_checks_each_as_the_others():
    from fastload.obs import copy_into, exact_dtypes

    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    image, label = np.zeros(3, np.float32), np.zeros((), np.int64)
    filled = getobs_into((image, label), _Items(rows), 2)
    assert type(filled) is tuple and filled[0] is image and filled[1] is label
    assert image.tolist() == [6.0, 7.0, 8.0] and label == 2
    with pytest.raises(ValueError, match="buffer with 2 members does not fit .* with 3"):
        copy_into((image, label), (rows[0], 1, 2))
    with pytest.raises(ValueError, match=r"shape \(3,\) does not fit .* shape \(2,\)"):
        copy_into((image, label), (rows[0, :2], 1))
    with exact_dtypes(), pytest.raises(ValueError, match="float32 does not fit .* float64"):
        copy_into((image, label), (rows[1].astype(np.float64), 1))
    # A member that cannot be filled in place comes back as the observation's.
    assert copy_into((image, None), (rows[3], "a")) == (image, "a")
    assert image.tolist() == [9.0, 10.0, 11.0]


def test_getobs_into_falls_back_to_getobs_for_a_list_buffer_or_plain_sequences():
    assert getobs_into([], X, [1]).tolist() == [X[1].tolist()]
    buffer = np.empty(2, np.int64)
    assert getobs_into(buffer, list(range(10, 16)), [5, 0]) is buffer
    assert buffer.tolist() == [15, 10]


def test_getobs_into_allocates_nothing_the_size_of_the_batch():
    data = (np.ones((4096, 256), np.float32), np.arange(4096.0))
    idx = np.random.default_rng(0).permutation(4096)[:1024]
    buffer = (np.empty((1024, 256), np.float32), np.empty(1024))
    batch_bytes = buffer[0].nbytes + buffer[1].nbytes
    getobs_into(buffer, data, idx)
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for _ in range(3):
            result = getobs_into(buffer, data, idx)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result[0] is buffer[0] and result[1] is buffer[1]
    assert peak - start < batch_bytes // 16


def _arrays(draw, n):
    shape = (n,) + tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    dtype = draw(
        st.sampled_from(["int8", "uint16", "int64", "float32", "float64", "bool", "complex64"])
    )
    array = (np.arange(int(np.prod(shape))) % 7).astype(dtype).reshape(shape)
    layout = draw(st.sampled_from(["c", "reversed", "fortran", "strided"]))
    if layout == "reversed":
        array = array[::-1]
    elif layout == "fortran":
        array = np.asfortranarray(array)
    elif layout == "strided":
        array = np.repeat(array, 2, axis=0)[::2]
    return array


@st.composite
def containers(draw):
    n = draw(st.integers(1, 8))
    kind = draw(st.sampled_from(["array", "tuple", "namedtuple", "dict", "nested"]))
    a, b = _arrays(draw, n), _arrays(draw, n)
    return {
        "array": a,
        "tuple": (a, b),
        "namedtuple": Pair(a, b),
        "dict": {"a": a, "b": b},
        "nested": (a, {"b": b, "c": (a,)}),
    }[kind]


@st.composite
def indices(draw, n):
    kind = draw(st.sampled_from(["int", "list", "array", "slice", "range"]))
    if kind == "int":
        return draw(st.integers(-n, n - 1))
    if kind == "slice":
        return slice(
            draw(st.integers(-n, n)),
            draw(st.integers(-n, n)),
            draw(st.sampled_from([1, 2, -1, -3])),
        )
    if kind == "range":
        start = draw(st.integers(0, n - 1))
        return range(start, draw(st.integers(0, n)), draw(st.sampled_from([1, 2, -1])))
    values = draw(st.lists(st.integers(-n, n - 1), max_size=10))
    return values if kind == "list" else np.array(values, np.int64)


@given(st.data())
def test_getobs_into_equals_getobs_and_fills_the_buffer_for_any_container_and_index(data):
    container = data.draw(containers())
    index = data.draw(indices(numobs(container)))
    expected = getobs(container, index)
    buffer = _empty_like(expected)
    result = getobs_into(buffer, container, index)
    assert_tree_equal(result, expected)
    assert type(result) is type(buffer)
    for got, buf in zip(leaves(result), leaves(buffer)):
        assert got is buf


def test_all_lists_the_users_names_and_the_helpers_stay_importable():
    import fastload.obs as obs

    assert obs.__all__ == ["Container", "Index", "getobs", "getobs_into", "numobs"]
    for helper in ("copy_into", "exact_dtypes", "is_batch_index", "normalize_index"):
        assert callable(getattr(obs, helper))
    from fastload._base.tree import map_tree, tree_leaves

    assert (obs.map_tree, obs.tree_leaves) == (map_tree, tree_leaves)
