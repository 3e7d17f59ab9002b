"""Distributed sharding: ranks simulated in one process."""

import os
import socket
import subprocess
import sys
import warnings

import numpy as np
import pytest
from helpers import assert_resumes_exactly, run_epochs
from hypothesis import given, settings
from hypothesis import strategies as st

import fastload
from fastload import DataLoader, eachobs
from fastload._loading import sharding
from fastload._loading.sharding import resolve_shard, shard_order
from fastload.order import quasi_shard_order


def epoch_indices(loader):
    return np.concatenate([np.asarray(b) for b in loader] or [np.empty(0, np.int64)])


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 200),
    world=st.integers(1, 6),
    batch_size=st.integers(1, 17),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_ranks_are_disjoint_cover_every_index_and_get_equal_batches(
    n, world, batch_size, drop_last, shuffle, seed
):
    data = np.arange(n)
    loaders = [
        DataLoader(
            data, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, shard=(rank, world)
        )
        for rank in range(world)
    ]
    assert len({len(loader) for loader in loaders}) == 1
    for _ in range(2):  # two epochs
        parts = [epoch_indices(loader) for loader in loaders]
        counts = np.bincount(np.concatenate(parts), minlength=n) if n else np.zeros(0)
        if drop_last:
            per_rank = (n // world) // batch_size * batch_size
            assert all(len(p) == per_rank for p in parts)
            assert counts.max(initial=0) <= 1  # disjoint, the remainder dropped
        else:
            per_rank = -(-n // world)
            assert all(len(p) == per_rank for p in parts)
            assert (counts >= 1).all()  # every index at least once
            assert counts.sum() - n == per_rank * world - n  # padding only, by wrapping
            if n:  # wrapping repeats every index about equally often
                assert counts.max() <= -(-per_rank * world // n)


def test_every_rank_draws_the_same_order_and_takes_its_part_of_each_global_batch():
    data = np.arange(100)
    (whole,) = run_epochs(DataLoader(data, 5, shuffle=True, seed=3), 1)
    ranks = [
        run_epochs(DataLoader(data, 5, shuffle=True, seed=3, shard=(r, 4)), 1)[0] for r in range(4)
    ]
    # Step k of rank r is batch 4k + r of the whole epoch's batches of 5.
    assert [ranks[k % 4][k // 4].tolist() for k in range(20)] == [b.tolist() for b in whole]


def test_padding_wraps_around_to_the_start_of_the_order():
    order = np.array([4, 2, 0, 1, 3])
    assert shard_order(order, 1, 2, drop_last=False).tolist() == [1, 3, 4]
    assert shard_order(order, 0, 2, drop_last=True).tolist() == [4, 2]


@pytest.mark.parametrize("parallel", [False, 2])
def test_each_rank_resumes_exactly(parallel):
    data = (np.arange(53) * 2.0, np.arange(53))
    for rank in range(3):
        assert_resumes_exactly(
            lambda rank=rank: DataLoader(
                data, 4, shuffle=True, seed=5, shard=(rank, 3), parallel=parallel
            )
        )


def test_a_state_from_another_rank_resumes_at_its_global_position():
    saver = DataLoader(np.arange(10), 2, shard=(0, 2))
    next(iter(saver))
    loader = DataLoader(np.arange(10), 2, shard=(1, 2))
    loader.load_state_dict(saver.state_dict())
    # From step 1: its part of the global batch [4..7], then of the last one, [8, 9].
    assert [b.tolist() for b in loader] == [[6, 7], [9]]


def test_a_quasi_random_state_from_another_rank_is_refused():
    data = Blockwise(40, 10)
    state = DataLoader(data, 2, shuffle="quasi", shard=(0, 2)).state_dict()
    with pytest.raises(ValueError, match="rank 0 of 2, this loader is rank 1 of 2"):
        DataLoader(data, 2, shuffle="quasi", shard=(1, 2)).load_state_dict(state)


def test_eachobs_shards_single_observations():
    parts = [list(eachobs(np.arange(10), shuffle=True, seed=1, shard=(r, 3))) for r in range(3)]
    assert [len(p) for p in parts] == [4, 4, 4]
    assert set(np.concatenate(parts).tolist()) == set(range(10))


class Blockwise:
    """A container with block boundaries, as a packed dataset has."""

    def __init__(self, n, block):
        self.values = np.arange(n)
        self.block_bounds = np.append(np.arange(0, n, block), n)

    def __len__(self):
        return len(self.values)

    def __getitem__(self, i):
        return self.values[i]


def test_quasi_random_order_shards_by_blocks_and_covers_the_epoch():
    data = Blockwise(400, 20)
    kw = {"shuffle": "quasi", "seed": 2, "drop_last": True, "partitions": None}
    parts = [epoch_indices(DataLoader(data, 10, shard=(r, 4), **kw)) for r in range(4)]
    merged = np.concatenate(parts)
    assert sorted(merged.tolist()) == list(range(400))
    for r, part in enumerate(parts):
        assert np.array_equal(part, quasi_shard_order(400, data.block_bounds, 2, 0, r, 4, 100))
    blocks = [set((part // 20).tolist()) for part in parts]
    for r in range(4):  # 5 whole blocks a rank: no block read by two ranks
        assert len(blocks[r]) == 5
        assert all(not (blocks[r] & blocks[q]) for q in range(r))
    # Unequal blocks: a rank's share differs from the others' by less than a block, and
    # the rows past it even the shares out.
    sizes = [7, 30, 3, 12, 25, 9, 14]
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    for world, per in [(3, 33), (3, 34), (2, 50)]:
        shares = [quasi_shard_order(100, bounds, 5, 1, r, world, per) for r in range(world)]
        assert all(len(share) == per for share in shares)
        merged = np.concatenate(shares)
        if per * world >= 100:
            assert sorted(set(merged.tolist())) == list(range(100))
        else:
            assert len(set(merged.tolist())) == per * world


def test_quasi_order_needs_blocks():
    with pytest.raises(ValueError, match="blocks"):
        DataLoader(np.arange(10), 2, shuffle="quasi")


def test_auto_shard_reads_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "5")
    assert resolve_shard("auto") == (2, 5)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert resolve_shard("auto") == (0, 1)


@pytest.mark.parametrize("shard", [(2, 2), (-1, 3), "rank0", (0,)])
def test_bad_shards_are_refused(shard):
    with pytest.raises(ValueError, match="shard"):
        resolve_shard(shard)


def test_sharded_loaders_without_a_seed_agree_on_the_order():
    loaders = [DataLoader(np.arange(50), 5, shuffle=True, shard=(r, 2)) for r in range(2)]
    assert loaders[0].seed == loaders[1].seed == 0
    assert DataLoader(np.arange(50), 5, shuffle=True, shard=(0, 2), seed=9).seed == 9
    parts = [epoch_indices(loader) for loader in loaders]
    assert sorted(np.concatenate(parts).tolist()) == list(range(50))


_RANK_SCRIPT = """
import numpy as np
from fastload import DataLoader
loader = DataLoader(np.arange(305), 16, shuffle=True, shard="auto")
print(",".join(str(int(i)) for batch in loader for i in batch))
"""


def test_two_rank_processes_without_a_seed_load_disjoint_blocks_of_one_order():
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK_SCRIPT],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "PYTHONPATH": root},
        )
        for r in range(2)
    ]
    parts = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        parts.append([int(v) for v in out.strip().split(",")])
    assert len(parts[0]) == len(parts[1]) == 153
    together = parts[0] + parts[1]
    assert set(together) == set(range(305))
    assert len(together) - len(set(together)) == 1  # the one index padding repeats


# -- a loader without shard= in a job of several ranks ----------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

UNSHARDED_SCRIPT = """
import os, sys, warnings
import numpy as np
import torch.distributed as dist
import fastload

port, rank = sys.argv[1], int(sys.argv[2])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(2):  # once per process
        assert len(list(fastload.DataLoader(np.arange(8), batch_size=4))) == 2
    list(fastload.eachobs_parallel(np.arange(8)))
    silent = fastload.DataLoader(np.arange(8), batch_size=4, shard=False)
    sharded = fastload.DataLoader(np.arange(8), batch_size=4, shard="auto")
messages = [str(w.message) for w in caught]
assert len(messages) == 1, messages
assert "torch.distributed runs 2 ranks" in messages[0] and "shard='auto'" in messages[0]
assert caught[0].filename == "<string>", caught[0].filename  # the user's line
assert (len(silent), len(sharded)) == (2, 1)
dist.barrier()
dist.destroy_process_group()
"""


def test_an_unsharded_loader_in_a_process_group_of_two_warns_once_naming_shard_auto():
    pytest.importorskip("torch")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", UNSHARDED_SCRIPT, str(port), str(rank)],
            env={**env, "PYTHONPATH": ROOT},
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        errors = [proc.communicate(timeout=300)[1] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert [proc.returncode for proc in procs] == [0, 0], errors


def test_a_world_size_in_the_environment_warns_and_shard_false_silences_it(monkeypatch):
    monkeypatch.setattr(sharding, "_warned_unsharded", False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.warns(UserWarning, match="WORLD_SIZE runs 4 ranks.*shard='auto'"):
        fastload.DataLoader(np.arange(8), batch_size=4)
    monkeypatch.setattr(sharding, "_warned_unsharded", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = fastload.DataLoader(np.arange(8), batch_size=4, shard=False)
    assert len(loader) == 2
    monkeypatch.setenv("WORLD_SIZE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fastload.DataLoader(np.arange(8), batch_size=4)
