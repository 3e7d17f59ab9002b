"""Writing a Ray Dataset as a packed dataset: a Ray Data ``Datasink`` whose write tasks
each write a partition's part files, committed by ``on_write_complete`` on the driver
(``fastload/storage/parts.py``). This module imports ray."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

import ray.data
from ray.data.block import Block, BlockAccessor

from fastload.storage.parts import DEFAULT_FILE_BYTES, Committed, Part, PartWrite

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
    "max_retries": 2}``). Raises TypeError/ValueError when made with a setting that
    ``write`` refuses, FileExistsError at the start for a committed ``prefix`` unless
    ``overwrite``; a task that fails for good fails the write with Ray's error,
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
        self.settings = PartWrite.of(locals())
        self.committed: Committed | None = None

    def get_name(self) -> str:
        return "fastload"

    def on_write_start(self, schema: Any = None) -> None:
        self.settings.prepare()

    def write(self, blocks: Iterable[Block], ctx: Any) -> Part:
        return self.settings.write(_rows(blocks), ctx.task_idx)

    def on_write_complete(self, write_result: Any) -> None:
        parts = list(write_result.write_returns)
        self.committed = self.settings.commit(parts, len(parts))


def _rows(blocks: Iterable[Block]) -> Iterator[dict[str, Any]]:
    for block in blocks:
        yield from BlockAccessor.for_block(block).iter_rows(public_row_format=True)


def write_ray(dataset: Any, prefix: str, fields: dict[str, Any], **options: Any) -> Committed:
    """Write the Ray Dataset ``dataset`` through a ``Datasink(prefix, fields,
    **options)``, in the dataset's order, a task that raised run twice more; returns the
    ``Committed`` dataset. Raises as ``Datasink`` does for a bad setting, and
    PartitionError naming the partition and the cause when a task fails for good
    (nothing is committed then)."""
    sink = Datasink(prefix, fields, **options)  # its settings checked before anything else
    context = ray.data.DataContext.get_current()
    before = context.execution_options.preserve_order
    context.execution_options.preserve_order = True
    try:
        dataset.write_datasink(sink, ray_remote_args={"retry_exceptions": True, "max_retries": 2})
    except FileExistsError:
        raise
    except Exception as exc:
        raise sink.settings.engine_error(exc) from exc
    finally:
        context.execution_options.preserve_order = before
    assert sink.committed is not None
    return sink.committed
