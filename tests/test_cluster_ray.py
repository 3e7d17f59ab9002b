"""Ray Data writes packed datasets in parts (``fastload.cluster.Datasink``, and
``write_ray`` around it) on a real local Ray (``ray.init(num_cpus=2)``): to a folder and
to moto's S3 server, equal byte for byte to ``fastload.write`` of the same rows; a
worker killed mid-task, a task that raises once, one that fails for good, a store that
refuses writes, and bad rows skipped (``partsets.EngineWrites``)."""

import pytest
from partsets import (
    FIELDS,
    EngineWrites,
    OnceJPEG,
    assert_same_as_write,
    make_rows,
    s3_fixture,
    share_tests_path,
)

pytestmark = pytest.mark.cluster

ROWS = make_rows(2000)
s3 = s3_fixture()


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    share_tests_path()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _dataset(rows, blocks):
    import ray.data

    return ray.data.from_items(rows, override_num_blocks=blocks)


@pytest.fixture(scope="module")
def write(cluster):
    """``write_ray`` of the rows as a dataset of ``partitions`` blocks."""
    from fastload.cluster import write_ray

    def write(rows, partitions, prefix, fields, **options):
        return write_ray(_dataset(rows, partitions), prefix, fields, **options)

    return write


class TestWrites(EngineWrites):
    """Faults, skipped rows and S3 on Ray Data (``EngineWrites``)."""

    def failing(self, n, at, marker, action):
        """Ray Data turns the rows' values into its own columns before a task sees them:
        the row fails where its image is encoded (``OnceJPEG``), not where it is read."""
        rows = make_rows(n)
        return rows, {**FIELDS, "image": OnceJPEG(rows[at]["image"], marker, action)}, rows


def test_a_datasink_writes_as_write_writes(cluster, tmp_path):
    from fastload.cluster import Datasink

    prefix = str(tmp_path / "out")
    context = cluster.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    sink = Datasink(prefix, FIELDS)
    _dataset(ROWS, 4).write_datasink(sink)
    assert sink.committed.rows == len(ROWS) and len(sink.committed.files) == 4
    assert_same_as_write(prefix, ROWS, str(tmp_path))
