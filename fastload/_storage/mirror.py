"""Where the bytes of an object at a URL are mirrored in this process: pages the kernel can
take back when it needs the memory, where the machine has a disk to put them on.

A ``Mirror`` is a shared map of the object's size. With a directory (the disk cache's), it
maps an unlinked sparse file there: the blocks written into it are file pages, which the
kernel writes back to that disk and may then reclaim under memory pressure, reading them
again on the next access, so a dataset kept for later epochs costs page cache, not
memory the training process needs. Without one (``cache_bytes=0``: nothing written to
disk), or where the directory cannot hold such a file, it is anonymous shared memory, as
the kernel can only swap out.

Either way the map is shared with worker processes forked later, and a range of it is
let go with ``MADV_REMOVE`` (its pages freed; in the file, a hole punched). The space a
block takes in the file is reserved before the block is written (``reserve``), so that a
full disk is a ``LoadError`` naming the directory, never a ``SIGBUS`` on a page written.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import weakref

from fastload.errors import LoadError

__all__ = ["Mirror"]

_MADV_REMOVE = getattr(mmap, "MADV_REMOVE", None)


class Mirror:
    """A shared map of ``size`` bytes (``mapping``): an unlinked file in ``directory``
    (``backed``) when there is one that can hold it, else anonymous memory."""

    def __init__(self, size: int, directory: str | None = None) -> None:
        self.size, self.directory = size, directory
        self._fd: int | None = None
        mapping = self._file_map() if directory is not None else None
        self.mapping: mmap.mmap = mapping if mapping is not None else mmap.mmap(-1, max(size, 1))

    @property
    def backed(self) -> bool:
        """True when the pages are a file's: the kernel may reclaim them."""
        return self._fd is not None

    def disk_bytes(self) -> int:
        """The bytes the file takes on its disk now (0 for anonymous memory): what was
        written and not let go, in whole file system blocks."""
        return 0 if self._fd is None else os.fstat(self._fd).st_blocks * 512

    def reserve(self, start: int, end: int, url: str) -> None:
        """Make room in the file for bytes [start, end) before they are written. Raises
        LoadError naming the directory and ``url`` when its disk has none."""
        if self._fd is None or end <= start:
            return
        try:
            os.posix_fallocate(self._fd, start, end - start)
        except OSError as exc:
            raise LoadError(
                f"{self.directory}: no room for the blocks of {url} ({exc}): pass cache_dir= "
                f"a writable directory with room, or cache_bytes=0",
                source=url,
            ) from exc

    def _file_map(self) -> mmap.mmap | None:
        """The map of an unlinked sparse file of ``size`` bytes in ``directory``; None when
        it cannot be made there, or its ranges cannot be let go (``MADV_REMOVE``)."""
        if _MADV_REMOVE is None or not hasattr(os, "posix_fallocate"):
            return None
        try:
            fd, path = tempfile.mkstemp(prefix=".fastload-mirror-", dir=self.directory)
        except OSError:
            return None
        try:
            os.unlink(path)  # gone with the last descriptor and map of it
            os.ftruncate(fd, max(self.size, 1))
            mapping = mmap.mmap(fd, max(self.size, 1))
            # A file system that punches holes: else what is let go would stay on disk.
            mapping.madvise(_MADV_REMOVE, 0, min(mmap.PAGESIZE, len(mapping)))
        except OSError:
            os.close(fd)
            return None
        self._fd = fd
        weakref.finalize(self, os.close, fd)
        return mapping
