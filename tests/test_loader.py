"""DataLoader and eachobs (fastload.loader): epochs, order, shuffling, buffers, resumable
state and stats."""

import tracemalloc

import numpy as np
import pytest
from helpers import assert_resumes_exactly, assert_tree_equal, copy_tree, run_epochs, stacked
from hypothesis import given
from hypothesis import strategies as st

from fastload import DataLoader, eachobs, getobs, mapobs

X = np.arange(30, dtype=np.float32).reshape(10, 3)
Y = np.arange(10, dtype=np.int64)


def indices_of(batches):
    return np.concatenate([np.asarray(b).reshape(-1) for b in batches] or [np.zeros(0)]).tolist()


@given(
    n=st.integers(0, 60),
    batch_size=st.integers(1, 16),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**63 - 1),
)
def test_every_index_once_per_epoch_and_drop_last_drops_only_the_tail(
    n, batch_size, drop_last, shuffle, seed
):
    data = np.arange(n)
    full = DataLoader(data, batch_size, shuffle=shuffle, seed=seed)
    loader = DataLoader(data, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed)
    for full_epoch, epoch in zip(run_epochs(full, 2), run_epochs(loader, 2)):
        assert sorted(indices_of(full_epoch)) == list(range(n))
        assert [len(b) for b in full_epoch] == [
            min(batch_size, n - s) for s in range(0, n, batch_size)
        ]
        if drop_last:
            assert len(epoch) == len(loader) == n // batch_size
            assert_tree_equal(epoch, full_epoch[: n // batch_size])
        else:
            assert len(epoch) == len(loader)
            assert_tree_equal(epoch, full_epoch)
        if not shuffle:
            assert indices_of(full_epoch) == list(range(n))


@pytest.mark.parametrize("batch_size", [0, -3, 2.5, "4"])
def test_batch_size_below_one_or_not_an_int_raises_value_error(batch_size):
    with pytest.raises(ValueError):
        DataLoader(X, batch_size)


@pytest.mark.parametrize(
    "option",
    [
        {"shuffle": "yes"},
        {"shuffle": None},
        {"shuffle": 1},
        {"parallel": -2},
        {"parallel": "2"},
        {"parallel": 1.5},
    ],
)
def test_bad_shuffle_or_parallel_values_raise_value_error(option):
    with pytest.raises(ValueError):
        DataLoader(X, 2, **option)
    with pytest.raises(ValueError):
        eachobs(X, **option)


@pytest.mark.parametrize("parallel", [False, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_an_empty_container_gives_zero_batches(parallel, shuffle):
    for data in (X[:0], (X[:0], Y[:0]), []):
        loader = DataLoader(data, 4, shuffle=shuffle, parallel=parallel, seed=0)
        assert len(loader) == 0
        assert list(loader) == [] and list(loader) == []
        assert list(eachobs(data, shuffle=shuffle, parallel=parallel, seed=0)) == []


def test_same_seed_gives_the_same_batches_and_epochs_differ():
    a = run_epochs(DataLoader(Y, 3, shuffle=True, seed=7), 3)
    b = run_epochs(DataLoader(Y, 3, shuffle=True, seed=7), 3)
    assert_tree_equal(a, b)
    assert indices_of(a[0]) != indices_of(a[1]) != indices_of(a[2])
    other = run_epochs(DataLoader(Y, 3, shuffle=True, seed=8), 1)
    assert indices_of(other[0]) != indices_of(a[0])


def test_seed_none_is_drawn_once_per_loader_and_its_state_reproduces_the_order():
    data = np.arange(100)
    loader = DataLoader(data, 10, shuffle=True)
    first, second = run_epochs(loader, 2)
    assert indices_of(first) != indices_of(second)
    state = loader.state_dict()
    third = run_epochs(loader, 1)[0]
    restored = DataLoader(data, 10, shuffle=True)
    restored.load_state_dict(state)
    assert_tree_equal(run_epochs(restored, 1)[0], third)
    assert indices_of(run_epochs(DataLoader(data, 10, shuffle=True), 1)[0]) != indices_of(first)


def test_eachobs_yields_single_observations_every_one_once_with_shuffle():
    loader = eachobs((X, Y), shuffle=True, seed=3)
    assert len(loader) == 10
    epochs = run_epochs(loader, 2)
    for epoch in epochs:
        labels = [int(y) for _, y in epoch]
        assert sorted(labels) == list(range(10))
        for x, y in epoch:
            assert_tree_equal(x, X[int(y)])
    assert [int(y) for _, y in epochs[0]] != list(range(10))
    assert [int(y) for _, y in epochs[0]] != [int(y) for _, y in epochs[1]]
    assert_tree_equal(list(eachobs(Y)), list(Y))


CONTAINERS = {
    "array": lambda: X,
    "vector": lambda: Y,
    "tuple": lambda: (X, Y),
    "dict": lambda: {"x": X, "y": Y},
    "mapobs": lambda: mapobs(lambda x: x * 2, X),
    "list": lambda: [{"a": i} for i in range(10)],
}


def stack_in_a_dict(observations):
    """A user's collate function: the observations stacked, in a dict."""
    return {"batch": stacked(list(observations))}


@pytest.mark.parametrize("collate", [None, True, "callable"])
@pytest.mark.parametrize("container", list(CONTAINERS))
@pytest.mark.parametrize("shuffle", [False, True])
def test_buffered_batches_equal_unbuffered_ones(container, collate, shuffle):
    if collate == "callable":
        collate = stack_in_a_dict
    data = CONTAINERS[container]()
    make = lambda buffer: DataLoader(
        data, 4, shuffle=shuffle, collate=collate, buffer=buffer, seed=1
    )
    expected = run_epochs(make(False), 2)
    buffered = run_epochs(make(True), 2)
    assert_tree_equal(buffered, expected)


@pytest.mark.parametrize("collate", [None, True])
def test_buffered_partial_last_batch_has_the_right_length(collate):
    batches = [copy_tree(b) for b in DataLoader((X, Y), 4, buffer=True, collate=collate)]
    assert [len(x) for x, _ in batches] == [4, 4, 2]
    assert [len(y) for _, y in batches] == [4, 4, 2]
    assert_tree_equal(batches[-1], (X[8:], Y[8:]))


def test_buffered_loader_alternates_two_buffers_and_allocates_nothing_per_batch():
    # Two slots: the last batch, and the one before it while the loader checks that
    # nothing refers to it any more. Addresses only: keeping a batch would be warned of.
    data = np.ones((8192, 64), np.float32)
    loader = DataLoader(data, 256, shuffle=True, buffer=True, seed=0)
    batch_bytes = 256 * 64 * 4
    it = iter(loader)
    addresses = [next(it).ctypes.data for _ in range(2)]
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for _ in range(20):
            addresses.append(next(it).ctypes.data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - start < batch_bytes // 4
    assert len(set(addresses)) == 2
    assert all(a != b for a, b in zip(addresses, addresses[1:]))


RESUME_CONFIGS = {
    "sequential": dict(batch_size=3),
    "shuffle": dict(batch_size=3, shuffle=True, seed=5),
    "shuffle-seed-none": dict(batch_size=3, shuffle=True),
    "drop-last": dict(batch_size=3, shuffle=True, drop_last=True, seed=5),
    "buffer": dict(batch_size=4, shuffle=True, buffer=True, seed=5),
    "parallel-true": dict(batch_size=3, shuffle=True, parallel=True, seed=5),
    "parallel-2-buffer": dict(batch_size=4, shuffle=True, parallel=2, buffer=True, seed=5),
    "parallel-1-drop-last": dict(batch_size=4, parallel=1, drop_last=True, seed=5),
    "collate-true": dict(batch_size=3, shuffle=True, collate=True, seed=5),
    "collate-false-parallel": dict(batch_size=3, shuffle=True, collate=False, parallel=2, seed=5),
}


@pytest.mark.parametrize("container", ["array", "tuple", "dict"])
@pytest.mark.parametrize("config", list(RESUME_CONFIGS))
def test_loader_resumes_exactly_from_any_step(config, container):
    data = CONTAINERS[container]()
    assert_resumes_exactly(lambda: DataLoader(data, **RESUME_CONFIGS[config]), epochs=2)


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(shuffle=True, seed=2),
        dict(shuffle=True),
        dict(shuffle=True, buffer=True, seed=2),
        dict(shuffle=True, parallel=2, seed=2),
        dict(shuffle=True, parallel=2, buffer=True, seed=2),
    ],
    ids=["plain", "shuffle", "seed-none", "buffer", "parallel", "parallel-buffer"],
)
def test_eachobs_resumes_exactly_from_any_step(options):
    assert_resumes_exactly(lambda: eachobs((X[:7], Y[:7]), **options), epochs=2)


def test_state_dict_right_after_load_state_dict_is_the_loaded_position():
    loader = DataLoader(Y, 3, shuffle=True, seed=1)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert {k: state[k] for k in ("seed", "epoch", "step", "steps")} == {
        "seed": 1,
        "epoch": 0,
        "step": 1,
        "steps": 4,
    }
    restored = DataLoader(Y, 3, shuffle=True, seed=1)
    restored.load_state_dict(state)
    assert restored.state_dict() == state


def test_loading_a_state_with_another_number_of_steps_raises_value_error():
    state = DataLoader(Y, 3).state_dict()
    with pytest.raises(ValueError, match="4 steps per epoch, this one has 5"):
        DataLoader(np.arange(len(Y) + 3), 3).load_state_dict(state)
    with pytest.raises(ValueError):
        DataLoader(Y, 3).load_state_dict({"seed": 0, "epoch": 0})
    with pytest.raises(ValueError):
        DataLoader(Y, 3).load_state_dict(dict(state, step=5))


@pytest.mark.parametrize("parallel", [False, 2])
def test_stats_report_every_key_and_count_items_and_batches(parallel):
    keys = {"items", "batches", "items_per_s", "wait_s", "compute_s", "wait_fraction", "skipped"}
    for data, collate in (((X, Y), None), ({"x": X, "y": Y}, None), (X, False), (X, True)):
        loader = DataLoader(data, 4, collate=collate, parallel=parallel)
        assert set(loader.stats()) == keys
        assert loader.stats()["items"] == 0
        run_epochs(loader, 2)
        stats = loader.stats()
        assert set(stats) == keys
        assert (stats["items"], stats["batches"], stats["skipped"]) == (20, 6, 0)
        assert stats["wait_s"] >= 0 and stats["compute_s"] >= 0
        assert 0 <= stats["wait_fraction"] <= 1
    each = eachobs(X, parallel=parallel)
    run_epochs(each, 1)
    assert (each.stats()["items"], each.stats()["batches"]) == (10, 10)


def test_stats_count_a_collate_result_whose_first_member_is_a_0d_array():
    def summarize(observations):
        return {"mean": np.array(np.mean(observations)), "batch": np.stack(observations)}

    loader = DataLoader(X, 4, collate=summarize)
    batches = run_epochs(loader, 1)[0]
    assert [len(b["batch"]) for b in batches] == [4, 4, 2]
    assert loader.stats()["batches"] == 3


def test_stats_print_as_one_short_line():
    loader = DataLoader(X, 4)
    run_epochs(loader, 1)
    line = str(loader.stats())
    assert "\n" not in line
    assert line.startswith("10 items in 3 batches: ") and "items/s" in line
    assert "waited for data" in line and "skipped" not in line


@pytest.mark.parametrize("parallel", [False, 2])
def test_a_loader_used_in_a_with_block_is_closed_at_its_end(parallel):
    with DataLoader(X, 4, parallel=parallel) as loader:
        it = iter(loader)
        first = next(it).copy()
    assert first.tolist() == X[:4].tolist()
    with pytest.raises(RuntimeError, match="closed"):
        next(it)
    assert [b.tolist() for b in loader] == [X[:4].tolist(), X[4:8].tolist(), X[8:].tolist()]


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_obsview_layers_fold_into_the_order_and_load_item_by_item(monkeypatch, backend):
    # obsview, shuffleobs and splitobs at the top of the data: the engine loads the
    # container under them natively, the same values as getobs through the views.
    from fastload import obsview, shuffleobs, splitobs
    from fastload._loading import engine as engine_module
    from fastload._loading.plan import ItemPlan, make_plan

    plans = []

    def spy(data, schedule, **kw):
        plans.append(make_plan(data, schedule, **kw))
        return plans[-1]

    monkeypatch.setattr(engine_module, "make_plan", spy)
    x, y = np.arange(60.0).reshape(30, 2), np.arange(30) * 10
    train, _ = splitobs(shuffleobs((x, y), seed=3), at=0.8)
    view = obsview(train, np.arange(23, -1, -1))
    loader = DataLoader(view, 5, shuffle=True, seed=1, parallel=2, backend=backend)
    for epoch in range(2):
        got = [copy_tree(b) for b in loader]
        order = loader.schedule(epoch).order
        expected = [getobs(view, order[s : s + 5]) for s in range(0, 24, 5)]
        assert_tree_equal(got, expected)
    assert plans and all(isinstance(p, ItemPlan) and not p.has_python for p in plans)


def test_eachobs_returns_the_public_epoch_loader_that_dataloader_extends():
    import fastload
    from fastload.loader import _EpochLoader

    assert type(eachobs(X)) is fastload.EpochLoader
    assert isinstance(eachobs(X, batch_size=2), fastload.EpochLoader)
    assert issubclass(DataLoader, fastload.EpochLoader)
    assert _EpochLoader is fastload.EpochLoader  # the name before 0.3
