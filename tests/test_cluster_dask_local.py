"""``write_dask`` without a distributed client: the tasks run on Dask's default scheduler
(threads of this process), each partition made and written in one task, and the
committed dataset is what ``fastload.write`` writes for the same rows."""

import pytest
from partsets import FIELDS, assert_same_as_write, make_rows

from fastload.cluster import write_dask

pytestmark = pytest.mark.cluster


def test_a_bag_is_written_on_the_default_scheduler(tmp_path):
    db = pytest.importorskip("dask.bag")
    distributed = pytest.importorskip("distributed")
    with pytest.raises(ValueError):
        distributed.get_client()  # no client here: write_dask takes Dask's own scheduler
    rows = make_rows(300)
    prefix = str(tmp_path / "out")
    committed = write_dask(db.from_sequence(rows, npartitions=5).map(dict), prefix, FIELDS)
    assert committed.rows == len(rows) and len(committed.files) == 5
    assert_same_as_write(prefix, rows, str(tmp_path))
