"""JPEG image pipeline: batch 256 at 224x224, RandomResizedCrop + horizontal flip, uint8 HWC
(with --jitter: + ColorJitter(0.4, 0.4, 0.4) + Normalize + ToCHW, float32 CHW).

Over a synthetic ImageNet-like ImageFolder (`images.py`: 4,000 JPEGs, shorter side 300-500
px, ~90 KB), compares side by side in one run (medians of interleaved epochs):
- fastload: DataLoader((mapobs(Compose([DecodeImage(), RandomResizedCrop(224),
  RandomHorizontalFlip()]), folder.images), folder.labels), 256, shuffle=True,
  parallel=True, buffer=True);
- the reference a user could write: simplejpeg decode at full size, torchvision's
  RandomResizedCrop parameters in Python, PIL crop + resize(BILINEAR), numpy flip, on a
  ThreadPoolExecutor as large as fastload's pool, into a reused (256, 224, 224, 3) batch;
- PyTorch's DataLoader (as many workers, persistent) over a PIL Dataset written as
  torchvision's transforms do it (open, convert, crop, resize, transpose; with --jitter
  also ImageEnhance brightness/contrast/saturation in a random order, then ToTensor and
  Normalize as torch ops), when installed.

Then, on one core: ms per image of fastload's pipeline split into decode (the crop region
only), resize and the rest, beside a full-image decode (simplejpeg).

First-batch latency (from building the dataset and loader to holding the first batch)
and peak memory are measured per candidate in a fresh child process that imports only
what that candidate needs and loads one epoch: peak memory is the sum of the RSS of that
process and its children (torch's workers), sampled every 10 ms by a thread (psutil).
Worker RSS counts pages shared with the parent once per process, so it overstates torch.

With --packed, instead: the packed pass-through read of the same full-size JPEGs.
``fastload.convert`` without ``max_side`` (no resize: every file keeps its coefficients)
writes the folder once with restart markers added losslessly (the default, restart_px=32,
and each other --restart-px given) and once with ``keep_given=True`` (the files byte for
byte); then DataLoader((mapobs(Compose([DecodeImage(), RandomResizedCrop(224),
RandomHorizontalFlip()]), ds["image"].encoded), ds["label"]), 256, shuffle=True,
parallel=True, buffer=True) reads each file, epochs alternating (medians), in RAM:
stored bytes per image, convert time, images/s.

Usage: python bench/jpeg.py [--n 4000] [--repeats 3] [--batches 0] [--root DIR] [--jitter]
       python bench/jpeg.py --packed [--restart-px 32 64] [--n 4000] [--repeats 5]
(--batches 0: whole epochs; k: the first k batches of each epoch)
"""

import argparse
import concurrent.futures
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import psutil
import simplejpeg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import compare
from images import DEFAULT_ROOT, generate
from pipelines import SIZE, pil_crop_flip, pil_jitter, rrc_params, train_ops

import fastload
from fastload.imagefolder import ImageFolder
from fastload.storage.convert import convert
from fastload.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Compose,
)

BATCH = 256
FASTLOAD = "fastload DataLoader"
THREADS = "simplejpeg+PIL thread pool"
TORCH = "torch DataLoader"


def make_fastload(root, jitter):
    folder = ImageFolder(root)
    train = Compose(train_ops(jitter))
    return fastload.DataLoader(
        (fastload.mapobs(train, folder.images), folder.labels),
        BATCH,
        shuffle=True,
        parallel=True,
        buffer=True,
    )


