"""A packed file that shrinks while it is read (truncated or rewritten in place): a
``LoadError`` naming it, in every backend, cache setting and order, never a death by
SIGBUS. Each case runs in a child process, so that a signal death fails the test instead
of ending pytest; the child truncates the file itself between two batches, so the cases
are deterministic."""

import builtins
import mmap
import os
import shutil
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
from helpers import deadline

from fastload import DataLoader, LoadError, _core, write
from fastload.storage import JPEG, Bytes, Raw, open

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Loads a packed file in batches and truncates it: to a third after the first batch (for
# each order and verify setting), or before the first batch (to nothing, and to a half).
# One output line per case: "error: <message>" or "no error".
CHILD = r"""
import os, shutil, sys, warnings
sys.path.insert(0, sys.argv[1])
from fastload import DataLoader, LoadError, mapobs, open
from fastload.transforms import Compose, DecodeImage
warnings.filterwarnings("ignore", ".*opened with verify=None", UserWarning)  # asked for

source, parallel, backend = sys.argv[2], int(sys.argv[3]) or False, sys.argv[4]
cases = [(s, v, 1, 3) for s in (True, "quasi") for v in ("read", None)]
cases += [(True, "read", 0, 0), ("quasi", None, 0, 2)]
for shuffle, verify, batches_first, part in cases:
    path = f"{source}.{shuffle}.{verify}.{part}.arrow"
    shutil.copyfile(source, path)
    ds = open(path, verify=verify)
    data = (ds["raw"], mapobs(Compose([DecodeImage()]), ds["jpeg"].encoded), ds["label"])
    loader = DataLoader(data, 20, shuffle=shuffle, parallel=parallel, backend=backend,
                        seed=0)
    batches = iter(loader)
    for _ in range(batches_first):
        next(batches)
    os.truncate(path, os.path.getsize(path) // part if part else 0)
    try:
        for _ in batches:
            pass
        print("no error", flush=True)
    except LoadError as exc:
        print("error:", str(exc).replace(chr(10), " "), flush=True)
    del batches, loader, data, ds
"""


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)
    rows = [
        {
            "raw": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
            "jpeg": image,
            "blob": bytes(rng.integers(0, 256, 64, dtype=np.uint8)),
            "label": k,
        }
        for k in range(3000)
    ]
    path = tmp_path_factory.mktemp("shrink") / "source.arrow"
    fields = {"raw": Raw(), "jpeg": JPEG(quality=90), "blob": Bytes(), "label": "int64"}
    write(path, rows, fields, block_bytes=1 << 16, progress=False)
    return path


@pytest.mark.parametrize(
    "parallel, backend",
    [(0, "thread"), (2, "thread"), (2, "process")],
    ids=["sequential", "threads", "processes"],
)
def test_a_file_truncated_under_a_running_loader_raises_load_error_naming_it(
    packed, tmp_path, parallel, backend
):
    source = tmp_path / "data.arrow"
    shutil.copyfile(packed, source)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, ROOT, str(source), str(parallel), backend],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, f"the loader died ({child.returncode}): {child.stderr[-2000:]}"
    assert child.stderr == ""
    names = [f"{s}.{v}.3" for s in (True, "quasi") for v in ("read", None)]
    names += ["True.read.0", "quasi.None.2"]
    lines = child.stdout.splitlines()
    assert len(lines) == len(names)
    for line, name in zip(lines, names):
        assert line.startswith("error: ") and f"data.arrow.{name}.arrow" in line, line
        assert "shrank while it was read" in line


