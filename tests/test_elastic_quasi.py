"""Elastic quasi-random order: ``shuffle="quasi"`` over a packed dataset deals each epoch's
blocks to partitions, so that every world size dividing them loads the same global
batches while each rank reads blocks no other rank reads, and a state saved on one world
size resumes on another at the same global position (ranks simulated in one process with
``shard=(rank, world_size)``; ``test_torch_distributed.py`` runs real ranks)."""

import time

import numpy as np
import pytest
from helpers import deadline
from hypothesis import given, settings
from hypothesis import strategies as st
from servers import S3Server

import fastload
from fastload import DataLoader
from fastload.order import (
    quasi_partition_order,
    quasi_partition_rows,
    quasi_random_order,
    quasi_shard_order,
)
from fastload.storage import Bytes

N, GLOBAL, PARTITIONS, SEED = 600, 16, 8, 11
WORLDS = (1, 2, 4)


def _rows(n=N):
    """Rows of uneven sizes, so that the blocks hold different numbers of rows."""
    return [{"label": k, "blob": bytes(k % 37)} for k in range(n)]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    path = tmp_path_factory.mktemp("packed") / "data.arrow"
    fastload.write(
        path, _rows(), {"label": "int64", "blob": Bytes()}, block_bytes=400, progress=False
    )
    return path


@pytest.fixture(scope="module")
def ds(packed):
    data = fastload.open(packed)
    assert data.num_blocks >= 4 * PARTITIONS  # several blocks a partition
    assert len(set(np.diff(data.block_bounds).tolist())) > 1  # of different sizes
    return data


