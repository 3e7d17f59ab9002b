"""Dask writes packed datasets in parts (``fastload.cluster.write_dask``) on a real
distributed cluster of two worker processes: a bag and a dataframe, to a folder and to
moto's S3 server, equal byte for byte to ``fastload.write`` of the same rows; a worker
killed mid-task, a task that raises once, one that fails for good, a store that refuses
writes, and bad rows skipped (``partsets.EngineWrites``)."""

import pytest
from partsets import (
    FIELDS,
    EngineWrites,
    assert_same_as_write,
    make_rows,
    s3_fixture,
    share_tests_path,
)

from fastload.cluster import write_dask

pytestmark = pytest.mark.cluster

ROWS = make_rows(2000)


class _Bags:
    """``dask.bag``, imported when a test runs (the default suite only collects these)."""

    def from_sequence(self, *args, **kwargs):
        return pytest.importorskip("dask.bag").from_sequence(*args, **kwargs)


db = _Bags()
s3 = s3_fixture()


@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("distributed")
    share_tests_path()
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client


@pytest.fixture(scope="module")
def write(client):
    """``write_dask`` of the rows as a bag of ``partitions`` partitions."""

    def write(rows, partitions, prefix, fields, **options):
        bag = db.from_sequence(rows, npartitions=partitions)
        return write_dask(bag, prefix, fields, **options)

    return write


class TestWrites(EngineWrites):
    """Faults, skipped rows and S3 on Dask (``EngineWrites``)."""


def test_a_bag_is_written_as_write_writes_it(client, tmp_path):
    prefix = str(tmp_path / "out")
    bag = db.from_sequence(ROWS, npartitions=6)
    committed = write_dask(bag, prefix, FIELDS)
    assert committed.rows == len(ROWS) and len(committed.files) == bag.npartitions > 1
    assert_same_as_write(prefix, ROWS, str(tmp_path))


def test_a_dataframe_is_written_as_write_writes_it(client, tmp_path):
    import dask
    import dask.dataframe as dd
    import pandas as pd

    # Dask makes object columns Arrow strings unless told not to: images are bytes.
    with dask.config.set({"dataframe.convert-string": False}):
        frame = dd.from_pandas(pd.DataFrame(ROWS), npartitions=3)
    prefix = str(tmp_path / "out")
    write_dask(frame, prefix, FIELDS)
    assert_same_as_write(prefix, ROWS, str(tmp_path))


def _lean(dask_worker=None, dask_scheduler=None):
    """(profiler running, tick period in ms) of the server a ``client.run`` hands in."""
    server = dask_worker or dask_scheduler
    return "profile" in server.periodic_callbacks, server.periodic_callbacks["tick"].callback_time


def test_the_local_cluster_of_convert_starts_with_lean_diagnostics():
    # ``convert --engine dask`` without an address: its workers run no statistical
    # profiler and every event loop ticks once a second, while this process's own Dask
    # config, and with it a cluster started after, stays at Dask's defaults.
    import dask
    import distributed

    from fastload.cluster.convert import local_dask_cluster

    default = dask.config.get("distributed.worker.profile.enabled")
    with local_dask_cluster(2) as cluster, distributed.Client(cluster) as client:
        assert sorted(client.run(_lean).values()) == [(False, 1000.0)] * 2
        assert client.run_on_scheduler(_lean) == (False, 1000.0)
    assert dask.config.get("distributed.worker.profile.enabled") is default is True
    with (
        distributed.LocalCluster(n_workers=1, dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):
        assert list(client.run(_lean).values()) == [(True, 20.0)]


def _chain(graph, key):
    """``key`` and the keys it needs, transitively, in ``graph``."""
    from dask.core import get_dependencies

    seen, todo = {key}, [key]
    while todo:
        for needed in get_dependencies(graph, todo.pop()):
            if needed not in seen:
                seen.add(needed)
                todo.append(needed)
    return seen


def test_each_partition_is_made_and_written_in_one_task():
    # The write of a partition runs in the task that makes its rows (a worker never holds
    # rows waiting for a write that the scheduler could not move without them): the
    # requested key is that one task, or a name for it.
    import dask

    from fastload.cluster.dask import _fused

    bag = db.from_sequence(ROWS[:40], npartitions=4).map(dict)
    tasks = [dask.delayed(len, pure=False)(p) for p in bag.to_delayed()]
    for made, most in ((tasks, 3), (_fused(tasks), 2)):
        graph = {}
        for task in made:
            graph.update(task.__dask_graph__())
        assert len(graph) <= most * 4
        assert max(len(_chain(graph, task.key)) for task in made) == most
        assert dask.compute(*made) == (10, 10, 10, 10)
