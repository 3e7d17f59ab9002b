"""The process backend: same steps as the thread engine and as plain getobs, errors and
dead workers reach the consumer, and nothing is left in /dev/shm."""

import functools
import gc
import mmap
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import simplejpeg
from helpers import assert_tree_equal, assert_workers_die_with_their_consumer, copy_tree, deadline
from hypothesis import given
from hypothesis import strategies as st

from fastload import DataLoader, LoadError, _core, batchview, getobs, mapobs, numobs, obsview
from fastload._base.tree import LeafKind
from fastload._loading import processes
from fastload._loading.engine import Engine
from fastload._loading.engine_options import EngineOptions, ProcessOptions
from fastload._loading.processes import WorkerError
from fastload._loading.schedule import Schedule, schedule_of
from fastload.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Compose,
    DecodeImage,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    ToCHW,
)


def _shm_entries():
    return {
        name for name in os.listdir("/dev/shm") if name.startswith(("psm_", "pym-", "fastload"))
    }


@pytest.fixture
def shm_clean():
    """Fails the test when it leaves a new shared-memory segment in /dev/shm."""
    before = _shm_entries()
    yield
    gc.collect()
    assert _shm_entries() - before == set()


def _steps(data, n, batch_size=7, shuffle=True, drop_last=False, collate=None, seed=3):
    order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
    return batchview(obsview(data, order), batch_size, drop_last, collate)


def process_engine(workers, buffer=True, processes=None, **options):
    options = EngineOptions(parallel=workers, backend="process", buffer=buffer, **options)
    return Engine(options, processes)


def thread_engine(**options):
    return Engine(EngineOptions(parallel=True, buffer=True, **options))


def _iterate(engine, steps, stats=None, **kw):
    """``steps`` (a view) loaded by ``engine``; ``kw``: seed, epoch, start."""
    return engine.iterate(*schedule_of(steps, **kw), stats=stats)


def _run(engine, steps, **kw):
    return [copy_tree(step) for step in _iterate(engine, steps, **kw)]


def _double(x):
    return x * 2


class Batched:
    """A container with its own batch semantics (loaded whole, step by step)."""

    def __init__(self, n):
        self.n = n

    def __numobs__(self):
        return self.n

    def __getobs__(self, i):
        return np.asarray(i, np.int64) * 10


def _configs():
    x = np.arange(60 * 3, dtype=np.float32).reshape(60, 3)
    y = np.arange(60, dtype=np.int64)

    def local_square(v):  # a local function: only 'fork' can ship it
        return v * v

    records = [{"id": k, "name": f"item{k}"} for k in range(60)]
    return {
        "tuple-shuffle": (_steps((x, y), 60), {}),
        "dict-drop_last": (_steps({"x": x, "y": y}, 60, drop_last=True), {}),
        "mapobs-lambda": (_steps(mapobs(lambda v: v + 1, x), 60, shuffle=False), {}),
        "mapobs-local": (_steps((mapobs(local_square, x), y), 60), {}),
        "module-function": (_steps(mapobs(_double, x), 60), {}),
        "list-of-dicts": (_steps(records, 60), {}),
        "collate-true": (_steps(mapobs(lambda v: {"v": v}, x), 60, collate=True), {}),
        "collate-callable": (_steps(y, 60, collate=lambda obs: sum(obs)), {}),
        "custom-getobs": (_steps(Batched(60), 60), {}),
        "single-observations": (obsview((x, y), np.arange(59, -1, -1)), {}),
        "resume-start": (_steps((x, y), 60), {"start": 4}),
    }


CONFIGS = _configs()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_same_steps_as_thread_engine_and_getobs(name, shm_clean):
    steps, kw = CONFIGS[name]
    engine = process_engine(2)
    try:
        got = _run(engine, steps, epoch=1, seed=5, **kw)
    finally:
        engine.close()
    threads = _run(thread_engine(), steps, epoch=1, seed=5, **kw)
    plain = [getobs(steps, k) for k in range(kw.get("start", 0), numobs(steps))]
    assert_tree_equal(got, threads)
    assert_tree_equal(got, plain)


def test_scalar_observations_of_a_python_leaf():
    steps = _steps(mapobs(_double, np.arange(30)), 30)
    engine = process_engine(2)
    try:
        got = _run(engine, steps)
    finally:
        engine.close()
    assert_tree_equal(got, [getobs(steps, k) for k in range(numobs(steps))])


def test_unbuffered_steps_are_owned_copies():
    steps = _steps(np.arange(40.0).reshape(20, 2), 20, batch_size=4)
    engine = process_engine(2, buffer=False)
    try:
        kept = list(_iterate(engine, steps))
    finally:
        engine.close()
    assert_tree_equal(kept, [getobs(steps, k) for k in range(numobs(steps))])


def _ring_pages(engine):
    """The bytes of each slot's whole pages in the engine's worker ring."""
    ring = engine._workers.shared
    return [bytes(ring.mapping[start : start + length]) for start, length in ring.spans]


def _copies_then_pages(engine, steps):
    """Every step of ``steps`` loaded by ``engine`` (copied, so that none is held), then
    the bytes of its ring's slots; the engine closed."""
    try:
        got = [copy_tree(step) for step in _iterate(engine, steps)]
        return got, _ring_pages(engine)
    finally:
        engine.close()


@pytest.mark.parametrize("buffer, lean", [(False, True), (True, True), (False, False)])
def test_a_lean_engine_gives_a_copied_steps_pages_back_and_keeps_the_rest(buffer, lean):
    # Rows of 3 pages, so that every slot holds whole pages whatever its offset.
    data = np.arange(24 * 3 * 4096, dtype=np.uint8).reshape(24, 3 * 4096) | 1
    steps = _steps(data, 24, batch_size=4)
    got, pages = _copies_then_pages(process_engine(2, buffer=buffer, lean=lean), steps)
    assert_tree_equal(got, [getobs(steps, k) for k in range(numobs(steps))])
    assert all(len(slot) >= 4096 for slot in pages)
    # Copied out by a lean engine: returned to the system, reading zeros; buffered, or
    # not lean: the steps stay.
    assert all((slot.count(0) == len(slot)) == (lean and not buffer) for slot in pages)


def _base_of(array):
    """The object that owns an array's memory, through views and buffers."""
    while isinstance(array, np.ndarray) and array.base is not None:
        array = array.base
    return array.obj if isinstance(array, memoryview) else array


