"""A synthetic ImageNet-like JPEG dataset in ImageFolder layout, generated once and cached.

`generate(root, n, seed)` writes `root/class<k>/<i>.jpg`: 10 classes, shorter side
300-500 px, aspect 3:4 to 4:3, quality 90 with 4:2:0 chroma (as most ImageNet files).
The content is smooth colour fields, a few hard-edged shapes and soft blobs, mid-frequency
texture and mild sensor noise, which gives realistic file sizes (~50-150 KB) and decode
costs. Image i depends only on (seed, i). A marker file records a complete dataset, so a
second call returns at once.

Usage: python bench/images.py [--root bench/.cache/images] [--n 4000] [--seed 0]
"""

import argparse
import concurrent.futures
import json
import os
import time

import numpy as np
import simplejpeg

__all__ = ["DEFAULT_ROOT", "generate"]

DEFAULT_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache", "images")
CLASSES = 10
QUALITY = 90
_MARKER = ".complete"
_VERSION = 1


def _upsample_matrix(n, k):
    """(n, k) weights that smoothly interpolate k control points onto n pixels."""
    t = np.linspace(0, k - 1, n, dtype=np.float32)
    i0 = np.minimum(t.astype(np.int64), k - 2)
    f = t - i0
    f = f * f * (3 - 2 * f)  # smoothstep: no visible kinks at the control points
    m = np.zeros((n, k), np.float32)
    rows = np.arange(n)
    m[rows, i0] = 1 - f
    m[rows, i0 + 1] = f
    return m


def _smooth_field(rng, h, w, gh, gw, channels, scale):
    """A smooth (h, w, channels) float32 field from a gh x gw grid of normal draws."""
    grid = rng.standard_normal((channels, gh, gw), dtype=np.float32) * scale
    field = _upsample_matrix(h, gh) @ grid @ _upsample_matrix(w, gw).T
    return np.ascontiguousarray(field.transpose(1, 2, 0))


def _shapes(rng, img, count):
    """Paints `count` hard-edged ellipses and rectangles of random colours in place."""
    h, w, _ = img.shape
    ys = np.arange(h, dtype=np.float32)[:, None]
    xs = np.arange(w, dtype=np.float32)[None, :]
    for _ in range(count):
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        ry, rx = rng.uniform(0.04, 0.25) * h, rng.uniform(0.04, 0.25) * w
        color = rng.uniform(0, 255, 3).astype(np.float32)
        alpha = rng.uniform(0.5, 1.0)
        if rng.random() < 0.5:
            mask = ((ys - cy) / ry) ** 2 + ((xs - cx) / rx) ** 2 < 1
        else:
            mask = (np.abs(ys - cy) < ry) & (np.abs(xs - cx) < rx)
        img[mask] = (1 - alpha) * img[mask] + alpha * color


def _blobs(rng, img, count):
    """Adds `count` soft Gaussian blobs of random colours (separable, so cheap)."""
    h, w, _ = img.shape
    ys = np.arange(h, dtype=np.float32)
    xs = np.arange(w, dtype=np.float32)
    for _ in range(count):
        gy = np.exp(-0.5 * ((ys - rng.uniform(0, h)) / (rng.uniform(0.05, 0.2) * h)) ** 2)
        gx = np.exp(-0.5 * ((xs - rng.uniform(0, w)) / (rng.uniform(0.05, 0.2) * w)) ** 2)
        color = rng.uniform(-90, 90, 3).astype(np.float32)
        img += (gy[:, None] * gx[None, :])[:, :, None] * color


def synthesize(seed, i):
    """Image i of the dataset of `seed`: uint8 (h, w, 3)."""
    rng = np.random.default_rng([seed, i])
    short = int(rng.integers(300, 501))
    aspect = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))  # width / height
    if aspect >= 1:
        h, w = short, int(round(short * aspect))
    else:
        h, w = int(round(short / aspect)), short
    img = _smooth_field(rng, h, w, 4, 4, 3, 45.0) + rng.uniform(60, 190, 3).astype(np.float32)
    _shapes(rng, img, int(rng.integers(2, 7)))
    _blobs(rng, img, int(rng.integers(2, 6)))
    # Texture whose strength varies over the image, like foliage next to sky.
    strength = 0.45 + np.abs(_smooth_field(rng, h, w, 3, 3, 1, 1.0))
    texture = _smooth_field(rng, h, w, max(2, h // 2), max(2, w // 2), 3, 26.0)
    img += strength * texture
    img += rng.standard_normal((h, w, 1), dtype=np.float32) * 5.0
    return np.clip(img, 0, 255).astype(np.uint8)


def _path(root, i):
    return os.path.join(root, f"class{i % CLASSES:02d}", f"{i:05d}.jpg")


def _write(root, seed, i):
    data = simplejpeg.encode_jpeg(
        synthesize(seed, i), quality=QUALITY, colorspace="RGB", colorsubsampling="420"
    )
    tmp = _path(root, i) + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, _path(root, i))
    return len(data)


def _remove_stale(root, n):
    """Deletes .jpg files of an earlier dataset that this one does not contain."""
    keep = {_path(root, i) for i in range(n)}
    for k in range(CLASSES):
        folder = os.path.join(root, f"class{k:02d}")
        for entry in os.scandir(folder):
            if entry.name.endswith((".jpg", ".tmp")) and entry.path not in keep:
                os.remove(entry.path)


def generate(root=DEFAULT_ROOT, n=4000, seed=0, num_threads=None):
    """Creates the dataset of `n` images under `root` unless a complete one with the same
    parameters is there; returns `root`. Prints progress while generating.
    Raises ValueError for n < CLASSES."""
    if n < CLASSES:
        raise ValueError(f"generate: n must be at least {CLASSES} (one image per class), got {n}")
    root = os.fspath(root)
    params = {"n": n, "seed": seed, "quality": QUALITY, "version": _VERSION}
    marker = os.path.join(root, _MARKER)
    try:
        with open(marker) as f:
            if json.load(f) == params:
                return root
    except (FileNotFoundError, json.JSONDecodeError):
        pass
    for k in range(CLASSES):
        os.makedirs(os.path.join(root, f"class{k:02d}"), exist_ok=True)
    if os.path.exists(marker):
        os.remove(marker)
    _remove_stale(root, n)
    start, total, done = time.perf_counter(), 0, 0
    step = max(1, n // 10)
    with concurrent.futures.ThreadPoolExecutor(num_threads or os.cpu_count()) as pool:
        for size in pool.map(lambda i: _write(root, seed, i), range(n)):
            total += size
            done += 1
            if done % step == 0 or done == n:
                elapsed = time.perf_counter() - start
                print(
                    f"  generating {root}: {done}/{n} images, mean {total / done / 1024:.0f} KB, "
                    f"{done / elapsed:.0f} images/s",
                    flush=True,
                )
    with open(marker, "w") as f:
        json.dump(params, f)
    return root


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=DEFAULT_ROOT)
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    generate(args.root, args.n, args.seed)


if __name__ == "__main__":
    main()
