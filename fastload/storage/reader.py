"""Opening packed datasets (and any Arrow IPC file): memory-mapped, zero copy.

pyarrow is used at open time only, to parse the file and locate the buffers; items are
then read through numpy views of the mapped file.
"""

from __future__ import annotations

import builtins
import contextlib
import glob
import mmap
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt

from fastload import _core
from fastload._base.arguments import RenamedKeys, renamed_attribute
from fastload._base.protocols import PackedRows
from fastload._storage.arrow_types import arrow_type, import_pyarrow
from fastload._storage.checksums import META_CHECKSUMS, file_checksums
from fastload._storage.feeds import RowFeed
from fastload._storage.fields import Bytes, Encoding, Raw, Scalar, Str
from fastload._storage.filepages import FilePages
from fastload._storage.framing import check_framing
from fastload._storage.guards import MappedFiles, file_state, shrunk_error
from fastload._storage.manifest import committed_folder
from fastload._storage.memory import memory_limit
from fastload._storage.meta import (
    META_FIELDS,
    META_FORMAT,
    read_blocks,
    read_fields,
    read_source_field,
    read_user,
)
from fastload._storage.progress import progress_bar
from fastload._storage.remote import is_url
from fastload.errors import LoadError
from fastload.obs import Index, is_batch_index, normalize_index
from fastload.storage.columns import (
    EncodedColumn,
    Piece,
    RawArray,
    RawColumn,
    ScalarArray,
    shape_list,
)

__all__ = ["Dataset", "open", "resolve_files"]

SUFFIXES = (".arrow", ".arrows", ".feather", ".ipc")
# A map keeps a descriptor of its file unless told not to (Python 3.13): the dataset keeps
# one of its own (``_OpenedFile.fd``).
_UNTRACKED = {"trackfd": False} if sys.version_info >= (3, 13) else {}
CACHES = ("os", "memory")
VERIFY = ("read", "open", None)


