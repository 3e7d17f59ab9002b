"""Every loader path reads a packed dataset at a URL with no fetch before it: the batches of
each path (fastload's loaders on threads, in the caller's thread, with buffers and in
worker processes; ``eachobs_parallel``; the drop-in PyTorch loader, natively and through
its worker processes) over each kind of field, with the dataset wholly in memory, with
``memory_bytes`` below one wave of blocks, and served from a warm disk cache, are the local
file's batches, on moto's S3 server and on the HTTP range server."""

import numpy as np
import pytest
from helpers import deadline
from servers import RangeServer, S3Server

import fastload
from fastload import (
    DataLoader,
    batchview,
    eachobs_parallel,
    joinobs,
    mapobs,
    obsview,
    shuffleobs,
    splitobs,
)
from fastload.storage import JPEG, Bytes, NDArray, Raw, Str
from fastload.transforms import CenterCrop, Compose, DecodeImage

N = 96
BATCH = 8


def _rows():
    rng = np.random.default_rng(3)
    return [
        {
            "image": rng.integers(0, 255, (24, 20 + i % 3, 3), np.uint8),
            "raw": np.full((3, 4), i % 256, np.uint8),
            "array": np.arange(6, dtype=np.float32).reshape(2, 3) + i,
            "label": i,
            "name": f"row-{i}",
            "blob": bytes([i % 256]) * (40 + i % 7),
        }
        for i in range(N)
    ]


FIELDS = {
    "image": JPEG(quality=90),
    "raw": Raw((3, 4), "uint8"),
    "array": NDArray("float32"),
    "label": "int64",
    "name": Str(),
    "blob": Bytes(),
}


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """A packed file of 96 rows in 16 blocks."""
    root = tmp_path_factory.mktemp("paths")
    fastload.write(root / "all.arrow", _rows(), FIELDS, block_bytes=8000, progress=False)
    return root


@pytest.fixture(scope="module")
def http(local):
    server = RangeServer(local)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def s3(local, tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("moto") / "moto.log")
    server.put("paths", "all.arrow", (local / "all.arrow").read_bytes())
    yield server
    server.stop()


# -- the kinds of field: a container over a dataset --------------------------------------------


def _native_jpeg(ds):
    return obsview(
        (mapobs(Compose([DecodeImage(), CenterCrop(16)]), ds["image"].encoded), ds["label"])
    )


def _python_jpeg(ds):
    return mapobs(
        lambda item: np.frombuffer(bytes(item), np.uint8)[:32].copy(), ds["image"].encoded
    )


def _decoded(images):
    return mapobs(Compose([DecodeImage(), CenterCrop(16)]), images)


KINDS = {
    "jpeg-native": _native_jpeg,
    "jpeg-python": _python_jpeg,
    "raw": lambda ds: ds["raw"],
    "ndarray": lambda ds: ds["array"],
    "scalar": lambda ds: ds["label"],
    "string": lambda ds: obsview((ds["name"], ds["blob"])),
    # Views over the dataset (those at the top fold into the order; the others stay).
    "joinobs": lambda ds: _decoded(joinobs(ds["image"].encoded, ds["image"].encoded)),
    "shuffleobs-under-mapobs": lambda ds: _decoded(shuffleobs(ds["image"].encoded, seed=1)),
    "splitobs": lambda ds: splitobs(obsview((ds["raw"], ds["label"])), at=0.5)[1],
    "shuffleobs-in-a-tuple": lambda ds: obsview((shuffleobs(ds["raw"], seed=2), ds["label"])),
}
VIEWS = ["joinobs", "shuffleobs-under-mapobs", "splitobs", "shuffleobs-in-a-tuple"]


# -- the loader paths: all the batches of an epoch, as numpy ----------------------------------


def _fastload(**options):
    return lambda data: list(DataLoader(data, BATCH, collate=None, **options))


def _eachobs_parallel(data):
    return [_owned(b) for b in eachobs_parallel(batchview(data, BATCH), buffered=True)]


def _torch(num_workers):
    def run(data):
        torch = pytest.importorskip("torch")
        from fastload.torch import DataLoader as TorchLoader

        sampler = torch.utils.data.SequentialSampler(range(len(data)))
        loader = TorchLoader(data, batch_size=BATCH, sampler=sampler, num_workers=num_workers)
        return list(loader)

    return run


def _torch_distributed(data):
    torch = pytest.importorskip("torch")
    from fastload.torch import DataLoader as TorchLoader

    batches = []
    for rank in range(2):
        sampler = torch.utils.data.DistributedSampler(
            range(len(data)), num_replicas=2, rank=rank, shuffle=False
        )
        batches += list(TorchLoader(data, batch_size=BATCH, sampler=sampler))
    return batches


class _PythonDataset:
    """A map-style dataset of Python code over a container: the drop-in's process ring."""

    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return fastload.getobs(self.data, i)


def _torch_ring(data):
    return _torch(2)(_PythonDataset(data))


