"""How a plan fills batch buffers: a batch is what ``np.stack`` of its observations gives,
or a LoadError naming the observation whose dtype is not observation 0's; never a cast."""

import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload import DataLoader, LoadError, eachobs, mapobs
from fastload._loading.plan import StepPlan, make_plan
from fastload._loading.schedule import Schedule

TRANSPORTS = {
    "sequential": {},
    "threads": {"parallel": 2},
    "processes": {"parallel": 2, "backend": "process"},
}


class Items:
    """A container of the given observations, loaded through Python ``getobs``."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def _load(data, batch_size, **options):
    with DataLoader(data, batch_size=batch_size, **options) as loader:
        return list(loader)


def _assert_refused(error, first, last, dtype, buffer_dtype):
    assert first <= error.index <= last
    message = str(error)
    assert f"dtype {dtype}" in message and f"dtype {buffer_dtype}" in message
    assert "mapobs" in message


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("container", [list, Items, lambda items: mapobs(lambda x: x, items)])
def test_wider_int_after_observation_0_raises_rather_than_wrapping(transport, container):
    items = [np.int32(1)] * 4 + [np.int64(2**40)] * 4
    loader = DataLoader(container(items), batch_size=4, **TRANSPORTS[transport])
    batches = iter(loader)
    np.testing.assert_array_equal(next(batches), np.ones(4, np.int32))
    with pytest.raises(LoadError) as caught:
        next(batches)
    _assert_refused(caught.value, 4, 7, "int64", "int32")
    loader.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_float64_after_float32_raises_rather_than_overflowing_to_inf(transport):
    items = [np.float32(1)] * 3 + [np.float64(1e300)] * 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow warning must not be all there is
        with pytest.raises(LoadError) as caught:
            _load(items, 3, **TRANSPORTS[transport])
    _assert_refused(caught.value, 3, 5, "float64", "float32")


def test_a_narrower_dtype_is_refused_too_since_np_stack_would_give_it():
    # A batch of int32 observations stacks to int32: an int64 buffer would change it.
    with pytest.raises(LoadError) as caught:
        _load([np.int64(5), np.int64(6), np.int32(7), np.int32(8)], 2)
    _assert_refused(caught.value, 2, 3, "int32", "int64")


def test_single_observations_are_refused_the_same_way():
    with pytest.raises(LoadError) as caught:
        list(eachobs([np.float32(1), np.float64(1e300)]))
    _assert_refused(caught.value, 1, 1, "float64", "float32")


def test_a_table_column_of_objects_of_mixed_dtypes_is_stacked_batch_by_batch():
    # A column of Python objects is collected as values, not into observation 0's buffer,
    # so each batch is what np.stack of its own values gives: nothing is cast.
    values = [np.int32(1)] * 4 + [np.int64(2**40)] * 4
    table = pd.DataFrame({"x": pd.Series(values, dtype=object), "y": np.arange(8)})
    for batch, start in zip(_load(table, 4), (0, 4), strict=True):
        expected = np.stack(values[start : start + 4])
        assert batch["x"].dtype == expected.dtype
        np.testing.assert_array_equal(batch["x"], expected)


class _Stream:
    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)


@pytest.mark.parametrize("collate", [None, True])
def test_a_stream_of_mixed_dtypes_raises_rather_than_casting(collate):
    items = [np.float32(1)] * 4 + [np.float64(1e300)] * 4
    with pytest.raises(LoadError) as caught:
        _load(_Stream(items), 4, collate=collate)
    _assert_refused(caught.value, 4, 7, "float64", "float32")


def test_a_member_of_a_tuple_observation_is_checked_too():
    items = [(np.zeros(2, np.float32), 0)] * 2 + [(np.full(2, 1e300), 1)] * 2
    with pytest.raises(LoadError) as caught:
        _load(Items(items), 2)
    _assert_refused(caught.value, 2, 3, "float64", "float32")


def test_one_dtype_throughout_loads_as_before():
    items = [np.float32(k) for k in range(10)]
    for transport in ("sequential", "threads"):
        batches = _load(Items(items), 4, **TRANSPORTS[transport])
        assert [b.dtype for b in batches] == [np.float32] * 3
        np.testing.assert_array_equal(np.concatenate(batches), np.arange(10, dtype=np.float32))


# Item dtypes: numpy scalars of every width, and Python numbers (int64 and float64 to numpy).
_INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
_FLOATS = {np.float16: 16, np.float32: 32, np.float64: 64}


def _numpy_ints(dtype):
    info = np.iinfo(dtype)
    return st.integers(int(info.min), int(info.max)).map(dtype)


def _numpy_floats(dtype, width):
    return st.floats(width=width, allow_nan=False, allow_infinity=False).map(dtype)


_ITEMS = st.one_of(
    st.booleans().map(np.bool_),
    *[_numpy_ints(t) for t in _INTS],
    *[_numpy_floats(t, w) for t, w in _FLOATS.items()],
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
)


def _check_against_np_stack(items, batch_size, options):
    """The batches are np.stack of each batch's items (values and dtype) up to a LoadError,
    which comes only at a batch holding an item of a dtype other than observation 0's."""
    expected = [
        np.stack([np.asarray(x) for x in items[k : k + batch_size]])
        for k in range(0, len(items), batch_size)
    ]
    got = []
    try:
        with DataLoader(Items(items), batch_size=batch_size, **options) as loader:
            for batch in loader:
                got.append(batch)
    except LoadError as error:
        first = np.asarray(items[0]).dtype
        step = len(got)
        batch = items[step * batch_size : (step + 1) * batch_size]
        assert any(np.asarray(x).dtype != first for x in batch), error
        assert np.asarray(items[error.index]).dtype != first
        expected = expected[:step]
    assert len(got) == len(expected)
    for batch, stacked in zip(got, expected):
        assert batch.dtype == stacked.dtype
        np.testing.assert_array_equal(batch, stacked)


