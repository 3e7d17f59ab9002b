"""Packed storage: conversion speed, and training pipelines read from packed files.

On 2 cores (the process is pinned to two CPUs when it may use more), side by side in one
run (medians of interleaved repeats, `common.compare`):
1. `convert(src, dst, mode="jpeg")` of the synthetic ImageFolder (`images.py`) to a packed
   file: the JPEGs are stored as their bytes, never re-encoded (target >= 500 rows/s);
   `mode="qoi"` (decode + lossless encode) on a subset, for information.
2. RandomResizedCrop(224) + flip, uint8, batch 256, shuffled, `parallel=True,
   buffer=True`, from the packed file (`ds["image"].encoded`) vs from the individual
   files (`ImageFolder(root).images`): once warm (each loader runs one epoch before
   timing, so the page cache holds both; reading then costs next to nothing), and once
   cold (the files' pages dropped with posix_fadvise before each epoch), where the target
   packed >= 1.1x files applies. Per-image costs on one thread (read, decode + crop) show
   where the time goes.
3. A CIFAR-like 50,000 x 32x32x3 uint8 dataset (+ int64 labels) written with `Raw()` and
   opened with `fastload.open` (the column is an array view of the file): RandomCrop(32,
   padding=4) + flip through `mapobs` in fastload's DataLoader vs PyTorch's DataLoader
   (2 workers, a map-style Dataset doing the same crop and flip in numpy per item) over
   the same arrays (target fastload >= 10x PyTorch).
4. The cost of checksum verification at the first read (`open`'s default, verify="read")
   against the explicit opt-out (verify=None): one epoch of a freshly opened file, the
   CIFAR-like file of 3. read natively (the cheapest loader: the worst case for the
   relative cost) and the JPEG file of 1. through the RandomResizedCrop pipeline of 2.;
   in RAM (page cache warm) and cold (the page cache dropped before each run with
   `echo 3 > /proc/sys/vm/drop_caches`, which needs root; without it the files' pages are
   dropped with posix_fadvise, which the output says).

Usage: python bench/storage.py [--n 4000] [--repeats 3] [--root DIR] [--out DIR]
[--raw-rows 50000] [--parts 1234]
(--root: an existing ImageFolder of JPEGs, used as it is; default: `images.generate`
with --n images under bench/.cache/images. --out: where packed files go. --raw-rows: rows
of the CIFAR-like file. --parts: which of the parts above to run; 4 needs the files of 1
and 3, and writes them when they are not there.)
"""

import argparse
import os
import random
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import compare, peak_rss_mb
from images import DEFAULT_ROOT, generate

import fastload
from fastload.imagefolder import ImageFolder
from fastload.storage import Raw
from fastload.storage.convert import convert
from fastload.transforms import (
    Compose,
    DecodeImage,
    RandomCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
)

CORES = 2
BATCH = 256
SIZE = 224
QOI_ROWS = 800
RAW_ROWS, RAW_SIDE, PAD = 50_000, 32, 4
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache")


