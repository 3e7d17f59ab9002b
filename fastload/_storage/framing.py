"""The framing of an Arrow IPC file or stream, checked before the file is mapped or read.

A file that is not Arrow IPC is refused after reading a few bytes of it, whatever its
size; one that is goes on to pyarrow, which reads what the framing points to::

    IPC file     "ARROW1" 00 00 | messages ... | footer | footer size (int32) | "ARROW1"
    IPC stream   ff ff ff ff | schema length (int32) | schema message | messages ...

Streams written before Arrow 0.15 (2019) begin with the schema length alone, without the
``ff ff ff ff`` marker; they are refused, with what to do.
"""

import os
import struct
from collections.abc import Callable

from fastload.errors import LoadError

__all__ = ["check_framing", "framing_of"]

MAGIC = b"ARROW1"
_CONTINUATION = b"\xff\xff\xff\xff"
_TAIL = 4 + len(MAGIC)  # footer size, closing magic
_HELP = (
    "fastload.open reads packed datasets (fastload.write) and Arrow IPC files or streams "
    "(pyarrow.ipc, Feather v2)"
)


def check_framing(fd: int, size: int, path: str) -> str:
    """``"file"`` or ``"stream"``: what the first and last bytes of the open file ``fd``
    (``size`` bytes, named ``path``) say it is; reads 18 bytes at most. Raises
    ``LoadError`` naming ``path`` for a file that is not Arrow IPC, or an IPC file whose
    end is missing (truncated)."""
    return framing_of(lambda n, offset: os.pread(fd, n, offset), size, path)


def framing_of(pread: Callable[[int, int], bytes], size: int, path: str) -> str:
    """``check_framing`` of the bytes that ``pread(n, offset)`` reads: the first 8 and
    the last 10 at most."""
    head = pread(8, 0)
    if head[: len(MAGIC)] == MAGIC:
        _check_file_end(pread, size, path)
        return "file"
    if head[:4] == _CONTINUATION and len(head) == 8:
        (length,) = struct.unpack("<i", head[4:])
        if 0 < length <= size - 8:
            return "stream"
        raise LoadError(
            f"{path}: an Arrow IPC stream whose schema message would take {length} bytes, in "
            f"a file of {size}: truncated or corrupt",
            source=path,
        )
    if len(head) >= 4 and 0 < struct.unpack("<i", head[:4])[0] <= size - 4:
        hint = (
            "; if it is an Arrow IPC stream written before Arrow 0.15, rewrite it with a "
            "current pyarrow"
        )
    else:
        hint = ""
    what = "an empty file" if size == 0 else f"it begins with {head!r}"
    raise LoadError(f"{path}: not an Arrow IPC file or stream ({what}); {_HELP}{hint}", source=path)


def _check_file_end(pread: Callable[[int, int], bytes], size: int, path: str) -> None:
    """An IPC file ends with its footer's size and the magic bytes, the footer within it."""
    tail = pread(_TAIL, max(size - _TAIL, 0)) if size >= 8 + _TAIL else b""
    if tail[4:] != MAGIC:
        raise LoadError(
            f"{path}: an Arrow IPC file without its closing magic bytes ({size} bytes): "
            f"truncated, or not fully written",
            source=path,
        )
    (footer,) = struct.unpack("<i", tail[:4])
    if not 0 < footer <= size - 8 - _TAIL:
        raise LoadError(
            f"{path}: an Arrow IPC file whose footer would take {footer} bytes, in a file "
            f"of {size}: corrupt",
            source=path,
        )
