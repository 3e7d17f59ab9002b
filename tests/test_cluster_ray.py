"""Ray Data writes packed datasets in parts (``fastload.cluster.Datasink``, and
``write_ray`` around it) on a real local Ray (``ray.init(num_cpus=2)``): to a folder and
to moto's S3 server, equal byte for byte to ``fastload.write`` of the same rows; a
worker killed mid-task, a task that raises once, one that fails for good, a store that
refuses writes, and bad rows skipped."""

import os

import pytest
from partsets import (
    FIELDS,
    OnceJPEG,
    assert_not_committed,
    assert_same_as_write,
    make_rows,
    share_tests_path,
)
from servers import S3Server

import fastload
from fastload.cluster import PartitionError

pytestmark = pytest.mark.cluster

ROWS = make_rows(2000)


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    share_tests_path()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("moto") / "moto.log")
    server.filesystem().mkdir("ray")
    yield server
    server.stop()


def _dataset(rows, blocks):
    import ray.data

    return ray.data.from_items(rows, override_num_blocks=blocks)


def test_a_datasink_writes_as_write_writes(cluster, tmp_path):
    from fastload.cluster import Datasink

    prefix = str(tmp_path / "out")
    context = cluster.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    sink = Datasink(prefix, FIELDS)
    _dataset(ROWS, 4).write_datasink(sink)
    assert sink.committed.rows == len(ROWS) and len(sink.committed.files) == 4
    assert_same_as_write(prefix, ROWS, str(tmp_path))


def test_a_dataset_is_written_to_s3(cluster, s3, tmp_path):
    from fastload.cluster import write_ray

    prefix, options = "s3://ray/train", s3.storage_options
    write_ray(_dataset(ROWS, 3), prefix, FIELDS, storage_options=options)
    assert_same_as_write(prefix, ROWS, str(tmp_path), options, cache_bytes=0)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_ray(_dataset(ROWS[:300], 2), prefix, FIELDS, storage_options=options)
    write_ray(_dataset(ROWS[:300], 2), prefix, FIELDS, storage_options=options, overwrite=True)
    assert_same_as_write(prefix, ROWS[:300], str(tmp_path), options, cache_bytes=0)


def _failing(rows, at, marker, action):
    """FIELDS with the image of row ``at`` failing as ``partsets.Once`` says."""
    return {**FIELDS, "image": OnceJPEG(rows[at]["image"], marker, action)}


@pytest.mark.parametrize("action", ["kill", "raise"])
def test_a_killed_worker_or_a_task_that_raises_once_is_run_again(cluster, tmp_path, action):
    from fastload.cluster import write_ray

    rows, prefix = ROWS[:400], str(tmp_path / "out")
    fields = _failing(rows, 350, tmp_path / "marker", action)
    committed = write_ray(_dataset(rows, 2), prefix, fields, file_bytes=50_000)
    assert os.path.exists(tmp_path / "marker")
    assert committed.removed, "the failed attempt wrote a file before it failed"
    assert_same_as_write(prefix, rows, str(tmp_path))


def test_a_task_that_fails_for_good_commits_nothing(cluster, tmp_path):
    from fastload.cluster import write_ray

    rows, prefix = ROWS[:200], str(tmp_path / "out")
    fields = _failing(rows, 150, tmp_path / "marker", "always")
    with pytest.raises(PartitionError, match="nothing was committed.*partition 1 failed") as caught:
        write_ray(_dataset(rows, 2), prefix, fields, file_bytes=20_000)
    assert caught.value.partition == 1 and "fails every time" in str(caught.value)
    assert_not_committed(prefix)


def test_a_store_that_refuses_writes_commits_nothing(cluster, s3):
    from fastload.cluster import write_ray

    options = s3.storage_options
    with pytest.raises(PartitionError, match="nothing was committed.*no-such-bucket"):
        write_ray(_dataset(ROWS[:20], 2), "s3://no-such-bucket/x", FIELDS, storage_options=options)


def test_bad_rows_are_skipped_as_write_skips_them(cluster, tmp_path):
    from fastload.cluster import write_ray

    rows = [dict(r) for r in ROWS[:300]]
    rows[10]["image"] = rows[250]["image"] = b"not an image"
    prefix = str(tmp_path / "out")
    committed = write_ray(_dataset(rows, 3), prefix, FIELDS, on_error="skip")
    assert [e.index for e in committed.skipped] == [10, 50]
    assert_same_as_write(prefix, rows[:10] + rows[11:250] + rows[251:], str(tmp_path))
    assert len(fastload.open(prefix)) == 298
