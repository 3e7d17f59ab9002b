"""Rows, partitions and checks shared by the tests of writes in parts (test_parts.py and
the engines' tests, test_cluster_*.py): generated JPEGs with labels and other fields, the
check that a committed dataset holds what ``fastload.write`` writes for the same rows in
the same order, byte for byte in every column, moto's S3 server as a module's fixture,
and the tests that every engine's writes pass (``EngineWrites``)."""

import os
import signal

import numpy as np
import pyarrow as pa
import pytest
import simplejpeg
from servers import S3Server

import fastload
from fastload import LoadError
from fastload.cluster import PartitionError
from fastload.storage import JPEG, Bytes, NDArray, Str
from fastload.storage.reader import SUFFIXES

BUCKET = "parts"  # made in the server of s3_fixture

FIELDS = {
    "image": JPEG(quality=85, max_side=24),
    "label": "int64",
    "name": Str(),
    "extra": Bytes(),
    "vector": NDArray("float32"),
}


def make_rows(n, seed=0):
    """``n`` rows: a JPEG of a random size (some wider than ``max_side``, so resized), a
    label, a name, a few bytes and a vector."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        h, w = int(rng.integers(8, 40)), int(rng.integers(8, 40))
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        rows.append(
            {
                "image": simplejpeg.encode_jpeg(pixels, quality=90),
                "label": i % 7,
                "name": f"row-{i}",
                "extra": bytes(i % 5),
                "vector": rng.standard_normal(3).astype(np.float32),
            }
        )
    return rows


def split(rows, partitions):
    """``rows`` cut into ``partitions`` runs, in order (some may be of unequal size)."""
    bounds = np.linspace(0, len(rows), partitions + 1).astype(int)
    return [rows[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _tables(files, storage_options):
    for f in files:
        if "://" in f:
            import fsspec

            with fsspec.open(f, "rb", **(storage_options or {})) as handle:
                yield pa.ipc.open_file(pa.py_buffer(handle.read())).read_all()
        else:
            yield pa.ipc.open_file(f).read_all()


def assert_same_as_write(prefix, rows, folder, storage_options=None, fields=FIELDS, **open_kw):
    """The dataset committed at ``prefix`` opens, and holds in every column the bytes
    that ``fastload.write`` writes for ``rows`` into one file (in ``folder``), in the
    same order; its fields and decoded rows are the same too."""
    single = os.path.join(folder, "single.arrow")
    fastload.write(single, rows, fields, progress=False, parallel=False)
    expected = pa.ipc.open_file(single).read_all()
    ds = fastload.open(prefix, storage_options=storage_options, **open_kw)
    assert all(f.endswith(SUFFIXES) and "/part-" in f for f in ds.files)
    got = pa.concat_tables(list(_tables(ds.files, storage_options)))
    assert got.column_names == expected.column_names
    for name in expected.column_names:
        assert got.column(name).to_pylist() == expected.column(name).to_pylist(), name
    one = fastload.open(single)
    assert len(ds) == len(one) == len(rows)
    assert {k: e.to_meta(k) for k, e in ds.fields.items()} == {
        k: e.to_meta(k) for k, e in one.fields.items()
    }
    for i in {0, len(rows) // 2, len(rows) - 1}:
        a, b = ds[i], one[i]
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))
    return ds


TESTS = os.path.dirname(os.path.abspath(__file__))


def share_tests_path():
    """Puts this folder (and the tree's root) on the path of the processes an engine
    starts from now on, so that they import what the rows hold (``Once``)."""
    root = os.path.dirname(TESTS)
    paths = [TESTS, root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))


class Once:
    """An image's pixels that fail where a task reads them: the first time in any process
    (``marker``: a file made then), ``action`` "kill" kills that process (SIGKILL, by its
    pid) and "raise" raises; "always" raises every time."""

    def __init__(self, pixels, marker, action):
        self.pixels, self.marker, self.action = pixels, str(marker), action

    def __array__(self, dtype=None, copy=None):
        _fail(self.marker, self.action)
        return self.pixels


def _fail(marker, action):
    """``Once``'s failure: kill, raise, or nothing when ``marker`` was made before."""
    if action == "always":
        raise RuntimeError("this row fails every time")
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError("this row fails once")


class OnceJPEG(JPEG):
    """``FIELDS["image"]`` (the same file metadata) that fails as ``Once`` says where it
    encodes the image ``trigger``: for an engine that turns the rows' values into its own
    columns before a task sees them (Ray)."""

    def __init__(self, trigger, marker, action):
        super().__init__(quality=85, max_side=24)
        self.trigger, self.marker, self.action = trigger, str(marker), action

    def encode(self, value):
        if bytes(value) == self.trigger:
            _fail(self.marker, self.action)
        return super().encode(value)


def pixel_rows(n, seed=1):
    """``n`` rows as ``make_rows`` makes them, their images as pixels (which a ``Once``
    can stand for)."""
    rows = make_rows(n, seed)
    for row in rows:
        row["image"] = simplejpeg.decode_jpeg(row["image"])
    return rows


def with_once(rows, at, marker, action):
    """``rows`` with row ``at``'s image a ``Once`` of its pixels."""
    rows = [dict(r) for r in rows]
    rows[at]["image"] = Once(rows[at]["image"], marker, action)
    return rows


def assert_not_committed(prefix, storage_options=None):
    """``prefix`` has no manifest, and opening it says that it was not committed."""
    with pytest.raises((LoadError, FileNotFoundError), match="not committed|no dataset files"):
        fastload.open(prefix, storage_options=storage_options)


def s3_fixture():
    """A test module's fixture ``s3`` (``s3 = s3_fixture()``): moto's S3 server, started
    for the module's tests, with the bucket ``BUCKET``."""

    @pytest.fixture(scope="module")
    def s3(tmp_path_factory):
        server = S3Server(tmp_path_factory.mktemp("moto") / "moto.log")
        server.filesystem().mkdir(BUCKET)
        yield server
        server.stop()

    return s3


class EngineWrites:
    """The tests that every engine's writes in parts pass: a worker killed mid-task and a
    task that raises once are run again, a task that fails for good or a store that
    refuses writes commits nothing, bad rows are skipped, a committed prefix at S3 is
    replaced only when asked. An engine's test module runs them as ``class
    TestWrites(EngineWrites)``, with two fixtures: ``write`` (``write(rows, partitions,
    prefix, fields, **options)``: the rows handed to the engine in ``partitions``
    partitions and written by its writer, which returns the ``Committed`` dataset) and
    ``s3`` (``s3_fixture()``'s)."""

    def failing(self, n, at, marker, action):
        """(the rows to write, their fields, the rows the dataset holds): ``n`` rows whose
        row ``at`` fails as ``Once`` says where a task reads its image."""
        rows = pixel_rows(n)
        return with_once(rows, at, marker, action), FIELDS, rows

    @pytest.mark.parametrize("action", ["kill", "raise"])
    def test_a_killed_worker_or_a_task_that_raises_once_is_run_again(self, write, tmp_path, action):
        given, fields, rows = self.failing(400, 350, tmp_path / "marker", action)
        prefix = str(tmp_path / "out")
        committed = write(given, 2, prefix, fields, file_bytes=50_000)
        assert os.path.exists(tmp_path / "marker")
        assert committed.removed, "the failed attempt wrote a file before it failed"
        assert_same_as_write(prefix, rows, str(tmp_path))

    def test_a_task_that_fails_for_good_commits_nothing(self, write, tmp_path):
        given, fields, _ = self.failing(200, 150, tmp_path / "marker", "always")
        prefix, match = str(tmp_path / "out"), "nothing was committed.*partition 1 failed"
        with pytest.raises(PartitionError, match=match) as caught:
            write(given, 2, prefix, fields, file_bytes=20_000)
        assert caught.value.partition == 1 and "fails every time" in str(caught.value)
        assert_not_committed(prefix)

    def test_a_store_that_refuses_writes_commits_nothing(self, write, s3):
        options = s3.storage_options
        with pytest.raises(PartitionError, match="nothing was committed.*no-such-bucket"):
            write(make_rows(20), 2, "s3://no-such-bucket/x", FIELDS, storage_options=options)

    def test_bad_rows_are_skipped_as_write_skips_them(self, write, tmp_path):
        rows = make_rows(300)
        rows[10]["image"] = rows[250]["image"] = b"not an image"
        prefix = str(tmp_path / "out")
        committed = write(rows, 3, prefix, FIELDS, on_error="skip")
        assert [e.index for e in committed.skipped] == [10, 50]
        assert ["partition 0" in str(e) for e in committed.skipped] == [True, False]
        assert_same_as_write(prefix, rows[:10] + rows[11:250] + rows[251:], str(tmp_path))

    def test_a_setting_that_write_refuses_is_refused_before_any_task(self, write, tmp_path):
        prefix = str(tmp_path / "out")
        with pytest.raises(ValueError, match="on_error must be 'raise' or 'skip'"):
            write(make_rows(4), 2, prefix, FIELDS, on_error="ignore")
        assert not os.path.exists(prefix)

    def test_a_committed_prefix_at_s3_is_replaced_only_when_asked(self, write, s3, tmp_path):
        rows, prefix, options = make_rows(2000), f"s3://{BUCKET}/train", s3.storage_options
        write(rows, 4, prefix, FIELDS, storage_options=options)
        assert_same_as_write(prefix, rows, str(tmp_path), options, cache_bytes=0)
        with pytest.raises(FileExistsError, match="overwrite=True"):
            write(rows[:300], 2, prefix, FIELDS, storage_options=options)
        write(rows[:300], 2, prefix, FIELDS, storage_options=options, overwrite=True)
        assert_same_as_write(prefix, rows[:300], str(tmp_path), options, cache_bytes=0)
