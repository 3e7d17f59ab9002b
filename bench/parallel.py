"""``parallel=True`` against ``parallel=False`` on each workload of the benchmarks: the same
``fastload.DataLoader(..., shuffle=True, buffer=True, seed=0)`` with and without the
pool, side by side in one run (medians of interleaved runs, ``common.compare``), and the
ratio parallel / sequential per workload:

- arrays: 1,000,000 x 64 float32 + int64 labels, batch 512 (``tensor.py``);
- batch of one: 200,000 x 64 float32 + int64 labels, batch_size=1, the first 50,000
  batches of an epoch (``overhead.py``);
- cifar: 50,000 32x32x3 uint8 images + labels, RandomCrop(32, padding=4) + flip, batch
  512 (``cifar.py``);
- JPEG: the ``images.py`` folder, DecodeImage + RandomResizedCrop(224) + flip, batch 256
  (``jpeg.py``);
- tables: a pandas DataFrame of 1,000,000 rows (16 float32 columns, an int64 label),
  batch 512, when pandas is installed.

The loader draws each epoch's permutation on both sides. Each candidate is timed over
whole epochs (the batch of one over its first 50,000 steps) from a fresh iterator.

``--batch n`` gives every workload the batch size n (the batch of one keeps its first
50,000 steps), to see smaller or larger steps of the same data.

Usage: python bench/parallel.py [--repeats 5] [--only arrays,jpeg] [--jpegs 1000] [--batch N]
"""

import argparse
import itertools
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import compare
from images import DEFAULT_ROOT, generate
from pipelines import train_ops

import fastload
from fastload.imagefolder import ImageFolder
from fastload.transforms import Compose, RandomCrop, RandomHorizontalFlip

PARALLEL, SEQUENTIAL = "parallel=True", "parallel=False"


def arrays(args):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1_000_000, 64), dtype=np.float32)
    return (x, rng.integers(0, 1000, len(x))), 512, None


def batch_of_one(args):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200_000, 64), dtype=np.float32)
    return (x, rng.integers(0, 1000, len(x))), 1, 50_000


def cifar(args):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (50_000, 32, 32, 3), dtype=np.uint8)
    augment = Compose([RandomCrop(32, padding=4), RandomHorizontalFlip()])
    return (fastload.mapobs(augment, images), rng.integers(0, 10, len(images))), 512, None


def jpeg(args):
    root = f"{DEFAULT_ROOT}-{args.jpegs}"
    generate(root, args.jpegs)
    folder = ImageFolder(root)
    return (fastload.mapobs(Compose(train_ops(False)), folder.images), folder.labels), 256, None


def tables(args):
    import pandas as pd

    rng = np.random.default_rng(0)
    columns = {f"f{k}": rng.standard_normal(1_000_000, dtype=np.float32) for k in range(16)}
    columns["label"] = rng.integers(0, 1000, 1_000_000)
    return pd.DataFrame(columns), 512, None


WORKLOADS = {
    "arrays": arrays,
    "batch of one": batch_of_one,
    "cifar": cifar,
    "jpeg": jpeg,
    "tables": tables,
}


def epoch(loader, steps):
    def run():
        for _ in itertools.islice(loader, steps):
            pass

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default=",".join(WORKLOADS), help="comma-separated workloads")
    parser.add_argument("--jpegs", type=int, default=1000, help="images of the JPEG workload")
    parser.add_argument("--batch", type=int, default=None, help="every workload's batch size")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, pool of {fastload._core.pool_size()} threads")
    ratios = {}
    for name in args.only.split(","):
        try:
            data, batch, steps = WORKLOADS[name](args)
            batch = args.batch or batch
        except ImportError as exc:
            print(f"{name}: skipped ({exc})")
            continue
        loaders = {
            label: fastload.DataLoader(
                data, batch, shuffle=True, buffer=True, seed=0, parallel=parallel
            )
            for label, parallel in ((PARALLEL, True), (SEQUENTIAL, False))
        }
        n = fastload.numobs(data)
        items = min(n, steps * batch) if steps else n
        print(f"{name}: batch {batch}, {items:,} observations per run")
        for loader in loaders.values():  # a first epoch: threads started, files cached
            epoch(loader, steps)()
        candidates = {label: (epoch(loader, steps), items) for label, loader in loaders.items()}
        medians = compare(candidates, args.repeats, SEQUENTIAL)
        ratios[name] = medians[PARALLEL] / medians[SEQUENTIAL]
    print("parallel / sequential: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))


if __name__ == "__main__":
    main()