def test_a_lean_engines_copies_are_maps_of_their_own():
    # Each step copied into an anonymous map, unmapped when the caller drops it (a freed
    # copy of a plain np.copy would stay in the allocator's heap).
    steps = _steps((np.arange(24 * 4096, dtype=np.uint8).reshape(24, 4096), np.arange(24)), 24)
    engine = process_engine(2, buffer=False, lean=True)
    try:
        got = list(_iterate(engine, steps))
    finally:
        engine.close()
    assert_tree_equal(got, [getobs(steps, k) for k in range(numobs(steps))])
    assert all(isinstance(_base_of(part), mmap.mmap) for step in got for part in step)


def _lent_from(engine, step):
    """True when every array of ``step`` lies in the engine's worker ring (lent, not
    copied)."""
    ring = np.frombuffer(engine._workers.shared.mapping, np.uint8)
    return all(np.shares_memory(part, ring) for part in step)


def _pages_rows(n):
    """``n`` rows of one page each, every row its own bytes, none zero."""
    return ((np.arange(n)[:, None] * 7 + np.arange(4096)) % 251 + 1).astype(np.uint8)


def _pages_steps(n=48, batch_size=4):
    """Steps of ``_pages_rows``, with their positions."""
    return _steps((_pages_rows(n), np.arange(n)), n, batch_size=batch_size)


def test_a_lending_engine_reuses_a_lent_slot_only_once_its_step_is_dropped():
    steps = _pages_steps()
    expected = [getobs(steps, k) for k in range(numobs(steps))]
    # 4 in flight, 6 slots
    engine = process_engine(2, buffer=False, processes=ProcessOptions(lend=True))
    try:
        batches = _iterate(engine, steps)
        first = next(batches)
        assert _lent_from(engine, first)
        rest, lent = [], []
        for step in batches:
            lent.append(_lent_from(engine, step))
            rest.append(copy_tree(step))
        # Eleven more steps went through a ring of six slots: the one kept was not reused.
        assert_tree_equal([first] + rest, expected)
        # Two lent at most: ``first`` and the loop's last step, while it asks for the next.
        assert lent == [True, False] * 5 + [True]
        assert len(engine._workers.shared.lent) == 2
        del first, step
        gc.collect()
        again = next(_iterate(engine, steps))  # the next iteration takes the slots back
        assert len(engine._workers.shared.lent) == 1 and _lent_from(engine, again)
        assert_tree_equal(again, expected[0])
    finally:
        engine.close()


@pytest.mark.parametrize(
    "workers, prefetch, ordered", [(2, None, True), (1, 1, True), (3, None, False)]
)
def test_a_caller_that_keeps_every_step_gets_copies_past_the_lending_limit(
    workers, prefetch, ordered
):
    # 46 rows: the last step, of 2, is copied whatever the limit.
    steps = _pages_steps(46)
    lend = ProcessOptions(lend=True)
    engine = process_engine(workers, False, lend, prefetch=prefetch, ordered=ordered)
    try:
        with deadline(60):
            got = list(_iterate(engine, steps))
        lent = [_lent_from(engine, step) for step in got]
    finally:
        engine.close()
    expected = [getobs(steps, k) for k in range(numobs(steps))]
    if not ordered:
        got.sort(key=lambda step: int(step[1][0]))
        expected.sort(key=lambda step: int(step[1][0]))
    assert_tree_equal(got, expected)
    # Two lent, whatever the ring: one slot always cycles.
    assert lent == [True] * 2 + [False] * (len(got) - 2)


def test_a_step_dropped_in_another_thread_comes_back_to_the_ring():
    steps = _pages_steps()
    engine = process_engine(2, buffer=False, processes=ProcessOptions(lend=True), lean=True)
    try:
        batches = _iterate(engine, steps)
        held = [next(batches), next(batches)]
        assert all(_lent_from(engine, step) for step in held)

        def drop():
            held.clear()

        thread = threading.Thread(target=drop)
        thread.start()
        thread.join()
        got = [copy_tree(step) for step in batches]
    finally:
        engine.close()
    assert_tree_equal(got, [getobs(steps, k) for k in range(2, numobs(steps))])


def test_a_lean_lending_engine_gives_a_dropped_steps_pages_back_at_once():
    steps = _pages_steps(24)
    engine = process_engine(2, buffer=False, processes=ProcessOptions(lend=True), lean=True)
    try:
        got, lent = [], []
        for step in _iterate(engine, steps):
            lent.append(_lent_from(engine, step))
            got.append(copy_tree(step))
        held = _ring_pages(engine)
        del step
        pages = _ring_pages(engine)  # before any other ``next()``
    finally:
        engine.close()
    assert all(lent)
    assert_tree_equal(got, [getobs(steps, k) for k in range(numobs(steps))])
    # While held, the last step's slot holds it; once dropped, every slot reads zeros.
    assert sum(slot.count(0) != len(slot) for slot in held) == 1
    assert all(len(slot) >= 4096 and slot.count(0) == len(slot) for slot in pages)


def _slow_pages_steps(n=48, batch_size=4, seconds=0.002):
    """``_pages_steps`` whose rows each take ``seconds`` to load."""
    rows, labels = _pages_rows(n), np.arange(n)

    def slow(row):
        time.sleep(seconds)
        return row

    return _steps((mapobs(slow, rows), labels), n, batch_size=batch_size, shuffle=False)


def _slot_of(engine, step):
    """The ring slot a lent step lies in."""
    ring = engine._workers.shared
    base = np.frombuffer(ring.mapping, np.uint8).ctypes.data
    offset = step[0].__array_interface__["data"][0] - base
    return max(k for k, (start, _) in enumerate(ring.spans) if start <= offset + mmap.PAGESIZE)


@pytest.mark.parametrize("workers", [1, 2])
def test_whole_step_jobs_take_a_slot_when_they_start(workers):
    # Jobs queued at a worker hold no slot: a step takes one when its work starts (a
    # released one first, else the lowest free), so the slots in use are those filled or
    # held at once (a worker's, the caller's step and the one before: workers + 2, or one
    # more while the caller is late), not all six of the ring (4 in flight + 2 held) in
    # turn.
    steps = _slow_pages_steps(seconds=0.005)
    lend = ProcessOptions(lend=True, split_steps=False)
    engine = process_engine(workers, buffer=False, processes=lend, prefetch=4)
    try:
        slots, got = [], []
        with deadline(60):
            for step in _iterate(engine, steps):
                assert _lent_from(engine, step)
                slots.append(_slot_of(engine, step))
                got.append(copy_tree(step))
        count = len(engine._workers.slots)
    finally:
        engine.close()
    assert_tree_equal(got, [getobs(steps, k) for k in range(numobs(steps))])
    assert count == 6 and max(slots) < 5


