"""A 70/30 mix of two packed JPEG datasets against one packed dataset of the same images:
the mix (``fastload.mix``, decoded natively across the two files) should load as fast as
the single dataset. Each epoch loads every image once either way (the mix's counts are the
datasets' sizes), through one pipeline (RandomResizedCrop(224) and a flip), in a random
order; the medians of interleaved runs and their ratio are printed.

Usage: python bench/mixing.py [--n 2000] [--repeats 5] [--parallel 2]
"""

import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import compare
from images import DEFAULT_ROOT, generate
from pipelines import train_ops

import fastload
from fastload import DataLoader, mapobs, mix
from fastload.storage import JPEG
from fastload.transforms import Compose


def _packed(path, files):
    images = [open(f, "rb").read() for f in files]
    labels = np.arange(len(files), dtype=np.int64)
    fastload.write(
        path, (images, labels), {"image": JPEG(keep_given=True), "label": "int64"}, progress=False
    )
    return fastload.open(path)


def _fields(ds, pipeline):
    return {"image": mapobs(pipeline, ds["image"].encoded), "label": ds["label"]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--parallel", type=int, default=2)
    args = parser.parse_args()
    generate(DEFAULT_ROOT, args.n, 0)
    files = sorted(
        os.path.join(root, name)
        for root, _, names in os.walk(DEFAULT_ROOT)
        for name in names
        if name.endswith(".jpg")
    )[: args.n]
    cut = int(0.7 * len(files))
    pipeline = Compose(train_ops(jitter=False))
    with tempfile.TemporaryDirectory() as folder:
        single = _packed(os.path.join(folder, "all.arrow"), files)
        a = _packed(os.path.join(folder, "a.arrow"), files[:cut])
        b = _packed(os.path.join(folder, "b.arrow"), files[cut:])
        mixed = mix([_fields(a, pipeline), _fields(b, pipeline)], proportion=[0.7, 0.3])
        assert mixed.epoch_size == len(files)
        data = {"one dataset": (_fields(single, pipeline), True), "mix 70/30": (mixed, False)}

        def epoch(name):
            # A loader of its own each run: loaders alive at once share the pool's threads,
            # and the first made would have the advantage.
            items, shuffle = data[name]
            with DataLoader(items, 64, shuffle=shuffle, parallel=args.parallel, seed=0) as loader:
                for _ in loader:
                    pass

        for name in data:  # warm: the page cache
            epoch(name)
        print(f"{len(files)} JPEGs an epoch, parallel={args.parallel}, batch 64")
        runs = {name: (lambda name=name: epoch(name), len(files)) for name in data}
        compare(runs, args.repeats, "one dataset", unit="images/s")


if __name__ == "__main__":
    main()
