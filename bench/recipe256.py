"""FFCV's ImageNet write recipe in fastload: JPEG quality 90, longer side at most 256, chroma
4:2:0, and what reading those files costs, with and without restart markers.

1. ``fastload.convert`` of the synthetic ImageFolder of ``images.py`` (2,000 JPEGs, about
   450x400) with ``mode="jpeg", quality=90, max_side=256`` (4:2:0 and a restart marker
   every 32 pixels by default), and again with ``restart_px=None``: stored bytes per
   image, against the same source images area-resized to the same size and encoded by
   Pillow at quality 90 and 4:2:0 (the settings of OpenCV's encoder, which FFCV's
   ``RGBImageField(write_mode='jpg', jpeg_quality=90, max_resolution=256)`` calls).
2. Reading: ``DataLoader((mapobs(Compose([DecodeImage(), RandomResizedCrop(224),
   RandomHorizontalFlip()]), ds["image"].encoded), ds["label"]), 256, shuffle=True,
   parallel=True, buffer=True)``, whole epochs after a first one, in RAM, the two files'
   epochs alternating: images/s (median of the epochs) and the process's CPU time per
   image. The pixels of both files are the same; a crop of the file with markers
   entropy-decodes only the restart intervals under it.

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
    plain_path = os.path.join(out, "recipe256-no-markers.arrow")
    convert(root, path, mode="jpeg", quality=90, max_side=256, progress=False)
    convert(
        root, plain_path, mode="jpeg", quality=90, max_side=256, restart_px=None, progress=False
    )
    ds, plain = fastload.open(path), fastload.open(plain_path)
    stored = ds["image"].encoded
    mean_bytes = float(np.mean([len(stored[i]) for i in range(len(ds))]))
    plain_bytes = float(np.mean([len(plain["image"].encoded[i]) for i in range(len(ds))]))
    rows = np.random.default_rng(0).choice(len(ds), min(200, len(ds)), replace=False)
    same, resized = pillow_bytes(ds, rows, root)
    ours = float(np.mean([len(stored[int(i)]) for i in rows]))
    print(
        f"{len(ds)} images at longer side 256, quality 90, 4:2:0: "
        f"{mean_bytes / 1e3:.1f} KB per image with restart markers (the default), "
        f"{plain_bytes / 1e3:.1f} KB without ({mean_bytes / plain_bytes:.3f}x)"
    )
    print(
        f"  {len(rows)} of them: fastload {ours / 1e3:.2f} KB; Pillow at FFCV's encoder "
        f"settings {same / 1e3:.2f} KB on the same pixels ({ours / same:.3f}x), "
        f"{resized / 1e3:.2f} KB on the source area-resized by PIL ({ours / resized:.3f}x)"
    )
    loaders = {
        name: fastload.DataLoader(
            (fastload.mapobs(Compose(train_ops(False)), d["image"].encoded), d["label"]),
            BATCH,
            shuffle=True,
            parallel=True,
            buffer=True,
        )
        for name, d in (("with markers", ds), ("without", plain))
    }
    for loader in loaders.values():  # threads started, the file in the page cache
        for _ in loader:
            pass
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    cpu: dict[str, list[float]] = {name: [] for name in loaders}
    for _ in range(args.repeats):
        for name, loader in loaders.items():
            wall, proc = time.perf_counter(), time.process_time()
            for _ in loader:
                pass
            rates[name].append(len(ds) / (time.perf_counter() - wall))
            cpu[name].append((time.process_time() - proc) / len(ds))
    for name in loaders:
        print(
            f"  RandomResizedCrop(224) + flip, batch {BATCH}, parallel=True, {name}: "
            f"{statistics.median(rates[name]):,.0f} images/s (median of {args.repeats} epochs), "
            f"{1e3 * statistics.median(cpu[name]):.3f} ms of CPU per image"
        )
    print(
        "  markers against none: "
        f"{statistics.median(rates['with markers']) / statistics.median(rates['without']):.2f}x "
        "the rate, "
        f"{statistics.median(cpu['with markers']) / statistics.median(cpu['without']):.2f}x "
        "the CPU per image"
    )


if __name__ == "__main__":
    main()