@pytest.mark.parametrize("workers", [1, 2])
def test_a_lean_ring_of_whole_steps_keeps_the_pages_of_the_slots_a_steady_state_uses(workers):
    # A released slot keeps its pages as a spare, which the next job takes first, while no
    # more slots hold pages than the workers' and the two lent (``keep``): the workers
    # fill spares again without faulting pages in, and only a slot beyond those gives its
    # pages back. After the epoch, no slot in use: the spares hold steps, the others zeros
    # (which spare a job takes: test_slot_claims_take_a_spare_first_else_the_lowest_free_slot).
    from fastload._loading import workers as worker_module

    steps = _slow_pages_steps(48, seconds=0.002)
    lend = ProcessOptions(lend=True, split_steps=False)
    engine = process_engine(workers, buffer=False, processes=lend, lean=True, prefetch=4)
    try:
        got = [copy_tree(step) for step in _iterate(engine, steps)]
        ring = engine._workers.shared
        words = ring.claims.words.copy()
        pages = _ring_pages(engine)
    finally:
        engine.close()
    assert_tree_equal(got, [getobs(steps, k) for k in range(numobs(steps))])
    assert ring.keep == workers + 2 and len(pages) == 6
    spares = [slot for slot, word in enumerate(words) if word == worker_module._SPARE]
    assert 1 <= len(spares) <= ring.keep
    assert all(words[slot] == worker_module._FREE for slot in range(6) if slot not in spares)
    for slot, data in enumerate(pages):
        assert len(data) >= 4096 and (data.count(0) < len(data)) == (slot in spares)


def test_whole_step_jobs_give_their_slots_back_after_failures_and_early_ends():
    # A step that fails, epochs left early and a lent step kept across them: every later
    # epoch still finds its free slots (a slot lost would make a worker find none).
    n = 48
    rows = _pages_rows(n)

    def item(i):
        if i == 13 and failing:
            raise ValueError("item 13")
        return rows[i]

    failing = True
    steps = _steps((mapobs(item, np.arange(n)), np.arange(n)), n, batch_size=4, shuffle=False)
    expected = [getobs((rows, np.arange(n)), np.arange(4 * k, 4 * k + 4)) for k in range(12)]
    lend = ProcessOptions(lend=True, split_steps=False)
    engine = process_engine(2, buffer=False, processes=lend, lean=True)
    try:
        with deadline(60):
            kept = None
            for _ in range(3):
                with pytest.raises(LoadError, match="13"):
                    for step in _iterate(engine, steps):
                        kept = step if kept is None else kept
                early = _iterate(engine, steps)
                next(early), next(early)  # left there: the next iteration stops it
            failing = False  # the workers forked with ``failing`` set: a new engine
            engine.close()
            got = [copy_tree(step) for step in _iterate(engine, steps)]
            assert_tree_equal(kept, expected[0])
    finally:
        engine.close()
    assert_tree_equal(got, expected)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_lent_step_dropped_early_never_frees_a_slot_a_worker_took_since(workers):
    # Each step dropped as soon as it is read, then the caller works a while: the step's
    # lease freed its slot and a worker takes it for its next job before the consumer
    # counts it free; counting it must not free it a second time under the worker (a
    # later step would overwrite the one in it).
    steps = _slow_pages_steps(32, seconds=0.001)
    lend = ProcessOptions(lend=True, split_steps=False)
    engine = process_engine(workers, buffer=False, processes=lend)
    expected = [getobs(steps, k) for k in range(numobs(steps))]
    try:
        with deadline(60):
            got = []
            for step in _iterate(engine, steps):
                got.append(copy_tree(step))
                del step
                time.sleep(0.006)
    finally:
        engine.close()
    assert_tree_equal(got, expected)


def test_a_worker_that_finds_no_free_slot_replies_that_it_failed():
    # A consumer's miscount: the job fails with a reply that says so, the worker lives on.
    from fastload._loading import workers

    claims = processes.SlotClaims(np.ones(2, np.int64), threading.Lock())
    control = np.ones(1, np.int64)
    worker = workers._Worker(None, [], control, claims)
    worker.epoch = workers.Epoch(1, None, False, ())
    reply = worker.answer(workers.Job(1, 5, -1))
    assert isinstance(reply, workers.WorkerFailed) and reply.step == 5
    assert "take a slot" in reply.what and "no free slot" in reply.message


def test_slot_claims_take_a_spare_first_else_the_lowest_free_slot():
    claims = processes.SlotClaims(np.zeros(4, np.int64), threading.Lock())
    assert [claims.take(), claims.take(), claims.take()] == [0, 1, 2]
    assert claims.holding() == 3
    claims.give(1)
    assert claims.take() == 1
    claims.spare(2)  # free, with its pages: taken before the lower free slot 0
    claims.give(0)
    assert claims.holding() == 2 and claims.take() == 2
    claims.spare(1)
    claims.reset({2})  # slot 2 lent: it stays taken; slot 1 stays a spare
    assert claims.holding() == 2
    assert [claims.take(), claims.take(), claims.take()] == [1, 0, 3]
    with pytest.raises(RuntimeError, match="no free slot"):
        claims.take()


def test_a_lease_that_outlived_its_turn_frees_nothing():
    steps = _pages_steps(24)
    engine = process_engine(2, buffer=False, processes=ProcessOptions(lend=True), lean=True)
    try:
        step = next(_iterate(engine, steps))
        ring = engine._workers.shared
        ((slot, token),) = ring.lent.items()
        stale = processes._Lease(ring, slot, token + 1)  # an earlier lease of the slot
        del stale
        assert ring.returned() == [] and ring.lent == {slot: token}
        assert_tree_equal(step, getobs(steps, 0))  # its pages were not given back
    finally:
        engine.close()


def test_a_forked_childs_copy_of_a_lent_step_leaves_the_parents_pages():
    steps = _pages_steps(24)
    engine = process_engine(2, buffer=False, processes=ProcessOptions(lend=True), lean=True)
    try:
        step = next(_iterate(engine, steps))
        pid = os.fork()
        if pid == 0:  # the child drops its copy of the lease, then leaves at once
            del step
            gc.collect()
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        assert_tree_equal(step, getobs(steps, 0))
    finally:
        engine.close()


