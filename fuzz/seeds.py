"""Writes the seed corpus of every fuzz target: a few tiny valid inputs each, generated
from a fixed seed (about 25 KB in all).

    python fuzz/seeds.py OUT     # OUT/<target>/<name> for each target of fuzz/
"""

import io
import os
import sys

import numpy as np
import simplejpeg
from PIL import Image

from fastload import _core, write
from fastload.storage import JPEG, QOI, Bytes, Raw, Str


def _images(rng):
    """Small images that exercise different codings: flat (runs), smooth (small
    differences), noise (literal pixels), and odd sizes."""
    ramp = np.add.outer(np.arange(9), np.arange(13)).astype(np.uint8)
    return {
        "flat": np.full((8, 8, 3), 200, np.uint8),
        "smooth": np.stack([ramp * 3, ramp * 5, ramp * 7], axis=-1).astype(np.uint8),
        "noise": rng.integers(0, 256, (7, 11, 3), dtype=np.uint8),
        "rgba": rng.integers(0, 256, (5, 6, 4), dtype=np.uint8),
        "wide": rng.integers(0, 256, (2, 40, 3), dtype=np.uint8),
    }


def _pil_jpeg(image, **options):
    out = io.BytesIO()
    Image.fromarray(image).save(out, "JPEG", quality=80, **options)
    return out.getvalue()


def _jpegs(rng):
    """Baseline 4:2:0, 4:4:4 and gray, progressive, with restart markers every 2 MCUs,
    every MCU and every MCU row (intervals that divide the row: a crop decodes through
    the intervals under it alone)."""
    image = rng.integers(0, 256, (21, 30, 3), dtype=np.uint8)
    gray = image[:, :, :1]
    return {
        "baseline420": simplejpeg.encode_jpeg(image, quality=70, colorsubsampling="420"),
        "baseline444": simplejpeg.encode_jpeg(image, quality=70, colorsubsampling="444"),
        "gray": simplejpeg.encode_jpeg(np.ascontiguousarray(gray), quality=70, colorspace="GRAY"),
        "progressive": _pil_jpeg(image, progressive=True),
        "restarts": _pil_jpeg(image, restart_marker_blocks=2),
        "restart_each_mcu": _pil_jpeg(image, restart_marker_blocks=1),
        "restart_each_row": _pil_jpeg(image, restart_marker_rows=1),
    }


def write_packed(path):
    """A packed file of 6 rows with one field of each encoding, in 3 blocks: the
    reference file that the packed target damages."""
    rng = np.random.default_rng(3)
    rows = [
        {
            "jpeg": rng.integers(0, 256, (8, 10, 3), dtype=np.uint8),
            "qoi": rng.integers(0, 256, (6, 5, 3), dtype=np.uint8),
            "raw": rng.standard_normal((2, 3)).astype(np.float32),
            "blob": bytes(rng.integers(0, 256, k + 1, dtype=np.uint8)),
            "text": f"row {k}",
            "label": k,
        }
        for k in range(6)
    ]
    fields = {
        "jpeg": JPEG(quality=80),
        "qoi": QOI(),
        "raw": Raw(),
        "blob": Bytes(),
        "text": Str(),
        "label": "int64",
    }
    write(path, rows, fields, block_bytes=600, progress=False)


def _save(folder, name, data):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def main(out):
    rng = np.random.default_rng(0)
    for name, image in _images(rng).items():
        _save(os.path.join(out, "qoi_decode"), name, _core.qoi_encode(image))
    for name, jpeg in _jpegs(rng).items():
        _save(os.path.join(out, "jpeg_size"), name, jpeg)
        # The decode target's 6 leading bytes: channels and scale, then the wanted region.
        for k, head in enumerate(
            [b"\x01\x20\x20\xe0\xe0\x00", b"\x05\x50\x30\x90\xc0\x00", b"\x8e\x00\x00\xff\xff\x00"]
        ):
            _save(os.path.join(out, "jpeg_decode"), f"{name}-{k}", head + jpeg)
    for k in range(4):
        _save(
            os.path.join(out, "pipeline"),
            f"random-{k}",
            rng.integers(0, 256, 96, dtype=np.uint8).tobytes(),
        )
    # The packed target's inputs are edits of its reference file, 4 bytes each: none, and
    # one of each kind.
    for name, edits in [
        ("none", b""),
        ("flip", b"\x00\x10\x00\x40"),
        ("set", b"\x01\xf0\x00\x00"),
        ("cut", b"\x02\xc0\x00\x00"),
        ("insert", b"\x07\x80\x00\xff"),
    ]:
        _save(os.path.join(out, "packed"), name, edits)
    # The tar target's inputs: the archive (plain, gz, bz2, xz), then edits as the packed
    # target's, and a fifth kind: a 512-byte block wiped to zeros.
    for archive in range(4):
        for name, edits in [
            ("none", b""),
            ("flip", b"\x00\x60\x00\x10"),
            ("cut", b"\x02\xa0\x00\x00"),
            ("wipe", b"\x04\x34\x00\x00"),
        ]:
            _save(os.path.join(out, "tarstream"), f"{name}-{archive}", bytes([archive]) + edits)


if __name__ == "__main__":
    main(sys.argv[1])
