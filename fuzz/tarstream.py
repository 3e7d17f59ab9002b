"""Fuzz target: `fastload.streams.tar_samples` over damaged tar files, plain and compressed.

An input is a byte that picks the reference archive (plain tar, .tar.gz, .tar.bz2,
.tar.xz), then edits of 4 bytes each: flip a byte, set a byte, cut the file, insert bytes,
or wipe a 512-byte block to zeros (at a multiple of 512 bytes: a tar block). The
references hold a few samples of random bytes; the compressed ones also a long name (a
pax header), a folder and an empty member.

Allowed outcomes:
- compressed (the file still starts with its compression's magic bytes): the reference's
  samples exactly, or a ValueError (a LoadError is one): its compression's check covers
  every byte, so a sample that differs is a finding;
- plain tar (or a compressed one whose magic bytes were damaged): a ValueError, or
  samples: tar stores no check of member data, so their bytes may differ (and edits
  enough can make another valid archive, an empty one of zeros say); after one edit, the
  same samples with fields of the same sizes (a header is checked by its checksum; a
  wiped header or a cut is found, never a shorter archive).
Any other exception, a crash or a hang is a finding.

    python fuzz/tarstream.py [libFuzzer options] CORPUS...   # with atheris (coverage-guided)

Without atheris it replays the corpus and then tries random edits until -max_total_time,
writing each failing input as <-artifact_prefix>crash-<n> (fuzz/packed.py's loop).
"""

import bz2
import contextlib
import gzip
import io
import lzma
import os
import sys
import tarfile

import numpy as np

try:
    import atheris
except ImportError:
    atheris = None

# With atheris, fastload's Python code reports its coverage to the fuzzer.
with atheris.instrument_imports(include=["fastload"]) if atheris else contextlib.nullcontext():
    from fastload.streams import tar_samples

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from packed import run_without_atheris

MAX_INSERT = 16
BLOCK = 512


def _samples(long_names):
    rng = np.random.default_rng(7)
    samples = [
        {"__key__": f"s/{k}", "bin": rng.bytes(100 + 37 * k), "cls": str(k).encode()}
        for k in range(4)
    ]
    if long_names:
        samples.append({"__key__": "s/" + "n" * 120, "bin": rng.bytes(50), "txt": b""})
    return samples


def _tar(samples, folder):
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        if folder:
            info = tarfile.TarInfo("s")
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for sample in samples:
            for ext, payload in sample.items():
                if ext != "__key__":
                    info = tarfile.TarInfo(f"{sample['__key__']}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
    return data.getvalue()


def references():
    """(archive bytes, its samples, the magic bytes of its compression) for each choice
    of the first byte."""
    plain = _samples(long_names=False)
    full = _samples(long_names=True)
    tar = _tar(full, folder=True)
    return [
        (_tar(plain, folder=False), plain, None),
        (gzip.compress(tar, mtime=0), full, b"\x1f\x8b"),
        (bz2.compress(tar), full, b"BZh"),
        (lzma.compress(tar), full, b"\xfd7zXZ\x00"),
    ]


def damage(reference, edits):
    """`reference` with the 4-byte edits of `edits` applied, in order."""
    data = bytearray(reference)
    for k in range(0, len(edits) - 3, 4):
        op, hi, lo, value = edits[k : k + 4]
        at = ((hi << 8) | lo) * len(reference) >> 16
        if at >= len(data):
            continue
        if op % 5 == 0:
            data[at] ^= value | 1
        elif op % 5 == 1:
            data[at] = value
        elif op % 5 == 2:
            del data[at:]
        elif op % 5 == 3:
            data[at:at] = bytes([value]) * (1 + op // 5 % MAX_INSERT)
        else:
            at -= at % BLOCK
            data[at : at + BLOCK] = bytes(len(data[at : at + BLOCK]))
    return bytes(data)


def _shape(samples):
    return [{k: (v if k == "__key__" else len(v)) for k, v in s.items()} for s in samples]


class Target:
    def __init__(self):
        self.references = references()

    def __call__(self, data):
        if not data:
            return
        reference, samples, magic = self.references[data[0] % len(self.references)]
        edits = data[1:]
        damaged = damage(reference, edits)
        # Damage to the magic bytes leaves a file that is read as a plain tar file.
        compressed = magic is not None and damaged.startswith(magic)
        stream = io.BytesIO(damaged)
        stream.name = "damaged.tar"
        try:
            got = list(tar_samples(stream))
        except ValueError:
            return
        if compressed and got != samples:
            raise AssertionError("a damaged compressed archive gave other samples, no error")
        if not compressed and len(edits) < 8 and _shape(got) != _shape(samples):
            raise AssertionError("one edit of a tar file gave other samples, no error")


def main():
    target = Target()
    if atheris is None:
        sys.exit(run_without_atheris(target, sys.argv[1:]))
    atheris.Setup(sys.argv, target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
