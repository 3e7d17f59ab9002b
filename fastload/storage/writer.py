"""Writing packed datasets: observations encoded in parallel, spilled column by column,
written as one Arrow IPC file.

Each file holds one record batch, so every column is contiguous in the file (see
``spill.py``); the ``chunk_bytes`` chunks used for sample order are row ranges kept in
the metadata. The file is written under a temporary name in the destination's directory
and renamed when complete, so an error or Ctrl-C never leaves a partial file under the
final name.
"""
import json
import os
import shutil
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, closing

from fastload.errors import LoadError
from fastload.obs import getobs, numobs
from fastload.storage.arrow_types import arrow_type, import_pyarrow
from fastload.storage.checksums import META_CHECKSUMS, chunk_checksums, metadata_checksum
from fastload.storage.fields import as_encoding
from fastload.storage.meta import (FORMAT_VERSION, META_CHUNKS, META_FIELDS, META_FORMAT,
                                   META_USER)
from fastload.storage.progress import progress_bar
from fastload.storage.spill import ColumnSpill
from fastload.views import source_of

__all__ = ["write"]

DEFAULT_CHUNK_BYTES = 64 << 20


def write(path, data, fields, *, chunk_bytes=DEFAULT_CHUNK_BYTES, num_threads=None,
          progress=True, metadata=None, on_error="raise"):
    """Encode every observation of ``data`` and write them to the packed file ``path``.

    ``data`` is a container (``numobs``/``getobs``) whose observations are dicts holding
    the fields, or tuples with the fields in the order of ``fields``. ``fields`` maps each
    field name to an encoding (``Raw()``, ``JPEG(quality=90)``, ``"int64"``, ...).
    Encoded rows are spilled to files in a temporary directory next to ``path`` as they
    come (removed at the end, or by the next write after a kill), so memory
    stays bounded (disk needs about twice the dataset's size while writing). Rows are cut
    into chunks of about ``chunk_bytes`` encoded bytes, the unit of the quasi-random
    order. ``num_threads`` encoder threads (default: one per CPU) run at once;
    ``progress`` shows a tqdm bar when tqdm is installed. ``metadata`` is an optional
    JSON-serializable dict kept in the file (``Dataset.metadata``), e.g. class names.

    Raises ValueError/TypeError for bad arguments, FileNotFoundError for a missing
    directory, and ``LoadError`` naming the row (and its file, when the container has
    ``paths``) when an observation cannot be read or encoded. With ``on_error="skip"``
    such rows are left out instead; the returned list holds their ``LoadError``s (empty
    when every row was written). Example::

        write("train.arrow", {"image": images, "label": labels},
              {"image": JPEG(quality=90), "label": "int64"})
    """
    path = os.fspath(path)
    encodings, threads = _check_args(path, fields, chunk_bytes, num_threads)
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    user_meta = json.dumps({} if metadata is None else metadata).encode()
    n = numobs(data)
    if n < 1:
        raise ValueError("cannot write a dataset with no observations")
    pa = import_pyarrow()
    encodings = _bound(data, n, encodings, on_error == "skip")
    skipped = []
    _remove_stale(path)
    work = _work_dir(path)
    try:
        os.mkdir(work)
        with ExitStack() as stack:
            spills = _spills(stack, os.path.join(work, "column"), encodings)
            rows = stack.enter_context(closing(
                _encoded_rows(data, n, encodings, threads, on_error == "skip")))
            bounds = _spill_rows(rows, spills, chunk_bytes, n, progress, skipped)
            arrays = [s.to_arrow(pa) for s in spills]
            schema = _schema(pa, encodings, user_meta, bounds, arrays)
            batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
            del arrays
            tmp = os.path.join(work, "dataset.arrow")
            with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, schema) as out:
                out.write_batch(batch)
            del batch
        _fsync(tmp)
        os.replace(tmp, path)
        _fsync(os.path.dirname(os.path.abspath(path)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return skipped


def _work_dir(path):
    """The temporary directory of one write: spill files and the file before its rename,
    named after the destination, the process and the thread."""
    head, tail = os.path.split(os.path.abspath(path))
    return os.path.join(head, f".{tail}.{os.getpid()}-{threading.get_ident()}.tmp")


def _remove_stale(path):
    """Remove the temporary directories that earlier writes of ``path`` left behind: those
    of a process that is gone (killed), or of a thread of this one that is no longer
    running (an interrupt that came too late for the clean-up)."""
    head, tail = os.path.split(os.path.abspath(path))
    prefix = f".{tail}."
    for entry in os.scandir(head):
        name = entry.name
        if not (name.startswith(prefix) and name.endswith(".tmp") and entry.is_dir()):
            continue
        pid, _, tid = name[len(prefix):-len(".tmp")].partition("-")
        if pid.isdigit() and tid.isdigit() and not _writing(int(pid), int(tid)):
            shutil.rmtree(entry.path, ignore_errors=True)


def _writing(pid, tid):
    if pid == os.getpid():   # this thread is about to write: its old directory is stale
        return tid != threading.get_ident() and any(t.ident == tid
                                                     for t in threading.enumerate())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True      # another user's process: leave its files alone
    return True


def _fsync(path):
    """Flush a file, or a directory's entries, to the disk: the renamed file survives a
    power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _bound(data, n, encodings, skip):
    """The encodings bound to the first row that loads (the first row, unless ``skip``)."""
    names = list(encodings)
    for i in range(n):
        try:
            first = _observation(data, i, names)
            return {k: _at_row(i, k, lambda: enc.bind(first[k]), data)
                    for k, enc in encodings.items()}
        except LoadError:
            if not skip or i == n - 1:
                raise


def _check_args(path, fields, chunk_bytes, num_threads):
    if not isinstance(fields, dict) or not fields:
        raise TypeError("fields must be a non-empty dict: field name -> encoding")
    encodings = {}
    for name, spec in fields.items():
        if not isinstance(name, str) or not name or "." in name:
            raise ValueError(f"a field name must be a non-empty str without '.', got {name!r}")
        encodings[name] = as_encoding(spec)
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be a positive int, got {chunk_bytes!r}")
    if num_threads is None:
        num_threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else (os.cpu_count() or 1)
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be a positive int or None, got {num_threads!r}")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"cannot write {path!r}: directory {parent!r} does not exist")
    if os.path.isdir(path):
        raise IsADirectoryError(f"cannot write {path!r}: it is a directory")
    return encodings, num_threads


def _spills(stack, tmp, encodings):
    """One ColumnSpill per column, each deleted when ``stack`` closes."""
    spills = []
    kinds = [kind for name, enc in encodings.items() for _, kind in enc.columns(name)]
    for k, kind in enumerate(kinds):
        spill = ColumnSpill(f"{tmp}.{k}", kind)
        stack.callback(spill.close)
        spills.append(spill)
    return spills


def _schema(pa, encodings, user_meta, bounds, arrays):
    """The file's schema, with the fastload metadata and the checksums of ``arrays``."""
    cols = [pa.field(col, arrow_type(pa, kind), nullable=False)
            for name, enc in encodings.items() for col, kind in enc.columns(name)]
    fields = json.dumps({name: enc.to_meta(name) for name, enc in encodings.items()}).encode()
    chunks = json.dumps(bounds).encode()
    sums = {"crc32": chunk_checksums(pa, arrays, bounds),
            "metadata": metadata_checksum(fields, chunks, user_meta)}
    return pa.schema(cols, metadata={META_FORMAT: str(FORMAT_VERSION).encode(),
                                     META_FIELDS: fields, META_CHUNKS: chunks,
                                     META_USER: user_meta,
                                     META_CHECKSUMS: json.dumps(sums).encode()})


def _at_row(i, field, fn, data):
    """``fn()``, with any exception re-raised as a LoadError naming row ``i`` (and the
    file it comes from, when ``data`` says)."""
    try:
        return fn()
    except LoadError as exc:
        if exc.index == i:
            raise  # getobs already named the row
        raise _row_error(i, field, exc, data) from exc
    except Exception as exc:
        raise _row_error(i, field, exc, data) from exc


def _row_error(i, field, exc, data):
    source = source_of(data, i)
    where = f"row {i}" + (f" ({source})" if source else "") + \
        (f", field {field!r}" if field else "")
    return LoadError(f"cannot write {where}: {type(exc).__name__}: {exc}",
                     index=i, source=source or field)


def _observation(data, i, names):
    """Observation ``i`` as a dict with the ``names`` fields."""
    def get():
        obs = getobs(data, i)
        if isinstance(obs, dict):
            missing = [k for k in names if k not in obs]
            if missing:
                raise KeyError(f"observation has no field(s) {missing}; it has {list(obs)}")
            return obs
        if isinstance(obs, (tuple, list)):
            if len(obs) != len(names):
                raise ValueError(f"observation is a {type(obs).__name__} of {len(obs)} values "
                                 f"for {len(names)} fields {names}")
            return dict(zip(names, obs))
        raise TypeError(f"an observation must be a dict or tuple, got {type(obs).__name__}")
    return _at_row(i, None, get, data)


def _encode_row(data, i, encodings, skip=False):
    """Row ``i`` encoded, field by field; with ``skip``, its LoadError instead of raising."""
    try:
        obs = _observation(data, i, list(encodings))
        return [_at_row(i, k, lambda: enc.encode(obs[k]), data)
                for k, enc in encodings.items()]
    except LoadError as exc:
        if not skip:
            raise
        return exc


def _encoded_rows(data, n, encodings, threads, skip):
    """Encoded rows in order (a LoadError for a row skipped), at most 4 * threads in
    flight (bounded memory)."""
    if threads == 1:
        for i in range(n):
            yield _encode_row(data, i, encodings, skip)
        return
    pool = ThreadPoolExecutor(threads, thread_name_prefix="fastload-write")
    pending = deque()
    try:
        for i in range(n):
            pending.append(pool.submit(_encode_row, data, i, encodings, skip))
            if len(pending) >= 4 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        # On an error or Ctrl-C: drop queued rows, wait only for the running ones.
        pool.shutdown(wait=True, cancel_futures=True)


def _spill_rows(rows, spills, chunk_bytes, n, progress, skipped):
    """Appends every row to the spills (a skipped row's LoadError to ``skipped``);
    returns the chunk boundaries [0, ..., rows written]."""
    bar = progress_bar(n, progress, "obs", "writing")
    bounds, size, i = [0], 0, 0
    try:
        for row in rows:
            if bar is not None:
                bar.update(1)
            if isinstance(row, LoadError):
                skipped.append(row)
                continue
            i += 1
            for spill, value in zip(spills, (v for parts in row for v in parts)):
                size += spill.append(value)
            if size >= chunk_bytes:
                bounds.append(i)
                size = 0
    finally:
        if bar is not None:
            bar.close()
    if bounds[-1] != i:
        bounds.append(i)
    return bounds
