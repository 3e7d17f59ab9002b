"""Packed datasets (fastload.storage): encodings round-trip, files are plain Arrow, shards,
zero-copy buffers, safe writes, corrupt files, quasi-random order."""

import builtins
import gc
import json
import os
import re
import subprocess
import sys
import threading

import numpy as np
import pyarrow as pa
import pytest
import simplejpeg
from hypothesis import given
from hypothesis import strategies as st

from fastload import LoadError, getobs
from fastload._storage.meta import META_FORMAT
from fastload.order import quasi_random_order
from fastload.storage import JPEG, QOI, Bytes, NDArray, Raw, Smart, Str, open, write
from fastload.storage.columns import RawArray, RawColumn


def smooth_image(h, w, seed=0, channels=3):
    """A smooth colour gradient: JPEG at quality 90 keeps it within a few levels."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    phase = rng.uniform(0, 2 * np.pi, size=channels)
    img = [127 + 100 * np.sin(3 * x + 2 * y + p) for p in phase]
    return np.stack(img, axis=-1).round().astype(np.uint8)


def sample_rows(n, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        h, w = int(rng.integers(8, 48)), int(rng.integers(8, 48))
        rows.append(
            {
                "jpeg": smooth_image(h, w, seed=i),
                "qoi": rng.integers(0, 256, (h, w, 3 + i % 2), dtype=np.uint8),
                "raw": rng.standard_normal((3, 5)).astype(np.float32),
                "nd": rng.integers(-9, 9, size=(i % 4, 3)),
                "blob": bytes(rng.integers(0, 256, i, dtype=np.uint8)),
                "text": "ünïcode " * (i % 3) + str(i),
                "label": i,
                "weight": float(i) / 2,
            }
        )
    return rows


FIELDS = {
    # 4:4:4: the small saturated gradients of sample_rows keep their colour within 3 levels.
    "jpeg": JPEG(quality=90, subsampling="444"),
    "qoi": QOI(),
    "raw": Raw(),
    "nd": NDArray(),
    "blob": Bytes(),
    "text": Str(),
    "label": "int64",
    "weight": "float32",
}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    rows = sample_rows(40)
    path = str(tmp_path_factory.mktemp("ds") / "data.arrow")
    write(path, rows, FIELDS, block_bytes=4000, parallel=4, progress=False)
    return path, rows


def check_row(got, want):
    assert np.abs(got["jpeg"].astype(int) - want["jpeg"]).mean() < 3
    assert np.array_equal(got["qoi"], want["qoi"])
    assert np.array_equal(got["raw"], want["raw"]) and got["raw"].dtype == np.float32
    assert np.array_equal(got["nd"], want["nd"]) and got["nd"].shape == want["nd"].shape
    assert got["blob"] == want["blob"]
    assert got["text"] == want["text"]
    assert got["label"] == want["label"]
    assert got["weight"] == np.float32(want["weight"])


def test_every_encoding_round_trips(written):
    path, rows = written
    ds = open(path)
    assert len(ds) == len(rows) and ds.num_blocks > 1
    for i, want in enumerate(rows):
        check_row(ds[i], want)


def test_memory_cache_reads_the_same(written):
    path, rows = written
    ds = open(path, cache="memory")
    for i in (0, 17, 39):
        check_row(ds[i], rows[i])


def test_columns_expose_encodings_and_sizes(written):
    path, rows = written
    ds = open(path)
    assert ds.encodings == {
        "jpeg": "jpeg",
        "qoi": "qoi",
        "raw": "raw",
        "nd": "ndarray",
        "blob": "bytes",
        "text": "str",
        "label": "scalar",
        "weight": "scalar",
    }
    assert np.array_equal(ds["label"], np.arange(40))
    assert ds["label"].encoding == "scalar"
    assert [int(h) for h in ds["qoi"].height] == [r["qoi"].shape[0] for r in rows]
    assert [int(w) for w in ds["jpeg"].width] == [r["jpeg"].shape[1] for r in rows]


def test_batches_are_dicts_of_arrays_and_lists(written):
    path, rows = written
    ds = open(path)
    batch = ds[[3, 1, 2]]
    assert batch["raw"].shape == (3, 3, 5) and type(batch["raw"]) is np.ndarray
    assert np.array_equal(batch["label"], [3, 1, 2])
    assert isinstance(batch["qoi"], list) and np.array_equal(batch["qoi"][1], rows[1]["qoi"])
    assert np.array_equal(getobs(ds, slice(0, 4))["label"], [0, 1, 2, 3])


def test_buffers_are_zero_copy_views_of_the_file(written):
    path, rows = written
    ds = open(path)
    col = ds["qoi"]
    assert col.contiguous
    data, offsets = col.buffers()
    assert data.dtype == np.uint8 and data.size == os.path.getsize(path)
    assert offsets.dtype == np.int64 and len(offsets) == len(ds) + 1
    assert np.all(np.diff(offsets) > 0)
    for i in (0, 13, 39):
        item = data[offsets[i] : offsets[i + 1]]
        assert bytes(item) == bytes(col.encoded[i])
        assert np.shares_memory(np.frombuffer(col.encoded[i], np.uint8), data)
    text_data, text_offsets = ds["text"].buffers()
    assert bytes(text_data[text_offsets[5] : text_offsets[6]]).decode() == rows[5]["text"]


def test_raw_column_is_one_array_view_of_the_file(written):
    path, rows = written
    col = open(path)["raw"]
    assert isinstance(col, RawArray) and col.encoding == "raw"
    assert col.shape == (40, 3, 5) and col.dtype == np.float32
    assert np.array_equal(col[7], rows[7]["raw"])
    assert not col.flags.writeable


def rebatch(src, dst, max_chunksize):
    """Rewrite a file with pyarrow into several record batches, keeping its metadata."""
    table = pa.ipc.open_file(str(src)).read_all()
    with pa.ipc.new_file(str(dst), table.schema) as w:
        w.write_table(table, max_chunksize=max_chunksize)


def test_files_with_several_record_batches_still_read(tmp_path):
    x = np.arange(600, dtype=np.float64).reshape(100, 2, 3)
    data = {"x": x, "b": [bytes([i]) * i for i in range(100)]}
    write(tmp_path / "a.arrow", data, {"x": Raw(), "b": Bytes()}, progress=False)
    rebatch(tmp_path / "a.arrow", tmp_path / "b.arrow", 30)
    ds = open(tmp_path / "b.arrow")
    col = ds["x"]
    assert isinstance(col, RawColumn) and len(col.chunks) == 4
    assert np.array_equal(np.asarray(col), x)
    assert np.array_equal(col[[5, 99, 0]], x[[5, 99, 0]])
    assert ds[77]["b"] == data["b"][77]
    assert not ds["b"].contiguous
    with pytest.raises(ValueError, match="record batches"):
        ds["b"].buffers()


def test_tuple_observations_follow_field_order(tmp_path):
    data = [(np.full((2, 2), i, np.uint8), i) for i in range(5)]
    write(tmp_path / "t.arrow", data, {"x": Raw(), "y": "int32"}, progress=False)
    ds = open(tmp_path / "t.arrow")
    assert ds.keys() == ["x", "y"] and ds["y"].dtype == np.int32
    assert np.array_equal(ds[4]["x"], data[4][0])


def test_dict_of_arrays_container_writes(tmp_path):
    data = {"x": np.arange(12.0).reshape(6, 2), "y": np.arange(6)}
    write(tmp_path / "d.arrow", data, {"x": Raw(), "y": "int64"}, progress=True)
    ds = open(tmp_path / "d.arrow")
    assert np.array_equal(ds["x"], data["x"]) and np.array_equal(ds["y"], data["y"])


def test_jpeg_bytes_are_stored_without_reencoding(tmp_path):
    """JPEG bytes keep their coefficients (their quality, not the field's): with restart
    markers added by default, the same pixels; byte for byte with keep_given=True."""
    blobs = [simplejpeg.encode_jpeg(smooth_image(20, 30, seed=s), quality=75) for s in range(3)]
    fields = {"im": JPEG(quality=95), "given": JPEG(quality=95, keep_given=True)}
    rows = [{"im": b, "given": b} for b in blobs]
    write(tmp_path / "j.arrow", rows, fields, progress=False)
    ds = open(tmp_path / "j.arrow")
    assert [bytes(ds["given"].encoded[i]) for i in range(3)] == blobs
    for i in range(3):
        assert np.array_equal(ds[i]["im"], simplejpeg.decode_jpeg(blobs[i]))
    assert ds[0]["im"].shape == (20, 30, 3)


def test_max_side_shrinks_images_keeping_aspect(tmp_path):
    img = smooth_image(100, 40)
    jpeg = simplejpeg.encode_jpeg(img, quality=95)
    rows = [{"a": img, "b": jpeg, "c": img}]
    write(
        tmp_path / "m.arrow",
        rows,
        {"a": QOI(max_side=50), "b": JPEG(max_side=50), "c": Smart(10**6, max_side=25)},
        progress=False,
    )
    ds = open(tmp_path / "m.arrow")
    assert ds[0]["a"].shape == (50, 20, 3)
    assert ds[0]["b"].shape == (50, 20, 3)
    assert ds[0]["c"].shape == (25, 10, 3)
    # area averaging of a smooth image stays close to subsampling it
    assert np.abs(ds[0]["a"].astype(int) - img[1::2, 1::2]).mean() < 4


def test_smart_stores_small_images_raw_and_large_ones_as_jpeg(tmp_path):
    small = np.random.default_rng(0).integers(0, 256, (8, 8, 4), dtype=np.uint8)
    large = smooth_image(64, 64)
    write(
        tmp_path / "s.arrow",
        [{"im": small}, {"im": large}],
        {"im": Smart(threshold_bytes=1000)},
        progress=False,
    )
    ds = open(tmp_path / "s.arrow")
    assert list(ds["im"].format) == [0, 1]
    assert np.array_equal(ds[0]["im"], small)
    assert np.abs(ds[1]["im"].astype(int) - large).mean() < 3


def test_pyarrow_and_pandas_read_the_file(written):
    path, rows = written
    table = pa.ipc.open_file(path).read_all()
    assert table.num_rows == len(rows)
    assert table.column("label").to_pylist() == list(range(len(rows)))
    meta = table.schema.metadata
    assert meta[META_FORMAT] == b"2"
    assert json.loads(meta[b"fastload.fields"])["qoi"]["encoding"] == "qoi"
    import pandas as pd

    df = pd.read_feather(path)
    assert list(df["text"]) == [r["text"] for r in rows]
    assert df["blob"][7] == rows[7]["blob"]


def test_directory_of_shards_opens_as_one_dataset(tmp_path):
    rows = sample_rows(30, seed=5)
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    for k in range(3):
        write(
            shard_dir / f"part-{k}.arrow",
            rows[10 * k : 10 * k + 10],
            FIELDS,
            block_bytes=3000,
            progress=False,
        )
    (shard_dir / "README.txt").write_text("not a shard")
    ds = open(shard_dir)
    assert len(ds) == 30 and len(ds.files) == 3
    assert list(ds.file_bounds) == [0, 10, 20, 30]
    assert ds.block_bounds[0] == 0 and ds.block_bounds[-1] == 30
    for i in (0, 9, 10, 25, 29):
        check_row(ds[i], rows[i])
    with pytest.raises(ValueError, match="file_datasets"):
        ds["qoi"].buffers()
    for k, shard in enumerate(ds.file_datasets):
        data, offsets = shard["qoi"].buffers()
        assert bytes(data[offsets[0] : offsets[1]]) == bytes(ds["qoi"].encoded[10 * k])
    bases, base_of, starts, ends = ds["qoi"].encoded.spans()  # every item, across the files
    assert len(bases) == 3
    for i in range(30):
        at = bases[base_of[i]][starts[i] : ends[i]]
        assert bytes(at) == bytes(ds["qoi"].encoded[i])
    assert len(open(str(shard_dir / "part-*.arrow"))) == 30


def test_shards_with_different_schemas_are_rejected(tmp_path):
    write(tmp_path / "a.arrow", [{"x": 1}], {"x": "int64"}, progress=False)
    write(tmp_path / "b.arrow", [{"x": 1.5}], {"x": "float64"}, progress=False)
    with pytest.raises(LoadError, match="schema differs"):
        open(tmp_path)


def test_plain_arrow_files_and_streams_open(tmp_path):
    table = pa.table(
        {
            "img": pa.array([b"ab", b"", b"xyz"]),
            "name": ["a", "b", "c"],
            "n": pa.array([1, 2, 3], pa.int32()),
            "tags": pa.array([[1], [], [2, 3]]),
            "maybe": pa.array([b"x", None, b"y"]),
        }
    )
    with pa.ipc.new_file(str(tmp_path / "f.arrow"), table.schema) as w:
        w.write_table(table, max_chunksize=2)
    with pa.ipc.new_stream(str(tmp_path / "s.arrows"), table.schema) as w:
        w.write_table(table)
    for name in ("f.arrow", "s.arrows"):
        ds = open(tmp_path / name)
        assert ds.encodings == {
            "img": "bytes",
            "name": "str",
            "n": "scalar",
            "tags": "arrow",
            "maybe": "arrow",
        }
        assert ds[2] == {"img": b"xyz", "name": "c", "n": 3, "tags": [2, 3], "maybe": b"y"}
        assert ds["maybe"][1] is None


def test_unknown_format_version_is_a_clear_error(tmp_path):
    schema = pa.schema([("x", pa.int64())], metadata={META_FORMAT: b"999"})
    with pa.ipc.new_file(str(tmp_path / "v.arrow"), schema) as w:
        w.write_table(pa.table({"x": [1]}, schema=schema))
    with pytest.raises(LoadError, match="version 999"):
        open(tmp_path / "v.arrow")


def test_missing_paths_raise_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        open(tmp_path / "nope.arrow")
    with pytest.raises(FileNotFoundError):
        open(tmp_path)  # empty directory
    with pytest.raises(FileNotFoundError):
        write(tmp_path / "no" / "dir.arrow", [{"x": 1}], {"x": "int64"})
    with pytest.raises(ValueError, match="cache"):
        open(tmp_path / "x.arrow", cache="disk")


def test_bad_fields_are_rejected_at_the_edge(tmp_path):
    with pytest.raises(ValueError, match="encoding"):
        write(tmp_path / "x.arrow", [{"x": 1}], {"x": "jpeg"})
    with pytest.raises(TypeError, match="instance"):
        write(tmp_path / "x.arrow", [{"x": 1}], {"x": JPEG})
    with pytest.raises(ValueError, match="quality"):
        JPEG(quality=0)
    assert not os.listdir(tmp_path)


def test_scalar_fields_reject_lossy_values(tmp_path):
    for value, dtype in [(1.5, "int64"), (300, "uint8"), ("7", "int32")]:
        with pytest.raises(LoadError, match="row 0"):
            write(tmp_path / "s.arrow", [{"v": value}], {"v": dtype}, progress=False)
    write(tmp_path / "s.arrow", [{"v": 3, "f": 2}], {"v": "uint8", "f": "float32"}, progress=False)
    assert open(tmp_path / "s.arrow")[0] == {"v": 3, "f": 2.0}


def leftovers(directory):
    return sorted(os.listdir(directory))


class Exploding:
    """A container whose observation ``k`` raises ``exc``."""

    def __init__(self, n, k, exc):
        self.n, self.k, self.exc = n, k, exc

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.k:
            raise self.exc
        return {"x": np.full((64, 64), i % 256, np.uint8), "y": i}


@pytest.mark.parametrize("threads", [1, 4])
def test_error_in_a_row_names_it_and_leaves_no_file(tmp_path, threads):
    data = Exploding(300, 123, RuntimeError("disk on fire"))
    with pytest.raises(LoadError, match="(row|observation) 123") as info:
        write(
            tmp_path / "out.arrow",
            data,
            {"x": QOI(), "y": "int64"},
            block_bytes=5000,
            parallel=threads,
            progress=False,
        )
    cause = info.value
    while cause.__cause__ is not None:
        cause = cause.__cause__
    assert info.value.index == 123 and isinstance(cause, RuntimeError)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("threads", [1, 4])
def test_keyboard_interrupt_leaves_no_file(tmp_path, threads):
    data = Exploding(300, 200, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        write(
            tmp_path / "out.arrow",
            data,
            {"x": Raw(), "y": "int64"},
            block_bytes=5000,
            parallel=threads,
            progress=False,
        )
    assert leftovers(tmp_path) == []


def test_failed_rewrite_keeps_the_previous_file(tmp_path):
    write(tmp_path / "out.arrow", [{"y": 1}], {"y": "int64"}, progress=False)
    with pytest.raises(LoadError, match="row 0"):
        write(tmp_path / "out.arrow", [{"y": "not a number"}], {"y": "int64"}, progress=False)
    assert leftovers(tmp_path) == ["out.arrow"] and list(open(tmp_path / "out.arrow")["y"]) == [1]


def test_bad_observations_name_the_row_and_field(tmp_path):
    rows = [{"x": np.zeros((2, 2))}, {"x": np.zeros((3, 2))}]
    with pytest.raises(LoadError, match=r"row 1, field 'x'.*shape"):
        write(tmp_path / "o.arrow", rows, {"x": Raw()}, progress=False)
    with pytest.raises(LoadError, match="row 0.*no field"):
        write(tmp_path / "o.arrow", [{"z": 1}], {"x": "int64"}, progress=False)


def read_everything(path):
    ds = open(path)
    for i in range(len(ds)):
        try:
            ds[i]
        except LoadError:
            pass
    return ds


def test_random_corruptions_give_clean_errors_or_data(tmp_path):
    """200 byte flips and truncations of a file: a LoadError (ValueError) at open or at
    the item, or valid data; never a crash."""
    rows = sample_rows(12, seed=9)
    good = tmp_path / "good.arrow"
    write(good, rows, FIELDS, block_bytes=3000, progress=False)
    original = good.read_bytes()
    rng = np.random.default_rng(2024)
    outcomes = {"open error": 0, "opened": 0}
    for trial in range(200):
        data = bytearray(original)
        if trial % 4 == 0:
            data = data[: int(rng.integers(0, len(data)))]
        else:
            for _ in range(int(rng.integers(1, 8))):
                data[int(rng.integers(0, len(data)))] = int(rng.integers(0, 256))
        bad = tmp_path / "bad.arrow"
        bad.write_bytes(bytes(data))
        try:
            read_everything(bad)
        except LoadError:
            outcomes["open error"] += 1
        else:
            outcomes["opened"] += 1
    assert outcomes["open error"] > 0 and outcomes["opened"] > 0


def _same(got, want):
    """Two rows (dicts of arrays, bytes, str, numbers) hold the same values."""
    return got.keys() == want.keys() and all(
        np.array_equal(got[k], want[k]) if isinstance(want[k], np.ndarray) else got[k] == want[k]
        for k in want
    )


def _damaged(original, path, scratch, trial, rng):
    """A damaged copy of the packed file ``original`` (bytes; written at ``path``): a
    byte flipped in the data, random flips anywhere, or a self-consistent metadata edit
    (rewritten through ``scratch``)."""
    kind = trial % 3
    if kind == 2:
        meta = dict(pa.ipc.open_file(path).schema.metadata)
        key = [b"fastload.user", b"fastload.chunks", b"fastload.fields"][trial % 9 // 3]
        value = bytearray(meta.get(key) or b"{}")
        at = int(rng.integers(0, len(value)))
        value[at] = ord(str((int(chr(value[at])) + 1) % 10)) if chr(value[at]).isdigit() else 32
        _rewrite(path, scratch, metadata={**meta, key: bytes(value)})
        return scratch.read_bytes()
    data = bytearray(original)
    lo, hi = (len(data) // 8, len(data) * 7 // 8) if kind == 0 else (0, len(data))
    for _ in range(1 if kind == 0 else int(rng.integers(1, 8))):
        data[int(rng.integers(lo, hi))] ^= int(rng.integers(1, 256))
    return bytes(data)


def test_a_corrupted_file_never_loads_other_data_with_the_default_settings(written, tmp_path):
    """Flipped bytes in the data, random flips, metadata edits: with ``open(path)``'s
    defaults each row (read by ``ds[i]``, or by a loader on threads) raises ``LoadError``
    naming the file (and, for changed bytes, the block and its rows) or is the row
    written."""
    from fastload import DataLoader

    path, _ = written
    original = builtins.open(path, "rb").read()
    expected = [open(path)[i] for i in range(40)]
    rng = np.random.default_rng(258)
    bad = tmp_path / "bad.arrow"
    errors = 0
    for trial in range(90):
        bad.write_bytes(_damaged(original, path, tmp_path / "edited.arrow", trial, rng))
        try:
            ds = open(bad)
        except LoadError as exc:
            assert "bad.arrow" in str(exc)
            errors += 1
            continue
        for i in range(40):
            try:
                assert _same(ds[i], expected[i]), f"trial {trial}: row {i} differs"
            except LoadError as exc:
                assert re.search(r"bad.arrow: (block \d+ \(rows \d+\.\.\d+\)|cannot)", str(exc))
                errors += 1
        loader = DataLoader((open(bad)["raw"], open(bad)["blob"]), 8, parallel=2)
        try:
            for step, (raw, blob) in enumerate(loader):
                rows = expected[8 * step : 8 * step + 8]
                assert np.array_equal(raw, [r["raw"] for r in rows])
                assert blob == [r["blob"] for r in rows]
        except LoadError as exc:
            assert "bad.arrow" in str(exc)
    assert errors > 30  # most damage is found; the rest changed nothing read


def test_import_fastload_storage_does_not_import_pyarrow():
    code = (
        "import sys, fastload, fastload.storage; "
        "assert 'pyarrow' not in sys.modules, 'pyarrow imported'"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


# Quasi-random order


def check_permutation(order, n):
    assert order.dtype == np.int64 and len(order) == n
    assert np.array_equal(np.sort(order), np.arange(n))


@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=30),
    st.integers(0, 2**32),
    st.integers(0, 100),
    st.integers(1, 6),
)
def test_quasi_order_visits_every_index_once(sizes, seed, epoch, wave):
    n = sum(sizes)
    order = quasi_random_order(n, sizes, seed, epoch, wave=wave)
    check_permutation(order, n)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    assert np.array_equal(order, quasi_random_order(n, bounds, seed, epoch, wave=wave))
    # block-local: cut greedily into runs touching at most `wave` blocks each; a
    # wave-by-wave order needs no more runs than there are waves
    block_of = np.searchsorted(bounds, order, side="right") - 1
    runs, seen = 0, set()
    for c in block_of:
        if c not in seen and len(seen) == wave:
            seen = set()
        if not seen:
            runs += 1
        seen.add(c)
    nonempty = sum(1 for s in sizes if s)
    assert runs <= -(-nonempty // wave)


def test_quasi_order_is_reproducible_and_differs_across_epochs():
    sizes = [100] * 20
    a = quasi_random_order(2000, sizes, seed=7, epoch=0)
    assert np.array_equal(a, quasi_random_order(2000, sizes, seed=7, epoch=0))
    b = quasi_random_order(2000, sizes, seed=7, epoch=1)
    c = quasi_random_order(2000, sizes, seed=8, epoch=0)
    check_permutation(b, 2000)
    assert not np.array_equal(a, b) and not np.array_equal(a, c)
    # the first wave (8 blocks of 100) touches exactly 8 blocks
    assert len(set(a[:800] // 100)) == 8


def test_quasi_order_with_dataset_blocks(written):
    path, _ = written
    ds = open(path)
    check_permutation(quasi_random_order(len(ds), ds.block_bounds, seed=0, epoch=0), len(ds))


def test_quasi_order_rejects_bad_blocks():
    with pytest.raises(ValueError, match="blocks"):
        quasi_random_order(10, [3, 3], seed=0, epoch=0)
    with pytest.raises(ValueError, match="wave"):
        quasi_random_order(6, [3, 3], seed=0, epoch=0, wave=0)


def test_quasi_order_over_columns_reads_the_datasets_blocks(written):
    from fastload import DataLoader, mapobs
    from fastload.transforms import CenterCrop, Compose, DecodeImage

    path, _ = written
    ds = open(path)
    assert len(ds.block_bounds) > 2  # several blocks, so the order is quasi-random
    images = mapobs(Compose([DecodeImage(), CenterCrop(8)]), ds["jpeg"].encoded)
    loader = DataLoader((images, ds["label"]), 4, shuffle="quasi", seed=3, parallel=2)
    for epoch in range(2):
        labels = np.concatenate([b[1].copy() for b in loader])
        assert labels.tolist() == quasi_random_order(len(ds), ds.block_bounds, 3, epoch).tolist()


class _Tagged(pa.ExtensionType):
    """An extension type of the kind fastload must refuse (a plain int64 underneath)."""

    def __init__(self):
        super().__init__(pa.int64(), "example.tagged")

    def __arrow_ext_serialize__(self):
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type, serialized):
        return cls()


@pytest.mark.parametrize("nested", [False, True])
def test_a_file_with_an_extension_type_is_refused_registered_or_not(tmp_path, nested):
    values = pa.ExtensionArray.from_storage(_Tagged(), pa.array([1, 2, 3], pa.int64()))
    column = pa.StructArray.from_arrays([values], ["inner"]) if nested else values
    table = pa.table({"label": pa.array([0, 1, 2]), "tagged": column})
    path = str(tmp_path / "tagged.arrow")
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    pa.register_extension_type(_Tagged())
    try:
        with pytest.raises(LoadError, match="'tagged.*' has the Arrow extension type"):
            open(path)
    finally:
        pa.unregister_extension_type("example.tagged")
    with pytest.raises(LoadError, match="example.tagged"):
        open(path)


def test_the_next_write_removes_what_a_killed_or_interrupted_write_left(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    stale = [
        tmp_path / f".out.arrow.{dead}-12345.tmp",  # a killed process
        tmp_path / f".out.arrow.{os.getpid()}-{threading.get_ident()}.tmp",  # this thread
        tmp_path / f".other.arrow.{dead}-1.tmp",  # a killed write of another file
    ]
    for folder in stale:
        folder.mkdir()
        (folder / "column.0").write_bytes(b"x" * 1000)
    alive = tmp_path / ".other.arrow.1-1.tmp"  # process 1 is running: it may be writing
    alive.mkdir()
    foreign = tmp_path / f".notes.{dead}-2.tmp"  # a name alike, but files no write makes
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    write(tmp_path / "out.arrow", [{"y": 1}, {"y": 2}], {"y": "int64"}, progress=False)
    assert leftovers(tmp_path) == sorted([alive.name, foreign.name, "out.arrow"])


def test_a_write_killed_midway_leaves_its_work_directory_that_any_next_write_removes(tmp_path):
    code = (
        "import numpy as np, sys\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "from fastload.storage import Raw, write\n"
        "class Slow:\n"
        "    def __len__(self):\n"
        "        return 10**6\n"
        "    def __getitem__(self, i):\n"
        "        if i == 2000:\n"
        "            print('writing', flush=True)\n"
        "        return {'x': np.full((32, 32), i % 256, np.uint8)}\n"
        "write(sys.argv[1], Slow(), {'x': Raw()}, progress=False, parallel=1)\n"
    )
    out = tmp_path / "big.arrow"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            str(out),
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip() == "writing"
    child.kill()
    child.wait(30)
    assert [p.endswith(".tmp") for p in leftovers(tmp_path)] == [True]
    write(tmp_path / "small.arrow", [{"y": 1}], {"y": "int64"}, progress=False)
    assert leftovers(tmp_path) == ["small.arrow"]  # a write of another file cleans up


def _rewrite(src, dst, *, metadata=None, batch_rows=None):
    """A copy of the Arrow file ``src`` with other schema metadata or batches."""
    table = pa.ipc.open_file(src).read_all()
    if metadata is not None:
        table = table.replace_schema_metadata(metadata)
    with pa.OSFile(str(dst), "wb") as sink, pa.ipc.new_file(sink, table.schema) as out:
        for batch in table.to_batches(max_chunksize=batch_rows):
            out.write_batch(batch)


def test_every_block_is_checksummed_and_a_flipped_byte_is_found(written, tmp_path, capsys):
    from fastload.__main__ import main

    path, rows = written
    result = open(path, verify="open").verify()
    assert result["files"] == 1 and result["blocks"] == len(open(path).block_bounds) - 1 > 2
    assert main(["verify", path, "--no-progress"]) == 0
    data = bytearray(builtins.open(path, "rb").read())
    at = data.index(rows[39]["blob"])  # 39 random bytes: one place in the file
    data[at] ^= 0xFF
    bad = tmp_path / "flipped.arrow"
    bad.write_bytes(bytes(data))
    assert open(bad, verify=None)["blob"][39] != rows[39]["blob"]  # unverified: other data
    with pytest.raises(LoadError, match=r"flipped.arrow: block \d+ \(rows \d+\.\.39\)"):
        open(bad)["blob"][39]  # verified at the first read by default
    with pytest.raises(LoadError, match=r"block \d+ \(rows \d+\.\.\d+\) does not match"):
        open(bad, verify="open")
    assert main(["verify", str(bad), "--no-progress"]) == 2
    assert "does not match its checksum" in capsys.readouterr().err


def test_a_metadata_edit_is_found_and_rebatching_keeps_the_checksums(written, tmp_path):
    path, _ = written
    meta = dict(pa.ipc.open_file(path).schema.metadata)
    rebatched = tmp_path / "rebatched.arrow"
    _rewrite(path, rebatched, batch_rows=7)
    assert open(rebatched, verify="open").verify()["files"] == 1
    edited = tmp_path / "edited.arrow"
    _rewrite(path, edited, metadata={**meta, b"fastload.user": b'{"classes": ["x"]}'})
    with pytest.raises(LoadError, match="metadata does not match"):
        open(edited, verify="open")


def test_a_file_without_checksums_opens_and_says_it_was_not_verified(written, tmp_path):
    path, rows = written
    meta = {
        k: v
        for k, v in pa.ipc.open_file(path).schema.metadata.items()
        if k != b"fastload.checksums"
    }
    damaged = tmp_path / "damaged.arrow"  # version 2 must have them
    _rewrite(path, damaged, metadata=meta)
    with pytest.raises(LoadError, match="without its checksums"):
        open(damaged)
    old = tmp_path / "old.arrow"  # version 1 had none
    _rewrite(path, old, metadata={**meta, META_FORMAT: b"1"})
    with pytest.warns(UserWarning, match="no checksums"):  # verify="read" by default
        assert open(old)["label"].tolist() == [r["label"] for r in rows]
    with pytest.warns(UserWarning, match="no checksums"):
        assert open(old, verify=None)["label"].tolist() == [r["label"] for r in rows]
    with pytest.warns(UserWarning, match="no checksums"):
        ds = open(old, verify="open")
    assert ds.verify() == {"files": 0, "blocks": 0, "unverified": [str(old)]}


@pytest.mark.parametrize("options", [{}, {"parallel": 2}, {"parallel": 2, "backend": "process"}])
def test_verify_read_checks_a_block_before_any_of_its_rows_is_read(written, tmp_path, options):
    from fastload import DataLoader

    path, rows = written
    data = bytearray(builtins.open(path, "rb").read())
    data[data.index(rows[39]["raw"].tobytes())] ^= 0xFF  # a raw (numpy-read) value
    bad = tmp_path / "flipped.arrow"
    bad.write_bytes(bytes(data))
    ds = open(bad, verify="read")
    assert ds[0]["label"] == 0 and ds["blob"][1] == rows[1]["blob"]  # other blocks: fine
    loader = DataLoader((ds["raw"], ds["label"]), 4, **options)
    delivered = []
    with pytest.raises(LoadError, match=r"block \d+ \(rows \d+\.\.39\) does not match"):
        for _, labels in loader:
            delivered.extend(labels.tolist())
    assert 0 < len(delivered) < 39 and 39 not in delivered
    with pytest.raises(LoadError, match="does not match"):
        ds[39]
    assert open(path, verify="read")[39]["label"] == 39  # the intact file reads


def _cut_in_half(data):
    return data[: len(data) // 2]


@pytest.mark.parametrize(
    "encoding, encoded",
    [
        (JPEG(keep_given=True), lambda img: simplejpeg.encode_jpeg(img, quality=95)),
        (Smart(0, keep_given=True), lambda img: simplejpeg.encode_jpeg(img, quality=95)),
        (QOI(), lambda img: _qoi_encode(img)),
    ],
)
def test_image_bytes_stored_as_given_are_decoded_first_unless_check_is_off(
    tmp_path, encoding, encoded
):
    rng = np.random.default_rng(0)
    good = [encoded(rng.integers(0, 256, (48, 40, 3), dtype=np.uint8)) for _ in range(3)]
    rows = [{"image": good[0]}, {"image": _cut_in_half(good[1])}, {"image": good[2]}]
    path = tmp_path / "images.arrow"
    with pytest.raises(LoadError, match=r"row 1, field 'image'.*(truncated|QOI)"):
        write(path, rows, {"image": encoding}, progress=False)
    skipped = write(path, rows, {"image": encoding}, progress=False, on_error="skip")
    assert [e.index for e in skipped] == [1]
    assert [bytes(b) for b in open(path)["image"].encoded[:]] == [good[0], good[2]]
    encoding.check = False  # the opt-out: stored as given, found when loaded
    write(path, rows, {"image": encoding}, progress=False)
    with pytest.raises(LoadError, match=f"{path}, row 1"):
        open(path)["image"][1]


def _qoi_encode(img):
    from fastload import _core

    return _core.qoi_encode(img)


def test_check_must_be_a_bool():
    with pytest.raises(TypeError, match="check must be True or False"):
        JPEG(check="no")


def test_source_field_must_name_a_str_field(tmp_path):
    rows = [{"y": 1, "name": "a.txt"}]
    for bad in ("y", "missing"):
        with pytest.raises(ValueError, match="source_field must name a Str"):
            write(tmp_path / "x.arrow", rows, {"y": "int64", "name": Str()}, source_field=bad)


def test_errors_on_a_row_name_the_source_the_file_records(tmp_path):
    rows = [{"blob": b"\x00" * 3, "origin": f"raw/{k}.bin"} for k in range(3)]
    path = tmp_path / "nd.arrow"
    write(path, rows, {"blob": Bytes(), "origin": Str()}, progress=False, source_field="origin")
    ds = open(path)
    assert ds.source_field == "origin"
    assert ds["blob"].row_source(2) == f"{path}, row 2 (from raw/2.bin)"
    write(path, rows, {"blob": Bytes(), "origin": Str()}, progress=False)
    assert open(path)["blob"].row_source(2) == f"{path}, row 2"


@pytest.mark.parametrize("verify", [None, "read"])
def test_a_dropped_dataset_unmaps_its_files_at_once(tmp_path, verify):
    """No reference cycle holds a dataset's maps until the garbage collector runs: once
    the dataset, and what was read of it, is dropped, its files are unmapped and their
    descriptors closed (a filesystem can be unmounted, a deleted file's space comes
    back)."""
    rows = [{"x": np.full((4, 4), k, np.uint8), "s": str(k)} for k in range(20)]
    for name in ("a", "b"):
        write(tmp_path / f"{name}.arrow", rows, {"x": Raw(), "s": Str()}, progress=False)

    def mapped():
        with builtins.open("/proc/self/maps") as f:
            return sum(str(tmp_path) in line for line in f)

    def descriptors():
        fds = os.listdir("/proc/self/fd")
        return sum(os.path.realpath(f"/proc/self/fd/{fd}").startswith(str(tmp_path)) for fd in fds)

    was = gc.isenabled()
    gc.disable()
    try:
        ds = open(tmp_path, verify=verify)
        assert mapped() == 2 and descriptors() >= 2  # (each map holds one before 3.13)
        got = (ds[3]["x"], ds["x"][5], ds["s"][7])
        assert got[0][0, 0] == 3 and got[1][0, 0] == 5 and got[2] == "7"
        del ds, got
        assert mapped() == 0 and descriptors() == 0
    finally:
        if was:
            gc.enable()
