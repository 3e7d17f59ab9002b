"""``python -m fastload convert SRC DST --engine ray|dask|spark``: a folder of class
subfolders of images packed by a cluster's engine into a dataset written in parts, with
the fields and metadata that ``convert`` gives a single file."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fastload._storage.fields import Encoding, Str
from fastload.imagefolder import ImageFolder
from fastload.storage.parts import Committed

__all__ = ["ENGINES", "convert_parts"]

ENGINES = ("ray", "dask", "spark")
ROWS_PER_PARTITION = 1000


class ImageRow:
    """A task's row of one image: ``{"image": its file's bytes, "label", "path"}`` from
    ``(path under root, label)`` (or a dict holding them, as Ray Data hands rows)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def __call__(self, item: Any) -> dict[str, Any]:
        path, label = (item["path"], item["label"]) if isinstance(item, Mapping) else item
        with open(os.path.join(self.root, path), "rb") as f:
            return {"image": f.read(), "label": int(label), "path": path}


@dataclass(frozen=True)
class _Run:
    """A conversion on an engine: ``items`` (path under the root, label) read into rows by
    ``row`` in ``partitions`` tasks and written to ``dst`` with ``fields`` and the
    writer's ``options``, on the cluster at ``address`` or a local one of ``workers``
    processes."""

    items: list[tuple[str, int]]
    row: ImageRow
    partitions: int
    dst: str
    fields: dict[str, Any]
    address: str | None
    workers: int
    options: dict[str, Any]

    def write(
        self, writer: Callable[..., Committed], collection: Any, progress: bool = True
    ) -> Committed:
        """``writer(collection, dst, fields, **options)``; ``progress=False`` leaves the
        ``progress`` option out, for an engine that shows its own."""
        options = {k: v for k, v in self.options.items() if progress or k != "progress"}
        return writer(collection, self.dst, self.fields, **options)


def convert_parts(
    src: str,
    dst: str,
    encoding: Encoding,
    engine: str,
    *,
    address: str | None = None,
    workers: int = 2,
    partitions: int | None = None,
    **options: Any,
) -> Committed:
    """Pack ``src/<class>/<image files>`` into the dataset ``dst`` (a directory or a URL)
    in parts, one task per partition (``partitions``: default one per 1000 images, at
    least two per worker), on ``engine``'s cluster at ``address``, or on a local one of
    ``workers`` processes started here (and stopped after). Fields ``image``
    (``encoding``), ``label`` and ``path``, as ``convert`` writes them; ``options``: as
    the engine's writer takes them (``storage_options``, ``on_error``, ``progress``,
    ``overwrite``). Raises ValueError for an unknown engine."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    folder = ImageFolder(src)
    root = os.path.abspath(folder.root)
    items = [(os.path.relpath(os.path.abspath(p), root), int(t)) for p, t in _labelled(folder)]
    n = partitions or max(2 * workers, -(-len(items) // ROWS_PER_PARTITION))
    fields = {"image": encoding, "label": "int64", "path": Str()}
    options.update(metadata={"classes": folder.classes, "source": root}, source_field="path")
    run = _Run(items, ImageRow(root), n, dst, fields, address, workers, options)
    return {"ray": _ray, "dask": _dask, "spark": _spark}[engine](run)


def _labelled(folder: ImageFolder) -> list[tuple[str, int]]:
    return list(zip(folder.paths, (int(label) for label in folder.labels)))


def _dask(run: _Run) -> Committed:
    import dask.bag as db
    from distributed import Client

    from fastload.cluster.dask import write_dask

    cluster = None if run.address else local_dask_cluster(run.workers)
    try:
        with Client(run.address or cluster):
            bag = db.from_sequence(run.items, npartitions=run.partitions).map(run.row)
            return run.write(write_dask, bag)
    finally:
        if cluster is not None:
            cluster.close()


def local_dask_cluster(workers: int, lean: bool = True) -> Any:
    """A ``distributed.LocalCluster`` of ``workers`` processes of one thread each, started
    with Dask's diagnostics lean (``LEAN_DIAGNOSTICS``; at Dask's defaults if not
    ``lean``): the conversion is its only work."""
    import dask
    from distributed import LocalCluster

    from fastload.cluster.dask import LEAN_DIAGNOSTICS

    with dask.config.set(LEAN_DIAGNOSTICS if lean else {}):
        return LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
        )


def _ray(run: _Run) -> Committed:
    import ray

    from fastload.cluster.ray import write_ray

    workers = None if run.address else run.workers
    ray.init(address=run.address, num_cpus=workers, include_dashboard=False)
    try:
        records = [{"path": p, "label": t} for p, t in run.items]
        dataset = ray.data.from_items(records, override_num_blocks=run.partitions).map(run.row)
        return run.write(write_ray, dataset, progress=False)  # Ray Data shows its own
    finally:
        ray.shutdown()


def _spark(run: _Run) -> Committed:
    import sys

    from pyspark.sql import SparkSession

    from fastload.cluster.spark import write_spark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    master = run.address or f"local[{run.workers},3]"
    spark = SparkSession.builder.master(master).appName("fastload convert").getOrCreate()
    try:
        rdd = spark.sparkContext.parallelize(run.items, run.partitions).map(run.row)
        return run.write(write_spark, rdd, progress=False)  # Spark shows its own
    finally:
        spark.stop()
