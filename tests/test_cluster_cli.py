"""``python -m fastload convert SRC DST --engine ray|dask|spark`` packs a folder of class
folders on a local cluster of each engine into a dataset in parts whose every column is
the single file's that ``convert`` writes, byte for byte, with the same metadata."""

import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
import simplejpeg

import fastload
from fastload.storage.convert import convert

pytestmark = pytest.mark.cluster
ENGINES = {"dask": "distributed", "ray": "ray", "spark": "pyspark"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for name in ("cat", "dog", "eel"):
        os.makedirs(root / name)
        for k in range(15):
            pixels = rng.integers(0, 256, (int(rng.integers(40, 90)), 70, 3), dtype=np.uint8)
            (root / name / f"{k}.jpg").write_bytes(simplejpeg.encode_jpeg(pixels))
    return root


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_convert_on_an_engine_writes_the_file_convert_writes(engine, folder, tmp_path):
    pytest.importorskip(ENGINES[engine])
    dst = tmp_path / "parts"
    command = [sys.executable, "-m", "fastload", "convert", str(folder), str(dst)]
    command += ["--engine", engine, "--max-side", "32", "--partitions", "3", "--no-progress"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"wrote 45 images to {dst} in 3 parts" in result.stdout
    convert(str(folder), str(tmp_path / "one.arrow"), max_side=32, progress=False)
    parts, one = fastload.open(dst), fastload.open(tmp_path / "one.arrow")
    assert parts.metadata == one.metadata and parts.source_field == one.source_field == "path"
    got = pa.concat_tables([pa.ipc.open_file(f).read_all() for f in parts.files])
    expected = pa.ipc.open_file(str(tmp_path / "one.arrow")).read_all()
    assert got.column_names == expected.column_names
    for name in expected.column_names:
        assert got.column(name).to_pylist() == expected.column(name).to_pylist(), name


def test_convert_on_an_engine_keeps_the_files_as_given_when_told(folder, tmp_path):
    pytest.importorskip("distributed")
    dst = tmp_path / "parts"
    command = [sys.executable, "-m", "fastload", "convert", str(folder), str(dst)]
    command += ["--engine", "dask", "--keep-given", "--partitions", "2", "--no-progress"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    parts = fastload.open(dst)
    for k in (0, 17, 44):
        path = parts["path"][k]
        given = (folder / path).read_bytes()
        assert bytes(parts["image"].encoded[k]) == given, path  # byte for byte
