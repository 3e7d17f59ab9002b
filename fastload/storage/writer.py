"""Writing packed datasets: observations encoded in parallel (``_storage/encoders.py``,
``_storage/encoder_processes.py``), written as one Arrow IPC file.

Each file holds one record batch, so every column is contiguous in the file: the first
column's bytes are written into the file as rows come (``_storage/ipcfile.py``), the other columns
are spilled (``_storage/spill.py``) and copied in at the end. The ``block_bytes`` blocks used for
sample order are row ranges kept in the metadata. The file is written under a temporary
name in the destination's directory and renamed when complete, so an error or Ctrl-C
never leaves a partial file under the final name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from contextlib import ExitStack, closing
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from fastload._base.arguments import is_size, renamed_keywords, warn_renamed
from fastload._storage.arrow_types import arrow_type, import_pyarrow
from fastload._storage.checksums import META_CHECKSUMS, block_checksums, metadata_checksum
from fastload._storage.encoder_processes import SLOT_BYTES, process_slabs
from fastload._storage.encoders import at_row, encode_row, is_byte_kind, observation, thread_slabs
from fastload._storage.fields import Encoding, as_encoding
from fastload._storage.ipcfile import InPlaceFile, body_lead
from fastload._storage.meta import (
    FORMAT_VERSION,
    META_BLOCKS,
    META_FIELDS,
    META_FORMAT,
    META_SOURCE,
    META_USER,
)
from fastload._storage.progress import progress_bar
from fastload._storage.remote import Retries, is_url
from fastload._storage.spill import ColumnSpill
from fastload.errors import LoadError
from fastload.obs import Container, numobs

__all__ = ["write"]

DEFAULT_BLOCK_BYTES = 64 << 20
# At a URL a block is the unit of a request, and a wave of them what the first batch
# waits for: a few MB (docs/remote.md).
DEFAULT_URL_BLOCK_BYTES = 4 << 20


@renamed_keywords(chunk_bytes="block_bytes")
def write(
    path: str | os.PathLike[str],
    data: Container,
    fields: dict[str, Encoding | str | np.dtype[Any]],
    *,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    parallel: bool | int = True,
    backend: Literal["thread", "process"] = "thread",
    progress: bool = True,
    metadata: dict[str, Any] | None = None,
    on_error: Literal["raise", "skip"] = "raise",
    source_field: str | None = None,
    num_threads: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> list[LoadError]:
    """Encode every observation of ``data`` and write them to the packed file ``path``;
    at a URL (``s3://bucket/train.arrow``; ``storage_options``: fsspec's), write it in a
    temporary folder and ``upload`` it, so that it is there whole or not at all.

    ``data`` is a container (``numobs``/``getobs``) whose observations are dicts holding
    the fields, or tuples with the fields in the order of ``fields``. ``fields`` maps each
    field name to an encoding (``Raw()``, ``JPEG(quality=90)``, ``"int64"``, ...).
    Encoded rows are written as they come, in a temporary directory next to ``path``
    (removed at the end; one that a killed writer left is removed by the next write into
    the same folder, of any file), so memory stays bounded: the first field's bytes
    straight into the file, the other columns to spill files copied in at the end. Rows
    are cut into blocks of about ``block_bytes`` encoded bytes, the unit of the
    quasi-random order. ``parallel`` says how many encoders run at once, as the loader's
    ``parallel=`` does: True (default) one per CPU, a number, or False (the caller's
    thread alone); threads, or with ``backend="process"`` forked worker processes, for containers
    whose Python code holds the GIL (as ``DataLoader(..., backend="process")`` loads them;
    the container is not pickled; Linux). Either way the file is the same. ``progress``
    shows a tqdm bar. ``metadata`` is an optional JSON-serializable
    dict kept in the file (``Dataset.metadata``), e.g. class names. ``source_field``
    names a ``Str()`` field that holds where each row came from (a file path): an error
    in loading a row of the written file names it. ``num_threads=n`` is the deprecated
    spelling of ``parallel=n`` (it warns).

    Raises ValueError/TypeError for bad arguments, FileNotFoundError for a missing
    directory, ``LoadError`` naming the row (and its file, when the container has
    ``paths``) when an observation cannot be read or encoded, and ``RuntimeError`` when a
    worker process dies. With ``on_error="skip"`` such rows are left out instead; the
    returned list holds a ``LoadError`` for each (empty when every row was written).
    Example::

        write("train.arrow", {"image": images, "label": labels},
              {"image": JPEG(quality=90), "label": "int64"})
    """
    path = os.fspath(path)
    if is_url(path):
        keywords: dict[str, Any] = dict(block_bytes=block_bytes, parallel=parallel)
        keywords.update(backend=backend)
        keywords.update(progress=progress, metadata=metadata, on_error=on_error)
        keywords.update(source_field=source_field, num_threads=num_threads)
        return _uploaded(
            path, storage_options, lambda local: write(local, data, fields, **keywords)
        )
    if storage_options is not None:
        raise ValueError(f"storage_options are for a URL; {path!r} is a local path")
    parallel = _renamed_num_threads(num_threads, parallel)
    job = _job(path, data, fields, block_bytes, parallel, backend, on_error, metadata, source_field)
    skipped: list[LoadError] = []
    _remove_stale(path)
    work = _work_dir(path)
    try:
        os.mkdir(work)
        tmp = _write_work_file(job, work, progress, skipped)
        _fsync(tmp)
        os.replace(tmp, path)
        _fsync(os.path.dirname(os.path.abspath(path)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return skipped


def _uploaded(
    url: str,
    storage_options: Mapping[str, Any] | None,
    write_file: Callable[[str], list[LoadError]],
) -> list[LoadError]:
    """``write_file(local)`` into a temporary folder, then the file uploaded to ``url``."""
    with tempfile.TemporaryDirectory(prefix="fastload-upload-") as folder:
        local = os.path.join(folder, url.rstrip("/").rsplit("/", 1)[-1] or "data.arrow")
        skipped = write_file(local)
        upload(local, url, storage_options)
    return skipped


def upload(local: str, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """Upload the file ``local`` to ``url``: under a hidden name next to it first (which
    ``open`` of the folder skips), renamed to ``url`` once whole. Raises ``LoadError``
    naming the URL when the store refuses it or cannot be reached (transient failures
    tried again for a minute)."""
    from fsspec.core import url_to_fs

    fs, key = url_to_fs(url, **dict(storage_options or {}))
    folder, _, name = key.rstrip("/").rpartition("/")
    hidden = (
        f"{folder}/.{name}.{uuid.uuid4().hex[:12]}.uploading" if folder else f".{name}.uploading"
    )
    store = Retries(url, 60.0)
    try:
        store.call(lambda: fs.put_file(local, hidden))
        store.call(lambda: fs.mv(hidden, key))
    except BaseException:
        try:
            fs.rm_file(hidden)
        except Exception:  # gone, or never there: nothing left behind
            pass
        raise


@dataclass(frozen=True)
class _Job:
    """One write, its arguments checked: the rows, their encodings bound to the first row
    that loads, and how the file is laid out."""

    pa: ModuleType
    data: Container
    n: int
    encodings: dict[str, Encoding]
    kinds: list[str]  # of the columns, in order
    row_bytes: int  # of the first row that loads
    block_bytes: int
    threads: int
    backend: str
    skip: bool
    user_meta: bytes
    source: bytes


def _job(
    path: str,
    data: Container,
    fields: dict[str, Encoding | str | np.dtype[Any]],
    block_bytes: int,
    parallel: bool | int,
    backend: str,
    on_error: str,
    metadata: dict[str, Any] | None,
    source_field: str | None,
) -> _Job:
    """``write``'s arguments checked (raising as ``write`` says) and the first row that
    loads read."""
    encodings, threads = _check_args(path, fields, block_bytes, parallel, backend)
    source = _check_source_field(source_field, encodings)
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    user_meta = json.dumps({} if metadata is None else metadata).encode()
    n = numobs(data)
    if n < 1:
        raise ValueError("cannot write a dataset with no observations")
    pa = import_pyarrow()
    skip = on_error == "skip"
    encodings, row_bytes = _bound(data, n, encodings, skip)
    kinds = [kind for name, enc in encodings.items() for _, kind in enc.columns(name)]
    return _Job(
        pa=pa,
        data=data,
        n=n,
        encodings=encodings,
        kinds=kinds,
        row_bytes=row_bytes,
        block_bytes=block_bytes,
        threads=threads,
        backend=backend,
        skip=skip,
        user_meta=user_meta,
        source=source,
    )


def _write_work_file(job: _Job, work: str, progress: bool, skipped: list[LoadError]) -> str:
    """Encodes every row and writes the file in the directory ``work``; returns its path
    (the LoadErrors of skipped rows go to ``skipped``)."""
    pa, encodings, n = job.pa, job.encodings, job.n
    tmp = os.path.join(work, "dataset.arrow")
    with ExitStack() as stack:
        # The first column's bytes go straight into the file (_storage/ipcfile.py), the others
        # to spill files.
        out = InPlaceFile(
            tmp,
            _header_bytes(job),
            body_lead(job.kinds[0], n) if is_byte_kind(job.kinds[0]) else None,
        )
        stack.callback(out.close)
        spills = _spills(stack, os.path.join(work, "column"), job.kinds, out)
        slabs = stack.enter_context(closing(_slabs(job)))
        bounds = _spill_slabs(slabs, spills, job.block_bytes, n, progress, skipped)
        arrays = [s.to_arrow(pa) for s in spills]
        sums = block_checksums(pa, arrays, bounds)
        schema = _schema(pa, encodings, job.user_meta, bounds, sums, job.source)
        batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
        del arrays
        if not out.finish(pa, batch):
            # More blocks than the header was made for: pyarrow writes the file anew.
            tmp = os.path.join(work, "copy.arrow")
            with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, schema) as copy:
                copy.write_batch(batch)
        del batch
    return tmp


def _slabs(job: _Job) -> Generator[Any, None, None]:
    """The encoded slabs of rows, in order: about 1 MiB each on threads, half a worker's
    slot in processes."""
    args = (job.data, job.n, job.encodings, job.kinds, job.threads, job.skip)
    if job.backend == "process":
        return process_slabs(*args, _rows_for(SLOT_BYTES // 2, job.row_bytes))
    return thread_slabs(*args, _rows_for(1 << 20, job.row_bytes))


def _rows_for(target: int, row_bytes: int) -> int:
    return max(1, min(4096, target // max(row_bytes, 1)))


def _row_bytes(data: Container, i: int, encodings: dict[str, Encoding]) -> int:
    """The bytes row ``i`` takes, as blocks count them (8 per number)."""
    size = 0
    for parts in encode_row(data, i, encodings):
        for value in parts:
            if isinstance(value, str):
                value = value.encode("utf-8")
            size += (
                8 * len(value)
                if isinstance(value, list)
                else len(value)
                if isinstance(value, bytes)
                else 8
            )
    return size


def _header_bytes(job: _Job) -> int:
    """Bytes reserved before the body for the schema and record batch metadata: enough
    for four times the blocks that the first row's size predicts (a block has a row at
    least), rounded up to 64 KiB."""
    n, encodings = job.n, job.encodings
    blocks = min(n, 4 * (n * max(job.row_bytes, 1) // job.block_bytes + 1) + 16)
    schema = _schema(
        job.pa, encodings, job.user_meta, [n] * (blocks + 1), [2**32 - 1] * blocks, job.source
    )
    columns = sum(len(enc.columns(name)) for name, enc in encodings.items())
    size = 8 + schema.serialize().size + 1024 + 64 * columns
    return -(-size // (64 << 10)) * (64 << 10)


def _work_dir(path: str) -> str:
    """The temporary directory of one write: spill files and the file before its rename,
    named after the destination, the process and the thread."""
    head, tail = os.path.split(os.path.abspath(path))
    return os.path.join(head, f".{tail}.{os.getpid()}-{threading.get_ident()}.tmp")


# A write's temporary directory, ".<file name>.<pid>-<thread id>.tmp" (``_work_dir``), and
# the files it holds (``write``, ``_spills``).
_WORK_DIR = re.compile(r"\.(?P<file>.+)\.(?P<pid>\d+)-(?P<tid>\d+)\.tmp")
_WORK_FILE = re.compile(r"dataset\.arrow|copy\.arrow|column\.\d+")


def _remove_stale(path: str) -> None:
    """Remove the temporary directories that earlier writes into the folder of ``path``
    left behind, whatever file they wrote: those of a process that is gone (killed), or
    of a thread of this one that is no longer running (an interrupt that came too late
    for the clean-up). A directory that holds anything a write does not make is left."""
    head = os.path.dirname(os.path.abspath(path))
    for entry in os.scandir(head):
        match = _WORK_DIR.fullmatch(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False):
            continue
        if _writing(int(match["pid"]), int(match["tid"])) or not _only_work_files(entry.path):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)


def _only_work_files(folder: str) -> bool:
    try:
        return all(_WORK_FILE.fullmatch(name) for name in os.listdir(folder))
    except OSError:
        return False  # gone already, or not ours to read


def _writing(pid: int, tid: int) -> bool:
    if pid == os.getpid():  # this thread is about to write: its old directory is stale
        return tid != threading.get_ident() and any(t.ident == tid for t in threading.enumerate())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: leave its files alone
    return True


def _fsync(path: str) -> None:
    """Flush a file, or a directory's entries, to the disk: the renamed file survives a
    power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _bound(
    data: Container,
    n: int,
    encodings: dict[str, Encoding],
    skip: bool,
) -> tuple[dict[str, Encoding], int]:
    """(the encodings bound to the first row that loads and encodes, the bytes of that
    row): the first row, unless ``skip``."""
    names = list(encodings)
    for i in range(n):
        try:
            first = observation(data, i, names)
            bound = {
                k: at_row(i, k, lambda enc=enc, k=k, first=first: enc.bind(first[k]), data)
                for k, enc in encodings.items()
            }
            return bound, _row_bytes(data, i, bound)
        except LoadError:
            if not skip or i == n - 1:
                raise
    raise ValueError("there is no row to write")