def open(
    path: str | os.PathLike[str],
    *,
    cache: Literal["os", "memory"] = "os",
    verify: Literal["read", "open"] | None = "read",
    storage_options: Mapping[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_bytes: int | None = None,
    memory_bytes: int | None = None,
    timeout: float = 60.0,
) -> Dataset:
    """Open a packed dataset: a file, a directory of files (``*.arrow``, ``*.ipc``,
    ``*.feather``, ``*.arrows``; in name order, or as its manifest lists: docs/cluster.md)
    or a glob pattern; or the same at a URL (``s3://``, ``gs://``, any fsspec URL).

    At a URL, ``storage_options`` are fsspec's (credentials, ``endpoint_url`` for an
    S3-compatible store, ...), ``timeout`` bounds each request, its retries included. The
    dataset reads what the same files would give, byte for byte: at open it fetches the
    files' metadata and small buffers (offsets, scalars, shapes); the bulk of each block
    is fetched when its rows are first read, or ahead of a loader (ranged requests,
    several at once), its checksum checked before any of it is used. Fetched blocks are
    kept on disk in ``cache_dir`` (default: ``~/.cache/fastload``) within ``cache_bytes``
    (default: 50 GiB, or half the disk's free space; 0: nothing on disk), shared safely by
    the processes of the machine. One larger than ``memory_bytes`` (default: half the
    memory this process may use) is read with bounded memory (docs/remote.md).

    ``cache="os"`` memory-maps the files (the OS page cache holds what is read);
    ``cache="memory"`` reads each file into RAM once. Any Arrow IPC file or stream opens;
    without fastload metadata its binary columns read as bytes, strings as str and
    numbers as arrays. A file that is not one is refused after its first and last bytes
    are read, before it is mapped or read.

    ``verify="read"``, the default, checks each block against the checksums the writer
    stored the first time one of its rows is read (by ``ds[i]``, a column's items, or a
    loader before it hands out a batch): one CRC-32 pass over each block, once (about
    3 GB/s). ``verify="open"`` checks every block at open (a full read of the files);
    ``verify=None`` checks nothing (``Dataset.verify()`` and ``python -m fastload
    verify`` check later). A fastload file read unchecked warns (UserWarning), one
    warning per file naming it: opened with ``verify=None``, or written before checksums
    existed; Arrow files that fastload did not write warn only with ``verify="open"``.

    A mapped file that shrinks while it is read (truncated or rewritten in place) raises
    ``LoadError`` naming it where the rows past its new end would have been handed out,
    whatever ``verify`` says; so does a file rewritten in place whatever its size (``cp
    new old``, ``rsync --inplace``, ``dd``: another size or modification time than at
    open), where rows read since would have been handed out ("the file changed while it
    was open"). A file replaced by rename is not seen: the dataset reads the one opened.

    Raises FileNotFoundError for a missing path, ``LoadError`` (a ValueError) for a file
    that is not Arrow IPC, truncated, corrupt (any block whose bytes differ from its
    checksum: at open with ``verify="open"``, at its first read with ``verify="read"``,
    naming the file, the block and its rows), of an unknown format version or
    inconsistent with the other files.
    Example::

        ds = open("train.arrow")
        ds[0]["image"]            # decoded
        ds["image"].encoded[0]    # stored bytes, zero copy
    """
    if cache not in CACHES:
        raise ValueError(f"cache must be one of {CACHES}, got {cache!r}")
    if verify not in VERIFY:
        raise ValueError(f"verify must be 'read', 'open' or None, got {verify!r}")
    dataset = _dataset(
        path, cache, verify, storage_options, cache_dir, cache_bytes, memory_bytes, timeout
    )
    if verify == "open":
        dataset.verify()
    for s in dataset._opened:
        why = _unchecked(s, verify)
        if why is not None:
            # One warning per file, naming it: Python's filters show each once per place
            # that opens it, whatever else that place opened before.
            warnings.warn(
                f"{s.path}: {why}: its blocks are not checked against checksums, and a "
                f"corrupted byte is handed out as data",
                UserWarning,
                stacklevel=2,
            )
    return dataset


def _dataset(
    path: str | os.PathLike[str],
    cache: Literal["os", "memory"],
    verify: Literal["read", "open"] | None,
    storage_options: Mapping[str, Any] | None,
    cache_dir: str | os.PathLike[str] | None,
    cache_bytes: int | None,
    memory_bytes: int | None,
    timeout: float,
) -> Dataset:
    """``open``'s dataset, its blocks not checked yet: of local files, or at a URL, its
    objects mirrored in memory (``RemoteFile``), parsed as local files are, their bulk
    fetched by ``RemoteRows``."""
    if not is_url(path):
        given = (storage_options, cache_dir, cache_bytes, memory_bytes)
        if any(option is not None for option in given):
            raise ValueError(
                f"storage_options, cache_dir, cache_bytes and memory_bytes are for a dataset "
                f"at a URL; {os.fspath(path)!r} is a local path"
            )
        return Dataset([_read_file(f, cache) for f in resolve_files(path)], verify=verify)
    from fastload._storage.remotefiles import (
        can_let_go,
        default_cache,
        default_memory,
        open_objects,
    )

    blocks = default_cache(cache_dir, cache_bytes)
    memory = default_memory(memory_bytes)
    # The blocks kept for later epochs go where the kernel can reclaim them: files on the
    # disk of the cache, unless nothing may be written to disk.
    mirrors = blocks.directory if blocks.max_bytes > 0 else None
    files = open_objects(str(path), storage_options, timeout, _remote_file, mirrors)
    total, limit = sum(f.obj.size for f in files), memory_limit()
    if not can_let_go() and limit is not None and total > limit:
        warnings.warn(
            f"{path}: {total / 1e9:.1f} GB, more than the {limit / 1e9:.1f} GB of memory this "
            f"process may use: on this platform the blocks it reads stay in memory while "
            f"the dataset is open; read a part of it per process (shard=, or file_datasets)",
            UserWarning,
            stacklevel=3,
        )
    return Dataset([f.opened for f in files], verify=verify, remote=(files, blocks, memory))


def _remote_file(remote: Any, kind: str) -> None:
    """Parse the object ``remote`` (a ``RemoteFile`` whose skeleton was fetched, of
    ``kind``): its small buffers fetched, then checked as a local file is; sets
    ``remote.opened``, its ``_OpenedFile``."""
    pa = import_pyarrow()
    buf = pa.py_buffer(remote.base)
    if not remote.whole:
        try:
            _, batches = _parse_ipc(pa, buf, kind)
        except Exception as exc:
            raise LoadError(
                f"{remote.url}: not a readable Arrow IPC file (truncated or corrupt?): {exc}",
                source=remote.url,
            ) from exc
        remote.small_buffers(batches)
    schema, batches = _parsed(pa, remote.url, buf, kind, None, None)
    base = np.frombuffer(buf, np.uint8)
    remote.opened = _OpenedFile(remote.url, None, None, base, schema, batches)


def _unchecked(opened_file: _OpenedFile, verify: str | None) -> str | None:
    """Why the blocks of ``opened_file`` are read unchecked, when that is worth a warning:
    a fastload file without checksums or opened with ``verify=None``; a file that fastload
    did not write (it has none) only when asked to verify at open."""
    meta = opened_file.schema.metadata or {}
    if META_CHECKSUMS not in meta and META_FORMAT in meta:
        return "no checksums (written by an older fastload)"
    if META_CHECKSUMS not in meta and verify == "open":
        return "no checksums (not written by fastload)"
    if verify is None and META_FORMAT in meta:
        return "opened with verify=None"
    return None


def resolve_files(path: str | os.PathLike[str]) -> list[str]:
    """The files ``path`` names: itself, the files of a directory (those its manifest
    lists, when it has one: ``_storage/manifest.py``), or a glob's matches, sorted.
    Raises FileNotFoundError when there are none, LoadError for a directory of parts
    that was not committed."""
    path = os.fspath(path)
    if os.path.isdir(path):
        committed = committed_folder(path)
        if committed is not None:
            return committed
        files = sorted(
            os.path.join(path, f)
            for f in os.listdir(path)
            if f.endswith(SUFFIXES) and not f.startswith(".")
        )
        if not files:
            raise FileNotFoundError(
                f"no dataset files ({', '.join(SUFFIXES)}) in directory {path!r}"
            )
        return files
    if os.path.exists(path):
        return [path]
    if any(c in path for c in "*?["):
        files = sorted(f for f in glob.glob(path) if os.path.isfile(f))
        if files:
            return files
        raise FileNotFoundError(f"no files match {path!r}")
    raise FileNotFoundError(f"no such dataset file or directory: {path!r}")


class _OpenedFile:
    """One opened file: its bytes (``mapping``: the mmap, None when read into memory;
    ``guard``: the ``FileGuard`` the bytes are read through when mapped), and its record
    batches. Mapped, it keeps ``fd``, a descriptor of the file (closed with this object),
    and ``state``, the file's ``file_state`` before it was mapped: what tells a file
    rewritten in place (``guards.MappedFiles``)."""

    def __init__(
        self,
        path: str,
        mapping: mmap.mmap | None,
        guard: Any,
        base: npt.NDArray[np.uint8],
        schema: Any,
        batches: list[Any],
        fd: int | None = None,
        state: tuple[int, int, int] | None = None,
    ) -> None:
        self.path, self.mapping, self.guard, self.base = path, mapping, guard, base
        self.schema, self.batches = schema, batches
        self.rows = sum(b.num_rows for b in batches)
        self.fd, self.state = fd, state
        if fd is not None:
            weakref.finalize(self, os.close, fd)


def _read_file(path: str, cache: str) -> _OpenedFile:
    pa = import_pyarrow()
    mapping = guard = fd = None
    try:
        with builtins.open(path, "rb") as f:
            state = file_state(f.fileno())
            kind = check_framing(f.fileno(), state[0], path)
            if cache == "os":
                mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ, **_UNTRACKED)
                guard = _core.FileGuard(mapping)
                buf = pa.py_buffer(guard)
                fd = os.dup(f.fileno())
            else:
                buf = pa.py_buffer(f.read())
    except OSError as exc:
        raise LoadError(f"{path}: cannot read: {exc}", source=path) from exc
    try:
        schema, batches = _parsed(pa, path, buf, kind, guard, fd)
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    base = np.frombuffer(buf, np.uint8)
    return _OpenedFile(path, mapping, guard, base, schema, batches, fd, state)


