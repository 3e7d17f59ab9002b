"""Parallel loading on the native pool (fastload._loading.engine, DataLoader(parallel=...)): the
same output as sequential loading for any thread count, errors, and clean-up (early
break, Ctrl-C, fork, many loaders)."""

import _thread
import gc
import multiprocessing
import os
import re
import subprocess
import sys
import threading
import time
import tracemalloc

import numpy as np
import pytest
from helpers import assert_tree_equal, copy_tree, deadline, run_epochs
from hypothesis import given
from hypothesis import strategies as st

from fastload import (
    DataLoader,
    LoadError,
    _core,
    batchview,
    eachobs,
    eachobs_parallel,
    mapobs,
    numobs,
)
from fastload._loading.engine import Engine
from fastload._loading.engine_options import EngineOptions
from fastload._loading.schedule import schedule_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def array(n, dtype, layout, width=4):
    """An (n, ...) array of ``dtype`` with distinct rows, laid out as ``layout``."""
    base = (np.arange(n * width * 2 * 3) % 251).reshape(n, width * 2, 3)
    if dtype == "bool":
        base = base % 2
    base = base.astype(dtype)
    if layout == "c":
        return np.ascontiguousarray(base[:, :width])
    if layout == "strided":
        return base[:, ::2]
    if layout == "fortran":
        return np.asfortranarray(base[:, :width])
    if layout == "reversed":
        return base[::-1, :width]
    if layout == "vector":
        return np.ascontiguousarray(base[:, 0, 0])
    raise ValueError(layout)


@st.composite
def array_containers(draw, n):
    def one():
        return array(
            n,
            draw(
                st.sampled_from(
                    ["uint8", "int16", "int64", "float32", "float64", "bool", "complex64"]
                )
            ),
            draw(st.sampled_from(["c", "strided", "fortran", "reversed", "vector"])),
        )

    kind = draw(st.sampled_from(["array", "tuple", "dict", "nested"]))
    if kind == "array":
        return one()
    if kind == "tuple":
        return (one(), one())
    if kind == "dict":
        return {"x": one(), "y": one()}
    return (one(), {"y": one(), "z": (one(),)})


def sequential_and_parallel(data, parallel, **options):
    expected = run_epochs(DataLoader(data, **options), 2)
    for buffer in (False, True):
        got = run_epochs(DataLoader(data, parallel=parallel, buffer=buffer, **options), 2)
        assert_tree_equal(got, expected, f"parallel={parallel} buffer={buffer}")


@pytest.mark.parametrize("parallel", [1, 2, 4])
@given(
    data=st.data(),
    n=st.integers(0, 40),
    batch_size=st.integers(1, 12),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
)
def test_parallel_output_equals_sequential_for_arrays_of_any_dtype_and_layout(
    parallel, data, n, batch_size, drop_last, shuffle
):
    container = data.draw(array_containers(n))
    sequential_and_parallel(
        container, parallel, batch_size=batch_size, drop_last=drop_last, shuffle=shuffle, seed=n
    )


def test_parallel_true_output_equals_sequential():
    data = (array(50, "float32", "strided"), array(50, "int64", "vector"))
    sequential_and_parallel(data, True, batch_size=7, shuffle=True, seed=3)


class Custom:
    """Defines its own batches with __getobs__ (the engine loads whole steps)."""

    def __init__(self, n):
        self.n = n

    def __numobs__(self):
        return self.n

    def __getobs__(self, i):
        return {"i": np.asarray(i) * 3, "kind": "batch" if np.ndim(i) else "one"}


