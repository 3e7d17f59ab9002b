"""``EngineOptions`` and ``ProcessOptions``: how an engine loads, checked once when made;
``check_parallel``, the one check of ``parallel=`` that every loader goes through."""

import re

import numpy as np
import pytest

from fastload import DataLoader, eachobs, eachobs_parallel
from fastload._loading.engine import Engine
from fastload._loading.engine_options import EngineOptions, ProcessOptions, check_parallel


@pytest.mark.parametrize(
    "given, stored",
    [(False, False), (0, False), (np.bool_(True), True), (True, True), (np.int64(3), 3), (1, 1)],
)
def test_check_parallel_gives_false_true_or_a_count(given, stored):
    got = check_parallel(given)
    assert got == stored and type(got) is type(stored)


@pytest.mark.parametrize("bad", [-1, 2.0, "4", None])
def test_every_loader_refuses_a_bad_parallel_with_one_message(bad):
    message = f"parallel must be False, True or a number of threads >= 1, got {bad!r}"
    for make in (
        lambda: check_parallel(bad),
        lambda: EngineOptions(parallel=bad),
        lambda: DataLoader(np.arange(4), 2, parallel=bad),
        lambda: eachobs(np.arange(4), parallel=bad),
        lambda: eachobs_parallel(np.arange(4), parallel=bad),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            make()


def test_parallel_zero_is_the_caller_s_thread_on_every_path():
    assert DataLoader(np.arange(4), 2, parallel=0).parallel is False
    assert eachobs(np.arange(4), parallel=0).parallel is False
    assert [int(v) for v in eachobs_parallel(np.arange(4), parallel=0)] == [0, 1, 2, 3]


def test_process_options_need_worker_processes():
    with pytest.raises(ValueError, match="act on worker processes: use backend='process'"):
        Engine(EngineOptions(parallel=2), ProcessOptions(split_steps=False))
    engine = Engine(EngineOptions(parallel=2, backend="process"))
    assert engine.processes == ProcessOptions()  # the defaults
    assert Engine(EngineOptions(parallel=2)).processes is None


@pytest.mark.parametrize(
    "options, error, message",
    [
        (dict(buffer=1), TypeError, "buffer must be True or False"),
        (dict(lean="yes"), TypeError, "lean must be True or False"),
        (dict(prefetch=0), ValueError, "prefetch must be a positive int or None"),
        (dict(backend="process"), ValueError, "backend='process' needs parallel=True"),
    ],
)
def test_engine_options_are_checked_when_made(options, error, message):
    with pytest.raises(error, match=re.escape(message)):
        EngineOptions(**options)
