"""Streams: sources of records that have no length, read from the start each epoch.

A stream is any iterable that is not a container (no ``__len__``/``__getitem__``): a
PyTorch ``IterableDataset``, a Hugging Face streaming dataset, an object whose
``__iter__`` yields records, a generator (one epoch only: it cannot start over), or
``FileStream``: files (local or URLs) read one after the other. ``mapobs(f, stream)`` is a
stream of ``f`` applied to each record. How a loader reads a stream is in
``_loading/rounds.py``; this module says what a stream is and which records a rank reads::

    rank's records:  FileStream          -> the epoch's files [rank::world], read in turn
                     .shard() source -> source.shard(num_shards=world, index=rank)
                     any other       -> every world-th record, from the rank-th

URLs are read through fsspec (``pip install fsspec``, with ``aiohttp`` for HTTP), imported
only when a URL is opened. Every call into fsspec (opening, each read of up to 1 MiB,
closing) runs on a helper thread that the reader waits for at most ``timeout`` seconds,
whatever the filesystem: a server that accepts and never answers raises ``TimeoutError``
naming the URL instead of blocking the stream. A call that timed out is abandoned: its
helper thread ends when the filesystem's own timeout (or the server) ends the call. A
server that refuses the connection raises ``ConnectionRefusedError`` naming the URL
(fsspec's HTTP filesystem raises ``FileNotFoundError`` from the refusal).
"""

from __future__ import annotations

import collections.abc
import errno
import io
import itertools
import math
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, Any

from ._base.arguments import module_getattr
from ._base.randomness import Purpose, generator
from ._base.tree import children, replaced, walk_views
from ._storage.tarshards import tar_samples
from .obs import Container, numobs

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "FileStream",
    "check_ranks",
    "open_file",
    "rank_records",
    "stream_source",
    "tar_samples",
]

DEFAULT_TIMEOUT_S = 60.0  # longest wait for one call into fsspec (open, read, close)
_READ_BYTES = 1 << 20  # bytes asked of fsspec per read: one timed call per MiB


def _is_url(path: str | os.PathLike[str]) -> bool:
    return "://" in str(path)


def open_file(
    path: str | os.PathLike[str],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    storage_options: dict[str, Any] | None = None,
) -> IO[bytes]:
    """A binary file object for ``path``: a local file, or a URL through fsspec, opened
    with ``storage_options`` (the filesystem's keyword arguments: credentials, headers,
    ``client_kwargs``, ...). A URL's file raises ``TimeoutError`` naming it when opening,
    a read or closing takes more than ``timeout`` seconds, and ``ConnectionRefusedError``
    naming it when its server refuses the connection. Raises ``ImportError`` naming
    the package when a URL needs fsspec and it is missing, ``ValueError`` for a timeout
    that is not a positive number of seconds."""
    timeout = _check_timeout(timeout)
    if not _is_url(path):
        return open(path, "rb")
    try:
        import fsspec
    except ImportError:
        raise ImportError(f"reading {path} needs fsspec (pip install fsspec aiohttp)") from None
    url = str(path)
    opener = fsspec.open(url, "rb", **(storage_options or {}))
    remote = _timed(opener.open, timeout, f"opening {url}")
    return io.BufferedReader(_TimedFile(remote, url, timeout), buffer_size=_READ_BYTES)


def _timed(call: Callable[[], Any], timeout: float, what: str) -> Any:
    """``call()`` run on a helper thread, waited for at most ``timeout`` seconds. Raises
    ``TimeoutError`` naming ``what`` when it takes longer (the thread is abandoned: a
    blocked socket read cannot be interrupted from outside), ``ConnectionRefusedError``
    naming ``what`` when the server refused the connection, or what ``call`` raised."""
    outcome: list[tuple[bool, Any]] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # handed to the waiting thread, which raises it
            outcome.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=run, name="fastload-remote-read", daemon=True).start()
    if not done.wait(timeout):
        raise TimeoutError(
            f"{what}: no answer in {timeout:g} s (the server stalled or the network is "
            f"down); FileStream(..., timeout=) sets the limit"
        )
    ok, value = outcome[0]
    if ok:
        return value
    if _refused(value):
        raise ConnectionRefusedError(
            errno.ECONNREFUSED,
            f"{what}: the connection was refused (no server listens at that address and "
            f"port, or a firewall refuses it)",
        ) from value
    raise value


