"""Packed datasets at a URL, read from real servers on 127.0.0.1 (moto's S3 server, an HTTP
server with byte ranges): the same values as the local files, byte for byte, through
every way of reading them; blocks fetched once and checked; the cache; the faults."""

import gc
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import deadline
from servers import RangeServer, S3Server, free_port

import fastload
from fastload import DataLoader, LoadError, mapobs, obsview
from fastload._storage.blockcache import BlockCache
from fastload.storage import JPEG, Bytes, Raw

N = 120


def _rows(n=N):
    rng = np.random.default_rng(0)
    return [
        {
            "image": rng.integers(0, 255, (24 + i % 3, 20, 3), np.uint8),
            "label": i,
            "raw": np.full((3, 4), i % 256, np.uint8),
        }
        for i in range(n)
    ]


FIELDS = {"image": JPEG(quality=90), "label": "int64", "raw": Raw((3, 4), "uint8")}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Two packed files of 60 rows each, in blocks of a few rows, and one of them whole."""
    root = tmp_path_factory.mktemp("packed")
    rows = _rows()
    for k in range(2):
        part = rows[k * 60 : (k + 1) * 60]
        fastload.write(root / f"part-{k}.arrow", part, FIELDS, block_bytes=4000, progress=False)
    fastload.write(root / "all.arrow", rows, FIELDS, block_bytes=4000, progress=False)
    return root


@pytest.fixture(scope="module")
def s3(files, tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("moto") / "moto.log")
    for name in ("part-0.arrow", "part-1.arrow", "all.arrow"):
        server.put(
            "data",
            f"train/{name}" if name.startswith("part") else name,
            (files / name).read_bytes(),
        )
    yield server
    server.stop()


@pytest.fixture
def http(files, tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    (root / "all.arrow").write_bytes((files / "all.arrow").read_bytes())
    server = RangeServer(root)
    yield server
    server.stop()


def _same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert np.array_equal(np.asarray(a), np.asarray(b))


def _open_s3(s3, path, **kwargs):
    kwargs.setdefault("cache_bytes", 0)
    return fastload.open(f"s3://data/{path}", storage_options=s3.storage_options, **kwargs)


# -- the same values as the local files -----------------------------------------------------


def test_a_dataset_at_a_url_reads_what_the_local_file_holds(s3, files):
    local = fastload.open(files / "all.arrow")
    ds = _open_s3(s3, "all.arrow")
    assert len(ds) == len(local) and ds.num_blocks == local.num_blocks > 10
    assert ds.keys() == local.keys() and ds.encodings == local.encodings
    assert not ds.remote_rows.present.any()  # nothing of the bulk fetched at open
    _same(ds[7], local[7])
    assert ds.remote_rows.present.sum() == 1  # row 7's block alone
    _same(ds[[3, 100, 55]], local[[3, 100, 55]])
    _same(ds[10:30], local[10:30])
    assert bytes(ds["image"].encoded[90]) == bytes(local["image"].encoded[90])
    _same(ds["raw"][[1, 119]], local["raw"][[1, 119]])
    _same(np.asarray(ds["raw"]), np.asarray(local["raw"]))
    _same(ds["label"], local["label"])
    assert ds.verify()["blocks"] == local.num_blocks
    assert ds.remote_rows.present.all()


def test_a_prefix_and_a_glob_open_their_objects_in_name_order(s3, files):
    local = fastload.open(files / "part-*.arrow")
    for path in ("train/", "train/part-*.arrow"):
        ds = _open_s3(s3, path)
        assert ds.files == ["s3://data/train/part-0.arrow", "s3://data/train/part-1.arrow"]
        _same(ds[np.arange(N)], local[np.arange(N)])
        assert [len(f) for f in ds.file_datasets] == [60, 60]
        _same(ds.file_datasets[1][5], local[65])


LOADERS = [
    {"parallel": 2},
    {"parallel": False},
    {"parallel": 2, "shuffle": True, "buffer": True},
    {"parallel": 2, "shuffle": "quasi"},
    {"parallel": 2, "backend": "process"},
    {"parallel": 2, "backend": "process", "shuffle": "quasi", "buffer": True},
]


@pytest.mark.parametrize(
    "options", LOADERS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items())
)
def test_loaders_give_the_batches_of_the_local_file(s3, files, options):
    local = fastload.open(files / "all.arrow")
    ds = _open_s3(s3, "all.arrow")
    with deadline(60):
        got = [b for b in DataLoader(ds, batch_size=16, seed=4, **options)]
        want = [b for b in DataLoader(local, batch_size=16, seed=4, **options)]
    assert len(got) == len(want) == 8
    _same(got, want)
    assert ds.remote_rows.present.all()


def test_views_and_columns_at_a_url_load_as_the_local_ones(s3, files):
    local = fastload.open(files / "all.arrow")
    ds = _open_s3(s3, "all.arrow")
    perm = np.random.default_rng(1).permutation(N)

    def built(d):
        shape = mapobs(lambda b: np.frombuffer(b, np.uint8)[:4].copy(), d["image"].encoded)
        return (obsview(d["raw"], perm), shape, d["label"])

    with deadline(60):
        got = list(DataLoader(built(ds), batch_size=10, parallel=2))
        want = list(DataLoader(built(local), batch_size=10, parallel=2))
    _same(got, want)


def test_an_http_url_reads_as_the_local_file(http, files):
    local = fastload.open(files / "all.arrow")
    ds = fastload.open(f"{http.url}/all.arrow", cache_bytes=0)
    with deadline(60):
        _same(
            list(DataLoader(ds, batch_size=32, shuffle=True, seed=2)),
            list(DataLoader(local, batch_size=32, shuffle=True, seed=2)),
        )


# -- each block fetched once, by one rank -------------------------------------------------


def test_each_block_is_fetched_once_and_the_second_epoch_makes_no_request(http):
    ds = fastload.open(f"{http.url}/all.arrow", cache_bytes=0)
    at_open = http.requests
    loader = DataLoader(ds, batch_size=8, shuffle="quasi", seed=0, parallel=2)
    with deadline(60):
        list(loader)
    per_epoch = http.requests - at_open
    assert per_epoch <= 2 * ds.num_blocks  # one GET per block (and a version check per read)
    with deadline(60):
        list(loader)
    assert http.requests - at_open == per_epoch


def test_ranks_fetch_disjoint_blocks(http):
    fetched = []
    for rank in range(3):
        ds = fastload.open(f"{http.url}/all.arrow", cache_bytes=0)
        with deadline(60):
            n = sum(
                len(b["label"]) for b in DataLoader(ds, 8, shuffle="quasi", shard=(rank, 3), seed=1)
            )
        assert n == 40
        fetched.append(ds.remote_rows.present.astype(bool))
    both = [(fetched[a] & fetched[b]).sum() for a in range(3) for b in range(a)]
    assert sum(both) <= 2  # at most the blocks whose rows even the shares out
    assert np.logical_or.reduce(fetched).all()


def test_a_resumed_loader_gives_the_rest_of_the_epoch(s3, files):
    local = fastload.open(files / "all.arrow")
    ds = _open_s3(s3, "all.arrow")
    loader = DataLoader(ds, batch_size=8, shuffle="quasi", seed=3)
    it = iter(loader)
    first = [next(it) for _ in range(5)]
    state = loader.state_dict()
    resumed = DataLoader(_open_s3(s3, "all.arrow"), batch_size=8, shuffle="quasi", seed=3)
    resumed.load_state_dict(state)
    _same(first + list(resumed), list(DataLoader(local, batch_size=8, shuffle="quasi", seed=3)))


# -- the cache on disk ----------------------------------------------------------------------


def test_a_cache_large_enough_serves_the_next_opens_without_fetching_a_block(http, tmp_path):
    cache = tmp_path / "cache"
    ds = fastload.open(f"{http.url}/all.arrow", cache_dir=cache, cache_bytes=1 << 30)
    with deadline(60):
        first = list(DataLoader(ds, batch_size=16, seed=0))
    assert BlockCache(cache, 1 << 30).total_bytes() == ds.remote_rows.block_nbytes().sum()
    again = fastload.open(f"{http.url}/all.arrow", cache_dir=cache, cache_bytes=1 << 30)
    at_open = http.requests
    with deadline(60):
        _same(list(DataLoader(again, batch_size=16, seed=0)), first)
    assert http.requests == at_open


def test_the_cache_stays_within_its_bytes(http, tmp_path):
    cache = tmp_path / "cache"
    ds = fastload.open(f"{http.url}/all.arrow", cache_dir=cache, cache_bytes=20_000)
    assert ds.remote_rows.block_nbytes().sum() > 60_000
    with deadline(60):
        list(DataLoader(ds, batch_size=16, seed=0))
    assert 0 < BlockCache(cache, 20_000).total_bytes() <= 20_000


def test_no_cache_writes_nothing_to_disk(http, tmp_path):
    ds = fastload.open(f"{http.url}/all.arrow", cache_dir=tmp_path / "cache", cache_bytes=0)
    ds.verify()
    assert not (tmp_path / "cache").exists()


def test_an_unwritable_cache_is_a_clear_error(http, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")  # a file where the cache's directory would be
    with pytest.raises(LoadError, match="cache"):
        ds = fastload.open(
            f"{http.url}/all.arrow", cache_dir=blocker / "cache", cache_bytes=1 << 20
        )
        ds[0]


_KEPT = """
import sys, numpy as np, fastload