def _parsed(
    pa: ModuleType, path: str, buf: Any, kind: str, guard: Any, fd: int | None
) -> tuple[Any, list[Any]]:
    """(schema, record batches) of the bytes ``buf`` of ``path`` (read, or mapped and read
    through ``guard``, the file open as ``fd``), validated; raises ``LoadError`` for bytes
    that are not a readable Arrow file, or a fastload file without the checksums its
    version has."""
    try:
        schema, batches = _parse_ipc(pa, buf, kind)
        for b in batches:
            b.validate(full=True)
    except Exception as exc:  # pyarrow reports bad bytes with several exception types
        if guard is not None and guard.faults:
            raise shrunk_error(path, buf.size, file_state(fd)[0]) from exc
        raise LoadError(
            f"{path}: not a readable Arrow IPC file (truncated or corrupt?): {exc}", source=path
        ) from exc
    for field in schema:
        _refuse_extension_types(pa, field, path)
    meta = schema.metadata or {}
    if meta.get(META_FORMAT) == b"2" and META_CHECKSUMS not in meta:
        raise LoadError(
            f"{path}: a fastload file of format version 2 without its "
            f"checksums: the file is corrupt",
            source=path,
        )
    return schema, batches


def _refuse_extension_types(pa: ModuleType, field: Any, path: str, where: str = "") -> None:
    """Raise LoadError for an Arrow extension type anywhere in ``field``, registered or not:
    fastload reads plain Arrow types only, and an extension type's deserializer may run
    code (pyarrow's pickle-based ``arrow.py_extension_type`` did before 14.0.1)."""
    where = f"{where}.{field.name}" if where else field.name
    name = (field.metadata or {}).get(b"ARROW:extension:name")
    if isinstance(field.type, pa.BaseExtensionType) or name is not None:
        kind = name.decode("utf-8", "replace") if name is not None else field.type
        raise LoadError(
            f"{path}: field {where!r} has the Arrow extension type {kind}; "
            f"fastload reads plain Arrow types only",
            source=path,
        )
    t = field.type
    children = [t.field(k) for k in range(t.num_fields)] if pa.types.is_struct(t) else []
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        children = [t.value_field]
    if pa.types.is_map(t):
        children = [t.key_field, t.item_field]
    for child in children:
        _refuse_extension_types(pa, child, path, where)


