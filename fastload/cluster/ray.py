"""Writing a Ray Dataset as a packed dataset: a Ray Data ``Datasink`` whose write tasks
each write a partition's part files, committed by ``on_write_complete`` on the driver
(``fastload/storage/parts.py``). This module imports ray."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

import ray.data
from ray.data.block import Block, BlockAccessor

from fastload.storage.parts import (
    DEFAULT_FILE_BYTES,
    Committed,
    Part,
    commit,
    engine_error,
    prepare,
    write_part,
)

__all__ = ["Datasink", "write_ray"]


class Datasink(ray.data.Datasink):
    """A Ray Data datasink writing the packed dataset ``prefix`` (a directory or a URL;
    ``storage_options``: fsspec's) with ``fields`` (and the other options, as
    ``write_part`` takes them): ``ds.write_datasink(Datasink(prefix, fields))``. Each
    write task writes its blocks' rows as one partition, numbered by the task's index;
    the rows are in the dataset's order when Ray Data preserves it
    (``DataContext.execution_options.preserve_order``, which ``write_ray`` sets). After
    the write, ``committed`` is the ``Committed`` dataset.

    Ray retries a task whose worker died; one that raised is run again when
    ``ray_remote_args`` of ``write_datasink`` say so (``{"retry_exceptions": True,
    "max_retries": 2}``). Raises FileExistsError at the start for a committed ``prefix``
    unless ``overwrite``; a task that fails for good fails the write with Ray's error,
    which holds the PartitionError naming the partition and the cause, and nothing is
    committed."""

    def __init__(
        self,
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
    ) -> None:
        self.prefix, self.fields, self.overwrite = prefix, fields, overwrite
        self.storage_options = storage_options
        options: dict[str, Any] = dict(storage_options=storage_options, file_bytes=file_bytes)
        options.update(block_bytes=block_bytes, on_error=on_error, metadata=metadata)
        options.update(source_field=source_field)
        self.options = options
        self.committed: Committed | None = None

    def get_name(self) -> str:
        return "fastload"

    def on_write_start(self, schema: Any = None) -> None:
        prepare(self.prefix, self.storage_options, self.overwrite)

    def write(self, blocks: Iterable[Block], ctx: Any) -> Part:
        return write_part(_rows(blocks), ctx.task_idx, self.prefix, self.fields, **self.options)

    def on_write_complete(self, write_result: Any) -> None:
        parts = list(write_result.write_returns)
        options: dict[str, Any] = dict(storage_options=self.storage_options)
        self.committed = commit(self.prefix, parts, len(parts), overwrite=self.overwrite, **options)


def _rows(blocks: Iterable[Block]) -> Iterator[dict[str, Any]]:
    for block in blocks:
        yield from BlockAccessor.for_block(block).iter_rows(public_row_format=True)


def write_ray(dataset: Any, prefix: str, fields: dict[str, Any], **options: Any) -> Committed:
    """Write the Ray Dataset ``dataset`` through a ``Datasink(prefix, fields,
    **options)``, in the dataset's order, a task that raised run twice more; returns the
    ``Committed`` dataset. Raises PartitionError naming the partition and the cause when
    a task fails for good (nothing is committed then)."""
    context = ray.data.DataContext.get_current()
    before = context.execution_options.preserve_order
    context.execution_options.preserve_order = True
    sink = Datasink(prefix, fields, **options)
    try:
        dataset.write_datasink(sink, ray_remote_args={"retry_exceptions": True, "max_retries": 2})
    except FileExistsError:
        raise
    except Exception as exc:
        raise engine_error(prefix, exc) from exc
    finally:
        context.execution_options.preserve_order = before
    assert sink.committed is not None
    return sink.committed