def pin_cores(k):
    """Restricts this process (and the threads and children it starts) to k of its CPUs;
    returns how many it may use."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > k:
        os.sched_setaffinity(0, cpus[:k])
    return len(os.sched_getaffinity(0))


def verdict(name, value, target, unit):
    ok = "met" if value >= target else "MISSED"
    print(f"  => {name}: {value:,.2f} {unit} (target >= {target:,} {unit}): {ok}")


def epoch(loader):
    def run():
        for _ in loader:
            pass

    return run


# 1. Conversion


def subset_folder(root, dst, rows):
    """``dst/<class>/`` holding symlinks to ``rows`` images of ``root`` spread evenly over
    it (so every class appears); returns ``dst``."""
    paths = ImageFolder(root).images.paths
    shutil.rmtree(dst, ignore_errors=True)
    for path in paths[:: max(1, len(paths) // rows)][:rows]:
        folder = os.path.join(dst, os.path.basename(os.path.dirname(path)))
        os.makedirs(folder, exist_ok=True)
        os.symlink(os.path.abspath(path), os.path.join(folder, os.path.basename(path)))
    return dst


def bench_convert(root, out, repeats):
    """Prints conversion rows/s; returns the path of the packed JPEG file."""
    n = len(ImageFolder(root))
    jpeg_dst = os.path.join(out, "storage_jpeg.arrow")
    qoi_dst = os.path.join(out, "storage_qoi.arrow")
    subset = subset_folder(root, os.path.join(out, "storage_qoi_src"), QOI_ROWS)
    rows = len(ImageFolder(subset))
    jpeg, qoi = f"convert jpeg ({n:,} rows)", f"convert qoi ({rows:,} rows, info)"
    candidates = {
        jpeg: (lambda: convert(root, jpeg_dst, mode="jpeg", progress=False), n),
        qoi: (lambda: convert(subset, qoi_dst, mode="qoi", progress=False), rows),
    }
    print(
        "1. convert to a packed file (items = rows; source files warm: one run of each "
        "before timing)"
    )
    for run, _ in candidates.values():
        run()
    medians = compare(candidates, repeats, jpeg)
    print(
        f"  file sizes: jpeg {os.path.getsize(jpeg_dst) / 2**20:,.0f} MiB for {n:,} rows, "
        f"qoi {os.path.getsize(qoi_dst) / 2**20:,.0f} MiB for {rows:,} rows"
    )
    os.remove(qoi_dst)
    verdict("jpeg conversion (no re-encode)", medians[jpeg], 500, "rows/s")
    return jpeg_dst


# 2. RandomResizedCrop pipeline: packed file vs individual files


def rrc():
    return Compose([DecodeImage(), RandomResizedCrop(SIZE), RandomHorizontalFlip()])


def rrc_loader(images, labels):
    return fastload.DataLoader(
        (fastload.mapobs(rrc(), images), labels), BATCH, shuffle=True, parallel=True, buffer=True
    )


def per_image_ms(f, count):
    start = time.perf_counter()
    for i in range(count):
        f(i)
    return 1e3 * (time.perf_counter() - start) / count


def components(folder, encoded, cores, count=400):
    """Per-image costs on one thread, in ms: where the time of the RRC pipeline goes."""
    count = min(count, len(encoded))
    pipeline = rrc()
    blobs = [bytes(encoded[i]) for i in range(count)]
    read_file = per_image_ms(lambda i: folder.images[i], count)
    read_packed = per_image_ms(lambda i: bytes(encoded[i]), count)
    work = per_image_ms(lambda i: pipeline(blobs[i], index=i), count)
    print(
        f"  per image on one thread ({count} images, warm): file open+read {read_file:.3f} ms,"
        f" packed item {read_packed:.3f} ms, decode+crop+resize+flip {work:.3f} ms"
    )
    bound = (read_file + work) / (read_packed + work)
    print(
        f"  reading is {100 * read_file / (read_file + work):.1f}% of a file-based item: "
        f"with a warm page cache packed/files can reach about {bound:.2f}x; {cores} threads "
        f"at these costs give at most {cores * 1e3 / (read_packed + work):,.0f} images/s"
    )


def bench_pipeline(root, packed, repeats, cores):
    """Prints images/s of the RRC pipeline from the packed file and from the files."""
    ds = fastload.open(packed)
    folder = ImageFolder(root)
    packed_name, files_name = "packed file (ds['image'].encoded)", "individual files"
    loaders = {
        packed_name: rrc_loader(ds["image"].encoded, ds["label"]),
        files_name: rrc_loader(folder.images, folder.labels),
    }
    print(
        f"2. RandomResizedCrop({SIZE}) + flip, uint8, batch {BATCH}, shuffled, parallel, "
        f"buffered; {len(folder):,} JPEGs; both read warm (one epoch each before timing, "
        f"so the page cache holds both)"
    )
    for loader in loaders.values():
        epoch(loader)()
    medians = compare({k: (epoch(v), len(folder)) for k, v in loaders.items()}, repeats, files_name)
    components(folder, ds["image"].encoded, cores)
    print(
        f"  warm: packed / individual files {medians[packed_name] / medians[files_name]:.2f} x "
        f"(reading costs next to nothing when the page cache holds both)"
    )
    del loaders, ds
    print(
        "   cold page cache (the files' pages dropped with posix_fadvise before each epoch; "
        "the packed file reopened):"
    )
    paths = list(folder.images.paths)

    def cold(make, evicted):
        def run():
            _evict(evicted)
            for _ in make():
                pass

        return run

    cold_medians = compare(
        {
            packed_name: (cold(lambda: _packed_loader(packed), [packed]), len(folder)),
            files_name: (
                cold(lambda: rrc_loader(folder.images, folder.labels), paths),
                len(folder),
            ),
        },
        repeats,
        files_name,
    )
    verdict(
        "cold: packed / individual files",
        cold_medians[packed_name] / cold_medians[files_name],
        1.1,
        "x",
    )


def _packed_loader(path):
    ds = fastload.open(path)
    return rrc_loader(ds["image"].encoded, ds["label"])


def _evict(paths):
    """Drop the page-cache pages of ``paths`` (clean pages of files nobody maps)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# 3. Small raw images: fastload vs PyTorch's DataLoader


