"""Streams (fastload.streams, fastload._loading.rounds): iterables without a length loaded by the
engine a window at a time; the shuffle buffer, sharding by file, resume by replay, files
over HTTP through fsspec, and clean-up."""

import bz2
import functools
import gzip
import http.server
import io
import json
import lzma
import socket
import tarfile
import threading

import numpy as np
import pytest
from helpers import assert_tree_equal, deadline, run_epochs
from hypothesis import given
from hypothesis import strategies as st

from fastload import DataLoader, FileStream, LoadError, eachobs, mapobs
from fastload._loading.rounds import ShuffleBuffer, round_size
from fastload.streams import rank_records, tar_samples
from fastload.transforms import Compose, RandomCrop


class Records:
    """A stream of ``n`` records (dicts of an array and a label), read from the start
    each time it is iterated; counts the passes."""

    def __init__(self, n):
        self.n = n
        self.passes = 0

    def __iter__(self):
        self.passes += 1
        for k in range(self.n):
            yield {"x": np.full(3, k, np.float32), "label": k}


def labels(batches):
    return np.concatenate([np.asarray(b["label"]).reshape(-1) for b in batches]).tolist()


@pytest.mark.parametrize("parallel", [False, 2])
@pytest.mark.parametrize("buffer", [False, True])
def test_a_stream_loads_in_order_in_batches_with_a_partial_last_one(parallel, buffer):
    loader = DataLoader(Records(2500), 64, parallel=parallel, buffer=buffer)
    batches = run_epochs(loader, 1)[0]
    assert [len(b["label"]) for b in batches] == [64] * 39 + [4]
    assert labels(batches) == list(range(2500))
    assert_tree_equal(
        batches[3]["x"], np.repeat(np.arange(192, 256, dtype=np.float32), 3).reshape(64, 3)
    )
    dropped = DataLoader(Records(2500), 64, drop_last=True, parallel=parallel)
    assert labels(run_epochs(dropped, 1)[0]) == list(range(2496))


def test_a_stream_has_no_length_and_every_epoch_reads_it_again():
    source = Records(10)
    loader = DataLoader(source, 4)
    with pytest.raises(TypeError, match="no length"):
        len(loader)
    assert bool(loader)
    assert [labels(e) for e in run_epochs(loader, 2)] == [list(range(10))] * 2
    assert source.passes == 2


def test_mapobs_of_a_stream_runs_on_the_pool_and_eachobs_yields_records():
    doubled = mapobs(lambda r: (r["x"] * 2, r["label"]), Records(3000))
    for parallel in (False, 3):
        batches = list(DataLoader(doubled, 100, parallel=parallel))
        assert np.concatenate([b[1] for b in batches]).tolist() == list(range(3000))
        assert batches[5][0][0].tolist() == [1000.0] * 3
    assert [int(r["label"]) for r in eachobs(Records(5))] == [0, 1, 2, 3, 4]


def test_a_generator_loads_one_epoch_then_says_it_cannot_start_over():
    loader = DataLoader((k for k in range(7)), 3)
    assert [b.tolist() for b in loader] == [[0, 1, 2], [3, 4, 5], [6]]
    with pytest.raises(ValueError, match="cannot start over"):
        iter(loader)


def test_the_shuffle_buffer_is_seeded_bounded_and_keeps_every_record():
    n, size = 5000, 300
    a = labels(DataLoader(Records(n), 50, shuffle=True, shuffle_buffer=size, seed=1))
    b = labels(DataLoader(Records(n), 50, shuffle=True, shuffle_buffer=size, seed=1, parallel=2))
    assert a == b
    assert sorted(a) == list(range(n)) and a != list(range(n))
    # A record comes out at most `size` places before it came in.
    assert min(pos - record for pos, record in enumerate(a)) >= -size
    loader = DataLoader(Records(n), 50, shuffle=True, shuffle_buffer=size, seed=1)
    first, second = (labels(e) for e in run_epochs(loader, 2))
    assert first == a and second != first


def test_shuffle_buffer_draws_the_same_for_the_same_groups():
    out = []
    for _ in range(2):
        buffer = ShuffleBuffer(4, seed=3, epoch=0)
        out.append(buffer.push(list(range(10))) + buffer.push(list(range(10, 12))) + buffer.drain())
    assert out[0] == out[1] and sorted(out[0]) == list(range(12))


