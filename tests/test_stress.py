"""Bounded stress runs of the failure audit: mutated images, corrupted packed files, killed
workers, interrupted writes, a full disk. Not part of `make test` (they take minutes):
`make stress` runs them. Each ends in a clear error or the right data, never a crash, a
hang or plausible wrong data.
"""

import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import simplejpeg
from helpers import deadline

from fastload import DataLoader, mapobs, open, write
from fastload.storage import JPEG, QOI, Bytes, Raw, Str
from fastload.transforms import Compose, DecodeImage, RandomResizedCrop

pytestmark = pytest.mark.stress
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mutations(data, count, seed):
    """``count`` damaged copies of ``data``: flipped bytes, cuts, inserted garbage."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        b = bytearray(data)
        kind = rng.integers(3)
        if kind == 0:
            for at in rng.integers(0, len(b), rng.integers(1, 8)):
                b[at] ^= int(rng.integers(1, 256))
        elif kind == 1:
            b = b[: int(rng.integers(0, len(b)))]
        else:
            at = int(rng.integers(0, len(b)))
            b[at:at] = bytes(rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8))
        yield bytes(b)


def test_mutated_jpeg_and_qoi_images_load_or_fail_cleanly():
    from fastload import _core

    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
    sources = [simplejpeg.encode_jpeg(image, quality=90), _core.qoi_encode(image)]
    mutated = [m for k, src in enumerate(sources) for m in _mutations(src, 4000, k)]
    chain = Compose([DecodeImage(), RandomResizedCrop(24)])
    loader = DataLoader(mapobs(chain, mutated), 64, parallel=2, on_error="skip", seed=0)
    with deadline(300), pytest.warns(RuntimeWarning, match="skipped"):
        loaded = sum(len(batch) for batch in loader)
    assert loaded + loader.stats()["skipped"] == len(mutated)
    for data in mutated[::40]:  # the Python path: an array of the right shape, or a
        try:  # ValueError
            assert chain(data).shape == (24, 24, 3)
        except ValueError:
            pass


def _rows(n):
    rng = np.random.default_rng(1)
    return [
        {
            "jpeg": rng.integers(0, 256, (16, 20, 3), dtype=np.uint8),
            "qoi": rng.integers(0, 256, (12, 10, 3), dtype=np.uint8),
            "raw": rng.standard_normal((2, 3)).astype(np.float32),
            "blob": bytes(rng.integers(0, 256, k % 17, dtype=np.uint8)),
            "text": f"row {k}",
            "label": k,
        }
        for k in range(n)
    ]


FIELDS = {
    "jpeg": JPEG(quality=95),
    "qoi": QOI(),
    "raw": Raw(),
    "blob": Bytes(),
    "text": Str(),
    "label": "int64",
}


def _values(ds):
    return [
        (
            ds["jpeg"].encoded[k].tobytes()
            if hasattr(ds["jpeg"].encoded[k], "tobytes")
            else bytes(ds["jpeg"].encoded[k]),
            ds["qoi"][k].tobytes(),
            ds["raw"][k].tobytes(),
            ds["blob"][k],
            ds["text"][k],
            int(ds["label"][k]),
        )
        for k in range(len(ds))
    ]


def test_a_corrupted_packed_file_never_opens_verified_with_other_data(tmp_path):
    path = tmp_path / "good.arrow"
    write(path, _rows(60), FIELDS, block_bytes=2000, progress=False)
    original = path.read_bytes()
    expected = _values(open(path))
    found = 0
    for k, damaged in enumerate(_mutations(original, 1200, 7)):
        bad = tmp_path / "bad.arrow"
        bad.write_bytes(damaged)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # "not verified" counts as found
                ds = open(bad, verify="open")
            values = _values(ds)
        except (ValueError, UserWarning):  # LoadError is a ValueError
            found += 1
            continue
        assert values == expected, f"mutation {k} opened verified with other data"
    assert found > 1000  # most damage is found; the rest changed nothing read


def _slow(x):
    time.sleep(0.005)
    return x


def test_killed_workers_always_end_in_an_error_and_the_next_loader_works():
    rng = np.random.default_rng(2)
    data = mapobs(_slow, np.arange(2000.0))
    for trial in range(20):
        loader = DataLoader(data, 8, parallel=2, backend="process", seed=trial)
        it = iter(loader)
        next(it)
        time.sleep(float(rng.uniform(0, 0.05)))
        victim = loader._engine._workers.procs[int(rng.integers(2))]
        os.kill(victim.pid, signal.SIGKILL)
        with deadline(30), pytest.raises(RuntimeError, match="SIGKILL"):
            for _ in it:
                pass
        loader.close()
    with deadline(30):
        got = [
            b.copy()
            for b in DataLoader(mapobs(_slow, np.arange(40.0)), 8, parallel=2, backend="process")
        ]
    assert np.array_equal(np.concatenate(got), np.arange(40.0))


WRITER = """
import sys, numpy as np
sys.path.insert(0, sys.argv[2])
from fastload.storage import Raw, write
class Rows:
    def __len__(self):
        return 200_000
    def __getitem__(self, i):
        if i == 500:
            print("writing", flush=True)
        return {"x": np.full((32, 32), i % 256, np.uint8)}
