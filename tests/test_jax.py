"""Smoke test of the JAX integration (skipped without jax)."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")

from fastload import DataLoader, mapobs  # noqa: E402
from fastload.jax import prefetch_to_device  # noqa: E402

from helpers import assert_tree_equal, copy_tree  # noqa: E402


@pytest.mark.parametrize("buffer", [True, False])
def test_prefetch_to_device_yields_jax_arrays_equal_to_the_batches(buffer):
    data = {"x": mapobs(lambda v: v + 1, np.arange(60, dtype=np.float32).reshape(30, 2)),
            "y": np.arange(30, dtype=np.int32)}
    make = lambda: DataLoader(data, batch_size=4, shuffle=True, seed=2, parallel=2,  # noqa: E731
                              buffer=buffer)
    expected = [copy_tree(b) for b in make()]
    got = list(prefetch_to_device(make(), size=3))
    assert all(isinstance(b["x"], jax.Array) for b in got)
    assert_tree_equal([{k: np.asarray(v) for k, v in b.items()} for b in got], expected)


def test_size_must_be_positive():
    with pytest.raises(ValueError):
        next(prefetch_to_device([], size=0))
