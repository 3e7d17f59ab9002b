"""A packed file rewritten in place while it is open (``cp new old``, ``rsync --inplace``,
``dd``): the bytes under the map change, the file's size or modification time with them,
and no row of the new bytes is handed out: ``LoadError`` names the file. A file replaced
by rename is another file: what is open keeps reading the old one. Files read unchecked
(``verify=None``, no checksums) warn once per file."""

import builtins
import os
import shutil
import time
import warnings

import numpy as np
import pyarrow as pa
import pytest

from fastload import DataLoader, LoadError
from fastload._storage.meta import META_FORMAT
from fastload.storage import Raw, open, write

ROWS = 512
CHANGED = "the file changed while it was open"
LOADERS = [{"parallel": False}, {"parallel": 2}, {"parallel": 2, "backend": "process"}]
LOADER_IDS = ["sequential", "threads", "processes"]


def _rows(seed=0):
    rng = np.random.default_rng(seed)
    return [
        {"raw": rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), "label": k} for k in range(ROWS)
    ]


def _write(path, rows):
    write(path, rows, {"raw": Raw(), "label": "int64"}, block_bytes=8 << 10, progress=False)
    return path


@pytest.fixture
def packed(tmp_path):
    """(path, rows, other, other_rows): a packed file, and the bytes of another one written
    with the same schema and of the same size (the same layout, other values)."""
    rows = _rows()
    path = _write(tmp_path / "data.arrow", rows)
    for seed in range(1, 64):  # the checksums' digits vary the metadata's length a little
        other_rows = _rows(seed)
        other = builtins.open(_write(tmp_path / "other.arrow", other_rows), "rb").read()
        if len(other) == os.path.getsize(path):
            break
    assert len(other) == os.path.getsize(path)
    # Timestamps have a granularity (a jiffy before Linux 6.13): a rewrite within it of
    # the file's last change could keep its modification time.
    time.sleep(0.05)
    return path, rows, other, other_rows


def _rewrite(path, data, how):
    """Rewrite ``path`` in place: truncated and written again (``cp``, ``rsync
    --inplace``), or written over (``dd conv=notrunc``)."""
    if how == "cp":
        source = f"{path}.new"
        builtins.open(source, "wb").write(data)
        shutil.copyfile(source, path)  # opens with O_TRUNC: the same inode, rewritten
    else:
        with builtins.open(path, "r+b") as f:
            f.write(data)
    assert os.path.getsize(path) == len(data)


def _check_batch(raw, labels, rows):
    for image, label in zip(raw, labels):
        assert np.array_equal(image, rows[int(label)]["raw"]), f"row {label}: other bytes"


@pytest.mark.filterwarnings("ignore:.*opened with verify=None:UserWarning")
@pytest.mark.parametrize("how", ["cp", "dd"])
@pytest.mark.parametrize("verify", ["read", "open", None])
@pytest.mark.parametrize("options", LOADERS, ids=LOADER_IDS)
def test_a_file_rewritten_in_place_between_epochs_raises_load_error_naming_it(
    packed, options, verify, how
):
    path, rows, other, _ = packed
    ds = open(path, verify=verify)
    loader = DataLoader((ds["raw"], ds["label"]), 32, shuffle=True, seed=0, **options)
    for raw, labels in loader:
        _check_batch(raw, labels, rows)
    _rewrite(path, other, how)
    delivered = []
    with pytest.raises(LoadError, match=f"data.arrow: {CHANGED}"):
        for _, labels in loader:
            delivered.append(labels)
    assert delivered == []
    with pytest.raises(LoadError, match=CHANGED):
        ds[0]
    with pytest.raises(LoadError, match=CHANGED):
        list(DataLoader(ds, 32, **options))


