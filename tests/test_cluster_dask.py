"""Dask writes packed datasets in parts (``fastload.cluster.write_dask``) on a real
distributed cluster of two worker processes: a bag and a dataframe, to a folder and to
moto's S3 server, equal byte for byte to ``fastload.write`` of the same rows; a worker
killed mid-task, a task that raises once, one that fails for good, a store that refuses
writes, and bad rows skipped."""

import os

import pytest
from partsets import (
    FIELDS,
    assert_not_committed,
    assert_same_as_write,
    make_rows,
    pixel_rows,
    share_tests_path,
    with_once,
)
from servers import S3Server

from fastload.cluster import PartitionError, write_dask

pytestmark = pytest.mark.cluster

ROWS = make_rows(2000)


class _Bags:
    """``dask.bag``, imported when a test runs (the default suite only collects these)."""

    def from_sequence(self, *args, **kwargs):
        return pytest.importorskip("dask.bag").from_sequence(*args, **kwargs)


db = _Bags()


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
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("moto") / "moto.log")
    server.filesystem().mkdir("dask")
    yield server
    server.stop()


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


def test_a_bag_is_written_to_s3(client, s3, tmp_path):
    prefix, options = "s3://dask/train", s3.storage_options
    write_dask(db.from_sequence(ROWS, npartitions=4), prefix, FIELDS, storage_options=options)
    assert_same_as_write(prefix, ROWS, str(tmp_path), options, cache_bytes=0)


@pytest.mark.parametrize("action", ["kill", "raise"])
def test_a_killed_worker_or_a_task_that_raises_once_is_run_again(client, tmp_path, action):
    rows = pixel_rows(400)
    prefix = str(tmp_path / "out")
    bag = db.from_sequence(with_once(rows, 350, tmp_path / "marker", action), npartitions=2)
    committed = write_dask(bag, prefix, FIELDS, file_bytes=50_000)
    assert os.path.exists(tmp_path / "marker")
    assert committed.removed, "the failed attempt wrote a file before it failed"
    assert_same_as_write(prefix, rows, str(tmp_path))


def test_a_task_that_fails_for_good_commits_nothing(client, tmp_path):
    rows = with_once(pixel_rows(200), 150, tmp_path / "marker", "always")
    prefix = str(tmp_path / "out")
    bag = db.from_sequence(rows, npartitions=2)
    with pytest.raises(PartitionError, match="nothing was committed.*partition 1 failed") as caught:
        write_dask(bag, prefix, FIELDS, file_bytes=20_000)
    assert caught.value.partition == 1 and "fails every time" in str(caught.value)
    assert_not_committed(prefix)


def test_a_store_that_refuses_writes_commits_nothing(client, s3):
    bag = db.from_sequence(ROWS[:20], npartitions=2)
    with pytest.raises(PartitionError, match="nothing was committed.*no-such-bucket"):
        write_dask(bag, "s3://no-such-bucket/x", FIELDS, storage_options=s3.storage_options)


def test_bad_rows_are_skipped_as_write_skips_them(client, tmp_path):
    rows = [dict(r) for r in ROWS[:300]]
    rows[10]["image"] = rows[250]["image"] = b"not an image"
    prefix = str(tmp_path / "out")
    committed = write_dask(db.from_sequence(rows, npartitions=3), prefix, FIELDS, on_error="skip")
    assert [e.index for e in committed.skipped] == [10, 50]
    assert ["partition 0" in str(e) for e in committed.skipped] == [True, False]
    assert_same_as_write(prefix, rows[:10] + rows[11:250] + rows[251:], str(tmp_path))
