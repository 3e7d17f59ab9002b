"""Tar files in webdataset's layout, read as a stream of samples, and checked.

What is checked, each where it can be (a failure raises ``LoadError`` naming the file):

- each member header, against its own checksum (``tarfile``'s check);
- the end of the archive: two blocks of zeros, then nothing but zeros (writers pad an
  archive to a whole record) up to the end of the file. A block of zeros followed by
  data is not the end: it is a header wiped out (or a second archive appended, whose
  members ``tarfile`` would leave unread), and raises, naming its offset. A file that
  ends before a header, inside a member or inside the end marker is cut short;
- a compressed file (``.tar.gz``, ``.tar.bz2``, ``.tar.xz``, ``.tar.zst`` on Python 3.14),
  by its compression's own check (``compressed.py``). Tar stores no check of member
  data: an uncompressed file's data is read as it is.

A compression's check covers a gzip member (usually the whole file) or a bz2 or xz block,
and is complete only at its end, so damage to a compressed file may be found after
samples it damaged were handed out: holding them back would take holding the whole file
in memory. What is done instead: the last sample is held until the end is checked (a
file that is whole gives every sample, a damaged one never gives its last), the error
says how many samples of the file were handed out before it, and a loader with the
default ``on_error="raise"`` stops there. With ``on_error="skip"`` the file is counted in
``stats()["skipped"]`` and its earlier samples stay delivered.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator
from typing import IO, Any

from fastload._storage.compressed import StreamError, decompressed
from fastload.errors import LoadError

__all__ = ["tar_samples"]

_TAIL_READ = 1 << 16  # bytes read at a time after the end-of-archive block

# The block of zeros that ends an archive (tarfile's, missing from typeshed's stubs).
_EOF_HEADER: type[Exception] = getattr(tarfile, "EOFHeaderError")  # noqa: B009


class _DamagedTar(Exception):
    """The archive is damaged or cut short; the message says how and at which byte."""


class _CheckedTarInfo(tarfile.TarInfo):
    """A tar header that tells the end of an archive (a block of zeros) from a header
    that is missing or damaged, where ``tarfile`` ends quietly after the first member."""

    @classmethod
    def fromtarfile(cls, tar: tarfile.TarFile) -> _CheckedTarInfo:
        try:
            return super().fromtarfile(tar)
        except _EOF_HEADER:
            raise  # a block of zeros: _check_end says whether it is the end
        except tarfile.HeaderError as exc:
            reason = str(exc) or type(exc).__name__
            raise _DamagedTar(
                f"no valid header or end-of-archive at byte {tar.offset:,} ({reason})"
            ) from None


def _check_end(tar: tarfile.TarFile) -> None:
    """Reads what follows the block of zeros at ``tar.offset`` that ended the members
    (through ``tar.fileobj``, which holds what was read ahead): nothing but zeros, at
    least one more block of them. Raises ``_DamagedTar``."""
    zeros, fileobj = tar.offset, tar.fileobj
    at = zeros + tarfile.BLOCKSIZE
    while fileobj is not None and (chunk := fileobj.read(_TAIL_READ)):
        data = chunk.lstrip(b"\0")
        if data:
            found = at + len(chunk) - len(data)
            raise _DamagedTar(
                f"a block of zeros at byte {zeros:,} is followed by data at byte "
                f"{found:,}: a member header wiped out, or a second archive appended"
            )
        at += len(chunk)
    if at < zeros + 2 * tarfile.BLOCKSIZE:
        raise _DamagedTar(f"its end-of-archive marker at byte {zeros:,} is cut short")


# What each compression's check covers: it fails at the end of that.
_CHECKS = {
    "gzip": "gzip data is checked at the end of each member, most often the whole file",
    "bz2": "bz2 data is checked at the end of each block, of up to 900 kB",
    "xz": "xz data is checked at the end of each block",
    "zstd": "zstd data is checked at the end of each frame",
    "lzma": "legacy lzma data carries no check",
}


def _samples_before(given: int, compression: str | None) -> str:
    """What an error in a compressed file says of the samples handed out before it."""
    if compression not in _CHECKS or given == 0:
        return ""
    samples = "sample" if given == 1 else "samples"
    return (
        f"; the {given:,} {samples} handed out before this may hold damaged bytes "
        f"({_CHECKS[compression]})"
    )


def tar_samples(f: IO[bytes]) -> Iterator[dict[str, Any]]:
    """The samples of a tar file in webdataset's layout, read as a stream: consecutive
    members that share a name up to the first dot of the file name form one sample, a
    dict ``{"__key__": name, ext: bytes, ...}`` (``a/b.jpg``, ``a/b.cls`` ->
    ``{"__key__": "a/b", "jpg": ..., "cls": ...}``). A gzip, bz2, xz (or, on Python 3.14,
    zstd) compressed file is told by its first bytes and checked by its compression's
    own check (gzip's CRC-32 and length, bz2's block CRCs, xz's block checks, a zstd
    frame's checksum where it has one).

    Raises ``fastload.LoadError`` (a ``ValueError``) naming the file: for a header that is
    damaged or wiped to zeros, a file cut short (even between two members) and data after
    the end-of-archive marker, with the byte offset in the (decompressed) archive, after
    the samples before the damage (the sample being read there is not yielded: it may be
    incomplete); for compressed data that is damaged or cut short, with the number of
    samples read from the file before. A compression's check is made at the end of what
    it covers (for gzip, the whole file), so samples it finds damaged may have been
    handed out already: the error says how many, and the last sample of a file is held
    until its end is checked. The checks cost little: zlib computes gzip's CRC-32 as it
    inflates (a 50 MB ``.tar.gz`` reads 3-13% slower than unchecked: docs/loader.md, Streams)."""
    name = str(getattr(f, "name", None) or "tar stream")
    sample: dict[str, Any] | None = None
    member: tarfile.TarInfo | None = None
    compression: str | None = None
    given = 0
    try:
        stream, compression = decompressed(f)
        with stream, tarfile.open(fileobj=stream, mode="r|", tarinfo=_CheckedTarInfo) as tar:
            for member in tar:
                if not member.isfile():
                    continue
                folder, file_name = os.path.split(member.name)
                stem, _, ext = file_name.partition(".")
                key = os.path.join(folder, stem)
                if sample is not None and sample["__key__"] != key:
                    yield sample
                    given += 1
                    sample = None
                if sample is None:
                    sample = {"__key__": key}
                sample[ext] = tar.extractfile(member).read()  # type: ignore[union-attr]
            _check_end(tar)
    except StreamError as exc:
        raise LoadError(
            f"{name}: {exc}{_samples_before(given, exc.format)}",
            source=name,
        ) from exc
    except _DamagedTar as exc:
        raise LoadError(
            f"{name}: not a complete tar file: {exc}; the file is truncated or damaged"
            f"{_samples_before(given, compression)}",
            source=name,
        ) from None
    except tarfile.ReadError as exc:
        where = "at its start" if member is None else f"in member {member.name!r}"
        offset = 0 if member is None else member.offset
        raise LoadError(
            f"{name}: not a complete tar file: {exc} {where} (header at byte {offset:,}); "
            f"the file is truncated or damaged{_samples_before(given, compression)}",
            source=name,
        ) from None
    if sample is not None:
        yield sample
