"""A bounded local cache of the blocks of remote objects, shared by the processes of one
machine (ranks, workers): what reading a packed dataset at a URL keeps on disk.

Each cached block is one file, ``<directory>/<hash of object key>/<block>.blk``; the
object key names the object and its version (URL and ETag), so that blocks of two
versions never mix. ``BlockCache.get`` finds a block or fetches it::

    get(object_key, block, fetch, check)
      |-- <block>.blk there: map it, check it; good -> its bytes (mtime touched: LRU)
      |-- missing (or bad): lock <block>.lock (flock), then look again: another process
      |     may have fetched it meanwhile
      |-- fetch(), check(); a bad block is fetched again once, then LoadError
      |-- written to <block>.tmp, then os.replace'd to <block>.blk; lock released
      '-- evict the least recently used .blk files until the total is <= max_bytes
            (and remove the .tmp and .lock files that processes that died left)

Invariants, kept across processes:
- A ``.blk`` file is only ever created whole, by ``os.replace``, and never written
  after: a crash leaves at most a ``.tmp`` file, which no reader opens (the next eviction
  removes it), and a reader never sees a torn block.
- One process at a time fetches a given block: the one holding its ``flock``. The kernel
  releases the lock of a process that dies, so that a crash mid-fetch blocks nobody.
- Eviction unlinks: a reader that mapped a block keeps its bytes until it lets go of them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
import time
from collections.abc import Callable, Iterator

from ..errors import LoadError

Block = memoryview | bytes

_SUFFIX = ".blk"


class BlockCache:
    """Blocks of remote objects cached in ``directory``, at most ``max_bytes`` bytes of
    them (``.blk`` files; each file's size counts), the least recently used evicted first.
    ``max_bytes=0`` stores nothing and creates no directory: every ``get`` fetches.

    Several ``BlockCache`` objects, in several processes, may share one directory.
    Raises ValueError for a negative ``max_bytes``; LoadError when ``directory`` cannot
    be created.
    """

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes must be an int >= 0, not {max_bytes!r}")
        self.directory = os.fspath(directory)
        self.max_bytes = max_bytes
        if max_bytes > 0:
            self._makedirs(self.directory)

    def __repr__(self) -> str:
        return f"BlockCache({self.directory!r}, max_bytes={self.max_bytes})"

    def get(
        self,
        object_key: str,
        block: int,
        fetch: Callable[[], bytes],
        check: Callable[[Block], object],
    ) -> Block:
        """The bytes of block ``block`` of the object ``object_key``: from the cache when
        there and ``check(data)`` passes, else from ``fetch()`` (called by one process at a
        time for a given block), checked, then cached.

        ``check`` raises (any Exception) on a bad block: a bad cached block is deleted and
        fetched again; a fetched block that fails is fetched again once. Raises LoadError
        naming the object key and the block when the block is still bad after that, and
        LoadError naming the directory when the cache cannot be written. What ``fetch``
        raises goes through unchanged.

        Waits while another process fetches the same block (as long as its ``fetch``
        takes: that fetch's own timeout bounds the wait; a signal such as Ctrl-C wakes
        it). A block larger than ``max_bytes`` is returned and not kept.
        """
        if isinstance(block, bool) or not isinstance(block, int) or block < 0:
            raise ValueError(f"block must be an int >= 0, not {block!r}")
        if self.max_bytes == 0:
            return _fetch_checked(object_key, block, fetch, check, failures=0)
        path = self._block_path(object_key, block)
        failures, bad = 0, None
        seen = self._read(path)
        if seen is not None:
            data, bad = seen
            if _passes(check, data):
                return data
            failures = 1
        self._makedirs(os.path.dirname(path))
        with self._locked(path[: -len(_SUFFIX)] + ".lock"):
            seen = self._read(path)
            if seen is not None and seen[1] != bad:  # another process stored it meanwhile
                if _passes(check, seen[0]):
                    return seen[0]
                failures = 1
            if seen is not None:
                _unlink(path)
            data = _fetch_checked(object_key, block, fetch, check, failures)
            self._store(path, data)
        self._evict()
        return data

    def total_bytes(self) -> int:
        """The bytes of the blocks cached now (every process's)."""
        return sum(size for _, size, _ in self._files(_SUFFIX))

    # -- files ------------------------------------------------------------------------

    def _block_path(self, object_key: str, block: int) -> str:
        name = hashlib.sha256(object_key.encode()).hexdigest()[:32]
        return os.path.join(self.directory, name, f"{block}{_SUFFIX}")

    def _makedirs(self, folder: str) -> None:
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as error:
            raise self._unwritable(error) from error

    def _unwritable(self, error: OSError) -> LoadError:
        return LoadError(
            f"the block cache {self.directory!r} cannot be used ({error.strerror or error}):"
            f" pass cache_dir= a writable directory with room, or cache_bytes=0 to cache"
            f" nothing",
            source=self.directory,
        )

    def _read(self, path: str) -> tuple[Block, tuple[int, int]] | None:
        """The cached block at ``path`` (mapped) and its file's identity, its mtime set to
        now (the LRU order); None when there is none."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise self._unwritable(error) from error
        try:
            stat = os.fstat(fd)
            now = time.time_ns()
            os.utime(fd, ns=(now, now))
            data: Block = (
                memoryview(mmap.mmap(fd, 0, access=mmap.ACCESS_READ)) if stat.st_size else b""
            )
        finally:
            os.close(fd)
        return data, (stat.st_dev, stat.st_ino)

    def _store(self, path: str, data: bytes) -> None:
        """``data`` written whole to ``path`` (through a temporary file that the lock
        holder alone writes), or not at all."""
        temporary = path[: -len(_SUFFIX)] + ".tmp"
        try:
            with open(temporary, "wb") as file:
                file.write(data)
            now = time.time_ns()
            os.utime(temporary, ns=(now, now))
            os.replace(temporary, path)
        except OSError as error:
            with contextlib.suppress(OSError):  # the error that matters is raised below
                os.unlink(temporary)
            raise self._unwritable(error) from error

    @contextlib.contextmanager
    def _locked(self, lock_path: str, wait: bool = True) -> Iterator[bool]:
        """Holds the exclusive ``flock`` of ``lock_path`` and yields True; with
        ``wait=False``, yields False at once when another holds it. The holder unlinks the
        lock file before letting go, so that lock files do not pile up; a waiter that wakes
        holding the lock of an unlinked file tries again on the file now at the path."""
        while True:
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as error:
                raise self._unwritable(error) from error
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = os.fstat(fd)
                try:
                    now = os.stat(lock_path)
                except FileNotFoundError:
                    now = None
            except BlockingIOError:
                os.close(fd)
                yield False
                return
            except BaseException:
                os.close(fd)
                raise
            if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
                break
            os.close(fd)
        try:
            yield True
        finally:
            _unlink(lock_path)
            os.close(fd)

    # -- eviction ---------------------------------------------------------------------

    def _files(self, suffix: str) -> Iterator[tuple[int, int, str]]:
        """(mtime in ns, size, path) of every file of the cache whose name ends with
        ``suffix``."""
        with os.scandir(self.directory) as folders:
            for folder in folders:
                if not folder.is_dir(follow_symlinks=False):
                    continue
                with os.scandir(folder.path) as entries:
                    for entry in entries:
                        if not entry.name.endswith(suffix):
                            continue
                        try:
                            stat = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:  # removed meanwhile by another process
                            continue
                        yield stat.st_mtime_ns, stat.st_size, entry.path

    def _evict(self) -> None:
        """Removes what processes that died left (a ``.tmp`` or ``.lock`` file whose lock
        no one holds), then unlinks the least recently used blocks until the total is
        <= max_bytes. Processes evicting at once may evict a little more than needed,
        never less."""
        for _, _, path in [*self._files(".tmp"), *self._files(".lock")]:
            stem = path.rsplit(".", 1)[0]
            with self._locked(stem + ".lock", wait=False) as free:  # unlinks the lock file
                if free:
                    _unlink(stem + ".tmp")
        blocks = sorted(self._files(_SUFFIX))
        total = sum(size for _, size, _ in blocks)
        for _, size, path in blocks:
            if total <= self.max_bytes:
                break
            _unlink(path)
            total -= size


def _passes(check: Callable[[Block], object], data: Block) -> bool:
    try:
        check(data)
    except Exception:
        return False
    return True


def _fetch_checked(
    object_key: str,
    block: int,
    fetch: Callable[[], bytes],
    check: Callable[[Block], object],
    failures: int,
) -> bytes:
    """``fetch()`` until ``check`` passes, with two failed checks in all (``failures``
    already seen, from the cached copy) allowed before LoadError."""
    while True:
        data = fetch()
        try:
            check(data)
        except Exception as error:
            failures += 1
            if failures >= 2:
                raise LoadError(
                    f"block {block} of {object_key!r} is still bad after fetching it again:"
                    f" {type(error).__name__}: {error}",
                    source=object_key,
                ) from error
            continue
        return data


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