write(sys.argv[1], Rows(), {"x": Raw()}, progress=False, parallel=2)
"""


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_interrupted_writes_leave_the_old_file_and_the_next_write_cleans_up(tmp_path, how):
    rng = np.random.default_rng(int(how))
    out = tmp_path / "out.arrow"
    write(out, [{"y": 1}], {"y": "int64"}, progress=False)
    for _ in range(7):
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(out), ROOT],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert child.stdout.readline().strip() == "writing"
        time.sleep(float(rng.uniform(0, 0.3)))
        child.send_signal(how)
        child.wait(60)
        assert open(out)["y"].tolist() == [1]  # the old file, whole
        if how == signal.SIGINT:  # Python saw it: nothing left behind
            assert sorted(os.listdir(tmp_path)) == ["out.arrow"]
    write(out, [{"y": 2}], {"y": "int64"}, progress=False)
    assert sorted(os.listdir(tmp_path)) == ["out.arrow"]
    assert open(out)["y"].tolist() == [2]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_disk_is_a_clear_error_that_leaves_nothing_behind(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)]).returncode:
        pytest.skip("this machine does not let a test mount a tmpfs")
    try:
        rows = [{"x": np.full((64, 64), k % 256, np.uint8)} for k in range(1000)]  # 4 MB
        with pytest.raises(OSError) as info:
            write(mount / "big.arrow", rows, {"x": Raw()}, progress=False)
        assert "No space left" in str(info.value) or info.value.errno == 28
        assert os.listdir(mount) == []
        write(mount / "small.arrow", rows[:10], {"x": Raw()}, progress=False)
        assert len(open(mount / "small.arrow")) == 10
    finally:
        busy = subprocess.run(["umount", str(mount)]).returncode
        if busy:
            subprocess.run(["umount", "-l", str(mount)])  # leave nothing mounted
    assert not busy, "the tmpfs stayed in use: a map of small.arrow outlived its dataset"


SHRINKING = """
import sys
sys.path.insert(0, sys.argv[2])
from fastload import DataLoader, LoadError, open
parallel, backend, shuffle = int(sys.argv[3]) or False, sys.argv[4], sys.argv[5]
ds = open(sys.argv[1])
loader = DataLoader(ds, 16, shuffle={"True": True}.get(shuffle, shuffle), parallel=parallel,
                    backend=backend, seed=0)
print("loading", flush=True)
try:
    for epoch in range(1000):
        for batch in loader:
            pass
except LoadError as exc:
    print("error:", exc, flush=True)
"""


@pytest.mark.parametrize(
    "parallel, backend", [(0, "thread"), (2, "thread"), (2, "process")], ids=["seq", "thr", "proc"]
)
def test_a_file_truncated_at_any_moment_under_a_loader_raises_load_error_naming_it(
    tmp_path, parallel, backend
):
    """Another process truncates the file at a random moment while a loader reads it, in
    a loop of epochs: the loader raises ``LoadError`` naming the file, never dies by
    SIGBUS."""
    rng = np.random.default_rng(parallel + len(backend))
    source = tmp_path / "source.arrow"
    rows = [{"x": np.full((40, 40), k % 256, np.uint8), "blob": bytes(k % 97)} for k in range(4000)]
    write(source, rows, {"x": Raw(), "blob": Bytes()}, block_bytes=1 << 16, progress=False)
    for trial in range(8):
        path = tmp_path / f"data{trial}.arrow"
        path.write_bytes(source.read_bytes())
        shuffle = ("True", "quasi")[trial % 2]
        child = subprocess.Popen(
            [sys.executable, "-c", SHRINKING, str(path), ROOT, str(parallel), backend, shuffle],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stdout.readline().strip() == "loading"
        time.sleep(float(rng.uniform(0, 0.5)))
        os.truncate(path, int(rng.integers(0, path.stat().st_size)))
        out, err = child.communicate(timeout=120)
        # A sanitizer's report starts its output, a traceback ends it.
        said = err if len(err) < 5000 else f"{err[:3500]}\n[...]\n{err[-1500:]}"
        assert child.returncode == 0, f"trial {trial} died ({child.returncode}): {said}"
        assert out.startswith("error: ") and f"data{trial}.arrow" in out, out + err[-1500:]