def _resume_stream(make_loader, epochs=2):
    """For every stop point of an ``epochs``-epoch run, a loader restored from the state
    taken there yields the rest of the run."""
    reference = [b for e in run_epochs(make_loader(), epochs) for b in e]
    per_epoch = len(reference) // epochs
    for k in list(range(0, per_epoch + 1, 3)) + [per_epoch - 1, per_epoch]:
        loader = make_loader()
        it = iter(loader)
        for _ in range(k):
            next(it)
        state = loader.state_dict()
        assert (state["epoch"], state["step"]) == ((0, k) if k < per_epoch else (1, 0))
        restored = make_loader()
        restored.load_state_dict(state)
        rest = [b for e in run_epochs(restored, epochs - state["epoch"]) for b in e]
        assert_tree_equal(rest, reference[k:], f"resumed at step {k}")


@pytest.mark.parametrize("parallel", [False, 2])
def test_a_stream_resumes_exactly_by_replaying_its_epoch(parallel):
    _resume_stream(
        lambda: DataLoader(
            Records(700), 32, shuffle=True, shuffle_buffer=100, seed=4, parallel=parallel
        )
    )


def test_random_transforms_of_a_stream_draw_the_same_resumed_and_for_any_threads():
    image = np.random.default_rng(0).integers(0, 255, (12, 12, 3), np.uint8)
    images = [image] * 1500  # the same pixels: crops differ only by their draws

    class Images:
        def __iter__(self):
            return iter(images)

    def make(parallel=False):
        return DataLoader(
            mapobs(Compose([RandomCrop(8)]), Images()), 100, seed=2, parallel=parallel
        )

    one, three = run_epochs(make(), 1)[0], run_epochs(make(3), 1)[0]
    assert_tree_equal(one, three)
    windows = round_size(100)
    crops = np.concatenate(one)
    assert not np.array_equal(crops[0], crops[windows])  # windows draw apart
    assert len({c.tobytes() for c in crops[:50]}) > 5
    _resume_stream(make, epochs=1)


class Sharded:
    """A stream that can split itself, as a Hugging Face IterableDataset can."""

    def __init__(self, n, num_shards, index=None, world=None):
        self.n, self.num_shards, self.index, self.world = n, num_shards, index, world
        self.epochs = []

    def shard(self, num_shards, index):
        return Sharded(self.n, self.num_shards, index, num_shards)

    def set_epoch(self, epoch):
        self.epochs.append(epoch)

    def __iter__(self):
        ks = range(self.n) if self.index is None else range(self.index, self.n, self.world)
        return iter(list(ks))


def test_ranks_read_their_own_files_or_shards_or_records():
    paths = [f"f{k}" for k in range(6)]
    files = FileStream(paths, read=lambda f: [f])
    files.records = lambda path: [path]  # no file system needed
    parts = [
        list(rank_records(files, r, 3, seed=0, epoch=0, shuffle_files=False)) for r in range(3)
    ]
    assert parts == [["f0", "f3"], ["f1", "f4"], ["f2", "f5"]]
    shuffled = [
        list(rank_records(files, r, 3, seed=0, epoch=1, shuffle_files=True)) for r in range(3)
    ]
    assert sorted(p for part in shuffled for p in part) == paths and shuffled != parts
    source = Sharded(10, num_shards=4)
    assert list(rank_records(source, 1, 2, 0, 5, False)) == [1, 3, 5, 7, 9]
    assert source.epochs == [5]
    assert list(rank_records(iter(range(10)), 2, 3, 0, 0, False)) == [2, 5, 8]
    with pytest.raises(ValueError, match="files"):
        list(rank_records(files, 0, 7, 0, 0, False))


def test_sharded_stream_loaders_are_disjoint_and_cover_the_records():
    parts = [
        labels(DataLoader(Records(103), 10, shuffle=True, shuffle_buffer=20, shard=(r, 2), seed=3))
        for r in range(2)
    ]
    assert sorted(parts[0] + parts[1]) == list(range(103))


def _write_shards(folder, count, per):
    paths = []
    for s in range(count):
        path = folder / f"part-{s}.jsonl"
        path.write_text("".join(json.dumps({"id": s * per + k}) + "\n" for k in range(per)))
        paths.append(path)
    return paths


