"""Packed datasets written by a cluster's engine, one task per partition, committed whole.

``write_dask`` (a Dask bag or dataframe), ``write_spark`` (a Spark DataFrame) and
``Datasink`` (Ray Data: ``ds.write_datasink(Datasink(prefix, fields))``) run
``write_part`` in each task and ``commit`` on the driver (``fastload/storage/parts.py``):
the dataset at the prefix appears whole, through its manifest, or not at all
(docs/cluster.md). ``clean`` removes the parts that no manifest lists. No engine is
imported until one of them runs.
"""

from typing import Any

from fastload.cluster.dask import write_dask
from fastload.cluster.spark import write_spark
from fastload.storage.parts import (
    Committed,
    Part,
    PartitionError,
    clean,
    commit,
    prepare,
    write_part,
)

__all__ = [
    "Committed",
    "Datasink",
    "Part",
    "PartitionError",
    "clean",
    "commit",
    "prepare",
    "write_dask",
    "write_part",
    "write_ray",
    "write_spark",
]
assert __all__ == sorted(__all__)


def __getattr__(name: str) -> Any:
    # Ray Data's Datasink subclasses Ray's: ray is imported when it or write_ray is asked for.
    if name in ("Datasink", "write_ray"):
        from fastload.cluster import ray

        return getattr(ray, name)
    raise AttributeError(f"module 'fastload.cluster' has no attribute {name!r}")
