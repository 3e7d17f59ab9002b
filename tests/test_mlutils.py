"""MLUtils.jl's data API in fastload: each test mirrors the examples of the MLUtils
docstring it names (MLUtils counts from 1, fastload from 0), then checks that the views
stay lazy index views that a loader gathers natively over arrays."""

import numpy as np
import pytest
from helpers import assert_tree_equal, copy_tree
from hypothesis import given
from hypothesis import strategies as st

from fastload import (
    DataLoader,
    batchview,
    chunk,
    eachobs,
    eachobs_parallel,
    filterobs,
    getobs,
    getobs_into,
    group_counts,
    groupobs,
    kfolds,
    leavepout,
    mapobs,
    numobs,
    obsview,
    oversample,
    randobs,
    shuffleobs,
    slidingwindow,
    splitobs,
    timeseries_kfolds,
    undersample,
)
from fastload._base.tree import LeafKind
from fastload._loading.plan import ItemPlan, make_plan
from fastload._loading.schedule import schedule_of
from fastload.views import ObsView


def values(view):
    return getobs(view).tolist()


def gathers_natively(view):
    """True when a loader over ``view`` gathers every leaf natively (no Python per item)."""
    plan = make_plan(*schedule_of(batchview(view, 4)))
    return isinstance(plan, ItemPlan) and all(leaf.kind is LeafKind.GATHER for leaf in plan.leaves)


def loads_like_getobs(view):
    """Every batch of a parallel loader over ``view`` equals getobs of its positions."""
    got = [copy_tree(b) for b in DataLoader(view, 4, parallel=2)]
    n = numobs(view)
    assert_tree_equal(got, [getobs(view, range(s, min(s + 4, n))) for s in range(0, n, 4)])


def test_filterobs_keeps_the_observations_f_accepts():
    """MLUtils ``filterobs``: ``data = 1:10; fdata = filterobs(>(5), data);
    numobs(fdata) == 5``."""
    data = np.arange(1, 11)
    fdata = filterobs(lambda x: x > 5, data)
    assert numobs(data) == 10 and numobs(fdata) == 5
    assert values(fdata) == [6, 7, 8, 9, 10]
    assert isinstance(fdata, ObsView) and gathers_natively(fdata)
    loads_like_getobs(filterobs(lambda obs: obs[1] % 2 == 0, (np.arange(10.0), np.arange(10))))


def test_groupobs_splits_by_the_value_of_f():
    """MLUtils ``groupobs``: ``data = -10:10; datas = groupobs(>(0), data);
    length(datas) == 2``."""
    datas = groupobs(lambda x: x > 0, np.arange(-10, 11))
    assert len(datas) == 2
    assert list(datas) == [False, True]  # plain bools, in order of appearance
    assert values(datas[True]) == list(range(1, 11))
    assert values(datas[False]) == list(range(-10, 1))
    assert gathers_natively(datas[True])


def test_oversample_repeats_the_smaller_classes():
    """MLUtils ``oversample``: 6 observations, ``Y = ["a", "b", "b", "b", "b", "a"]``;
    ``X_bal, Y_bal = oversample(X, Y)`` has 8 observations, 4 of "a" and 4 of "b"."""
    X = np.random.default_rng(0).random((6, 3))
    Y = np.array(["a", "b", "b", "b", "b", "a"])
    X_bal, Y_bal = getobs(oversample((X, Y), seed=1))
    assert X_bal.shape == (8, 3) and len(Y_bal) == 8
    assert (Y_bal == "a").sum() == 4 and (Y_bal == "b").sum() == 4
    assert all(any(np.array_equal(row, x) for x in X) for row in X_bal)
    same = oversample(X, Y, seed=1)
    assert values(same) == X_bal.tolist()  # classes= is the tuple's last member
    unshuffled = oversample(np.arange(6), Y, shuffle=False, seed=1)
    assert values(unshuffled)[:6] == list(range(6)) and set(values(unshuffled)[6:]) == {0, 5}
    assert getobs(oversample(X, Y, fraction=0.5, seed=2)).shape == (6, 3)  # "a" already 2
    assert gathers_natively(oversample((X, Y), seed=1))


