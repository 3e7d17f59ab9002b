"""The framing of a packed file is checked before it is mapped or read: a file that is
not Arrow IPC (or an IPC file without its end) is refused after a few bytes, whatever its
size and the cache setting."""

import os
import struct
import subprocess
import sys

import pytest

from fastload import LoadError, open, write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Opens argv[2] (a sparse file of zeros) with cache=argv[3]; prints the peak resident
# memory that the attempt added, in MiB, and the error.
CHILD = r"""
import resource, sys
sys.path.insert(0, sys.argv[1])
import pyarrow
import fastload
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    fastload.open(sys.argv[2], cache=sys.argv[3])
    error = "none"
except fastload.LoadError as exc:
    error = str(exc)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) // 1024)
print(error)
"""


@pytest.mark.parametrize("cache", ["os", "memory"])
def test_a_large_file_that_is_not_arrow_is_refused_without_reading_it(tmp_path, cache):
    path = tmp_path / "zeros.arrow"
    with path.open("wb") as f:
        f.truncate(2 << 30)  # sparse: 2 GiB of zeros that take no disk
    child = subprocess.run(
        [sys.executable, "-c", CHILD, ROOT, str(path), cache],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    grown_mib, error = child.stdout.splitlines()
    assert "zeros.arrow: not an Arrow IPC file or stream" in error
    assert int(grown_mib) < 64  # the 2 GiB were neither copied nor read


@pytest.fixture()
def packed(tmp_path):
    path = tmp_path / "good.arrow"
    write(path, [{"y": k} for k in range(100)], {"y": "int64"}, progress=False)
    return path.read_bytes()


@pytest.mark.parametrize("cache", ["os", "memory"])
def test_framing_errors_name_the_file_and_what_is_wrong(tmp_path, packed, cache):
    bad = tmp_path / "bad.arrow"
    cases = {
        b"": "bad.arrow: not an Arrow IPC file or stream \\(an empty file\\)",
        b"PK\x03\x04" + bytes(100): "bad.arrow: not an Arrow IPC file or stream .*PK",
        packed[: len(packed) // 2]: "bad.arrow: an Arrow IPC file without its closing magic",
        packed[:-10] + struct.pack("<i", 1 << 30) + b"ARROW1": "footer would take",
        b"\xff\xff\xff\xff" + struct.pack("<i", 1 << 20) + bytes(8): "schema message would",
        struct.pack("<i", 40) + bytes(60): "written before Arrow 0.15",
    }
    for data, message in cases.items():
        bad.write_bytes(data)
        with pytest.raises(LoadError, match=message):
            open(bad, cache=cache)
    bad.write_bytes(packed)
    assert open(bad, cache=cache)["y"].tolist() == list(range(100))
