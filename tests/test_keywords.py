"""PyTorch's DataLoader keywords: each one fastload spells differently raises a TypeError
that says what to write instead."""

import re

import numpy as np
import pytest

from fastload import (
    DataLoader,
    batchview,
    eachobs,
    eachobs_parallel,
    kfolds,
    oversample,
    randobs,
    shuffleobs,
    splitobs,
    undersample,
)
from fastload._base.keywords import PYTORCH_KEYWORDS


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


def test_mlutils_spellings_say_fastloads_names_all_in_one_error():
    """MLUtils' ``DataLoader(data; batchsize, partial, rng)``: one TypeError names every
    misspelled keyword of the call with fastload's name for it."""
    for make in (DataLoader, eachobs):
        with pytest.raises(TypeError) as info:
            make(np.arange(4), batchsize=2, partial=False, rng=1, num_workers=2, colour=1)
        message = str(info.value)
        for name, hint in [
            ("batchsize=", "batch_size="),
            ("partial=", "drop_last="),
            ("rng=", "seed="),
            ("num_workers=", "parallel=n"),
            ("'colour'", "unexpected"),
        ]:
            assert name in message and hint in message
        assert "5 of the keywords" in message
    with pytest.raises(TypeError, match="batch_size="):
        batchview(np.arange(4), batchsize=2)
    with pytest.raises(TypeError, match="moveaxis"):
        DataLoader(np.arange(4), obsdim=1)


def test_each_buffering_spelling_points_to_the_other():
    with pytest.raises(TypeError, match="use buffer=True"):
        DataLoader(np.arange(4), 2, buffered=True)
    with pytest.raises(TypeError, match="use buffered=True"):
        eachobs_parallel(np.arange(4), buffer=True)


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"batch_size": True}, ValueError, "batch_size must be an int >= 1, got True"),
        ({"batch_size": np.int64(0)}, ValueError, "batch_size must be an int >= 1"),
        ({"drop_last": "no"}, TypeError, "drop_last must be True or False, got 'no'"),
        ({"drop_last": 1}, TypeError, "drop_last must be True or False"),
        ({"shuffle": 1}, ValueError, "shuffle must be False, True or 'quasi', got 1"),
        ({"shuffle": 0}, ValueError, "shuffle must be False, True or 'quasi'"),
        ({"ordered": "yes"}, TypeError, "ordered must be True or False"),
        ({"buffer": 1}, TypeError, "buffer must be True, False, or arrays"),
        ({"prefetch": True}, ValueError, "prefetch must be a positive int"),
        ({"seed": True}, TypeError, "seed must be an int or None"),
        ({"parallel": 2.0}, ValueError, "parallel must be False, True or a number"),
    ],
)
def test_flags_are_bools_and_sizes_are_ints(options, error, message):
    """``batch_size=True`` is not 1, ``drop_last="no"`` is not true, and ``shuffle=1`` is
    not a container's shuffle: each raises, saying what is expected."""
    batch_size = options.pop("batch_size", 2)
    with pytest.raises(error, match=re.escape(message)):
        DataLoader(np.arange(4), batch_size, **options)


def test_numpy_bools_and_ints_are_taken():
    loader = DataLoader(np.arange(5), np.int64(2), drop_last=np.bool_(True), shuffle=np.True_)
    assert len(loader) == 2 and loader.drop_last is True
    assert len(batchview(np.arange(5), np.int32(2), drop_last=np.False_)) == 3
    with pytest.raises(ValueError, match="batch_size"):
        batchview(np.arange(5), True)
    with pytest.raises(TypeError, match="drop_last"):
        batchview(np.arange(5), 2, drop_last="no")


def test_random_views_point_rng_to_seed():
    """MLUtils' ``shuffleobs(data; rng)``, ``splitobs(data; at, rng)`` and the samplers'
    ``rng`` are fastload's ``seed=``."""
    data = (np.arange(6), np.arange(6) % 2)
    for make in (shuffleobs, splitobs, kfolds, oversample, undersample, randobs):
        with pytest.raises(TypeError, match=rf"{make.__name__}\(\) has no rng= .*seed="):
            make(data, rng=1)