def _refused(error: BaseException) -> bool:
    """Whether ``error`` comes of a refused connection: filesystems wrap it (fsspec's
    HTTP one raises ``FileNotFoundError`` from aiohttp's error from it)."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, OSError) and cause.errno == errno.ECONNREFUSED:
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


class _TimedFile(io.RawIOBase):
    """A remote file whose every call is bounded by ``timeout`` seconds (``_timed``)."""

    def __init__(self, remote: IO[bytes], url: str, timeout: float) -> None:
        super().__init__()
        self._remote, self.name, self._timeout = remote, url, timeout

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        size = min(len(view), _READ_BYTES)  # a read of the whole file is one call a MiB
        data = _timed(lambda: self._remote.read(size), self._timeout, f"reading {self.name}")
        view[: len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        parts = []
        while part := self.read(_READ_BYTES):
            parts.append(part)
        return b"".join(parts)

    def close(self) -> None:
        if not self.closed:
            try:
                _timed(self._remote.close, self._timeout, f"closing {self.name}")
            except TimeoutError:
                pass  # nothing more is read from it: the stalled call is left to end
            super().close()


def _check_timeout(timeout: float) -> float:
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


class FileStream:
    """A stream of the records of several files, read one after the other:
    ``read(f)`` gives the records of one file from ``f``, a binary file object open on it.
    ``paths`` are local paths or URLs (``s3://``, ``gs://``, ``https://``, ... through
    fsspec), so every machine of a cluster can read one copy of a dataset.

    In a loader, the files are the unit of sharding (each rank reads its own) and of
    shuffling (a new file order each epoch with ``shuffle``), as webdataset's shards::

        stream = FileStream(["s3://bucket/train-000.tar", ...], read=tar_samples)
        lines = FileStream(glob.glob("data/*.jsonl"), read=lambda f: map(json.loads, f))

    URLs are opened with fsspec's ``storage_options`` (``{"anon": True}``, ``{"headers":
    {...}}``, ...), and every call into fsspec (opening, each read of up to 1 MiB)
    that takes more than ``timeout`` seconds raises ``TimeoutError`` naming the URL; a
    refused connection raises ``ConnectionRefusedError`` naming it.
    In a loader with ``on_error="skip"``, a file that fails to read (a timeout, a damaged
    tar file) is left out from where it failed and counted in ``stats()["skipped"]``.

    Raises ``ValueError`` for no paths or a timeout that is not a positive number of
    seconds, and ``TypeError`` when ``read`` is not callable.
    """

    def __init__(
        self,
        paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
        read: Callable[[IO[bytes]], Iterable[Any]],
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if isinstance(paths, (str, bytes, os.PathLike)):
            paths = [paths]
        self.paths = [os.fspath(p) if isinstance(p, os.PathLike) else p for p in paths]
        if not self.paths:
            raise ValueError("FileStream needs at least one path")
        if not callable(read):
            raise TypeError(f"read must be a callable f -> records, got {type(read).__name__}")
        self.read = read
        self.timeout = _check_timeout(timeout)
        if storage_options is not None and not isinstance(storage_options, dict):
            raise TypeError(
                f"storage_options must be a dict of fsspec options, got "
                f"{type(storage_options).__name__}"
            )
        self.storage_options = dict(storage_options or {})

    def records(self, path: str) -> Iterator[Any]:
        """The records of the file at ``path``."""
        with open_file(path, timeout=self.timeout, storage_options=self.storage_options) as f:
            yield from self.read(f)

    def __iter__(self) -> Iterator[Any]:
        for path in self.paths:
            yield from self.records(path)

    def __repr__(self) -> str:
        return (
            f"FileStream({len(self.paths)} files, read={getattr(self.read, '__name__', self.read)})"
        )


# The names of 0.2, with a DeprecationWarning.
__getattr__ = module_getattr(
    "fastload.streams", {"Shards": "FileStream", "open_shard": "open_file"}, globals()
)


def _is_torch_iterable(data: object) -> bool:
    """A PyTorch IterableDataset: a stream even when it has a ``__len__`` (its
    ``__getitem__`` is the base class's, which raises)."""
    data_module = sys.modules.get("torch.utils.data")
    base = getattr(data_module, "IterableDataset", None)
    return base is not None and isinstance(data, base)


def _is_stream(data: object) -> bool:
    if _is_torch_iterable(data):
        return True
    try:
        numobs(data)
        return False
    except TypeError:
        return isinstance(data, collections.abc.Iterable)


def stream_source(data: Container) -> Any:
    """The stream under ``data`` (itself, or under ``mapobs`` and the members of tuples
    and dicts), or None when ``data`` is a container. Raises ``ValueError`` when the
    members mix a stream with other data or with another stream."""
    leaves = [node for node in walk_views(data) if not children(node)]
    found = {id(leaf) for leaf in leaves if _is_stream(leaf)}
    if not found:
        return None
    streams = [leaf for leaf in leaves if id(leaf) in found]
    if len(found) > 1 or len(streams) != len(leaves):
        raise ValueError(
            "a loader reads one stream: its views (mapobs, tuples, dicts) "
            "must all be of the same stream, without containers beside it"
        )
    return streams[0]


def substitute(data: Container, source: Iterable[Any], records: Sequence[Any]) -> Any:
    """``data`` with the stream ``source`` replaced by the container ``records``: the
    views of a stream made views of one round of its records."""
    return replaced(data, source, records)


def is_one_shot(source: object) -> bool:
    """True for an iterator (a generator): it cannot start over for a new epoch."""
    return isinstance(source, collections.abc.Iterator)


def _shard_count(source: Any) -> int | None:
    count = getattr(source, "num_shards", None)
    if count is None:
        count = getattr(source, "n_shards", None)
    return count if isinstance(count, int) and callable(getattr(source, "shard", None)) else None


def _shard_records(
    source: FileStream, paths: list[str], on_skip: Callable[[str, Exception], None] | None
) -> Iterator[Any]:
    for path in paths:
        try:
            yield from source.records(path)
        except Exception as exc:
            if on_skip is None:
                raise
            on_skip(path, exc)


def check_ranks(source: Any, world: int) -> None:
    """Raises ``ValueError`` when ``source`` is ``FileStream`` of fewer files than ``world``
    ranks: each rank reads whole files."""
    if isinstance(source, FileStream) and len(source.paths) < world:
        raise ValueError(
            f"{len(source.paths)} files cannot be shared out over {world} ranks: "
            f"each rank reads whole files"
        )


def rank_records(
    source: Any,
    rank: int,
    world: int,
    seed: int,
    epoch: int,
    shuffle_files: bool,
    on_skip: Callable[[str, Exception], None] | None = None,
) -> Iterator[Any]:
    """The records of ``source`` that ``rank`` of ``world`` reads in ``epoch``, in order.
    ``FileStream`` are shared out by file (in a new order each epoch when ``shuffle_files``),
    a source with ``shard(num_shards, index)`` and a number of shards that ``world``
    divides by its own shards, anything else record by record (every rank reads it all).
    A source with ``set_epoch`` is told the epoch first (a Hugging Face dataset reshuffles
    its own files then). A file of a ``FileStream`` that raises is passed to ``on_skip(path,
    error)`` and left from there when ``on_skip`` is given, else the error propagates.
    Raises ``ValueError`` when there are fewer files than ranks."""
    set_epoch = getattr(source, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)
    check_ranks(source, world)
    if isinstance(source, FileStream):
        paths = source.paths
        if shuffle_files:
            rng = generator(seed, Purpose.FILE_ORDER, epoch)
            paths = [paths[k] for k in rng.permutation(len(paths))]
        return _shard_records(source, paths[rank::world], on_skip)
    if world == 1:
        return iter(source)
    count = _shard_count(source)
    if count is not None and count % world == 0:
        return iter(source.shard(num_shards=world, index=rank))
    return itertools.islice(iter(source), rank, None, world)
