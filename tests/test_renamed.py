"""The names that 0.3 renamed still work for that release: each gives what the new name
gives, with a DeprecationWarning that names the new spelling."""

import numpy as np
import pytest

import fastload
import fastload.streams
from fastload import FileStream
from fastload.order import quasi_random_order
from fastload.storage import Raw, open, write


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    path = tmp_path_factory.mktemp("renamed") / "data.arrow"
    rows = [{"x": np.full(64, k, np.uint8)} for k in range(200)]
    write(path, rows, {"x": Raw()}, block_bytes=2000, progress=False)
    return path, rows


def test_shards_and_open_shard_are_the_file_stream_names():
    with pytest.warns(DeprecationWarning, match="fastload.FileStream"):
        assert fastload.Shards is FileStream
    with pytest.warns(DeprecationWarning, match="fastload.streams.FileStream"):
        assert fastload.streams.Shards is FileStream
    with pytest.warns(DeprecationWarning, match="fastload.streams.open_file"):
        assert fastload.streams.open_shard is fastload.streams.open_file


def test_an_unknown_module_attribute_still_raises_attribute_error():
    with pytest.raises(AttributeError, match="NoSuchName"):
        fastload.NoSuchName  # noqa: B018
    with pytest.raises(AttributeError, match="NoSuchName"):
        fastload.streams.NoSuchName  # noqa: B018


def test_write_takes_chunk_bytes_as_block_bytes(written, tmp_path):
    path, rows = written
    old = tmp_path / "old.arrow"
    with pytest.warns(DeprecationWarning, match="block_bytes="):
        write(old, rows, {"x": Raw()}, chunk_bytes=2000, progress=False)
    assert np.array_equal(open(old).block_bounds, open(path).block_bounds)
    assert open(path).num_blocks > 2
    with pytest.raises(TypeError, match="block_bytes="):
        write(tmp_path / "both.arrow", rows, {"x": Raw()}, chunk_bytes=1, block_bytes=1)


def test_the_dataset_attributes_of_0_2_read_the_new_ones(written):
    ds = open(written[0])
    for old, new in [
        ("chunk_bounds", "block_bounds"),
        ("num_chunks", "num_blocks"),
        ("shard_bounds", "file_bounds"),
    ]:
        with pytest.warns(DeprecationWarning, match=f"Dataset.{new}"):
            assert np.array_equal(getattr(ds, old), getattr(ds, new))
    with pytest.warns(DeprecationWarning, match="Dataset.file_datasets"):
        assert [len(d) for d in ds.shards] == [len(d) for d in ds.file_datasets] == [200]


def test_the_verify_result_reads_chunks_as_blocks(written):
    result = fastload.open(written[0]).verify()
    assert result["blocks"] > 2
    with pytest.warns(DeprecationWarning, match="'blocks'"):
        assert result["chunks"] == result["blocks"]
    with pytest.raises(KeyError):
        result["rows"]


def test_quasi_random_order_takes_chunks_and_window_as_blocks_and_wave():
    new = quasi_random_order(100, [30, 30, 40], 1, 2, wave=2)
    with pytest.warns(DeprecationWarning) as caught:
        old = quasi_random_order(100, chunks=[30, 30, 40], seed=1, epoch=2, window=2)
    assert np.array_equal(old, new)
    assert {str(w.message).split(": write ")[1].split(" ")[0] for w in caught} == {
        "blocks=",
        "wave=",
    }


def test_chunk_sizes_is_block_sizes():
    import fastload.order

    with pytest.warns(DeprecationWarning, match="fastload.order.block_sizes"):
        assert fastload.order.chunk_sizes is fastload.order.block_sizes


def test_stream_epochs_shuffle_is_its_shuffle_buffer():
    from fastload._base.collate import Collate
    from fastload._loading.rounds import StreamEpochs

    records = list(range(10))
    options = dict(drop_last=False, collate=Collate.of(None), rank=0, world_size=1)
    with pytest.warns(
        DeprecationWarning, match=r"StreamEpochs.__init__\(shuffle=\).*shuffle_buffer="
    ):
        epochs = StreamEpochs(records, records, [], 2, shuffle=16, **options)
    assert epochs.shuffle_buffer == 16
    with pytest.warns(DeprecationWarning, match="StreamEpochs.shuffle_buffer"):
        assert epochs.shuffle == 16
    with pytest.raises(TypeError, match="not both"):
        StreamEpochs(records, records, [], 2, shuffle=16, shuffle_buffer=16, **options)
