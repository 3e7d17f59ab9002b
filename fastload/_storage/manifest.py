"""The manifest of a dataset written in parts: what makes the parts of one write visible
together.

A write spread over a cluster's tasks leaves, under its prefix (a folder, or a URL
prefix), one or more **part files** per partition and attempt, then the **manifest**,
written last and at once (a rename; a single PUT on an object store)::

    PREFIX/part-00000-<attempt>-000.arrow    partition 0, the attempt that succeeded
    PREFIX/part-00001-<attempt>-000.arrow
    PREFIX/part-00001-<attempt>-001.arrow    a partition may write several files
    PREFIX/part-00001-<other>-000.arrow      a failed or duplicate attempt: never read
    PREFIX/_fastload_manifest.json           {"fastload": "manifest", "version": 1,
                                               "rows": N, "partitions": [{"partition": 0,
                                               "attempt": ..., "files": [...], "rows": n},
                                               ...]}

``open(PREFIX)`` reads the files the manifest lists, partition by partition; a prefix
with part files and no manifest was not committed (its job died, or is still running),
and opening it is an error. A folder without part files opens as before (its dataset
files in name order).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from fastload.errors import LoadError

__all__ = [
    "MANIFEST",
    "committed_folder",
    "committed_names",
    "is_part",
    "listed_files",
    "manifest_bytes",
    "new_attempt",
    "parse_manifest",
    "part_name",
]

MANIFEST = "_fastload_manifest.json"
VERSION = 1
_PART = re.compile(r"part-(?P<partition>\d{5,})-(?P<attempt>[0-9a-f]{16})-(?P<file>\d{3,})\.arrow")
_ATTEMPT = re.compile(r"[0-9a-f]{16}")


def new_attempt() -> str:
    """A new attempt id: 16 random hex digits."""
    import uuid

    return uuid.uuid4().hex[:16]


def part_name(partition: int, attempt: str, k: int) -> str:
    """The name of file ``k`` of ``partition``'s ``attempt``."""
    return f"part-{partition:05d}-{attempt}-{k:03d}.arrow"


def is_part(name: str) -> bool:
    """Whether ``name`` (a file's name, no folder) is a part file's."""
    return _PART.fullmatch(name) is not None


def manifest_bytes(partitions: Sequence[tuple[int, str, Sequence[str], int]]) -> bytes:
    """The manifest of ``partitions``: (partition, attempt, file names, rows) each, in
    partition order."""
    entries = [
        {"partition": p, "attempt": a, "files": list(files), "rows": rows}
        for p, a, files, rows in partitions
    ]
    total = sum(rows for *_, rows in partitions)
    document = {"fastload": "manifest", "version": VERSION, "rows": total, "partitions": entries}
    return json.dumps(document, indent=1).encode()


def parse_manifest(data: bytes, where: str) -> list[dict[str, Any]]:
    """The partitions a manifest lists, checked: numbered 0, 1, ... in order, each with
    its attempt's part files. Raises LoadError naming ``where`` for anything else."""
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise LoadError(f"{where}: the manifest is not JSON: {exc}", source=where) from None
    if not isinstance(document, dict) or document.get("fastload") != "manifest":
        raise LoadError(f"{where}: not a fastload manifest", source=where)
    if document.get("version") != VERSION:
        raise LoadError(
            f"{where}: manifest version {document.get('version')!r} is not supported (this "
            f"fastload reads version {VERSION}); upgrade fastload",
            source=where,
        )
    partitions = document.get("partitions")
    if not isinstance(partitions, list):
        raise LoadError(f"{where}: the manifest lists no partitions", source=where)
    for k, entry in enumerate(partitions):
        _check_entry(entry, k, where)
    return partitions


def _check_entry(entry: Any, k: int, where: str) -> None:
    """Raises LoadError unless ``entry`` is partition ``k``'s: its attempt's part files."""
    ok = (
        isinstance(entry, dict)
        and entry.get("partition") == k
        and isinstance(entry.get("attempt"), str)
        and _ATTEMPT.fullmatch(entry["attempt"]) is not None
        and isinstance(entry.get("rows"), int)
        and isinstance(entry.get("files"), list)
    )
    if ok:
        wanted = [part_name(k, entry["attempt"], i) for i in range(len(entry["files"]))]
        ok = entry["files"] == wanted
    if not ok:
        raise LoadError(f"{where}: the manifest's entry {k} is not partition {k}'s", source=where)


def listed_files(partitions: Iterable[dict[str, Any]]) -> list[str]:
    """The part files of ``parse_manifest``'s partitions, in partition order."""
    return [name for entry in partitions for name in entry["files"]]


def committed_names(
    names: Iterable[str], read: Callable[[], bytes], where: str
) -> list[str] | None:
    """The dataset files of the folder ``where`` whose entries are ``names``: those its
    manifest lists, in partition order (``read()`` returns the manifest's bytes); None
    for a folder with neither a manifest nor part files (it opens as before).

    Raises LoadError for part files without a manifest (a write that was not committed)
    and for a manifest that lists a file the folder does not have."""
    present = set(names)
    if MANIFEST not in present:
        parts = sorted(name for name in present if is_part(name))
        if parts:
            raise LoadError(
                f"{where}: {len(parts)} part files and no {MANIFEST}: a write that was not "
                f"committed (its job failed, or is still running); write it again, or "
                f"remove the parts with `python -m fastload clean {where}`",
                source=where,
            )
        return None
    files = listed_files(parse_manifest(read(), f"{where}/{MANIFEST}"))
    missing = [name for name in files if name not in present]
    if missing:
        raise LoadError(
            f"{where}: the manifest lists {len(missing)} part files that are not there "
            f"({missing[0]}, ...): the dataset is incomplete",
            source=where,
        )
    if not files:
        raise LoadError(f"{where}: the manifest lists no rows", source=where)
    return files


def committed_folder(folder: str) -> list[str] | None:
    """``committed_names`` of the local directory ``folder``, as paths."""
    import os

    def read() -> bytes:
        with open(os.path.join(folder, MANIFEST), "rb") as f:
            return f.read()

    names = committed_names(os.listdir(folder), read, folder)
    return None if names is None else [os.path.join(folder, name) for name in names]
