"""``python -m fastload demo``: the main job on generated data, with what it measured.

Loads shuffled batches of an in-memory dataset three ways and prints items/s: a plain
Python loop over the same data (the baseline a user would write), fastload sequential,
and fastload parallel with reused buffers.
"""
import time

import numpy as np

from .loader import DataLoader


def _items_per_s(batches, count):
    start = time.perf_counter()
    for _ in batches():
        pass
    return count / (time.perf_counter() - start)


def run_tensor_demo(n=200_000, features=64, batch_size=256):
    """Print items/s of fastload against a plain Python loop on generated tensors."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, features), dtype=np.float32)
    y = rng.integers(0, 10, n, dtype=np.int64)
    print(f"generated {n:,} observations of {features} float32 features + an int64 label; "
          f"batch {batch_size}, shuffled")

    def python_loop():
        order = rng.permutation(n)
        for start in range(0, n, batch_size):
            idx = order[start:start + batch_size]
            yield np.stack([X[i] for i in idx]), np.array([y[i] for i in idx])

    sequential = DataLoader((X, y), batch_size, shuffle=True, seed=0, buffer=True)
    parallel = DataLoader((X, y), batch_size, shuffle=True, seed=0, buffer=True, parallel=True)
    rates = {
        "plain Python loop (per-item indexing + np.stack)": _items_per_s(python_loop, n),
        "fastload DataLoader, sequential": _items_per_s(lambda: sequential, n),
        "fastload DataLoader, parallel=True, buffer=True": _items_per_s(lambda: parallel, n),
    }
    baseline = next(iter(rates.values()))
    for name, rate in rates.items():
        print(f"  {name:<50} {rate:>12,.0f} items/s  {rate / baseline:6.1f}x")
    stats = parallel.stats()
    print(f"  parallel loader stats: {stats['items_per_s']:,.0f} items/s while iterating, "
          f"consumer waited for data {100 * stats['wait_fraction']:.0f}% of the time")
    return rates


def main():
    run_tensor_demo()


if __name__ == "__main__":
    main()
