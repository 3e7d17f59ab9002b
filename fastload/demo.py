"""``python -m fastload demo``: the main job on generated data, with what it measured.

Loads shuffled batches of in-memory tensors, then of generated JPEGs through the image
pipeline, and prints items/s of fastload against a plain Python loop over the same data:
medians of epochs run in turn, after a first epoch of each.
"""

import time

import numpy as np
import simplejpeg

from ._images.codecs import decoder_name
from .loader import DataLoader
from .transforms import Compose, DecodeImage, RandomHorizontalFlip, RandomResizedCrop
from .views import mapobs


def _items_per_s(batches, count):
    start = time.perf_counter()
    for _ in batches():
        pass
    return count / (time.perf_counter() - start)


def _median_rates(candidates, count, rounds):
    """Items/s of each of ``candidates`` (name: a function giving an epoch's batches), the
    median of ``rounds`` epochs after a first one, run in turn (the order reversed every
    other round) so that the machine's noise falls on all alike."""
    names = list(candidates)
    for name in names:
        _items_per_s(candidates[name], count)  # threads started, the data in the caches
    rates: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            rates[name].append(_items_per_s(candidates[name], count))
    return {name: float(np.median(rates[name])) for name in names}


def run_tensor_demo(n=200_000, features=64, batch_size=256):
    """Print items/s of fastload against a plain Python loop on generated tensors."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, features), dtype=np.float32)
    y = rng.integers(0, 10, n, dtype=np.int64)
    print(
        f"generated {n:,} observations of {features} float32 features + an int64 label; "
        f"batch {batch_size}, shuffled"
    )

    def python_loop():
        order = rng.permutation(n)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            yield np.stack([X[i] for i in idx]), np.array([y[i] for i in idx])

    sequential = DataLoader((X, y), batch_size, shuffle=True, seed=0, buffer=True)
    parallel = DataLoader((X, y), batch_size, shuffle=True, seed=0, buffer=True, parallel=True)
    candidates = {
        "plain Python loop (per-item indexing + np.stack)": python_loop,
        "fastload DataLoader, sequential": lambda: sequential,
        "fastload DataLoader, parallel=True, buffer=True": lambda: parallel,
    }
    rates = _median_rates(candidates, n, rounds=5)
    baseline = next(iter(rates.values()))
    for name, rate in rates.items():
        print(f"  {name:<50} {rate:>12,.0f} items/s  {rate / baseline:6.1f}x")
    stats = parallel.stats()
    print(
        f"  parallel loader stats: {stats['items_per_s']:,.0f} items/s while iterating, "
        f"consumer waited for data {100 * stats['wait_fraction']:.0f}% of the time"
    )
    return rates


def generate_jpegs(n, seed=0):
    """``n`` photo-like JPEGs (smooth gradients, shapes, noise) of 300-500 px a side."""
    rng = np.random.default_rng(seed)
    images = []
    for _ in range(n):
        h, w = (int(v) for v in rng.integers(300, 500, 2))
        yy, xx = np.mgrid[:h, :w].astype(np.float32)
        colors = rng.uniform(0, 255, (3, 3)).astype(np.float32)
        image = (
            colors[0] * (xx / w)[..., None]
            + colors[1] * (yy / h)[..., None]
            + colors[2] * 0.5 * (1 + np.sin((xx + yy) / rng.uniform(8, 40)))[..., None]
        ) / 2
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(20, 150)
        image[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.uniform(0, 255, 3)
        image += rng.normal(0, 6, image.shape)
        images.append(simplejpeg.encode_jpeg(np.clip(image, 0, 255).astype(np.uint8), quality=90))
    return images


def run_image_demo(n=512, batch_size=64):
    """Print images/s of the 224x224 RandomResizedCrop + flip pipeline: a Python loop
    calling it per image against fastload's parallel loader, on generated JPEGs."""
    images = generate_jpegs(n)
    labels = np.arange(n) % 10
    pipeline = Compose([DecodeImage(), RandomResizedCrop(224), RandomHorizontalFlip()])
    print(
        f"generated {n} JPEGs of 300-500 px a side; RandomResizedCrop(224) + flip, "
        f"batch {batch_size}, uint8; JPEG decoder: {decoder_name()}"
    )

    def python_loop():
        order = np.random.default_rng(0).permutation(n)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            yield np.stack([pipeline(images[i], index=int(i)) for i in idx]), labels[idx]

    loader = DataLoader(
        (mapobs(pipeline, images), labels),
        batch_size,
        shuffle=True,
        seed=0,
        parallel=True,
        buffer=True,
    )
    candidates = {
        "Python loop calling the pipeline per image": python_loop,
        "fastload DataLoader, parallel=True, buffer=True": lambda: loader,
    }
    rates = _median_rates(candidates, n, rounds=3)
    baseline = next(iter(rates.values()))
    for name, rate in rates.items():
        print(f"  {name:<50} {rate:>12,.0f} images/s  {rate / baseline:6.1f}x")
    return rates