@pytest.mark.parametrize("transport", ["sequential", "threads"])
@given(items=st.lists(_ITEMS, min_size=1, max_size=12), batch_size=st.integers(1, 5))
def test_batches_are_np_stack_of_their_items_or_a_load_error(transport, items, batch_size):
    _check_against_np_stack(items, batch_size, TRANSPORTS[transport])


# Every example starts worker processes: a fifth of the profile's examples.
@settings(max_examples=max(5, settings().max_examples // 5))
@given(items=st.lists(_ITEMS, min_size=1, max_size=12), batch_size=st.integers(1, 5))
def test_process_batches_are_np_stack_of_their_items_or_a_load_error(items, batch_size):
    _check_against_np_stack(items, batch_size, TRANSPORTS["processes"])


# Leaf kinds and the collate value a plan is given.


def _plan(data, batch_size, collate=None):
    from fastload._loading.plan import make_plan
    from fastload._loading.schedule import Schedule

    return make_plan(data, Schedule(np.arange(6), batch_size, collate=collate))


def test_each_leaf_has_a_leaf_kind_and_the_binding_gets_it():
    from fastload._base.tree import LeafKind

    data = (np.zeros((6, 2)), Items([np.zeros(3)] * 6), Items(["a"] * 6))
    plan = _plan(data, 3)
    kinds = [leaf.kind for leaf in plan.leaves]
    assert kinds == [LeafKind.GATHER, LeafKind.INTO, LeafKind.OBJECT]
    assert [kind for kind, _ in plan.fields] == kinds
    assert [kind.native for kind in kinds] == [True, False, False]
    assert plan.has_python and plan.has_objects and plan.row_bytes[0] == 16


@pytest.mark.parametrize("transport", list(TRANSPORTS))
def test_a_collate_function_is_the_plans_value_not_a_patched_method(transport):
    from fastload._base.collate import Collate

    def pairs(observations):
        return [tuple(o) for o in observations]

    data = np.arange(12).reshape(6, 2)
    plan = _plan(data, 4, collate=pairs)
    assert plan.collate == Collate(pairs)
    assert "assemble" not in vars(plan)  # assembled by the class, forming with the value
    batches = _load(data, 4, collate=pairs, **TRANSPORTS[transport])
    assert batches == [[(0, 1), (2, 3), (4, 5), (6, 7)], [(8, 9), (10, 11)]]


def test_each_step_plan_has_its_own_fields_and_row_bytes():
    # The binding and the ring read these lists: one plan's are not another's.
    schedule = Schedule(np.arange(0), 4)
    a, b = make_plan(np.zeros((6, 2)), schedule), make_plan(np.zeros((6, 2)), schedule)
    assert isinstance(a, StepPlan) and a.fields == b.fields and a.row_bytes == b.row_bytes
    assert a.fields is not b.fields and a.row_bytes is not b.row_bytes
    assert "fields" not in vars(StepPlan) and "row_bytes" not in vars(StepPlan)
