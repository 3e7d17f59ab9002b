"""In-memory tensors: 1,000,000 x 64 float32 features and int64 labels, batch 512, shuffled.

Compares, side by side in one run (medians of interleaved repeats):
- fastload DataLoader(parallel=True, buffer=True)
- fastload DataLoader sequential (buffer=True)
- a plain Python loop doing X[idx], y[idx] per batch (one numpy gather: the reference)
- PyTorch's DataLoader over a map-style Dataset with 2 workers, when torch is installed
  (timed over a part of an epoch: it is far slower).

Usage: python bench/tensor.py [--n 1000000] [--repeats 5]
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from common import compare, current_rss_mb, peak_rss_mb

import fastload


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=512)
    args = parser.parse_args()
    n, bs = args.n, args.batch_size
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, 64), dtype=np.float32)
    y = rng.integers(0, 1000, n, dtype=np.int64)
    data_mb = (X.nbytes + y.nbytes) / 2**20
    print(
        f"{n:,} x 64 float32 + int64 labels ({data_mb:.0f} MB), batch {bs}, shuffled; "
        f"{os.cpu_count()} CPUs, pool of {fastload._core.pool_size()} threads"
    )

    parallel = fastload.DataLoader((X, y), bs, shuffle=True, seed=0, parallel=True, buffer=True)
    sequential = fastload.DataLoader((X, y), bs, shuffle=True, seed=0, buffer=True)

    def drain(loader):
        def run():
            for _ in loader:
                pass

        return run

    def numpy_loop():
        order = rng.permutation(n)
        for start in range(0, n, bs):
            idx = order[start : start + bs]
            X[idx], y[idx]

    # Memory first, before torch is imported: the resident size with the data alone, then
    # the peak over an epoch of each fastload loader.
    with_data = current_rss_mb()
    drain(parallel)()
    drain(sequential)()
    fastload_peak = peak_rss_mb()
    candidates = {
        "numpy gather loop": (numpy_loop, n),
        "fastload parallel": (drain(parallel), n),
        "fastload sequential": (drain(sequential), n),
    }
    try:
        import torch.utils.data as tud
    except ImportError:
        print("  (torch not installed: PyTorch's DataLoader skipped)")
    else:

        class MapStyle(tud.Dataset):
            def __len__(self):
                return n

            def __getitem__(self, i):
                return X[i], y[i]

        torch_batches = 100
        torch_loader = tud.DataLoader(
            MapStyle(), batch_size=bs, shuffle=True, num_workers=2, persistent_workers=True
        )

        def torch_run():
            for k, _ in enumerate(torch_loader):
                if k + 1 == torch_batches:
                    break

        torch_run()  # start the workers outside the timing
        candidates["torch DataLoader (2 workers)"] = (torch_run, torch_batches * bs)

    medians = compare(candidates, args.repeats, "numpy gather loop")
    if "torch DataLoader (2 workers)" in medians:
        print(
            f"  fastload parallel / torch DataLoader: "
            f"{medians['fastload parallel'] / medians['torch DataLoader (2 workers)']:.1f}x"
        )
    ring_mb = 3 * bs * (64 * 4 + 8) / 2**20  # prefetch 2 + the slot held by the consumer
    print(
        f"  memory: {with_data:.0f} MB resident with the data ({data_mb:.0f} MB) loaded; "
        f"peak {fastload_peak:.0f} MB over an epoch of each fastload loader "
        f"(+{fastload_peak - with_data:.0f} MB; the ring is {ring_mb:.1f} MB, an epoch's "
        f"permutation {n * 8 / 2**20:.0f} MB, and each loader draws the next epoch's "
        f"while it loads one)"
    )


if __name__ == "__main__":
    main()
