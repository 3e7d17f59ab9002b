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
    filterobs,
    getobs,
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
    undersample,
)
from fastload.plan import ItemPlan, make_plan
from fastload.schedule import schedule_of
from fastload.views import ObsView


def values(view):
    return getobs(view).tolist()


def gathers_natively(view):
    """True when a loader over ``view`` gathers every leaf natively (no Python per item)."""
    plan = make_plan(*schedule_of(batchview(view, 4)))
    return isinstance(plan, ItemPlan) and all(leaf.kind == "gather" for leaf in plan.leaves)


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
