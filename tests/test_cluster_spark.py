"""Spark writes packed datasets in parts (``fastload.cluster.write_spark``) on a real
local Spark (``local[2,3]``: two cores, a task tried up to three times): a DataFrame and
an RDD, to a folder and to moto's S3 server, equal byte for byte to ``fastload.write``
of the same rows; a Python worker killed mid-task, a task that raises once, one that
fails for good, a store that refuses writes, and bad rows skipped."""

import os
import sys

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

from fastload.cluster import PartitionError, write_spark

pytestmark = pytest.mark.cluster

ROWS = make_rows(2000)
# A DataFrame's columns: the fields but the vector (Spark infers no type for an array).
FRAME_FIELDS = {k: v for k, v in FIELDS.items() if k != "vector"}


@pytest.fixture(scope="module")
def spark():
    pyspark_sql = pytest.importorskip("pyspark.sql")
    share_tests_path()
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the workers run this interpreter
    session = (
        pyspark_sql.SparkSession.builder.master("local[2,3]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    yield session
    session.stop()


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("moto") / "moto.log")
    server.filesystem().mkdir("spark")
    yield server
    server.stop()


def _frame_rows(rows):
    return [{k: r[k] for k in FRAME_FIELDS} for r in rows]


def test_a_dataframe_is_written_as_write_writes_it(spark, tmp_path):
    rows = _frame_rows(ROWS)
    frame = spark.createDataFrame(rows)
    prefix = str(tmp_path / "out")
    committed = write_spark(frame, prefix, FRAME_FIELDS)
    assert committed.rows == len(rows) and len(committed.files) == frame.rdd.getNumPartitions()
    assert_same_as_write(prefix, rows, str(tmp_path), fields=FRAME_FIELDS)


def test_an_rdd_is_written_to_s3(spark, s3, tmp_path):
    prefix, options = "s3://spark/train", s3.storage_options
    rdd = spark.sparkContext.parallelize(ROWS, 4)
    write_spark(rdd, prefix, FIELDS, storage_options=options)
    assert_same_as_write(prefix, ROWS, str(tmp_path), options, cache_bytes=0)
    again = spark.sparkContext.parallelize(ROWS[:300], 2)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_spark(again, prefix, FIELDS, storage_options=options)
    write_spark(again, prefix, FIELDS, storage_options=options, overwrite=True)
    assert_same_as_write(prefix, ROWS[:300], str(tmp_path), options, cache_bytes=0)


@pytest.mark.parametrize("action", ["kill", "raise"])
def test_a_killed_worker_or_a_task_that_raises_once_is_run_again(spark, tmp_path, action):
    rows = pixel_rows(400)
    prefix = str(tmp_path / "out")
    rdd = spark.sparkContext.parallelize(with_once(rows, 350, tmp_path / "marker", action), 2)
    committed = write_spark(rdd, prefix, FIELDS, file_bytes=50_000)
    assert os.path.exists(tmp_path / "marker")
    assert committed.removed, "the failed attempt wrote a file before it failed"
    assert_same_as_write(prefix, rows, str(tmp_path))


def test_a_task_that_fails_for_good_commits_nothing(spark, tmp_path):
    rows = with_once(pixel_rows(200), 150, tmp_path / "marker", "always")
    prefix = str(tmp_path / "out")
    rdd = spark.sparkContext.parallelize(rows, 2)
    with pytest.raises(PartitionError, match="nothing was committed.*partition 1 failed") as caught:
        write_spark(rdd, prefix, FIELDS, file_bytes=20_000)
    assert caught.value.partition == 1 and "fails every time" in str(caught.value)
    assert_not_committed(prefix)


def test_a_store_that_refuses_writes_commits_nothing(spark, s3):
    rdd = spark.sparkContext.parallelize(ROWS[:20], 2)
    with pytest.raises(PartitionError, match="nothing was committed.*no-such-bucket"):
        write_spark(rdd, "s3://no-such-bucket/x", FIELDS, storage_options=s3.storage_options)


def test_bad_rows_are_skipped_as_write_skips_them(spark, tmp_path):
    rows = [dict(r) for r in ROWS[:300]]
    rows[10]["image"] = rows[250]["image"] = b"not an image"
    prefix = str(tmp_path / "out")
    rdd = spark.sparkContext.parallelize(rows, 3)
    committed = write_spark(rdd, prefix, FIELDS, on_error="skip")
    assert [e.index for e in committed.skipped] == [10, 50]
    assert_same_as_write(prefix, rows[:10] + rows[11:250] + rows[251:], str(tmp_path))
