"""Samplers and batch samplers (fastload.samplers): weighted draws, a given order per
epoch, batches of different sizes through the native engine, resume and sharding."""

import decimal
import fractions

import numpy as np
import pytest
from helpers import assert_resumes_exactly, assert_tree_equal, copy_tree, run_epochs
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload import BucketBatchSampler, DataLoader, LoadError, WeightedSampler, eachobs, getobs
from fastload._loading.engine import Engine
from fastload._loading.engine_options import EngineOptions
from fastload._loading.schedule import Schedule


def _data(n):
    return np.arange(n * 2, dtype=np.float32).reshape(n, 2), np.arange(n, dtype=np.int64)


def test_weighted_sampling_with_replacement_follows_the_weights():
    weights = np.array([1.0, 0.0, 3.0, 6.0])
    drawn = WeightedSampler(weights, 20000)(0, 7)
    freq = np.bincount(drawn, minlength=4) / len(drawn)
    assert freq[1] == 0
    assert np.allclose(freq, weights / weights.sum(), atol=0.02)


def test_weighted_sampling_without_replacement_draws_each_position_at_most_once():
    weights = np.array([5.0, 0.0, 1.0, 1.0, 0.5, 2.0])
    for epoch in range(20):
        drawn = WeightedSampler(weights, 5, replacement=False)(epoch, 3)
        assert len(set(drawn.tolist())) == 5 and 1 not in drawn
    # The heaviest is drawn first most often.
    firsts = [WeightedSampler(weights, 2, replacement=False)(e, 0)[0] for e in range(400)]
    assert np.bincount(firsts).argmax() == 0


def test_weighted_draws_depend_on_seed_and_epoch_only():
    sampler = WeightedSampler(np.ones(50), 30)
    assert np.array_equal(sampler(2, 9), WeightedSampler(np.ones(50), 30)(2, 9))
    assert not np.array_equal(sampler(2, 9), sampler(3, 9))
    assert not np.array_equal(sampler(2, 9), sampler(2, 10))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(weights=[-1.0, 2.0]),
        dict(weights=[0.0, 0.0]),
        dict(weights=[np.nan]),
        dict(weights=[1.0, 0.0], num_samples=2, replacement=False),
    ],
)
def test_bad_weights_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        WeightedSampler(**kwargs)


@pytest.mark.parametrize("parallel", [False, 2])
def test_a_loader_with_a_weighted_sampler_loads_what_it_draws(parallel):
    X, y = _data(40)
    sampler = WeightedSampler(np.linspace(0.1, 1, 40), 50)
    loader = DataLoader((X, y), 8, sampler=sampler, seed=4, parallel=parallel)
    assert len(loader) == 7
    for epoch, batches in enumerate(run_epochs(loader, 2)):
        drawn = sampler(epoch, 4)
        assert np.array_equal(np.concatenate([b[1] for b in batches]), drawn)
        assert_tree_equal(batches[0], (X[drawn[:8]], y[drawn[:8]]))


def test_a_sampler_may_be_a_function_or_a_container_of_positions():
    y = np.arange(10)
    by_function = DataLoader(y, 3, sampler=lambda epoch, seed: [9 - epoch, 0, 5])
    assert [b.tolist() for e in run_epochs(by_function, 2) for b in e] == [[9, 0, 5], [8, 0, 5]]
    fixed = DataLoader(y, 2, sampler=[4, 4, 1])
    assert [b.tolist() for e in run_epochs(fixed, 2) for b in e] == [[4, 4], [1]] * 2
    assert [int(v) for v in eachobs(y, sampler=range(3, 0, -1))] == [3, 2, 1]


def test_a_pytorch_sampler_is_iterated_once_per_epoch():
    torch = pytest.importorskip("torch")
    from torch.utils.data import SequentialSampler

    loader = DataLoader(np.arange(5), 2, sampler=SequentialSampler(range(5)))
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4]]
    assert torch is not None