def test_a_lent_structured_step_keeps_its_dtype():
    dtype = np.dtype([("a", "u1"), ("b", "<i4")], align=True)  # padded
    records = np.zeros(24, dtype)
    records["a"], records["b"] = np.arange(24), np.arange(24) * 1000
    steps = _steps(records, 24, batch_size=4)
    engine = process_engine(2, buffer=False, processes=ProcessOptions(lend=True))
    try:
        got = list(_iterate(engine, steps))
    finally:
        engine.close()
    assert all(step.dtype == dtype for step in got)
    assert_tree_equal(got, [getobs(steps, k) for k in range(numobs(steps))])


def test_a_lent_step_outlives_its_engine():
    steps = _pages_steps()
    engine = process_engine(2, buffer=False, processes=ProcessOptions(lend=True))
    kept = next(_iterate(engine, steps))
    assert _lent_from(engine, kept)
    engine.close()
    gc.collect()
    assert_tree_equal(kept, getobs(steps, 0))  # its ring stays mapped while it is held
    kept[0][:] = 7  # and it is the caller's to write


@pytest.mark.parametrize(
    "options",
    [
        {"backend": "thread", "parallel": 2},
        {"backend": "process", "parallel": 2, "buffer": True},
    ],
)
def test_lending_needs_worker_processes_and_no_buffer(options):
    with pytest.raises(ValueError, match="lend=True .* needs backend='process' and buffer=False"):
        Engine(EngineOptions(**options), ProcessOptions(lend=True))


def test_unordered_delivers_the_same_set_of_steps():
    steps = _steps(np.arange(50), 50, batch_size=5)
    engine = process_engine(3, ordered=False)
    try:
        got = sorted(tuple(b) for b in _run(engine, steps))
    finally:
        engine.close()
    assert got == sorted(tuple(getobs(steps, k)) for k in range(numobs(steps)))


@pytest.mark.slow
@given(
    n=st.integers(1, 40),
    batch_size=st.integers(1, 9),
    drop_last=st.booleans(),
    workers=st.integers(1, 3),
    seed=st.integers(0, 100),
)
def test_every_worker_count_gives_the_sequential_steps(n, batch_size, drop_last, workers, seed):
    data = (mapobs(lambda v: v * 3, np.arange(2 * n).reshape(n, 2)), np.arange(n) * 0.5)
    steps = _steps(data, n, batch_size, drop_last=drop_last, seed=seed)
    engine = process_engine(workers, prefetch=2)
    try:
        got = _run(engine, steps)
    finally:
        engine.close()
    assert_tree_equal(got, [getobs(steps, k) for k in range(numobs(steps))])


def _jpegs(n):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (n, 40, 48, 3), dtype=np.uint8)
    return [simplejpeg.encode_jpeg(image, quality=90) for image in images]


def test_image_pipeline_matches_the_native_thread_engine():
    compose = Compose(
        [
            DecodeImage(),
            RandomResizedCrop(32, scale=(0.5, 1)),
            RandomHorizontalFlip(),
            Normalize(IMAGENET_MEAN, IMAGENET_STD),
            ToCHW(),
        ]
    )
    steps = _steps((mapobs(compose, _jpegs(24)), np.arange(24)), 24, batch_size=8)
    engine = process_engine(2)
    try:
        got = _run(engine, steps, epoch=2, seed=11)
    finally:
        engine.close()
    assert_tree_equal(got, _run(thread_engine(), steps, epoch=2, seed=11))


def test_next_epoch_reuses_the_workers():
    steps = _steps(mapobs(lambda v: v + 1, np.arange(30)[:, None]), 30)
    engine = process_engine(2)
    try:
        first = _run(engine, steps, epoch=0)
        pids = [p.pid for p in engine._workers.procs]
        second = _run(engine, _steps(engine._workers.root, 30, seed=9), epoch=1)
        assert [p.pid for p in engine._workers.procs] == pids
    finally:
        engine.close()
    assert_tree_equal(first, [getobs(steps, k) for k in range(numobs(steps))])
    other = _steps(steps.data.data, 30, seed=9)
    assert_tree_equal(second, [getobs(other, k) for k in range(numobs(other))])


def _fails_at(bad):
    def load(v):
        if int(v[0]) == bad:
            raise KeyError(f"no record {bad}")
        return v

    return load


def test_a_worker_that_raises_names_the_index_with_its_traceback(shm_clean):
    data = mapobs(_fails_at(13), np.arange(40)[:, None])
    engine = process_engine(2)
    try:
        with deadline(30), pytest.raises(LoadError) as info:
            _run(engine, _steps(data, 40, shuffle=False, batch_size=4))
        assert info.value.index == 13
        assert "observation 13" in str(info.value) and "no record 13" in str(info.value)
        chain, error = [], info.value
        while error is not None:
            chain.append(error)
            error = error.__cause__
        remote = [e for e in chain if isinstance(e, WorkerError)]
        assert remote, f"no worker traceback in {chain!r}"
        original = [e for e in chain if type(e) is KeyError]  # as the thread backend gives
        assert original and original[0].args == ("no record 13",), chain
        assert "KeyError: 'no record 13'" in str(remote[0]) and "in load" in str(remote[0])
        # The workers survive an error: the next epoch runs on them.
        steps = _steps(np.arange(10), 10)
        assert_tree_equal(_run(engine, steps), [getobs(steps, k) for k in range(2)])
    finally:
        engine.close()


def test_skip_drops_failed_observations_like_the_thread_engine():
    data = mapobs(_fails_at(5), np.arange(20)[:, None])
    steps = _steps(data, 20, batch_size=6)
    engine = process_engine(2, on_error="skip")
    stats, thread_stats = _core.Stats(), _core.Stats()
    try:
        got = _run(engine, steps, stats=stats)
    finally:
        engine.close()
    assert_tree_equal(got, _run(thread_engine(on_error="skip"), steps, stats=thread_stats))
    assert stats.skipped == thread_stats.skipped == 1
    assert stats.items == thread_stats.items == 19


def _slow(v):
    time.sleep(0.02)
    return v


