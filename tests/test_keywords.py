"""PyTorch's DataLoader keywords: each one fastload spells differently raises a TypeError
that says what to write instead."""

import numpy as np
import pytest

from fastload import DataLoader, eachobs
from fastload.keywords import PYTORCH_KEYWORDS


@pytest.mark.parametrize(
    "name, hint",
    [
        ("num_workers", "parallel="),
        ("collate_fn", "collate="),
        ("pin_memory", "TorchLoader"),
        ("persistent_workers", "not needed"),
        ("worker_init_fn", "seed, epoch, index"),
        ("prefetch_factor", "prefetch="),
        ("generator", "seed="),
        ("timeout", "not needed"),
        ("multiprocessing_context", "backend='process'"),
        ("in_order", "ordered="),
    ],
)
def test_a_pytorch_keyword_says_what_fastload_calls_it(name, hint):
    with pytest.raises(TypeError, match="PyTorch") as info:
        DataLoader(np.arange(4), 2, **{name: 1})
    assert hint in str(info.value) and name in str(info.value)


def test_every_pytorch_keyword_has_a_hint_and_eachobs_refuses_them_too():
    assert all(hint for hint in PYTORCH_KEYWORDS.values())
    with pytest.raises(TypeError, match="parallel=n"):
        eachobs(np.arange(4), num_workers=2)


def test_an_unknown_keyword_raises_the_usual_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'batches'"):
        DataLoader(np.arange(4), batches=2)


def test_batch_size_none_points_to_eachobs():
    with pytest.raises(ValueError, match="eachobs"):
        DataLoader(np.arange(4), None)
