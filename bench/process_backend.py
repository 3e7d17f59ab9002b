"""The JPEG pipeline of `jpeg.py` on worker processes against the native thread pool.

Over the synthetic ImageFolder of `images.py` (600 JPEGs by default), one DataLoader per
backend, alike but for ``backend``:

    DataLoader((mapobs(Compose([DecodeImage(), RandomResizedCrop(224),
               RandomHorizontalFlip()]), folder.images), folder.labels), batch,
               shuffle=True, parallel=workers, buffer=True, seed=0, backend=...)

A worker process loads its part of each step (contiguous rows, one part per worker) by an
inline native run over its shared slot, so both backends run the same fused
decode+crop+resize; what differs is the transport (a message per part, pipes, the
consumer's one thread waiting) against pool threads sharing every batch. The untimed first
epoch forks the workers and warms the page cache, and checks that both backends give the
same first batch. Then whole epochs alternate between the two (medians of ``--repeats``),
and the ratio process / thread is printed.

Usage: python bench/process_backend.py [--n 600] [--workers 2] [--batch 32] [--repeats 5]
[--root DIR] [--jitter]
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import compare
from images import DEFAULT_ROOT, generate
from pipelines import SIZE, train_ops

import fastload
from fastload.imagefolder import ImageFolder
from fastload.transforms import (
    Compose,
)

THREAD = "backend='thread'"
PROCESS = "backend='process'"


def make(root, backend, workers, batch, jitter):
    folder = ImageFolder(root)
    return fastload.DataLoader(
        (fastload.mapobs(Compose(train_ops(jitter)), folder.images), folder.labels),
        batch,
        shuffle=True,
        parallel=workers,
        buffer=True,
        seed=0,
        backend=backend,
    )


def epoch(loader):
    def run():
        for _ in loader:
            pass

    return run


def first_batch(loader):
    """The first batch of an epoch, copied; the rest of the epoch is loaded untimed."""
    batches = iter(loader)
    first = tuple(np.copy(x) for x in next(batches))
    for _ in batches:
        pass
    return first


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=600)
    parser.add_argument("--workers", type=int, default=2, help="threads, or worker processes")
    parser.add_argument("--batch", type=int, default=32, help="observations per step")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--root", default=None, help=f"dataset folder (default {DEFAULT_ROOT}-{{n}})"
    )
    parser.add_argument(
        "--jitter", action="store_true", help="add ColorJitter(0.4, 0.4, 0.4) + Normalize + ToCHW"
    )
    args = parser.parse_args()
    # A folder of its own: generate() removes the images a smaller dataset does not hold.
    root = generate(args.root or f"{DEFAULT_ROOT}-{args.n}", args.n)
    n = len(ImageFolder(root))
    print(
        f"{n:,} JPEGs in {root}, batch {args.batch} at {SIZE}x{SIZE}, "
        f"{'with' if args.jitter else 'without'} jitter, {args.workers} workers; "
        f"{os.cpu_count()} CPUs; JPEG decoder: {fastload._images.codecs.decoder_name()}"
    )
    loaders = {
        name: make(root, backend, args.workers, args.batch, args.jitter)
        for name, backend in ((THREAD, "thread"), (PROCESS, "process"))
    }
    firsts = {name: first_batch(loader) for name, loader in loaders.items()}
    for got, want in zip(firsts[PROCESS], firsts[THREAD]):
        if not np.array_equal(got, want):
            raise SystemExit("the two backends gave different first batches")
    candidates = {name: (epoch(loader), n) for name, loader in loaders.items()}
    medians = compare(candidates, args.repeats, THREAD, unit="images/s")
    print(f"  process / thread: {medians[PROCESS] / medians[THREAD]:.2f}x (target >= 0.95x)")
    for loader in loaders.values():
        loader.close()


if __name__ == "__main__":
    main()
