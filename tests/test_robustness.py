"""Hostile inputs and misuse that must end in a clear error, never a crash or a hang."""

import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import simplejpeg
from helpers import deadline

from fastload import DataLoader, LoadError, mapobs
from fastload.imagefolder import ImageFolder
from fastload.transforms import CenterCrop, Compose, DecodeImage, Resize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_child(code, timeout=60):
    child = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert child.returncode == 0 and child.stdout.strip().endswith("ok"), (
        f"exit status {child.returncode}: {child.stdout[-1000:]}{child.stderr[-3000:]}"
    )


def test_images_whose_output_size_follows_their_aspect_never_reach_a_fixed_slot():
    # Resize(shorter side) alone: a wide image gives a wider output than a square one.
    run_child(
        "import numpy as np\n"
        "from fastload import DataLoader, LoadError, mapobs\n"
        "from fastload.transforms import Compose, Resize\n"
        "images = [np.zeros((10, 10, 3), np.uint8), np.zeros((10, 4000, 3), np.uint8)]\n"
        "for parallel in (False, 2):\n"
        "    try:\n"
        "        list(DataLoader(mapobs(Compose([Resize(64)]), images), 2, parallel=parallel))\n"
        "    except LoadError:\n"
        "        pass\n"
        "    else:\n"
        "        raise SystemExit('no error')\n"
        "print('ok')\n"
    )


def test_closing_a_loader_mid_iteration_stops_it_with_an_error_not_stale_batches():
    data = mapobs(lambda x: x * 2, np.arange(4000.0).reshape(1000, 4))
    loader = DataLoader(data, 10, parallel=2, buffer=True)
    batches = iter(loader)
    first = next(batches).copy()
    assert np.array_equal(first, np.arange(40.0).reshape(10, 4) * 2)
    loader.close()
    with deadline(10), pytest.raises(RuntimeError, match="closed"):
        for _ in batches:
            pass
    again = [b.copy() for b in DataLoader(data, 10, parallel=2)]
    assert np.array_equal(np.concatenate(again), data.data * 2)


def test_a_forked_child_can_drop_an_iteration_of_its_parent_and_load_anew():
    run_child(
        "import os, numpy as np\n"
        "from fastload import DataLoader, mapobs\n"
        "data = mapobs(lambda x: x + 1, np.arange(2000.0).reshape(500, 4))\n"
        "batches = iter(DataLoader(data, 5, parallel=2, buffer=True))\n"
        "next(batches)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    try:\n"
        "        next(batches)\n"
        "        code = 3\n"
        "    except RuntimeError:\n"
        "        code = 0\n"
        "    batches.close()\n"
        "    fresh = np.concatenate([b.copy() for b in DataLoader(data, 50, parallel=2)])\n"
        "    os._exit(code if np.array_equal(fresh, data.data + 1) else 4)\n"
        "import time\n"
        "for _ in range(300):\n"
        "    done, status = os.waitpid(pid, os.WNOHANG)\n"
        "    if done:\n"
        "        break\n"
        "    time.sleep(0.1)\n"
        "else:\n"
        "    os.kill(pid, 9)\n"
        "    raise SystemExit('the child hung')\n"
        "assert os.WEXITSTATUS(status) == 0, os.WEXITSTATUS(status)\n"
        "print(sum(len(b) for b in batches), 'ok')\n"
    )


def test_an_exception_whose_text_cannot_be_made_still_fails_its_item():
    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no text")

    def f(x):
        if x[0] == 28:
            raise Unprintable()
        return x

    data = mapobs(f, np.arange(400.0).reshape(100, 4))
    with deadline(10), pytest.raises(LoadError) as info:
        list(DataLoader(data, 10, parallel=2))
    assert info.value.index == 7


def test_a_fifo_among_image_files_fails_its_item_instead_of_blocking(tmp_path):
    jpeg = simplejpeg.encode_jpeg(np.zeros((64, 64, 3), np.uint8))
    (tmp_path / "a").mkdir()
    for k in range(4):
        (tmp_path / "a" / f"{k}.jpg").write_bytes(jpeg)
    folder = ImageFolder(tmp_path)
    os.remove(folder.images.paths[2])
    os.mkfifo(folder.images.paths[2])
    data = mapobs(Compose([DecodeImage(), CenterCrop(32)]), folder.images)
    with deadline(10), pytest.raises(LoadError, match="not a regular file") as info:
        list(DataLoader(data, 2, parallel=2))
    assert info.value.index == 2


