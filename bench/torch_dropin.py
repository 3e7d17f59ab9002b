"""The one-line switch: ``fastload.torch.DataLoader`` against the loaders it replaces, over
the synthetic ImageNet-like JPEG folder of ``images.py`` (RandomResizedCrop(224) + flip,
uint8), two workers, medians of interleaved epochs (``common.compare``):

1. over a fastload container, ``obsview((mapobs(Compose([DecodeImage(),
   RandomResizedCrop(224), RandomHorizontalFlip()]), folder.images), folder.labels))``:
   ``fastload.torch.DataLoader(data, batch_size, shuffle=True, num_workers=2)`` (the
   native path) against ``fastload.DataLoader(data, batch_size, shuffle=True,
   parallel=2)``, with and without ``buffer=True``: the main loader at least as fast;
   the same on in-RAM arrays (a ``TensorDataset`` for the drop-in, batch 512);
2. over a PyTorch-style dataset (PIL open, convert, crop, resize and flip in
   ``__getitem__``, as ``jpeg.py`` writes it): ``fastload.torch.DataLoader(ds,
   batch_size, shuffle=True, num_workers=2, persistent_workers=True)`` (fastload's worker
   processes and shared-memory ring, the ``"process-ring"`` path) against PyTorch's
   ``DataLoader`` with the same arguments; the aim is at least 1.0x in every run, and no
   more peak memory over one epoch, each measured in a fresh child process: the PSS of
   the process and its workers summed (a page shared by k processes counts 1/k in each,
   so the tree's footprint; the summed RSS, which counts shared pages once per process,
   is printed beside it), then the minor page faults of its workers over a second epoch
   (the pages of a batch's shared memory, and of what an item allocates, mapped anew).
   With ``--control``, a second PyTorch ``DataLoader`` with the same arguments runs in the
   same rounds: its ratio to the first is this run's own noise, what a loader that is
   exactly as fast as PyTorch's would read.

Each loop reads a byte of every page of every batch, as a training step reads its batch:
a loop that reads nothing never maps the shared memory PyTorch delivers a batch in, so
its pages would count in no process's memory.

Usage: python bench/torch_dropin.py [--n 2000] [--batch 64] [--repeats 3] [--root DIR]
       [--control]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np
import torch
import torch.utils.data as tud
from common import TreeMemory, compare, minor_faults, touch, workers_of
from images import DEFAULT_ROOT, generate
from PIL import Image
from pipelines import pil_crop_flip, train_ops

import fastload
import fastload.torch
from fastload.imagefolder import ImageFolder
from fastload.transforms import Compose

WORKERS = 2
NATIVE, ENGINE = "fastload.torch.DataLoader", "fastload.DataLoader"
ENGINE_BUFFERED = "fastload.DataLoader buffer=True"
DROPIN, TORCH = "fastload.torch.DataLoader (process-ring)", "torch DataLoader"
CONTROL = "torch DataLoader, a second one"


def container(root):
    folder = ImageFolder(root)
    train = Compose(train_ops(jitter=False))
    return fastload.obsview((fastload.mapobs(train, folder.images), folder.labels))


class PILFolder(tud.Dataset):
    """A dataset as PyTorch users write one: PIL decodes, crops, resizes and flips."""

    def __init__(self, root):
        folder = ImageFolder(root)
        self.paths, self.labels = folder.images.paths, folder.labels

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with Image.open(self.paths[i]) as f:
            img = f.convert("RGB")
        img = pil_crop_flip(img)
        return torch.from_numpy(np.array(img)), int(self.labels[i])


def make(name, root, batch):
    if name == NATIVE:
        return fastload.torch.DataLoader(
            container(root), batch_size=batch, shuffle=True, num_workers=WORKERS
        )
    if name in (ENGINE, ENGINE_BUFFERED):
        buffer = name == ENGINE_BUFFERED
        return fastload.DataLoader(
            container(root), batch, shuffle=True, parallel=WORKERS, buffer=buffer
        )
    make_loader = fastload.torch.DataLoader if name == DROPIN else tud.DataLoader  # TORCH, CONTROL
    return make_loader(
        PILFolder(root),
        batch_size=batch,
        shuffle=True,
        num_workers=WORKERS,
        persistent_workers=True,
    )


def epoch(loader):
    def run():
        for batch in loader:
            touch(batch)

    return run


def probe(name, root, batch):
    """In a fresh process: peak memory of this process and its workers over one epoch,
    then the page faults of the workers over a second."""
    with TreeMemory() as memory:
        loader = make(name, root, batch)
        epoch(loader)()
    workers = workers_of(os.getpid())  # persistent: the same in the second epoch
    before = minor_faults(workers)
    epoch(loader)()
    faults = minor_faults(workers) - before
    sizes = {"rss_mb": memory.rss / 2**20, "pss_mb": memory.pss / 2**20}
    print(json.dumps({**sizes, "faults": faults}))


def run_probe(name, root, batch):
    cmd = [sys.executable, os.path.abspath(__file__), "--probe", name, "--root", root]
    cmd += ["--batch", str(batch)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise RuntimeError(f"the probe of {name} exited with {done.returncode} (its output above)")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare_arrays(repeats):
    """The drop-in over a ``TensorDataset`` (its native path) against ``fastload.DataLoader``
    over the same arrays with ``buffer=True``, whole epochs."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1_000_000, 64), dtype=np.float32)
    y = rng.integers(0, 1000, len(x))
    tensors = tud.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    dropin = fastload.torch.DataLoader(tensors, batch_size=512, shuffle=True, num_workers=WORKERS)
    main_loader = fastload.DataLoader((x, y), 512, shuffle=True, parallel=WORKERS, buffer=True)

    def drain(loader):
        def run():
            for _ in loader:
                pass

        return run

    for loader in (dropin, main_loader):
        drain(loader)()  # threads started
    candidates = {
        f"{NATIVE} (TensorDataset)": (drain(dropin), len(x)),
        ENGINE_BUFFERED: (drain(main_loader), len(x)),
    }
    compare(candidates, repeats, f"{NATIVE} (TensorDataset)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--root", default=None)
    parser.add_argument(
        "--control", action="store_true", help="time a second PyTorch loader too (the noise)"
    )
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    root = args.root or f"{DEFAULT_ROOT}-{args.n}"
    if args.probe:
        probe(args.probe, root, args.batch)
        return
    generate(root, args.n)
    native = make(NATIVE, root, args.batch)
    print(f"{args.n} JPEGs, batch {args.batch}, {WORKERS} workers; path: {native.path}")
    print("1. a fastload container (the drop-in on the native path)")
    engine, buffered = make(ENGINE, root, args.batch), make(ENGINE_BUFFERED, root, args.batch)
    candidates = {
        NATIVE: (epoch(native), args.n),
        ENGINE: (epoch(engine), args.n),
        ENGINE_BUFFERED: (epoch(buffered), args.n),
    }
    compare(candidates, args.repeats, NATIVE)
    print("1b. in-RAM arrays: 1,000,000 x 64 float32 + int64 labels, batch 512")
    compare_arrays(args.repeats)
    print("2. a PyTorch-style dataset (PIL in __getitem__)")
    dropin, torch_loader = make(DROPIN, root, args.batch), make(TORCH, root, args.batch)
    print(f"  path: {dropin.path}")
    candidates = {DROPIN: (epoch(dropin), args.n), TORCH: (epoch(torch_loader), args.n)}
    if args.control:
        candidates[CONTROL] = (epoch(make(CONTROL, root, args.batch)), args.n)
    compare(candidates, args.repeats, TORCH)
    dropin.close()
    peaks = {DROPIN: [], TORCH: []}
    for _ in range(args.repeats):  # alternating, each in a fresh process
        for name in peaks:
            peaks[name].append(run_probe(name, root, args.batch))
    for name, runs in peaks.items():
        pss = statistics.median(r["pss_mb"] for r in runs)
        rss = statistics.median(r["rss_mb"] for r in runs)
        faults = statistics.median(r["faults"] for r in runs)
        print(
            f"  {name}: peak memory {pss:,.0f} MB PSS ({rss:,.0f} MB summed RSS); "
            f"page faults in the workers over a second epoch {faults:,.0f}; medians"
        )


if __name__ == "__main__":
    main()
