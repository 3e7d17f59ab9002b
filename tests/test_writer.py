"""The writer's encoders (``fastload._storage.encoders``) and the file it lays out in place
(``ipcfile``): worker processes (``backend="process"``) write the same file as threads,
byte for byte, and report failed and skipped rows the same way; the file is a plain Arrow
IPC file whatever its first column; a header that outgrows its reserve still gives one;
a worker that dies ends the write with no file left."""

import filecmp
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import simplejpeg

import fastload
from fastload import LoadError
from fastload._storage import ipcfile
from fastload.storage import JPEG, Bytes, NDArray, Raw, Str, write


class Source:
    """Rows made in Python (``__getitem__``), some of them failing."""

    def __init__(self, n, bad=()):
        self.n, self.bad = n, set(bad)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.bad:
            raise ValueError(f"row {i} is broken")
        rng = np.random.default_rng(i)
        pixels = rng.integers(0, 256, (6 + i % 5, 10, 3), dtype=np.uint8)
        return {
            "jpeg": simplejpeg.encode_jpeg(pixels, quality=90),
            "label": i,
            "raw": rng.integers(-9, 9, 4).astype(np.int16),
            "text": "é" * (i % 4) + str(i),
            "nd": rng.integers(0, 9, (i % 3, 2)),
            "blob": bytes(i % 13),
        }


ENCODINGS = {
    "jpeg": JPEG(),
    "label": "int64",
    "raw": Raw(),
    "text": Str(),
    "nd": NDArray(),
    "blob": Bytes(),
}
ORDERS = [
    ("jpeg", "label", "raw"),
    ("text", "nd", "label"),
    ("label", "blob", "raw"),
    ("nd", "jpeg"),
    ("raw", "text"),
]


def write_both(tmp_path, data, names, **options):
    """The file and the result of a write with threads, and of one with processes."""
    fields = {name: ENCODINGS[name] for name in names}
    out = []
    for backend in ("thread", "process"):
        path = str(tmp_path / f"{backend}.arrow")
        out.append(
            (
                path,
                write(
                    path,
                    data,
                    fields,
                    backend=backend,
                    parallel=2,
                    block_bytes=400,
                    progress=False,
                    **options,
                ),
            )
        )
    return out


def check_readable(path, source, skipped=()):
    ds = fastload.open(path, verify="open")
    ds.verify()
    pa.ipc.open_file(path).get_batch(0).validate(full=True)
    assert len(pd.read_feather(path)) == len(ds)
    expected = [i for i in range(len(source)) if i not in set(skipped)]
    for k, i in enumerate(expected):
        row, want = ds[k], source[i]
        for name in row:
            if name == "jpeg":
                assert row[name].shape[:2] == (6 + i % 5, 10)
            elif name == "text":
                assert row[name] == want[name]
            else:
                assert np.array_equal(np.asarray(row[name]), np.asarray(want[name]))


@pytest.mark.parametrize("names", ORDERS)
def test_processes_write_the_same_file_as_threads(tmp_path, names):
    source = Source(60)
    (threads, none), (processes, none_too) = write_both(tmp_path, source, names)
    assert none == none_too == []
    assert filecmp.cmp(threads, processes, shallow=False)
    check_readable(processes, source)
    assert fastload.open(processes).num_blocks > 1


@pytest.mark.parametrize("names", ORDERS[:3])
def test_processes_skip_and_report_rows_as_threads_do(tmp_path, names):
    source = Source(60, bad=(0, 17, 18, 59))
    (threads, by_threads), (processes, by_processes) = write_both(
        tmp_path, source, names, on_error="skip"
    )
    assert filecmp.cmp(threads, processes, shallow=False)
    assert [e.index for e in by_processes] == [e.index for e in by_threads] == [0, 17, 18, 59]
    assert [str(e) for e in by_processes] == [str(e) for e in by_threads]
    for error in by_processes:
        assert isinstance(error, LoadError) and isinstance(error.__cause__, ValueError)
    check_readable(processes, source, skipped=(0, 17, 18, 59))


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_the_first_failed_row_is_raised_and_no_file_is_left(tmp_path, backend):
    with pytest.raises(LoadError, match="row 33") as info:
        write(
            str(tmp_path / "out.arrow"),
            Source(300, bad=(33, 250)),
            {"jpeg": JPEG()},
            backend=backend,
            parallel=2,
            block_bytes=400,
            progress=False,
        )
    assert info.value.index == 33
    assert isinstance(info.value.__cause__, ValueError)
    assert "row 33 is broken" in str(info.value.__cause__)
    assert os.listdir(tmp_path) == []


class DiesInAWorker:
    def __init__(self, parent):
        self.parent = parent

    def __len__(self):
        return 400

    def __getitem__(self, i):
        if i == 300 and os.getpid() != self.parent:
            os._exit(3)
        return {"x": np.full(16, i % 256, np.uint8)}


def test_a_worker_that_dies_ends_the_write_with_no_file_left(tmp_path):
    with pytest.raises(RuntimeError, match="worker process .* exited with code 3"):
        write(
            str(tmp_path / "out.arrow"),
            DiesInAWorker(os.getpid()),
            {"x": Raw()},
            backend="process",
            parallel=2,
            progress=False,
        )
    assert os.listdir(tmp_path) == []