def test_undersample_keeps_as_many_of_each_class_as_the_smallest_has():
    """MLUtils ``undersample``: the same 6 observations give ``X_bal`` with 4 observations,
    2 of "a" and 2 of "b"."""
    X = np.random.default_rng(0).random((6, 3))
    Y = np.array(["a", "b", "b", "b", "b", "a"])
    X_bal, Y_bal = getobs(undersample((X, Y), seed=1))
    assert X_bal.shape == (4, 3) and len(Y_bal) == 4
    assert (Y_bal == "a").sum() == 2 and (Y_bal == "b").sum() == 2
    ordered = values(undersample(np.arange(6), Y, shuffle=False, seed=1))
    assert ordered == sorted(ordered) and {0, 5} <= set(ordered)
    with pytest.raises(ValueError):
        undersample(X)  # no labels


def test_slidingwindow_gives_windows_of_adjacent_observations():
    """MLUtils ``slidingwindow``: ``s = slidingwindow(11:30, size=6)``: ``s[1] == 11:16``,
    ``s[2] == 12:17``, ``getobs(s, [1, 2])`` the first two windows; with ``stride=3`` the
    windows are 11:16, 14:19, 17:22, 20:25 and 23:28."""
    s = slidingwindow(np.arange(11, 31), size=6)
    assert numobs(s) == 15
    assert getobs(s, 0).tolist() == list(range(11, 17))
    assert getobs(s, 1).tolist() == list(range(12, 18))
    assert getobs(s, [0, 1]).tolist() == [list(range(11, 17)), list(range(12, 18))]
    strided = slidingwindow(np.arange(11, 31), size=6, stride=3)
    assert [w.tolist()[0] for w in strided] == [11, 14, 17, 20, 23]
    assert [w.tolist()[-1] for w in strided] == [16, 19, 22, 25, 28]
    frames = (np.arange(40.0).reshape(20, 2), np.arange(20))
    assert gathers_natively(slidingwindow(frames, 5, 2))
    loads_like_getobs(slidingwindow(frames, 5, 2))
    words = slidingwindow([f"w{i}" for i in range(5)], 2)  # a list: windows are lists
    assert getobs(words, 3) == ["w3", "w4"]
    for bad in ({"size": 0}, {"size": 21}, {"size": 2, "stride": 0}):
        with pytest.raises(ValueError):
            slidingwindow(frames, **bad)


def test_chunk_splits_into_n_parts_or_parts_of_a_size():
    """MLUtils ``chunk``: ``chunk(1:10, 3)`` is 1:4, 5:8, 9:10; ``chunk(1:10; size = 2)``
    five parts of two; ``chunk(1:6; size = [2, 4])`` is 1:2, 3:6."""
    assert [values(c) for c in chunk(np.arange(1, 11), 3)] == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]
    assert [values(c) for c in chunk(np.arange(1, 11), size=2)] == [
        [1, 2],
        [3, 4],
        [5, 6],
        [7, 8],
        [9, 10],
    ]
    assert [values(c) for c in chunk(np.arange(1, 7), size=[2, 4])] == [[1, 2], [3, 4, 5, 6]]
    assert gathers_natively(chunk((np.arange(10), np.ones((10, 2))), 3)[1])
    for bad in ({"n": 0}, {"size": [2, 3]}, {"n": 2, "size": 2}, {}):
        with pytest.raises(ValueError):
            chunk(np.arange(6), **bad)


def test_group_counts_counts_each_value():
    """MLUtils ``group_counts``: ``group_counts(['a', 'b', 'b'])`` is
    ``Dict('a' => 1, 'b' => 2)``."""
    assert group_counts(["a", "b", "b"]) == {"a": 1, "b": 2}
    assert group_counts(np.array([3, 1, 3, 3])) == {3: 3, 1: 1}


def test_kfolds_validates_on_consecutive_folds():
    """MLUtils ``kfolds(10, 5)``: validation 1:2, 3:4, 5:6, 7:8, 9:10; training
    [3, ..., 10], [1, 2, 5, ..., 10], ..., [1, ..., 8]."""
    folds = kfolds(np.arange(1, 11), 5)
    assert [values(v) for _, v in folds] == [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]]
    assert values(folds[0][0]) == [3, 4, 5, 6, 7, 8, 9, 10]
    assert values(folds[1][0]) == [1, 2, 5, 6, 7, 8, 9, 10]
    assert values(folds[4][0]) == [1, 2, 3, 4, 5, 6, 7, 8]
    # n not divisible by k: the first n % k folds are one larger, as in MLUtils
    assert [numobs(v) for _, v in kfolds(np.arange(10), 3)] == [4, 3, 3]
    assert all(gathers_natively(part) for fold in folds for part in fold)


