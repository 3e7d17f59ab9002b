"""A compressed file read as a stream, checked by its compression's own integrity data.

``decompressed(f)`` tells the compression from the first bytes of ``f`` and gives its
decompressed bytes, through the standard library's readers, which check what each format
stores (``tarfile``'s stream mode checks none of it)::

    gzip  1f 8b          each member's CRC-32 and length (ISIZE) of its data
    bz2   "BZh"          each block's CRC-32 and the stream's combined CRC
    xz    fd "7zXZ" 00   the headers' CRC-32 and each block's check (CRC-64 by default)
    zstd  28 b5 2f fd    each frame's checksum, where its writer stored one (zstd's
                         command line does); Python 3.14's compression.zstd
    lzma  5d 00 00 80    the legacy .lzma format stores no check: read as it is
    anything else        not compressed: read as it is

Several streams one after the other (pigz, pbzip2) are read as one, and zeros after the
last gzip member are taken as padding, as gzip's tools take them. Damaged data raises
``StreamError`` (as soon as the decoder cannot go on, else where the check fails: at
the end of a gzip member, a bz2 block or an xz block), and so does a stream cut short; an
error of ``f`` itself (a timeout, a network error) propagates as it is. Reading the whole
stream is what completes the check: a reader that stops early has checked nothing after
the last complete block.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import sys
import zlib
from typing import IO, Any, cast

__all__ = ["StreamError", "decompressed"]

_HEAD_BYTES = 6  # enough to tell each format apart (xz's magic is the longest)

_DECODER_ERRORS: tuple[type[Exception], ...] = (OSError, EOFError, zlib.error, lzma.LZMAError)

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

# (magic bytes, name, the reader of a file object of that compression)
_FORMATS: list[tuple[bytes, str, Any]] = [
    (b"\x1f\x8b", "gzip", lambda source: gzip.GzipFile(fileobj=source, mode="rb")),
    (b"BZh", "bz2", bz2.BZ2File),
    (b"\xfd7zXZ\x00", "xz", lzma.LZMAFile),
    (b"\x5d\x00\x00\x80", "lzma", lzma.LZMAFile),
]
if sys.version_info >= (3, 14):
    from compression import zstd

    _FORMATS.append((_ZSTD_MAGIC, "zstd", zstd.ZstdFile))
    _DECODER_ERRORS += (zstd.ZstdError,)


class StreamError(Exception):
    """The compressed data cannot be read: damaged, cut short, or in a compression this
    Python does not read. ``format`` names the compression; the message says which, and
    what the decoder found."""

    def __init__(self, format: str, reason: str) -> None:
        super().__init__(reason)
        self.format = format


class _Source(io.RawIOBase):
    """The compressed bytes: ``head`` (read already, to tell the format), then the rest
    of ``f``. Keeps the error ``f`` raised, so that it is told apart from damage."""

    def __init__(self, head: bytes, f: IO[bytes]) -> None:
        super().__init__()
        self._head, self._f = head, f
        self.error: BaseException | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._head:
            size = min(len(view), len(self._head))
            view[:size], self._head = self._head[:size], self._head[size:]
            return size
        try:
            data = self._f.read(len(view))
        except BaseException as exc:
            self.error = exc
            raise
        view[: len(data)] = data
        return len(data)


class _Checked(io.RawIOBase):
    """The decompressed bytes of ``source`` through ``reader``, whose decoder's errors
    become ``StreamError`` (the source's own errors pass through)."""

    def __init__(self, reader: io.BufferedIOBase, source: _Source, format: str) -> None:
        super().__init__()
        self._reader, self._source, self.format = reader, source, format

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            return self._reader.readinto(buffer)
        except _DECODER_ERRORS as exc:
            if exc is self._source.error:
                raise
            if isinstance(exc, EOFError):
                reason = (
                    f"{self.format} data cut short: the file ends before its compressed data does"
                )
            else:
                reason = f"damaged {self.format} data: {type(exc).__name__}: {exc}"
            raise StreamError(self.format, reason) from exc

    def close(self) -> None:
        self._reader.close()
        super().close()


def _head(f: IO[bytes]) -> bytes:
    head = b""
    while len(head) < _HEAD_BYTES and (part := f.read(_HEAD_BYTES - len(head))):
        head += part
    return head


def decompressed(f: IO[bytes]) -> tuple[IO[bytes], str | None]:
    """The decompressed bytes of ``f`` and the name of its compression (None: not
    compressed, the bytes of ``f`` as they are). Closing the result leaves ``f`` open.
    Reading raises ``StreamError`` for damaged or cut data; ``f``'s own errors pass
    through. Raises ``StreamError`` at once for zstd data before Python 3.14."""
    head = _head(f)
    source = _Source(head, f)
    for magic, format, reader in _FORMATS:
        if head.startswith(magic):
            return cast(IO[bytes], _Checked(reader(source), source, format)), format
    if head.startswith(_ZSTD_MAGIC):
        raise StreamError("zstd", "zstd data: reading it needs Python 3.14 (compression.zstd)")
    return cast(IO[bytes], source), None