def test_killed_worker_raises_within_seconds(shm_clean):
    engine = process_engine(2)
    try:
        it = _iterate(engine, _steps(mapobs(_slow, np.arange(400)[:, None]), 400, batch_size=4))
        next(it)
        victim = engine._workers.procs[0]
        os.kill(victim.pid, signal.SIGKILL)
        with deadline(20), pytest.raises(RuntimeError, match="SIGKILL"):
            for _ in it:
                pass
        assert engine._workers.procs is None
        steps = _steps(np.arange(12), 12)
        assert_tree_equal(_run(engine, steps), [getobs(steps, k) for k in range(2)])
    finally:
        engine.close()


@pytest.mark.slow
def test_early_break_stops_jobs_and_the_next_epoch_is_exact(shm_clean):
    data = mapobs(_slow, np.arange(200)[:, None])
    engine = process_engine(2)
    try:
        with deadline(20):
            for k, _ in enumerate(_iterate(engine, _steps(data, 200, batch_size=4))):
                if k == 2:
                    break
        steps = _steps(data, 200, batch_size=4, seed=8)
        got = _run(engine, steps)
    finally:
        engine.close()
    assert_tree_equal(got, [getobs(steps, k) for k in range(numobs(steps))])


def test_ctrl_c_in_the_consumer_stops_cleanly(shm_clean):
    engine = process_engine(2)
    try:
        it = _iterate(engine, _steps(mapobs(_slow, np.arange(400)[:, None]), 400, batch_size=4))
        next(it)
        with deadline(20), pytest.raises(KeyboardInterrupt):
            for k, _ in enumerate(it):
                if k == 1:
                    os.kill(os.getpid(), signal.SIGINT)
        assert all(p.is_alive() for p in engine._workers.procs)
        steps = _steps(np.arange(12), 12)
        assert_tree_equal(_run(engine, steps), [getobs(steps, k) for k in range(2)])
    finally:
        engine.close()


def test_ctrl_c_reaching_a_worker_is_ignored_by_it():
    steps = _steps(mapobs(_slow, np.arange(40)[:, None]), 40, batch_size=4)
    engine = process_engine(2)
    try:
        it = _iterate(engine, steps)
        got = [copy_tree(next(it))]
        for proc in engine._workers.procs:
            os.kill(proc.pid, signal.SIGINT)
        got += [copy_tree(b) for b in it]
    finally:
        engine.close()
    assert_tree_equal(got, [getobs(steps, k) for k in range(numobs(steps))])


def test_dropping_the_engine_stops_its_workers():
    engine = process_engine(2)
    _run(engine, _steps(np.arange(10), 10))
    procs = list(engine._workers.procs)
    del engine
    gc.collect()
    for proc in procs:
        proc.join(10)
        assert not proc.is_alive()


def test_close_is_idempotent_and_the_next_iteration_restarts():
    engine = process_engine(1)
    steps = _steps(np.arange(10), 10)
    _run(engine, steps)
    engine.close()
    engine.close()
    assert_tree_equal(_run(engine, steps), [getobs(steps, k) for k in range(2)])
    engine.close()


@pytest.mark.parametrize(
    "bad", [{"parallel": 0}, {"parallel": 2, "prefetch": 0}, {"parallel": 2, "on_error": "ignore"}]
)
def test_bad_options_raise_value_error(bad):
    with pytest.raises(ValueError):
        EngineOptions(backend="process", **bad)


def test_dataloader_process_backend_matches_threads():
    data = (mapobs(lambda v: v * 2.0, np.arange(50.0)), np.arange(50))
    kw = dict(batch_size=8, shuffle=True, seed=4, buffer=True)
    procs = DataLoader(data, parallel=2, backend="process", **kw)
    threads = DataLoader(data, parallel=2, **kw)
    try:
        for _ in range(2):
            assert_tree_equal([copy_tree(b) for b in procs], [copy_tree(b) for b in threads])
    finally:
        procs.close()


def test_workers_exit_quietly_when_the_consumer_dies():
    code = (
        "import os, time, numpy as np\n"
        "from fastload import DataLoader, mapobs\n"
        "def slow(v):\n"
        "    time.sleep(0.01)\n"
        "    return v\n"
        "loader = DataLoader(mapobs(slow, np.arange(400.0)), 4, parallel=2,\n"
        "                    backend='process')\n"
        "it = iter(loader)\n"
        "next(it)\n"
        "os._exit(0)   # dies with jobs in flight: the workers' replies have no reader\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": root},
    )
    assert result.returncode == 0
    assert "Traceback" not in result.stderr and "Error" not in result.stderr, result.stderr


# -- worker_init, step turns, timeout ------------------------------------------------------


def _who(v):
    """The worker that loads ``v``, what its init left and its first random draw."""
    return np.array([_worker_state["id"], _worker_state["draw"], int(v[0])])


_worker_state = {"id": -1, "draw": -1}


def _init_worker(worker_id):
    rng = np.random.default_rng(worker_id)
    _worker_state.update(id=worker_id, draw=int(rng.integers(1000)))


def test_worker_init_runs_once_in_each_worker_and_whole_steps_go_in_turn(shm_clean):
    data = mapobs(_who, np.arange(24)[:, None])
    engine = process_engine(
        3, buffer=False, processes=ProcessOptions(worker_init=_init_worker, split_steps=False)
    )
    try:
        with deadline(30):
            for _ in range(2):  # the same workers, initialised once, over two epochs
                steps = _run(engine, _steps(data, 24, batch_size=4, shuffle=False))
                for k, step in enumerate(steps):
                    draw = int(np.random.default_rng(k % 3).integers(1000))
                    assert step[:, 0].tolist() == [k % 3] * 4
                    assert step[:, 1].tolist() == [draw] * 4
                    assert step[:, 2].tolist() == list(range(4 * k, 4 * k + 4))
    finally:
        engine.close()


def _split_steps(n, workers, batch_size):
    """The steps of n observations in order on ``workers`` workers, each row holding the
    id of the worker that loaded it (column 0) and the observation (column 2)."""
    data = mapobs(_who, np.arange(n)[:, None])
    engine = process_engine(workers, False, ProcessOptions(worker_init=_init_worker))
    try:
        with deadline(30):
            return _run(engine, _steps(data, n, batch_size=batch_size, shuffle=False))
    finally:
        engine.close()