def _loaders(data, world, **options):
    """The ``world`` ranks' loaders of global batch ``GLOBAL``, quasi-random order."""
    kw = dict({"shuffle": "quasi", "seed": SEED, "partitions": PARTITIONS}, **options)
    return [DataLoader(data, GLOBAL // world, shard=(r, world), **kw) for r in range(world)]


def _labels(batch):
    return np.asarray(batch["label"]).tolist()


def _per_rank(loaders):
    """Each rank's batches of one epoch, as lists of labels (the rows' positions)."""
    per_rank = [[_labels(b) for b in loader] for loader in loaders]
    assert len({len(p) for p in per_rank}) == 1  # every rank steps together
    return per_rank


def _global(per_rank):
    """Each step's batches concatenated in rank order."""
    return [[i for p in per_rank for i in p[k]] for k in range(len(per_rank[0]))]


def _blocks(data, rows):
    return set((np.searchsorted(data.block_bounds, rows, side="right") - 1).tolist())


@pytest.fixture(scope="module")
def reference(ds):
    """Two epochs of global batches on one rank, on the consumer's thread."""
    (one,) = _loaders(ds, 1)
    return [_global(_per_rank([one])) for _ in range(2)]


@pytest.mark.parametrize(
    "options", [{}, {"parallel": 2}, {"parallel": 2, "backend": "process"}], ids=str
)
def test_every_world_size_dividing_the_partitions_loads_the_same_global_batches(
    ds, reference, options
):
    for world in WORLDS:
        loaders = _loaders(ds, world, **options)
        with deadline(120):
            epochs = [_global(_per_rank(loaders)) for _ in range(2)]
        assert epochs == reference, (world, options)
        for loader in loaders:
            loader.close()
    assert reference[0] != reference[1]  # a new order each epoch


def test_the_loader_draws_the_documented_rule(ds, reference):
    for epoch in range(2):
        for world in WORLDS:
            ranks = [
                quasi_partition_order(
                    len(ds), ds.block_bounds, SEED, epoch, r, world, GLOBAL, PARTITIONS
                )
                for r in range(world)
            ]
            b = GLOBAL // world
            steps = [
                np.concatenate([o[k * b : (k + 1) * b] for o in ranks])
                for k in range(len(ranks[0]) // b)
            ]
            assert [s.tolist() for s in steps] == reference[epoch]


def test_each_rank_reads_blocks_no_other_rank_reads(ds):
    for world in (2, 4):
        loaders = _loaders(ds, world)
        for _ in range(2):
            blocks = [_blocks(ds, [i for b in p for i in b]) for p in _per_rank(loaders)]
            for r in range(world):
                assert all(not (blocks[r] & blocks[q]) for q in range(r)), (world, r)
            assert set().union(*blocks) == set(range(ds.num_blocks))


def test_every_row_once_an_epoch_and_the_padding_within_its_partition(ds, reference):
    per = GLOBAL // PARTITIONS
    for epoch, steps in enumerate(reference):
        rows = quasi_partition_rows(len(ds), ds.block_bounds, SEED, epoch, PARTITIONS)
        assert rows.sum() == N and rows.max() - rows.min() <= np.diff(ds.block_bounds).max()
        # As many steps as the largest partition fills; the others wrap around.
        assert len(steps) == -(-int(rows.max()) // per)
        flat = [i for s in steps for i in s]
        assert sorted(set(flat)) == list(range(N))
        assert len(flat) - N == len(steps) * GLOBAL - N  # the padding, and nothing else
        for p in range(PARTITIONS):  # partition p's items of each step, in order
            mine = [i for s in steps for i in s[p * per : (p + 1) * per]]
            own = mine[: rows[p]]
            assert len(set(own)) == rows[p]  # its rows once, then its own first rows again
            assert mine[rows[p] :] == (own * len(mine))[: len(mine) - rows[p]]


def test_drop_last_drops_what_the_smallest_partition_does_not_fill(ds):
    (one,) = _loaders(ds, 1, drop_last=True)
    steps = _global(_per_rank([one]))
    rows = quasi_partition_rows(len(ds), ds.block_bounds, SEED, 0, PARTITIONS)
    assert len(steps) == int(rows.min()) // (GLOBAL // PARTITIONS)
    flat = [i for s in steps for i in s]
    assert len(set(flat)) == len(flat) == len(steps) * GLOBAL  # no row twice
    for world in (2, 4):
        assert _global(_per_rank(_loaders(ds, world, drop_last=True))) == steps


def _consumed(loaders, k):
    """The first ``k`` global steps of ``loaders``' next epoch (left mid-epoch)."""
    its = [iter(loader) for loader in loaders]
    return [[i for it in its for i in _labels(next(it))] for _ in range(k)]


def test_a_state_saved_on_one_world_size_resumes_on_another_at_the_same_position(ds, reference):
    steps = len(reference[0])
    for before in WORLDS:
        for k in (0, 1, 5, steps - 1):
            saver = _loaders(ds, before)
            done = _consumed(saver, k)
            state = saver[-1].state_dict()
            assert state["partitions"] == PARTITIONS and state["steps"] == steps
            for after in WORLDS:
                resumed = _loaders(ds, after)
                for loader in resumed:
                    loader.load_state_dict(state)
                rest = _global(_per_rank(resumed))
                # The rest of the epoch exactly once, none of what was consumed.
                assert done + rest == reference[0], (before, after, k)
                assert _global(_per_rank(resumed)) == reference[1]  # then the next epoch


def test_a_state_of_the_order_of_each_world_size_resumes_as_before(ds):
    """A state saved before the partitions (format 3) keeps that order, on its rank."""
    legacy = _loaders(ds, 2, partitions=None)
    done = _consumed(legacy, 3)
    state = legacy[0].state_dict()
    assert state["partitions"] is None
    old = {k: v for k, v in state.items() if k != "partitions"}
    old["format"] = "fastload.container_loader/3"
    whole = [[i for b in p for i in b] for p in _per_rank(_loaders(ds, 2, partitions=None))]
    for r in range(2):
        assert (
            whole[r]
            == quasi_shard_order(N, ds.block_bounds, SEED, 0, r, 2, -(-N // 2)).tolist()[
                : len(whole[r])
            ]
        )
    for r, loader in enumerate(_loaders(ds, 2, partitions="auto")):  # 8 fits
        loader.load_state_dict(dict(old, rank=r))
        rest = [i for b in loader for i in _labels(b)]
        ahead = [i for step in done for i in step[r * 8 : (r + 1) * 8]]
        assert ahead + rest == whole[r]
        assert loader.state_dict()["partitions"] is None  # and it keeps that order
    with pytest.raises(ValueError, match="rank 0 of 2, this loader is rank 0 of 4"):
        _loaders(ds, 4)[0].load_state_dict(old)


def test_partitions_that_do_not_fit_are_a_clear_error(ds, tmp_path):
    with pytest.raises(ValueError, match="3 ranks do not divide partitions=8"):
        DataLoader(ds, 4, shuffle="quasi", shard=(0, 3), partitions=8)
    with pytest.raises(ValueError, match="partitions=8 does not divide the global batch of 12"):
        DataLoader(ds, 6, shuffle="quasi", shard=(0, 2), partitions=8)
    few = tmp_path / "few.arrow"
    fastload.write(
        few, _rows(40), {"label": "int64", "blob": Bytes()}, block_bytes=400, progress=False
    )
    with pytest.raises(ValueError, match="non-empty blocks, fewer than partitions=8"):
        DataLoader(fastload.open(few), 8, shuffle="quasi", partitions=8)
    with pytest.raises(ValueError, match="partitions= deals a packed dataset's blocks"):
        DataLoader(ds, 8, shuffle=True, partitions=8)
    with pytest.raises(ValueError, match="partitions must be an int >= 1"):
        DataLoader(ds, 8, shuffle="quasi", partitions=0)


def test_auto_partitions_are_8_on_several_ranks_where_that_fits(ds, reference):
    def partitions(batch_size, world, **options):
        loader = DataLoader(ds, batch_size, shuffle="quasi", shard=(0, world), **options)
        return loader.state_dict()["partitions"]

    assert partitions(8, 2) == partitions(4, 4) == partitions(24, 2) == 8
    assert partitions(4, 3) is None  # 3 ranks do not divide 8
    assert partitions(6, 2) is None  # 8 does not divide 12
    # One process: the quasi order, every row once.
    assert partitions(16, 1) is None
    (one,) = _loaders(ds, 1, partitions="auto")
    flat = [i for b in _per_rank([one])[0] for i in b]
    assert flat == quasi_random_order(N, ds.block_bounds, SEED, 0).tolist()
    assert _global(_per_rank(_loaders(ds, 2, partitions="auto"))) == reference[0]


def test_a_state_resumes_only_where_its_partitions_and_global_batch_are(ds):
    saver = _loaders(ds, 2)
    _consumed(saver, 2)
    state = saver[0].state_dict()
    with pytest.raises(ValueError, match="resume on a world size dividing 8"):
        DataLoader(ds, 4, shuffle="quasi", seed=SEED, shard=(0, 3)).load_state_dict(state)
    with pytest.raises(ValueError, match="this loader's global batch is 32"):
        DataLoader(ds, 8, shuffle="quasi", seed=SEED, shard=(0, 4)).load_state_dict(state)
    with pytest.raises(ValueError, match="partitions=8, this one's to partitions=4"):
        DataLoader(ds, 8, shuffle="quasi", seed=SEED, shard=(0, 2), partitions=4).load_state_dict(
            state
        )


# -- at a URL: each rank fetches its own blocks ------------------------------------------


@pytest.fixture(scope="module")
def s3(packed, tmp_path_factory):
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    server = S3Server(log)
    server.put("data", "data.arrow", packed.read_bytes())
    server.log = log
    yield server
    server.stop()


def _gets(server):
    """The GETs of the dataset's object moto's server has logged so far (a line each,
    written just after the answer: read until two reads agree)."""
    counts = [-1]
    while True:
        counts.append(server.log.read_text(errors="replace").count("GET /data/data.arrow HTTP"))
        if counts[-1] == counts[-2]:
            return counts[-1]
        time.sleep(0.2)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_ranks_at_a_url_fetch_disjoint_blocks_and_the_same_global_batches(s3, reference, backend):
    for world in (2, 4):
        fetched, requests, per_rank = [], [], []
        for rank in range(world):
            data = fastload.open(
                "s3://data/data.arrow", storage_options=s3.storage_options, cache_bytes=0
            )
            before = _gets(s3)
            loader = DataLoader(
                data,
                GLOBAL // world,
                shuffle="quasi",
                seed=SEED,
                shard=(rank, world),
                parallel=2,
                backend=backend,
            )
            with deadline(120):
                per_rank.append([_labels(b) for b in loader])
            requests.append(_gets(s3) - before)
            fetched.append(data.remote_rows.present.astype(bool))
        assert _global(per_rank) == reference[0]
        for r in range(world):
            assert all(not (fetched[r] & fetched[q]).any() for q in range(r)), (world, r)
            # A GET a block (and a check of the object's version per read).
            assert fetched[r].sum() <= requests[r] <= 2 * fetched[r].sum(), (world, r, requests)
        assert np.logical_or.reduce(fetched).all()


def test_a_refused_state_leaves_the_loader_as_it_was(ds):
    legacy = _loaders(ds, 2, partitions=None)
    _consumed(legacy, 1)
    old = dict(legacy[0].state_dict(), format="fastload.container_loader/3")
    del old["partitions"]
    loader = DataLoader(ds, 8, shuffle="quasi", seed=SEED, shard=(0, 2))
    loader.load_state_dict(old)  # the order of 2 ranks, from now on
    saver = [DataLoader(ds, 8, shuffle="quasi", seed=SEED, shard=(r, 4)) for r in range(4)]
    _consumed(saver, 1)
    with pytest.raises(ValueError, match="global batch of 32.*this loader's global batch is 16"):
        loader.load_state_dict(saver[0].state_dict())
    assert loader.state_dict()["partitions"] is None


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 9), min_size=1, max_size=40),
    partitions=st.sampled_from([1, 2, 4, 8]),
    share=st.integers(1, 3),
    seed=st.integers(0, 2**64 - 1),
    drop_last=st.booleans(),
)
def test_the_rule_holds_for_any_blocks(sizes, partitions, share, seed, drop_last):
    """Any blocks, partitions, share of a step per partition: every world size dividing
    the partitions has the same global sequence, its ranks disjoint blocks, and the epoch
    every row once (with drop_last: at most once)."""
    n, glob = sum(sizes), share * partitions
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    if sum(1 for x in sizes if x) < partitions:
        with pytest.raises(ValueError, match="fewer than partitions"):
            quasi_partition_order(n, sizes, seed, 0, 0, 1, glob, partitions)
        return
    sequences = []
    for world in [w for w in (1, 2, 4, 8) if partitions % w == 0]:
        ranks = [
            quasi_partition_order(n, sizes, seed, 0, r, world, glob, partitions, drop_last)
            for r in range(world)
        ]
        b = glob // world
        sequences.append(np.stack([o.reshape(-1, b) for o in ranks], 1).ravel().tolist())
        blocks = [set(np.searchsorted(bounds, o, side="right").tolist()) for o in ranks]
        assert all(not (blocks[r] & blocks[q]) for r in range(world) for q in range(r))
    assert all(s == sequences[0] for s in sequences)
    flat = sequences[0]
    if drop_last:
        assert len(set(flat)) == len(flat)
    else:
        assert set(flat) == set(range(n))
    assert len(flat) % glob == 0