def _parse_ipc(pa: ModuleType, buf: Any, kind: str) -> tuple[Any, list[Any]]:
    """(schema, record batches) of an IPC file or stream (``kind``, from its framing)."""
    if kind == "file":
        reader = pa.ipc.open_file(pa.BufferReader(buf))
        return reader.schema, [reader.get_batch(i) for i in range(reader.num_record_batches)]
    reader = pa.ipc.open_stream(pa.BufferReader(buf))
    return reader.schema, list(reader)


class Dataset(PackedRows):
    """A packed dataset: ``len(ds)`` observations; ``ds[i]`` a dict of decoded fields;
    ``ds[idx]`` (index array or slice) a dict of batches (arrays for raw and scalar
    fields, lists for the others); ``ds["name"]`` a column.

    Columns: scalar fields are 1-D arrays; Raw fields an ``(n, *shape)`` array (a
    ``RawColumn`` holding one array per record batch when the file has several); other
    fields an ``EncodedColumn``. Every column has ``.encoding``.
    """

    block_bounds: npt.NDArray[np.int64]  # a dataset always knows its blocks

    def __init__(
        self,
        opened: Sequence[_OpenedFile],
        verify: Literal["read", "open"] | None = None,
        remote: tuple[Sequence[Any], Any, Any] | None = None,
    ) -> None:
        self._opened = opened
        self._verify = verify
        self._remote = remote
        first = opened[0]
        _check_same_schema(opened)
        try:
            described = read_fields(first.schema.metadata, first.schema.names)
        except ValueError as exc:
            raise LoadError(f"{first.path}: {exc}", source=first.path) from exc
        self._inferred = described is None
        if described is None:
            described = _infer_fields(first.schema)
        pieces = [(s, b) for s in opened for b in s.batches]
        self.file_bounds = _bounds([s.rows for s in opened])
        self.block_bounds = self._block_bounds()
        piece_bounds = _bounds([b.num_rows for _, b in pieces])
        self.files = [s.path for s in opened]
        self.fields = {name: enc for name, (enc, _) in described.items()}
        self.metadata = read_user(first.schema.metadata)
        self._field_columns = {name: cols for name, (_, cols) in described.items()}
        try:
            self._columns = {
                name: self._column(name, enc, cols, pieces, piece_bounds)
                for name, (enc, cols) in described.items()
            }
        except LoadError:
            raise
        except Exception as exc:  # inconsistent buffers that Arrow's validation let by
            raise LoadError(f"{first.path}: corrupt dataset: {exc}", source=first.path) from exc
        # At a URL: the blocks' bulk is fetched before their rows are read.
        self.remote_rows = None if remote is None else self._remote_rows(*remote)
        self.source_field = read_source_field(first.schema.metadata, self.fields)
        if self.source_field is not None:
            sources = self._columns[self.source_field]
            for column in self._columns.values():
                if isinstance(column, EncodedColumn) and column is not sources:
                    column.sources = sources  # not on itself: a cycle that would hold the maps
        self._files = MappedFiles(opened, self.file_bounds)
        # With verify="open", every block is checked at open (by ``open``); the checks
        # then check again only the blocks of a file whose change time moved.
        checked = verify == "open"
        self._checks = _BlockChecks(self, self._files, checked) if verify is not None else None
        if self._checks is not None and self.remote_rows is not None:
            self.remote_rows.checked = self._checks.mark  # checked as fetched: not again
        if self._checks is not None or self._files or self.remote_rows is not None:
            self.verify_rows = _RowChecks(self._files, self._checks, self.remote_rows)
        mapped = all(s.mapping is not None for s in opened)
        check = self._checks.block if self._checks is not None else None
        self.file_pages = FilePages(opened, self.block_bounds, check) if mapped else None
        if self.verify_rows is not None or self.remote_rows is not None:
            self.row_feed = RowFeed(self.verify_rows, self.remote_rows)  # what loaders start
        for column in self._columns.values():
            _mark_blocks(column, self.block_bounds, self.verify_rows, self.file_pages)
            column.remote_rows = self.remote_rows
            column.row_feed = self.row_feed

    def _remote_rows(self, files: Sequence[Any], cache: Any, memory: Any) -> Any:
        """The dataset's ``RemoteRows``; ``memory``: its ``memory_bytes``, or (for one of
        ``file_datasets``) the whole dataset's ``RemoteRows`` and the file's first block
        there, whose marks it shares: the files' maps are the same."""
        from fastload._storage.remotefiles import RemoteRows

        per_file = [_own_blocks(s) for s in self._opened]
        within = memory if isinstance(memory, tuple) else None
        return RemoteRows(
            files,
            self._opened,
            self.block_bounds,
            per_file,
            cache,
            self._verify is not None,
            memory_bytes=None if within else memory,
            within=within,
        )

    def _block_bounds(self) -> npt.NDArray[np.int64]:
        """Row boundaries of the blocks over all files: a file's block metadata, else its
        record batches."""
        bounds = [np.zeros(1, np.int64)]
        for s, start in zip(self._opened, self.file_bounds):
            bounds.append(_own_blocks(s)[1:] + start)
        return np.concatenate(bounds)

    def _column(
        self,
        name: str,
        enc: Encoding | None,
        cols: list[str],
        pieces: list[tuple[_OpenedFile, Any]],
        piece_bounds: npt.NDArray[np.int64],
    ) -> Any:
        """The read-side column of field ``name``; raises LoadError when the file's
        columns do not fit the field's encoding."""
        pa = import_pyarrow()
        schema = self._opened[0].schema
        if not self._inferred:
            # A field the metadata describes has an encoding.
            self._check_types(pa, schema, name, enc)  # type: ignore[arg-type]
        arrays = {col: [b.column(col) for _, b in pieces] for col in cols}
        if any(a.null_count for col in cols for a in arrays[col]):
            if not self._inferred:
                raise LoadError(
                    f"{self.files[0]}: field {name!r} has missing values", source=self.files[0]
                )
            enc = None  # a foreign column with nulls: read through pyarrow
        if enc is None:
            return ArrowColumn(name, pa.chunked_array(arrays[name], schema.field(name).type))
        if isinstance(enc, Scalar):
            chunked = pa.chunked_array(arrays[name], schema.field(name).type)
            return chunked.to_numpy().view(ScalarArray)
        main = [Piece(a, s.base, id(s)) for (s, _), a in zip(pieces, arrays[name])]
        if isinstance(enc, Raw):
            col = RawColumn(name, enc, main, piece_bounds)
            # At a URL, an array would read blocks not fetched yet: the column fetches them.
            single = len(main) == 1 and self._remote is None
            return col.chunks[0].view(RawArray) if single else col
        parts = {}
        for col, kind in enc.columns(name)[1:]:
            chunked = pa.chunked_array(arrays[col], schema.field(col).type)
            parts[col.split(".", 1)[1]] = (
                shape_list(chunked) if kind == "shape" else chunked.to_numpy()
            )
        return EncodedColumn(name, enc, main, parts, piece_bounds, [s.path for s, _ in pieces])

    def _check_types(self, pa: ModuleType, schema: Any, name: str, enc: Encoding) -> None:
        for col, kind in enc.columns(name):
            if schema.field(col).type != arrow_type(pa, kind):
                raise LoadError(
                    f"{self.files[0]}: column {col!r} has type "
                    f"{schema.field(col).type}, field {name!r} ({enc.name}) "
                    f"needs {arrow_type(pa, kind)}",
                    source=self.files[0],
                )

    def __len__(self) -> int:
        return int(self.file_bounds[-1])

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}: {c.encoding}" for k, c in self._columns.items())
        return f"<fastload Dataset: {len(self)} rows, {len(self.files)} file(s), {{{fields}}}>"

    def verify(self, progress: bool = False) -> dict[str, Any]:
        """Check every block of every file against its stored checksums (see
        ``fastload._storage.checksums``). Returns ``{"files", "blocks", "unverified"}``:
        files and blocks checked, and the files that have no checksums. ``progress`` shows
        a tqdm bar over the blocks. Raises ``LoadError`` naming the file and the block
        (and its rows) that does not match, or a file that changed since it was opened."""
        pa = import_pyarrow()
        self._files.check(self.file_bounds[:-1])
        remote, every = self.remote_rows, np.arange(len(self))
        # At a URL: every block fetched (and checked) first, none let go meanwhile.
        with remote.holding(every) if remote is not None else contextlib.nullcontext():
            if remote is not None:
                remote.ensure(every)
            return self._verified(pa, progress)

    def _verified(self, pa: Any, progress: bool) -> dict[str, Any]:
        """``verify``'s checks of every block, their blocks in memory."""
        bar = progress_bar(len(self.block_bounds) - 1, progress, "block", "verifying")
        checked, blocks, unverified = 0, 0, []
        try:
            for s, first in zip(self._opened, self.file_bounds):
                sums = file_checksums(pa, s.path, s.schema, s.batches, s.rows)
                if sums is None:
                    unverified.append(s.path)
                    continue
                for k in range(len(sums.sums)):
                    _check_block(sums, k, self._files, first)
                    if bar is not None:
                        bar.update(1)
                checked, blocks = checked + 1, blocks + len(sums.sums)
        finally:
            if bar is not None:
                bar.close()
        return RenamedKeys(
            {"files": checked, "blocks": blocks, "unverified": unverified}, chunks="blocks"
        )

    # The names of 0.2, read with a DeprecationWarning.
    chunk_bounds = renamed_attribute("block_bounds")
    num_chunks = renamed_attribute("num_blocks")
    shard_bounds = renamed_attribute("file_bounds")
    shards = renamed_attribute("file_datasets")

    def keys(self) -> list[str]:
        """The field names, in file order."""
        return list(self._columns)

    @property
    def encodings(self) -> dict[str, str]:
        """Field name -> encoding name ("jpeg", "raw", "scalar", ...)."""
        return {k: c.encoding for k, c in self._columns.items()}

    @property
    def num_blocks(self) -> int:
        """The number of record batches, over all files."""
        return len(self.block_bounds) - 1

    @property
    def nbytes(self) -> int:
        """Total size of the files, in bytes."""
        return sum(s.base.size for s in self._opened)

    def field_nbytes(self) -> dict[str, int]:
        """Field name -> bytes its columns take in the files (Arrow buffers)."""
        return {
            name: sum(b.column(c).nbytes for s in self._opened for b in s.batches for c in cols)
            for name, cols in self._field_columns.items()
        }

    @property
    def file_datasets(self) -> list[Dataset]:
        """One Dataset per file (sharing the mapped files)."""
        if len(self._opened) == 1:
            return [self]
        if self._remote is not None:
            files, cache, _ = self._remote
            firsts = np.searchsorted(self.block_bounds, self.file_bounds[:-1])
            return [
                Dataset([s], verify=self._verify, remote=([f], cache, (self.remote_rows, int(b))))
                for s, f, b in zip(self._opened, files, firsts)
            ]
        return [Dataset([s], verify=self._verify) for s in self._opened]

    @overload
    def __getitem__(self, key: str) -> Any: ...

    @overload
    def __getitem__(self, key: Index) -> dict[str, Any]: ...

    def __getitem__(self, key: str | Index) -> Any:
        if isinstance(key, str):
            try:
                return self._columns[key]
            except KeyError:
                raise KeyError(f"no field {key!r}; fields are {self.keys()}") from None
        i = normalize_index(key, len(self))
        if self.remote_rows is not None:
            self.remote_rows.ensure(i)
        if self._checks is not None:
            self._checks.rows(i)
        try:
            item = {k: _plain(col[i]) for k, col in self._columns.items()}
        except LoadError:
            self._files.check(i)  # an item that does not decode: read past a file's end?
            raise
        self._files.check(i)
        if self._checks is not None:
            self._checks.rows(i)  # blocks of a file whose change time moved, checked again
        return item

    def __getobs__(self, i: Index) -> dict[str, Any]:
        return self[i]


