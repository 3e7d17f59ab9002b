"""Reading objects by byte ranges from object storage (fastload/_storage/remote.py),
against real servers on 127.0.0.1 (tests/servers.py): moto's S3 server and an HTTP server
with byte ranges whose switches inject a store's failures. moto accepts any credentials:
refused credentials are tested with the HTTP server's 403."""

import subprocess
import sys
import threading

import numpy as np
import pytest
from helpers import deadline
from servers import RangeServer, S3Server

from fastload._storage.remote import SHORT_TRIES, RemoteObject, is_url, resolve_urls
from fastload.errors import LoadError

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

SIZE = 300_000


def payload(seed, size=SIZE):
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def some_ranges(seed, size=SIZE, n=64):
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, size, n)
    lengths = rng.integers(0, 20_000, n)
    ranges = [(int(s), int(min(size, s + n))) for s, n in zip(starts, lengths)]
    return ranges + [(0, 0), (0, size), (size - 1, size), (size, size)]


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    server = S3Server(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.stop()


@pytest.fixture
def http_server(tmp_path):
    server = RangeServer(tmp_path)
    yield server
    server.stop()


def test_is_url_tells_store_urls_from_local_paths():
    assert is_url("s3://bucket/key.arrow")
    assert is_url("https://host/data/train.arrow")
    assert is_url("gs://bucket/prefix/")
    assert not is_url("/data/train.arrow")
    assert not is_url("data/train.arrow")
    assert not is_url("file:///data/train.arrow")
    assert not is_url("C:\\data\\train.arrow")


def test_importing_the_module_imports_no_fsspec():
    code = (
        "import sys, fastload, fastload._storage.remote\n"
        "assert 'fsspec' not in sys.modules and 's3fs' not in sys.modules, 'imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_s3_ranges_are_the_local_bytes(s3_server):
    data = payload(1)
    url = s3_server.put("ranges", "one/train.arrow", data)
    with deadline(30):
        obj = RemoteObject(url, s3_server.storage_options, timeout=20)
        ranges = some_ranges(2)
        chunks = obj.read_ranges(ranges)
    assert obj.size == SIZE and obj.etag
    assert chunks == [data[s:e] for s, e in ranges]


def test_http_ranges_are_the_local_bytes_many_in_flight(http_server, tmp_path):
    data = payload(3)
    (tmp_path / "train.arrow").write_bytes(data)
    with deadline(30):
        obj = RemoteObject(f"{http_server.url}/train.arrow", timeout=20)
        ranges = some_ranges(4, n=300)
        chunks = obj.read_ranges(ranges)
    assert obj.size == SIZE and obj.etag
    assert chunks == [data[s:e] for s, e in ranges]


def test_a_range_outside_the_object_is_a_value_error(http_server, tmp_path):
    (tmp_path / "a.arrow").write_bytes(b"0123456789")
    obj = RemoteObject(f"{http_server.url}/a.arrow", timeout=10)
    with pytest.raises(ValueError, match="outside"):
        obj.read_ranges([(5, 11)])


def test_s3_directory_and_glob_resolve_to_sorted_dataset_files(s3_server):
    for key in ["b.ipc", "a.arrow", ".hidden.arrow", "notes.txt", "c.feather", "d.arrows"]:
        s3_server.put("resolve", f"set/{key}", b"x" * 10)
    options = s3_server.storage_options
    with deadline(30):
        listed = [o.url for o in resolve_urls("s3://resolve/set", options, timeout=20)]
        globbed = [o.url for o in resolve_urls("s3://resolve/set/*.arrow*", options, timeout=20)]
        single = resolve_urls("s3://resolve/set/b.ipc", options, timeout=20)
    names = ["a.arrow", "b.ipc", "c.feather", "d.arrows"]
    assert listed == [f"s3://resolve/set/{n}" for n in names]
    assert globbed == ["s3://resolve/set/a.arrow", "s3://resolve/set/d.arrows"]
    assert [(o.url, o.size) for o in single] == [("s3://resolve/set/b.ipc", 10)]
    assert single[0].read_ranges([(2, 5)]) == [b"xxx"]


def test_http_directory_resolves_to_sorted_dataset_files(http_server, tmp_path):
    (tmp_path / "set").mkdir()
    for name in ["b.ipc", "a.arrow", ".hidden.arrow", "notes.txt"]:
        (tmp_path / "set" / name).write_bytes(name.encode())
    with deadline(30):
        objects = resolve_urls(f"{http_server.url}/set/", timeout=20)
        chunks = [o.read_ranges([(0, o.size)])[0] for o in objects]
    assert [o.url for o in objects] == [f"{http_server.url}/set/{n}" for n in ["a.arrow", "b.ipc"]]
    assert chunks == [b"a.arrow", b"b.ipc"]


def test_a_missing_url_is_a_file_not_found_error_naming_it(s3_server, http_server):
    s3_server.put("missing", "here.arrow", b"x")
    options = s3_server.storage_options
    with deadline(30):
        for url in ["s3://missing/not-here.arrow", "s3://missing/none/", "s3://missing/*.ipc"]:
            with pytest.raises(FileNotFoundError, match=url.replace("*", r"\*")):
                resolve_urls(url, options, timeout=10)
        url = f"{http_server.url}/not-here.arrow"
        with pytest.raises(FileNotFoundError, match=url):
            RemoteObject(url, timeout=10)


def test_a_server_killed_mid_read_and_restarted_within_the_timeout_is_read(http_server, tmp_path):
    data = payload(5)
    (tmp_path / "train.arrow").write_bytes(data)
    obj = RemoteObject(f"{http_server.url}/train.arrow", timeout=20)
    http_server.stall = True  # the reads are in flight when the server goes down

    def kill_then_restart():
        http_server.stop()
        http_server.stall = False
        http_server.restart_after(0.5)

    killer = threading.Timer(0.3, kill_then_restart)
    killer.start()
    ranges = some_ranges(6)
    with deadline(30):
        chunks = obj.read_ranges(ranges)
    killer.join()
    assert chunks == [data[s:e] for s, e in ranges]


def test_a_server_killed_and_not_restarted_is_a_load_error_naming_the_url(http_server, tmp_path):
    (tmp_path / "train.arrow").write_bytes(payload(7))
    url = f"{http_server.url}/train.arrow"
    obj = RemoteObject(url, timeout=2)
    http_server.stop()
    with deadline(20), pytest.raises(LoadError, match="bytes 100-200 of .*gave up") as caught:
        obj.read_ranges([(100, 200)])
    assert url in str(caught.value) and caught.value.source == url


def test_a_stalled_server_is_a_load_error_within_the_timeout(http_server, tmp_path):
    (tmp_path / "train.arrow").write_bytes(payload(8))
    url = f"{http_server.url}/train.arrow"
    obj = RemoteObject(url, timeout=1.5)
    http_server.stall = True
    with (
        deadline(20),
        pytest.raises(LoadError, match=f"bytes (0-1000|5000-6000) of '{url}': .*no answer"),
    ):
        obj.read_ranges([(0, 1000), (5000, 6000)])
    with deadline(20), pytest.raises(LoadError, match=f"opening '{url}'"):
        RemoteObject(url, timeout=1.5)


def test_503s_then_success_are_retried(http_server, tmp_path):
    data = payload(9)
    (tmp_path / "train.arrow").write_bytes(data)
    http_server.fail_next(3)  # the open's too
    with deadline(30):
        obj = RemoteObject(f"{http_server.url}/train.arrow", timeout=20)
        http_server.fail_next(4)
        chunks = obj.read_ranges([(0, 10), (10, 20_000)])
    assert chunks == [data[:10], data[10:20_000]]
    assert http_server.requests >= 3 + 4 + 2


def test_a_body_cut_mid_way_is_fetched_again(http_server, tmp_path):
    data = payload(10)
    (tmp_path / "train.arrow").write_bytes(data)
    obj = RemoteObject(f"{http_server.url}/train.arrow", timeout=20)
    http_server.cut_next(2)
    with deadline(30):
        chunks = obj.read_ranges([(0, 100_000), (200_000, SIZE)])
    assert chunks == [data[:100_000], data[200_000:]]


def test_answers_that_stay_short_are_an_object_that_shrank_not_an_outage(http_server, tmp_path):
    data = payload(15)
    (tmp_path / "train.arrow").write_bytes(data)
    (tmp_path / "other.arrow").write_bytes(data[:1000])
    obj = RemoteObject(f"{http_server.url}/train.arrow", timeout=600)
    other = RemoteObject(f"{http_server.url}/other.arrow", timeout=600)
    http_server.short_next(1000)  # as a server would whose object lost its tail
    before = http_server.requests
    with (
        deadline(60),
        pytest.raises(LoadError, match="changed since it was opened .shorter than when") as caught,
    ):
        obj.read_ranges([(1000, 5000)])
    assert "bytes 1000-5000" in str(caught.value) and "gave up" not in str(caught.value)
    assert http_server.requests - before == SHORT_TRIES  # then no more tries
    http_server._shorts = 0
    # Not taken for an outage: the next reads go to the store, and are answered.
    with deadline(30):
        assert other.read_ranges([(0, 1000)]) == [data[:1000]]
        assert obj.read_ranges([(5000, 6000)]) == [data[5000:6000]]


@pytest.mark.parametrize("replacement", [b"short", payload(12)])
def test_http_object_replaced_after_open_is_a_load_error(http_server, tmp_path, replacement):
    (tmp_path / "train.arrow").write_bytes(payload(11))
    obj = RemoteObject(f"{http_server.url}/train.arrow", timeout=20)
    (tmp_path / "train.arrow").write_bytes(replacement)
    before = http_server.requests
    with deadline(20), pytest.raises(LoadError, match="changed since it was opened, reopen it"):
        obj.read_ranges([(0, 1000), (SIZE - 10, SIZE)])
    assert http_server.requests - before <= 2  # no retries


@pytest.mark.parametrize("replacement", [b"short", payload(14)])
def test_s3_object_replaced_after_open_is_a_load_error(s3_server, replacement):
    url = s3_server.put("replaced", "train.arrow", payload(13))
    with deadline(30):
        obj = RemoteObject(url, s3_server.storage_options, timeout=20)
        s3_server.put("replaced", "train.arrow", replacement)
        with pytest.raises(LoadError, match="changed since it was opened, reopen it"):
            obj.read_ranges([(0, 1000), (SIZE - 10, SIZE)])


def test_refused_credentials_are_a_load_error_at_once(http_server, tmp_path):
    (tmp_path / "train.arrow").write_bytes(payload(15))
    url = f"{http_server.url}/train.arrow"
    obj = RemoteObject(url, timeout=20)
    http_server.refuse = True
    before = http_server.requests
    with deadline(10), pytest.raises(LoadError, match=f"'{url}': access refused: .*403"):
        obj.read_ranges([(0, 1000)])
    assert http_server.requests - before == 1
    with deadline(10), pytest.raises(LoadError, match=f"opening '{url}': access refused"):
        RemoteObject(url, timeout=20)


def test_a_byte_altered_in_transit_is_passed_on_for_the_block_checksums_to_catch(
    http_server, tmp_path
):
    data = payload(16)
    (tmp_path / "train.arrow").write_bytes(data)
    obj = RemoteObject(f"{http_server.url}/train.arrow", timeout=20)
    http_server.altered = 5
    with deadline(20):
        (chunk,) = obj.read_ranges([(0, 10)])
    assert chunk[:5] == data[:5] and chunk[5] == data[5] ^ 0xFF and chunk[6:] == data[6:10]


def test_a_sync_store_is_read_through_threads_and_checked_after(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    data = payload(17)
    fs = fsspec.filesystem("memory")
    fs.pipe_file("/remote-fetch/train.arrow", data)
    try:
        obj = RemoteObject("memory://remote-fetch/train.arrow", timeout=10)
        ranges = some_ranges(18)
        with deadline(20):
            assert obj.read_ranges(ranges) == [data[s:e] for s, e in ranges]
        fs.pipe_file("/remote-fetch/train.arrow", data[:1000])
        with deadline(20), pytest.raises(LoadError, match="reopen it"):
            obj.read_ranges([(0, 10)])
    finally:
        fs.rm("/remote-fetch", recursive=True)
