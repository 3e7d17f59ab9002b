"""Fuzz target: `fastload.open` and every way of reading a small packed file, damaged.

An input is a list of edits, 4 bytes each, to a reference file (6 rows, one field of each
encoding, written at start-up): flip a byte, set a byte, cut the file, or insert bytes.
Edits land only on the file's meaningful bytes (its metadata, Arrow messages and data), not
on the page padding that makes up most of a small file. Each damaged file is opened
without verification and read row by row, column by column, and through loaders (the
native gather and the native JPEG/QOI decode of its image fields).

Allowed outcomes: the data, or a ValueError (a LoadError is one). Any other exception, a
crash or a hang is a finding.

    python fuzz/packed.py [libFuzzer options] CORPUS...   # with atheris (coverage-guided)

Without atheris it replays the corpus and then tries random edits until
-max_total_time, writing each failing input as <-artifact_prefix>crash-<n>.
"""

import contextlib
import os
import random
import re
import sys
import tempfile
import time
import traceback
import warnings

try:
    import atheris
except ImportError:
    atheris = None

# With atheris, fastload's Python code reports its coverage to the fuzzer.
with atheris.instrument_imports(include=["fastload"]) if atheris else contextlib.nullcontext():
    import fastload
    from fastload import DataLoader, mapobs
    from fastload.transforms import CenterCrop, Compose, DecodeImage

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from seeds import write_packed

PADDING_RUN = 1024  # zero runs at least this long are page padding
MAX_INSERT = 16


def _meaningful_offsets(data):
    """The offsets of `data` outside its runs of zero bytes of PADDING_RUN or more."""
    offsets, start = [], 0
    for run in re.finditer(rb"\x00{%d,}" % PADDING_RUN, data):
        offsets.extend(range(start, run.start()))
        start = run.end()
    offsets.extend(range(start, len(data)))
    return offsets


def damage(reference, offsets, edits):
    """`reference` with the edits of `edits` applied, in order."""
    data = bytearray(reference)
    for k in range(0, len(edits) - 3, 4):
        op, hi, lo, value = edits[k : k + 4]
        at = offsets[((hi << 8) | lo) * len(offsets) >> 16]
        if at >= len(data):
            continue
        if op % 4 == 0:
            data[at] ^= value | 1
        elif op % 4 == 1:
            data[at] = value
        elif op % 4 == 2:
            del data[at:]
        else:
            data[at:at] = bytes([value]) * (1 + op // 4 % MAX_INSERT)
    return bytes(data)


def read_everything(path):
    """Opens the file and reads every row, every column and every batch of a loader."""
    ds = fastload.open(path)
    for i in range(len(ds)):
        ds[i]
    names = list(ds.keys())
    for name in names:
        column = ds[name]
        for i in range(len(column)):
            column[i]
    for _batch in DataLoader(ds, batch_size=4):
        pass
    chain = Compose([DecodeImage(), CenterCrop(4)])
    for name in ("jpeg", "qoi"):
        if name in names:
            for _batch in DataLoader(mapobs(chain, ds[name].encoded), batch_size=4, parallel=2):
                pass


class Target:
    """Writes each damaged file under a fresh name (a mapping of the previous one may still
    be alive) and reads it."""

    def __init__(self, folder):
        self.folder = folder
        reference_path = os.path.join(folder, "reference.arrow")
        write_packed(reference_path)
        with open(reference_path, "rb") as f:
            self.reference = f.read()
        self.offsets = _meaningful_offsets(self.reference)
        self.count = 0

    def __call__(self, edits):
        data = damage(self.reference, self.offsets, edits)
        self.count += 1
        path = os.path.join(self.folder, f"damaged-{self.count}.arrow")
        with open(path, "wb") as f:
            f.write(data)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                read_everything(path)
        except ValueError:
            pass
        finally:
            os.unlink(path)


def _random_edits(rng):
    return bytes(rng.randrange(256) for _ in range(4 * rng.randint(1, 8)))


def run_without_atheris(target, argv):
    """The inputs of the corpus folders in argv, then random edits until
    -max_total_time; libFuzzer's options otherwise ignored."""
    options = dict(a[1:].split("=", 1) for a in argv if a.startswith("-") and "=" in a)
    seconds = float(options.get("max_total_time", 30))
    prefix = options.get("artifact_prefix", "./")
    inputs = [
        os.path.join(d, name) for d in argv if os.path.isdir(d) for name in sorted(os.listdir(d))
    ]
    rng = random.Random(0)
    stop, runs, failures = time.monotonic() + seconds, 0, 0
    while time.monotonic() < stop:
        if runs < len(inputs):
            with open(inputs[runs], "rb") as f:
                edits = f.read()
        else:
            edits = _random_edits(rng)
        runs += 1
        try:
            target(edits)
        except Exception:
            failures += 1
            with open(f"{prefix}crash-{failures}", "wb") as f:
                f.write(edits)
            traceback.print_exc()
    print(f"Done {runs} runs in {seconds:.0f} second(s) without atheris, {failures} failures")
    return 1 if failures else 0


def main():
    with tempfile.TemporaryDirectory() as folder:
        target = Target(folder)
        if atheris is None:
            sys.exit(run_without_atheris(target, sys.argv[1:]))
        atheris.Setup(sys.argv, target)
        atheris.Fuzz()


if __name__ == "__main__":
    main()
