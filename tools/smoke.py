"""A smoke test of an installed fastload, run against each built wheel and sdist (``make
wheel-check`` and the release workflow):

    python -I tools/smoke.py --decoder NAME [--libjpeg-hidden]

Run with ``-I``, from outside the source tree, so that the installed package is imported
and not the sources. Checks that fastload imports from site-packages; that
``python -m fastload --version`` prints the package's version; that ``build_info()`` names
the expected JPEG decoder (its ``jpeg_decoder`` starts with NAME: ``libjpeg-turbo`` for a
wheel); that a JPEG pipeline through ``DataLoader(parallel=2)`` gives batches of the right
shapes and dtypes, with the pixels of Pillow's decode (resized by fastload, within 2 gray
levels); and, with ``--libjpeg-hidden``, that the system's libjpeg really cannot be loaded
in this process, so that the wheel's own copy is the one in use.
Needs only what fastload installs (numpy, Pillow). Exits 1 with a message on the first
failed check.
"""

import argparse
import ctypes
import ctypes.util
import io
import os
import subprocess
import sys
import sysconfig

import numpy as np
from PIL import Image

N, H, W, SIZE, BATCH = 10, 48, 64, 32, 4


def check(condition, message):
    if not condition:
        sys.exit(f"smoke test failed: {message}")


def jpeg_images():
    """N small photo-like JPEGs (gradients and noise), and their pixels as Pillow decodes."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:H, 0:W]
    encoded, decoded = [], []
    for k in range(N):
        base = np.stack([xx * 4, yy * 5, (xx + yy + 16 * k) % 256], axis=-1)
        pixels = np.clip(base + rng.integers(-8, 9, base.shape), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "JPEG", quality=92)
        encoded.append(buf.getvalue())
        decoded.append(np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB")))
    return encoded, decoded


def check_installed(fastload):
    site = sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]
    where = os.path.realpath(fastload.__file__)
    check(
        where.startswith(tuple(os.path.realpath(s) for s in site)),
        f"fastload was imported from {where}, not from this environment's site-packages",
    )
    version = subprocess.run(
        [sys.executable, "-I", "-m", "fastload", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    check(
        version.stdout == f"fastload {fastload.__version__}\n",
        f"python -m fastload --version printed {version.stdout!r} {version.stderr!r}",
    )


def check_decoder(fastload, expected):
    decoder = fastload.build_info()["jpeg_decoder"]
    check(decoder.startswith(expected), f"build_info() names {decoder!r}, not {expected}")
    return decoder


def check_pipeline(fastload):
    from fastload.transforms import Compose, DecodeImage, RandomHorizontalFlip, Resize

    encoded, decoded = jpeg_images()
    train = Compose([DecodeImage(), Resize((SIZE, SIZE)), RandomHorizontalFlip()])
    labels = np.arange(N, dtype=np.int64)
    loader = fastload.DataLoader(
        (fastload.mapobs(train, encoded), labels), batch_size=BATCH, parallel=2, seed=0
    )
    shapes = [(x.shape, x.dtype.name, y.shape) for x, y in loader]
    expected = [((n, SIZE, SIZE, 3), "uint8", (n,)) for n in (BATCH, BATCH, N - 2 * BATCH)]
    check(shapes == expected, f"batches of {shapes}, not {expected}")

    exact = Compose([DecodeImage(exact=True), Resize((SIZE, SIZE))])
    resize = Compose([Resize((SIZE, SIZE))])
    loader = fastload.DataLoader(fastload.mapobs(exact, encoded), batch_size=BATCH, parallel=2)
    batches = np.concatenate([np.array(x) for x in loader])
    reference = np.stack([resize(pixels) for pixels in decoded])
    diff = int(np.abs(batches.astype(int) - reference.astype(int)).max())
    check(diff <= 2, f"pixels differ from Pillow's decode by up to {diff} gray levels")


def check_libjpeg_hidden():
    name = ctypes.util.find_library("jpeg") or "libjpeg.so.62"
    try:
        ctypes.CDLL(name)
    except OSError:
        return
    check(False, f"--libjpeg-hidden, but the system's {name} loads in this process")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decoder", required=True, metavar="NAME")
    parser.add_argument("--libjpeg-hidden", action="store_true")
    args = parser.parse_args()
    if args.libjpeg_hidden:
        check_libjpeg_hidden()
    import fastload

    check_installed(fastload)
    decoder = check_decoder(fastload, args.decoder)
    check_pipeline(fastload)
    hidden = " with the system's libjpeg hidden" if args.libjpeg_hidden else ""
    print(
        f"smoke test passed{hidden}: fastload {fastload.__version__} from "
        f"{os.path.dirname(fastload.__file__)}, JPEG decoder {decoder}"
    )


if __name__ == "__main__":
    main()
