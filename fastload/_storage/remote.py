"""Objects in object storage (S3, GCS, HTTP, any fsspec URL) read by byte ranges: what
reading a packed dataset at a URL block by block stands on.

A ``RemoteObject`` is one object, opened once: its size and version (the ETag, else the
modification time and size) are read at open, and every read after is checked against
them, so that bytes of two versions of an object never mix::

    read_ranges([(start, end), ...])     each range: a request, retried on its own
      |-- several requests in flight (an async store: its event loop; else a thread pool)
      |-- transient failure (refused or reset connection, 5xx, 429, timeout): backoff
      |     with jitter, then again, all within one deadline (``timeout``)
      |-- refused credentials (401, 403): LoadError at once
      |-- a short answer: tried again up to SHORT_TRIES times in all, then taken for an
      |     object that shrank: LoadError, "reopen it"
      |-- another version, or longer than asked: LoadError at once, "reopen it"
      '-- the version checked after the reads (HTTP: with them, through If-Match)

fsspec and the store's own library (s3fs, aiohttp, ...) are imported when an object is
opened, never by ``import fastload``; nothing touches the network before that.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import mmap
import os
import random
import re
import struct
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from ..errors import LoadError
from .manifest import MANIFEST, committed_names

T = TypeVar("T")

# The suffixes of packed dataset files (fastload.storage.reader.SUFFIXES, which sits in a
# layer above this one).
SUFFIXES = (".arrow", ".arrows", ".feather", ".ipc")

# Bytes of the shared record of the last outage (when, the message's length, the message).
_DOWN_BYTES = 4096

# Answers shorter than their range taken, per range, before the object is taken to have
# shrunk since it was opened (a store without versions cannot say so otherwise): a short
# answer is most often a fault of the answer, fetched again, but one that keeps coming is
# the object's new size.
SHORT_TRIES = 8

# Requests in flight at once per ``read_ranges`` call.
MAX_CONCURRENCY = 8

# Backoff between tries, in seconds: the first delay, doubled each try up to the cap, each
# delay drawn uniformly below that bound (full jitter), so that many clients that failed
# together do not come back together.
BACKOFF_FIRST_S = 0.05
BACKOFF_CAP_S = 2.0

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")

# Exception classes of the stores' libraries that mean "the connection failed, try again",
# by name, so that none of these libraries is imported to test for them (aiohttp's, then
# botocore's).
_TRANSIENT_NAMES = frozenset(
    {
        "ClientConnectionError",
        "ClientPayloadError",
        "ServerTimeoutError",
        "HTTPClientError",
        "ConnectionClosedError",
        "EndpointConnectionError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
    }
)


def is_url(path: object) -> bool:
    """True for a URL of a store (``s3://bucket/key``, ``https://host/file``, ``gs://...``,
    any ``scheme://``), False for a local path. ``file://`` URLs count as local: a file on
    this machine is mapped, not fetched by ranges."""
    return (
        isinstance(path, str) and bool(_URL.match(path)) and not path.lower().startswith("file://")
    )


class _Changed(Exception):
    """The object is not the one opened (shorter, another version, gone): not retried."""


class _NoRanges(Exception):
    """The server sent the whole object for a range: it does not answer byte ranges."""


class _Short(Exception):
    """The server sent fewer bytes than the range holds: a fault of the answer, retried."""


class Retries:
    """Calls to a store for ``url``, tried again after transient failures (backoff with
    jitter) within a deadline; what ends them raised as ``LoadError`` naming the URL."""

    def __init__(self, url: str, timeout: float) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        self.url = url
        self.timeout = float(timeout)
        self._random = random.Random()
        # When the store last gave no answer (or refused the connection) within
        # ``timeout``, and the message: a read started within ``timeout`` after it fails at
        # once with it, so that reads that follow one another (a probe, a loader's fetch,
        # a worker process's, a check) tell of one outage once, within ``timeout``. In
        # memory shared with the worker processes forked later, which wait for each
        # other's fetches.
        self._down = mmap.mmap(-1, _DOWN_BYTES)

    def call(self, fetch: Callable[[], T]) -> T:
        """``fetch()``, tried again within ``timeout`` seconds after transient failures."""
        return self._retry_sync(fetch, time.monotonic() + self.timeout, None)

    def _retry_sync(
        self, fetch: Callable[[], T], deadline: float, where: tuple[int, int] | None
    ) -> T:
        attempt = shorts = 0
        while True:
            try:
                if deadline - time.monotonic() <= 0:
                    raise TimeoutError(f"no answer within {self.timeout:g} s")
                return fetch()
            except Exception as error:
                shorts += isinstance(error, _Short)
                delay = self._next_delay(error, attempt, shorts, deadline, where)
            time.sleep(delay)
            attempt += 1

    def _next_delay(
        self,
        error: Exception,
        attempt: int,
        shorts: int,
        deadline: float,
        where: tuple[int, int] | None,
    ) -> float:
        """The pause before trying again after ``error`` (try ``attempt``, counted from 0,
        the ``shorts``-th short answer of this range), or the error to raise: a LoadError
        (FileNotFoundError for a missing object at open)."""
        status = _status(error)
        if isinstance(error, _NoRanges):
            raise self._error(
                where,
                f"{error}: the server does not answer byte ranges. Serve the dataset with one "
                f"that does (an S3-compatible store, nginx, Caddy: docs/remote.md, 'Serving "
                f"over HTTP'), or copy it to a local disk",
            ) from error
        if isinstance(error, _Changed):
            raise self._error(
                where, f"{error}: the object changed since it was opened, reopen it"
            ) from error
        if isinstance(error, _Short) and shorts >= SHORT_TRIES:
            raise self._error(
                where,
                f"{error}, {shorts} times: the object changed since it was opened (shorter "
                f"than when it was opened), reopen it",
            ) from error
        if status in (401, 403) or _any(error, PermissionError):
            raise self._error(where, f"access refused: {_describe(error)}") from error
        if status in (412, 416):
            raise self._error(
                where, f"the object changed since it was opened, reopen it ({_describe(error)})"
            ) from error
        if isinstance(error, FileNotFoundError) and status in (None, 404, 410):
            if where is None:
                raise FileNotFoundError(f"no such object: {self.url!r}") from error
            raise self._error(where, "the object is gone since it was opened: reopen it") from error
        if not _transient(error, status):
            raise self._error(where, _describe(error)) from error
        delay = self._random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_FIRST_S * 2**attempt))
        if time.monotonic() + delay >= deadline:
            message = (
                f"gave up after {attempt + 1} attempt(s) in {self.timeout:g} s: "
                f"{_reason(error, self.timeout)}"
            )
            if _no_answer(error, status):
                raise self._gave_up(where, message) from error
            raise self._error(where, message) from error
        return delay

    def _gave_up(self, where: tuple[int, int] | None, message: str) -> LoadError:
        """The error of a store that gave no answer (or refused the connection) within
        ``timeout``, remembered: an outage, told to the reads that follow within
        ``timeout``. Answers that came (a status, a short body) are not remembered."""
        error = self._error(where, message)
        text = str(error).encode()[: _DOWN_BYTES - 12]
        self._down[12 : 12 + len(text)] = text
        struct.pack_into("<dI", self._down, 0, time.monotonic(), len(text))
        return error

    def _still_down(self) -> None:
        """Raise the last ``_gave_up`` error (of any process) when it came less than
        ``timeout`` ago."""
        when, length = struct.unpack_from("<dI", self._down, 0)
        if length and time.monotonic() - when < self.timeout:
            message = bytes(self._down[12 : 12 + length]).decode(errors="replace")
            raise LoadError(
                f"{message} (the store failed less than {self.timeout:g} s ago)",
                source=self.url,
            )

    def _error(self, where: tuple[int, int] | None, message: str) -> LoadError:
        what = "opening" if where is None else f"reading bytes {where[0]}-{where[1]} of"
        return LoadError(f"{what} {self.url!r}: {message}", source=self.url)


class RemoteObject(Retries):
    """One object at ``url`` in a store that fsspec can open
    (``fsspec.core.url_to_fs(url, **storage_options)``), read by byte ranges.

    ``size`` (bytes) and ``version`` (the ETag, else the modification time and size) are
    read once, here. ``timeout`` (seconds) bounds each call, its retries included: the
    open, and each ``read_ranges``. Raises FileNotFoundError naming the URL when there is
    no such object, LoadError when the store cannot be reached within ``timeout`` or
    refuses the credentials.
    """

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        timeout: float = 60.0,
        _fs: Any = None,
        _info: Mapping[str, Any] | None = None,
    ) -> None:
        Retries.__init__(self, url, timeout)
        self._options = dict(storage_options or {})
        self._pid = os.getpid()
        if _fs is None:
            from fsspec.core import url_to_fs

            _fs, self._path = url_to_fs(url, **dict(storage_options or {}))
        else:
            self._path = _fs._strip_protocol(url)
        self._fs = _fs
        self._async = bool(getattr(_fs, "async_impl", False))
        self._http = type(_fs).__name__ == "HTTPFileSystem"
        self._s3 = type(_fs).__name__ == "S3FileSystem"
        info = _info if _info is not None else self._stat(time.monotonic() + self.timeout)
        if info.get("type", "file") != "file" or info.get("size") is None:
            raise FileNotFoundError(f"{url!r} is not an object of known size (a directory?)")
        self.size = int(info["size"])
        self.etag: str | None = _etag(info)
        self.version = self.etag or f"{_mtime(info)}/{self.size}"

    def __repr__(self) -> str:
        return f"RemoteObject({self.url!r}, size={self.size}, version={self.version!r})"

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The bytes of each ``(start, end)`` range (end excluded), in order, fetched with
        up to MAX_CONCURRENCY requests in flight. Each result has exactly ``end - start``
        bytes.

        Raises ValueError for a range outside ``[0, size]``; LoadError naming the URL and
        the byte range when a read fails for good (after retries within ``timeout``
        seconds for transient failures, at once for refused credentials) or when the
        object changed since it was opened.
        """
        ranges = [(int(start), int(end)) for start, end in ranges]
        self._after_fork()
        for start, end in ranges:
            if not 0 <= start <= end <= self.size:
                raise ValueError(
                    f"byte range {start}-{end} is outside {self.url!r} ({self.size} bytes)"
                )
        wanted = [(s, e) for s, e in ranges if e > s]  # stores differ on empty ranges
        if not wanted:
            return [b"" for _ in ranges]
        self._still_down()
        deadline = time.monotonic() + self.timeout
        if self._async:
            from fsspec.asyn import sync

            # sync()'s own timeout only backs up _gather's deadline, which cancels the
            # requests on the loop (a request abandoned by sync() would run on).
            chunks = sync(self._fs.loop, self._gather, wanted, deadline, timeout=self.timeout + 5)
        else:
            chunks = self._pool(wanted, deadline)
        if not self._conditional():
            self._check_version(deadline, wanted)
        fetched = iter(chunks)
        return [next(fetched) if e > s else b"" for s, e in ranges]

    def _after_fork(self) -> None:
        """In a process forked since the object was opened (a worker process), a
        filesystem of its own: an asynchronous one's event loop stayed in the parent."""
        if os.getpid() == self._pid:
            return
        from fsspec.core import url_to_fs

        options = {**self._options, "skip_instance_cache": True}
        self._fs, self._path = url_to_fs(self.url, **options)
        self._pid = os.getpid()

    # -- reading -------------------------------------------------------------------------

    async def _gather(self, ranges: list[tuple[int, int]], deadline: float) -> list[bytes]:
        """The ranges' bytes; the first failure cancels the requests still running."""
        gate = asyncio.Semaphore(MAX_CONCURRENCY)

        async def one(start: int, end: int) -> bytes:
            async with gate:
                fetch = lambda: self._fetch_async(start, end)
                return await self._retry_async(fetch, deadline, (start, end))

        tasks = [asyncio.ensure_future(one(s, e)) for s, e in ranges]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception()]
        finally:
            for task in tasks:
                task.cancel()
            # The cancelled requests close their connections before the call returns.
            await asyncio.gather(*tasks, return_exceptions=True)
        if failed:
            failed[0].result()  # raises its exception
        return [t.result() for t in tasks]

    async def _fetch_async(self, start: int, end: int) -> bytes:
        if self._s3 and self._conditional():
            return _exact(await self._fetch_s3(start, end), start, end, self.size)
        kwargs: dict[str, Any] = {}
        if self._conditional():
            headers = dict(getattr(self._fs, "kwargs", {}).get("headers") or {})
            headers["If-Match"] = self.etag
            kwargs["headers"] = headers
        data = await self._fs._cat_file(self._path, start=start, end=end, **kwargs)
        return _exact(bytes(data), start, end, self.size)

    def _pool(self, ranges: list[tuple[int, int]], deadline: float) -> list[bytes]:
        def one(start: int, end: int) -> bytes:
            fetch = lambda: _exact(
                bytes(self._fs.cat_file(self._path, start=start, end=end)), start, end, self.size
            )
            return self._retry_sync(fetch, deadline, (start, end))

        workers = min(MAX_CONCURRENCY, len(ranges))
        pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="fastload-fetch")
        try:
            futures = [pool.submit(one, s, e) for s, e in ranges]
            left = max(0.0, deadline - time.monotonic())
            concurrent.futures.wait(futures, left, concurrent.futures.FIRST_EXCEPTION)
            for future in futures:  # the first failure, in the order of the ranges
                if future.done() and future.exception() is not None:
                    future.result()
            if not all(f.done() for f in futures):
                start, end = ranges[next(k for k, f in enumerate(futures) if not f.done())]
                raise self._gave_up((start, end), f"no answer within {self.timeout:g} s")
            return [f.result() for f in futures]
        finally:
            # A call stuck in the store's library cannot be interrupted: its thread ends
            # when that call returns, and its result is dropped.
            pool.shutdown(wait=False, cancel_futures=True)

    # -- retries -------------------------------------------------------------------------

    async def _retry_async(
        self, fetch: Callable[[], Awaitable[T]], deadline: float, where: tuple[int, int] | None
    ) -> T:
        attempt = shorts = 0
        while True:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError(f"no answer within {self.timeout:g} s")
                try:
                    return await asyncio.wait_for(fetch(), left)
                except asyncio.TimeoutError:
                    raise TimeoutError(f"no answer within {self.timeout:g} s") from None
            except Exception as error:
                shorts += isinstance(error, _Short)
                delay = self._next_delay(error, attempt, shorts, deadline, where)
            await asyncio.sleep(delay)
            attempt += 1

    # -- the version ---------------------------------------------------------------------

    async def _fetch_s3(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the opened version of an S3 object (``IfMatch``: 412 when
        it changed), through s3fs's client."""
        bucket, key, _ = self._fs.split_path(self._path)
        answer = await self._fs._call_s3(
            "get_object",
            Bucket=bucket,
            Key=key,
            Range=f"bytes={start}-{end - 1}",
            IfMatch=self.etag,
        )
        try:
            return bytes(await answer["Body"].read())
        finally:
            answer["Body"].close()

    def _conditional(self) -> bool:
        """True when each read asks the store for the opened version (HTTP's If-Match, S3's
        IfMatch): then no check after the reads is needed."""
        return (self._http or self._s3) and self.etag is not None

    def _stat(self, deadline: float, where: tuple[int, int] | None = None) -> Mapping[str, Any]:
        """The store's description of the object (a fresh one, not a cached listing)."""
        self._fs.invalidate_cache(self._path)
        if self._async:
            from fsspec.asyn import sync

            async def stat() -> Mapping[str, Any]:
                info: Mapping[str, Any] = await self._retry_async(
                    lambda: self._fs._info(self._path), deadline, where
                )
                return info

            result: Mapping[str, Any] = sync(self._fs.loop, stat, timeout=self.timeout + 5)
            return result
        return self._retry_sync(lambda: self._fs.info(self._path), deadline, where)

    def _check_version(self, deadline: float, ranges: list[tuple[int, int]]) -> None:
        where = (min(s for s, _ in ranges), max(e for _, e in ranges))
        info = self._stat(deadline, where)
        size, etag = info.get("size"), _etag(info)
        version = etag or f"{_mtime(info)}/{size}"
        if size != self.size or version != self.version:
            raise self._error(
                where,
                f"the object changed since it was opened, reopen it (version {self.version!r}, "
                f"{self.size} bytes; now {version!r}, {size} bytes)",
            )


def resolve_urls(
    url: str, storage_options: Mapping[str, Any] | None = None, *, timeout: float = 60.0
) -> list[RemoteObject]:
    """The objects ``url`` names, opened: itself; the dataset files of a "directory"
    prefix (those its manifest lists, when it has one: ``manifest.py``; else names ending
    in .arrow, .arrows, .feather or .ipc, not starting with a dot, sorted by name); or a
    glob's matches (``s3://bucket/train-*.arrow``), sorted. A URL ending in "/" is a
    directory. Raises FileNotFoundError naming the URL when there are
    none, LoadError naming it when the store refuses the credentials or cannot be reached
    within ``timeout`` seconds (transient failures tried again until then).
    """
    from fsspec.core import url_to_fs

    fs, path = url_to_fs(url, **dict(storage_options or {}))
    protocol = url.split("://", 1)[0]
    store = Retries(url, timeout)
    if any(c in path for c in "*?["):
        found = store.call(lambda: fs.glob(path, detail=True))
        infos = [
            found[name]
            for name in sorted(found)
            if found[name].get("type") == "file" and not _base(name).startswith(".")
        ]
        if not infos:
            raise FileNotFoundError(f"no objects match {url!r}")
    else:
        info = None if url.endswith("/") else store.call(lambda: _info_or_none(fs, path))
        if info is not None and info.get("type", "file") == "file":
            return [RemoteObject(url, storage_options, timeout=timeout, _fs=fs, _info=info)]
        listing = store.call(lambda: _listing_or_none(fs, path))
        if listing is None:
            raise FileNotFoundError(f"no such object or directory: {url!r}")
        infos = _committed(url, fs, path, listing, store) or sorted(
            (i for i in listing if i.get("type") == "file" and _is_dataset_file(i["name"])),
            key=lambda i: str(i["name"]),
        )
        if not infos:
            raise FileNotFoundError(f"no dataset files ({', '.join(SUFFIXES)}) under {url!r}")
    return [
        RemoteObject(
            _unstrip(protocol, i["name"]),
            storage_options,
            timeout=timeout,
            _fs=fs,
            _info=i if i.get("size") is not None else None,  # HTTP lists no sizes
        )
        for i in infos
    ]


def _committed(
    url: str, fs: Any, path: str, listing: list[Mapping[str, Any]], store: Retries
) -> list[Mapping[str, Any]] | None:
    """The objects of the prefix ``url`` that its manifest lists, in partition order; None
    for a prefix without manifest or parts (``manifest.committed_names``)."""
    files = {_base(i["name"]): i for i in listing if i.get("type") == "file"}
    manifest = f"{path.rstrip('/')}/{MANIFEST}"
    names = committed_names(files, lambda: store.call(lambda: fs.cat_file(manifest)), url)
    return None if names is None else [files[name] for name in names]


def _info_or_none(fs: Any, path: str) -> Mapping[str, Any] | None:
    try:
        info: Mapping[str, Any] = fs.info(path)
    except FileNotFoundError:
        return None
    return info


def _listing_or_none(fs: Any, path: str) -> list[Mapping[str, Any]] | None:
    try:
        listing: list[Mapping[str, Any]] = fs.ls(path, detail=True)
    except FileNotFoundError:
        return None
    return listing


def _base(name: str) -> str:
    return name.rstrip("/").rsplit("/", 1)[-1]


def _is_dataset_file(name: str) -> bool:
    return _base(name).endswith(SUFFIXES) and not _base(name).startswith(".")


def _unstrip(protocol: str, name: str) -> str:
    """The URL of ``name`` as ``fs`` lists it (HTTP lists full URLs, s3fs bucket/key)."""
    return name if is_url(name) else f"{protocol}://{name}"


def _exact(data: bytes, start: int, end: int, size: int) -> bytes:
    """``data``, when it is the ``end - start`` bytes asked for; else raises what its length
    says: the whole object (``size`` bytes: no range support), fewer bytes (a short answer,
    tried again), more (the object changed)."""
    if len(data) == end - start:
        return data
    if len(data) == size:
        raise _NoRanges(f"the whole object ({size} bytes) came back for a range of {end - start}")
    if len(data) < end - start:
        raise _Short(f"a short answer: {len(data)} bytes came back for a range of {end - start}")
    raise _Changed(f"{len(data)} bytes came back for a range of {end - start}")


def _etag(info: Mapping[str, Any]) -> str | None:
    for key in ("ETag", "etag", "Etag"):
        if info.get(key):
            return str(info[key])
    return None


def _mtime(info: Mapping[str, Any]) -> str:
    for key in ("LastModified", "Last-Modified", "last_modified", "mtime", "updated", "created"):
        if info.get(key) is not None:
            return str(info[key])
    return "?"


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and the exceptions it was raised from or during, nearest first."""
    seen: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and e not in seen:
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


def _any(error: BaseException, kind: type[BaseException]) -> bool:
    return any(isinstance(e, kind) for e in _chain(error))


def _status(error: BaseException) -> int | None:
    """The HTTP status of the store's answer in ``error``'s chain, if it has one (aiohttp
    keeps it as ``status``, botocore in ``response``)."""
    for e in _chain(error):
        status = getattr(e, "status", None)
        if isinstance(status, int):
            return status
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(code, int):
                return code
    return None


def _transient(error: BaseException, status: int | None) -> bool:
    if isinstance(error, _Short):
        return True
    if status is not None:
        return status >= 500 or status in (408, 429)
    for e in _chain(error):
        if isinstance(e, (ConnectionError, TimeoutError, asyncio.TimeoutError)):
            return True
        if any(c.__name__ in _TRANSIENT_NAMES for c in type(e).__mro__):
            return True
    return False


# Of _TRANSIENT_NAMES, those that mean no answer came (not a fault of an answer, as a body
# cut short is).
_NO_ANSWER_NAMES = _TRANSIENT_NAMES - {"ClientPayloadError", "HTTPClientError"}


def _no_answer(error: BaseException, status: int | None) -> bool:
    """True when ``error`` means the store gave no answer or refused the connection: an
    outage, as against an answer that came wrong (a status, a short or cut body)."""
    if status is not None or isinstance(error, _Short):
        return False
    for e in _chain(error):
        if isinstance(e, (ConnectionError, TimeoutError, asyncio.TimeoutError)):
            return True
        if any(c.__name__ in _NO_ANSWER_NAMES for c in type(e).__mro__):
            return True
    return False


def _reason(error: BaseException, timeout: float) -> str:
    """Why the last try failed, in words: the connection refused, no answer, or the
    error."""
    chain = _chain(error)
    if any(
        isinstance(e, ConnectionRefusedError)
        or getattr(e, "errno", None) == errno.ECONNREFUSED
        or "connection refused" in str(e).lower()
        for e in chain
    ):
        return f"the connection was refused: is the server up at this address? ({_describe(error)})"
    if any(isinstance(e, (TimeoutError, asyncio.TimeoutError)) for e in chain):
        return f"no answer within {timeout:g} s ({_describe(error)})"
    return _describe(error)


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