class PaddedCropFlip:
    """The map-style Dataset a PyTorch user writes: zero-pad by PAD, a random RAW_SIDE crop
    and a random horizontal flip, per item in numpy (workers seed ``random``)."""

    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        img = np.pad(self.images[i], ((PAD, PAD), (PAD, PAD), (0, 0)))
        top, left = random.randint(0, 2 * PAD), random.randint(0, 2 * PAD)
        img = img[top : top + RAW_SIDE, left : left + RAW_SIDE]
        if random.random() < 0.5:
            img = img[:, ::-1]
        return np.ascontiguousarray(img), self.labels[i]


def write_raw(path, rows):
    """Writes the CIFAR-like dataset of ``rows`` rows to ``path``; returns rows/s of the
    write."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (rows, RAW_SIDE, RAW_SIDE, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, rows).astype(np.int64)
    start = time.perf_counter()
    fastload.write(
        path, {"image": images, "label": labels}, {"image": Raw(), "label": "int64"}, progress=False
    )
    return rows / (time.perf_counter() - start)


def torch_loader(images, labels, workers):
    import torch.utils.data as tud

    return tud.DataLoader(
        PaddedCropFlip(images, labels),
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        persistent_workers=True,
    )


def bench_raw(out, rows, repeats, cores):
    """Prints images/s of padded crop + flip on small raw images, fastload vs PyTorch."""
    path = os.path.join(out, "storage_cifar.arrow")
    write_rate = write_raw(path, rows)
    ds = fastload.open(path)
    images, labels = ds["image"], ds["label"]
    augment = Compose([RandomCrop(RAW_SIDE, padding=PAD), RandomHorizontalFlip()])
    fast_name, torch_name = "fastload DataLoader", f"torch DataLoader ({cores} workers)"
    loaders = {
        fast_name: fastload.DataLoader(
            (fastload.mapobs(augment, images), labels),
            BATCH,
            shuffle=True,
            parallel=True,
            buffer=True,
        ),
        torch_name: torch_loader(images, labels, cores),
    }
    print(
        f"3. {rows:,} x {RAW_SIDE}x{RAW_SIDE}x3 uint8 + int64 labels, Raw() packed file "
        f"(written at {write_rate:,.0f} rows/s; image column: {type(images).__name__} "
        f"{images.shape}); RandomCrop({RAW_SIDE}, padding={PAD}) + flip, batch {BATCH}, "
        f"shuffled; both warm (one epoch each before timing)"
    )
    for loader in loaders.values():
        epoch(loader)()
    medians = compare({k: (epoch(v), rows) for k, v in loaders.items()}, repeats, torch_name)
    verdict("fastload / torch DataLoader", medians[fast_name] / medians[torch_name], 10, "x")


# 4. Verification at the first read vs none


def drop_page_cache(paths):
    """Drop the page cache (all of it, as root), else the pages of ``paths``; returns how."""
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        _evict(paths)
        return "posix_fadvise"


def verified_epoch(path, verify, loader_of, cold):
    """One run: (the page cache dropped when ``cold``) open ``path`` with ``verify`` and
    load one epoch of ``loader_of(ds)``."""
    how = []

    def run():
        if cold:
            how.append(drop_page_cache([path]))
        for _ in loader_of(fastload.open(path, verify=verify)):
            pass

    return run, how


def raw_epoch_loader(ds):
    return fastload.DataLoader(
        (ds["image"], ds["label"]), BATCH, shuffle=True, parallel=True, buffer=True
    )


def jpeg_epoch_loader(ds):
    return rrc_loader(ds["image"].encoded, ds["label"])


def bench_verify(files, repeats):
    """Prints items/s of one epoch of a freshly opened file, verify="read" vs None."""
    print(
        '4. checksums verified at the first read (verify="read", the default) vs the '
        "opt-out (verify=None): one epoch of a freshly opened file, shuffled, parallel, "
        "buffered"
    )
    for name, path, loader_of in files:
        rows = len(fastload.open(path, verify=None))
        size = os.path.getsize(path) / 2**20
        for cold in (False, True):
            where = "cold" if cold else "in RAM"
            checked, unchecked = (
                f'verify="read" ({name}, {where})',
                f"verify=None ({name}, {where})",
            )
            runs = {
                checked: verified_epoch(path, "read", loader_of, cold),
                unchecked: verified_epoch(path, None, loader_of, cold),
            }
            if not cold:
                for run, _ in runs.values():
                    run()  # the page cache holds the file
            print(f"  {name}: {rows:,} rows, {size:,.0f} MiB, {where}")
            medians = compare({k: (run, rows) for k, (run, _) in runs.items()}, repeats, unchecked)
            cost = 100 * (medians[unchecked] / medians[checked] - 1)
            dropped = {how for _, hows in runs.values() for how in hows}
            note = ""
            if cold and dropped != {"drop_caches"}:
                note = (
                    " (the page cache could not be dropped: not root, or /proc/sys is "
                    "read-only; the file's pages were dropped with posix_fadvise)"
                )
            print(f"  => verification adds {cost:+.1f}% to the epoch's time{note}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4000, help="images to generate")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--root",
        default=None,
        help=f"an existing ImageFolder (default: generate --n images in {DEFAULT_ROOT})",
    )
    parser.add_argument("--out", default=DEFAULT_OUT, help="where packed files go")
    parser.add_argument("--raw-rows", type=int, default=RAW_ROWS, help="rows of the raw file")
    parser.add_argument("--parts", default="1234", help="which parts to run (1 to 4)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    cores = pin_cores(CORES)
    root = args.root or generate(DEFAULT_ROOT, args.n)
    os.makedirs(args.out, exist_ok=True)
    print(
        f"{cores} cores (CPUs {sorted(os.sched_getaffinity(0))}), fastload pool of "
        f"{fastload._core.pool_size()} threads, {args.repeats} repeats, medians; "
        f"images in {root}, packed files in {args.out}"
    )
    packed = os.path.join(args.out, "storage_jpeg.arrow")
    raw = os.path.join(args.out, "storage_cifar.arrow")
    if "1" in args.parts:
        packed = bench_convert(root, args.out, args.repeats)
    if "2" in args.parts:
        bench_pipeline(root, packed, args.repeats, cores)
    if "3" in args.parts:
        bench_raw(args.out, args.raw_rows, args.repeats, cores)
    if "4" in args.parts:
        if not os.path.exists(packed):
            convert(root, packed, mode="jpeg", progress=False)
        if not os.path.exists(raw):
            write_raw(raw, args.raw_rows)
        files = [("raw", raw, raw_epoch_loader), ("jpeg + RRC", packed, jpeg_epoch_loader)]
        bench_verify(files, args.repeats)
    print(f"peak RSS of this process and its waited-for children: {peak_rss_mb():,.0f} MB")


if __name__ == "__main__":
    main()
