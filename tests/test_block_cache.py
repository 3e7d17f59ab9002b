"""The local cache of remote blocks (fastload/_storage/blockcache.py), on real files and
real processes: hits and misses, one fetch for processes that ask at once, bad blocks,
eviction, a process killed holding a block's lock, and a cache that cannot be written."""

import multiprocessing
import os
import resource
import signal
import time

import pytest
from helpers import deadline

from fastload._storage.blockcache import BlockCache
from fastload.errors import LoadError

KEY = "s3://bucket/train.arrow#etag-1"
BLOCK_BYTES = 1000

fork = multiprocessing.get_context("fork")


def payload(block):
    return bytes((block * 7 + i) % 251 for i in range(BLOCK_BYTES))


def checker(block):
    def check(data):
        if bytes(data) != payload(block):
            raise ValueError(f"block {block} differs from its payload")

    return check


def counting_fetch(counter, block, wait_s=0.0, data=None):
    """A fetch that appends a line to ``counter`` (one write: processes may share it),
    waits ``wait_s`` seconds and returns ``data`` (the block's payload by default)."""

    def fetch():
        with open(counter, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(wait_s)
        return payload(block) if data is None else data

    return fetch


def fetches(counter):
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def block_files(directory, suffix=".blk"):
    return sorted(p.name for p in directory.rglob(f"*{suffix}"))


def get(cache, block, counter, **fetch_options):
    return cache.get(KEY, block, counting_fetch(counter, block, **fetch_options), checker(block))


def test_a_miss_fetches_once_and_a_hit_reads_the_cached_block(tmp_path):
    with deadline(10):
        cache = BlockCache(tmp_path / "cache", 10 * BLOCK_BYTES)
        counter = tmp_path / "fetches"
        assert bytes(get(cache, 3, counter)) == payload(3)
        assert fetches(counter) == 1
        assert block_files(tmp_path / "cache") == ["3.blk"]
        for _ in range(3):
            assert bytes(get(cache, 3, counter)) == payload(3)
        assert fetches(counter) == 1
        other = BlockCache(tmp_path / "cache", 10 * BLOCK_BYTES)  # another object, same files
        assert bytes(get(other, 3, counter)) == payload(3)
        assert fetches(counter) == 1
        assert block_files(tmp_path / "cache", ".tmp") == []
        assert block_files(tmp_path / "cache", ".lock") == []


def _get_in_child(directory, counter, block, wait_s, start):
    start.wait(10)
    cache = BlockCache(directory, 10 * BLOCK_BYTES)
    data = get(cache, block, counter, wait_s=wait_s)
    os._exit(0 if bytes(data) == payload(block) else 1)


def test_processes_asking_for_one_block_at_once_fetch_it_once(tmp_path):
    with deadline(20):
        counter = tmp_path / "fetches"
        start = fork.Barrier(4)
        children = [
            fork.Process(target=_get_in_child, args=(tmp_path / "cache", counter, 5, 0.3, start))
            for _ in range(4)
        ]
        for child in children:
            child.start()
        for child in children:
            child.join()
        assert [child.exitcode for child in children] == [0, 0, 0, 0]
        assert fetches(counter) == 1
        assert block_files(tmp_path / "cache") == ["5.blk"]


def test_a_corrupt_cached_block_is_fetched_again_once_and_replaced(tmp_path):
    with deadline(10):
        cache = BlockCache(tmp_path / "cache", 10 * BLOCK_BYTES)
        counter = tmp_path / "fetches"
        get(cache, 2, counter)
        (path,) = (tmp_path / "cache").rglob("2.blk")
        with open(path, "r+b") as f:
            f.seek(100)
            f.write(bytes([payload(2)[100] ^ 0xFF]))
        assert bytes(get(cache, 2, counter)) == payload(2)
        assert fetches(counter) == 2
        assert path.read_bytes() == payload(2)
        assert bytes(get(cache, 2, counter)) == payload(2)
        assert fetches(counter) == 2


def test_a_block_that_stays_bad_raises_load_error_naming_the_object_and_block(tmp_path):
    with deadline(10):
        cache = BlockCache(tmp_path / "cache", 10 * BLOCK_BYTES)
        counter = tmp_path / "fetches"
        bad = b"x" * BLOCK_BYTES
        with pytest.raises(LoadError, match=r"block 4 of 's3://bucket/train\.arrow#etag-1'"):
            get(cache, 4, counter, data=bad)
        assert fetches(counter) == 2  # fetched, then once again
        assert block_files(tmp_path / "cache") == []

        get(cache, 4, counter)
        (path,) = (tmp_path / "cache").rglob("4.blk")
        path.write_bytes(bad)  # a cached copy gone bad counts as the first failure
        with pytest.raises(LoadError, match="block 4 of") as raised:
            get(cache, 4, counter, data=bad)
        assert isinstance(raised.value.__cause__, ValueError)
        assert fetches(counter) == 4
        assert block_files(tmp_path / "cache") == []


def test_eviction_keeps_the_total_within_max_bytes_and_evicts_the_least_recently_used(tmp_path):
    with deadline(10):
        cache = BlockCache(tmp_path / "cache", 3 * BLOCK_BYTES)
        counter = tmp_path / "fetches"
        for block in (0, 1, 2):
            get(cache, block, counter)
        get(cache, 0, counter)  # now 1 is the least recently used
        get(cache, 3, counter)
        assert block_files(tmp_path / "cache") == ["0.blk", "2.blk", "3.blk"]
        assert cache.total_bytes() <= 3 * BLOCK_BYTES
        assert fetches(counter) == 4
        get(cache, 1, counter)  # fetched again; evicts 2
        assert fetches(counter) == 5
        assert block_files(tmp_path / "cache") == ["0.blk", "1.blk", "3.blk"]
        for block in range(10):
            get(cache, block, counter)
            assert cache.total_bytes() <= 3 * BLOCK_BYTES


def test_a_reader_holding_an_evicted_block_still_reads_its_bytes(tmp_path):
    with deadline(10):
        cache = BlockCache(tmp_path / "cache", BLOCK_BYTES)
        counter = tmp_path / "fetches"
        get(cache, 0, counter)
        held = get(cache, 0, counter)  # from the file
        assert isinstance(held, memoryview)
        get(cache, 1, counter)
        assert block_files(tmp_path / "cache") == ["1.blk"]
        assert bytes(held) == payload(0)


def _hold_the_lock_forever(directory, started):
    def fetch():
        started.touch()
        time.sleep(60)
        return payload(0)

    BlockCache(directory, 10 * BLOCK_BYTES).get(KEY, 0, fetch, checker(0))
    os._exit(1)


def test_a_process_killed_holding_a_blocks_lock_blocks_no_one(tmp_path):
    with deadline(15):
        started = tmp_path / "started"
        child = fork.Process(target=_hold_the_lock_forever, args=(tmp_path / "cache", started))
        child.start()
        while not started.exists():
            assert child.is_alive(), "the child ended before fetching"
            time.sleep(0.01)
        counter = tmp_path / "fetches"
        cache = BlockCache(tmp_path / "cache", 10 * BLOCK_BYTES)
        get(cache, 1, counter)  # its eviction leaves the lock that a live process holds
        assert block_files(tmp_path / "cache", ".lock") == ["0.lock"]
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        assert bytes(get(cache, 0, counter)) == payload(0)
        assert fetches(counter) == 2
        assert block_files(tmp_path / "cache", ".lock") == []


def test_the_files_a_dead_writer_left_are_removed_by_the_next_eviction(tmp_path):
    with deadline(10):
        cache = BlockCache(tmp_path / "cache", 10 * BLOCK_BYTES)
        counter = tmp_path / "fetches"
        get(cache, 0, counter)
        (folder,) = (tmp_path / "cache").iterdir()
        (folder / "5.tmp").write_bytes(payload(5)[:300])  # died writing block 5
        (folder / "6.lock").write_bytes(b"")  # died fetching block 6
        get(cache, 1, counter)
        assert block_files(tmp_path / "cache") == ["0.blk", "1.blk"]
        assert block_files(tmp_path / "cache", ".tmp") == []
        assert block_files(tmp_path / "cache", ".lock") == []


def test_a_cache_directory_that_cannot_be_created_raises_load_error(tmp_path):
    with deadline(10):
        (tmp_path / "file").write_bytes(b"")
        directory = tmp_path / "file" / "cache"
        with pytest.raises(LoadError, match="cache_dir=.*cache_bytes=0") as raised:
            BlockCache(directory, BLOCK_BYTES)
        assert str(directory) in str(raised.value)


def _get_with_files_limited(directory, counter):
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails: EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (BLOCK_BYTES // 2, resource.RLIM_INFINITY))
    try:
        get(BlockCache(directory, 10 * BLOCK_BYTES), 0, counter)
    except LoadError as error:
        os._exit(0 if "cache_bytes=0" in str(error) else 2)
    os._exit(1)


def test_a_write_that_fails_raises_load_error_and_leaves_no_block_file(tmp_path):
    with deadline(10):
        counter = tmp_path / "fetches"
        child = fork.Process(target=_get_with_files_limited, args=(tmp_path / "cache", counter))
        child.start()
        child.join()
        assert child.exitcode == 0
        assert fetches(counter) == 1
        assert block_files(tmp_path / "cache") == []
        assert block_files(tmp_path / "cache", ".tmp") == []
        assert block_files(tmp_path / "cache", ".lock") == []


def test_max_bytes_zero_stores_nothing(tmp_path):
    with deadline(10):
        (tmp_path / "file").write_bytes(b"")
        cache = BlockCache(tmp_path / "file" / "cache", 0)  # not even created
        counter = tmp_path / "fetches"
        for _ in range(2):
            assert bytes(get(cache, 1, counter)) == payload(1)
        assert fetches(counter) == 2
        with pytest.raises(LoadError, match="block 1 of"):
            get(cache, 1, counter, data=b"bad")
        assert fetches(counter) == 4


@pytest.mark.parametrize("max_bytes", [-1, 1.5, True, None])
def test_a_max_bytes_not_a_count_raises_value_error(tmp_path, max_bytes):
    with pytest.raises(ValueError, match="max_bytes must be an int >= 0"):
        BlockCache(tmp_path, max_bytes)


def test_a_block_not_an_index_raises_value_error(tmp_path):
    cache = BlockCache(tmp_path, BLOCK_BYTES)
    with pytest.raises(ValueError, match="block must be an int >= 0"):
        cache.get(KEY, -1, lambda: b"", lambda data: None)
