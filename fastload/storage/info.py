"""A human-readable summary of a packed dataset (``python -m fastload info``)."""

import collections

import simplejpeg

from fastload._storage.fields import FORMAT_JPEG

__all__ = ["chroma", "describe", "format_bytes"]

# The rows whose JPEG headers ``chroma`` reads: the first ones, in the first block, so that
# ``info`` reads (and checks the checksum of) one block, whatever the file's size.
CHROMA_ROWS = 64


def format_bytes(n):
    """``n`` bytes as a short string with a binary unit ("1.5 MiB")."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def describe(ds):
    """Lines describing ``ds``: files, rows, blocks, sizes, and one line per field."""
    where = "on disk" if getattr(ds, "remote_rows", None) is None else "in the store"
    lines = [
        f"files:  {len(ds.files)} ({', '.join(ds.files[:3])}"
        f"{', ...' if len(ds.files) > 3 else ''})",
        f"rows:   {len(ds)}",
        f"blocks: {ds.num_blocks}",
        f"size:   {format_bytes(ds.nbytes)} {where}",
    ]
    if ds.metadata.get("classes"):
        classes = ds.metadata["classes"]
        lines.append(
            f"classes: {len(classes)} ({', '.join(map(str, classes[:5]))}"
            f"{', ...' if len(classes) > 5 else ''})"
        )
    sizes = ds.field_nbytes()
    width = max(len(k) for k in ds.keys())
    lines.append("fields:")
    for name in ds.keys():
        enc = ds.fields[name]
        desc = repr(enc) if enc is not None else "arrow"
        lines.append(
            f"  {name:<{width}}  {ds[name].encoding:<8} {format_bytes(sizes[name]):>10}  {desc}"
        )
        if ds[name].encoding in ("jpeg", "smart"):
            lines.append(f"  {'':<{width}}  {chroma(ds[name])}")
    return lines


def chroma(column, rows=CHROMA_ROWS):
    """The chroma subsampling of the JPEGs stored in the first ``rows`` rows of a jpeg or
    smart ``column``, read from their headers: "chroma: 4:2:0 in 64 of the first 64 rows".
    The field's ``subsampling`` is what fastload encodes with; JPEG input stored as given
    keeps its own, which this shows."""
    n = min(rows, len(column))
    formats = column.format[:n] if column.encoding == "smart" else [FORMAT_JPEG] * n
    found = collections.Counter(
        _sampling(column.encoded[i]) for i in range(n) if formats[i] == FORMAT_JPEG
    )
    if not found:
        return f"chroma: no JPEG in the first {n} rows"
    counts = ", ".join(f"{name} in {k}" for name, k in found.most_common())
    return f"chroma: {counts} of the first {n} rows"


def _sampling(data):
    """A JPEG's chroma subsampling from its header: "4:2:0", "4:4:4", ..., "gray", or
    "unreadable"."""
    try:
        sampling = simplejpeg.decode_jpeg_header(bytes(data))[3]
    except ValueError:
        return "unreadable"
    return ":".join(sampling) if sampling.isdigit() else sampling.lower()