def test_shards_are_read_one_after_the_other_and_shared_out_by_file(tmp_path):
    paths = _write_shards(tmp_path, 4, 25)
    stream = mapobs(lambda r: r["id"], FileStream(paths, read=lambda f: map(json.loads, f)))
    assert np.concatenate(list(DataLoader(stream, 10))).tolist() == list(range(100))
    ranks = [
        np.concatenate(list(DataLoader(stream, 10, shard=(r, 2), shuffle=True))) for r in range(2)
    ]
    assert sorted(np.concatenate(ranks).tolist()) == list(range(100))
    assert {int(v) // 25 for v in ranks[0]}.isdisjoint({int(v) // 25 for v in ranks[1]})


@pytest.fixture
def http_folder(tmp_path):
    """A folder served over HTTP on 127.0.0.1 by a thread of this process."""
    handler = functools.partial(_QuietHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield tmp_path, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_shards_at_urls_are_read_through_fsspec(http_folder):
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    folder, url = http_folder
    _write_shards(folder, 3, 40)
    urls = [f"{url}/part-{s}.jsonl" for s in range(3)]
    stream = mapobs(lambda r: r["id"], FileStream(urls, read=lambda f: map(json.loads, f)))
    with deadline(60):
        got = np.concatenate(list(DataLoader(stream, 16, parallel=2))).tolist()
    assert got == list(range(120))


def test_tar_samples_group_members_by_key():
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for name, payload in [
            ("a/0.jpg", b"J0"),
            ("a/0.cls", b"3"),
            ("a/1.jpg", b"J1"),
            ("a/1.cls", b"5"),
            ("a/1.meta.json", b"{}"),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    data.seek(0)
    assert list(tar_samples(data)) == [
        {"__key__": "a/0", "jpg": b"J0", "cls": b"3"},
        {"__key__": "a/1", "jpg": b"J1", "cls": b"5", "meta.json": b"{}"},
    ]


def test_an_error_in_the_stream_or_in_an_item_reaches_the_consumer():
    def broken():
        yield from range(1500)
        raise OSError("connection reset")

    with pytest.raises(OSError, match="connection reset"):
        list(DataLoader(broken(), 100, parallel=2))

    def fail(record):
        if record["label"] == 1234:
            raise ValueError("bad record")
        return record["x"]

    with pytest.raises(LoadError, match="bad record"):
        list(DataLoader(mapobs(fail, Records(2000)), 100, parallel=2))


def test_breaking_out_of_a_stream_stops_its_reader():
    before = {t.ident for t in threading.enumerate()}
    loader = DataLoader(Records(10**6), 10, parallel=2, shuffle=True)
    for k, _ in enumerate(loader):
        if k == 3:
            break
    loader.close()
    with deadline(10):
        while any(
            t.name == "fastload-stream-reader" and t.ident not in before
            for t in threading.enumerate()
        ):
            threading.Event().wait(0.01)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(shuffle="quasi"),
        dict(shuffle=0),
        dict(sampler=[0]),
        dict(parallel=2, backend="process"),
    ],
)
def test_options_that_need_a_container_are_refused_for_a_stream(kwargs):
    with pytest.raises(ValueError):
        DataLoader(Records(3), 2, **kwargs)


def test_an_int_shuffle_is_refused_for_a_container():
    with pytest.raises(ValueError, match="stream"):
        DataLoader(np.arange(3), 2, shuffle=10)


def test_a_stream_beside_a_container_is_refused():
    with pytest.raises(ValueError, match="one stream"):
        DataLoader((Records(3), np.arange(3)), 2)


def test_a_pytorch_iterable_dataset_is_a_stream():
    torch = pytest.importorskip("torch")

    class Numbers(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(25))

    class Sized(Numbers):
        def __len__(self):
            return 25

    for dataset in (Numbers(), Sized()):
        loader = DataLoader(dataset, 10, parallel=2)
        assert [b.tolist() for b in loader] == [
            list(range(10)),
            list(range(10, 20)),
            list(range(20, 25)),
        ]


def test_closing_the_loader_mid_stream_ends_the_iteration_with_an_error():
    loader = DataLoader(Records(5000), 10, parallel=2)
    it = iter(loader)
    next(it)
    loader.close()
    with pytest.raises(RuntimeError, match="closed"):
        for _ in it:
            pass


def test_stream_stats_count_items_and_batches():
    loader = DataLoader(Records(2100), 100, parallel=2)
    for _ in loader:
        pass
    stats = loader.stats()
    assert (stats["items"], stats["batches"]) == (2100, 21)


def test_fewer_files_than_ranks_is_refused_at_construction():
    with pytest.raises(ValueError, match="2 files"):
        DataLoader(FileStream(["a", "b"], read=list), 4, shard=(0, 3))


def test_a_stream_has_neither_an_order_nor_a_schedule_drawn_up_front():
    loader = DataLoader(Records(100), 10)
    with pytest.raises(TypeError, match="stream"):
        loader.schedule(0)
    with pytest.raises(TypeError, match="stream"):
        loader.order(0)


def _tar_shard(path, first, count):
    """A tar file of ``count`` samples (a payload and a label each), keys ``first`` ...
    ``first + count - 1``; returns the byte offsets of its members."""
    with tarfile.open(path, mode="w") as tar:
        for k in range(first, first + count):
            for ext, payload in (("bin", bytes([k % 256]) * 700), ("cls", str(k).encode())):
                info = tarfile.TarInfo(f"s/{k:05d}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    with tarfile.open(path) as tar:
        return [m.offset for m in tar.getmembers()]


def _cut(path, size):
    data = path.read_bytes()
    path.write_bytes(data[:size])


def test_tar_samples_cut_between_members_raises_naming_the_file_and_offset(tmp_path):
    path = tmp_path / "cut.tar"
    offsets = _tar_shard(path, 0, 100)
    _cut(path, offsets[100])  # the end of sample 49: a cut on a member boundary
    got = []
    with open(path, "rb") as f, pytest.raises(ValueError, match=r"cut\.tar.*byte 128,000"):
        got.extend(tar_samples(f))
    assert [s["__key__"] for s in got] == [f"s/{k:05d}" for k in range(49)]


@pytest.mark.parametrize("where", ["header", "inside a member", "header cut"])
def test_tar_samples_damaged_or_truncated_after_the_first_member_raise(tmp_path, where):
    path = tmp_path / "bad.tar"
    offsets = _tar_shard(path, 0, 10)
    data = bytearray(path.read_bytes())
    if where == "header":
        data[offsets[4] : offsets[4] + 512] = b"\x07" * 512
    else:
        data = data[: offsets[4] + (700 if where == "inside a member" else 100)]
    path.write_bytes(bytes(data))
    with open(path, "rb") as f, pytest.raises(ValueError, match="bad.tar: not a complete tar"):
        list(tar_samples(f))


def test_a_loader_over_tar_shards_raises_for_a_truncated_one_or_skips_it(tmp_path):
    paths = []
    for s in range(3):
        paths.append(tmp_path / f"shard-{s}.tar")
        offsets = _tar_shard(paths[-1], 1000 * s, 1000)
    _cut(paths[1], offsets[1000])  # shard 1 ends after 500 samples, on a boundary
    keys = mapobs(lambda sample: int(sample["cls"]), FileStream(paths, read=tar_samples))
    with deadline(60), pytest.raises(ValueError, match=r"shard-1\.tar.*byte"):
        list(DataLoader(keys, 100, parallel=2))
    loader = DataLoader(keys, 100, parallel=2, on_error="skip")
    with deadline(60), pytest.warns(RuntimeWarning, match="skipped 1"):
        got = np.concatenate(list(loader)).tolist()
    # What shard 1 held before the cut is kept, but its sample at the cut is not.
    assert got == list(range(1000)) + list(range(1000, 1499)) + list(range(2000, 3000))
    assert loader.stats()["skipped"] == 1


@pytest.fixture
def stalled_server():
    """A loopback address whose server accepts connections and never answers."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for connection in accepted:
            connection.close()
        listener.close()


def test_a_stalled_server_times_out_naming_the_url(stalled_server, tmp_path):
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    url = f"{stalled_server}/part-0.jsonl"
    stream = FileStream([url], read=lambda f: map(json.loads, f), timeout=0.5)
    with deadline(30), pytest.raises(TimeoutError, match=f"{url}: no answer in 0.5 s"):
        list(DataLoader(stream, 16, parallel=2))


def test_a_stalled_shard_is_skipped_and_counted_with_on_error_skip(stalled_server, tmp_path):
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    paths = [str(p) for p in _write_shards(tmp_path, 2, 30)]
    stream = FileStream(
        [paths[0], f"{stalled_server}/x.jsonl", paths[1]],
        read=lambda f: map(json.loads, f),
        timeout=0.5,
    )
    loader = DataLoader(mapobs(lambda r: r["id"], stream), 16, on_error="skip")
    with deadline(30), pytest.warns(RuntimeWarning, match="skipped 1"):
        assert np.concatenate(list(loader)).tolist() == list(range(60))


class _TokenHandler(_QuietHandler):
    """Serves files only to a request with the header ``X-Token: secret``."""

    def do_GET(self):
        if self.headers.get("X-Token") != "secret":
            self.send_error(403)
            return
        super().do_GET()

    do_HEAD = do_GET


def test_shards_pass_storage_options_to_fsspec(tmp_path):
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    _write_shards(tmp_path, 1, 20)
    handler = functools.partial(_TokenHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/part-0.jsonl"
        read = lambda f: map(json.loads, f)
        with deadline(30):
            with pytest.raises(OSError):  # fsspec: the server refused (403)
                list(FileStream(url, read=read))
            stream = FileStream(url, read=read, storage_options={"headers": {"X-Token": "secret"}})
            assert [r["id"] for r in stream] == list(range(20))
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), "5", True])
def test_shards_refuse_a_timeout_that_is_not_a_positive_number(timeout):
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        FileStream(["a.tar"], read=tar_samples, timeout=timeout)


def test_a_read_that_stalls_mid_file_times_out_on_any_fsspec_filesystem(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    from fsspec.implementations.memory import MemoryFileSystem

    release = threading.Event()

    class Stalling(io.RawIOBase):
        """A remote file that gives its first 100 bytes, then waits until released."""

        def __init__(self):
            self.sent = 0

        def readable(self):
            return True

        def readinto(self, buffer):
            if self.sent >= 100:
                release.wait(30)
                return 0
            size = min(len(buffer), 100 - self.sent)
            buffer[:size] = b"x" * size
            self.sent += size
            return size

    class StallingFileSystem(MemoryFileSystem):
        protocol = "fastload-stall-test"

        def _open(self, path, mode="rb", **kwargs):
            return Stalling()  # a read gives what has come, as a socket does

    fsspec.register_implementation(StallingFileSystem.protocol, StallingFileSystem, clobber=True)
    url = "fastload-stall-test://bucket/part-0.bin"
    stream = FileStream([url], read=lambda f: iter(lambda: f.read(10), b""), timeout=0.5)
    got = []
    try:
        with deadline(30), pytest.raises(TimeoutError, match=f"reading {url}: no answer"):
            got.extend(stream)
    finally:
        release.set()
    assert got == [b"x" * 10] * 10


_KEPT = "still referenced when its memory is about to be reused"


@pytest.mark.parametrize("parallel", [False, 2])
def test_a_buffered_stream_batch_kept_too_long_is_warned_of_and_a_plain_loop_is_not(
    parallel, recwarn
):
    loader = DataLoader(Records(3000), 16, buffer=True, parallel=parallel)  # three windows
    with deadline(30):
        for batch in loader:
            total = batch["x"].sum() + batch["label"].sum()
    assert total > 0
    assert not [w for w in recwarn if _KEPT in str(w.message)]
    kept = []
    with deadline(30), pytest.warns(RuntimeWarning, match=_KEPT):
        for batch in loader:
            kept.append(batch["x"])


def test_records_of_mixed_dtypes_raise_rather_than_being_cast():
    records = [{"x": np.float32(1), "label": k} for k in range(4)]
    records += [{"x": np.float64(1e300), "label": k} for k in range(4, 8)]

    class Stream:
        def __iter__(self):
            return iter(records)

    with deadline(30), pytest.raises(LoadError, match="dtype float32 does not fit .*float64"):
        list(DataLoader(Stream(), 4))


_COMPRESSIONS = {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}


class _Named(io.BytesIO):
    """Bytes read as a file of that name (as ``open`` and ``FileStream`` give them)."""

    def __init__(self, data, name):
        super().__init__(data)
        self.name = name


def _random_samples(count, seed=0):
    """``count`` samples of random bytes (incompressible: a damaged bit of the compressed
    stream lands in a literal byte of a sample, not only in the tar's padding)."""
    rng = np.random.default_rng(seed)
    return [
        {"__key__": f"s/{k:05d}", "bin": rng.bytes(150), "cls": str(k).encode()}
        for k in range(count)
    ]


def _tar_bytes(samples):
    """The bytes of a tar file of ``samples``, as ``tar_samples`` gives them."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for sample in samples:
            for ext, payload in sample.items():
                if ext != "__key__":
                    info = tarfile.TarInfo(f"{sample['__key__']}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
    return data.getvalue()


def _read_or_raise(data, name):
    """The samples of ``data``, or None when reading it raises ``LoadError`` naming
    ``name``; what else it raises propagates."""
    try:
        return list(tar_samples(_Named(data, name)))
    except LoadError as exc:
        assert name in str(exc) and exc.source == name, str(exc)
        return None


@pytest.mark.parametrize("compression", sorted(_COMPRESSIONS))
def test_a_bit_flipped_anywhere_in_a_compressed_shard_raises_or_changes_nothing(compression):
    samples = _random_samples(6)
    reference = _COMPRESSIONS[compression](_tar_bytes(samples))
    name = f"shard.tar.{compression}"
    wrong, raised = [], 0
    for at in range(len(reference)):
        data = bytearray(reference)
        data[at] ^= 1 << (at % 8)
        got = _read_or_raise(bytes(data), name)
        if got is None:
            raised += 1
        elif got != samples:
            wrong.append(at)
    assert wrong == [], f"wrong samples with no error for flips at bytes {wrong}"
    assert raised > len(reference) // 2


@given(
    compression=st.sampled_from(sorted(_COMPRESSIONS)),
    edits=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)), min_size=1),
)
def test_any_damage_to_a_compressed_shard_raises_or_changes_nothing(compression, edits):
    samples = _random_samples(4, seed=1)
    data = bytearray(_COMPRESSIONS[compression](_tar_bytes(samples)))
    for where, mask in edits:
        data[int(where * len(data))] ^= mask
    got = _read_or_raise(bytes(data), "damaged.tar")
    assert got is None or got == samples


def test_a_compressed_shard_whose_check_fails_at_its_end_says_what_was_given(tmp_path):
    samples = _random_samples(30)
    data = bytearray(gzip.compress(_tar_bytes(samples)))
    data[-8] ^= 0x40  # the stored CRC-32: every sample decompresses as written
    path = tmp_path / "crc.tar.gz"
    path.write_bytes(bytes(data))
    got = []
    with open(path, "rb") as f, pytest.raises(LoadError) as raised:
        got.extend(tar_samples(f))
    assert got == samples[:29]  # the last one is held until the check
    message = str(raised.value)
    assert str(path) in message and "CRC" in message
    assert "29 samples handed out before this may hold damaged bytes" in message


@pytest.mark.parametrize("compression", sorted(_COMPRESSIONS))
def test_a_compressed_shard_cut_short_raises(compression):
    samples = _random_samples(10)
    data = _COMPRESSIONS[compression](_tar_bytes(samples))
    for size in (len(data) - 1, len(data) - 9, len(data) // 2):
        with pytest.raises(LoadError, match="cut.tar"):
            list(tar_samples(_Named(data[:size], "cut.tar")))


@pytest.mark.parametrize("compression", sorted(_COMPRESSIONS))
def test_compressed_shards_of_several_streams_and_zero_padding_read_whole(compression):
    samples = _random_samples(10)
    tar = _tar_bytes(samples)
    compress = _COMPRESSIONS[compression]
    data = compress(tar[:4096]) + compress(tar[4096:])  # pigz/pbzip2/xz -T: several streams
    assert list(tar_samples(_Named(data, "multi.tar"))) == samples
    if compression == "gz":  # gzip's tools accept zeros after the last member
        assert list(tar_samples(_Named(data + bytes(100), "padded.tar"))) == samples


def test_a_loader_raises_for_a_damaged_compressed_shard_or_skips_it(tmp_path):
    paths = []
    for s in range(3):
        samples = [
            {"__key__": f"s/{k}", "cls": str(k).encode()} for k in range(s * 50, s * 50 + 50)
        ]
        data = bytearray(gzip.compress(_tar_bytes(samples)))
        if s == 1:
            data[-8] ^= 1  # its CRC-32 fails, at its end
        paths.append(tmp_path / f"shard-{s}.tar.gz")
        paths[-1].write_bytes(bytes(data))
    keys = mapobs(lambda sample: int(sample["cls"]), FileStream(paths, read=tar_samples))
    with deadline(60), pytest.raises(LoadError, match=r"shard-1\.tar\.gz.*CRC"):
        list(DataLoader(keys, 10, parallel=2))
    loader = DataLoader(keys, 10, parallel=2, on_error="skip")
    with deadline(60), pytest.warns(RuntimeWarning, match="skipped 1"):
        got = np.concatenate(list(loader)).tolist()
    # What shard 1 gave before its check failed was handed out: it cannot be taken back.
    assert got == list(range(99)) + list(range(100, 150))
    assert loader.stats()["skipped"] == 1


@pytest.mark.parametrize("compression", ["", "gz", "xz"])
def test_an_error_of_the_file_itself_is_not_taken_for_damaged_data(compression):
    data = _tar_bytes(_random_samples(20))
    if compression:
        data = _COMPRESSIONS[compression](data)

    class Failing(io.RawIOBase):
        """The file's first half, then a network error, as a remote file gives it."""

        def __init__(self):
            self.given = 0

        def readable(self):
            return True

        def readinto(self, buffer):
            if self.given >= len(data) // 2:
                raise TimeoutError("reading x.tar: no answer")
            size = min(len(buffer), len(data) // 2 - self.given)
            buffer[:size] = data[self.given : self.given + size]
            self.given += size
            return size

    with pytest.raises(TimeoutError, match="no answer"):
        list(tar_samples(Failing()))


@pytest.mark.parametrize("compression", ["", "gz"])
def test_a_header_wiped_to_zeros_raises_naming_the_file_and_offset(tmp_path, compression):
    path = tmp_path / "zeroed.tar"
    offsets = _tar_shard(path, 0, 100)
    data = bytearray(path.read_bytes())
    data[offsets[100] : offsets[100] + 512] = bytes(512)  # the header of sample 50's .bin
    if compression:
        data = bytearray(gzip.compress(bytes(data)))
    got = []
    with pytest.raises(LoadError, match=r"zeroed\.tar.* block of zeros at byte 128,000"):
        got.extend(tar_samples(_Named(bytes(data), "zeroed.tar")))
    # Sample 49, read when the damage was found, may be incomplete: it is not given.
    assert [s["__key__"] for s in got] == [f"s/{k:05d}" for k in range(49)]


@pytest.mark.parametrize("member", [0, 9, 19])
def test_any_member_header_wiped_to_zeros_raises(tmp_path, member):
    path = tmp_path / "zeroed.tar"
    offsets = _tar_shard(path, 0, 10)
    data = bytearray(path.read_bytes())
    data[offsets[member] : offsets[member] + 512] = bytes(512)
    with pytest.raises(LoadError, match=f"byte {offsets[member]:,}"):
        list(tar_samples(_Named(bytes(data), "zeroed.tar")))


def test_the_end_of_a_tar_file_is_two_zero_blocks_then_only_zeros(tmp_path):
    path = tmp_path / "end.tar"
    offsets = _tar_shard(path, 0, 10)
    data = path.read_bytes()
    end = offsets[-1] + 1024  # after the last member (a 512-byte payload block)
    assert data[end:] == bytes(len(data) - end)
    keys = [f"s/{k:05d}" for k in range(10)]
    for whole in (data, data[: end + 1024], data + bytes(5000)):
        assert [s["__key__"] for s in tar_samples(_Named(whole, "end.tar"))] == keys
    for broken in (data[: end + 512], data[: end + 700], data + b"\x01", data + data):
        with pytest.raises(LoadError, match="end.tar"):
            list(tar_samples(_Named(broken, "end.tar")))


@pytest.mark.parametrize("read", [tar_samples, lambda f: map(json.loads, f)])
def test_a_refused_connection_says_so_naming_the_url(read):
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    with socket.socket() as probe:  # a port of this machine that nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/x.jsonl"
    with deadline(30), pytest.raises(ConnectionRefusedError, match=f"{url}: .*refused"):
        list(FileStream([url], read=read, timeout=10))