def test_kfolds_shuffled_and_stratified():
    """MLUtils ``kfolds(X, k=5, stratified=y)``: each validation set keeps the label
    proportions of ``y``; ``shuffle=true`` assigns observations to folds at random."""
    y = np.array([0] * 10 + [1] * 5)
    folds = kfolds(np.arange(15), 5, stratified=y)
    for train, validation in folds:
        assert sorted(y[values(validation)].tolist()) == [0, 0, 1]
        assert sorted(values(train) + values(validation)) == list(range(15))
    shuffled = kfolds(np.arange(15), 5, shuffle=True, seed=3, stratified=y)
    assert [values(v) for _, v in shuffled] == [
        values(v) for _, v in kfolds(np.arange(15), 5, shuffle=True, seed=3, stratified=y)
    ]
    assert [values(v) for _, v in shuffled] != [values(v) for _, v in folds]
    assert sorted(np.concatenate([values(v) for _, v in shuffled])) == list(range(15))
    with pytest.raises(ValueError, match="label 1"):
        kfolds(np.arange(15), 6, stratified=y)


def test_leavepout_makes_folds_of_p():
    """MLUtils ``leavepout(10, 2)``: the folds of ``kfolds(10, 5)``; ``p = 1`` is
    leave-one-out."""
    folds = leavepout(np.arange(1, 11), 2)
    assert [values(v) for _, v in folds] == [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]]
    assert [numobs(v) for _, v in leavepout(np.arange(11), 2)] == [3, 2, 2, 2, 2]
    assert len(leavepout(np.arange(4))) == 4
    with pytest.raises(ValueError):
        leavepout(np.arange(10), 6)


@pytest.mark.parametrize(
    "n, at, sizes",
    [
        (100, 0.7, (70, 30)),  # splitobs(100, at=0.7) == (1:70, 71:100)
        (100, (0.1, 0.4), (10, 40, 50)),  # splitobs(100, at=(0.1, 0.4)) == (1:10, 11:50, 51:100)
        (15, (0.2, 0.3), (3, 4, 8)),  # the second fraction rounds on what is left
        (7, (0.5, 0.5), (4, 3, 0)),  # half to even: round(3.5) == 4
        (100, 1, (1, 99)),
        (100, 1.0, (100, 0)),
        (100, 0, (0, 100)),
        (100, 0.0, (0, 100)),
        (15, (3, 4), (3, 4, 8)),
        (10, (0.5, 0.0), (5, 0, 5)),
    ],
)
def test_splitobs_sizes_follow_mlutils(n, at, sizes):
    """MLUtils ``splitobs``: ``splitobs(100, at=0.7)``, ``splitobs(100, at=(0.1, 0.4))``;
    an integer ``at`` is a number of observations (``at=1`` is one, ``at=1.0`` all)."""
    parts = splitobs(np.arange(n), at=at)
    assert tuple(numobs(p) for p in parts) == sizes
    assert np.concatenate([getobs(p) for p in parts]).tolist() == list(range(n))


def test_splitobs_shuffled_tuple_stays_aligned_and_stratified_keeps_proportions():
    """MLUtils ``splitobs``: ``train, test = splitobs((reshape(1.0:100.0, 1, :), 101:200),
    at=0.7, shuffle=true)``; ``vec(test[1]) .+ 100 == test[2]``."""
    train, test = splitobs(
        (np.arange(1.0, 101.0), np.arange(101, 201)), at=0.7, shuffle=True, seed=0
    )
    x, y = getobs(test)
    assert numobs(train) == 70 and numobs(test) == 30
    assert (x + 100 == y).all() and x.tolist() != sorted(x.tolist())
    assert gathers_natively(train)
    labels = np.array([0] * 80 + [1] * 20)
    train, test = splitobs(np.arange(100), at=0.75, stratified=labels)
    assert (labels[values(train)] == 1).sum() == 15 and (labels[values(test)] == 1).sum() == 5
    assert values(train) == sorted(values(train))


@given(
    n=st.integers(0, 40),
    fractions=st.lists(st.floats(0, 0.5), min_size=1, max_size=3),
    classes=st.integers(1, 4),
    shuffle=st.booleans(),
    seed=st.integers(0, 3),
)
def test_every_split_partitions_the_observations(n, fractions, classes, shuffle, seed):
    """Property: ``splitobs`` (plain or stratified) and ``kfolds`` place every observation
    in exactly one subset (validation view), whatever the fractions."""
    at = tuple(f / max(1.0, sum(fractions)) for f in fractions)
    labels = np.arange(n) % classes
    for stratified in (None, labels):
        parts = splitobs(np.arange(n), at=at, shuffle=shuffle, seed=seed, stratified=stratified)
        assert len(parts) == len(at) + 1
        assert sorted(np.concatenate([getobs(p) for p in parts]).tolist()) == list(range(n))
    if n >= 2:
        k = min(n, 3)
        folds = kfolds(np.arange(n), k, shuffle=shuffle, seed=seed)
        assert sorted(np.concatenate([getobs(v) for _, v in folds]).tolist()) == list(range(n))