@pytest.mark.parametrize("options", LOADERS, ids=LOADER_IDS)
def test_a_rewrite_in_the_middle_of_an_epoch_hands_out_no_row_of_the_new_bytes(packed, options):
    path, rows, other, _ = packed
    ds = open(path)
    loader = DataLoader((ds["raw"], ds["label"]), 16, shuffle=True, seed=1, **options)
    batches = iter(loader)
    for _ in range(5):
        _check_batch(*next(batches), rows)
    _rewrite(path, other, "dd")
    with pytest.raises(LoadError, match=CHANGED):
        for raw, labels in batches:  # batches loaded before the rewrite may come out
            _check_batch(raw, labels, rows)


def test_a_changed_file_is_reported_by_verify_and_by_items(packed):
    path, _, other, other_rows = packed
    ds = open(path, verify="open")
    _rewrite(path, other, "cp")
    with pytest.raises(LoadError, match=CHANGED):
        ds.verify()
    with pytest.raises(LoadError, match=CHANGED):
        ds[[1, 2]]
    assert np.array_equal(open(path, verify="open")[0]["raw"], other_rows[0]["raw"])  # reopened


def test_a_file_replaced_by_rename_keeps_reading_the_one_that_was_open(packed):
    path, rows, _, _ = packed
    ds = open(path)
    loader = DataLoader((ds["raw"], ds["label"]), 64, shuffle=True, parallel=2)
    list(loader)
    _write(path, _rows(seed=7))  # write() renames a finished file over the old one
    for raw, labels in loader:
        _check_batch(raw, labels, rows)
    assert np.array_equal(ds[5]["raw"], rows[5]["raw"])


def test_a_rewrite_that_sets_the_modification_time_back_is_found_by_the_checksums(packed):
    """``cp -p``, ``rsync -t --inplace``: the size and the modification time are the old
    ones, only the change time says; each block is checked against its checksum again,
    the next time it is read."""
    path, _, other, other_rows = packed
    ds = open(path)
    before = os.stat(path)
    list(DataLoader(ds, 64))
    _rewrite(path, other, "dd")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(LoadError, match=f"data.arrow: {CHANGED}"):
        list(DataLoader(ds, 64, parallel=2))
    # A change of the metadata alone (a mode, a rename) checks the blocks again, and reads on
    same = open(path)
    list(DataLoader(same, 64))
    os.chmod(path, 0o600)
    os.rename(path, f"{path}.moved")
    assert np.array_equal(same[3]["raw"], other_rows[3]["raw"])
    assert np.array_equal(next(iter(DataLoader(same, 8)))["raw"][7], other_rows[7]["raw"])


def _without_checksums(path):
    table = pa.ipc.open_file(path).read_all()
    meta = {k: v for k, v in table.schema.metadata.items() if k != b"fastload.checksums"}
    table = table.replace_schema_metadata({**meta, META_FORMAT: b"1"})  # an older file
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as out:
        out.write_table(table)


def _flip_a_value(path, rows, row):
    data = bytearray(builtins.open(path, "rb").read())
    data[data.index(rows[row]["raw"].tobytes())] ^= 0xFF
    builtins.open(path, "wb").write(bytes(data))


@pytest.mark.parametrize("kind", ["verify=None", "format 1"])
def test_each_file_read_unchecked_warns_once_naming_it_and_the_risk(tmp_path, kind):
    rows = _rows()
    paths = [_write(tmp_path / f"{name}.arrow", rows) for name in ("a", "b")]
    for path in paths:
        if kind == "format 1":
            _without_checksums(path)
        _flip_a_value(path, rows, 5)
    verify = None if kind == "verify=None" else "read"

    def opened(path):  # one place in the code that opens: where the warnings point
        return open(path, verify=verify)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's own: once per message and place
        for _ in range(3):
            for path in paths:
                got = opened(path)[5]["raw"]
                assert not np.array_equal(got, rows[5]["raw"])  # the flipped value, unchecked
            both = opened(tmp_path)  # the two files as one dataset
            assert not np.array_equal(both[ROWS + 5]["raw"], rows[5]["raw"])
    messages = sorted(str(w.message) for w in caught if w.category is UserWarning)
    assert len(messages) == 2, messages
    for message, path in zip(messages, paths):
        assert message.startswith(f"{path}: ") and "handed out as data" in message