def _check_args(
    path: str,
    fields: dict[str, Encoding | str | np.dtype[Any]],
    block_bytes: int,
    parallel: bool | int,
    backend: str,
) -> tuple[dict[str, Encoding], int]:
    if not isinstance(fields, dict) or not fields:
        raise TypeError("fields must be a non-empty dict: field name -> encoding")
    encodings: dict[str, Encoding] = {}
    for name, spec in fields.items():
        if not isinstance(name, str) or not name or "." in name:
            raise ValueError(f"a field name must be a non-empty str without '.', got {name!r}")
        encodings[name] = as_encoding(spec)
    if isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or block_bytes < 1:
        raise ValueError(f"block_bytes must be a positive int, got {block_bytes!r}")
    threads = _encoders(parallel)
    if backend not in ("thread", "process"):
        raise ValueError(f"backend must be 'thread' or 'process', got {backend!r}")
    if backend == "process" and parallel is False:
        raise ValueError("backend='process' needs parallel=True or a number of workers")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"cannot write {path!r}: directory {parent!r} does not exist")
    if os.path.isdir(path):
        raise IsADirectoryError(f"cannot write {path!r}: it is a directory")
    return encodings, threads


def _renamed_num_threads(num_threads: int | None, parallel: bool | int) -> bool | int:
    """``parallel``, or the deprecated ``num_threads`` in its place (warned of)."""
    if num_threads is None:
        return parallel
    if parallel is not True:
        raise TypeError("write() takes parallel= alone: num_threads= is its old spelling")
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be a positive int or None, got {num_threads!r}")
    warn_renamed(f"num_threads={num_threads}", f"parallel={num_threads}")
    return num_threads


