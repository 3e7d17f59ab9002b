"""Spark writes packed datasets in parts (``fastload.cluster.write_spark``) on a real
local Spark (``local[2,3]``: two cores, a task tried up to three times): a DataFrame and
an RDD, to a folder and to moto's S3 server, equal byte for byte to ``fastload.write``
of the same rows; a Python worker killed mid-task, a task that raises once, one that
fails for good, a store that refuses writes, and bad rows skipped
(``partsets.EngineWrites``)."""

import os
import sys

import pytest
from partsets import (
    FIELDS,
    EngineWrites,
    assert_same_as_write,
    make_rows,
    s3_fixture,
    share_tests_path,
)

from fastload.cluster import write_spark

pytestmark = pytest.mark.cluster

ROWS = make_rows(2000)
# A DataFrame's columns: the fields but the vector (Spark infers no type for an array).
FRAME_FIELDS = {k: v for k, v in FIELDS.items() if k != "vector"}
s3 = s3_fixture()


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
def write(spark):
    """``write_spark`` of the rows as an RDD of ``partitions`` partitions."""

    def write(rows, partitions, prefix, fields, **options):
        rdd = spark.sparkContext.parallelize(rows, partitions)
        return write_spark(rdd, prefix, fields, **options)

    return write


class TestWrites(EngineWrites):
    """Faults, skipped rows and S3 on Spark, from an RDD (``EngineWrites``)."""


def test_a_dataframe_is_written_as_write_writes_it(spark, tmp_path):
    rows = [{k: r[k] for k in FRAME_FIELDS} for r in ROWS]
    frame = spark.createDataFrame(rows)
    prefix = str(tmp_path / "out")
    committed = write_spark(frame, prefix, FRAME_FIELDS)
    assert committed.rows == len(rows) and len(committed.files) == frame.rdd.getNumPartitions()
    assert_same_as_write(prefix, rows, str(tmp_path), fields=FRAME_FIELDS)