def _own_blocks(opened_file: _OpenedFile) -> npt.NDArray[np.int64]:
    """The block boundaries of one file: its block metadata, else its record batches."""
    try:
        own = read_blocks(opened_file.schema.metadata, opened_file.rows)
    except ValueError as exc:
        raise LoadError(f"{opened_file.path}: {exc}", source=opened_file.path) from exc
    return own if own is not None else _bounds([b.num_rows for b in opened_file.batches])


def _mark_blocks(
    column: PackedRows,
    bounds: npt.NDArray[np.int64],
    verify_rows: Callable[[int | npt.NDArray[np.int64]], None] | None,
    pages: FilePages | None,
) -> None:
    """A column, and its stored bytes, know the dataset's blocks and where they lie in the
    files (``file_pages``): a loader over columns (``mapobs(f, ds["image"].encoded)``,
    ``ds["label"]``) can read block by block (``shuffle="quasi"``), reading ahead, as it
    can over the dataset. They also carry the dataset's ``verify_rows`` (when it checks
    anything), which a loader runs on each batch's rows before it hands the batch out."""
    column.block_bounds = bounds  # its stored bytes (``column.encoded``) read them from it
    column.file_pages = pages
    column.verify_rows = verify_rows


class _RowChecks:
    """A dataset's ``verify_rows``: before what was read of ``rows`` is handed out, raise
    ``LoadError`` when a file shrank under its map or was rewritten in place, or (with
    ``verify``) when a block of ``rows`` not checked yet (or to be checked again: its
    file's change time moved) does not match its checksum. Its columns carry it, and it
    holds no reference to the dataset: a dataset dropped is unmapped at once, not when the
    garbage collector finds a cycle."""

    def __init__(self, files: MappedFiles, checks: _BlockChecks | None, remote: Any = None) -> None:
        self.files, self.checks, self.remote = files, checks, remote

    def __call__(self, rows: int | npt.NDArray[np.int64]) -> None:
        if self.remote is not None:  # at a URL: the blocks not fetched yet, first
            self.remote.ensure(rows)
        self.files.check(rows)
        if self.checks is not None:
            self.checks.rows(rows)


