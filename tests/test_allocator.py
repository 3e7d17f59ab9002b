"""The loader's public ``allocator``: what makes the ring's batch buffers."""

import numpy as np
import pytest

import fastload


class Counting:
    """np.empty that counts its calls and remembers what it made."""

    def __init__(self):
        self.made = []

    def __call__(self, shape, dtype):
        array = np.empty(shape, dtype)
        self.made.append(array)
        return array


def test_the_ring_is_made_by_the_given_allocator():
    data = np.arange(40, dtype=np.float32).reshape(20, 2)
    alloc = Counting()
    loader = fastload.DataLoader(data, 4, buffer=True, parallel=2, allocator=alloc)
    batches = [b.copy() for b in loader]
    assert np.array_equal(np.concatenate(batches), data)
    assert alloc.made and all(a.shape == (4, 2) and a.dtype == np.float32 for a in alloc.made)
    assert loader.allocator is alloc


def test_setting_the_allocator_drops_the_ring_and_the_next_epoch_uses_it():
    data = np.arange(30, dtype=np.int64)
    loader = fastload.DataLoader(data, 5, buffer=True)
    first = [b.copy() for b in loader]
    alloc = Counting()
    loader.allocator = alloc
    second = [b.copy() for b in loader]
    assert alloc.made, "the next epoch did not allocate with the new allocator"
    assert np.array_equal(np.concatenate(first), np.concatenate(second))
    with pytest.raises(TypeError, match="allocator must be callable"):
        loader.allocator = "np.empty"