def test_randobs_draws_one_observation_or_a_batch_of_n():
    """MLUtils ``randobs(data, [n])``: a random observation, or a batch of ``n``."""
    X = np.arange(30).reshape(10, 3)
    one, batch = randobs(X, seed=1), randobs(X, 5, seed=1)
    assert one.shape == (3,) and batch.shape == (5, 3)
    assert all(row.tolist() in X.tolist() for row in batch)
    np.random.seed(123)  # the global generator plays no part
    assert np.array_equal(randobs(X, 5, seed=1), batch)
    assert not np.array_equal(randobs(X, 5, seed=2), batch)


def test_mapobs_with_a_function_of_an_observation():
    """MLUtils ``mapobs``: ``data = (a=[1,2,3], b=[1,2,3])``, ``mdata = mapobs(x -> (c =
    x.a .+ x.b, d = x.a .- x.b), data)``: ``mdata[1] == (c = 2, d = 0)`` and
    ``mdata[1:2] == (c = [2, 4], d = [0, 0])``."""
    data = {"a": np.array([1, 2, 3]), "b": np.array([1, 2, 3])}
    mdata = mapobs(lambda x: {"c": x["a"] + x["b"], "d": x["a"] - x["b"]}, data)
    assert getobs(mdata, 0) == {"c": 2, "d": 0}
    assert_tree_equal(getobs(mdata, [0, 1]), {"c": np.array([2, 4]), "d": np.array([0, 0])})


def test_mapobs_with_named_functions_and_a_tuple_of_functions():
    """MLUtils ``mapobs``: ``nameddata = mapobs((x = sqrt, y = log), 1:10)``:
    ``getobs(nameddata, 10) == (x = sqrt(10), y = log(10))`` and ``getobs(nameddata.x, 10)
    == sqrt(10)``; ``mapobs(fs::Tuple, data)`` is a tuple of containers."""
    data = np.arange(1.0, 11.0)
    nameddata = mapobs({"x": np.sqrt, "y": np.log}, data)
    assert getobs(nameddata, 9) == {"x": np.sqrt(10.0), "y": np.log(10.0)}
    assert getobs(nameddata["x"], 9) == np.sqrt(10.0)
    square, half = mapobs((np.square, lambda v: v / 2), data)
    assert getobs(square, 2) == 9.0 and getobs(half, 2) == 1.5
    batch = next(iter(DataLoader(nameddata, 4)))
    assert_tree_equal(batch, {"x": np.sqrt(data[:4]), "y": np.log(data[:4])})


def test_mapobs_batched_calls_a_vectorised_function_once_per_batch():
    """MLUtils ``mapobs(f, data; batched=:always)``: ``f`` is always called on a batch;
    ``mdata[idx]`` is ``getobs(f(getobs(data, [idx])), 1)``."""
    calls = []

    def scale(batch):
        calls.append(len(batch))
        return batch * 10

    mdata = mapobs(scale, np.arange(10), batched=True)
    assert getobs(mdata, 3) == 30 and calls == [1]
    assert getobs(mdata, [1, 2]).tolist() == [10, 20] and calls == [1, 2]
    calls.clear()
    assert [b.tolist() for b in DataLoader(mdata, 4)] == [
        [0, 10, 20, 30],
        [40, 50, 60, 70],
        [80, 90],
    ]
    assert calls == [4, 4, 2]


def test_getobs_without_an_index_gives_all_observations():
    """MLUtils ``getobs(data)``: every observation of a container, materialised."""
    X = np.arange(12).reshape(6, 2)
    assert getobs(obsview(X, [4, 1])).tolist() == [[8, 9], [2, 3]]
    assert_tree_equal(getobs((X, X[:, 0])), (X, X[:, 0]))


def test_views_compose_and_stay_index_remaps():
    X = np.arange(60.0).reshape(30, 2)
    y = np.arange(30) % 3
    composed = oversample(filterobs(lambda obs: obs[1] != 2, shuffleobs((X, y), seed=0)), seed=1)
    assert gathers_natively(composed)
    loads_like_getobs(composed)
    train, _ = splitobs(chunk((X, y), 2)[1], at=0.5)
    assert gathers_natively(train)
    assert getobs(train)[1].tolist() == y[15:23].tolist()  # round(7.5) == 8