def test_items_read_after_the_file_shrank_raise_instead_of_reading_zeros(packed, tmp_path):
    path = tmp_path / "data.arrow"
    shutil.copyfile(packed, path)
    ds = open(path, verify=None)
    want = ds[2999]["blob"]
    os.truncate(path, os.path.getsize(path) // 3)
    with pytest.raises(LoadError, match="data.arrow: the file shrank while it was read"):
        ds[2999]
    with pytest.raises(LoadError, match="shrank"):
        ds["blob"][2990:]
    with pytest.raises(LoadError, match="shrank"):
        ds[0]  # its rows are whole, but the file is known to be cut: every read says so
    with pytest.raises(LoadError, match="shrank"):
        ds.verify()
    assert want == bytes(want)  # read before the cut, kept


def test_rows_in_the_page_that_holds_the_new_end_raise_though_they_read_without_fault(
    tmp_path,
):
    """The system zeroes the page holding a file's new end past it instead of cutting it:
    reading there raises no fault, and the file's size says it was cut."""
    path = tmp_path / "data.arrow"
    labels = 0x5EED0000 + np.arange(1000)
    write(
        path,
        {"x": np.zeros((1000, 16), np.uint8), "label": labels},
        {"x": Raw(), "label": "int64"},
        progress=False,
    )
    data = path.read_bytes()
    cut = data.index(int(labels[-1]).to_bytes(8, "little"))
    assert len(data) - cut < mmap.PAGESIZE  # the rest of the file lies in the cut page
    ds = open(path, verify=None)
    os.truncate(path, cut)
    with pytest.raises(LoadError, match="data.arrow: the file shrank while it was read"):
        ds[999]
    batches = DataLoader(ds, 100)
    with pytest.raises(LoadError, match="data.arrow: the file shrank"):
        for _ in batches:
            pass


def test_a_file_read_into_memory_is_not_affected_by_a_later_cut(packed, tmp_path):
    path = tmp_path / "data.arrow"
    shutil.copyfile(packed, path)
    ds = open(path, cache="memory")
    want = open(packed)[2999]
    os.truncate(path, 100)
    got = ds[2999]
    assert got["blob"] == want["blob"] and np.array_equal(got["raw"], want["raw"])


def _guarded_file(path, pages, seed):
    """A file of ``pages`` pages of random nonzero bytes at ``path``: (its bytes, its
    mmap, the mmap's ``FileGuard``)."""
    data = np.random.default_rng(seed).integers(1, 256, pages * mmap.PAGESIZE, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    with builtins.open(path, "rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return data, mapping, _core.FileGuard(mapping)


def test_a_guarded_map_reads_zeros_past_the_new_end_and_counts_the_fault(tmp_path):
    path = tmp_path / "f.bin"
    data, mapping, guard = _guarded_file(path, 3, seed=1)
    view = np.frombuffer(guard, np.uint8)
    before = _core.guarded_faults()
    assert guard.faults == 0 and np.array_equal(view, data)
    os.truncate(path, mmap.PAGESIZE + 10)
    with deadline(10):
        tail = view[2 * mmap.PAGESIZE :].copy()
    assert not tail.any() and guard.faults == 1 and _core.guarded_faults() == before + 1
    assert np.array_equal(view[: mmap.PAGESIZE + 10], data[: mmap.PAGESIZE + 10])
    with pytest.raises(BufferError):
        mapping.close()  # the guard holds the map while it lives
    del view, guard
    mapping.close()


def test_threads_reading_a_shrunk_guarded_map_at_once_all_read_zeros_past_the_new_end(tmp_path):
    """Threads copy the end of a map, from the page the file's new end falls in, at once
    and again, without the GIL (numpy's copies): each copy holds the bytes before the cut
    and zeros past it, whether its thread faulted or read the zero pages another thread's
    fault mapped, and the faults are counted. (Under ThreadSanitizer, ``make tsan``, the
    zero pages mapped under readers are the race tools/tsan.supp explains.)"""
    path = tmp_path / "f.bin"
    data, mapping, guard = _guarded_file(path, 128, seed=2)
    view = np.frombuffer(guard, np.uint8)
    first, cut = 3 * mmap.PAGESIZE, 3 * mmap.PAGESIZE + 10
    os.truncate(path, cut)
    start = threading.Barrier(4)
    copies = [[] for _ in range(4)]

    def read(k, tail):
        start.wait()
        for _ in range(20):
            copies[k].append(tail.copy())

    threads = [threading.Thread(target=read, args=(k, view[first:])) for k in range(4)]
    with deadline(30):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for got in (c for each in copies for c in each):
        assert np.array_equal(got[: cut - first], data[first:cut]) and not got[cut - first :].any()
    assert 1 <= guard.faults <= 4
    del view, threads, guard
    mapping.close()


def test_a_sigbus_outside_a_guarded_map_still_ends_the_process(tmp_path):
    """The handler answers faults in fastload's maps only: another map's fault is not
    turned into zeros."""
    code = (
        "import mmap, os, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from fastload import open\n"  # installs the handler through a guarded map
        "from fastload.storage import write\n"
        "write(sys.argv[2] + '.arrow', [{'y': 1}], {'y': 'int64'}, progress=False)\n"
        "ds = open(sys.argv[2] + '.arrow')\n"
        "with __builtins__.open(sys.argv[2], 'wb') as f:\n"
        "    f.write(bytes(1 << 16))\n"
        "with __builtins__.open(sys.argv[2], 'rb') as f:\n"
        "    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)\n"
        "os.truncate(sys.argv[2], 10)\n"
        "print(m[(1 << 16) - 1])\n"
    )
    # Under a sanitizer (make sanitize, make tsan) the fault would be its to report: leave it
    # to the default action, as a process without a sanitizer has it.
    env = dict(os.environ)
    for sanitizer in ("ASAN_OPTIONS", "TSAN_OPTIONS"):
        env[sanitizer] = f"{env.get(sanitizer, '')}:handle_sigbus=0".lstrip(":")
    child = subprocess.run(
        [sys.executable, "-c", code, ROOT, str(tmp_path / "other")],
        capture_output=True,
        timeout=60,
        env=env,
    )
    assert child.returncode == -signal.SIGBUS  # as without fastload
