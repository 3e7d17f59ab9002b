"""Reading packed datasets ahead of a quasi-random order (``fastload._storage.readahead``,
``filepages``) and the memory checks around it: the order and every row once per epoch
are kept, with shards and with ``shard=``; blocks are let go only of rows no later step
reads; ``shuffle=True`` warns once when the files outgrow the memory this process may use;
the cgroup limits (v1 and v2) and what is free under them are read; the read-ahead's
budget follows what it measures (memory free, the disk's and the loader's rates) within
its bounds; blocks are checked against their checksums as they are read, ahead of the
loader, and a block that does not match still stops the loader."""

import os
import time
import warnings

import numpy as np
import pytest
import simplejpeg
from hypothesis import given
from hypothesis import strategies as st

import fastload
from fastload import DataLoader
from fastload._storage import filepages, memory, readahead
from fastload._storage.readahead import ReadAhead, wave_bytes
from fastload.errors import LoadError
from fastload.order import quasi_random_order, quasi_shard_order
from fastload.storage import JPEG, Raw, write

ROWS_PER_SHARD, SHARDS, SIDE = 60, 3, 8


def image(i):
    return np.random.default_rng(i).integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)


def rows(first, count):
    return [
        {"image": image(i), "jpeg": simplejpeg.encode_jpeg(image(i), quality=90), "label": i}
        for i in range(first, first + count)
    ]


FIELDS = {"image": Raw(), "jpeg": JPEG(), "label": "int64"}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """A directory of 3 files of 60 rows, about 10 rows a block."""
    root = tmp_path_factory.mktemp("shards")
    for k in range(SHARDS):
        write(
            str(root / f"part-{k}.arrow"),
            rows(k * ROWS_PER_SHARD, ROWS_PER_SHARD),
            FIELDS,
            block_bytes=2500,
            progress=False,
        )
    return str(root)


