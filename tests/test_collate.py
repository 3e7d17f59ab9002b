"""Default collation (fastload._base.collate) for every kind of container, and torch tensors as
containers (fastload.tensors): batches of arrays and tensors, strings as lists."""

from collections import namedtuple

import numpy as np
import pytest
from helpers import assert_tree_equal, copy_tree

from fastload import (
    DataLoader,
    LoadError,
    batchview,
    getobs,
    getobs_into,
    joinobs,
    mapobs,
    numobs,
)
from fastload._base.collate import collate
from fastload._base.tree import LeafKind
from fastload._loading.plan import make_plan
from fastload._loading.schedule import schedule_of
from fastload.transforms import Compose, Lambda

torch = pytest.importorskip("torch")

N = 10
Pair = namedtuple("Pair", "x y")


class TorchStyle:
    """A map-style dataset as PyTorch users write them: ``(np.ndarray, int)`` items."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        if not 0 <= i < N:
            raise IndexError(i)
        return np.full((2, 3), i, np.float32), i


def batches(data, **options):
    return [copy_tree(b) for b in DataLoader(data, 4, **options)]


@pytest.mark.parametrize(
    "options",
    [{}, {"parallel": 2}, {"parallel": 2, "buffer": True}, {"parallel": 2, "backend": "process"}],
    ids=["sequential", "threads", "buffered", "processes"],
)
def test_a_torch_style_dataset_gives_a_pair_of_batch_arrays(options):
    got = batches(TorchStyle(), **options)
    assert len(got) == 3
    images, labels = got[0]
    assert images.shape == (4, 2, 3) and images.dtype == np.float32
    assert labels.shape == (4,) and labels.tolist() == [0, 1, 2, 3]
    assert_tree_equal(
        got[2], (np.stack([np.full((2, 3), i, np.float32) for i in (8, 9)]), np.array([8, 9]))
    )


def test_collate_false_keeps_the_list_of_observations():
    first = batches(TorchStyle(), collate=False)[0]
    assert isinstance(first, list) and len(first) == 4 and first[1][1] == 1


def test_collation_goes_through_dicts_and_namedtuples_and_keeps_strings_as_lists():
    records = [
        {
            "x": np.arange(3) + i,
            "name": f"r{i}",
            "pair": Pair(i, float(i)),
            "tokens": list(range(i)),
        }
        for i in range(N)
    ]
    expected = {
        "x": np.stack([np.arange(3) + i for i in range(4)]),
        "name": ["r0", "r1", "r2", "r3"],
        "pair": Pair(np.arange(4), np.arange(4.0)),
        "tokens": [[], [0], [0, 1], [0, 1, 2]],
    }
    assert_tree_equal(getobs(records, range(4)), expected)
    assert_tree_equal(batches(records)[0], expected)
    assert_tree_equal(batches(records, parallel=2)[0], expected)
    assert getobs(["a", "b", "c"], [2, 0]) == ["c", "a"]
    assert getobs([{"a": 1}, {"b": 2}], [0, 1]) == [{"a": 1}, {"b": 2}]  # keys differ


def test_observations_of_different_shapes_raise_unless_collected_as_lists():
    ragged = [np.zeros(i + 1) for i in range(N)]
    with pytest.raises(ValueError, match="collate=False"):
        collate(ragged[:2])
    with pytest.raises(LoadError):
        list(DataLoader(ragged, 4))
    assert [len(b) for b in DataLoader(ragged, 4, collate=False)] == [4, 4, 2]


def test_a_value_that_does_not_fit_the_batch_dtype_raises_instead_of_truncating():
    mixed = [1, 2, 2.5, 4]  # the batch buffer takes the dtype of observation 0
    with pytest.raises(LoadError, match="dtype"):
        list(DataLoader(mixed, 4))
    assert getobs(mixed, [0, 2]).tolist() == [1.0, 2.5]


def test_a_value_that_does_not_fit_is_named_with_its_member_and_observation_0():
    records = {"id": np.arange(4), "score": [1, "high", 2, 3]}
    with pytest.raises(LoadError, match="observation 1") as caught:
        list(DataLoader(records, 4))
    message = str(caught.value)
    assert "<U4" in message and "['score']" in message and "shape () of int64" in message
    assert "image" not in message and "CenterCrop" not in message


def test_images_that_do_not_fit_are_told_to_crop():
    images = [np.zeros((8, 8, 3), np.uint8), np.zeros((6, 6, 3), np.uint8)]
    flipped = mapobs(Compose([Lambda(lambda image: image[:, ::-1])]), images)
    with pytest.raises(LoadError, match=r"(?s)shape \(6, 6, 3\).*CenterCrop"):
        list(DataLoader(flipped, 2))


def test_a_tensor_is_a_container_that_gives_tensors():
    t = torch.arange(N * 2, dtype=torch.float32).reshape(N, 2)
    assert numobs(t) == N
    assert torch.equal(getobs(t, 3), t[3])
    assert torch.equal(getobs(t, [4, 1]), t[[4, 1]])
    assert torch.equal(getobs(t), t)
    buffer = torch.zeros(2, 2)
    assert getobs_into(buffer, t, [5, 6]) is buffer and torch.equal(buffer, t[5:7])
    assert getobs_into(buffer, t.numpy(), [1, 2]) is buffer and torch.equal(buffer, t[1:3])
    plan = make_plan(*schedule_of(batchview((t, torch.arange(N)), 4)))
    assert [leaf.kind for leaf in plan.leaves] == [LeafKind.GATHER, LeafKind.GATHER]


@pytest.mark.parametrize(
    "options",
    [{}, {"buffer": True}, {"parallel": 2}, {"parallel": 2, "buffer": True, "shuffle": True}],
)
def test_a_loader_over_tensors_yields_tensors_the_caller_can_keep(options):
    t = torch.arange(N * 2, dtype=torch.float32).reshape(N, 2)
    labels = torch.arange(N)
    loader = DataLoader((t, labels), 4, seed=0, **options)
    kept = list(loader)  # kept across next(): each batch owns its memory
    assert all(isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) for x, y in kept)
    order = torch.from_numpy(loader.order(0)) if options.get("shuffle") else torch.arange(N)
    assert torch.equal(torch.cat([x for x, _ in kept]), t[order])
    assert torch.equal(torch.cat([y for _, y in kept]), labels[order])


def test_datasets_of_tensors_give_batches_of_tensors():
    pairs = torch.utils.data.TensorDataset(torch.arange(N * 3.0).reshape(N, 3), torch.arange(N))
    for options in ({}, {"parallel": 2}):
        x, y = batches(pairs, **options)[1]
        assert isinstance(x, torch.Tensor) and x.shape == (4, 3)
        assert torch.equal(y, torch.arange(4, 8))
    joined = getobs(joinobs(torch.zeros(2, 3), torch.ones(1, 3)), [0, 2])
    assert torch.equal(joined, torch.tensor([[0.0, 0, 0], [1, 1, 1]]))