def test_a_split_step_gives_worker_p_its_part_p_of_contiguous_rows(shm_clean):
    steps = _split_steps(23, 3, 7)
    # 7 rows: parts [0, 2), [2, 4), [4, 7); the last step's 2 rows: one row to each of 2.
    assert [step[:, 0].tolist() for step in steps] == [[0, 0, 1, 1, 2, 2, 2]] * 3 + [[0, 1]]
    assert np.concatenate([step[:, 2] for step in steps]).tolist() == list(range(23))


def _broken_init(worker_id):
    raise KeyError(f"worker {worker_id} has no key")


def test_an_error_in_worker_init_is_raised_as_it_was_raised(shm_clean):
    engine = process_engine(2, processes=ProcessOptions(worker_init=_broken_init))
    try:
        with deadline(30), pytest.raises(KeyError, match="worker 0 has no key") as info:
            _run(engine, _steps(mapobs(_double, np.arange(10.0)), 10))
        assert isinstance(info.value.__cause__, WorkerError)  # the worker's traceback
        assert "_broken_init" in str(info.value.__cause__)
    finally:
        engine.close()


def _sleepy(v):
    time.sleep(5)
    return v


def test_a_step_later_than_the_timeout_raises_timeout_error(shm_clean):
    engine = process_engine(2, processes=ProcessOptions(timeout=0.5))
    try:
        with deadline(30), pytest.raises(TimeoutError, match="in 0.5 s"):
            _run(engine, _steps(mapobs(_sleepy, np.arange(4.0)), 4, batch_size=1))
    finally:
        engine.close()


_TEST_PROCESS = os.getpid()


def _blocked(v):
    if os.getpid() != _TEST_PROCESS:  # the consumer reads observation 0 to plan
        time.sleep(60)
    return v


def test_a_step_later_than_the_timeout_raises_on_time_and_stops_the_workers(shm_clean):
    engine = process_engine(2, processes=ProcessOptions(timeout=1))
    try:
        it = _iterate(engine, _steps(mapobs(_blocked, np.arange(4.0)), 4, batch_size=1))
        workers = engine.worker_processes
        start = time.monotonic()
        with deadline(60), pytest.raises(TimeoutError, match="in 1 s"):
            next(it)
        # On time (within a second of it): the workers stuck in their items are stopped
        # at once, not given their jobs' time to end. The bound is loose for a loaded machine.
        assert time.monotonic() - start < 1 + 3
        for proc in workers:
            proc.join(10)
            assert not proc.is_alive()
        steps = _steps(np.arange(12), 12)  # the next iteration starts new workers
        assert_tree_equal(_run(engine, steps), [getobs(steps, k) for k in range(2)])
    finally:
        engine.close()


_FORK_NOISE = (
    "import gc, os, sys, numpy as np\n"
    "from fastload import DataLoader, mapobs\n"
    "class Parents:\n"
    "    def __del__(self):\n"
    "        print('finalized in', os.getpid(), file=sys.stderr)\n"
    "consumer = os.getpid()\n"
    "def collect(v):\n"
    "    if os.getpid() != consumer:  # the consumer reads observation 0 to plan\n"
    "        gc.collect()  # what any allocation in a worker may do\n"
    "    return v\n"
    "gc.disable()  # the parent's garbage stays until it collects it\n"
    "garbage = Parents()\n"
    "garbage.cycle = garbage\n"
    "del garbage\n"
    "loader = DataLoader(mapobs(collect, np.arange(8.0)), 2, parallel=2, backend='process')\n"
    "assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]\n"
    "loader.close()\n"
    "gc.collect()  # here, in its own process, the parent's object is finalized\n"
    "print('parent', os.getpid(), file=sys.stderr)\n"
)


def test_a_worker_never_runs_the_finalizers_of_its_parents_objects():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run(
        [sys.executable, "-c", _FORK_NOISE],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": root},
    )
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    parent = lines[-1].split()[1]
    assert lines == [f"finalized in {parent}", f"parent {parent}"], result.stderr


_STUCK_WORKERS = (
    "import os, sys, threading, time, numpy as np\n"
    "from fastload import DataLoader, mapobs\n"
    "consumer = os.getpid()\n"
    "def stuck(v):\n"
    "    if os.getpid() != consumer:  # the consumer reads observation 0 to plan\n"
    "        os.write(1, b'%d\\n' % os.getpid())\n"
    "        time.sleep(3600)\n"
    "    return v\n"
    "def consume():\n"
    "    loader = DataLoader(mapobs(stuck, np.arange(8.0)), 2, parallel=2, backend='process')\n"
    "    next(iter(loader))\n"
    "if sys.argv[1] == 'thread':\n"
    "    threading.Thread(target=consume, daemon=True).start()\n"
    "    time.sleep(3600)\n"
    "consume()\n"
)


@pytest.mark.parametrize("where", ["main", "thread"])
def test_workers_stuck_in_an_item_die_with_a_killed_consumer(where):
    # Forked from the main thread, a worker dies with its parent by the kernel's signal;
    # from another thread (whose end would send it), a watchdog sees the parent gone.
    assert_workers_die_with_their_consumer(_STUCK_WORKERS.replace("sys.argv[1]", repr(where)), 2)


def _slow_while(path, v):
    if v >= 2 and os.path.exists(path):
        open(path + ".asleep", "w").close()  # tells the test a worker holds on to its job
        time.sleep(5)
    return v


def test_an_iteration_started_while_workers_hold_on_to_old_jobs_gets_new_workers(
    tmp_path, monkeypatch
):
    flag = tmp_path / "slow"
    flag.touch()
    monkeypatch.setattr(processes, "_STOP_S", 0.5)
    steps = _steps(mapobs(functools.partial(_slow_while, str(flag)), np.arange(8.0)), 8, 2, False)
    engine = process_engine(2, buffer=False)
    try:
        first = _iterate(engine, steps)
        assert next(first).tolist() == [0.0, 1.0]  # the next steps sleep in the workers
        old = engine.worker_processes
        with deadline(30):  # a slow machine may not have started them yet
            while not (tmp_path / "slow.asleep").exists():
                time.sleep(0.01)
        flag.unlink()
        with deadline(30):  # they cannot give their jobs up within 0.5 s: new workers load
            got = list(_iterate(engine, steps))
        assert [step.tolist() for step in got] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]
        assert not any(proc.is_alive() for proc in old)
        with pytest.raises(RuntimeError, match="stopped"):
            next(first)
    finally:
        engine.close()