class ThreadPoolLoader:
    """The reference loop: one thread-pool map per batch into a reused batch buffer."""

    def __init__(self, root, threads, jitter):
        from PIL import Image, ImageEnhance  # here, so that the fastload probe stays PIL-free

        self.image, self.enhance, self.jitter = Image, ImageEnhance, jitter
        folder = ImageFolder(root)
        self.paths, self.labels = folder.images.paths, folder.labels
        self.pool = concurrent.futures.ThreadPoolExecutor(threads)
        shape = (BATCH, 3, SIZE, SIZE) if jitter else (BATCH, SIZE, SIZE, 3)
        self.out = np.empty(shape, np.float32 if jitter else np.uint8)
        self.mean = np.array(IMAGENET_MEAN, np.float32)[:, None, None]
        self.std = np.array(IMAGENET_STD, np.float32)[:, None, None]
        self.rng = np.random.default_rng(0)
        self.epoch = 0

    def _load(self, slot, index, seed):
        rng = random.Random(seed)
        with open(self.paths[index], "rb") as f:
            pixels = simplejpeg.decode_jpeg(f.read(), colorspace="RGB")
        y, x, h, w = rrc_params(rng, *pixels.shape[:2])
        crop = self.image.fromarray(pixels).crop((x, y, x + w, y + h))
        resized = crop.resize((SIZE, SIZE), self.image.BILINEAR)
        if rng.random() < 0.5:
            resized = resized.transpose(self.image.FLIP_LEFT_RIGHT)
        if not self.jitter:
            self.out[slot] = np.asarray(resized)
            return
        chw = np.asarray(pil_jitter(resized, rng, self.enhance)).transpose(2, 0, 1)
        self.out[slot] = (chw / np.float32(255) - self.mean) / self.std

    def __iter__(self):
        order = self.rng.permutation(len(self.paths))
        self.epoch += 1
        for start in range(0, len(order), BATCH):
            idx = order[start : start + BATCH]
            seeds = [(self.epoch << 32) + int(i) for i in idx]
            list(self.pool.map(self._load, range(len(idx)), idx, seeds))
            yield self.out[: len(idx)], self.labels[idx]


def make_torch(root, workers, persistent, jitter, batches=0):
    import torch
    import torch.utils.data as tud
    from PIL import Image, ImageEnhance

    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)

    class PILFolder(tud.Dataset):
        def __init__(self):
            folder = ImageFolder(root)
            self.paths, self.labels = folder.images.paths, folder.labels

        def __len__(self):
            return len(self.paths)

        def __getitem__(self, i):
            with Image.open(self.paths[i]) as f:
                img = f.convert("RGB")
            img = pil_crop_flip(img)
            if not jitter:
                return torch.from_numpy(np.array(img)), int(self.labels[i])
            img = pil_jitter(img, random, ImageEnhance)
            x = torch.from_numpy(np.array(img)).permute(2, 0, 1).float().div_(255)
            return x.sub_(mean).div_(std), int(self.labels[i])

    data = PILFolder()
    # A short epoch rather than a break: after a break, persistent workers would go on
    # loading their prefetched batches while the next candidate is timed.
    sampler = tud.RandomSampler(data, num_samples=min(len(data), batches * BATCH) or None)
    return tud.DataLoader(
        data, batch_size=BATCH, sampler=sampler, num_workers=workers, persistent_workers=persistent
    )


def make(name, root, workers, jitter, persistent=True, batches=0):
    if name == FASTLOAD:
        return make_fastload(root, jitter)
    if name == THREADS:
        return ThreadPoolLoader(root, workers, jitter)
    return make_torch(root, workers, persistent, jitter, batches)


class TreeRSS:
    """Peak of the summed RSS of this process and its descendants, sampled by a thread."""

    def __init__(self, interval=0.01):
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self):
        me = psutil.Process()
        total = me.memory_info().rss
        for child in me.children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        self.peak = max(self.peak, total)

    def _run(self):
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self):
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()


def probe(name, root, workers, jitter):
    """In a fresh process: first-batch latency and peak tree memory over one epoch."""
    with TreeRSS() as rss:
        start = time.perf_counter()
        loader = make(name, root, workers, jitter, persistent=False)
        it = iter(loader)
        next(it)
        first = time.perf_counter() - start
        for _ in it:
            pass
    print(json.dumps({"first_s": first, "peak_mb": rss.peak / 2**20}))


