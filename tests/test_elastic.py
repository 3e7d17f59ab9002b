"""Elastic order: the ranks' batches of a step, concatenated in rank order, are the same
global batch on every world size dividing it, and a state saved on one world size
resumes on another at the same global position (ranks simulated in one process with
``shard=(rank, world_size)``; ``test_torch_distributed.py`` runs real ranks)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload import DataLoader
from fastload._loading.sharding import shard_blocks, shard_elastic
from fastload.samplers import WeightedSampler

N, GLOBAL = 53, 8  # 6 full global batches and a partial one of 5


def _sampler(epoch, seed):
    return np.random.default_rng([seed, epoch]).permutation(N)[:45]


def _batches(epoch, seed):
    rng = np.random.default_rng([seed, epoch, 1])
    cuts = np.sort(rng.choice(np.arange(1, N), 12, replace=False))
    return np.split(rng.permutation(N), cuts)


SETTINGS = {
    "in order": {"shuffle": False},
    "shuffled": {"shuffle": True},
    "sampler": {"sampler": _sampler},
    "weighted": {"sampler": WeightedSampler(np.arange(1.0, N + 1))},
    "dropping": {"shuffle": True, "drop_last": True},
}


def _flat(lists):
    return [x for part in lists for x in part]


def _loaders(world, setting, **options):
    """The ``world`` ranks' loaders of ``setting``, of global batch ``GLOBAL``."""
    kw = dict(SETTINGS[setting], seed=7, **options)
    return [DataLoader(np.arange(N), GLOBAL // world, shard=(r, world), **kw) for r in range(world)]


def _global_steps(loaders):
    """The epoch's global batches: each step's batches concatenated in rank order."""
    per_rank = [[b.tolist() for b in loader] for loader in loaders]
    assert len({len(p) for p in per_rank}) == 1  # every rank steps together
    return [_flat(p[k] for p in per_rank) for k in range(len(per_rank[0]))]


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_every_world_size_dividing_the_global_batch_loads_the_same_global_batches(setting):
    (one,) = _loaders(1, setting)
    reference = [_global_steps([one]) for _ in range(2)]  # two epochs
    for world in (2, 4, 8):
        loaders = _loaders(world, setting)
        for epoch in range(2):
            steps = _global_steps(loaders)
            assert len(steps) == len(reference[epoch])
            # Every step but a partial last one is the same global batch; the partial one
            # starts alike and is padded to a multiple of the world size by wrapping.
            for k, (got, want) in enumerate(zip(steps, reference[epoch], strict=True)):
                assert got[: len(want)] == want, (world, epoch, k)
                flat = _flat(reference[epoch])
                assert got[len(want) :] == flat[: len(got) - len(want)]
                assert len(got) == len(want) + (-len(want)) % world


def test_threads_and_worker_processes_load_the_same_global_batches():
    reference = _global_steps(_loaders(2, "shuffled"))
    for options in ({"parallel": 2}, {"parallel": 2, "backend": "process"}):
        assert _global_steps(_loaders(2, "shuffled", **options)) == reference
        assert _global_steps(_loaders(4, "shuffled", **options))[:-1] == reference[:-1]


def test_a_batch_samplers_batches_are_dealt_one_a_rank_in_turn():
    whole = [b.tolist() for b in DataLoader(np.arange(N), batch_sampler=_batches, seed=3)]
    for world in (2, 4):
        ranks = [
            [
                b.tolist()
                for b in DataLoader(np.arange(N), batch_sampler=_batches, seed=3, shard=(r, world))
            ]
            for r in range(world)
        ]
        dealt = [ranks[k % world][k // world] for k in range(world * len(ranks[0]))]
        assert dealt[: len(whole)] == whole
        assert dealt[len(whole) :] == whole[: len(dealt) - len(whole)]  # wrapped around


def test_one_observation_a_step_is_distributed_samplers_layout():
    order = np.arange(10)[::-1]
    padded = np.resize(order, 12)
    for r in range(4):
        assert shard_elastic(order, r, 4, 1, False).tolist() == padded[r::4].tolist()
    # drop_last: the partial global batch (positions 6 to 9) is dropped.
    assert shard_elastic(order, 1, 2, 3, True).tolist() == [6, 5, 4]


def _consumed(loaders, k):
    """The first ``k`` global steps of ``loaders``' next epoch (they are left mid-epoch)."""
    its = [iter(loader) for loader in loaders]
    steps = [[next(it).tolist() for it in its] for _ in range(k)]
    return [_flat(step) for step in steps]


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_a_state_saved_on_one_world_size_resumes_on_another_at_the_same_position(setting):
    (one,) = _loaders(1, setting)
    flat = _flat(_global_steps([one]))  # the epoch's order (what drop_last keeps)
    steps = len(one)
    for before in (1, 2, 4):
        for k in (0, 1, 3, steps - 1):
            saver = _loaders(before, setting)
            done = _consumed(saver, k)
            state = saver[-1].state_dict()
            for after in (1, 2, 4):
                resumed = _loaders(after, setting)
                for loader in resumed:
                    loader.load_state_dict(state)
                rest = _global_steps(resumed)
                assert len(done) + len(rest) == steps, (before, after, k)
                loaded = _flat(done + rest)
                # The epoch's order exactly once, then the padding of the last step.
                assert loaded[: len(flat)] == flat, (before, after, k)
                assert loaded[len(flat) :] == flat[: len(loaded) - len(flat)]


def test_a_state_resumes_on_a_global_batch_it_is_a_whole_number_of():
    saver = DataLoader(np.arange(N), 4, shuffle=True, seed=1, shard=(0, 2))
    it = iter(saver)
    for _ in range(3):
        next(it)
    state = saver.state_dict()  # 3 steps of 8: position 24
    other = DataLoader(np.arange(N), 3, shuffle=True, seed=1, shard=(1, 4))
    other.load_state_dict(state)  # 24 = 2 steps of 12
    order = np.concatenate(list(DataLoader(np.arange(N), 8, shuffle=True, seed=1)))
    assert next(iter(other)).tolist() == order[27:30].tolist()
    with pytest.raises(ValueError, match="does not divide"):
        DataLoader(np.arange(N), 3, shuffle=True, seed=1, shard=(0, 3)).load_state_dict(
            dict(state, step=1)
        )


def test_a_state_of_version_2_resumes_in_the_contiguous_blocks_it_was_saved_in():
    data = np.arange(N)
    order = np.concatenate([b for b in DataLoader(data, 4, shuffle=True, seed=2)])
    saver = DataLoader(data, 4, shuffle=True, seed=2, shard=(1, 2))
    state = {k: v for k, v in saver.state_dict().items() if k != "layout"}
    state.update(format="fastload.container_loader/2", step=2)
    loader = DataLoader(data, 4, shuffle=True, seed=2, shard=(1, 2))
    loader.load_state_dict(state)
    assert loader.state_dict()["layout"] == "blocks"
    block = shard_blocks(order, 1, 2, False)
    assert np.concatenate(list(loader)).tolist() == block[8:].tolist()
    with pytest.raises(ValueError, match="rank 1 of 2, this loader is rank 0 of 4"):
        DataLoader(data, 2, shuffle=True, seed=2, shard=(0, 4)).load_state_dict(state)


def test_single_observations_resume_on_a_world_size_that_divides_the_position():
    from fastload import eachobs

    order = list(eachobs(np.arange(N), shuffle=True, seed=4))
    saved = [eachobs(np.arange(N), shuffle=True, seed=4, shard=(r, 2)) for r in range(2)]
    its = [iter(loader) for loader in saved]
    done = [int(next(it)) for _ in range(6) for it in its]  # 6 steps of 2: position 12
    assert done == [int(i) for i in order[:12]]
    resumed = [eachobs(np.arange(N), shuffle=True, seed=4, shard=(r, 4)) for r in range(4)]
    for loader in resumed:
        loader.load_state_dict(saved[1].state_dict())  # step 3 of 4 observations
    rest = [[int(i) for i in loader] for loader in resumed]
    flat = [rest[r][k] for k in range(len(rest[0])) for r in range(4)]
    assert done + flat[: N - 12] == [int(i) for i in order]
    with pytest.raises(ValueError, match="does not divide that position 12"):
        eachobs(np.arange(N), shuffle=True, seed=4, shard=(0, 5)).load_state_dict(
            saved[0].state_dict()
        )


@pytest.mark.parametrize("before, after", [(1, 2), (2, 4), (4, 2), (2, 1)])
def test_a_batch_samplers_state_resumes_on_another_world_size(before, after):
    whole = [b.tolist() for b in DataLoader(np.arange(N), batch_sampler=_batches, seed=3)]
    saved = [
        DataLoader(np.arange(N), batch_sampler=_batches, seed=3, shard=(r, before))
        for r in range(before)
    ]
    its = [iter(loader) for loader in saved]
    done = [next(it).tolist() for _ in range(4 // before) for it in its]  # 4 batches
    resumed = [
        DataLoader(np.arange(N), batch_sampler=_batches, seed=3, shard=(r, after))
        for r in range(after)
    ]
    for loader in resumed:
        loader.load_state_dict(saved[0].state_dict())
    rest = [[b.tolist() for b in loader] for loader in resumed]
    dealt = [rest[k % after][k // after] for k in range(after * len(rest[0]))]
    assert (done + dealt)[: len(whole)] == whole


class Drawing:
    """An iterable sampler that draws anew each time it is iterated."""

    def __init__(self):
        self.rng = np.random.default_rng(11)

    def __iter__(self):
        return iter(self.rng.permutation(N).tolist())


@pytest.mark.parametrize("world", [1, 2])
def test_an_iterable_sampler_is_iterated_once_an_epoch_by_a_resumed_loader(world):
    def ranks():
        return [
            DataLoader(np.arange(N), 4, sampler=Drawing(), shard=(r, world), seed=0)
            for r in range(world)
        ]

    reference = _global_steps(ranks())
    saved = ranks()
    done = _consumed(saved, 3)
    resumed = ranks()
    for loader in resumed:
        loader.load_state_dict(saved[0].state_dict())
    assert done + _global_steps(resumed) == reference


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 120),
    world=st.integers(1, 9),
    batch=st.integers(1, 17),
    drop_last=st.booleans(),
)
def test_each_rank_takes_its_run_of_each_global_batch_of_the_padded_order(
    n, world, batch, drop_last
):
    order = np.random.default_rng(n).permutation(n)
    per = n // world if drop_last else -(-n // world)
    padded = np.resize(order, per * world) if n else order  # wrapped to the start
    if world == 1:  # the whole order (the loader drops a partial last batch)
        assert shard_elastic(order, 0, 1, batch, drop_last) is order
        return
    for rank in range(world):
        got = shard_elastic(order, rank, world, batch, drop_last)
        assert len(got) == (per // batch * batch if drop_last else per)
        for k in range(0, len(got), batch):  # step k // batch
            step = got[k : k + batch]
            start = k * world + rank * len(step)  # the last step's runs are shorter
            assert step.tolist() == padded[start : start + len(step)].tolist()