def test_a_position_outside_the_data_raises_index_error():
    with pytest.raises(IndexError, match="12"):
        list(DataLoader(np.arange(10), 2, sampler=[1, 12]))


NOT_POSITIONS = [
    ([0.5, 1.9, 2.0], "0.5"),
    ([decimal.Decimal("1.5")], "Decimal"),
    ([fractions.Fraction(3, 2)], "Fraction"),
    ([1, True], "True"),
    ([np.bool_(False)], "False"),
    (["1"], "'1'"),
    (np.array([[0, 1], [2, 3]]), r"shape \(2, 2\)"),
    (np.array([0.0, 1.0]), "float64"),
    (np.array([True, False]), "bool"),
    ("12", "iterable"),
]


@pytest.mark.parametrize("positions, words", NOT_POSITIONS)
def test_a_sampler_that_gives_no_integer_positions_raises_naming_the_value(positions, words):
    with pytest.raises(TypeError, match=words):
        list(DataLoader(np.arange(10), 2, sampler=positions))


@pytest.mark.parametrize("positions, words", NOT_POSITIONS)
def test_a_batch_sampler_checks_positions_as_a_sampler_does(positions, words):
    with pytest.raises(TypeError, match=f"batch 1 gave.*{words}"):
        list(DataLoader(np.arange(10), batch_sampler=[[0, 1], positions]))


def test_positions_name_their_place_and_any_integer_type_is_one():
    with pytest.raises(TypeError, match=r"1\.0 \(a float\) at place 2"):
        list(DataLoader(np.arange(10), batch_sampler=[[4, 5, 1.0]]))
    with pytest.raises(IndexError, match=r"12 \(at place 1\)"):
        list(DataLoader(np.arange(10), batch_sampler=[[1, 12]]))
    loader = DataLoader(np.arange(10), 4, sampler=[np.int64(2), 3, np.uint8(1), np.array(4)])
    assert [b.tolist() for b in loader] == [[2, 3, 1, 4]]


def test_integer_tensors_are_positions_and_bool_tensors_are_not():
    torch = pytest.importorskip("torch")
    loader = DataLoader(np.arange(10), 2, sampler=[torch.tensor(5), 1])
    assert [b.tolist() for b in loader] == [[5, 1]]
    by_tensor = DataLoader(np.arange(10), batch_sampler=[torch.tensor([7, 0]), np.array([3])])
    assert [b.tolist() for b in by_tensor] == [[7, 0], [3]]
    with pytest.raises(TypeError, match="bool"):
        list(DataLoader(np.arange(10), 2, sampler=[torch.tensor(True)]))
    with pytest.raises(TypeError, match="bool"):
        list(DataLoader(np.arange(10), 2, sampler=torch.tensor([True, False])))


@pytest.mark.parametrize(
    "lengths, words",
    [([3, -1, 2], r"lengths\[1\] is -1"), ([1.0, np.nan], "nan"), ([np.inf], "inf")],
)
def test_bucket_lengths_must_be_finite_and_not_negative(lengths, words):
    with pytest.raises(ValueError, match=words):
        BucketBatchSampler(lengths, 2)


def test_bucket_sizes_are_ints_not_bools():
    with pytest.raises(ValueError, match="batch_size"):
        BucketBatchSampler([1, 2], True)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(shuffle=True, sampler=[0]),
        dict(batch_sampler=[[0]], batch_size=2),
        dict(batch_sampler=[[0]], shuffle=True),
        dict(batch_sampler=[[0]], drop_last=True),
        dict(batch_sampler=[[0]], sampler=[0]),
    ],
)
def test_samplers_exclude_the_options_they_replace(kwargs):
    with pytest.raises(ValueError):
        DataLoader(np.arange(4), **kwargs)