# MLUtils' test/eachobs.jl and test/dataloader.jl: X holds 15 observations of 4 features
# (MLUtils puts them in the columns of a 4x15 matrix, fastload in the rows of a 15x4 one).
X = np.random.default_rng(0).random((15, 4))


def test_eachobs_parallel_takes_buffered_as_the_design_names_it():
    """The design's ``eachobs_parallel(data, buffered=True)``: views into a reused slot;
    ``buffered=False`` yields values the caller owns."""
    assert [float(v) for v in eachobs_parallel(np.arange(8.0), buffered=True)] == list(
        map(float, range(8))
    )
    owned = list(eachobs_parallel(batchview(X, 4), buffered=False, parallel=2))
    assert_tree_equal(owned, [X[0:4], X[4:8], X[8:12], X[12:15]])
    with pytest.raises(TypeError, match="buffered=True or False"):
        eachobs_parallel(X, buffer=True)
    with pytest.raises(TypeError, match="buffered must be True or False"):
        eachobs_parallel(X, buffered="yes")


def test_eachobs_yields_each_observation_with_or_without_buffer():
    """``for (i, x) in enumerate(eachobs(X)) x == X[:, i]``, also with ``buffer=true``."""
    for buffer in (False, True):
        for i, x in enumerate(eachobs(X, buffer=buffer)):
            assert np.array_equal(x, X[i])


def test_eachobs_fills_a_buffer_of_the_users_in_place():
    """``b = zeros(size(X, 1)); for (i, x) in enumerate(eachobs(X, buffer=b)) x == X[:, i]``
    and afterwards ``b == X[:, end]``: each observation is written into ``b``."""
    b = np.zeros(4)
    for i, x in enumerate(eachobs(X, buffer=b)):
        assert x is b and np.array_equal(x, X[i])
    assert np.array_equal(b, X[-1])


@pytest.mark.parametrize("parallel", [False, 2])
def test_eachobs_with_batch_size_and_a_buffer_fills_it_with_each_batch(parallel):
    """``eachobs(X, batchsize=2, buffer=b, partial=false)`` with ``b = zeros(4, 2)``: every
    batch is ``b``, and afterwards ``b`` holds the last one."""
    b = np.zeros((2, 4))
    got = []
    for x in eachobs(X, batch_size=2, buffer=b, drop_last=True, parallel=parallel):
        assert x is b
        got.append(x.copy())
    assert_tree_equal(got, [X[2 * i : 2 * i + 2] for i in range(7)])
    assert np.array_equal(b, X[12:14])


def test_eachobs_batched_keeps_the_partial_last_batch():
    """``eachobs(X, batchsize=2, partial=true)``: seven batches of 2, then one of 1;
    ``buffer=true, partial=false``: seven of 2."""
    batches = [x.copy() for x in eachobs(X, batch_size=2)]
    assert [len(x) for x in batches] == [2] * 7 + [1]
    assert np.array_equal(batches[-1], X[14:15])
    buffered = [x.copy() for x in eachobs(X, batch_size=2, buffer=True, drop_last=True)]
    assert_tree_equal(buffered, [X[2 * i : 2 * i + 2] for i in range(7)])


def test_a_loader_buffer_of_a_tuple_gets_the_partial_batch_in_its_first_rows():
    """``DataLoader((X, y), batch_size=4, buffer=(bx, by))``: the last batch of 3 fills
    the first 3 rows and is yielded as views of them."""
    y = np.arange(15)
    bx, by = np.zeros((4, 4)), np.zeros(4, np.int64)
    batches = []
    for xb, yb in DataLoader((X, y), batch_size=4, buffer=(bx, by), shuffle=True, seed=1):
        assert np.shares_memory(xb, bx) and np.shares_memory(yb, by)
        batches.append((xb.copy(), yb.copy()))
    order = DataLoader((X, y), 4, shuffle=True, seed=1).order(0)
    assert_tree_equal(batches, [(X[order[s : s + 4]], y[order[s : s + 4]]) for s in (0, 4, 8, 12)])
    assert len(batches[-1][1]) == 3
    assert DataLoader(X, 2, buffer=np.zeros((2, 4))).buffer is True  # batches go to buffers


@pytest.mark.parametrize(
    "buffer, message",
    [
        (np.zeros((3, 4)), "batch_size=2"),
        (np.zeros((2, 5)), "shape"),
        (np.zeros((2, 4), np.float32), "dtype float32 where the steps have float64"),
        ((np.zeros((2, 4)), np.zeros(2)), "structure"),
        ([np.zeros((2, 4))], "numpy array"),
    ],
)
def test_a_buffer_that_does_not_fit_the_batches_is_a_clear_error(buffer, message):
    with pytest.raises((ValueError, TypeError), match=message):
        list(DataLoader(X, batch_size=2, buffer=buffer))


