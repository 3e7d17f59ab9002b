"""Writing a Spark DataFrame (or RDD) as a packed dataset: a task per partition
(``mapPartitionsWithIndex``), committed by the driver (``fastload/storage/parts.py``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

from fastload.storage.parts import DEFAULT_FILE_BYTES, Committed, Part, PartWrite

__all__ = ["write_spark"]


def write_spark(
    frame: Any,
    prefix: str,
    fields: dict[str, Any],
    *,
    storage_options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    file_bytes: int = DEFAULT_FILE_BYTES,
    block_bytes: int | None = None,
    on_error: Literal["raise", "skip"] = "raise",
    metadata: dict[str, Any] | None = None,
    source_field: str | None = None,
) -> Committed:
    """Write the rows of ``frame`` (a Spark DataFrame whose columns hold the fields, or
    an RDD of dicts or tuples) as the packed dataset ``prefix`` (a directory or a URL;
    ``storage_options``: fsspec's): one task per partition, tried again as Spark's
    ``spark.task.maxFailures`` says (``local[n, tries]`` on a local master); a
    speculative or retried duplicate is never read. The rows are in partition order,
    then row order. ``fields`` and the other options: as ``write_part`` takes them.

    Returns the ``Committed`` dataset; raises as ``write_dask`` does: for a bad setting
    before any task, for a committed ``prefix`` unless ``overwrite``, and PartitionError
    naming the partition and the cause when a task fails for good (nothing is committed
    then)."""
    settings = PartWrite.of(locals())
    settings.prepare()
    rdd = frame.rdd if hasattr(frame, "rdd") else frame

    def task(index: int, rows: Iterable[Any]) -> Iterator[Part]:
        yield settings.write(rows, index)

    try:
        parts = rdd.mapPartitionsWithIndex(task).collect()
    except Exception as exc:
        raise settings.engine_error(exc) from exc
    return settings.commit(parts, rdd.getNumPartitions())
