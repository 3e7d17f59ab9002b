"""Per-batch overhead: small batches from a 200,000 x 64 float32 array + int64 labels, shuffled.

At batch size 1 or 16 the copying is next to nothing, so what is measured is the fixed cost
of producing one batch (in batches/s). Compares, side by side per batch size (medians of
interleaved repeats, `common.compare`):
- a plain Python loop: a permutation per epoch, then `idx = order[s:s+bs]; X[idx], y[idx]`
  per batch (the reference; the same slicing at batch size 1, so it is the same work)
- fastload DataLoader sequential, sequential with buffer=True, and parallel with buffer=True
- PyTorch's DataLoader over a TensorDataset in the same process (num_workers=0), when torch
  is installed.
Every candidate loads the same number of batches per timed run: min(--batches, n // bs),
from a fresh iterator (an epoch left unfinished is fine). Ends with the spec's targets.

Usage: python bench/overhead.py [--n 200000] [--batch-sizes 1,16] [--batches 50000]
       [--repeats 5]
"""

import argparse
import itertools
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import compare

import fastload

REFERENCE = "numpy loop"
TORCH = "torch DataLoader in-process"


def drain(loader, count):
    """A run that takes `count` batches from a fresh iterator of `loader` (islice calls
    iter(), which starts a new epoch) and drops them; stops without asking for one more."""

    def run():
        for _ in itertools.islice(loader, count):
            pass

    return run


def candidates_for(X, y, bs, count, torch_data):
    n = len(X)
    rng = np.random.default_rng(0)

    def numpy_loop():
        order = rng.permutation(n)  # drawn per run, as each loader draws one per epoch
        for start in range(0, count * bs, bs):
            idx = order[start : start + bs]
            X[idx], y[idx]

    def loader(**options):
        return fastload.DataLoader((X, y), bs, shuffle=True, seed=0, **options)

    runs = {REFERENCE: numpy_loop}
    for name, options in [
        ("fastload sequential", {}),
        ("fastload sequential buffered", {"buffer": True}),
        ("fastload parallel buffered", {"parallel": True, "buffer": True}),
    ]:
        runs[name] = drain(loader(**options), count)
    if torch_data is not None:
        import torch.utils.data as tud

        torch_loader = tud.DataLoader(torch_data, batch_size=bs, shuffle=True, num_workers=0)
        runs[TORCH] = drain(torch_loader, count)
    for run in runs.values():  # warm up (first allocations, the pool's threads) untimed
        run()
    return {name: (run, count) for name, run in runs.items()}


def check(label, value, goal, fmt=",.0f"):
    print(f"  {label}: {value:{fmt}} >= {goal:{fmt}}: {'met' if value >= goal else 'missed'}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument(
        "--batches",
        type=int,
        default=50_000,
        help="most batches per timed run (a full epoch when fewer)",
    )
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    n = args.n
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, 64), dtype=np.float32)
    y = rng.integers(0, 1000, n, dtype=np.int64)
    print(
        f"{n:,} x 64 float32 + int64 labels, shuffled; {os.cpu_count()} CPUs, "
        f"pool of {fastload._core.pool_size()} threads"
    )
    try:
        import torch
        from torch.utils.data import TensorDataset
    except ImportError:
        torch_data = None
        print(f"  (torch not installed: {TORCH} skipped)")
    else:
        torch_data = TensorDataset(torch.from_numpy(X), torch.from_numpy(y))

    results = {}
    for bs in batch_sizes:
        count = min(args.batches, n // bs)
        print(f"batch size {bs}: {count:,} batches per timed run")
        results[bs] = compare(
            candidates_for(X, y, bs, count, torch_data), args.repeats, REFERENCE, unit="batches/s"
        )

    # The spec says "sequential" without naming the buffer mode: both are checked.
    print("targets (batches/s):")
    goals = {
        1: [
            ("fastload sequential", 200_000),
            ("fastload sequential buffered", 200_000),
            ("fastload parallel buffered", 150_000),
        ],
        16: [
            ("fastload sequential", 150_000),
            ("fastload sequential buffered", 150_000),
            ("fastload parallel buffered", 150_000),
        ],
    }
    for bs in batch_sizes:
        for name, goal in goals.get(bs, []):
            check(f"batch_size={bs} {name}", results[bs][name], goal)
    if 1 in results and TORCH in results[1]:
        ratio = results[1]["fastload parallel buffered"] / results[1][TORCH]
        check(f"batch_size=1 fastload parallel buffered / {TORCH} (x)", ratio, 4, ".1f")


if __name__ == "__main__":
    main()
