"""FFCV's ImageNet write recipe in fastload: JPEG quality 90, longer side at most 256, chroma
4:2:0, and what reading those files costs.

1. ``fastload.convert`` of the synthetic ImageFolder of ``images.py`` (2,000 JPEGs, about
   450x400) with ``mode="jpeg", quality=90, max_side=256`` (4:2:0 by default): stored
   bytes per image, against the same source images area-resized to the same size and
   encoded by Pillow at quality 90 and 4:2:0 (the settings of OpenCV's encoder, which
   FFCV's ``RGBImageField(write_mode='jpg', jpeg_quality=90, max_resolution=256)`` calls).
2. Reading: ``DataLoader((mapobs(Compose([DecodeImage(), RandomResizedCrop(224),
   RandomHorizontalFlip()]), ds["image"].encoded), ds["label"]), 256, shuffle=True,
   parallel=True, buffer=True)``, whole epochs after a first one, in RAM: images/s
   (median of the epochs) and the process's CPU time per image.

Usage: python bench/recipe256.py [--n 2000] [--repeats 5] [--out DIR]
"""

import argparse
import io
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from images import DEFAULT_ROOT, generate
from pipelines import train_ops

import fastload
from fastload.storage.convert import convert
from fastload.transforms import Compose

BATCH = 256


def pillow_bytes(ds, rows, root):
    """Mean bytes of the rows encoded by Pillow at quality 90, 4:2:0 (the settings of
    OpenCV's encoder, which FFCV calls): (the pixels fastload stored, the source image
    area-resized by PIL (BOX, as OpenCV's INTER_AREA) to the stored size)."""
    from PIL import Image

    def encoded(image):
        out = io.BytesIO()
        image.save(out, "JPEG", quality=90, subsampling=2)  # 4:2:0
        return out.tell()

    same, resized = [], []
    for i in rows:
        row = ds[int(i)]
        h, w = row["image"].shape[:2]
        same.append(encoded(Image.fromarray(row["image"])))
        with Image.open(os.path.join(root, row["path"])) as source:
            resized.append(encoded(source.convert("RGB").resize((w, h), Image.BOX)))
    return float(np.mean(same)), float(np.mean(resized))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="where the packed file goes")
    args = parser.parse_args()
    root = f"{DEFAULT_ROOT}-{args.n}"
    generate(root, args.n)
    out = args.out or tempfile.mkdtemp(prefix="recipe256-")
    path = os.path.join(out, "recipe256.arrow")
    convert(root, path, mode="jpeg", quality=90, max_side=256, progress=False)
    ds = fastload.open(path)
    stored = ds["image"].encoded
    mean_bytes = float(np.mean([len(stored[i]) for i in range(len(ds))]))
    rows = np.random.default_rng(0).choice(len(ds), min(200, len(ds)), replace=False)
    same, resized = pillow_bytes(ds, rows, root)
    ours = float(np.mean([len(stored[int(i)]) for i in rows]))
    print(
        f"{len(ds)} images at longer side 256, quality 90, 4:2:0: "
        f"{mean_bytes / 1e3:.1f} KB per image"
    )
    print(
        f"  {len(rows)} of them: fastload {ours / 1e3:.2f} KB; Pillow at FFCV's encoder "
        f"settings {same / 1e3:.2f} KB on the same pixels ({ours / same:.3f}x), "
        f"{resized / 1e3:.2f} KB on the source area-resized by PIL ({ours / resized:.3f}x)"
    )
    loader = fastload.DataLoader(
        (fastload.mapobs(Compose(train_ops(False)), stored), ds["label"]),
        BATCH,
        shuffle=True,
        parallel=True,
        buffer=True,
    )
    for _ in loader:  # threads started, the file in the page cache
        pass
    rates, cpu = [], []
    for _ in range(args.repeats):
        wall, proc = time.perf_counter(), time.process_time()
        for _ in loader:
            pass
        rates.append(len(ds) / (time.perf_counter() - wall))
        cpu.append((time.process_time() - proc) / len(ds))
    print(
        f"  RandomResizedCrop(224) + flip, batch {BATCH}, parallel=True: "
        f"{statistics.median(rates):,.0f} images/s (median of {args.repeats} epochs), "
        f"{1e3 * statistics.median(cpu):.2f} ms of CPU per image"
    )


if __name__ == "__main__":
    main()
