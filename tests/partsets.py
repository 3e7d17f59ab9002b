"""Rows, partitions and checks shared by the tests of writes in parts (test_parts.py and
the engines' tests, test_cluster_*.py): generated JPEGs with labels and other fields, and
the check that a committed dataset holds what ``fastload.write`` writes for the same rows
in the same order, byte for byte in every column."""

import os

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