@pytest.mark.parametrize(
    "backend, bad",
    [
        ("thread", {"worker_init": _init_worker}),
        ("thread", {"timeout": 1.0}),
        ("process", {"timeout": 0}),
        ("process", {"timeout": True}),
    ],
)
def test_worker_options_are_checked(backend, bad):
    with pytest.raises(ValueError):
        Engine(EngineOptions(parallel=2, backend=backend), ProcessOptions(**bad))
    with pytest.raises(TypeError, match="worker_init must be a callable"):
        ProcessOptions(worker_init=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="split_steps must be True or False"):
        ProcessOptions(split_steps="no")  # type: ignore[arg-type]


# -- the native path in a worker -----------------------------------------------------------


def _augment():
    return Compose([DecodeImage(), RandomResizedCrop(24, scale=(0.3, 1)), RandomHorizontalFlip()])


def _compose_refused(worker_id):
    """Makes ``Compose.__call__`` (the Python path of an image leaf) fail in the worker."""

    def refused(self, *args, **kwargs):
        raise AssertionError("a worker loaded an image leaf through Compose.__call__")

    Compose.__call__ = refused  # type: ignore[method-assign]  # in the forked worker only


def test_a_worker_loads_a_native_image_leaf_natively_as_the_thread_engine_does(shm_clean):
    # The worker runs the step as the engine's inline native run: the image leaf's crops
    # and flips are drawn and applied in C, never through the Python Compose.
    steps = _steps((mapobs(_augment(), _jpegs(30)), np.arange(30)), 30, batch_size=6)
    engine = process_engine(2, processes=ProcessOptions(worker_init=_compose_refused))
    try:
        with deadline(60):
            got = _run(engine, steps, epoch=1, seed=5)
    finally:
        engine.close()
    assert_tree_equal(got, _run(thread_engine(), steps, epoch=1, seed=5))