def test_bucket_batches_cover_every_position_once_and_group_similar_lengths():
    lengths = np.random.default_rng(0).integers(1, 200, 1000)
    sampler = BucketBatchSampler(lengths, 16, pool_size=256)
    batches = sampler(0, 1)
    assert sorted(np.concatenate(batches).tolist()) == list(range(1000))
    assert sum(len(b) < 16 for b in batches) == 1
    spread = np.mean([np.ptp(lengths[b]) for b in batches])
    assert spread < 0.1 * np.ptp(lengths)  # sorted within pools: little padding
    assert [b.tolist() for b in batches] == [b.tolist() for b in sampler(0, 1)]
    assert [b.tolist() for b in batches] != [b.tolist() for b in sampler(1, 1)]


def test_bucket_batches_by_max_tokens_fit_the_budget():
    lengths = np.random.default_rng(1).integers(1, 100, 500)
    lengths[7] = 500  # longer than the budget: alone
    batches = BucketBatchSampler(lengths, max_tokens=256)(0, 0)
    assert sorted(np.concatenate(batches).tolist()) == list(range(500))
    for b in batches:
        assert len(b) * lengths[b].max() <= 256 or len(b) == 1
    assert len({len(b) for b in batches}) > 3  # batches of different sizes


def test_bucket_drop_last_drops_the_partial_batch():
    batches = BucketBatchSampler(np.ones(10), 4, drop_last=True, shuffle=False)(0, 0)
    assert [len(b) for b in batches] == [4, 4]


def test_schedule_bounds_cut_steps_of_different_sizes():
    s = Schedule(np.arange(10)[::-1], 4, bounds=[0, 1, 5, 7, 10])
    assert (s.steps, s.rows) == (4, 4)
    assert s.positions(1).tolist() == [8, 7, 6, 5]
    assert s.positions(3).tolist() == [2, 1, 0]
    for bounds in ([0, 5, 10], [0, 3, 3, 10], [1, 10], [0, 9]):
        with pytest.raises(ValueError, match="bounds|steps"):
            Schedule(np.arange(10), 4, bounds=bounds)


