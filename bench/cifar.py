"""CIFAR-like augmentation: 50,000 32x32x3 uint8 images + int64 labels, RandomCrop(32,
padding=4) + RandomHorizontalFlip, batch 512, shuffled.

Compares, side by side in one run (medians of interleaved repeats, `common.compare`), in
items/s over full epochs:
- fastload: DataLoader((mapobs(Compose([RandomCrop(32, padding=4), RandomHorizontalFlip()]),
  images), labels), 512, shuffle=True, parallel=True, buffer=True)
- a numba @njit(nogil=True) kernel (the reference): per epoch a permutation, per batch
  offsets 0..8 and flip flags drawn with numpy, the padded crop + flip written into a
  preallocated (512, 32, 32, 3) uint8 batch by 2 threads (a ThreadPoolExecutor(2), one
  half of the batch each), and the labels gathered.
Padding is zeros on both sides, as fastload's RandomCrop (csrc/image.c, copy_window) and
torchvision's default (fill 0). Target: fastload >= 1.5x the numba kernel.

Usage: python bench/cifar.py [--n 50000] [--repeats 5]   (needs numba: pip install numba)
"""

import argparse
import concurrent.futures
import os
import sys

import numpy as np
from numba import njit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import compare

import fastload
from fastload.transforms import Compose, RandomCrop, RandomHorizontalFlip

SIDE, PAD, BATCH, THREADS = 32, 4, 512, 2
FASTLOAD = "fastload parallel buffered"
NUMBA = f"numba kernel, {THREADS} threads"


@njit(nogil=True)
def crop_flip(images, idx, oy, ox, flip, out):
    """out[k] = the SIDE x SIDE window at (oy[k], ox[k]) of images[idx[k]] zero-padded by
    PAD, mirrored left-right when flip[k]. As fastload's C (copy_window): zero the output,
    then copy the part inside the source, with no padded copy and no per-pixel bounds test.
    The three channels are copied one by one, unrolled: of the plain variants tried
    (a loop over channels, slice copies) this is the fastest by 2-3x, so the reference is
    not a straw man."""
    h, w = images.shape[1], images.shape[2]
    for k in range(idx.shape[0]):
        src, dst = images[idx[k]], out[k]
        y0, x0 = oy[k] - PAD, ox[k] - PAD
        lo, hi = max(0, -x0), min(SIDE, w - x0)  # output columns that fall inside the source
        dst[:] = 0
        for r in range(max(0, -y0), min(SIDE, h - y0)):
            s, d = src[y0 + r], dst[r]
            if flip[k]:  # two loops rather than a test per pixel: measurably faster
                for col in range(lo, hi):
                    t, f = SIDE - 1 - col, x0 + col
                    d[t, 0], d[t, 1], d[t, 2] = s[f, 0], s[f, 1], s[f, 2]
            else:
                for col in range(lo, hi):
                    f = x0 + col
                    d[col, 0], d[col, 1], d[col, 2] = s[f, 0], s[f, 1], s[f, 2]


def padded_crop(img, oy, ox, flip):
    """The same crop in plain numpy, to check the kernel (and fastload) against."""
    crop = np.pad(img, ((PAD, PAD), (PAD, PAD), (0, 0)))[oy : oy + SIDE, ox : ox + SIDE]
    return crop[:, ::-1] if flip else crop


def numba_epoch(images, labels, rng, pool, out):
    """One epoch of the reference: yields (batch, labels); the batch is reused, like
    fastload's with buffer=True."""
    n = len(images)
    order = rng.permutation(n)
    for start in range(0, n, BATCH):
        idx = order[start : start + BATCH]
        m = len(idx)
        oy = rng.integers(0, 2 * PAD + 1, m)
        ox = rng.integers(0, 2 * PAD + 1, m)
        flip = rng.random(m) < 0.5
        half = (m + 1) // 2
        parts = [
            pool.submit(crop_flip, images, idx[a:b], oy[a:b], ox[a:b], flip[a:b], out[a:b])
            for a, b in ((0, half), (half, m))
        ]
        for part in parts:
            part.result()
        yield out[:m], labels[idx]


def sanity_checks(images, augment):
    """Untimed: the kernel's crops equal numpy's for one image (corners, centre and random
    offsets, both flips), and fastload's output for that image is one of those crops, so
    both sides do the same work."""
    rng = np.random.default_rng(1)
    out = np.empty((1, SIDE, SIDE, 3), np.uint8)
    cases = [(0, 0), (8, 8), (0, 8), (4, 4)] + [tuple(rng.integers(0, 9, 2)) for _ in range(4)]
    for oy, ox in cases:
        for flip in (False, True):
            crop_flip(images, np.array([0]), np.array([oy]), np.array([ox]), np.array([flip]), out)
            assert np.array_equal(out[0], padded_crop(images[0], oy, ox, flip)), (oy, ox, flip)
    got = augment(images[0], index=0, seed=0, epoch=0)
    assert any(
        np.array_equal(got, padded_crop(images[0], oy, ox, flip))
        for oy in range(9)
        for ox in range(9)
        for flip in (False, True)
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    n = args.n
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, SIDE, SIDE, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, n, dtype=np.int64)
    print(
        f"{n:,} x {SIDE}x{SIDE}x3 uint8 + int64 labels, RandomCrop({SIDE}, padding={PAD}) + "
        f"flip, batch {BATCH}, shuffled; {os.cpu_count()} CPUs, "
        f"pool of {fastload._core.pool_size()} threads"
    )

    augment = Compose([RandomCrop(SIDE, padding=PAD), RandomHorizontalFlip()])
    loader = fastload.DataLoader(
        (fastload.mapobs(augment, images), labels),
        BATCH,
        shuffle=True,
        seed=0,
        parallel=True,
        buffer=True,
    )
    pool = concurrent.futures.ThreadPoolExecutor(THREADS)
    out = np.empty((BATCH, SIDE, SIDE, 3), np.uint8)
    sanity_checks(images, augment)  # also compiles the kernel, outside the timing

    def fastload_run():
        for _ in loader:
            pass

    def numba_run():
        for _ in numba_epoch(images, labels, rng, pool, out):
            pass

    fastload_run()  # one untimed epoch each: buffers, threads, first-touch of the pages
    numba_run()
    medians = compare({FASTLOAD: (fastload_run, n), NUMBA: (numba_run, n)}, args.repeats, NUMBA)
    ratio = medians[FASTLOAD] / medians[NUMBA]
    print(
        f"  target fastload >= 1.5x the numba kernel: {ratio:.2f}x: "
        f"{'met' if ratio >= 1.5 else 'missed'}"
    )
    pool.shutdown()


if __name__ == "__main__":
    main()