def run_probe(name, root, workers, jitter):
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--probe",
        name,
        "--root",
        root,
        "--workers",
        str(workers),
    ] + (["--jitter"] if jitter else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def drain(loader, batches):
    def run():
        for k, _ in enumerate(loader):
            if k + 1 == batches:
                break

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--batches", type=int, default=0, help="batches per timed run (0: whole epochs)"
    )
    parser.add_argument(
        "--root", default=None, help=f"dataset folder (default {DEFAULT_ROOT}, n={{n}} images)"
    )
    parser.add_argument(
        "--jitter", action="store_true", help="add ColorJitter(0.4, 0.4, 0.4) + Normalize + ToCHW"
    )
    parser.add_argument(
        "--packed",
        action="store_true",
        help="the packed read of the files with restart markers added and as given",
    )
    parser.add_argument(
        "--restart-px",
        type=int,
        nargs="+",
        default=[32],
        help="with --packed: the restart_px values to write (default: 32)",
    )
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        return probe(args.probe, args.root, args.workers, args.jitter)
    root = generate(args.root or DEFAULT_ROOT, args.n)
    if args.packed:
        return packed_pass_through(root, args.restart_px, args.repeats, args.jitter)
    n = len(ImageFolder(root))
    workers = fastload._core.pool_size()
    batches = args.batches or -(-n // BATCH)
    items = min(n, batches * BATCH)
    what = (
        "RandomResizedCrop + flip + ColorJitter + Normalize + ToCHW, float32"
        if args.jitter
        else "RandomResizedCrop + flip, uint8"
    )
    print(
        f"{n:,} JPEGs in {root}, batch {BATCH} at {SIZE}x{SIZE}, {what}, {batches} batches "
        f"per run; {os.cpu_count()} CPUs, pool of {workers} threads; JPEG decoder: "
        f"{fastload._images.codecs.decoder_name()}"
    )

    names = [FASTLOAD, THREADS]
    try:
        import torch  # noqa: F401

        names.append(TORCH)
    except ImportError:
        print("  (torch not installed: PyTorch's DataLoader skipped)")
    candidates = {}
    for name in names:
        loader = make(name, root, workers, args.jitter, batches=args.batches)
        drain(loader, batches)()  # untimed: starts pools and workers, warms the page cache
        candidates[name] = (drain(loader, batches), items)
    medians = compare(candidates, args.repeats, THREADS)
    if TORCH in medians:
        for name in (FASTLOAD, THREADS):
            print(f"  {name} / {TORCH}: {medians[name] / medians[TORCH]:.2f}x")
    print("  fresh process per candidate, one epoch: first batch, peak RSS of process tree")
    for name in names:
        p = run_probe(name, root, workers, args.jitter)
        print(
            f"  {name:<{max(map(len, names))}}  first batch {p['first_s']:6.3f} s   "
            f"peak {p['peak_mb']:6.0f} MB"
        )
    one_core_split(root, args.jitter)


def packed_pass_through(root, restart_pxs, repeats, jitter):
    """The folder packed without resize, with restart markers added losslessly (each of
    ``restart_pxs``) and as given: stored bytes per image and convert time; then, epochs
    alternating (in reverse order every other round), images/s and CPU ms per image of the
    training pipeline over each file (median and range of ``repeats``), and ms per image of
    the same pipeline on one core over the first 300 rows (median of ``repeats`` passes)."""
    out = tempfile.mkdtemp(prefix="jpeg-packed-")
    written = {f"restart_px={px}": {"restart_px": px} for px in restart_pxs}
    written["as given (keep_given=True)"] = {"keep_given": True}
    print(f"packed pass-through read of {root} (no max_side), {os.cpu_count()} CPUs:")
    loaders, rows = {}, {}
    for k, (name, options) in enumerate(written.items()):
        path = os.path.join(out, f"{k}.arrow")
        start = time.perf_counter()
        convert(root, path, mode="jpeg", check=False, progress=False, **options)
        seconds = time.perf_counter() - start
        stored = fastload.open(path)["image"].encoded
        labels = fastload.open(path)["label"]
        mean = float(np.mean([len(stored[i]) for i in range(len(stored))]))
        print(f"  {name:<28} {mean / 1e3:7.1f} KB per image, convert {seconds:5.1f} s")
        chain = Compose(train_ops(jitter))
        loaders[name] = fastload.DataLoader(
            (fastload.mapobs(chain, stored), labels), BATCH, shuffle=True, parallel=True,
            buffer=True,
        )  # fmt: skip
        drain(loaders[name], 0)()  # untimed: threads started, the file in the page cache
        rows[name] = (chain, [stored[i] for i in range(min(300, len(stored)))])
    rates, cpu, one_core = ({name: [] for name in loaders} for _ in range(3))
    names = list(loaders)
    for round_ in range(repeats):
        for name in names if round_ % 2 == 0 else names[::-1]:
            wall, proc = time.perf_counter(), time.process_time()
            drain(loaders[name], 0)()
            rates[name].append(len(labels) / (time.perf_counter() - wall))
            cpu[name].append((time.process_time() - proc) / len(labels) * 1e3)
            chain, items = rows[name]
            one_core[name].append(per_image_ms(lambda i, d, f=chain: f(d, index=i), items))
    reference = statistics.median(rates[names[-1]])
    print(f"  {repeats} alternating rounds: images/s, CPU ms per image, one-core ms per image")
    for name in names:
        r, c, o = rates[name], cpu[name], one_core[name]
        print(
            f"  {name:<28} {statistics.median(r):6,.0f} ({min(r):,.0f}-{max(r):,.0f}) "
            f"{statistics.median(r) / reference:5.2f}x   {statistics.median(c):6.3f} "
            f"({min(c):.3f}-{max(c):.3f})   {statistics.median(o):6.3f}"
        )


def per_image_ms(f, items):
    start = time.perf_counter()
    for i, item in enumerate(items):
        f(i, item)
    return (time.perf_counter() - start) / len(items) * 1e3


def one_core_split(root, jitter, n=500, repeats=3):
    """ms per image on one core (this thread): the pipeline, its decode (the crop region
    only), the resize of the crop, and the rest; a full-image decode beside them."""
    paths = ImageFolder(root).images.paths[:n]
    datas = []
    for path in paths:
        with open(path, "rb") as f:
            datas.append(f.read())
    chain = Compose(train_ops(jitter))
    source = fastload._core.ImageSource(
        chain.pipeline,
        channels=3,
        name="bytes",
        decoder=fastload._images.codecs,
        max_pixels=fastload.limits.MAX_IMAGE_PIXELS,
        max_file_bytes=fastload.limits.MAX_FILE_BYTES,
        buffers=datas,
    )
    wholes = [simplejpeg.decode_jpeg(d) for d in datas]
    crops = []
    for i, img in enumerate(wholes):
        (y, x, h, w), _ = chain.pipeline.prepare(img.shape[0], img.shape[1], 0, 0, i)
        crops.append(img[y : y + h, x : x + w])
    runs = {
        "pipeline": lambda i, d: chain(d, index=i),
        "decode (crop region)": lambda i, d: source.decode(d, 0, 0, i),
        "resize (crop to 224)": lambda i, c: fastload._core.resize(c, SIZE, SIZE),
        "full decode (simplejpeg)": lambda i, d: simplejpeg.decode_jpeg(d),
    }
    inputs = {"resize (crop to 224)": crops}
    ms = {
        name: sorted(per_image_ms(f, inputs.get(name, datas)) for _ in range(repeats))[repeats // 2]
        for name, f in runs.items()
    }
    rest = ms["pipeline"] - ms["decode (crop region)"] - ms["resize (crop to 224)"]
    print(f"  one core, ms per image (median of {repeats} passes over {len(datas)} images):")
    for name in ("pipeline", "decode (crop region)", "resize (crop to 224)"):
        print(f"    {name:<26} {ms[name]:6.3f}")
    print(f"    {'the rest':<26} {rest:6.3f}")
    print(f"    {'full decode (simplejpeg)':<26} {ms['full decode (simplejpeg)']:6.3f}")


if __name__ == "__main__":
    main()
