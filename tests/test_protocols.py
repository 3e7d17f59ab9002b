"""What the engine and the loader ask of storage is declared as protocols
(``fastload._base.protocols``): the storage classes implement them explicitly, and the loader and
the planner take what implements them, never an object that merely has an attribute of
the same name."""

import numpy as np
import pytest

from fastload import DataLoader, mapobs
from fastload._base.protocols import (
    Blockwise,
    ContiguousBytes,
    FilePaths,
    PackedRows,
    SpannedBytes,
)
from fastload._images.imagesources import native_images
from fastload.imagefolder import FileBytes
from fastload.storage import JPEG, Raw, write
from fastload.storage import open as open_dataset
from fastload.storage.columns import EncodedColumn, ItemBytes, RawArray
from fastload.storage.reader import Dataset
from fastload.transforms import Compose, DecodeImage, Resize

SIDE = 8


def image(i):
    return np.random.default_rng(i).integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A packed dataset of 30 rows in several blocks: raw images, JPEG images, labels."""
    path = str(tmp_path_factory.mktemp("ds") / "data.arrow")
    rows = [{"image": image(i), "encoded": image(i), "label": i} for i in range(30)]
    fields = {"image": Raw(), "encoded": JPEG(), "label": "int64"}
    write(path, rows, fields, block_bytes=600, progress=False)
    return open_dataset(path)


def test_storage_classes_declare_the_protocols_they_implement():
    # Declared as bases (so that mypy checks them), not only matched by their attributes.
    assert PackedRows in Dataset.__mro__ and PackedRows in RawArray.__mro__
    for cls in (EncodedColumn, ItemBytes):
        assert {ContiguousBytes, SpannedBytes, PackedRows} <= set(cls.__mro__)
    assert FilePaths in FileBytes.__mro__


def test_a_dataset_and_its_columns_offer_their_blocks(dataset):
    bounds = dataset.block_bounds
    assert len(bounds) > 2  # several blocks
    for part in (dataset, dataset["image"], dataset["encoded"], dataset["encoded"].encoded):
        assert isinstance(part, PackedRows) and part.block_bounds is bounds


def test_a_slice_of_a_column_offers_no_blocks(dataset):
    # Its rows are not the dataset's: block bounds from the class, None, not the column's.
    part = dataset["image"][5:]
    assert part.block_bounds is None and part.file_pages is None and part.verify_rows is None
    with pytest.raises(ValueError, match="shuffle='quasi' reads a packed dataset"):
        DataLoader(part, 4, shuffle="quasi")


class UserBlocks:
    """Not storage: a container that implements ``Blockwise`` by its attribute alone."""

    def __init__(self, bounds):
        self.block_bounds = bounds

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return np.full(2, i)


def test_a_container_that_offers_blocks_is_read_by_them_and_one_that_offers_none_refused():
    blockwise = UserBlocks(np.array([0, 2, 4], np.int64))
    assert isinstance(blockwise, Blockwise) and not isinstance(blockwise, PackedRows)
    rows = np.concatenate(list(DataLoader(blockwise, 2, shuffle="quasi")))
    assert sorted(rows[:, 0]) == list(range(4))
    with pytest.raises(ValueError, match="shuffle='quasi' reads a packed dataset"):
        DataLoader(UserBlocks(None), 2, shuffle="quasi")


def test_quasi_order_follows_the_blocks_of_a_column_under_mapobs(dataset):
    loader = DataLoader(mapobs(lambda x: x, dataset["label"]), 5, shuffle="quasi", seed=3)
    seen = np.concatenate(list(loader))
    assert sorted(seen) == list(range(30))


class BytesWithBuffers:
    """Encoded images with a ``buffers`` method but no ``contiguous``: not ContiguousBytes."""

    def __init__(self, items):
        self.items = items

    def buffers(self):
        raise AssertionError("not a ContiguousBytes: never asked for its buffers")

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def test_images_that_do_not_implement_a_byte_protocol_load_through_python(dataset):
    items = [bytes(dataset["encoded"].encoded[i]) for i in range(6)]
    view = mapobs(Compose([DecodeImage(), Resize((4, 4))]), BytesWithBuffers(items))
    assert native_images(view) is None
    batches = list(DataLoader(view, 3, parallel=False))
    native = list(DataLoader(mapobs(view.f, items), 3, parallel=False))
    assert all(np.array_equal(a, b) for a, b in zip(batches, native))
