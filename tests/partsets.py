"""Rows, partitions and checks shared by the tests of writes in parts (test_parts.py and
the engines' tests, test_cluster_*.py): generated JPEGs with labels and other fields, and
the check that a committed dataset holds what ``fastload.write`` writes for the same rows
in the same order, byte for byte in every column."""

import os
import signal

import numpy as np
import pyarrow as pa
import simplejpeg

import fastload
from fastload.storage import JPEG, Bytes, NDArray, Str
from fastload.storage.reader import SUFFIXES

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
    import pytest

    from fastload import LoadError

    with pytest.raises((LoadError, FileNotFoundError), match="not committed|no dataset files"):
        fastload.open(prefix, storage_options=storage_options)