def test_a_header_that_outgrows_its_reserve_is_written_by_pyarrow(tmp_path, monkeypatch):
    finished = []
    real = ipcfile.InPlaceFile.finish
    monkeypatch.setattr(
        ipcfile.InPlaceFile,
        "finish",
        lambda self, *args: finished.append(real(self, *args)) or finished[-1],
    )
    rows = [{"b": b"x"}] + [{"b": bytes([i % 256]) * 100} for i in range(6000)]
    path = str(tmp_path / "many.arrow")
    write(path, rows, {"b": Bytes()}, block_bytes=100, progress=False)
    assert finished == [False]  # 6000 blocks: far more than the first row said
    ds = fastload.open(path, verify="open")
    assert ds.num_blocks == 6000 and ds[4]["b"] == bytes([3]) * 100
    pa.ipc.open_file(path).get_batch(0).validate(full=True)


def test_write_refuses_an_unknown_backend(tmp_path):
    with pytest.raises(ValueError, match="backend"):
        write(str(tmp_path / "x.arrow"), [{"y": 1}], {"y": "int64"}, backend="gpu")


class Interrupted(Source):
    def __getitem__(self, i):
        if i == 150:
            raise KeyboardInterrupt
        return super().__getitem__(i)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_an_interrupt_in_a_row_is_raised_as_it_is_and_leaves_no_file(tmp_path, backend):
    with pytest.raises(KeyboardInterrupt):
        write(
            str(tmp_path / "out.arrow"),
            Interrupted(300),
            {"raw": Raw()},
            backend=backend,
            parallel=2,
            progress=False,
        )
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "field, values, dtype",
    [
        (Raw(), [np.ones(2, np.int32), np.full(2, 2**40, np.int64)], "int32"),  # would wrap
        (NDArray(), [np.ones(3, np.float32), np.full(2, 1e300)], "float32"),  # would be inf
        ("float32", [np.float32(1), 1e300], "float32"),
        ("int32", [1, 2**40], "int32"),
        ("uint8", [np.int16(3), np.int16(-1)], "uint8"),
    ],
)
def test_a_value_the_field_dtype_cannot_hold_is_refused_naming_row_and_field(
    tmp_path, field, values, dtype
):
    path = tmp_path / "cast.arrow"
    with pytest.raises(LoadError, match=f"row 1, field 'x'.* dtype {dtype} cannot hold") as caught:
        write(path, [{"x": v} for v in values], {"x": field}, progress=False)
    assert caught.value.index == 1
    assert not path.exists()


def test_values_that_survive_the_field_dtype_are_cast_as_before(tmp_path):
    path = tmp_path / "cast.arrow"
    rows = [
        {"raw": np.ones(2, np.float32), "f": 1, "i": np.int64(-7)},
        {"raw": np.full(2, 0.1), "f": 2.5, "i": True},  # float rounding is the field's
    ]
    write(path, rows, {"raw": Raw(), "f": "float32", "i": "int8"}, progress=False)
    got = fastload.getobs(fastload.storage.open(path), [0, 1])
    np.testing.assert_array_equal(got["raw"], np.array([[1, 1], [0.1, 0.1]], np.float32))
    np.testing.assert_array_equal(got["f"], np.array([1, 2.5], np.float32))
    np.testing.assert_array_equal(got["i"], np.array([-7, 1], np.int8))


def _write_with(tmp_path, name, **options):
    path = str(tmp_path / f"{name}.arrow")
    write(path, Source(40), ENCODINGS, block_bytes=400, progress=False, **options)
    return path


def test_every_parallel_setting_writes_the_same_file(tmp_path):
    paths = [
        _write_with(tmp_path, str(k), parallel=parallel)
        for k, parallel in enumerate([True, False, 0, 1, 3])
    ]
    assert all(filecmp.cmp(paths[0], p, shallow=False) for p in paths[1:])
    check_readable(paths[0], Source(40))


def test_num_threads_is_the_old_spelling_of_parallel_and_warns(tmp_path):
    new = _write_with(tmp_path, "new", parallel=2)
    with pytest.warns(DeprecationWarning, match=r"num_threads=2 is deprecated: write parallel=2"):
        old = _write_with(tmp_path, "old", num_threads=2)
    assert filecmp.cmp(new, old, shallow=False)


def test_the_num_threads_warning_points_at_the_callers_line(tmp_path):
    with pytest.warns(DeprecationWarning) as caught:
        _write_with(tmp_path, "old", num_threads=1)
    assert caught[0].filename == __file__


@pytest.mark.parametrize(
    "options, error, message",
    [
        (dict(parallel=2.5), ValueError, "parallel must be False, True or a number of threads"),
        (dict(parallel=-1), ValueError, "parallel must be False, True or a number of threads"),
        (dict(parallel="4"), ValueError, "parallel must be False, True or a number of threads"),
        (dict(parallel=False, backend="process"), ValueError, "backend='process' needs"),
        (dict(num_threads=0), ValueError, "num_threads must be a positive int or None, got 0"),
        (dict(num_threads=2, parallel=3), TypeError, "takes parallel= alone"),
    ],
)
def test_a_bad_parallel_is_refused_before_anything_is_written(tmp_path, options, error, message):
    with pytest.raises(error, match=message):
        _write_with(tmp_path, "bad", **options)
    assert not os.path.exists(tmp_path / "bad.arrow")


def test_skip_leaves_out_a_first_row_that_cannot_be_encoded(tmp_path):
    good = simplejpeg.encode_jpeg(np.zeros((8, 8, 3), np.uint8))
    rows = [{"image": b"not an image"}, {"image": good}]
    [error] = write(
        tmp_path / "a.arrow",
        rows,
        {"image": JPEG(keep_given=True)},
        on_error="skip",
        progress=False,
    )
    assert error.index == 0 and "not an image file" in str(error)
    assert fastload.open(tmp_path / "a.arrow")["image"].encoded[0] == good