class _BlockChecks:
    """``verify="read"``: each block is checked against its checksum the first time one of
    its rows is read, once (under a lock, so threads reading one block check it once);
    ``checked``: every block was checked at open (``verify="open"``). The blocks of a file
    whose change time moved alone (``MappedFiles.touches``: its metadata changed, or it
    was rewritten and its modification time set back) are checked again, each the next
    time one of its rows is read. ``files``: the dataset's ``MappedFiles``, which say when
    a mismatch is a file that shrank or changed while it was read."""

    def __init__(self, dataset: Dataset, files: MappedFiles, checked: bool = False) -> None:
        pa = import_pyarrow()
        self.files = files
        self.bounds = dataset.block_bounds
        self.done = np.full(len(self.bounds) - 1, checked, bool)
        # per block: (the file's FileChecksums or None, its index); per file: its blocks
        self.owner: list[tuple[Any, int]] = []
        self.file_blocks = [0]
        for s in dataset._opened:
            sums = file_checksums(pa, s.path, s.schema, s.batches, s.rows)
            count = len(sums.sums) if sums is not None else len(_own_blocks(s)) - 1
            self.owner.extend((sums, k) for k in range(count))
            self.file_blocks.append(len(self.owner))
        self._touched, self._touches = files.touched, list(files.touches)
        self._lock = threading.Lock()

    def rows(self, rows: int | npt.NDArray[np.int64]) -> None:
        """Check the blocks of ``rows`` (a row index, or an array of them) not checked yet;
        raises ``LoadError`` naming the file and block that does not match."""
        if self._touched != self.files.touched:
            self._forget_touched()
        blocks = np.searchsorted(self.bounds, np.atleast_1d(rows), side="right") - 1
        for k in np.unique(blocks[~self.done[blocks]]):
            self.block(int(k))

    def block(self, k: int) -> None:
        """Check block ``k`` unless it was; raises ``LoadError`` when it does not match."""
        if self._touched != self.files.touched:
            self._forget_touched()
        with self._lock:
            if self.done[k]:
                return
            sums, local = self.owner[k]
            if sums is not None:
                _check_block(sums, local, self.files, self.bounds[k])
            self.done[k] = True

    def mark(self, k: int) -> None:
        """Block ``k`` was checked (by whoever fetched it)."""
        with self._lock:
            self.done[k] = True

    def _forget_touched(self) -> None:
        """The blocks of the files touched since the last call are to be checked again."""
        with self._lock:
            self._touched, touches = self.files.touched, list(self.files.touches)
            for f, (was, now) in enumerate(zip(self._touches, touches)):
                if was != now:
                    self.done[self.file_blocks[f] : self.file_blocks[f + 1]] = False
            self._touches = touches