def _with_corrupt(n, bad):
    images = _jpegs(n)
    images[bad] = images[bad][: len(images[bad]) // 3]  # truncated: its decode fails
    return images


def _load_error(engine, steps):
    try:
        with deadline(60), pytest.raises(LoadError) as info:
            _run(engine, steps)
    finally:
        engine.close()
    return info.value


def test_a_corrupt_jpeg_in_a_worker_raises_the_thread_engines_load_error(shm_clean):
    steps = _steps(mapobs(_augment(), _with_corrupt(20, 11)), 20, shuffle=False, batch_size=4)
    got = _load_error(process_engine(2), steps)
    want = _load_error(thread_engine(), steps)
    assert got.index == want.index == 11
    assert str(got) == str(want) and "observation 11" in str(got)


def _skipping_on_both(steps):
    """The steps loaded with ``on_error="skip"`` by 2 workers, checked equal to the thread
    engine's, with the stats of each."""
    stats, thread_stats = _core.Stats(), _core.Stats()
    engine = process_engine(2, on_error="skip")
    try:
        with deadline(60):
            got = _run(engine, steps, stats=stats)
    finally:
        engine.close()
    assert_tree_equal(got, _run(thread_engine(on_error="skip"), steps, stats=thread_stats))
    return got, stats, thread_stats


def test_skip_drops_corrupt_jpegs_like_the_thread_engine(shm_clean):
    steps = _steps((mapobs(_augment(), _with_corrupt(20, 7)), np.arange(20)), 20, batch_size=6)
    got, stats, thread_stats = _skipping_on_both(steps)
    assert 7 not in np.concatenate([labels for _, labels in got]).tolist()
    assert stats.skipped == thread_stats.skipped == 1
    assert stats.items == thread_stats.items == 19


def _threads(v):
    """The threads of the process loading ``v``."""
    return np.asarray(len(os.listdir("/proc/self/task")))


def test_a_worker_loads_in_its_one_thread_whatever_the_consumers_pool(shm_clean):
    # The consumer's pool runs when the workers fork: a worker's inline run starts no
    # thread of its own pool, which fork left without threads.
    _run(thread_engine(), _steps(mapobs(_augment(), _jpegs(8)), 8))
    data = (mapobs(_augment(), _jpegs(16)), mapobs(_threads, np.arange(16)))
    engine = process_engine(2)
    try:
        with deadline(60):
            got = _run(engine, _steps(data, 16, batch_size=4))
    finally:
        engine.close()
    assert [counts.tolist() for _, counts in got] == [[1] * 4] * 4


def _inline_run(rows, order, step, filler):
    """An inline run of step ``step`` of ``order`` (steps of ``rows``), one Python field
    filled by ``filler``, as a worker runs its step."""
    run = _core.Iteration(
        None,
        ring=[[None]],
        values=[None],
        objects=[[None]],
        rows=rows,
        buffer=False,
        stats=_core.Stats(),
        progress=_core.Progress(),
    )
    run.start_run(
        _core.Fields([(LeafKind.OBJECT, None)], [0]),
        order=order,
        bounds=None,
        first_step=step,
        end_step=step + 1,
        seed=0,
        epoch=0,
        parallel=0,
        claim_size=rows,
        ordered=True,
        skip_errors=False,
        release_gil=True,
        filler=filler,
    )
    return run


def test_a_run_watching_a_word_stops_once_another_process_changes_it():
    # What stops a worker's run when the consumer moves to another generation: the
    # engine's own cancellation, read between items; the step never passes for loaded.
    word = np.zeros(1, np.int64)
    loaded = []
    rows = 6

    def filler(slot, field, pos, index):
        loaded.append(index)
        if pos == 2:
            word[0] = 1  # as the consumer writes the ring's generation word

    run = _inline_run(rows, np.arange(12, dtype=np.int64), 1, filler)
    run.watch(word, 0)
    with pytest.raises(RuntimeError, match="closed"):
        run.load_next()
    assert loaded == [6, 7, 8]


def test_an_unchanged_word_lets_the_run_load_its_step():
    word = np.full(1, 4, np.int64)
    loaded = []
    run = _inline_run(
        3, np.arange(9, dtype=np.int64), 2, lambda slot, field, pos, index: loaded.append(index)
    )
    run.watch(word, 4)
    assert run.load_next()[:3] == (2, 3, None)
    assert run.load_next() is None
    assert loaded == [6, 7, 8]


class _BatchedFailing(Batched):
    """Batches of its own, whose observations 4 to 7 fail to load."""

    def __getobs__(self, i):
        i = np.asarray(i)
        if np.any((i >= 4) & (i < 8)):
            raise KeyError("no record in 4..7")
        return i * 10


def test_skip_passes_over_a_whole_step_that_fails_like_the_thread_engine(shm_clean):
    # A container loaded whole steps at a time: the step none of whose observations load
    # is passed over, on threads and in workers alike (the engine's skip in both).
    steps = _steps(_BatchedFailing(20), 20, shuffle=False, batch_size=4)
    got, stats, thread_stats = _skipping_on_both(steps)
    assert [step.tolist() for step in got] == [[0, 10, 20, 30]] + [
        [10 * j for j in range(k, k + 4)] for k in (8, 12, 16)
    ]
    assert stats.skipped == thread_stats.skipped and stats.items == thread_stats.items == 16


# -- a step's rows split over the workers --------------------------------------------------


def _split_data(n, corrupt=()):
    """(seeded JPEG crops and flips, labels, names): native, gathered and object leaves."""
    images = _jpegs(n)
    for bad in corrupt:
        images[bad] = images[bad][: len(images[bad]) // 3]  # truncated: its decode fails
    return (mapobs(_augment(), images), np.arange(n), [f"item {k}" for k in range(n)])


@pytest.mark.parametrize("batch_size", [1, 2, 5, 8, 13])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_split_steps_give_the_thread_engines_values_exactly(batch_size, on_error):
    # 29 observations: a last partial step, and (batch 1, 2) steps of fewer rows than workers.
    corrupt = (4, 17, 18) if on_error == "skip" else ()
    steps = _steps(_split_data(29, corrupt), 29, batch_size=batch_size, seed=2)
    stats, thread_stats = _core.Stats(), _core.Stats()
    engine = process_engine(3, buffer=False, on_error=on_error)
    try:
        with deadline(60):
            got = _run(engine, steps, stats=stats, epoch=3, seed=7)
    finally:
        engine.close()
    threads = Engine(EngineOptions(parallel=True, on_error=on_error))
    want = _run(threads, steps, stats=thread_stats, epoch=3, seed=7)
    assert_tree_equal(got, want)
    assert stats.skipped == thread_stats.skipped == len(corrupt)
    assert stats.items == thread_stats.items == 29 - len(corrupt)
    labels = np.concatenate([step[1] for step in got]).tolist()
    assert sorted(labels) == sorted(set(range(29)) - set(corrupt))


def test_split_and_whole_steps_give_the_same_values():
    steps = _steps(_split_data(20, (9,)), 20, batch_size=7)
    results = []
    for split_steps in (True, False):
        engine = process_engine(
            2, processes=ProcessOptions(split_steps=split_steps), on_error="skip"
        )
        try:
            with deadline(60):
                results.append(_run(engine, steps, epoch=1, seed=4))
        finally:
            engine.close()
    assert_tree_equal(results[0], results[1])


def _fails_at_any(bad):
    def load(v):
        if int(v[0]) in bad:
            raise KeyError(f"no record {int(v[0])}")
        return v

    return load


@pytest.mark.parametrize("bad", [{10}, {10, 9}, {11, 6}])
def test_a_failure_in_a_split_step_names_its_first_observation_and_type(bad, shm_clean):
    # Step 1 holds 6..11; 3 workers load 6-7, 8-9 and 10-11: the lowest part's failure
    # is raised, the first failing position, as the thread backend raises it.
    data = mapobs(_fails_at_any(bad), np.arange(24)[:, None])
    steps = _steps(data, 24, shuffle=False, batch_size=6)
    engine = process_engine(3)
    try:
        with deadline(30), pytest.raises(LoadError) as info:
            _run(engine, steps)
    finally:
        engine.close()
    assert info.value.index == min(bad)
    assert f"observation {min(bad)}" in str(info.value)
    chain, error = [], info.value
    while error is not None:
        chain.append(error)
        error = error.__cause__
    assert any(type(e) is KeyError and e.args == (f"no record {min(bad)}",) for e in chain)
    assert any(isinstance(e, WorkerError) for e in chain)


def test_a_step_with_fewer_rows_than_workers_is_split_one_row_a_worker(shm_clean):
    steps = _split_steps(5, 4, 3)
    assert [step[:, 0].tolist() for step in steps] == [[0, 1, 2], [0, 1]]
    assert [step[:, 2].tolist() for step in steps] == [[0, 1, 2], [3, 4]]


def test_steps_of_different_sizes_are_split_as_the_thread_engine_loads_them(shm_clean):
    data = _split_data(20, (13,))
    order = np.random.default_rng(1).permutation(20)
    bounds = [0, 6, 7, 11, 17, 18, 20]  # a batch sampler's steps of 6, 1, 4, 6, 1 and 2
    schedule = Schedule(order, 6, bounds=bounds, seed=3, epoch=2)
    results = []
    for engine in (
        process_engine(3, buffer=False, on_error="skip"),
        Engine(EngineOptions(on_error="skip")),
    ):
        try:
            with deadline(60):
                results.append([copy_tree(step) for step in engine.iterate(data, schedule)])
        finally:
            engine.close()
    assert_tree_equal(results[0], results[1])
    kept = [[k for k in order[a:b] if k != 13] for a, b in zip(bounds, bounds[1:])]
    assert [step[1].tolist() for step in results[0]] == [labels for labels in kept if labels]


def _faults_of_churn(i):
    """Minor page faults of one item that allocates and frees 12 blocks of 0.9 MB, as
    a PIL decode churns through its temporaries (read in the worker that loads it)."""

    def faults():
        with open("/proc/self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[7])

    before = faults()
    blocks = [np.ones(900_000, np.uint8) for _ in range(12)]  # touched: faulted in
    del blocks
    return faults() - before


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or "libasan" in os.environ.get("LD_PRELOAD", ""),
    reason="it measures glibc's malloc, which only Linux has, and which make sanitize "
    "replaces with ASan's allocator: there is nothing of glibc's to measure",
)
def test_a_worker_keeps_what_an_item_frees_for_the_next_item():
    """glibc's default gives the 10 MB an item freed back to the system, and the next
    item faults it in again (about 2,600 faults per item); fastload's workers keep it."""
    first = np.ones(1_000_000, np.uint8)  # a block freed early sets glibc's thresholds
    del first
    loader = DataLoader(mapobs(_faults_of_churn, np.arange(16)), parallel=1, backend="process")
    faults = np.concatenate(list(loader)).tolist()
    assert max(faults[4:]) < 100, faults