def _encoders(parallel: bool | int) -> int:
    """The encoders that ``parallel`` runs: one per CPU for True, one for False or 0."""
    if parallel is True:
        return (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else (os.cpu_count() or 1)
        )
    if parallel is False or (is_size(parallel) and parallel >= 0):
        return max(1, int(parallel))
    raise ValueError(f"parallel must be False, True or a number of threads >= 1, got {parallel!r}")


def _check_source_field(source_field: str | None, encodings: dict[str, Encoding]) -> bytes:
    """The name of the field of rows' sources, as stored (empty for none)."""
    if source_field is None:
        return b""
    if source_field not in encodings or encodings[source_field].name != "str":
        raise ValueError(
            f"source_field must name a Str() field of fields, got {source_field!r} "
            f"(fields: {', '.join(f'{k}: {e.name}' for k, e in encodings.items())})"
        )
    return source_field.encode()


def _spills(stack: ExitStack, tmp: str, kinds: list[str], out: InPlaceFile) -> list[ColumnSpill]:
    """One ColumnSpill per column, each deleted when ``stack`` closes; the first column's
    bytes go into ``out`` when they can."""
    spills = []
    for k, kind in enumerate(kinds):
        spill = ColumnSpill(f"{tmp}.{k}", kind, out if k == 0 and out.lead is not None else None)
        stack.callback(spill.close)
        spills.append(spill)
    return spills


