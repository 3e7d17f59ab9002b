"""Lazy views (fastload.views): what each selects, and that every view keeps the container
protocol: numobs, getobs and getobs_into agree, and getobs_into fills the caller's buffer."""

import numpy as np
import pytest
from helpers import assert_fills, assert_tree_equal, stacked
from hypothesis import given
from hypothesis import strategies as st

from fastload import (
    LoadError,
    batchview,
    getobs,
    getobs_into,
    joinobs,
    kfolds,
    mapobs,
    numobs,
    obsview,
    randobs,
    shuffleobs,
    splitobs,
)

N = 12
X2 = np.arange(N * 3, dtype=np.float32).reshape(N, 3)
X1 = np.arange(N, dtype=np.int64) * 10


def tree_map(f, x):
    if isinstance(x, dict):
        return {k: tree_map(f, v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(tree_map(f, v) for v in x)
    return f(x)


def double(x):
    return tree_map(lambda a: a * 2, x)


DATA = {"matrix": X2, "vector": X1, "tuple": (X2, X1), "dict": {"x": X2, "y": X1}}

# Each view: (build(data) -> view, rows(n) -> positions in data that the view's rows are,
# per-row transform of the values).
VIEWS = {
    "obsview-list": (lambda d: obsview(d, [3, 1, 4, 1, 5, -1]), np.array([3, 1, 4, 1, 5, N - 1])),
    "obsview-all": (lambda d: obsview(d), np.arange(N)),
    "obsview-slice": (lambda d: obsview(d, slice(2, 11, 3)), np.arange(2, 11, 3)),
    "obsview-range": (lambda d: obsview(d, range(N - 1, 0, -2)), np.arange(N - 1, 0, -2)),
    "shuffleobs": (lambda d: shuffleobs(d, seed=3), None),
    "splitobs-train": (lambda d: splitobs(d, 0.75)[0], np.arange(9)),
    "splitobs-test": (lambda d: splitobs(d, 0.75)[1], np.arange(9, N)),
    "kfolds-train": (lambda d: kfolds(d, 3)[1][0], np.r_[0:4, 8:12]),
    "kfolds-validation": (lambda d: kfolds(d, 3)[1][1], np.arange(4, 8)),
    "mapobs": (lambda d: mapobs(double, d), np.arange(N)),
    "joinobs": (lambda d: joinobs(d, obsview(d, [0, 1])), np.r_[0:N, 0:2]),
    "nested": (
        lambda d: mapobs(double, obsview(joinobs(obsview(d, [5, 6]), d), range(1, 9))),
        np.r_[6, 0:7],
    ),
}
DOUBLED = {"mapobs", "nested"}


def expected_rows(name, data, rows_idx):
    build, rows = VIEWS[name]
    if rows is None:  # a seeded shuffle: its rows are what it shows of 0..N-1
        rows = np.asarray(getobs(build(np.arange(N)), slice(None)))
    values = getobs(data, rows[rows_idx])
    return double(values) if name in DOUBLED else values


def _empty_like(x):
    if isinstance(x, dict):
        return {k: _empty_like(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_empty_like(v) for v in x)
    return np.full(np.shape(x), 99, np.asarray(x).dtype)


@st.composite
def view_index(draw, n):
    kind = draw(st.sampled_from(["int", "list", "array", "slice"]))
    if kind == "int":
        return draw(st.integers(-n, n - 1))
    if kind == "slice":
        start = draw(st.integers(0, n - 1))
        return slice(start, draw(st.integers(start + 1, n)))
    values = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=6))
    return values if kind == "list" else np.array(values)


@pytest.mark.parametrize("data_kind", list(DATA))
@pytest.mark.parametrize("view_name", list(VIEWS))
@given(st.data())
def test_every_view_agrees_on_numobs_getobs_and_getobs_into_and_fills_the_buffer(
    view_name, data_kind, data
):
    build, _ = VIEWS[view_name]
    container = DATA[data_kind]
    view = build(container)
    n = numobs(view)
    assert n == len(expected_rows(view_name, np.arange(N), slice(None)))
    index = data.draw(view_index(n))
    positions = np.arange(n)[index]
    expected = expected_rows(view_name, container, positions)

    assert_tree_equal(stacked(getobs(view, index)), expected)
    buffer = _empty_like(expected)
    result = getobs_into(buffer, view, index)
    assert_tree_equal(result, expected)
    assert_fills(result, buffer)


def test_obsview_rejects_a_single_int_index():
    with pytest.raises(TypeError):
        obsview(X2, 3)


@pytest.mark.parametrize("n", [0, 1, 7, 100])
def test_shuffleobs_with_a_seed_is_a_reproducible_permutation(n):
    data = np.arange(n)
    a, b = shuffleobs(data, seed=11), shuffleobs(data, seed=11)
    assert getobs(a, slice(None)).tolist() == getobs(b, slice(None)).tolist()
    assert sorted(getobs(a, slice(None)).tolist()) == list(range(n))
    if n == 100:
        assert getobs(a, slice(None)).tolist() != list(range(n))
        assert (
            getobs(a, slice(None)).tolist()
            != getobs(shuffleobs(data, seed=12), slice(None)).tolist()
        )


@pytest.mark.parametrize(
    "n, at, sizes",
    [
        (10, 0.8, (8, 2)),
        (10, 0.5, (5, 5)),
        (10, (0.2, 0.3), (2, 3, 5)),
        (7, (0.5, 0.5), (4, 3, 0)),
        (3, 0.1, (0, 3)),
    ],
)
def test_splitobs_sizes_follow_the_fractions_and_cover_everything_in_order(n, at, sizes):
    parts = splitobs(np.arange(n), at=at)
    assert tuple(numobs(p) for p in parts) == sizes
    assert np.concatenate([getobs(p, slice(None)) for p in parts]).tolist() == list(range(n))


def test_splitobs_with_shuffle_is_a_seeded_partition():
    parts = splitobs(np.arange(50), at=(0.6, 0.2), shuffle=True, seed=5)
    values = np.concatenate([getobs(p, slice(None)) for p in parts])
    again = np.concatenate(
        [
            getobs(p, slice(None))
            for p in splitobs(np.arange(50), at=(0.6, 0.2), shuffle=True, seed=5)
        ]
    )
    assert [numobs(p) for p in parts] == [30, 10, 10]
    assert sorted(values.tolist()) == list(range(50))
    assert values.tolist() != list(range(50))
    assert values.tolist() == again.tolist()


@pytest.mark.parametrize("at", [11, -1, True, 1.5, -0.2, (0.6, 0.6), (), (0.5, 2), (6, 5)])
def test_splitobs_with_bad_fractions_or_counts_raises_value_error(at):
    with pytest.raises(ValueError):
        splitobs(np.arange(10), at=at)


@pytest.mark.parametrize("n, k", [(10, 2), (10, 3), (10, 10), (7, 4)])
def test_kfolds_validate_on_every_index_exactly_once_and_train_on_the_rest(n, k):
    folds = kfolds(np.arange(n), k)
    assert len(folds) == k
    validated = []
    for train, validation in folds:
        t, v = getobs(train, slice(None)).tolist(), getobs(validation, slice(None)).tolist()
        assert sorted(t + v) == list(range(n))
        assert len(v) in (n // k, -(-n // k))
        validated += v
    assert sorted(validated) == list(range(n))


@pytest.mark.parametrize("k", [1, 0, 11, 2.5, "3"])
def test_kfolds_with_bad_k_raises_value_error(k):
    with pytest.raises(ValueError):
        kfolds(np.arange(10), k)


def test_randobs_with_a_seed_is_reproducible_and_from_the_data():
    draws = [randobs(X2, seed=s) for s in range(20)]
    assert all(any(np.array_equal(d, row) for row in X2) for d in draws)
    assert np.array_equal(randobs(X2, seed=4), randobs(X2, seed=4))
    assert len({tuple(d.tolist()) for d in draws}) > 1
    with pytest.raises(ValueError):
        randobs(X2[:0])


def test_mapobs_applies_the_function_once_per_observation():
    calls = []

    def f(x):
        calls.append(int(x))
        return x + 1

    view = mapobs(f, X1)
    assert numobs(view) == N
    assert getobs(view, 3) == X1[3] + 1
    assert_tree_equal(getobs(view, [0, 2, 2]), X1[[0, 2, 2]] + 1)
    assert calls == [X1[3], X1[0], X1[2], X1[2]]


def test_mapobs_stacks_array_results_keeps_lists_of_other_results_and_rejects_ragged_ones():
    vectors = mapobs(lambda x: {"v": np.full(2, x), "s": (x, float(x))}, X1)
    assert_tree_equal(
        getobs(vectors, [1, 2]),
        {
            "v": np.stack([np.full(2, X1[1]), np.full(2, X1[2])]),
            "s": (X1[[1, 2]], X1[[1, 2]].astype(float)),
        },
    )
    assert getobs(mapobs(str, X1), [0, 1]) == ["0", "10"]
    with pytest.raises(ValueError, match="collate=False"):
        getobs(mapobs(lambda x: np.zeros(int(x) // 10 + 1), X1), [0, 1])


def test_mapobs_rejects_a_non_callable():
    with pytest.raises(TypeError):
        mapobs(3, X1)


def test_joinobs_concatenates_containers_of_different_sizes():
    view = joinobs(X1[:3], X1[5:6], X1[:0], X1[8:])
    assert numobs(view) == 3 + 1 + 0 + 4
    assert [int(getobs(view, i)) for i in range(numobs(view))] == X1[
        [0, 1, 2, 5, 8, 9, 10, 11]
    ].tolist()
    assert int(getobs(view, -1)) == X1[-1]
    with pytest.raises(IndexError):
        getobs(view, 8)


@pytest.mark.parametrize(
    "n, size, drop_last",
    [(10, 3, False), (10, 3, True), (9, 3, False), (2, 5, False), (2, 5, True), (0, 4, False)],
)
def test_batchview_sizes_and_drop_last(n, size, drop_last):
    view = batchview(np.arange(n), size, drop_last=drop_last)
    batches = [getobs(view, b).tolist() for b in range(numobs(view))]
    expected = [list(range(s, min(s + size, n))) for s in range(0, n, size)]
    if drop_last:
        expected = [b for b in expected if len(b) == size]
    assert batches == expected


@pytest.mark.parametrize("size", [0, -1, 2.0])
def test_batchview_with_a_bad_batch_size_raises_value_error(size):
    with pytest.raises(ValueError):
        batchview(X1, size)


def test_batchview_collate_none_true_false_and_callable():
    data = (X2, X1)
    rows = [1, 2, 3]
    assert_tree_equal(getobs(batchview(data, 3), 1), (X2[3:6], X1[3:6]))
    assert_tree_equal(getobs(batchview(data, 3, collate=True), 1), (X2[3:6], X1[3:6]))
    assert_tree_equal(
        getobs(batchview(data, 3, collate=False), 0), [(X2[i], X1[i]) for i in range(3)]
    )
    assert getobs(batchview(data, 3, collate=len), 0) == 3
    dicts = [{"a": np.full(2, i), "b": i} for i in rows]
    assert_tree_equal(
        getobs(batchview(dicts, 2, collate=True), 0),
        {"a": np.array([[1, 1], [2, 2]]), "b": np.array([1, 2])},
    )
    with pytest.raises(TypeError):
        batchview(data, 3, collate="stack")


@pytest.mark.parametrize("collate", [None, True])
@pytest.mark.parametrize("data_kind", list(DATA))
def test_batchview_getobs_into_fills_the_buffer_including_the_partial_last_batch(
    collate, data_kind
):
    data = DATA[data_kind]
    view = batchview(data, 5, collate=collate)
    buffer = _empty_like(getobs(view, 0))
    for b in range(numobs(view)):
        expected = getobs(view, b)
        result = getobs_into(buffer, view, b)
        assert_tree_equal(result, expected)
        assert_fills(result, buffer)


def test_a_batched_function_that_raises_on_an_empty_batch_gives_the_load_error():
    def fails(batch):
        raise RuntimeError("no")

    with pytest.raises(LoadError, match="no") as info:
        getobs(mapobs(fails, np.arange(5), batched=True), [])
    assert info.value.index is None


# One collate value, one step count.


@pytest.mark.parametrize("bad", ["stack", 1, 0, [], np.bool_(True)])
def test_a_collate_that_is_not_none_a_flag_or_a_callable_is_refused_at_every_edge(bad):
    from fastload import DataLoader, eachobs
    from fastload._base.collate import Collate

    message = "collate must be None, True, False or a callable, got"
    for make in (
        lambda: Collate.of(bad),
        lambda: batchview(X1, 4, collate=bad),
        lambda: DataLoader(X1, 4, collate=bad),
        lambda: eachobs(X1, batch_size=4, collate=bad),
        lambda: eachobs(X1, collate=bad),  # single observations: checked all the same
    ):
        with pytest.raises(TypeError, match=message):
            make()


def test_collate_forms_a_batch_as_its_option_says():
    from fastload._base.collate import Collate

    obs = [np.arange(2), np.arange(2) + 5]
    assert Collate.of(None).by_getobs and not Collate.of(None).whole
    np.testing.assert_array_equal(Collate.of(None).form(obs), [[0, 1], [5, 6]])
    assert Collate.of(True).stacks and not Collate.of(True).whole
    np.testing.assert_array_equal(Collate.of(True).form(obs), [[0, 1], [5, 6]])
    assert Collate.of(True).form([]) == []
    assert Collate.of(False).whole and Collate.of(False).form(obs) is obs
    assert Collate.of(len).whole and Collate.of(len).form(obs) == 2
    assert Collate.of(Collate.of(len)) == Collate.of(len)


def test_worker_processes_collect_lists_for_a_collate_function():
    from fastload._base.collate import Collate

    assert Collate.of(len).in_workers() == Collate(False)
    for option in (None, True, False):
        assert Collate.of(option).in_workers() == Collate.of(option)


def test_a_collate_function_runs_on_the_whole_batch_in_the_loader():
    from fastload import DataLoader

    batches = list(DataLoader(X1, 5, collate=lambda obs: ("n", len(obs)), parallel=2))
    assert batches == [("n", 5), ("n", 5), ("n", 2)]


@given(st.integers(0, 200), st.integers(1, 50))
def test_steps_is_the_ceiling_or_the_floor_of_n_over_rows(n, rows):
    from fastload.views import steps

    assert steps(n, rows, drop_last=True) == n // rows
    assert steps(n, rows, drop_last=False) == len(range(0, n, rows))


@pytest.mark.parametrize(
    "n, rows, drop_last, expected",
    [
        (12, 4, False, 3),
        (12, 4, True, 3),
        (13, 4, False, 4),
        (13, 4, True, 3),
        (0, 4, False, 0),
        (0, 4, True, 0),
        (3, 4, True, 0),
        (3, 4, False, 1),
    ],
)
def test_steps_of_whole_and_partial_batches(n, rows, drop_last, expected):
    from fastload import DataLoader
    from fastload._loading.schedule import Schedule
    from fastload.views import steps

    assert steps(n, rows, drop_last) == expected
    assert numobs(batchview(np.arange(n), rows, drop_last=drop_last)) == expected
    assert Schedule(np.arange(n), rows, drop_last=drop_last).steps == expected
    if n:
        assert len(DataLoader(np.arange(n), rows, drop_last=drop_last)) == expected


def test_all_lists_the_users_names_and_the_helpers_stay_importable():
    import fastload
    import fastload.views as views

    functions = [name for name in views.__all__ if name[0].islower()]
    assert all(name in fastload.__all__ for name in functions)
    assert not {"collate_batch", "source_of", "steps"} & set(views.__all__)
    assert all(callable(getattr(views, name)) for name in ("collate_batch", "source_of", "steps"))