def _check_block(sums: Any, k: int, files: MappedFiles, row: int) -> None:
    """``sums.check(k)``; a mismatch read past the end of a file that shrank, or in a
    file that changed since it was opened (the file of dataset row ``row``), is reported
    as that."""
    try:
        sums.check(k)
    except LoadError:
        files.check_mismatch(row)
        raise


def _plain(value: Any) -> Any:
    """Items and batches are plain arrays, not the column's array subclass."""
    return value.view(np.ndarray) if isinstance(value, (RawArray, ScalarArray)) else value


def _check_same_schema(opened: Sequence[_OpenedFile]) -> None:
    """FileStream must agree on columns, format version and field encodings (their blocks
    and user metadata may differ)."""
    first = opened[0]
    keys = (META_FORMAT, META_FIELDS)
    meta = [{k: (s.schema.metadata or {}).get(k) for k in keys} for s in opened]
    for s, m in zip(opened[1:], meta[1:]):
        if not s.schema.equals(first.schema) or m != meta[0]:
            raise LoadError(
                f"{s.path}: its schema differs from {first.path}'s; the files "
                f"of one dataset must share one schema",
                source=s.path,
            )


def _bounds(counts: Sequence[int]) -> npt.NDArray[np.int64]:
    """Row boundaries (int64, len(counts) + 1) from row counts."""
    return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)


def _infer_fields(schema: Any) -> dict[str, tuple[Encoding | None, list[str]]]:
    """Encodings for a file without fastload metadata, one field per column."""
    pa = import_pyarrow()
    fields: dict[str, tuple[Encoding | None, list[str]]] = {}
    for f in schema:
        t = f.type
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
            enc = Bytes()
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            enc = Str()
        elif (
            pa.types.is_integer(t)
            or (pa.types.is_floating(t) and t.bit_width > 16)
            or pa.types.is_boolean(t)
        ):
            enc = Scalar(t.to_pandas_dtype())
        else:
            enc = None
        fields[f.name] = (enc, [f.name])
    return fields


class ArrowColumn(PackedRows):
    """A column of a foreign Arrow file with no fastload encoding (nested types, nulls):
    items come from pyarrow as Python values."""

    encoding = "arrow"

    def __init__(self, name: str, chunked: Any) -> None:
        self.name, self.chunked = name, chunked

    def __len__(self) -> int:
        return len(self.chunked)

    def __getitem__(self, i: Index) -> Any:
        i = normalize_index(i, len(self))
        if is_batch_index(i):
            return self.chunked.take(i).to_pylist()
        return self.chunked[i].as_py()