class Sequence:
    """A plain Python sequence of dicts of arrays and numbers."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": np.full(3, i, np.float32), "label": i % 5}


def total(observations):
    return {"sum": np.sum([np.sum(o) for o in observations]), "count": len(observations)}


PYTHON_CONTAINERS = {
    "list-of-dicts": (lambda: [{"a": np.full(2, i), "b": float(i)} for i in range(23)], None),
    "list-of-dicts-collate-true": (
        lambda: [{"a": np.full(2, i), "b": float(i)} for i in range(23)],
        True,
    ),
    "sequence-collate-true": (lambda: Sequence(23), True),
    "mapobs-arrays": (lambda: mapobs(lambda x: x[::-1] * 2, array(23, "int16", "c")), None),
    "mapobs-tuple": (lambda: mapobs(lambda x: (x.sum(), x[:1]), array(23, "float64", "c")), None),
    "mapobs-scalars": (lambda: mapobs(lambda x: float(x) / 2, array(23, "int64", "vector")), None),
    "mapobs-ragged-collate-false": (
        lambda: mapobs(lambda x: np.zeros(int(x) % 3 + 1), array(23, "int64", "vector")),
        False,
    ),
    "custom-getobs": (lambda: Custom(23), None),
    "collate-false": (
        lambda: (array(23, "float32", "strided"), array(23, "int64", "vector")),
        False,
    ),
    "collate-callable": (lambda: array(23, "float32", "fortran"), total),
}


@pytest.mark.parametrize("parallel", [1, 2, 4])
@pytest.mark.parametrize("name", list(PYTHON_CONTAINERS))
def test_parallel_output_equals_sequential_for_python_containers(name, parallel):
    make, collate = PYTHON_CONTAINERS[name]
    for shuffle in (False, True):
        sequential_and_parallel(
            make(), parallel, batch_size=5, shuffle=shuffle, seed=2, collate=collate
        )


@pytest.mark.parametrize("parallel", [False, 2])
def test_ragged_mapobs_results_raise_a_load_error_unless_collated_as_lists(parallel):
    ragged = mapobs(lambda x: np.zeros(int(x) % 3 + 1), array(23, "int64", "vector"))
    with pytest.raises(LoadError):
        list(DataLoader(ragged, 5, parallel=parallel))


def test_parallel_output_equals_sequential_for_an_object_array():
    # Run in a child: copying object pointers without their reference counts crashes
    # the interpreter later, at an unpredictable point.
    code = (
        "import numpy as np, gc\n"
        "from fastload import DataLoader\n"
        "data = np.array([f'item {i}' for i in range(40)], dtype=object)\n"
        "one = DataLoader(data, 4, shuffle=True, seed=1)\n"
        "seq = [b.tolist() for e in range(3) for b in one]\n"
        "par = DataLoader(data, 4, shuffle=True, seed=1, parallel=2)\n"
        "got = [b.tolist() for e in range(3) for b in par]\n"
        "assert got == seq, (got, seq)\n"
        "del par, got; gc.collect()\n"
        "print('ok', flush=True)\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert child.returncode == 0 and child.stdout.strip() == "ok", (
        f"exit status {child.returncode}: {child.stdout[-500:]}{child.stderr[-2000:]}"
    )


@pytest.mark.parametrize("parallel", [2, 4])
def test_unordered_parallel_yields_the_same_multiset_of_batches(parallel):
    data = (array(61, "float32", "strided"), array(61, "int64", "vector"))
    for collate in (None, False):
        expected = run_epochs(DataLoader(data, 4, shuffle=True, seed=9, collate=collate), 2)
        loader = DataLoader(
            data, 4, shuffle=True, seed=9, collate=collate, parallel=parallel, ordered=False
        )
        for got, want in zip(run_epochs(loader, 2), expected):
            assert sorted(map(repr, got)) == sorted(map(repr, want))


@pytest.mark.parametrize("buffered", [False, True])
def test_eachobs_parallel_yields_every_observation_and_every_batch_in_order(buffered):
    x, y = array(37, "float64", "fortran"), array(37, "int64", "vector")
    observations = [copy_tree(o) for o in eachobs_parallel((x, y), buffered=buffered)]
    assert_tree_equal(observations, [(x[i], y[i]) for i in range(37)])
    view = batchview((x, y), 5)
    batches = [copy_tree(b) for b in eachobs_parallel(view, buffered=buffered, parallel=2)]
    assert_tree_equal(batches, [view[b] for b in range(numobs(view))])
    assert len(eachobs_parallel(view)) == numobs(view) == 8


@pytest.mark.parametrize("parallel", [2, 4])
def test_eachobs_parallel_loader_equals_sequential_eachobs(parallel):
    data = {"x": array(29, "uint8", "strided"), "y": array(29, "float32", "vector")}
    expected = run_epochs(eachobs(data, shuffle=True, seed=4), 2)
    for buffer in (False, True):
        got = run_epochs(eachobs(data, shuffle=True, seed=4, parallel=parallel, buffer=buffer), 2)
        assert_tree_equal(got, expected)


def test_buffered_parallel_steady_state_allocates_nothing_per_batch():
    rows, width = 128, 512
    data = np.zeros((rows * 110, width), np.float32)
    batch_bytes = rows * width * 4
    loader = DataLoader(data, rows, shuffle=True, seed=0, buffer=True, parallel=2)
    it = iter(loader)
    for _ in range(5):
        next(it)
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for _ in range(100):
            next(it)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    it.close()
    assert peak - start < batch_bytes // 8, f"{peak - start} bytes traced, batch {batch_bytes}"


def failing_at_7(calls=None):
    def f(x):
        if int(np.ravel(x)[0]) == 7 * 4:
            error = KeyError("no such key")
            if calls is not None:
                calls.append(error)
            raise error
        return x * 2

    return f


class FailsAt7:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == 7:
            raise RuntimeError("corrupt record")
        return np.full(2, i)


def assert_load_error_at_7(error_info, original_type, function_name):
    error = error_info.value
    assert error.index == 7
    assert re.search(r"\b7\b", str(error)), str(error)
    cause = error.__cause__
    assert isinstance(cause, original_type)
    frames = []
    tb = cause.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert function_name in frames, frames


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("parallel", [False, 1, 2, 4])
def test_an_error_in_a_mapobs_function_surfaces_as_load_error_naming_index_7(parallel, shuffle):
    data = np.arange(400).reshape(100, 4)
    calls = []
    loader = DataLoader(
        mapobs(failing_at_7(calls), data), 10, shuffle=shuffle, seed=1, parallel=parallel
    )
    with deadline(10), pytest.raises(LoadError) as info:
        for _ in loader:
            pass
    assert_load_error_at_7(info, KeyError, "f")
    assert info.value.__cause__ is calls[0]


@pytest.mark.parametrize("collate", [None, True, False])
def test_an_error_in_a_custom_getitem_surfaces_as_load_error_naming_index_7(collate):
    with deadline(10), pytest.raises(LoadError) as info:
        list(DataLoader(FailsAt7(100), 8, collate=collate, shuffle=True, seed=0, parallel=2))
    assert_load_error_at_7(info, RuntimeError, "__getitem__")
    with deadline(10), pytest.raises(LoadError) as info:
        list(eachobs(FailsAt7(100), parallel=2))
    assert_load_error_at_7(info, RuntimeError, "__getitem__")


def test_the_pool_serves_new_loaders_after_an_error_and_after_an_early_break():
    data = array(100, "float32", "strided")
    expected = run_epochs(DataLoader(data, 8, shuffle=True, seed=5), 1)
    with deadline(20):
        with pytest.raises(LoadError):
            list(DataLoader(FailsAt7(100), 8, parallel=2))
        assert_tree_equal(
            run_epochs(DataLoader(data, 8, shuffle=True, seed=5, parallel=2), 1), expected
        )
        for _ in range(3):
            for k, _ in enumerate(DataLoader(mapobs(lambda x: x + 1, data), 4, parallel=2)):
                if k == 2:
                    break
        assert_tree_equal(
            run_epochs(DataLoader(data, 8, shuffle=True, seed=5, parallel=4), 1), expected
        )


def wait_for_child(pid, timeout_s=30):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError(f"child {pid} still running after {timeout_s} s")


def child_iterates(data, expected):
    got = run_epochs(DataLoader(data, 8, shuffle=True, seed=1, parallel=2), 1)
    return all(np.array_equal(a, b) for a, b in zip(got[0], expected[0])) and len(got[0]) == len(
        expected[0]
    )


def test_a_forked_child_can_load_in_parallel_after_the_parent_used_the_pool():
    data = array(64, "float32", "strided")
    expected = run_epochs(DataLoader(data, 8, shuffle=True, seed=1, parallel=2), 1)
    live = iter(DataLoader(data, 8, parallel=2))
    next(live)  # the parent has an iteration in progress while it forks
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if child_iterates(data, expected) else 3
        finally:
            os._exit(code)
    assert wait_for_child(pid) == 0
    assert len([b for b in live]) == 7


def _mp_child(queue, data, expected):
    queue.put(child_iterates(data, expected))


def test_a_multiprocessing_fork_child_can_load_in_parallel():
    data = array(64, "float32", "strided")
    expected = run_epochs(DataLoader(data, 8, shuffle=True, seed=1, parallel=2), 1)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    process = context.Process(target=_mp_child, args=(queue, data, expected))
    process.start()
    try:
        assert queue.get(timeout=30) is True
    finally:
        process.join(30)
        if process.is_alive():
            process.kill()
    assert process.exitcode == 0


def native_threads():
    return len(os.listdir("/proc/self/task"))


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_thousand_dropped_parallel_loaders_leave_no_threads_and_little_memory():
    data = array(256, "float32", "c", width=16)
    labels = array(256, "int64", "vector")
    for _ in range(3):
        list(DataLoader((data, labels), 16, shuffle=True, parallel=2, seed=0))
    gc.collect()
    python_threads, threads, rss = threading.active_count(), native_threads(), rss_bytes()
    with deadline(60):
        for k in range(1000):
            source = (data, labels) if k % 10 else mapobs(lambda x: x * 2, data)
            loader = DataLoader(source, 16, shuffle=True, parallel=2, seed=k, buffer=bool(k % 2))
            it = iter(loader)
            next(it)
            next(it)
            del it, loader
    gc.collect()
    assert threading.active_count() == python_threads
    assert native_threads() <= threads
    assert rss_bytes() - rss < 50 * 2**20


def test_ctrl_c_reaches_the_consumer_promptly_and_a_new_loader_works_after():
    release = threading.Event()

    def slow(x):
        for _ in range(5):  # a slow item, in small steps
            if release.wait(0.004):
                break
        return x + 1

    data = array(2000, "float64", "c")
    timer = threading.Timer(0.3, _thread.interrupt_main)
    delivered = 0
    with deadline(10):
        with pytest.raises(KeyboardInterrupt):
            timer.start()
            for _ in DataLoader(mapobs(slow, data), 8, parallel=2):
                delivered += 1
        timer.join()
    assert 0 < delivered < 250
    release.set()
    with deadline(10):
        got = run_epochs(DataLoader(data, 16, shuffle=True, seed=2, parallel=2), 1)
    assert_tree_equal(got, run_epochs(DataLoader(data, 16, shuffle=True, seed=2), 1))


@pytest.mark.parametrize("buffer", [False, True])
def test_engine_on_error_skip_drops_the_failed_item_from_its_batch_and_counts_it(buffer):
    data = np.arange(120).reshape(30, 4)
    engine = Engine(EngineOptions(on_error="skip", buffer=buffer, parallel=2))
    container, schedule = schedule_of(batchview(mapobs(failing_at_7(), data), 10))
    stats = _core.Stats()
    with deadline(10):
        batches = [copy_tree(b) for b in engine.iterate(container, schedule, stats=stats)]
    assert [len(b) for b in batches] == [9, 10, 10]
    assert_tree_equal(batches[0], np.delete(data[:10], 7, axis=0) * 2)
    assert_tree_equal(batches[1:], [data[10:20] * 2, data[20:] * 2])
    assert (stats.skipped, stats.items) == (1, 29)
    with deadline(10):
        for _ in engine.iterate(container, schedule, stats=stats):
            pass
    assert stats.skipped == 2


@pytest.mark.parametrize("parallel", [False, 2])
def test_loader_on_error_skip_gives_the_batches_of_the_engine_and_counts_the_skip(parallel):
    data = np.arange(120).reshape(30, 4)
    loader = DataLoader(mapobs(failing_at_7(), data), 10, on_error="skip", parallel=parallel)
    with deadline(10), pytest.warns(RuntimeWarning, match="skipped 1"):
        batches = run_epochs(loader, 1)[0]
    assert_tree_equal(
        batches, [np.delete(data[:10], 7, axis=0) * 2, data[10:20] * 2, data[20:] * 2]
    )
    assert loader.stats()["skipped"] == 1
    assert loader.stats()["items"] == 29


def test_engine_rejects_bad_options_with_value_error():
    for options in (
        {"on_error": "ignore"},
        {"parallel": -1},
        {"prefetch": 0},
        {"prefetch": True},
        {"backend": "fibers"},
        {"backend": "process", "parallel": False},
    ):
        with pytest.raises(ValueError):
            Engine(EngineOptions(**options))


def test_a_thread_count_above_the_cpus_gives_the_same_output():
    data = (mapobs(lambda x: x * 3, array(40, "int16", "c")), array(40, "float32", "strided"))
    got = run_epochs(DataLoader(data, 4, shuffle=True, seed=6, parallel=8), 1)
    assert_tree_equal(got, run_epochs(DataLoader(data, 4, shuffle=True, seed=6), 1))


@pytest.mark.parametrize("buffer", [True, False])
def test_two_iterations_of_one_loader_at_once_do_not_share_buffers(buffer):
    data = np.arange(40.0).reshape(20, 2)
    loader = DataLoader(data, 4, parallel=2, buffer=buffer)
    first, second = iter(loader), iter(loader)
    pairs = [(a.copy(), b.copy()) for a, b in zip(first, second)]
    assert len(pairs) == 5
    for k, (a, b) in enumerate(pairs):
        assert np.array_equal(a, data[4 * k : 4 * k + 4])
        assert np.array_equal(b, data[4 * k : 4 * k + 4])


# Every path a step takes: the caller's thread, pool threads, worker processes, each with
# arrays the caller owns or views of the ring (buffer=True), in order or not.
SCALAR_PATHS = {
    "sequential": {},
    "sequential buffer": {"buffer": True},
    "threads": {"parallel": 2},
    "threads buffer": {"parallel": True, "buffer": True},
    "threads unordered": {"parallel": 2, "ordered": False},
    "processes": {"parallel": 2, "backend": "process"},
    "processes buffer": {"parallel": 2, "backend": "process", "buffer": True},
}
SCALARS = {
    "int64 array": (np.arange(1, 11), np.int64),
    "list of ints": (list(range(1, 11)), np.int64),
    "list of floats": ([k / 2 for k in range(1, 11)], np.float64),
    "uint8 array": (np.arange(1, 11, dtype=np.uint8), np.uint8),
    "list of bools": ([k % 3 == 0 for k in range(1, 11)], np.bool_),
}


@pytest.mark.parametrize("path", list(SCALAR_PATHS))
@pytest.mark.parametrize("name", list(SCALARS))
def test_a_scalar_observation_is_a_numpy_scalar_of_the_same_value_on_every_path(name, path):
    data, scalar = SCALARS[name]
    options = SCALAR_PATHS[path]
    in_order = sorted if options.get("ordered") is False else list
    expected = [scalar(v) for v in data]
    with eachobs(data, **options) as loader:
        got = list(loader)  # kept, not copied: a scalar is a value, not a view of the ring
    assert [type(v) for v in got] == [scalar] * len(data), path
    assert in_order(got) == in_order(expected), path
    assert len(set(got)) == len(set(expected))  # hashable, as numbers are
    # A batch of scalars is a 1-d array of that dtype on every path.
    with eachobs(data, batch_size=4, **options) as loader:
        batches = [copy_tree(b) for b in loader]
    assert all(type(b) is np.ndarray and b.ndim == 1 for b in batches), path
    assert all(b.dtype == np.dtype(scalar) for b in batches), path
    assert sorted(map(len, batches)) == [2, 4, 4], path
    values = np.concatenate(batches).tolist()
    assert in_order(values) == in_order(np.asarray(expected).tolist()), path


@pytest.mark.parametrize("buffered", [False, True])
def test_eachobs_parallel_and_a_stream_give_scalar_observations_as_numpy_scalars(buffered):
    got = list(eachobs_parallel(list(range(1, 11)), buffered=buffered, parallel=2))
    assert [type(v) for v in got] == [np.int64] * 10 and got == list(range(1, 11))
    stream = eachobs((k for k in range(1, 11)), parallel=2, buffer=buffered)
    got = list(stream)
    assert [type(v) for v in got] == [np.int64] * 10 and got == list(range(1, 11))
