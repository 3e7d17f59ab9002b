"""Writing a Dask bag or dataframe as a packed dataset: a task per partition, committed
by the client (``fastload/storage/parts.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from fastload._storage.progress import progress_bar
from fastload.storage.parts import DEFAULT_FILE_BYTES, Committed, Part, PartWrite

__all__ = ["LEAN_DIAGNOSTICS", "write_dask"]

# Dask's config for a cluster whose work is a conversion on few cores (docs/cluster.md,
# "On a small machine"), set around the cluster's start (``dask.config.set``), which its
# scheduler and workers read: each worker's statistical profiler, which samples the stacks
# of its task threads every 10 ms on a thread of its own, off; the event loop's health
# tick of the scheduler, each nanny and each worker every second, not every 20 ms. Both
# take the GIL and a core's time from CPU-bound tasks, and are diagnostics only.
LEAN_DIAGNOSTICS: dict[str, Any] = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
}


def write_dask(
    collection: Any,
    prefix: str,
    fields: dict[str, Any],
    *,
    storage_options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    retries: int = 2,
    progress: bool = False,
    file_bytes: int = DEFAULT_FILE_BYTES,
    block_bytes: int | None = None,
    on_error: Literal["raise", "skip"] = "raise",
    metadata: dict[str, Any] | None = None,
    source_field: str | None = None,
) -> Committed:
    """Write the rows of ``collection`` (a Dask bag of dicts or tuples, or a Dask
    dataframe whose columns hold the fields) as the packed dataset ``prefix`` (a
    directory or a URL; ``storage_options``: fsspec's): one task per partition, on the
    distributed client in use (``distributed.Client``) or else Dask's default
    scheduler; a task that raises is run again up to ``retries`` times (one whose worker
    died, as Dask's ``allowed-failures`` says). The rows are in partition order, then
    row order. ``progress``: a bar over the partitions (with a distributed client).
    ``fields`` and the other options: as ``write_part`` takes them.

    Returns the ``Committed`` dataset. Raises TypeError/ValueError for a setting that
    ``write`` refuses (before any task), FileExistsError for a committed ``prefix``
    unless ``overwrite``, and PartitionError naming the partition and the cause when a
    task fails for good: nothing is committed then."""
    settings = PartWrite.of(locals())
    import dask

    settings.prepare()
    task = dask.delayed(_write_partition, pure=False)
    tasks = [task(p, i, settings) for i, p in enumerate(collection.to_delayed())]
    try:
        parts = _computed(tasks, retries, progress)
    except Exception as exc:
        raise settings.engine_error(exc) from exc
    return settings.commit(parts, len(tasks))


def _write_partition(partition: Any, index: int, settings: PartWrite) -> Part:
    """A task: partition ``index`` (a list of rows, or a pandas DataFrame) written."""
    if hasattr(partition, "to_dict") and hasattr(partition, "columns"):
        partition = partition.to_dict("records")
    return settings.write(partition, index)


def _fused(tasks: list[Any]) -> list[Any]:
    """``tasks`` (Dask delayed objects) optimized here, each fused with the linear chain
    of tasks before it: one task per partition computes its rows and writes them."""
    import dask

    with dask.config.set({"optimization.fuse.delayed": True}):  # here, not on the scheduler
        return list(dask.optimize(*tasks))


def _computed(tasks: list[Any], retries: int, progress: bool) -> list[Any]:
    """The results of ``tasks``: on the distributed client in use (its futures cancelled
    when one fails for good), else on Dask's default scheduler; each ``_fused`` first:
    the rows never wait in a worker's memory between two tasks, and a task not yet
    started holds no data, so the scheduler gives each to the next worker free, or moves
    it there. Unfused, a worker that had read a few partitions ahead wrote them all while
    another had nothing left to do."""
    import dask

    tasks = _fused(tasks)
    try:
        from distributed import as_completed, get_client

        client = get_client()
    except (ImportError, ValueError):  # no distributed client: Dask's default scheduler
        return list(dask.compute(*tasks, optimize_graph=False))
    futures = client.compute(tasks, retries=retries, optimize_graph=False)
    bar = progress_bar(len(futures), progress, "partitions", "writing")
    try:
        for future in as_completed(futures):
            if future.status == "error":
                future.result()  # raises the task's error
            if bar is not None:
                bar.update(1)
        return list(client.gather(futures))
    finally:
        if bar is not None:
            bar.close()
        client.cancel(futures)
