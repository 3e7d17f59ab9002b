"""Files that change under a dataset's maps: found before what was read from them is used.

A file truncated (or rewritten in place) while it is memory-mapped cannot be read past its
new end; each of its maps is guarded (``_core.FileGuard``, ``csrc/mapguard.h``), so such
a read returns zeros instead of killing the process by SIGBUS, and counts a fault.
``MappedFiles.check()`` runs where fastload hands out what it read (a loader's batch,
``ds[i]``, a column's items, a checksum that does not match): once a fault was counted
anywhere (in this process or a worker process forked from it), it looks at all its files
and raises ``LoadError`` naming the one that shrank, and does so again at every later
check. Without a fault it looks at the files that hold the rows handed out (one ``fstat``
per file, through a descriptor of its own: the file that was opened, even when its path
names another one since), after they were read:

- smaller than mapped: it shrank (the page holding the new end is not cut but zeroed
  past it, and reads there raise no fault);
- another size or modification time than at open: rewritten in place (``cp new old``,
  ``rsync --inplace``, ``dd``), and what was read may be new bytes the checksums were
  never compared with: ``LoadError`` ("the file changed while it was open");
- the change time alone moved: the metadata changed (a rename, a mode, a link, the file
  replaced by rename or deleted, all harmless) or a rewrite set the modification time
  back (``cp -p``, ``rsync -t --inplace``, ``touch -r``). The two cannot be told apart:
  the file is counted in ``touches``, whose blocks the dataset's checksums then check
  again (``reader._BlockChecks``), and the new change time is taken as the file's.

A write that lands in a file's pages changes its modification time before the bytes
(``write(2)``; a write through a map, at its first store to a clean page), so a read
that saw new bytes is followed by a check that sees the new time, unless the change fell
within the filesystem's timestamp granularity of the change before the file's last
check (a jiffy, 1-10 ms, on Linux before 6.13; since, a time that was read is never
given again).
"""

import os
import threading

import numpy as np

from fastload import _core
from fastload.errors import LoadError

__all__ = ["MappedFiles", "changed_error", "file_state", "shrunk_error"]


def file_state(fd):
    """(size, modification time, change time; both in ns) of the open file ``fd``."""
    st = os.fstat(fd)
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


class MappedFiles:
    """The guarded maps of a dataset's files: ``opened``, each with ``path``, ``mapping``
    (the mmap), ``guard`` (its ``FileGuard``, None when the file was read into memory),
    ``base`` (its bytes as mapped), ``fd`` (a descriptor of the file) and ``state`` (its
    ``file_state`` when it was opened); ``file_bounds``: the rows of each file.
    ``touches[k]`` counts the times file k's change time moved alone, ``touched`` all."""

    def __init__(self, opened, file_bounds):
        self._opened = list(opened) if all(s.guard is not None for s in opened) else []
        self._bounds = file_bounds
        self._seen = _core.guarded_faults()
        self._states = [s.state for s in self._opened]
        self.touches = [0] * len(self._opened)
        self.touched = 0
        # Held while the files are checked after a fault and while a state is taken on.
        self._lock = threading.RLock()

    def __bool__(self):
        return bool(self._opened)

    def check(self, rows=None):
        """Raise ``LoadError`` naming a file that shrank under its map: any of them once a
        read past a file's end was answered with zeros (here or in a worker process), else
        those holding ``rows`` (a row, an array of rows; None: none), whose last page may
        have been read past the cut without a fault (the system zeroes the rest of it);
        or naming one of those that was rewritten in place since it was opened."""
        if not self._opened:
            return
        seen = _core.guarded_faults()
        if seen != self._seen:
            with self._lock:
                self._check(range(len(self._opened)))
                self._seen = seen
        elif rows is not None:
            self._check(self._files_of(rows))

    def check_mismatch(self, row):
        """A block of the file holding ``row`` does not match its checksum: raise what
        explains it, when something does (the file shrank, or changed since it was
        opened: its size, its modification time, or its change time alone)."""
        self.check(row)
        if not self._opened:
            return
        k = int(self._files_of(row)[0])
        if self.touches[k]:
            s = self._opened[k]
            raise changed_error(
                s.path,
                "its change time moved, its modification time was set back, and "
                "a block no longer matches its checksum",
            )

    def _files_of(self, rows):
        if len(self._opened) == 1:
            return [0]
        rows = np.atleast_1d(rows)
        return np.unique(np.searchsorted(self._bounds, rows, side="right") - 1)

    def _check(self, which):
        for k in which:
            k = int(k)
            s = self._opened[k]
            now = _state_now(s)
            if s.guard.faults or now is None or now[0] < s.base.size:
                raise shrunk_error(s.path, s.base.size, None if now is None else now[0])
            was = self._states[k]
            if now[:2] != was[:2]:
                raise changed_error(s.path, _what_changed(was, now))
            if now[2] != was[2]:
                with self._lock:
                    if self._states[k][2] != now[2]:
                        self._states[k] = now
                        self.touches[k] += 1
                        self.touched += 1


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


def changed_error(path, what):
    """The ``LoadError`` for file ``path``, rewritten in place since it was opened
    (``what``: how that shows)."""
    return LoadError(
        f"{path}: the file changed while it was open ({what}): it was rewritten in place "
        f"(cp, rsync --inplace, dd), and its bytes are no longer the ones it was opened and "
        f"checked with. Reopen it to read what it holds now (fastload.write replaces a file "
        f"by renaming a finished one over it, never in place, which open files do not see)",
        source=path,
    )


def _what_changed(was, now):
    if now[0] != was[0]:
        return f"{was[0]:,} bytes when opened, now {now[0]:,}"
    return "its modification time is not the one it had when opened"


def _state_now(file):
    """The ``file_state`` of the mapped file now (its own, even when its path names
    another file since), or None when the system cannot say."""
    try:
        return file_state(file.fd)
    except OSError:
        return None