def _schema(
    pa: ModuleType,
    encodings: dict[str, Encoding],
    user_meta: bytes,
    bounds: Sequence[int],
    sums: Sequence[int],
    source: bytes,
) -> Any:
    """The file's schema, with the fastload metadata, the blocks' checksums ``sums`` and
    the name of the field of rows' sources (``source``, empty for none)."""
    cols = [
        pa.field(col, arrow_type(pa, kind), nullable=False)
        for name, enc in encodings.items()
        for col, kind in enc.columns(name)
    ]
    fields = json.dumps({name: enc.to_meta(name) for name, enc in encodings.items()}).encode()
    blocks = json.dumps(bounds).encode()
    sums = {"crc32": sums, "metadata": metadata_checksum(fields, blocks, user_meta)}
    return pa.schema(
        cols,
        metadata={
            META_FORMAT: str(FORMAT_VERSION).encode(),
            META_FIELDS: fields,
            META_BLOCKS: blocks,
            META_USER: user_meta,
            META_CHECKSUMS: json.dumps(sums).encode(),
            **({META_SOURCE: source} if source else {}),
        },
    )


def _spill_slabs(
    slabs: Iterable[Any],
    spills: list[ColumnSpill],
    block_bytes: int,
    n: int,
    progress: bool,
    skipped: list[LoadError],
) -> list[int]:
    """Appends every slab to the spills (the LoadErrors of skipped rows to ``skipped``);
    returns the block boundaries [0, ..., rows written]: a block ends after the row that
    brings it to ``block_bytes`` or more."""
    bar = progress_bar(n, progress, "obs", "writing")
    bounds, size, i = [0], 0, 0
    try:
        for slab in slabs:
            if bar is not None:
                bar.update(slab.stop - slab.first)
            skipped.extend(slab.errors)
            sizes = sum(spill.extend(values) for spill, values in zip(spills, slab.columns))
            size = _cut(
                np.cumsum(sizes) if len(spills) else np.zeros(0, np.int64),
                size,
                i,
                block_bytes,
                bounds,
            )
            i += slab.stop - slab.first - len(slab.errors)
    finally:
        if bar is not None:
            bar.close()
    if bounds[-1] != i:
        bounds.append(i)
    return bounds


def _cut(
    cumulative: npt.NDArray[np.int64], size: int, i: int, block_bytes: int, bounds: list[int]
) -> int:
    """Block ends among rows i, i + 1, ... whose sizes sum to ``cumulative``, after
    ``size`` bytes of the current block; returns the bytes of the block left open."""
    used = 0
    while True:
        k = int(np.searchsorted(cumulative, used + block_bytes - size, side="left"))
        if k >= len(cumulative):
            return size + int(cumulative[-1] - used) if len(cumulative) else size
        bounds.append(i + k + 1)
        used, size = int(cumulative[k]), 0
