"""Writing a packed dataset in parts, one task per partition, committed whole.

What any engine runs (``fastload.cluster`` wraps it in Ray's, Dask's and Spark's idioms),
the write's settings checked once, on the driver, as a ``PartWrite`` that each task gets::

    driver: prepare(prefix)                  the folder made; a committed dataset there
                                             kept unless overwrite=True
    task:   write_part(rows, partition, ...) rows -> part files under a new attempt id,
                                             encoded by ``write`` (the same bytes);
                                             returns a ``Part``, or raises PartitionError
                                             naming the partition and the cause
    driver: commit(prefix, parts, n)         one Part per partition 0..n-1, their files
                                             checked (and a committed dataset there
                                             kept unless overwrite=True), the manifest
                                             published last and at once; the parts of
                                             other attempts removed

Until the manifest is there, ``open(prefix)`` refuses the parts (the write was not
committed); after it, it reads exactly the manifest's files in partition order, so a
retried, duplicated or failed attempt is never read.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any, Literal

import numpy as np

from fastload._base.arguments import check_flag, check_size
from fastload._storage.fields import Encoding, as_encoding
from fastload._storage.manifest import (
    MANIFEST,
    is_part,
    listed_files,
    manifest_bytes,
    new_attempt,
    parse_manifest,
    part_name,
)
from fastload._storage.prefixes import Prefix
from fastload.errors import LoadError
from fastload.storage.partfiles import Skipped, part_files
from fastload.storage.writer import DEFAULT_BLOCK_BYTES, DEFAULT_URL_BLOCK_BYTES

__all__ = ["Committed", "Part", "PartitionError", "clean", "commit", "prepare", "write_part"]

DEFAULT_FILE_BYTES = 512 << 20  # of input rows buffered per part file


class PartitionError(RuntimeError):
    """A partition of a write in parts failed: ``partition`` names it (None when the
    engine's error did not say which), the message says why."""

    def __init__(self, partition: int | None, message: str) -> None:
        super().__init__(message)
        self.partition = partition

    def __reduce__(self) -> tuple[type[PartitionError], tuple[int | None, str]]:
        return type(self), (self.partition, str(self))


@dataclass(frozen=True)
class Part:
    """What one task wrote: ``partition``'s ``attempt``, its ``files`` (names under the
    prefix) holding ``rows`` rows; ``skipped``: (row in the partition, source, message)
    of each row left out with ``on_error="skip"``."""

    partition: int
    attempt: str
    files: tuple[str, ...]
    rows: int
    skipped: tuple[Skipped, ...] = ()


@dataclass(frozen=True)
class Committed:
    """A committed dataset: its ``prefix``, its ``rows`` and ``files`` (in partition
    order), the ``LoadError`` of each row left out (``skipped``) and the files of other
    attempts that the commit removed (``removed``)."""

    prefix: str
    rows: int
    files: list[str]
    skipped: list[LoadError] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PartWrite:
    """The settings of one write in parts, checked once, where they are given: the
    dataset ``prefix`` (a directory or a URL; ``storage_options``: fsspec's), its
    ``fields``, how each partition is written (``file_bytes``, ``block_bytes``,
    ``on_error``, ``metadata``, ``source_field``: as ``write_part`` takes them) and
    whether the commit replaces a committed dataset (``overwrite``).

    An engine makes it on its driver and hands it to each task: ``prepare()``, then
    ``write(rows, partition)`` in each task, then ``commit(parts, partitions)``. Raises
    TypeError/ValueError naming the setting that ``write`` would refuse in every task."""

    prefix: str
    fields: dict[str, Encoding | str | np.dtype[Any]]
    storage_options: Mapping[str, Any] | None = None
    overwrite: bool = False
    file_bytes: int = DEFAULT_FILE_BYTES
    block_bytes: int | None = None
    on_error: Literal["raise", "skip"] = "raise"
    metadata: dict[str, Any] | None = None
    source_field: str | None = None

    def __post_init__(self) -> None:
        _check_settings(self)

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> PartWrite:
        """The settings among ``arguments``, by name: a writer's ``locals()`` on its first
        line, whose other parameters (the rows, ``retries``, ...) are not settings."""
        names = [f.name for f in dataclass_fields(cls)]
        return cls(**{name: arguments[name] for name in names if name in arguments})

    def prepare(self) -> None:
        """``prepare`` of the prefix, on the driver before the tasks."""
        prepare(self.prefix, self.storage_options, self.overwrite)

    def write(self, rows: Iterable[Any], partition: int) -> Part:
        """``write_part`` of ``rows`` as ``partition``, in a task."""
        if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
            raise ValueError(f"partition must be an int >= 0, got {partition!r}")
        attempt = new_attempt()
        try:
            folder = Prefix(self.prefix, self.storage_options)
            folder.make()
            name = functools.partial(part_name, partition, attempt)
            options = self._write_options(folder.remote)
            files, total, skipped = part_files(
                rows, name, folder, self.fields, self.file_bytes, options
            )
        except Exception as exc:
            raise PartitionError(partition, failure(partition, attempt, exc)) from exc
        return Part(partition, attempt, tuple(files), total, tuple(skipped))

    def commit(self, parts: Iterable[Part], partitions: int) -> Committed:
        """``commit`` of what the tasks returned, on the driver."""
        where, overwrite = self.storage_options, self.overwrite
        return commit(self.prefix, parts, partitions, storage_options=where, overwrite=overwrite)

    def engine_error(self, error: BaseException) -> PartitionError:
        """``engine_error`` of what the engine raised for this write."""
        return engine_error(self.prefix, error)

    def _write_options(self, remote: bool) -> dict[str, Any]:
        """``write``'s keywords for a part file in a folder at a URL (``remote``) or not:
        ``block_bytes`` by default as ``write`` picks it for the part's final place."""
        default = DEFAULT_URL_BLOCK_BYTES if remote else DEFAULT_BLOCK_BYTES
        block_bytes = default if self.block_bytes is None else self.block_bytes
        options = dict(metadata=self.metadata, source_field=self.source_field)
        return dict(block_bytes=block_bytes, on_error=self.on_error, **options)


def _check_settings(settings: PartWrite) -> None:
    """Raises TypeError/ValueError naming the first setting that ``write`` refuses."""
    fields = settings.fields
    if not isinstance(fields, dict) or not fields:
        raise TypeError("fields must be a non-empty dict: field name -> encoding")
    encodings = {name: as_encoding(spec) for name, spec in fields.items()}
    source = settings.source_field
    if source is not None and (source not in encodings or encodings[source].name != "str"):
        raise ValueError(f"source_field must name a Str() field of fields, got {source!r}")
    if settings.on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {settings.on_error!r}")
    check_size("file_bytes", settings.file_bytes)
    if settings.block_bytes is not None:
        check_size("block_bytes", settings.block_bytes)
    check_flag("overwrite", settings.overwrite)
    json.dumps(settings.metadata)  # TypeError for metadata that is not JSON


def prepare(
    prefix: str, storage_options: Mapping[str, Any] | None = None, overwrite: bool = False
) -> None:
    """Make the folder ``prefix`` ready for a write in parts. Raises FileExistsError
    when it holds a committed dataset and ``overwrite`` is False (with True, the commit
    replaces it: its manifest first, then its files are removed)."""
    folder = Prefix(prefix, storage_options)
    folder.make()
    if not overwrite and MANIFEST in folder.names():
        raise FileExistsError(
            f"{prefix} holds a committed dataset ({MANIFEST}); pass overwrite=True to replace it"
        )


def write_part(
    rows: Iterable[Any],
    partition: int,
    prefix: str,
    fields: dict[str, Encoding | str | np.dtype[Any]],
    *,
    storage_options: Mapping[str, Any] | None = None,
    file_bytes: int = DEFAULT_FILE_BYTES,
    block_bytes: int | None = None,
    on_error: Literal["raise", "skip"] = "raise",
    metadata: dict[str, Any] | None = None,
    source_field: str | None = None,
) -> Part:
    """Encode the ``rows`` of ``partition`` (dicts, tuples in the order of ``fields``,
    or records with ``asDict()``) into part files under ``prefix`` (a directory or a
    URL), under a new attempt id: a new file after each ``file_bytes`` of input, each
    written by ``write`` (``fields``, ``block_bytes``, ``on_error``, ``metadata``,
    ``source_field``: as ``write`` takes them; ``block_bytes`` by default 4 MiB at a
    URL, 64 MiB in a local folder, as ``write`` picks), on the caller's thread alone.

    Raises TypeError/ValueError for a setting that ``write`` refuses (as ``PartWrite``
    does), and PartitionError naming the partition and the cause for anything that fails
    (a row with ``on_error="raise"``, the destination); the files written before stay,
    never read (``clean`` removes them)."""
    return PartWrite.of(locals()).write(rows, partition)


def failure(partition: int, attempt: str, exc: BaseException) -> str:
    """The message of partition ``partition``'s failure: the marker that ``engine_error``
    finds in whatever an engine makes of it."""
    return f"fastload partition {partition} failed (attempt {attempt}): {type(exc).__name__}: {exc}"


def commit(
    prefix: str,
    parts: Iterable[Part],
    partitions: int,
    *,
    storage_options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> Committed:
    """Commit a write in parts: one ``Part`` per partition 0..``partitions``-1 (the first
    given of each, when an engine reports two), their files checked, then the manifest
    published at once; the part files of other attempts are removed after it.

    Raises FileExistsError when ``prefix`` holds a committed dataset (one there at
    ``prepare``, or one committed since) and ``overwrite`` is False, PartitionError
    naming the partitions without a part, or whose files are not there, and ValueError
    for a write of no rows: nothing is committed then."""
    folder = Prefix(prefix, storage_options)
    chosen = _one_per_partition(parts, partitions)
    names = folder.names()
    if not overwrite and MANIFEST in names:
        raise FileExistsError(
            f"nothing was committed at {prefix}: it holds a committed dataset ({MANIFEST}), "
            "committed since the write began; pass overwrite=True to replace it"
        )
    present = set(names)
    for part in chosen:
        missing = [name for name in part.files if name not in present]
        if missing:
            raise PartitionError(
                part.partition,
                f"nothing was committed at {prefix}: partition {part.partition}'s file "
                f"{missing[0]} is not there (removed while the write ran?)",
            )
    rows = sum(part.rows for part in chosen)
    if rows == 0:
        raise ValueError(f"nothing was committed at {prefix}: the write has no rows")
    entries = [(p.partition, p.attempt, p.files, p.rows) for p in chosen]
    folder.publish(MANIFEST, manifest_bytes(entries))
    listed = {name for part in chosen for name in part.files}
    stale = sorted(name for name in names if is_part(name) and name not in listed)
    folder.remove(stale)
    skipped = [_skipped(part.partition, *s) for part in chosen for s in part.skipped]
    files = [name for part in chosen for name in part.files]
    return Committed(folder.where, rows, files, skipped, stale)


def _one_per_partition(parts: Iterable[Part], partitions: int) -> list[Part]:
    chosen: dict[int, Part] = {}
    for part in parts:
        if not isinstance(part, Part):
            raise TypeError(f"commit takes the Parts that write_part returned, got {part!r}")
        chosen.setdefault(part.partition, part)
    missing = [p for p in range(partitions) if p not in chosen]
    extra = [p for p in chosen if not 0 <= p < partitions]
    if missing or extra:
        which = missing or extra
        raise PartitionError(
            which[0],
            f"nothing was committed: partitions {which[:10]} "
            + ("have no part that succeeded" if missing else f"are not among 0..{partitions - 1}"),
        )
    return [chosen[p] for p in range(partitions)]


def _skipped(partition: int, index: int | None, source: str | None, message: str) -> LoadError:
    return LoadError(f"partition {partition}: {message}", index=index, source=source)


def clean(prefix: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """Remove from ``prefix`` the part files that its manifest does not list (failed or
    duplicate attempts); with no manifest, every part file (a write that was not
    committed). Returns the names removed. Run it when no write to ``prefix`` is
    running: a write's parts are not listed until its commit."""
    folder = Prefix(prefix, storage_options)
    names = folder.names()
    listed: set[str] = set()
    if MANIFEST in names:
        listed = set(listed_files(parse_manifest(folder.read(MANIFEST), f"{prefix}/{MANIFEST}")))
    stale = sorted(name for name in names if is_part(name) and name not in listed)
    stale += sorted(name for name in names if _TEMPORARY.fullmatch(name))
    folder.remove(stale)
    return stale


_TEMPORARY = re.compile(r"\." + re.escape(MANIFEST) + r"\.[0-9a-f]{12}\.tmp")


_MARKER = re.compile(r"fastload partition (\d+) failed \(attempt [0-9a-f]+\): ([^\n]*)")


def engine_error(prefix: str, error: BaseException) -> PartitionError:
    """The PartitionError to raise for ``error``, what an engine raised for a write in
    parts: the partition and the cause found in it (through its causes and message),
    saying that nothing was committed."""
    seen: list[BaseException] = []
    at: BaseException | None = error
    while at is not None and at not in seen:
        seen.append(at)
        at = at.__cause__ or at.__context__
    # The marker's line, not the engine's rendering of the error (a traceback, colours).
    match = _MARKER.search("\n".join(str(e) for e in seen))
    if match is not None:
        partition, cause = int(match[1]), match[0]
        return PartitionError(partition, f"nothing was committed at {prefix}: {cause}")
    return PartitionError(
        None, f"nothing was committed at {prefix}: {type(error).__name__}: {error}"
    )
