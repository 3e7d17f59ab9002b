"""A human-readable summary of a packed dataset (``python -m fastload info``)."""

__all__ = ["describe", "format_bytes"]


def format_bytes(n):
    """``n`` bytes as a short string with a binary unit ("1.5 MiB")."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def describe(ds):
    """Lines describing ``ds``: files, rows, blocks, sizes, and one line per field."""
    lines = [
        f"files:  {len(ds.files)} ({', '.join(ds.files[:3])}"
        f"{', ...' if len(ds.files) > 3 else ''})",
        f"rows:   {len(ds)}",
        f"blocks: {ds.num_blocks}",
        f"size:   {format_bytes(ds.nbytes)} on disk",
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
    return lines
