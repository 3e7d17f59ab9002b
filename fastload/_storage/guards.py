"""Files that shrink under a dataset's maps: found before what was read from them is used.

A file truncated (or rewritten in place) while it is memory-mapped cannot be read past its
new end; each of its maps is guarded (``_core.FileGuard``, ``csrc/mapguard.h``), so such
a read returns zeros instead of killing the process by SIGBUS, and counts a fault.
``MappedFiles.check()`` runs where fastload hands out what it read (a loader's batch,
``ds[i]``, a column's items, a checksum that does not match): once a fault was counted
anywhere (in this process or a worker process forked from it), it looks at its files'
sizes and raises ``LoadError`` naming the one that shrank, and does so again at every
later check. Without a fault it looks at the sizes of the files that hold the rows
handed out (one ``fstat`` per file): the page holding the new end is not cut but zeroed
past it, and reads there raise no fault.
"""

import threading

import numpy as np

from fastload import _core
from fastload.errors import LoadError

__all__ = ["MappedFiles", "shrunk_error"]


class MappedFiles:
    """The guarded maps of a dataset's files: ``opened``, each with ``path``, ``mapping``
    (the mmap), ``guard`` (its ``FileGuard``, None when the file was read into memory)
    and ``base`` (its bytes as mapped); ``file_bounds``: the rows of each file."""

    def __init__(self, opened, file_bounds):
        self._opened = list(opened) if all(s.guard is not None for s in opened) else []
        self._bounds = file_bounds
        self._seen = _core.guarded_faults()
        self._lock = threading.Lock()

    def __bool__(self):
        return bool(self._opened)

    def check(self, rows=None):
        """Raise ``LoadError`` naming a file that shrank under its map: any of them once a
        read past a file's end was answered with zeros (here or in a worker process), else
        those holding ``rows`` (a row, an array of rows; None: none), whose last page may
        have been read past the cut without a fault (the system zeroes the rest of it)."""
        if not self._opened:
            return
        seen = _core.guarded_faults()
        if seen != self._seen:
            with self._lock:
                self._check(range(len(self._opened)))
                self._seen = seen
        elif rows is not None:
            if len(self._opened) == 1:
                self._check([0])
            else:
                rows = np.atleast_1d(rows)
                self._check(np.unique(np.searchsorted(self._bounds, rows, side="right") - 1))

    def _check(self, which):
        for k in which:
            s = self._opened[int(k)]
            now = _size_now(s)
            if s.guard.faults or now is None or now < s.base.size:
                raise shrunk_error(s.path, s.base.size, now)


def shrunk_error(path, was, now):
    """The ``LoadError`` for file ``path``, mapped at ``was`` bytes, now ``now`` (None:
    unknown) bytes long."""
    size = "of unknown size" if now is None else f"{now:,} bytes long"
    return LoadError(
        f"{path}: the file shrank while it was read (mapped at {was:,} bytes, now {size}): "
        f"it was truncated or rewritten in place, and what lay past its new end cannot be "
        f"read. Open it again once it is whole (fastload.write replaces a file by renaming "
        f"a finished one over it, never in place)",
        source=path,
    )


def _size_now(file):
    """The size of the mapped file now (its own, even when its path names another file
    since), or None when the system cannot say."""
    try:
        return file.mapping.size()
    except (OSError, ValueError):
        return None
