"""What writing an image costs: the CPU time per image of ``JPEG(max_side=256).encode``
(decode, the area shrink, encode with restart markers) of a generated 640x480 JPEG at
quality 90, and of the area shrink alone, in C (``_core.resize_area``, what the writer
calls) against the same exact integer sums in numpy (what the writer ran before 0.3),
alternating, medians of ``--repeats`` rounds of ``--n`` images. The encode runs twice:
in the buffers each thread keeps for the next image (what the fields do), and into new
arrays per image (``REUSED_BYTES`` 0), with the page faults per image of each. Run with
``MALLOC_TRIM_THRESHOLD_=65536`` to see what the new arrays cost where the allocator gives
them back to the kernel at each free, as in Dask's workers.

Usage: python bench/encode.py [--n 30] [--repeats 5]
"""

import argparse
import io
import resource
import statistics
import time

import numpy as np
from PIL import Image

from fastload import _core
from fastload._images import encoding
from fastload._images.encoding import fit_size
from fastload.storage import JPEG


def area_numpy(img, size):
    """The exact area mean as the writer computed it before 0.3: two passes of numpy int64
    sums, each output line one ``np.add.reduce`` of the lines it covers with its edges
    weighted, rounded half up."""
    rows = _sums(img, size[0])
    total = _sums(np.ascontiguousarray(rows.swapaxes(0, 1)), size[1]).swapaxes(0, 1)
    return np.floor(total / (img.shape[0] * img.shape[1]) + 0.5).astype(np.uint8, order="C")


def _sums(x, m):
    n = x.shape[0]
    lo, part = np.divmod(np.arange(m + 1, dtype=np.int64) * n, m)
    out = np.empty((m,) + x.shape[1:], np.int64)
    starts = lo.tolist()
    for j in range(m):
        np.add.reduce(x[starts[j] : starts[j + 1]], axis=0, dtype=np.int64, out=out[j])
    out *= m
    edge = x[np.minimum(lo, n - 1)] * part.reshape((-1,) + (1,) * (x.ndim - 1))
    out += edge[1:]
    out -= edge[:-1]
    return out


def photo_like(h, w):
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 // w, y * 255 // h, (x + y) % 256], -1)
    img = img + np.random.default_rng(0).integers(-20, 20, img.shape)
    out = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


def cpu_ms(work, n):
    """(CPU ms, minor page faults) per call of ``work``, over ``n`` calls."""
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.process_time()
    for _ in range(n):
        work()
    ms = (time.process_time() - start) / n * 1e3
    return ms, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / n


def fresh_arrays(work):
    """``work`` with the fields' buffers off: every image into new arrays."""

    def run():
        kept, encoding.REUSED_BYTES = encoding.REUSED_BYTES, 0
        try:
            work()
        finally:
            encoding.REUSED_BYTES = kept

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    data, field = photo_like(480, 640), JPEG(max_side=256)
    pixels = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    size = fit_size(480, 640, 256)
    assert np.array_equal(_core.resize_area(pixels, *size), area_numpy(pixels, size))
    works = {
        "JPEG(max_side=256).encode": lambda: field.encode(data),
        "the same into new arrays": fresh_arrays(lambda: field.encode(data)),
        "area shrink in C": lambda: _core.resize_area(pixels, *size),
        "area shrink in numpy": lambda: area_numpy(pixels, size),
    }
    times = {name: [] for name in works}
    faults = {name: [] for name in works}
    for _ in range(args.repeats):
        for name, work in works.items():
            work()
            ms, f = cpu_ms(work, args.n)
            times[name].append(ms)
            faults[name].append(f)
    for name, ms in times.items():
        print(
            f"  {name:27} {statistics.median(ms):6.2f} ms of CPU per image, "
            f"{statistics.median(faults[name]):5.0f} page faults"
        )
    c, py = (statistics.median(times[k]) for k in ("area shrink in C", "area shrink in numpy"))
    print(f"  the area shrink in C: {py / c:.1f}x numpy's (640x480 -> {size[1]}x{size[0]})")


if __name__ == "__main__":
    main()