def status(key):  # kB of this process's resident memory of that kind (Linux)
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)

ds = fastload.open(sys.argv[1], cache_dir=sys.argv[2], cache_bytes=int(sys.argv[3]))
before = status("RssShmem")
total = sum(int(b["raw"].sum()) for b in fastload.DataLoader(ds, 16, parallel=2))
print(total, status("RssShmem") - before, int(ds.remote_rows.nbytes.sum()))
"""


def test_blocks_kept_for_later_epochs_are_pages_the_kernel_can_reclaim(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    rows = [{"raw": np.full((200, 200), i, np.uint8)} for i in range(200)]  # 8 MB
    fastload.write(root / "big.arrow", rows, {"raw": Raw((200, 200), "uint8")}, progress=False)
    server = RangeServer(root)
    try:
        url, cache = f"{server.url}/big.arrow", str(tmp_path / "cache")
        kept = {}
        for cache_bytes in (1 << 30, 0):
            run = [sys.executable, "-c", _KEPT, url, cache, str(cache_bytes)]
            done = subprocess.run(run, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            total, kept[cache_bytes], bulk = (int(x) for x in done.stdout.split())
            assert total == sum(int(r["raw"].sum()) for r in rows) and bulk >= 8_000_000
    finally:
        server.stop()
    # With a disk cache, the blocks are file pages in its directory (written back, then
    # reclaimable); without one (nothing written to disk), shared memory, as measured.
    assert kept[1 << 30] < bulk // 8 and kept[0] > bulk // 2
    assert not list((tmp_path / "cache").rglob(".fastload-mirror*"))  # unlinked at open


_TWO_READERS = """
import sys, numpy as np, fastload
ds = fastload.open(sys.argv[1], cache_dir=sys.argv[2], cache_bytes=1 << 30)
print(int(sum(int(np.asarray(b["raw"]).sum()) for b in fastload.DataLoader(ds, 16))))
"""


def test_two_processes_fill_one_cache_at_once(http, files, tmp_path):
    cache = tmp_path / "cache"
    run = [sys.executable, "-c", _TWO_READERS, f"{http.url}/all.arrow", str(cache)]
    procs = [subprocess.Popen(run, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    expected = sum(int(r["raw"].sum()) for r in _rows())
    assert [int(o) for o in outs] == [expected, expected]
    ds = fastload.open(f"{http.url}/all.arrow", cache_dir=cache, cache_bytes=1 << 30)
    assert BlockCache(cache, 1 << 30).total_bytes() == ds.remote_rows.block_nbytes().sum()
    assert not list(cache.rglob("*.tmp"))


_FULL_DISK = """
import resource, signal, sys, fastload
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))  # no block fits on this "disk"
ds = fastload.open(sys.argv[1], cache_dir=sys.argv[2], cache_bytes=1 << 30)
try:
    ds[0]