def test_eachobs_reshuffles_each_iteration_and_a_shuffled_view_does_not():
    """``eachobs(shuffleobs(1:50))`` gives the same order twice; ``eachobs(1:50,
    shuffle=true)`` (buffered, parallel or both) a new one each time."""
    shuffled = eachobs(shuffleobs(np.arange(50), seed=0))
    assert [int(v) for v in shuffled] == [int(v) for v in shuffled]
    for options in ({}, {"buffer": True}, {"parallel": True}, {"buffer": True, "parallel": 2}):
        reshuffled = eachobs(np.arange(50), shuffle=True, **options)
        first, second = [int(v) for v in reshuffled], [int(v) for v in reshuffled]
        assert first != second and sorted(first) == sorted(second) == list(range(50))


@pytest.mark.parametrize("batch_size", [None, 2])
@pytest.mark.parametrize("buffer", [False, True, "array"])
@pytest.mark.parametrize("parallel", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_eachobs_argument_combinations(batch_size, buffer, parallel, shuffle, drop_last):
    """MLUtils' "Argument combinations": every combination of batch size, buffer (a flag or
    a buffer of one batch), parallel, shuffle and partial iterates the whole epoch."""
    if buffer == "array":
        buffer = np.zeros((2, 4) if batch_size else (4,))
    loader = eachobs(
        X,
        batch_size=batch_size,
        buffer=buffer,
        parallel=parallel,
        shuffle=shuffle,
        drop_last=drop_last,
        seed=0,
    )
    rows = [np.atleast_2d(v).copy() for v in loader]
    expected = 14 if drop_last and batch_size else 15  # one at a time: nothing partial
    assert sum(len(r) for r in rows) == expected
    got = sorted(map(tuple, np.concatenate(rows).tolist()))
    assert set(got) <= set(map(tuple, X.tolist())) and len(set(got)) == expected


def test_eachobs_of_single_observations_refuses_a_collate_function():
    """A collate function would go uncalled with one observation per step: an error."""
    with pytest.raises(ValueError, match="batch_size"):
        eachobs(X, collate=lambda observations: observations)
    assert len(eachobs(X, drop_last=True, collate=False)) == 15


def test_parallel_zero_loads_in_the_callers_thread():
    """MLUtils' ``parallel`` is a flag; ``parallel=0`` (no threads) is sequential."""
    loader = DataLoader(X, 4, parallel=0)
    assert loader.parallel is False
    assert_tree_equal(list(loader), list(DataLoader(X, 4)))


def test_getobs_into_without_an_index_fills_every_observation():
    """MLUtils ``getobs!(buffer, data)``: all observations into the buffer."""
    buffer = (np.empty((15, 4)), np.empty(15, np.int64))
    filled = getobs_into(buffer, (X, np.arange(15)))
    assert filled[0] is buffer[0] and np.array_equal(buffer[0], X)
    assert buffer[1].tolist() == list(range(15))
    view = np.empty((5, 4))
    getobs_into(view, obsview(X, [4, 3, 2, 1, 0]))
    assert np.array_equal(view, X[4::-1])


def test_splitobs_of_an_int_gives_index_ranges():
    """MLUtils ``splitobs(10, at=0.7) == (1:7, 8:10)``, ``splitobs(10, at=(0.5, 0.3)) ==
    (1:5, 6:8, 9:10)``, ``numobs.(splitobs(150, at=(.1,.2,.3))) == (15, 30, 45, 60)``, and
    the parts of 150 sum to the positions' sum (11325 from 1, 11175 from 0)."""
    assert splitobs(10, at=0.7) == (range(0, 7), range(7, 10))
    assert splitobs(10, at=0.5) == (range(0, 5), range(5, 10))
    assert splitobs(10, at=(0.5, 0.3)) == (range(0, 5), range(5, 8), range(8, 10))
    assert splitobs(10, at=0.0) == (range(0, 0), range(0, 10))
    assert tuple(map(numobs, splitobs(150, at=0.7))) == (105, 45)
    assert tuple(map(numobs, splitobs(150, at=(0.2, 0.3)))) == (30, 45, 75)
    assert tuple(map(numobs, splitobs(150, at=(0.1, 0.2, 0.3)))) == (15, 30, 45, 60)
    for at in (0.1, (0.2, 0.1), (0.1, 0.4, 0.2)):
        assert sum(sum(part) for part in splitobs(150, at=at)) == 11175
    assert tuple(map(sum, splitobs(150, at=0.7))) == (5460, 5715)
    shuffled = splitobs(20, at=0.5, shuffle=True, seed=0)
    assert sorted(np.concatenate(shuffled).tolist()) == list(range(20))
    again = splitobs(20, at=0.5, shuffle=True, seed=0)
    assert [list(p) for p in shuffled] == [list(p) for p in again]
    with pytest.raises(ValueError):
        splitobs(-1, at=0.5)


def test_kfolds_and_leavepout_of_an_int_give_positions():
    """MLUtils ``kfolds(15, k=5)``: 5 folds of 12 training and 3 validation positions that
    together are 1:15; ``leavepout(15) == kfolds(15, k=15)``, ``leavepout(1:15, p=5)`` is
    ``kfolds(1:15, 3)``."""
    folds = kfolds(15, k=5)
    assert len(folds) == 5
    for train, validation in folds:
        assert len(train) == 12 and len(validation) == 3
        assert sorted([*train, *validation]) == list(range(15))
    same = [(list(t), list(v)) for t, v in kfolds(15, 5)]
    assert [(list(t), list(v)) for t, v in folds] == same
    assert [(list(t), list(v)) for t, v in leavepout(15)] == [
        (list(t), list(v)) for t, v in kfolds(15, k=15)
    ]
    assert [(values(t), values(v)) for t, v in leavepout(np.arange(1, 16), p=5)] == [
        (values(t), values(v)) for t, v in kfolds(np.arange(1, 16), 3)
    ]
    for (xtr, ytr), (xval, yval) in (
        (getobs(t), getobs(v)) for t, v in kfolds((np.arange(1, 16), np.arange(11, 26)), k=5)
    ):
        assert len(xtr) == len(ytr) == 12 and len(xval) == len(yval) == 3
        assert sorted([*xtr, *xval]) == list(range(1, 16))
        assert sorted([*ytr, *yval]) == list(range(11, 26))


def test_timeseries_kfolds_train_on_the_past_only():
    """Folds for ordered data: validation blocks of ``n // (k + 1)`` at the end, training
    on everything before each (growing windows), a ``gap`` left out between them and
    ``max_train_size`` keeping the latest."""
    folds = timeseries_kfolds(np.arange(12) * 10, 3)
    assert [(values(t), values(v)) for t, v in folds] == [
        ([0, 10, 20], [30, 40, 50]),
        ([0, 10, 20, 30, 40, 50], [60, 70, 80]),
        ([0, 10, 20, 30, 40, 50, 60, 70, 80], [90, 100, 110]),
    ]
    for train, validation in folds:
        assert max(values(train)) < min(values(validation))
        assert gathers_natively(train) and gathers_natively(validation)
    assert timeseries_kfolds(10, 3, gap=1, max_train_size=3) == [
        (range(0, 3), range(4, 6)),
        (range(2, 5), range(6, 8)),
        (range(4, 7), range(8, 10)),
    ]
    assert timeseries_kfolds(7, 2, test_size=3) == [
        (range(0, 1), range(1, 4)),
        (range(0, 4), range(4, 7)),
    ]
    for bad in ({"k": 0}, {"k": 3, "test_size": 4}, {"k": 2, "gap": 5}, {"k": 2, "test_size": 0}):
        with pytest.raises(ValueError):
            timeseries_kfolds(12, **bad)


def test_mapobs_batched_auto_calls_f_on_what_is_read():
    """MLUtils ``mapobs(f, data; batched=:auto)``: ``f`` gets the batch for several indices
    (once per batch in a loader) and the observation for one."""
    seen = []

    def f(x):
        seen.append(np.shape(x))
        return x * 2

    mdata = mapobs(f, np.arange(10), batched="auto")
    assert getobs(mdata, 3) == 6 and seen == [()]
    assert getobs(mdata, [1, 2]).tolist() == [2, 4] and seen[-1] == (2,)
    seen.clear()
    assert [b.tolist() for b in DataLoader(mdata, 4, parallel=2)] == [
        [0, 2, 4, 6],
        [8, 10, 12, 14],
        [16, 18],
    ]
    assert sorted(seen) == [(2,), (4,), (4,)]
    with pytest.raises(ValueError, match="'auto'"):
        mapobs(f, np.arange(3), batched="always")


@pytest.mark.parametrize("parallel", [False, 2])
def test_sparse_rows_are_observations_and_batches_stay_sparse(parallel):
    """A ``scipy.sparse`` CSR matrix is a container of its rows (MLUtils: a sparse
    matrix's columns); batches are sparse matrices of those rows."""
    sparse = pytest.importorskip("scipy.sparse")
    A = sparse.random(11, 7, density=0.3, format="csr", random_state=0)
    y = np.arange(11)
    assert numobs(A) == 11
    assert (getobs(A, [3, 1]) != A[[3, 1]]).nnz == 0
    loader = DataLoader((A, y), 4, shuffle=True, seed=2, parallel=parallel)
    order = loader.order(0)
    for k, (xb, yb) in enumerate(loader):
        assert sparse.issparse(xb) and xb.format == "csr"
        assert np.array_equal(xb.toarray(), A.toarray()[order[4 * k : 4 * k + 4]])
        assert yb.tolist() == order[4 * k : 4 * k + 4].tolist()
    assert loader.stats()["items"] == 11  # rows counted, though a sparse matrix has no len()
    _, test = splitobs(A, at=0.7)
    assert getobs(test).shape == (3, 7)
    dense = getobs_into(np.empty((11, 7)), A)
    assert np.array_equal(dense, A.toarray())
    with pytest.raises(TypeError, match="tocsr"):
        numobs(A.tocoo())


def test_shuffled_sparse_members_stay_aligned():
    """MLUtils' "Tuple of SparseArray": ``x1, y1 = getobs(shuffleobs((sparse(X1),
    sparse(Y1))))`` keeps every observation once, both members shuffled alike; a sparse
    vector's observations are its entries."""
    sparse = pytest.importorskip("scipy.sparse")
    X1 = np.tile(np.arange(1.0, 16.0)[:, None], (1, 10))  # observation i is i + 1 ten times
    Y1 = sparse.csr_array(np.arange(1.0, 16.0))
    x1, y1 = getobs(shuffleobs((sparse.csr_matrix(X1), Y1), seed=4))
    assert numobs(Y1) == 15 and sparse.issparse(x1) and sparse.issparse(y1)
    assert x1.sum(axis=0).tolist() == [[120.0] * 10] and y1.sum() == 120
    assert np.array_equal(x1.toarray()[:, 0], y1.toarray())
    assert y1.toarray().tolist() != sorted(y1.toarray().tolist())


def test_getobs_into_a_tuple_buffer_returns_it_and_fills_a_list_of_strings():
    """MLUtils ``getobs!((xbuf, ybuf), (X, y), 2:3) === (xbuf, ybuf)`` with ``ybuf =
    ["foo", "bar"]``: both filled in place; ``getobs!(nothing, y, 1)`` is ``getobs``; a
    buffer with a member too few is an error."""
    y = np.array([f"label{i}" for i in range(15)])
    xbuf, ybuf = np.zeros((2, 4)), ["foo", "bar"]
    buffer = (xbuf, ybuf)
    assert getobs_into(buffer, (X, y), [13, 4]) is buffer
    assert np.array_equal(xbuf, X[[13, 4]]) and ybuf == ["label13", "label4"]
    assert getobs_into(None, y, 1) == "label1"
    got = getobs_into((None, None), (X, y), range(1, 3))
    assert_tree_equal(got, getobs((X, y), range(1, 3)))
    with pytest.raises(ValueError, match="members"):
        getobs_into((xbuf,), (X, y), range(5))
    words = ["a", "b", "c"]
    assert getobs_into(words, y, range(2)) is words and words == ["label0", "label1"]


def test_a_loader_is_a_container_of_its_next_epochs_batches():
    """MLUtils' ``mapobs(f, DataLoader(X, batchsize=2, collate=false))``: mapping over a
    loader maps its batches (``getobs(loader, i)`` is batch ``i`` of the coming epoch)."""
    ones = np.ones((6, 3))
    per_batch = mapobs(lambda b: b[0].sum(), DataLoader(ones, batch_size=2, collate=False))
    assert [float(v) for v in per_batch] == [3.0, 3.0, 3.0]
    summed = mapobs(lambda b: b.sum(), DataLoader(ones, batch_size=2, collate=True))
    assert [float(v) for v in summed] == [6.0, 6.0, 6.0]
    loader = DataLoader(np.arange(10), 3, shuffle=True, seed=1)
    coming = [getobs(loader, b).tolist() for b in range(numobs(loader))]
    assert [b.tolist() for b in loader] == coming
    assert [getobs(loader, b).tolist() for b in range(4)] != coming  # the next epoch's
    assert getobs(eachobs(np.arange(5) * 2), 3) == 6
