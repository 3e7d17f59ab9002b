"""The packed format's schema metadata: version and per-field encodings.

Keys of the Arrow schema metadata:
- ``fastload.format``: the format version, a decimal integer (``b"1"``).
- ``fastload.fields``: JSON, field name -> {"encoding", "columns", parameters}.
- ``fastload.chunks``: JSON, the row boundaries [0, ..., rows] of the file's blocks.
- ``fastload.user``: JSON, the ``metadata`` dict given to ``write`` (class names, ...).
- ``fastload.checksums``: JSON, CRC-32s of the blocks and the metadata (``checksums.py``).
- ``fastload.source``: the name of a ``str`` field that holds where each row came from
  (its source file), named by errors in loading the row; absent when there is none.

Version rule: a reader opens files of its version or older and rejects newer ones.
Version 2 added ``fastload.checksums``; a version-2 file without it is corrupt (the key
was damaged), where a version-1 file is merely older.
Additions that older readers may ignore (a new metadata key, a new parameter with a
default) keep the version; anything that changes how existing columns are read bumps it.
"""

import json

import numpy as np

from fastload._storage.fields import from_meta

FORMAT_VERSION = 2  # 2: block checksums, which a version-2 file must have
META_FORMAT = b"fastload.format"
META_FIELDS = b"fastload.fields"
META_USER = b"fastload.user"
META_BLOCKS = b"fastload.chunks"
META_SOURCE = b"fastload.source"


def read_fields(schema_metadata, column_names):
    """The {field: (Encoding, [columns])} of a file from its schema metadata, or None when
    the file has no fastload metadata. Raises ValueError for an unknown version or
    metadata that does not match the columns."""
    meta = schema_metadata or {}
    if META_FORMAT not in meta:
        return None
    try:
        version = int(meta[META_FORMAT].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"bad fastload format version {meta[META_FORMAT][:20]!r}") from None
    if version > FORMAT_VERSION or version < 1:
        raise ValueError(
            f"fastload format version {version} is not supported (this "
            f"fastload reads versions 1..{FORMAT_VERSION}); upgrade fastload"
        )
    try:
        described = json.loads(meta[META_FIELDS].decode("utf-8"))
    except (KeyError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"bad fastload field metadata: {exc}") from None
    if not isinstance(described, dict):
        raise ValueError("bad fastload field metadata: not a JSON object")
    fields = {}
    for name, fmeta in described.items():
        if not isinstance(fmeta, dict):
            raise ValueError(f"bad fastload metadata for field {name!r}")
        enc = from_meta(fmeta)
        cols = [c for c, _ in enc.columns(name)]
        if fmeta.get("columns") != cols or any(c not in column_names for c in cols):
            raise ValueError(
                f"field {name!r}: metadata names columns {fmeta.get('columns')}, "
                f"the file has {list(column_names)}"
            )
        fields[name] = (enc, cols)
    return fields


def read_source_field(schema_metadata, fields):
    """The name of the ``str`` field of ``fields`` ({name: Encoding}) that holds each row's
    source, or None when the file names none (or names no such field)."""
    raw = (schema_metadata or {}).get(META_SOURCE)
    try:
        name = raw.decode("utf-8") if raw else None
    except UnicodeDecodeError:
        return None
    return name if name in fields and fields[name].name == "str" else None


def read_user(schema_metadata):
    """The user metadata dict of a file ({} when absent or unreadable)."""
    raw = (schema_metadata or {}).get(META_USER)
    try:
        value = json.loads(raw.decode("utf-8")) if raw else {}
    except (UnicodeDecodeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def read_blocks(schema_metadata, rows):
    """The block boundaries (int64, [0, ..., rows]) a file's metadata gives, or None when
    it has none. Raises ValueError when they do not describe ``rows`` rows."""
    raw = (schema_metadata or {}).get(META_BLOCKS)
    if raw is None:
        return None
    try:
        bounds = np.asarray(json.loads(raw.decode("utf-8")), dtype=np.int64)
    except (UnicodeDecodeError, ValueError, TypeError, OverflowError):
        raise ValueError("bad fastload block metadata") from None
    if (
        bounds.ndim != 1
        or len(bounds) < 2
        or bounds[0] != 0
        or bounds[-1] != rows
        or np.any(np.diff(bounds) <= 0)
    ):
        raise ValueError(f"fastload block metadata does not describe {rows} rows")
    return bounds