except fastload.LoadError as error:
    print(error)
"""


def test_a_cache_on_a_full_disk_is_a_clear_error_and_leaves_nothing_half_written(http, tmp_path):
    cache = tmp_path / "cache"
    run = [sys.executable, "-c", _FULL_DISK, f"{http.url}/all.arrow", str(cache)]
    done = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "cache" in done.stdout and str(cache) in done.stdout and "large" in done.stdout
    assert not [p for p in cache.rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    ds = fastload.open(f"{http.url}/all.arrow", cache_dir=cache, cache_bytes=1 << 30)
    assert ds[0]["label"] == 0  # the same cache, with room: nothing wrong was kept


@pytest.fixture
def small_disk(tmp_path):
    """A directory on a tmpfs of 160 KiB (mounted as root): room for the parts of the
    dataset that open reads, not for all its blocks. Unmounted after the test."""
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160k", "tmpfs", str(mount)]).returncode:
        pytest.fail("root could not mount a tmpfs here")
    yield mount
    for thread in threading.enumerate():  # a closed prefetch's thread ends at its next wake
        if thread.name == "fastload-prefetch":
            thread.join(10)
    # A fetch in flight when the loader closed lands on its own thread, holding its
    # dataset until then: the map may be let go a little after the test, never kept.
    waited = time.monotonic() + 30
    while True:
        gc.collect()
        busy = subprocess.run(["umount", str(mount)], capture_output=True).returncode
        if not busy or time.monotonic() > waited:
            break
        time.sleep(0.2)
    if busy:
        subprocess.run(["umount", "-l", str(mount)])  # leave nothing mounted
    assert not busy, "the tmpfs stayed in use for 30 s: a map of the dataset outlived it"


def _error_of_an_epoch(ds, parallel):
    """The message of the LoadError that ends an epoch of ``ds`` (the error and its frames
    go with this call)."""
    try:
        with deadline(60):
            for _ in DataLoader(ds, batch_size=8, parallel=parallel):
                pass
    except LoadError as error:
        return str(error)
    raise AssertionError("the epoch ended without an error")


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
@pytest.mark.parametrize("parallel", [False, 2])
def test_blocks_on_a_full_disk_are_a_load_error_naming_it(http, files, small_disk, parallel):
    ds = fastload.open(f"{http.url}/all.arrow", cache_dir=small_disk, cache_bytes=1 << 30)
    assert ds.remote_rows.files[0].mirror.backed  # the blocks go to a file on that disk
    message = _error_of_an_epoch(ds, parallel)
    assert str(small_disk) in message and "cache_dir=" in message, message
    del ds
    ds = fastload.open(f"{http.url}/all.arrow", cache_dir=files / "roomy", cache_bytes=1 << 30)
    local = fastload.open(files / "all.arrow")
    for k in (0, N // 2, N - 1):  # what a full disk stopped is read whole elsewhere
        _same(ds[k], local[k])


# -- faults ----------------------------------------------------------------------------------


def _bulk_offset(ds, block):
    return ds.remote_rows.blocks[block].ranges[0][0] + 3


def test_a_block_altered_on_the_server_is_never_handed_out(http):
    ds = fastload.open(f"{http.url}/all.arrow", cache_bytes=0)
    http.altered = _bulk_offset(ds, 4)
    rows = np.arange(ds.block_bounds[4], ds.block_bounds[5])
    with pytest.raises(LoadError, match=r"all\.arrow.*block 4.*checksum"):
        ds[int(rows[0])]
    assert not ds.remote_rows.present[4]
    with pytest.raises(LoadError, match=r"block 4"), deadline(60):
        list(DataLoader(ds, batch_size=8, parallel=2))
    http.altered = None
    _same(ds[int(rows[0])]["raw"], np.full((3, 4), int(rows[0]) % 256, np.uint8))


def test_a_server_killed_mid_epoch_fails_with_the_url(http, files):
    local = fastload.open(files / "all.arrow")
    ds = fastload.open(f"{http.url}/all.arrow", cache_bytes=0, timeout=2)
    remote, fetch = ds.remote_rows, ds.remote_rows.fetch
    killed_at = int(ds.block_bounds[6])  # the server dies as block 6 is about to be fetched

    def fetch_until_killed(k, wanted=None):
        if k >= 6:
            http.stop()
        fetch(k, wanted)

    remote.fetch = fetch_until_killed
    got = []
    with pytest.raises(LoadError, match=r"127\.0\.0\.1.*all\.arrow"), deadline(60):
        for batch in DataLoader(ds, batch_size=8, parallel=2):
            got.append(batch)
    assert len(got) <= killed_at // 8  # batches of blocks fetched before, then the error
    _same(got, list(DataLoader(local, batch_size=8))[: len(got)])


def test_a_server_back_within_the_timeout_loses_nothing(http, files):
    local = fastload.open(files / "all.arrow")
    ds = fastload.open(f"{http.url}/all.arrow", cache_bytes=0, timeout=30)
    http.stop()
    http.restart_after(1.0)
    with deadline(60):
        _same(list(DataLoader(ds, batch_size=8, parallel=2)), list(DataLoader(local, batch_size=8)))


def test_a_stalled_server_times_out_with_a_clear_error(http):
    ds = fastload.open(f"{http.url}/all.arrow", cache_bytes=0, timeout=1)
    http.stall = True
    with pytest.raises(LoadError, match="within 1 s"), deadline(60):
        list(DataLoader(ds, batch_size=8, parallel=2))
    with pytest.raises(LoadError, match="within 1 s"), deadline(60):
        ds[0]


def test_a_truncated_object_is_refused_at_open(http, files):
    data = (files / "all.arrow").read_bytes()
    (Path(http.root) / "cut.arrow").write_bytes(data[: len(data) - 100])
    with pytest.raises(LoadError, match="cut.arrow"):
        fastload.open(f"{http.url}/cut.arrow", cache_bytes=0)
    (Path(http.root) / "junk.arrow").write_bytes(b"not arrow at all" * 100)
    with pytest.raises(LoadError, match="junk.arrow.*not an Arrow IPC"):
        fastload.open(f"{http.url}/junk.arrow", cache_bytes=0)


def test_refused_credentials_give_the_stores_message_with_the_url(http):
    http.refuse = True
    with pytest.raises(LoadError, match=r"all\.arrow.*(403|Access Denied|Forbidden)"):
        fastload.open(f"{http.url}/all.arrow", cache_bytes=0)


# -- a dataset larger than memory_bytes --------------------------------------------------------

BIG = 1200  # rows of 1 KiB in blocks of 16 KiB: 75 blocks, 1.2 MB
BUDGET = 150_000  # about 9 blocks


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A range server over a dataset of 75 blocks (1.2 MB), and two files of half of it."""
    root = tmp_path_factory.mktemp("big")
    rows = [
        {"x": np.full((32, 32), i % 251, np.uint8), "label": i, "tag": bytes([i % 251]) * 8}
        for i in range(BIG)
    ]
    fields = {"x": Raw((32, 32), "uint8"), "label": "int64", "tag": Bytes()}
    fastload.write(root / "all.arrow", rows, fields, block_bytes=16 << 10, progress=False)
    (root / "parts").mkdir()
    for k in range(2):
        part = rows[k * BIG // 2 : (k + 1) * BIG // 2]
        fastload.write(
            root / "parts" / f"{k}.arrow", part, fields, block_bytes=16 << 10, progress=False
        )
    server = RangeServer(root)
    yield server
    server.stop()


def _shared_memory():
    """The shared pages mapped in this process (the mirrors are shared maps)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) << 10 for line in status if line.startswith("RssShmem"))


@pytest.mark.parametrize(
    "options",
    [{}, {"parallel": False}, {"buffer": True}, {"parallel": 2, "backend": "process"}],
    ids=["threads", "sequential", "buffer", "processes"],
)
def test_a_dataset_larger_than_memory_bytes_is_read_within_them(big, options):
    ds = fastload.open(f"{big.url}/all.arrow", cache_bytes=0, memory_bytes=BUDGET)
    remote = ds.remote_rows
    assert remote.bounded and remote.nbytes.sum() > 8 * BUDGET
    loader = DataLoader(ds, 50, shuffle="quasi", seed=1, **options)
    for _ in range(2):
        before, held, labels = big.requests, 0, []
        mapped = base = _shared_memory()
        with deadline(120):
            for batch in loader:
                x, label = np.asarray(batch["x"]), np.asarray(batch["label"])
                assert (x == (label % 251).astype(np.uint8)[:, None, None]).all()
                labels.append(label)
                held = max(held, remote.held_bytes())
                mapped = max(mapped, _shared_memory())
        assert sorted(np.concatenate(labels).tolist()) == list(range(BIG))
        # Within the budget, but for the blocks of the steps being loaded.
        assert held <= 3 * BUDGET
        if "backend" not in options:  # the pages are given back, not only marked
            assert mapped - base < 4 * BUDGET
        # Each block fetched once per epoch (a request per column): again in the second,
        # once for all processes.
        once = sum(len(block.ranges) for block in remote.blocks)
        assert once <= big.requests - before <= 1.05 * once


def test_a_bounded_dataset_mirrored_on_disk_lets_go_of_the_disk_and_pages_too(big, tmp_path):
    ds = fastload.open(
        f"{big.url}/all.arrow",
        cache_dir=tmp_path / "cache",
        cache_bytes=1 << 30,
        memory_bytes=BUDGET,
    )
    remote = ds.remote_rows
    [mirror] = [f.mirror for f in remote.files]
    assert remote.bounded and mirror.backed
    at_open = mirror.disk_bytes()  # the skeleton and the small buffers
    for _ in range(2):  # the second epoch from the disk cache
        held = on_disk = 0
        with deadline(120):
            for batch in DataLoader(ds, 50, shuffle="quasi", seed=1):
                x, label = np.asarray(batch["x"]), np.asarray(batch["label"])
                assert (x == (label % 251).astype(np.uint8)[:, None, None]).all()
                held = max(held, remote.held_bytes())
                on_disk = max(on_disk, mirror.disk_bytes())
        assert held <= 3 * BUDGET and on_disk - at_open < 4 * BUDGET < remote.nbytes.sum()


@pytest.mark.parametrize("options", [{}, {"buffer": True}], ids=["threads", "buffer"])
def test_images_larger_than_memory_bytes_load_as_the_local_files_do(http, files, options):
    local = fastload.open(files / "all.arrow")
    budget = 10 * 5200  # 10 blocks of 30
    ds = fastload.open(f"{http.url}/all.arrow", cache_bytes=0, memory_bytes=budget)
    remote = ds.remote_rows
    assert remote.bounded and len(remote.blocks) == 30
    loader = DataLoader(ds, 8, shuffle="quasi", seed=5, parallel=2, **options)
    reference = DataLoader(local, 8, shuffle="quasi", seed=5, **options)
    for _ in range(2):
        held, steps = 0, 0
        with deadline(60):
            for got, want in zip(loader, reference, strict=True):
                _same(got, want)
                held = max(held, remote.held_bytes())
                steps += 1
        assert steps == 15
        # Within the budget, and the few blocks the gate waits for or a step being loaded
        # reads (without letting go, all 30 are held by the end)
        assert held <= budget + 3 * remote.nbytes.max()


def test_a_slow_consumer_does_not_let_the_fetching_run_ahead_of_the_budget(big):
    ds = fastload.open(f"{big.url}/all.arrow", cache_bytes=0, memory_bytes=BUDGET)
    remote, held = ds.remote_rows, 0
    with deadline(120):
        for _ in DataLoader(ds, 50, shuffle="quasi", seed=4):
            time.sleep(0.02)  # a training step: the fetching has all the time it wants
            held = max(held, remote.held_bytes())
    assert held <= 3 * BUDGET < remote.nbytes.sum() / 2


def test_python_reads_during_a_loaders_epoch_read_the_right_bytes(big):
    ds = fastload.open(f"{big.url}/all.arrow", cache_bytes=0, memory_bytes=BUDGET)
    rows = np.random.default_rng(0).permutation(BIG)[:200]
    with deadline(120):
        for k, batch in enumerate(DataLoader(ds, 50, shuffle="quasi", seed=5)):
            for i in rows[k * 8 : (k + 1) * 8]:  # between the loader's steps, other rows
                assert ds["tag"][int(i)] == bytes([int(i) % 251]) * 8
                assert (ds["x"][int(i)] == int(i) % 251).all()
            assert (np.asarray(batch["x"])[:, 0, 0] == np.asarray(batch["label"]) % 251).all()


def test_a_dataset_within_memory_bytes_keeps_its_blocks(big):
    ds = fastload.open(f"{big.url}/all.arrow", cache_bytes=0)  # half the memory: all of it
    assert not ds.remote_rows.bounded
    with deadline(60):
        list(DataLoader(ds, 50, shuffle="quasi", seed=1))
    assert ds.remote_rows.present.all()
    with pytest.raises(ValueError, match="memory_bytes"):
        fastload.open(f"{big.url}/all.arrow", cache_bytes=0, memory_bytes=-1)


def test_a_block_read_through_python_is_never_let_go(big):
    ds = fastload.open(f"{big.url}/all.arrow", cache_bytes=0, memory_bytes=BUDGET)
    remote = ds.remote_rows
    item, stored, row = ds["x"][7], ds["tag"].encoded[900], ds[534]["x"]  # views of the map
    read = remote.blocks_of(np.array([7, 900, 534]))
    tag, gathered = ds["tag"][300], ds["x"][[10, 1100]]  # copies: held while read, no more
    assert not remote.holds.any()
    assert np.flatnonzero(remote.pinned).tolist() == read.tolist()
    assert remote.present[read].all()
    with deadline(120):
        for _ in DataLoader(ds, 50, shuffle="quasi", seed=2):
            pass
    assert np.flatnonzero(remote.pinned).tolist() == read.tolist()  # the loader pins nothing
    assert remote.present[read].all() and remote.held_bytes() == remote.nbytes[read].sum()
    assert (item == 7).all() and set(bytes(stored)) == {900 % 251} and (row == 534 % 251).all()
    assert tag == bytes([300 % 251]) * 8 and gathered[1, 0, 0] == 1100 % 251


def test_a_random_order_over_a_bounded_dataset_warns(big):
    ds = fastload.open(f"{big.url}/all.arrow", cache_bytes=0, memory_bytes=BUDGET)
    with pytest.warns(UserWarning, match="shuffle='quasi'"):
        labels = [b["label"] for b in DataLoader(ds, 100, shuffle=True, seed=0)]
    assert sorted(np.concatenate(labels).tolist()) == list(range(BIG))


def test_a_wave_over_memory_bytes_warns_with_its_size_and_both_fixes(big):
    # 16 KiB blocks, waves of 8: a wave of about 130 KB, over a budget of 40 KB.
    ds = fastload.open(f"{big.url}/all.arrow", cache_bytes=0, memory_bytes=40_000)
    with pytest.warns(UserWarning) as caught:
        labels = [b["label"] for b in DataLoader(ds, 50, shuffle="quasi", seed=0)]
    assert sorted(np.concatenate(labels).tolist()) == list(range(BIG))
    message = str(caught[0].message)
    assert "this order reads a wave of 8 blocks (up to 16.5 KB each, 132 KB in all)" in message
    assert "memory_bytes=40,000 (40 KB)" in message
    assert "memory_bytes of at least" in message and "smaller blocks (block_bytes)" in message
    assert "shuffle=True" not in message and " 0 MB" not in message


def test_the_file_datasets_of_a_bounded_dataset_share_its_marks(big):
    ds = fastload.open(f"{big.url}/parts/", cache_bytes=0, memory_bytes=BUDGET)
    first, second = ds.file_datasets
    assert first.remote_rows.bounded and second.remote_rows.root is ds.remote_rows
    kept = second["x"][5]  # pinned in the dataset as well
    assert ds.remote_rows.pinned[second.remote_rows.offset + second.remote_rows.blocks_of(5)].all()
    with deadline(120):
        for batch in DataLoader(ds, 50, shuffle="quasi", seed=3):  # lets go of the others
            assert (np.asarray(batch["x"])[:, 0, 0] == np.asarray(batch["label"]) % 251).all()
        labels = [b["label"] for b in DataLoader(second, 50, shuffle="quasi", seed=3)]
    assert sorted(np.concatenate(labels).tolist()) == list(range(BIG // 2, BIG))
    assert (kept == (BIG // 2 + 5) % 251).all()


def test_local_paths_take_no_storage_options(files):
    with pytest.raises(ValueError, match="URL"):
        fastload.open(files / "all.arrow", cache_bytes=0)


# -- writing to a URL ------------------------------------------------------------------------


def test_write_uploads_a_file_that_appears_whole(s3, tmp_path):
    url = "s3://data/written/train.arrow"
    fastload.write(
        url, _rows(30), FIELDS, block_bytes=4000, progress=False, storage_options=s3.storage_options
    )
    fastload.write(tmp_path / "train.arrow", _rows(30), FIELDS, block_bytes=4000, progress=False)
    assert s3.filesystem().ls("data/written") == ["data/written/train.arrow"]  # no hidden key left
    ds = fastload.open(url, storage_options=s3.storage_options, cache_bytes=0)
    _same(ds[np.arange(30)], fastload.open(tmp_path / "train.arrow")[np.arange(30)])
    assert ds.verify()["files"] == 1

    def broken(i):
        if i == 20:
            raise OSError("a row that cannot be read")
        return _rows(30)[i]

    with pytest.raises(LoadError, match="observation 20"):
        fastload.write(
            "s3://data/broken/train.arrow",
            mapobs(broken, np.arange(30)),
            FIELDS,
            progress=False,
            storage_options=s3.storage_options,
        )
    assert not s3.filesystem().exists("data/broken/train.arrow")


def test_the_command_line_converts_to_a_url_and_reads_it_back(s3, tmp_path):
    from PIL import Image

    rng = np.random.default_rng(2)
    for label in ("cat", "dog"):
        (tmp_path / "images" / label).mkdir(parents=True)
        for k in range(3):
            pixels = rng.integers(0, 255, (16, 12, 3), np.uint8)
            Image.fromarray(pixels).save(tmp_path / "images" / label / f"{k}.png")
    options = json.dumps(s3.storage_options)
    url = "s3://data/cli/train.arrow"

    def run(*args):
        done = subprocess.run(
            [sys.executable, "-m", "fastload", *args, "--storage-options", options],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "wrote 6 images" in run("convert", str(tmp_path / "images"), url, "--no-progress")
    info = run("info", url)
    assert url in info and "6" in info
    assert "1 blocks of 1 file(s) match their checksums" in run("verify", url, "--no-progress")
    ds = fastload.open(url, storage_options=s3.storage_options, cache_bytes=0)
    assert ds.metadata["classes"] == ["cat", "dog"] and ds["label"].tolist() == [0, 0, 0, 1, 1, 1]
    # --block-bytes cuts the blocks: a block of a few rows, the verify names them all.
    small = "s3://data/cli/small-blocks.arrow"
    args = ("convert", str(tmp_path / "images"), small, "--no-progress", "--block-bytes", "1500")
    assert "wrote 6 images" in run(*args)
    assert fastload.open(small, storage_options=s3.storage_options, cache_bytes=0).num_blocks > 1


def test_write_to_a_url_defaults_to_blocks_of_a_few_mb(s3, tmp_path):
    from fastload.storage.writer import DEFAULT_BLOCK_BYTES, DEFAULT_URL_BLOCK_BYTES

    assert DEFAULT_URL_BLOCK_BYTES == 4 << 20 < DEFAULT_BLOCK_BYTES
    # 12 MB of raw rows: one block on disk, three or four at a URL.
    rows = [{"x": np.full(1 << 20, i, np.uint8)} for i in range(12)]
    fields = {"x": Raw((1 << 20,), "uint8")}
    fastload.write(tmp_path / "local.arrow", rows, fields, progress=False)
    fastload.write(
        "s3://data/defaults.arrow", rows, fields, progress=False, storage_options=s3.storage_options
    )
    assert fastload.open(tmp_path / "local.arrow").num_blocks == 1
    remote = fastload.open(
        "s3://data/defaults.arrow", storage_options=s3.storage_options, cache_bytes=0
    )
    assert 3 <= remote.num_blocks <= 4


_NO_UNCLOSED = """
import gc, sys, warnings
import fastload
warnings.simplefilter("always")
url, cache = sys.argv[1], sys.argv[2]
for _ in range(2):  # the second open reads the blocks from the cache on disk
    ds = fastload.open(url, cache_dir=cache, cache_bytes=1 << 30)
    for _ in fastload.DataLoader(ds, 16, parallel=2):
        pass
    del ds
    gc.collect()
"""


def test_a_dataset_at_a_url_leaves_no_unclosed_file(http, tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-W",
            "always",
            "-c",
            _NO_UNCLOSED,
            f"{http.url}/all.arrow",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "ResourceWarning" not in done.stderr, done.stderr


def test_short_answers_are_fetched_again_and_read_as_the_local_file(http, files):
    local = fastload.open(files / "all.arrow")
    ds = fastload.open(f"{http.url}/all.arrow", cache_bytes=0, timeout=30)
    http.short_next(5)  # well-formed 206s of half their range
    with deadline(60):
        _same(list(DataLoader(ds, 8, parallel=2)), list(DataLoader(local, 8)))
    assert http._shorts == 0


def test_a_server_without_byte_ranges_is_named_as_such(files, tmp_path):
    # Python's own file server sends the whole file for a range.
    root = tmp_path / "www"
    root.mkdir()
    (root / "all.arrow").write_bytes((files / "all.arrow").read_bytes())
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "-b", "127.0.0.1", "-d", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/all.arrow"
        with deadline(30):
            while True:
                with socket.socket() as probe:
                    if probe.connect_ex(("127.0.0.1", port)) == 0:
                        break
                time.sleep(0.1)  # not listening yet
        # At open already: its first range (the file's head) comes back whole.
        with pytest.raises(LoadError, match="does not answer byte ranges") as caught:
            with deadline(30):
                fastload.open(url, cache_bytes=0, timeout=5)
        assert "changed" not in str(caught.value) and url in str(caught.value)
    finally:
        server.kill()
        server.wait()


def _big_rows(shift):
    return [
        {
            "x": np.full((32, 32), (i + shift) % 251, np.uint8),
            "label": i,
            "tag": bytes([i % 251]) * 8,
        }
        for i in range(BIG)
    ]


@pytest.mark.parametrize(
    "options",
    [{"parallel": 2}, {"parallel": False}, {"parallel": 2, "backend": "process"}],
    ids=["threads", "sequential", "processes"],
)
def test_an_object_replaced_under_a_bounded_epoch_gives_the_documented_error(tmp_path, options):
    fields = {"x": Raw((32, 32), "uint8"), "label": "int64", "tag": Bytes()}
    for shift in (0, 1):
        path = tmp_path / f"v{shift}.arrow"
        fastload.write(path, _big_rows(shift), fields, block_bytes=16 << 10, progress=False)
    (tmp_path / "www").mkdir()
    server = RangeServer(tmp_path / "www")
    try:
        for seed in range(4):
            (tmp_path / "www" / "all.arrow").write_bytes((tmp_path / "v0.arrow").read_bytes())
            ds = fastload.open(f"{server.url}/all.arrow", cache_bytes=0, memory_bytes=BUDGET)
            with pytest.raises(LoadError, match=r"all\.arrow.*changed") as caught, deadline(60):
                for k, _ in enumerate(DataLoader(ds, 50, shuffle="quasi", seed=seed, **options)):
                    if k == 2 + 3 * seed:  # replaced, as a new version is uploaded
                        new = (tmp_path / "v1.arrow").read_bytes()
                        (tmp_path / "www" / "all.arrow").write_bytes(new)
            assert "please report" not in str(caught.value)
    finally:
        server.stop()


def _soon_bytes(ds, order, rows):
    """The most bytes of blocks that five consecutive steps of ``order`` read: what one
    loader keeps past its budget (its first step not delivered and the next four)."""
    remote = ds.remote_rows
    blocks = np.searchsorted(remote.bounds, order, side="right") - 1
    return max(
        int(remote.nbytes[np.unique(blocks[p : p + 5 * rows])].sum())
        for p in range(0, len(order), rows)
    )


@pytest.mark.parametrize("together", ["zip", "threads"])
def test_two_loaders_on_one_bounded_dataset_hold_within_the_stated_bound(big, together):
    budget = 300_000  # a quarter of the 1.2 MB
    ds = fastload.open(f"{big.url}/all.arrow", cache_bytes=0, memory_bytes=budget)
    remote = ds.remote_rows
    loaders = [DataLoader(ds, 16, shuffle="quasi", seed=s, parallel=2) for s in (1, 2)]
    bound = budget + sum(_soon_bytes(ds, loader.order(0), 16) for loader in loaders)
    held, labels = [], [[], []]

    def run(k):
        for batch in loaders[k]:
            labels[k].append(np.asarray(batch["label"]))
            held.append(remote.held_bytes())

    with deadline(120):
        if together == "zip":
            for a, b in zip(*loaders, strict=True):
                for k, batch in enumerate((a, b)):
                    labels[k].append(np.asarray(batch["label"]))
                held.append(remote.held_bytes())
        else:
            threads = [threading.Thread(target=run, args=(k,)) for k in (0, 1)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    for got in labels:
        assert sorted(np.concatenate(got).tolist()) == list(range(BIG))
    assert max(held) <= bound < remote.nbytes.sum()