PATHS = {
    "threads": _fastload(parallel=2),
    "caller": _fastload(parallel=False),
    "buffer": lambda data: [_owned(b) for b in DataLoader(data, BATCH, collate=None, buffer=True)],
    "processes": _fastload(parallel=2, backend="process"),
    "eachobs_parallel": _eachobs_parallel,
    "torch-native": _torch(0),
    "torch-threads": _torch(2),
    "torch-distributed": _torch_distributed,
    "torch-ring": _torch_ring,
}


def _owned(value):
    if isinstance(value, (tuple, list)):
        return type(value)(_owned(v) for v in value)
    if isinstance(value, dict):
        return {k: _owned(v) for k, v in value.items()}
    if isinstance(value, (bytes, str, int)):
        return value
    return np.array(value, copy=True)


def _plain(value):
    """A batch as nested lists of numpy arrays and Python values, to compare."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (bytes, str, int, memoryview)):
        return bytes(value) if isinstance(value, memoryview) else value
    return np.asarray(value)


def _same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert np.array_equal(np.asarray(a), np.asarray(b)), (a, b)


# -- the modes: how much of the dataset stays in memory ---------------------------------------

# memory_bytes below the dataset's bulk (125 KB): 3 of its 16 blocks of 8 KB.
BELOW_A_WAVE = 24_000


def _open(url, options, mode, tmp_path):
    if mode == "memory":
        return fastload.open(url, storage_options=options, cache_bytes=0)
    if mode == "bounded":
        return fastload.open(url, storage_options=options, cache_bytes=0, memory_bytes=BELOW_A_WAVE)
    cache = tmp_path / "cache"  # warm: every block fetched by a first open, then read again
    first = fastload.open(url, storage_options=options, cache_dir=cache, cache_bytes=1 << 30)
    first.remote_rows.ensure(np.arange(N))
    del first
    return fastload.open(url, storage_options=options, cache_dir=cache, cache_bytes=1 << 30)


def _check(server, local, tmp_path, path, kind, mode):
    url, options = server
    reference = fastload.open(local / "all.arrow")
    want = [_plain(b) for b in PATHS[path](KINDS[kind](reference))]
    assert len(want) >= 2
    ds = _open(url, options, mode, tmp_path)
    remote = ds.remote_rows
    assert remote.bounded == (mode == "bounded")
    assert not remote.present.any()  # nothing of the bulk fetched before the loader
    with deadline(60):
        got = [_plain(b) for b in PATHS[path](KINDS[kind](ds))]
    _same(got, want)


def _http(http):
    return f"{http.url}/all.arrow", None


def _s3(s3):
    return "s3://paths/all.arrow", s3.storage_options


# The process ring reads every kind through the dataset's Python code: two kinds will do.
MATRIX = [
    (path, kind)
    for path in PATHS
    for kind in KINDS
    if kind not in VIEWS and (path != "torch-ring" or kind in ("jpeg-native", "raw"))
]


@pytest.mark.parametrize(("path", "kind"), MATRIX)
def test_every_path_reads_each_kind_of_field_at_a_url_below_a_wave(
    http, local, tmp_path, path, kind
):
    _check(_http(http), local, tmp_path, path, kind, "bounded")


@pytest.mark.parametrize("mode", ["memory", "cache"])
@pytest.mark.parametrize("path", list(PATHS))
def test_every_path_reads_a_url_in_memory_and_from_a_warm_cache(http, local, tmp_path, path, mode):
    _check(_http(http), local, tmp_path, path, "jpeg-native", mode)


@pytest.mark.parametrize("mode", ["memory", "bounded"])
@pytest.mark.parametrize("path", ["threads", "processes", "torch-native", "torch-threads"])
def test_the_paths_read_a_dataset_on_s3(s3, local, tmp_path, path, mode):
    _check(_s3(s3), local, tmp_path, path, "raw" if mode == "memory" else "jpeg-native", mode)


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("path", ["threads", "torch-native"])
def test_views_over_a_dataset_at_a_url_read_as_over_the_local_file(
    http, local, tmp_path, path, view
):
    _check(_http(http), local, tmp_path, path, view, "bounded")


# -- faults: what each path raises, naming the cause ------------------------------------------

FAULTS = [
    (path, fault)
    for fault, paths in {
        "stall": ["item", "caller", "threads", "processes", "torch-native", "torch-ring"],
        "refused": ["item", "threads", "processes"],
    }.items()
    for path in paths
]


@pytest.mark.parametrize(("path", "fault"), FAULTS)
def test_a_stalled_or_refusing_server_is_named_on_every_path(local, path, fault):
    server = RangeServer(local)
    try:
        ds = fastload.open(f"{server.url}/all.arrow", cache_bytes=0, timeout=1)
        if fault == "stall":
            server.stall = True
        else:
            server.stop()  # the port refuses connections from now on
        read = (lambda: ds[5]) if path == "item" else (lambda: PATHS[path](ds["raw"]))
        with pytest.raises(Exception) as caught, deadline(30):
            read()
        message = str(caught.value)
        assert f"{server.url}/all.arrow" in message
        if fault == "stall":
            assert "no answer within 1 s" in message
        else:
            assert "the connection was refused" in message and "no answer" not in message
        assert "changed" not in message and "please report" not in message
    finally:
        server.stall = False
        server.stop()
