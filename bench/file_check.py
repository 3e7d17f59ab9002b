"""What the check of an open packed file costs a JPEG epoch: before each batch is handed
out, the loader compares each file's size, modification and change times with those at
open (one ``fstat`` per file), so that a file rewritten in place under the loader raises
instead of handing out its new bytes.

Side by side in one run (medians of 7 interleaved epochs, the order reversed every other
round): RandomResizedCrop(224) + flip, batch 256, shuffled, ``parallel=True,
buffer=True`` (``storage.py``'s pipeline), from the packed JPEGs of ``images.py``'s folder,
with the check and with it turned off on a second opening of the same file.

Usage: python bench/file_check.py [--n 2000] [--repeats 7]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import compare
from images import DEFAULT_ROOT, generate
from storage import rrc_loader

import fastload
from fastload.storage.convert import convert


class _Unchecked:
    """A dataset's file checks turned off (what the comparison runs without)."""

    def check(self, rows=None):
        pass

    def __bool__(self):
        return True


def epoch(loader):
    def run():
        for _ in loader:
            pass

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    root = f"{DEFAULT_ROOT}-{args.n}"
    generate(root, args.n)
    packed = os.path.join(os.path.dirname(root), f"packed-{args.n}.arrow")
    if not os.path.exists(packed):
        convert(root, packed, mode="jpeg", progress=False)
    checked, unchecked = fastload.open(packed), fastload.open(packed)
    unchecked.verify_rows.files = _Unchecked()
    loaders = {
        "with the file check": rrc_loader(checked["image"].encoded, checked["label"]),
        "without it": rrc_loader(unchecked["image"].encoded, unchecked["label"]),
    }
    for loader in loaders.values():
        epoch(loader)()  # warm: blocks verified, pages cached
    print(f"{args.n} packed JPEGs, RandomResizedCrop(224) + flip, batch 256, parallel=True")
    medians = compare(
        {name: (epoch(loader), args.n) for name, loader in loaders.items()},
        args.repeats,
        "without it",
        unit="images/s",
    )
    rates = list(medians.values())
    print(f"  the check costs {100 * (1 - rates[0] / rates[1]):+.2f}% of the epoch's time")


if __name__ == "__main__":
    main()