@pytest.fixture
def recorded(monkeypatch, shards):
    """Memory smaller than the files (blocks are let go) and a record of every block the
    reader read (``load``) and let go (``drop``, ``drop_rows``)."""
    size = sum(os.path.getsize(os.path.join(shards, f)) for f in os.listdir(shards))
    monkeypatch.setattr(filepages, "memory_limit", lambda: size // 3)
    calls = {"load": 0, "drop": 0, "drop_rows": 0}
    for name in calls:
        real = getattr(filepages.FilePages, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(filepages.FilePages, name, counted)
    aheads = []
    real_read_ahead = filepages.FilePages.read_ahead
    monkeypatch.setattr(
        filepages.FilePages,
        "read_ahead",
        lambda self, *args: aheads.append(real_read_ahead(self, *args)) or aheads[-1],
    )
    calls["threads"] = aheads
    return calls


def finished(recorded):
    """The counts, once every read-ahead started has ended."""
    for ahead in recorded["threads"]:
        ahead.close()
        ahead.join()
    return recorded


def labels_of(loader):
    return np.concatenate([np.asarray(batch["label"]).copy() for batch in loader])


@pytest.mark.parametrize("parallel,backend", [(False, "thread"), (2, "thread"), (2, "process")])
def test_read_ahead_keeps_the_quasi_order_and_the_rows(shards, recorded, parallel, backend):
    ds = fastload.open(shards)
    assert ds.num_blocks > 10 and len(ds.files) == SHARDS
    loader = DataLoader(ds, 7, shuffle="quasi", seed=5, parallel=parallel, backend=backend)
    for epoch in range(2):
        seen = []
        for batch in loader:
            for label, pixels, jpeg in zip(batch["label"], batch["image"], batch["jpeg"]):
                assert np.array_equal(pixels, image(int(label)))
                assert jpeg.shape == (SIDE, SIDE, 3)
            seen.extend(int(x) for x in batch["label"])
        assert seen == quasi_random_order(len(ds), ds.block_bounds, 5, epoch).tolist()
    loader.close()
    assert finished(recorded)["load"] > 0 and recorded["drop"] > 0  # read and let go


def test_read_ahead_over_columns_and_shards_covers_every_row_once(shards, recorded):
    ds = fastload.open(shards)
    n, world = len(ds), 3
    parts = []
    for rank in range(world):
        loader = DataLoader(
            {"jpeg": ds["jpeg"].encoded, "label": ds["label"]},
            5,
            shuffle="quasi",
            seed=1,
            shard=(rank, world),
            parallel=2,
        )
        parts.append(labels_of(loader))
        loader.close()
    merged = np.concatenate(parts)
    assert sorted(merged.tolist()) == list(range(n))
    shares = [
        quasi_shard_order(n, ds.block_bounds, 1, 0, r, world, n // world) for r in range(world)
    ]
    assert np.array_equal(merged, np.concatenate(shares))
    blocks = [set(np.searchsorted(ds.block_bounds, p, side="right") - 1) for p in parts]
    assert not (blocks[0] & blocks[1]) and not (blocks[1] & blocks[2])  # 3-row blocks, 60 a rank
    assert finished(recorded)["load"] > 0


def test_a_step_resumed_mid_epoch_reads_ahead_from_there(shards, recorded):
    ds = fastload.open(shards)
    loader = DataLoader(ds, 6, shuffle="quasi", seed=2)
    it = iter(loader)
    first = [int(x) for _ in range(4) for x in next(it)["label"]]
    state = loader.state_dict()
    rest = labels_of(_resumed(ds, state)).tolist()
    assert first + rest == quasi_random_order(len(ds), ds.block_bounds, 2, 0).tolist()


def _resumed(ds, state):
    loader = DataLoader(ds, 6, shuffle="quasi", seed=2)
    loader.load_state_dict(state)
    return loader


class FakePages:
    """Blocks of 10 rows, 1000 bytes each; records nothing: ``ReadAhead`` decides."""

    def __init__(self, n):
        self.block_bounds = np.arange(0, n + 1, 10)
        self.nbytes = 1000 * (len(self.block_bounds) - 1)

    def block_nbytes(self):
        return np.full(len(self.block_bounds) - 1, 1000, np.int64)


@pytest.mark.parametrize("rows,seed", [(4, 0), (7, 1), (16, 2), (1, 3)])
def test_blocks_are_let_go_only_of_rows_that_no_later_step_reads(rows, seed):
    n = 200
    order = quasi_random_order(n, np.arange(0, n + 1, 10), seed, 0, wave=3)
    ahead = ReadAhead(FakePages(n), order, rows, 0, limit=1)
    ahead.plan()
    for k in range(len(ahead.queue)):  # as if every block had been read
        ahead._held.append((int(ahead.last[k]), k, 0))
    ahead._held.sort()
    steps = -(-n // rows)
    step_of = np.empty(n, np.int64)
    step_of[order] = np.arange(n) // rows
    released = {0: set(), 1: set()}
    for step in range(steps):
        ahead.delivered(step)
        for q, part in ahead._release:
            block = int(ahead.queue[q])
            block_rows = np.arange(block * 10, block * 10 + 10)
            last = int(ahead.last[q])
            kept = block_rows[step_of[block_rows] == last]
            gone = np.setdiff1d(block_rows, kept) if part == 0 else kept
            assert np.all(step_of[gone] <= step), (block, part, step)
            assert q not in released[part]
            released[part].add(q)
        ahead._release.clear()
    assert released[0] == released[1] == set(range(len(ahead.queue)))


def test_file_pages_let_go_of_whole_pages_inside_the_block_but_the_kept_rows(tmp_path):
    path = str(tmp_path / "pages.arrow")  # rows of 3 KB, blocks of 40 KB: 10 pages
    write(
        path,
        [{"image": np.full((32, 32, 3), i % 256, np.uint8), "label": i} for i in range(100)],
        {"image": Raw(), "label": "int64"},
        block_bytes=40_000,
        progress=False,
    )
    ds = fastload.open(path)
    pages = ds.file_pages
    let_go = []
    pages._let_go = let_go.extend
    block = 3
    lo, hi = int(ds.block_bounds[block]), int(ds.block_bounds[block + 1])
    keep = np.array([lo + 1, hi - 1])
    pages.drop(block, keep=keep)
    assert let_go
    inside = filepages._pages(pages.spans()[block], outward=False)
    kept = filepages._pages(pages._row_spans(keep), outward=True)
    for shard, start, stop in let_go:
        assert start % filepages._PAGE == 0 and stop % filepages._PAGE == 0
        assert any(s == shard and a <= start and stop <= b for s, a, b in inside)
        assert not any(s == shard and start < b and a < stop for s, a, b in kept)
    let_go.clear()
    pages.drop_rows(block, keep)
    assert let_go and all(
        any(s == shard and a <= start and stop <= b for s, a, b in inside)
        for shard, start, stop in let_go
    )
    read = filepages._merged(pages.pieces(block))  # what load() reads: the block
    for shard, start, stop in pages.spans()[block]:
        assert any(s == shard and a <= start and stop <= b for s, a, b in read)


def test_shuffle_true_warns_once_when_the_files_outgrow_memory(shards, monkeypatch):
    ds = fastload.open(shards)
    monkeypatch.setattr(filepages, "memory_limit", lambda: ds.nbytes - 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every warning the loader gives counts
        loader = DataLoader(ds, 8, shuffle=True)
        for _ in range(2):
            labels_of(loader)
    assert len(caught) == 1 and caught[0].category is UserWarning
    assert "shuffle='quasi'" in str(caught[0].message)
    with pytest.warns(UserWarning, match="larger than the memory"):
        DataLoader((ds["jpeg"].encoded, ds["label"]), 8, shuffle=True, collate=False)


@pytest.mark.parametrize("shuffle", [True, False, "quasi"])
def test_no_warning_when_the_files_fit_or_the_order_is_block_local(shards, monkeypatch, shuffle):
    ds = fastload.open(shards)
    fits = shuffle is True
    monkeypatch.setattr(
        filepages, "memory_limit", lambda: ds.nbytes * 2 if fits else ds.nbytes // 2
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        labels_of(DataLoader(ds, 8, shuffle=shuffle))


def test_a_dataset_read_into_memory_neither_warns_nor_reads_ahead(shards, monkeypatch):
    ds = fastload.open(shards, cache="memory")
    monkeypatch.setattr(filepages, "memory_limit", lambda: 1)
    assert ds.file_pages is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        labels_of(DataLoader(ds, 8, shuffle=True))
        assert DataLoader(ds, 8, shuffle="quasi")._pages is None


def _cgroup_tree(tmp_path, version, limit, parent_limit, usage=None, inactive=0):
    """A cgroup file system of ``jobs/job1`` (``limit``, and ``usage`` bytes charged of
    which ``inactive`` are inactive page cache, when given) under ``jobs``
    (``parent_limit``); returns the paths of its ``/proc/self/cgroup`` and mountinfo."""
    mount = tmp_path / "cgroup"
    own = mount / "jobs" / "job1"
    own.mkdir(parents=True)
    name = "memory.limit_in_bytes" if version == 1 else "memory.max"
    (own / name).write_text(f"{limit}\n")
    (mount / "jobs" / name).write_text(f"{parent_limit}\n")
    if usage is not None:
        used = "memory.usage_in_bytes" if version == 1 else "memory.current"
        (own / used).write_text(f"{usage}\n")
        stat = "total_inactive_file" if version == 1 else "inactive_file"
        (own / "memory.stat").write_text(f"anon 5\n{stat} {inactive}\nfile 7\n")
    if version == 1:
        cgroup = "5:cpu:/\n4:memory:/jobs/job1\n"
        mount_line = f"40 30 0:35 / {mount} rw - cgroup cgroup rw,memory\n"
    else:
        cgroup = "0::/jobs/job1\n"
        mount_line = f"40 30 0:35 / {mount} rw - cgroup2 cgroup2 rw\n"
    (tmp_path / "cgroup.txt").write_text(cgroup)
    (tmp_path / "mountinfo.txt").write_text("22 1 8:1 / / rw - ext4 /dev/vda rw\n" + mount_line)
    return str(tmp_path / "cgroup.txt"), str(tmp_path / "mountinfo.txt")


@pytest.mark.parametrize("version", [1, 2])
def test_the_memory_limit_is_the_smallest_of_the_cgroup_and_its_parents(tmp_path, version):
    unlimited = "9223372036854771712" if version == 1 else "max"
    paths = _cgroup_tree(tmp_path, version, 1 << 30, unlimited)
    assert memory._cgroup_limits(*paths) == [1 << 30]
    paths = _cgroup_tree(tmp_path / "b", version, 3 << 30, 2 << 30)
    assert min(memory._cgroup_limits(*paths)) == 2 << 30


def test_the_memory_limit_is_at_most_the_ram():
    limit = memory.memory_limit()
    assert limit is None or 0 < limit <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@pytest.mark.parametrize("version", [1, 2])
def test_the_memory_room_is_the_limit_less_the_usage_with_others_inactive_cache_free(
    tmp_path, version
):
    gib = 1 << 30
    paths = _cgroup_tree(tmp_path, version, gib, "max", usage=gib // 2, inactive=gib // 4)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 100 kB\nMemAvailable: 8388608 kB\n")  # 8 GiB
    # Held page cache is not counted as free, inactive or not.
    assert memory.memory_room(0, *paths, str(meminfo)) == gib // 2 + gib // 4
    assert memory.memory_room(gib // 8, *paths, str(meminfo)) == gib // 2 + gib // 8
    assert memory.memory_room(gib // 2, *paths, str(meminfo)) == gib // 2
    # The system's MemAvailable binds too, and the room is never negative.
    meminfo.write_text("MemAvailable: 262144 kB\n")  # 256 MiB
    assert memory.memory_room(0, *paths, str(meminfo)) == gib // 4
    assert memory.memory_room(gib, *paths, str(meminfo)) == 0


def test_the_memory_room_is_unknown_without_cgroup_or_meminfo(tmp_path):
    missing = str(tmp_path / "none")
    assert memory.memory_room(0, missing, missing, missing) is None


MIB = 1 << 20


def test_the_wave_is_two_working_sets_while_nothing_is_measured():
    assert wave_bytes(512 * MIB) == 1024 * MIB
    assert wave_bytes(512 * MIB, disk_rate=2e9) == 1024 * MIB  # the loader's rate unknown


def test_the_wave_shrinks_to_the_memory_free_but_never_below_a_working_set():
    assert wave_bytes(512 * MIB, room=700 * MIB) == 700 * MIB
    assert wave_bytes(512 * MIB, room=100 * MIB) == 512 * MIB
    assert wave_bytes(512 * MIB, room=0) == 512 * MIB
    assert wave_bytes(512 * MIB, room=4096 * MIB) == 1024 * MIB


def test_the_wave_holds_what_the_disk_must_read_ahead_while_a_wave_is_used():
    # The loader uses bytes 10x as fast as the disk reads them: a tenth of the next wave
    # must be read while this one is used, twice that for noise.
    assert wave_bytes(500 * MIB, disk_rate=1e8, use_rate=1e9) == 600 * MIB
    # A disk at half the loader's rate or faster: the whole next wave.
    assert wave_bytes(500 * MIB, disk_rate=5e8, use_rate=1e9) == 1000 * MIB
    assert wave_bytes(500 * MIB, disk_rate=4e9, use_rate=1e9) == 1000 * MIB
    # The memory free binds before the rates.
    assert wave_bytes(500 * MIB, 550 * MIB, disk_rate=1e8, use_rate=1e9) == 550 * MIB


@given(
    working_set=st.integers(0, 1 << 40),
    room=st.none() | st.integers(0, 1 << 41),
    disk_rate=st.none() | st.floats(1.0, 1e12),
    use_rate=st.none() | st.floats(1.0, 1e12),
)
def test_the_wave_stays_within_its_bounds(working_set, room, disk_rate, use_rate):
    got = wave_bytes(working_set, room, disk_rate, use_rate)
    assert working_set <= got <= 2 * working_set
    if room is not None:
        assert got <= max(working_set, room)


def test_the_budget_follows_the_memory_measured_before_each_block(monkeypatch):
    n = 200
    order = quasi_random_order(n, np.arange(0, n + 1, 10), 0, 0, wave=3)
    ahead = ReadAhead(FakePages(n), order, 10, 0, limit=80_000)
    ahead.plan()
    assert ahead.working_set == 3000  # a wave: 3 blocks of 1000 bytes
    free = {"bytes": 1 << 30}
    monkeypatch.setattr(readahead, "memory_room", lambda held: free["bytes"])
    assert ahead.budget() == 6000  # room for two waves
    free["bytes"] = 14_500  # less the slack, an eighth of the limit: 4,500 bytes
    assert ahead.budget() == 4500
    ahead._nbytes = 1000  # held bytes are the reader's to keep
    assert ahead.budget() == 5500
    free["bytes"] = 0
    assert ahead.budget() == 3000


def test_blocks_are_checked_as_they_are_read_before_any_step_is_delivered(shards):
    ds = fastload.open(shards)
    order = quasi_random_order(len(ds), ds.block_bounds, 0, 0)
    ahead = ds.file_pages.read_ahead(order, 8).start()
    try:
        deadline = time.monotonic() + 60
        while not ds._checks.done.all() and time.monotonic() < deadline:
            time.sleep(0.01)
        # Every block is read (all the steps of this small order are ones the engine may
        # be loading) and checked, with no step delivered.
        assert ds._checks.done.all()
    finally:
        ahead.close()
        ahead.join(timeout=10)


def test_a_block_that_does_not_match_still_stops_the_loader(shards, tmp_path, recorded):
    ds = fastload.open(shards)
    block = 2
    shard, start, stop = ds.file_pages.spans()[block][0]
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in sorted(os.listdir(shards)):
        data = bytearray(open(os.path.join(shards, name), "rb").read())
        if name == sorted(os.listdir(shards))[shard]:
            data[(start + stop) // 2] ^= 0xFF
        (bad / name).write_bytes(bytes(data))
    loader = DataLoader(fastload.open(str(bad)), 8, shuffle="quasi", parallel=2)
    with pytest.raises(LoadError, match=rf"block {block} \(rows \d+\.\.\d+\) does not match"):
        labels_of(loader)
    finished(recorded)