def _sizes_batches(n, seed=0):
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    cuts = np.sort(rng.choice(np.arange(1, n), size=n // 5, replace=False))
    return [c for c in np.split(order, cuts) if len(c)]


@pytest.mark.parametrize("parallel", [False, 1, 2, 4])
@pytest.mark.parametrize("buffer", [False, True])
def test_batches_of_different_sizes_load_natively_as_given(parallel, buffer):
    data = _data(300)
    batches = _sizes_batches(300)
    loader = DataLoader(
        data,
        batch_sampler=batches,
        parallel=parallel,
        buffer=buffer,
        prefetch=2 if parallel else None,
    )
    got = run_epochs(loader, 2)
    expected = [getobs(data, b) for b in batches]
    for epoch in got:
        assert_tree_equal(epoch, expected)
    assert len(loader) == len(batches)


def test_batches_of_different_sizes_unordered_give_the_same_batches():
    data = _data(200)
    batches = _sizes_batches(200, seed=2)
    got = [copy_tree(b) for b in DataLoader(data, batch_sampler=batches, parallel=3, ordered=False)]
    assert sorted(b[1].tolist() for b in got) == sorted(data[1][b].tolist() for b in batches)


def test_batches_of_different_sizes_through_python_containers_and_collate():
    texts = [f"t{k}" for k in range(30)]
    batches = [[0, 1, 2], [3], [4, 5, 6, 7, 8, 9, 10], [11, 12]]
    loader = DataLoader(texts, batch_sampler=batches, parallel=2, collate=lambda xs: "+".join(xs))
    assert list(loader) == ["t0+t1+t2", "t3", "+".join(texts[4:11]), "t11+t12"]
    lists = DataLoader(texts, batch_sampler=batches, collate=False)
    assert [len(b) for b in lists] == [3, 1, 7, 2]


def test_a_failed_item_in_a_batch_of_its_own_size_is_named():
    class Flaky:
        def __len__(self):
            return 20

        def __getitem__(self, i):
            if i == 13:
                raise RuntimeError("bad item")
            return np.full(2, i, np.float32)

    loader = DataLoader(Flaky(), batch_sampler=[[0, 1], [2, 3, 4, 5, 13], [6]], parallel=2)
    with pytest.raises(LoadError, match="observation 13"):
        list(loader)
    skipping = DataLoader(Flaky(), batch_sampler=[[0, 1], [2, 13, 4], [6]], on_error="skip")
    with pytest.warns(RuntimeWarning):
        assert [b[:, 0].tolist() for b in skipping] == [[0, 1], [2, 4], [6]]


def test_the_process_backend_loads_batches_of_different_sizes():
    texts = [f"text {k}" for k in range(40)]
    batches = _sizes_batches(40, seed=3)
    threads = list(DataLoader(texts, batch_sampler=batches, parallel=2))
    processes = DataLoader(texts, batch_sampler=batches, parallel=2, backend="process")
    try:
        assert list(processes) == threads
    finally:
        processes.close()


def test_an_epoch_with_larger_batches_grows_the_slots():
    data = _data(50)
    draw = lambda epoch, seed: [
        list(range(k, min(k + 3 + 5 * epoch, 50))) for k in range(0, 50, 3 + 5 * epoch)
    ]
    loader = DataLoader(data, batch_sampler=draw, buffer=True, parallel=2, seed=0)
    for epoch in range(3):
        assert len(loader) == len(draw(epoch, 0))  # the coming epoch's batches
        batches = run_epochs(loader, 1)[0]
        assert_tree_equal(batches, [getobs(data, b) for b in draw(epoch, 0)])
    it = iter(loader)
    next(it)
    assert len(loader) == len(draw(3, 0))  # the epoch being iterated


@pytest.mark.parametrize("parallel", [False, 2])
def test_sampler_loaders_resume_exactly(parallel):
    data = _data(23)
    assert_resumes_exactly(
        lambda: DataLoader(
            data, 4, sampler=WeightedSampler(np.arange(1.0, 24.0), 18), seed=3, parallel=parallel
        )
    )
    assert_resumes_exactly(
        lambda: DataLoader(
            data,
            batch_sampler=BucketBatchSampler(np.arange(23) % 7, max_tokens=12),
            seed=5,
            parallel=parallel,
        )
    )


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 80), world=st.integers(1, 4), seed=st.integers(0, 2**31))
def test_sharded_batch_samplers_give_every_rank_as_many_whole_batches(n, world, seed):
    sampler = BucketBatchSampler(np.arange(n) % 5 + 1, max_tokens=9)
    batches = sampler(0, seed)
    parts = [
        [
            b.tolist()
            for b in DataLoader(np.arange(n), batch_sampler=sampler, seed=seed, shard=(r, world))
        ]
        for r in range(world)
    ]
    assert len({len(p) for p in parts}) == 1
    assert len(parts[0]) == -(-len(batches) // world)
    got = {tuple(b) for p in parts for b in p}
    assert got == {tuple(b.tolist()) for b in batches}


def test_sharded_samplers_split_the_drawn_positions():
    sampler = WeightedSampler(np.ones(30), 40)
    drawn = sampler(0, 8)
    parts = [
        list(DataLoader(np.arange(30), 5, sampler=sampler, seed=8, shard=(r, 2))) for r in range(2)
    ]
    # Each global batch of 10 drawn positions: rank 0's 5, then rank 1's.
    steps = [np.concatenate([parts[0][k], parts[1][k]]) for k in range(4)]
    assert np.array_equal(np.concatenate(steps), drawn)


def test_engine_runs_a_schedule_with_bounds_from_any_step():
    x = np.arange(12) * 10
    schedule = Schedule(np.arange(12), 5, bounds=[0, 2, 7, 8, 12], start=2)
    got = [copy_tree(v) for v in Engine(EngineOptions(parallel=2)).iterate(x, schedule)]
    assert [g.tolist() for g in got] == [[70], [80, 90, 100, 110]]