@pytest.mark.parametrize("mode", ["jpeg", "raw"])
def test_write_and_convert_refuse_a_fifo_named_like_an_image_instead_of_blocking(tmp_path, mode):
    from fastload.storage import JPEG, write
    from fastload.storage.convert import convert

    jpeg = simplejpeg.encode_jpeg(np.zeros((16, 16, 3), np.uint8))
    (tmp_path / "src" / "a").mkdir(parents=True)
    for k in range(3):
        (tmp_path / "src" / "a" / f"{k}.jpg").write_bytes(jpeg)
    os.mkfifo(tmp_path / "src" / "a" / "3.jpg")
    with deadline(20), pytest.raises(LoadError, match="3.jpg: not a regular file"):
        convert(tmp_path / "src", tmp_path / f"{mode}.arrow", mode=mode, progress=False)
    with deadline(20), pytest.raises(LoadError, match="not a regular file"):
        write(
            tmp_path / "w.arrow",
            ImageFolder(tmp_path / "src"),
            {"image": JPEG(), "label": "int64"},
            progress=False,
        )
    assert not os.path.exists(tmp_path / f"{mode}.arrow")


def test_a_forged_qoi_header_is_refused_before_memory_is_set_aside():
    huge = (
        b"qoif"
        + struct.pack(">II", 10_000_000, 1)
        + bytes([3, 0])
        + bytes(100)
        + bytes(7)
        + b"\x01"
    )
    data = mapobs(Compose([DecodeImage(), Resize(16), CenterCrop(16)]), [huge, huge])
    with deadline(10), pytest.raises(LoadError, match="truncated QOI"):
        list(DataLoader(data, 2, parallel=2))


def _forged_jpeg(h, w):
    """A small valid JPEG whose frame header (SOF0) declares h x w."""
    data = bytearray(simplejpeg.encode_jpeg(np.zeros((8, 8, 3), np.uint8)))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", h, w)
    return bytes(data)


@pytest.mark.parametrize("parallel", [False, 2])
def test_a_forged_jpeg_header_is_refused_before_memory_is_set_aside(parallel):
    forged = _forged_jpeg(16384, 16384)
    assert len(forged) < 1000
    data = mapobs(Compose([DecodeImage(), Resize(16), CenterCrop(16)]), [forged, forged])
    with deadline(10), pytest.raises(LoadError, match="over the limit.*MAX_IMAGE_PIXELS"):
        list(DataLoader(data, 2, parallel=parallel))
    with pytest.raises(ValueError, match="over the limit"):
        Compose([DecodeImage(), Resize(16), CenterCrop(16)])(forged)


@pytest.mark.parametrize("parallel", [False, 2])
def test_the_limits_are_settable_and_every_path_follows_them(tmp_path, monkeypatch, parallel):
    from fastload import files, limits

    image = simplejpeg.encode_jpeg(np.zeros((20, 20, 3), np.uint8))
    path = tmp_path / "a.jpg"
    path.write_bytes(image)
    chain = Compose([DecodeImage(), CenterCrop(8)])
    assert len(list(DataLoader(mapobs(chain, files([path])), 1, parallel=parallel))) == 1
    monkeypatch.setattr(limits, "MAX_IMAGE_PIXELS", 399)
    for source in ([image], files([path])):
        with pytest.raises(LoadError, match="20x20 image is over the limit of 399"):
            list(DataLoader(mapobs(chain, source), 1, parallel=parallel))
    monkeypatch.setattr(limits, "MAX_IMAGE_PIXELS", 10**9)
    monkeypatch.setattr(limits, "MAX_FILE_BYTES", len(image) - 1)
    with pytest.raises(LoadError, match="over the limit of .* bytes.*MAX_FILE_BYTES"):
        list(DataLoader(mapobs(chain, files([path])), 1, parallel=parallel))


def test_a_huge_file_that_is_no_image_is_refused_without_reading_it(tmp_path):
    from fastload import files

    big = tmp_path / "zeros.jpg"
    with open(big, "wb") as f:
        f.truncate(250 << 20)  # sparse: 250 MB of zeros, no image header
    # In a child, so that its peak memory is its own: reading the file would add 250 MB.
    code = (
        "import resource, sys\n"
        "import numpy as np\n"
        "from fastload import DataLoader, LoadError, files, mapobs\n"
        "from fastload.transforms import CenterCrop, Compose, DecodeImage\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "loader = DataLoader(mapobs(Compose([DecodeImage(), CenterCrop(8)]),\n"
        "                           files([sys.argv[1]])), 1, parallel=2)\n"
        "try:\n"
        "    list(loader)\n"
        "except LoadError as error:\n"
        "    print(error)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", code, str(big)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert child.returncode == 0, child.stderr[-3000:]
    out = child.stdout.splitlines()
    assert "not an image file fastload reads" in out[0] and str(big) in out[0]
    assert int(out[-1]) < 100, f"peak memory grew by {out[-1]} MB"
    chain = Compose([DecodeImage(), CenterCrop(8)])
    huge = tmp_path / "huge.jpg"
    with open(huge, "wb") as f:
        f.write(_forged_jpeg(64, 64))
        f.truncate(2 << 30)  # sparse 2 GB behind a JPEG header
    with deadline(10), pytest.raises(LoadError, match="MAX_FILE_BYTES"):
        list(DataLoader(mapobs(chain, files([huge])), 1, parallel=2))
