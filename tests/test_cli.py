"""The command line: ``python -m fastload convert``, ``info``, ``bench`` and ``demo``."""

import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import fastload._images.codecs
from fastload.__main__ import main
from fastload.demo import run_image_demo, run_tensor_demo
from fastload.storage import open as open_dataset
from fastload.storage.convert import convert

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def image_folder(tmp_path):
    """Two classes, JPEG and PNG files of different sizes."""
    rng = np.random.default_rng(0)
    src = tmp_path / "images"
    pixels = {}
    for label, name in enumerate(["cat", "dog"]):
        (src / name).mkdir(parents=True)
        for k in range(3):
            img = rng.integers(0, 256, (20 + 9 * k, 30, 3), dtype=np.uint8)
            path = src / name / f"{k}.{'png' if k == 1 else 'jpg'}"
            Image.fromarray(img).save(path)
            pixels[(label, k)] = np.asarray(Image.open(path).convert("RGB"))
    return src, pixels


@pytest.mark.parametrize("mode", ["jpeg", "raw", "qoi", "smart"])
def test_convert_then_info(image_folder, tmp_path, capsys, mode):
    src, pixels = image_folder
    dst = tmp_path / "out.arrow"
    assert main(["convert", str(src), str(dst), "--mode", mode, "--no-progress"]) == 0
    ds = open_dataset(dst)
    assert len(ds) == 6 and list(ds["label"]) == [0, 0, 0, 1, 1, 1]
    assert ds.metadata["classes"] == ["cat", "dog"]
    for i in range(6):
        assert ds[i]["image"].shape == pixels[(i // 3, i % 3)].shape
    if mode in ("raw", "qoi"):  # lossless: the decoded files come back exactly
        assert np.array_equal(ds[4]["image"], pixels[(1, 1)])
    assert main(["info", str(dst)]) == 0
    out = capsys.readouterr().out
    assert "rows:   6" in out and "image" in out and "label" in out and "blocks:" in out


def test_convert_max_side_and_quality(image_folder, tmp_path):
    src, _ = image_folder
    dst = tmp_path / "small.arrow"
    assert (
        main(
            ["convert", str(src), str(dst), "--max-side", "16", "--quality", "80", "--no-progress"]
        )
        == 0
    )
    ds = open_dataset(dst)
    assert max(int(h) for h in ds["image"].height) <= 16
    assert ds.fields["image"].quality == 80


def test_missing_source_is_exit_code_2_with_a_message(tmp_path, capsys):
    assert main(["convert", str(tmp_path / "nope"), str(tmp_path / "x.arrow")]) == 2
    assert "nope" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "x.arrow")


def test_missing_output_directory_is_exit_code_2(image_folder, tmp_path, capsys):
    src, _ = image_folder
    assert main(["convert", str(src), str(tmp_path / "no" / "x.arrow")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_info_on_missing_or_corrupt_file_is_exit_code_2(tmp_path, capsys):
    assert main(["info", str(tmp_path / "nope.arrow")]) == 2
    assert "nope.arrow" in capsys.readouterr().err
    (tmp_path / "bad.arrow").write_bytes(b"ARROW1\x00\x00garbage")
    assert main(["info", str(tmp_path / "bad.arrow")]) == 2
    assert "bad.arrow" in capsys.readouterr().err


def test_bad_option_is_a_usage_error(image_folder, tmp_path):
    src, _ = image_folder
    with pytest.raises(SystemExit) as info:
        main(["convert", str(src), str(tmp_path / "x.arrow"), "--mode", "webp"])
    assert info.value.code == 2
    assert main(["convert", str(src), str(tmp_path / "x.arrow"), "--quality", "0"]) == 2


@pytest.mark.parametrize(
    "options, says",
    [
        (
            ["--engine", "dask", "--threads", "2"],
            "--threads does not apply with --engine: --workers",
        ),
        (["--workers", "2"], "--workers apply only with --engine"),
        (["--partitions", "4", "--address", "tcp://127.0.0.1:1"], "--partitions, --address apply"),
        (["--overwrite"], "--overwrite apply only with --engine"),
    ],
)
def test_options_that_the_chosen_path_would_ignore_are_refused(
    image_folder, tmp_path, capsys, options, says
):
    src, _ = image_folder
    dst = tmp_path / "out"
    assert main(["convert", str(src), str(dst), "--no-progress", *options]) == 2
    assert says in capsys.readouterr().err
    assert not os.path.exists(dst)


def test_help_runs_as_a_module():
    out = subprocess.run(
        [sys.executable, "-m", "fastload", "convert", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--mode" in out and "--max-side" in out
    res = subprocess.run(
        [sys.executable, "-m", "fastload"], cwd=ROOT, capture_output=True, text=True
    )
    assert res.returncode == 2 and "convert" in res.stderr and "info" in res.stderr


@pytest.mark.parametrize("mode", ["jpeg", "raw", "qoi", "smart"])
def test_bench_loads_the_training_pipeline_from_a_converted_file(
    image_folder, tmp_path, capsys, mode
):
    src, _ = image_folder
    dst = tmp_path / f"{mode}.arrow"
    assert main(["convert", str(src), str(dst), "--mode", mode, "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["bench", str(dst), "--batches", "3", "--batch-size", "2", "--size", "16"]) == 0
    out = capsys.readouterr().out
    assert "images/s over 3 batches" in out and "RandomResizedCrop(16)" in out


def test_demo_measures_fastload_against_a_plain_loop(capsys):
    tensors = run_tensor_demo(n=3000, batch_size=64)
    images = run_image_demo(n=16, batch_size=8)
    assert len(tensors) == 3 and len(images) == 2
    assert all(rate > 0 for rate in [*tensors.values(), *images.values()])
    assert "items/s" in capsys.readouterr().out


def test_bench_counts_the_images_it_loaded_partial_last_batch_included(image_folder, tmp_path):
    from fastload import open
    from fastload.__main__ import bench_file

    src, _ = image_folder
    dst = tmp_path / "b.arrow"
    assert main(["convert", str(src), str(dst), "--no-progress"]) == 0
    n = len(open(str(dst)))  # 6 images in batches of 4: 4 + 2
    result = bench_file(str(dst), batches=100, batch_size=4, size=16)
    assert (result["batches"], result["images"]) == (2, n)
    assert bench_file(str(dst), batches=1, batch_size=4, size=16)["images"] == 4


def test_convert_names_a_bad_file_and_skips_it_on_request(image_folder, tmp_path, capsys):
    src, _ = image_folder
    (src / "dog" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    dst = tmp_path / "out.arrow"
    assert main(["convert", str(src), str(dst), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "broken.jpg" in err and "BytesIO" not in err
    assert not dst.exists()
    assert main(["convert", str(src), str(dst), "--no-progress", "--on-error", "skip"]) == 0
    out = capsys.readouterr().out
    assert "wrote 6 images" in out and "skipped 1 files" in out and "broken.jpg" in out
    from fastload import open

    ds = open(str(dst))
    assert len(ds) == 6 and sorted(ds["label"].tolist()) == [0, 0, 0, 1, 1, 1]


def test_version_prints_the_package_version_as_a_module():
    out = subprocess.run(
        [sys.executable, "-m", "fastload", "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert out == f"fastload {fastload.__version__}\n"
    assert fastload.__version__ == "0.3.0"


def test_info_without_a_path_says_what_this_build_decodes_with(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"jpeg_decoder: {fastload._images.codecs.decoder_name()}" in out
    assert "other_formats: Pillow" in out


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # a whole header, half the scan


@pytest.mark.parametrize("mode", ["jpeg", "smart"])
def test_convert_decodes_jpeg_files_it_stores_as_they_are_and_names_a_truncated_one(
    image_folder, tmp_path, capsys, mode
):
    src, _ = image_folder
    big = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(big).save(src / "dog" / "cut.jpg", quality=95)
    _truncate(src / "dog" / "cut.jpg")
    dst = tmp_path / "out.arrow"
    args = ["convert", str(src), str(dst), "--no-progress", "--mode", mode]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "cut.jpg" in err and "corrupt or truncated JPEG" in err
    assert not dst.exists()
    assert main(args + ["--on-error", "skip"]) == 0
    assert "skipped 1 files" in capsys.readouterr().out
    ds = open_dataset(str(dst))
    assert len(ds) == 6 and "dog/cut.jpg" not in ds["path"][:]
    for k in range(6):  # every row written decodes
        assert ds["image"][k].shape[2] == 3


def test_a_row_that_fails_to_load_names_its_packed_file_row_and_source_file(image_folder, tmp_path):
    from fastload import DataLoader, LoadError, mapobs
    from fastload.transforms import CenterCrop, Compose, DecodeImage

    src, _ = image_folder
    big = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(big).save(src / "dog" / "cut.jpg", quality=95)
    _truncate(src / "dog" / "cut.jpg")
    dst = tmp_path / "unchecked.arrow"
    assert main(["convert", str(src), str(dst), "--no-progress", "--no-check"]) == 0
    ds = open_dataset(str(dst))
    row = ds["path"][:].index(os.path.join("dog", "cut.jpg"))
    where = f"{dst}, row {row} (from {os.path.join('dog', 'cut.jpg')})"
    with pytest.raises(LoadError) as info:
        ds["image"][row]
    assert where in str(info.value) and info.value.index == row
    native = mapobs(Compose([DecodeImage(), CenterCrop(16)]), ds["image"].encoded)
    for data, collate in ((native, True), (ds["image"], False)):  # the column's vary in size
        with pytest.raises(LoadError) as info:
            list(DataLoader(data, 4, parallel=2, collate=collate))
        assert where in str(info.value) and info.value.source == where
        assert "corrupt or truncated JPEG" in str(info.value)


def test_convert_takes_parallel_and_warns_for_num_threads(image_folder, tmp_path):
    src, _ = image_folder
    convert(src, tmp_path / "new.arrow", parallel=2, progress=False)
    with pytest.warns(DeprecationWarning, match="num_threads=2 is deprecated: write parallel=2"):
        convert(src, tmp_path / "old.arrow", num_threads=2, progress=False)
    new, old = open_dataset(tmp_path / "new.arrow"), open_dataset(tmp_path / "old.arrow")
    assert [r["label"] for r in old] == [r["label"] for r in new]
    assert all(np.array_equal(a["image"], b["image"]) for a, b in zip(old, new))


def test_convert_takes_parallel_and_the_old_threads_still_works_saying_so_on_stderr(
    image_folder, tmp_path, capsys
):
    src, _ = image_folder
    new, old = tmp_path / "new.arrow", tmp_path / "old.arrow"
    assert main(["convert", str(src), str(new), "--parallel", "2", "--no-progress"]) == 0
    assert "deprecated" not in capsys.readouterr().err
    assert main(["convert", str(src), str(old), "--threads", "2", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "DeprecationWarning: --threads 2 is deprecated: write --parallel 2" in err
    new_rows, old_rows = open_dataset(new), open_dataset(old)
    assert len(new_rows) == len(old_rows) == 6
    assert all(np.array_equal(a["image"], b["image"]) for a, b in zip(old_rows, new_rows))


def test_convert_refuses_parallel_and_threads_together(image_folder, tmp_path, capsys):
    src, _ = image_folder
    argv = ["convert", str(src), str(tmp_path / "x.arrow"), "--parallel", "2", "--threads", "2"]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert not (tmp_path / "x.arrow").exists()
