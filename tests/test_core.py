"""The native core (fastload._core): counter-based randomness and the thread pool."""

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastload import _core

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
U64 = st.integers(0, 2**64 - 1)
MASK = 2**64 - 1


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def reference_bits(seed, epoch, index, op, n):
    """SplitMix64 over the key, then a Weyl sequence through the same mixer (rng.h)."""
    h = mix64((seed + 0x9E3779B97F4A7C15) & MASK)
    for value, constant in (
        (epoch, 0x632BE59BD9B4E019),
        (index, 0x85EBCA77C2B2AE63),
        (op, 0xC2B2AE3D27D4EB4F),
    ):
        h = mix64(h ^ ((value + constant) & MASK))
    out = []
    for _ in range(n):
        h = (h + 0x9E3779B97F4A7C15) & MASK
        out.append(mix64(h))
    return out


@given(seed=U64, epoch=U64, index=U64, op=U64)
def test_rng_bits_match_a_plain_python_splitmix_reference(seed, epoch, index, op):
    assert _core.rng_bits(seed, epoch, index, op, 4).tolist() == reference_bits(
        seed, epoch, index, op, 4
    )


def test_rng_golden_values_are_pinned_across_versions():
    assert _core.rng_bits(0, 0, 0, 0, 3).tolist() == reference_bits(0, 0, 0, 0, 3)
    assert _core.rng_bits(0, 0, 0, 0, 3).tolist() == [
        8994622298736777380,
        5058164690367330941,
        457284686389304390,
    ]
    assert _core.rng_uniform(1, 2, 3, 4, 2).tolist() == pytest.approx(
        [(b >> 11) / 2.0**53 for b in reference_bits(1, 2, 3, 4, 2)], abs=0
    )


@given(key=st.tuples(U64, U64, U64, U64), position=st.integers(0, 3), delta=st.integers(1, 2**63))
def test_rng_draws_are_a_pure_function_of_the_key_and_change_with_any_part(key, position, delta):
    first = _core.rng_bits(*key, 8)
    assert np.array_equal(first, _core.rng_bits(*key, 8))
    assert np.array_equal(_core.rng_uniform(*key, 8), _core.rng_uniform(*key, 8))
    changed = list(key)
    changed[position] = (changed[position] + delta) & MASK
    assert not np.array_equal(first, _core.rng_bits(*changed, 8))
    assert not np.array_equal(_core.rng_uniform(*key, 8), _core.rng_uniform(*changed, 8))


def test_rng_uniform_draws_lie_in_0_1_and_are_roughly_uniform():
    draws = _core.rng_uniform(123, 4, 5, 6, 100_000)
    assert draws.dtype == np.float64 and draws.shape == (100_000,)
    assert draws.min() >= 0.0 and draws.max() < 1.0
    assert abs(draws.mean() - 0.5) < 0.02
    counts = np.histogram(draws, bins=10, range=(0, 1))[0]
    assert counts.min() > 9_000 and counts.max() < 11_000
    firsts = np.array([_core.rng_uniform(0, 0, i, 0, 1)[0] for i in range(20_000)])
    assert abs(firsts.mean() - 0.5) < 0.02
    assert len(np.unique(firsts)) == len(firsts)


def test_rng_with_zero_draws_gives_empty_arrays():
    assert _core.rng_uniform(1, 1, 1, 1, 0).shape == (0,)
    assert _core.rng_bits(1, 1, 1, 1, 0).shape == (0,)


def test_pool_size_is_at_least_one_and_stable():
    assert _core.pool_size() >= 1
    assert _core.pool_size() == _core.pool_size()
    assert _core.default_pool_size() >= 1


def test_reserve_threads_grows_the_pool_and_never_shrinks_it():
    size = _core.pool_size()
    assert _core.reserve_threads(1) == size
    assert _core.reserve_threads(size + 1) == size + 1
    assert _core.pool_size() == size + 1
    assert _core.reserve_threads(1) == size + 1


def run_child(code, **env):
    child = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, **env),
    )
    assert child.returncode == 0, child.stderr[-2000:]
    return child.stdout.split()


def test_fastload_num_threads_sets_the_default_pool_size():
    code = (
        "import os\n"
        "from fastload import _core\n"
        "before = len(os.listdir('/proc/self/task'))\n"
        "print(_core.default_pool_size(), _core.pool_size(),"
        " len(os.listdir('/proc/self/task')) - before)"
    )
    default, size, started = map(int, run_child(code, FASTLOAD_NUM_THREADS="3"))
    assert (default, size, started) == (3, 3, 3)


def test_a_bad_fastload_num_threads_falls_back_to_the_cpus():
    cpus = len(os.sched_getaffinity(0))
    for value in ("0", "-2", "many", ""):
        code = "from fastload import _core; print(_core.default_pool_size())"
        assert run_child(code, FASTLOAD_NUM_THREADS=value) == [str(cpus)]


def test_shutdown_pool_joins_the_threads_and_the_pool_restarts_on_use():
    code = (
        "import os\n"
        "import numpy as np\n"
        "from fastload import _core, DataLoader\n"
        "threads = lambda: len(os.listdir('/proc/self/task'))\n"
        "before = threads(); size = _core.pool_size(); started = threads()\n"
        "_core.shutdown_pool()\n"
        "import time\n"
        "for _ in range(100):  # a joined thread leaves /proc a moment after its join\n"
        "    after = threads()\n"
        "    if after == before:\n"
        "        break\n"
        "    time.sleep(0.01)\n"
        "ok = [b.tolist() for b in DataLoader(np.arange(10), 3, parallel=2)]\n"
        "print(before, size, started, after, ok == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]])"
    )
    before, size, started, after, ok = run_child(code, FASTLOAD_NUM_THREADS="2")
    assert (int(size), int(started) - int(before), int(after), ok) == (2, 2, int(before), "True")
