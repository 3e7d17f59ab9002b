"""The engine and its boundary (fastload._loading.engine, fastload._loading.schedule): schedules
made once from views, rings that fill up and drain, small steps claimed across step boundaries,
whole-step containers, and no view built per batch."""

import gc
import multiprocessing
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from helpers import assert_tree_equal, copy_tree, deadline, run_epochs

from fastload import (
    DataLoader,
    LoadError,
    _core,
    batchview,
    eachobs,
    eachobs_parallel,
    obsview,
    shuffleobs,
    views,
)
from fastload._loading import engine as engine_module
from fastload._loading.engine import Engine
from fastload._loading.engine_options import EngineOptions
from fastload._loading.schedule import Schedule, schedule_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _arrays(n):
    return np.arange(n * 3, dtype=np.float32).reshape(n, 3), np.arange(n, dtype=np.int64)


def test_schedule_counts_steps_and_slices_positions():
    s = Schedule(np.arange(10)[::-1], 4)
    assert (s.steps, s.rows) == (3, 4)
    assert s.positions(2).tolist() == [1, 0]
    assert Schedule(np.arange(10), 4, drop_last=True).steps == 2
    assert Schedule(np.arange(10)).steps == 10
    with pytest.raises(ValueError, match="outside"):
        Schedule(np.arange(10), 4, start=4)
    with pytest.raises(ValueError, match="batch_size"):
        Schedule(np.arange(10), 0)


def test_schedule_of_folds_obsview_layers_into_one_order():
    x = np.arange(20) * 10
    a, b = np.random.default_rng(0).permutation(20), np.arange(12)[::-1]
    container, schedule = schedule_of(
        batchview(obsview(obsview(x, a), b), 5, drop_last=True), seed=3, epoch=2
    )
    assert container is x
    assert schedule.order.tolist() == a[b].tolist()
    assert (schedule.batch_size, schedule.drop_last, schedule.steps) == (5, True, 2)
    assert (schedule.seed, schedule.epoch) == (3, 2)
    got = [copy_tree(v) for v in Engine(EngineOptions()).iterate(container, schedule)]
    assert_tree_equal(got, [x[a[b]][:5], x[a[b]][5:10]])


@pytest.mark.parametrize("parallel", [1, 2, 4])
@pytest.mark.parametrize("prefetch", [None, 1, 3])
@pytest.mark.parametrize("ordered", [True, False])
def test_small_steps_through_a_ring_that_fills_and_drains(parallel, prefetch, ordered):
    # Thousands of steps through a ring of a few slots (or the deep default one): the
    # tasks stop when every slot is taken and start again as the consumer frees them.
    data = _arrays(2500)
    for batch_size in (1, 3):
        kw = dict(batch_size=batch_size, shuffle=True, seed=7)
        loader = DataLoader(
            data, parallel=parallel, prefetch=prefetch, ordered=ordered, buffer=True, **kw
        )
        with deadline(60):
            got = run_epochs(loader, 2)
        expected = run_epochs(DataLoader(data, **kw), 2)
        if ordered:
            assert_tree_equal(got, expected)
        else:
            for g, e in zip(got, expected):
                assert sorted(b[1].tolist() for b in g) == sorted(b[1].tolist() for b in e)


def test_a_slow_consumer_gets_every_step_in_order():
    data = _arrays(600)
    loader = DataLoader(data, 2, shuffle=True, seed=1, parallel=2, buffer=True)
    got = []
    for k, batch in enumerate(loader):
        got.append(copy_tree(batch))
        if k % 50 == 0:
            threading.Event().wait(0.01)  # the ring fills and the tasks exit meanwhile
    assert_tree_equal(got, run_epochs(DataLoader(data, 2, shuffle=True, seed=1), 1)[0])


@pytest.mark.parametrize("parallel", [False, 2])
def test_a_loader_over_arrays_builds_no_view_per_batch(parallel, monkeypatch):
    made = []
    for cls in (views.ObsView, views.BatchView):
        original = cls.__init__

        def counting(self, *args, _original=original, **kwargs):
            made.append(type(self).__name__)
            _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", counting)
    loader = DataLoader(_arrays(100), 4, shuffle=True, seed=0, parallel=parallel)
    assert len(run_epochs(loader, 2)[1]) == 25
    assert made == []


class Batched:
    """A container with batches of its own (the engine loads whole steps); observation 5
    cannot be loaded."""

    def __numobs__(self):
        return 12

    def __getobs__(self, i):
        i = np.asarray(i)
        if np.any(i == 5):
            raise KeyError("observation 5 is missing")
        return {"i": i * 10}


@pytest.mark.parametrize("parallel", [False, 2])
def test_whole_step_containers_count_observations_and_skip_the_bad_one(parallel):
    loader = DataLoader(Batched(), 4, parallel=parallel, on_error="skip")
    with pytest.warns(RuntimeWarning, match="skipped 1"):
        batches = run_epochs(loader, 1)[0]
    assert [b["i"].tolist() for b in batches] == [[0, 10, 20, 30], [40, 60, 70], [80, 90, 100, 110]]
    assert (loader.stats()["items"], loader.stats()["skipped"]) == (11, 1)
    with pytest.raises(LoadError, match="could not load step 1"):
        list(DataLoader(Batched(), 4, parallel=parallel))


def test_eachobs_parallel_takes_any_view_and_loads_it_like_getobs():
    x, y = _arrays(30)
    view = batchview(shuffleobs((x, y), seed=2), 7)
    got = [copy_tree(b) for b in eachobs_parallel(view, parallel=2)]
    assert_tree_equal(got, [view[k] for k in range(len(view))])
    single = [copy_tree(o) for o in eachobs_parallel(obsview((x, y), np.arange(29, -1, -1)))]
    assert_tree_equal(single, [(x[i], y[i]) for i in range(29, -1, -1)])


def test_next_from_two_threads_at_once_is_refused():
    release = threading.Event()

    def slow(i):
        if i > 0:  # the plan reads observation 0 to learn its shape
            release.wait(10)
        return np.zeros(2)

    it = iter(eachobs(views.mapobs(slow, np.arange(4)), parallel=1))
    first = threading.Thread(target=lambda: [next(it), next(it)])  # waits in the second
    first.start()
    threading.Event().wait(0.3)
    with deadline(10), pytest.raises(ValueError, match="already in next()"):
        next(it)
    release.set()
    first.join(10)
    assert not first.is_alive()


def test_close_wakes_a_consumer_waiting_in_another_thread():
    release = threading.Event()

    def slow(x):
        if x >= 8:  # the plan reads observation 0 to learn its shape
            release.wait(10)
        return x

    loader = DataLoader(views.mapobs(slow, np.arange(40.0)), 4, parallel=2)
    raised = []

    def consume():
        try:
            list(loader)
        except RuntimeError as error:
            raised.append(error)

    consumer = threading.Thread(target=consume)
    consumer.start()
    threading.Event().wait(0.2)
    loader.close()
    release.set()
    consumer.join(10)
    assert not consumer.is_alive()
    assert raised and "closed" in str(raised[0])


def test_stats_and_progress_are_updated_by_the_delivery_loop():
    stats, progress = _core.Stats(), _core.Progress(0, 2)
    container, schedule = schedule_of(batchview(_arrays(10), 3), start=2)
    engine = Engine(EngineOptions(parallel=2))
    got = list(engine.iterate(container, schedule, stats=stats, progress=progress))
    assert [b[1].tolist() for b in got] == [[6, 7, 8], [9]]
    assert (stats.items, stats.batches, progress.step) == (4, 2, 4)


@pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(),
    reason="the process backend forks its workers",
)
def test_the_process_backend_takes_its_worker_count_from_fastload_num_threads():
    code = (
        "import multiprocessing, numpy as np\n"
        "from fastload import DataLoader, mapobs\n"
        "loader = DataLoader(mapobs(lambda v: v + 1, np.arange(12.0)), 4, parallel=True,\n"
        "                    backend='process')\n"
        "it = iter(loader); next(it)\n"
        "print(len(multiprocessing.active_children()))\n"
        "loader.close()\n"
    )
    env = {**os.environ, "FASTLOAD_NUM_THREADS": "3", "PYTHONPATH": ROOT}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert out.strip() == "3"


@pytest.mark.parametrize("parallel", [False, 2])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_an_interrupt_inside_user_code_stops_the_loop_as_an_interrupt(parallel, on_error):
    def interrupted_at_5(x):
        if x == 5:
            raise KeyboardInterrupt
        return x

    loader = DataLoader(
        views.mapobs(interrupted_at_5, np.arange(20.0)), 4, parallel=parallel, on_error=on_error
    )
    with deadline(10), pytest.raises(KeyboardInterrupt):
        list(loader)
    assert [b.tolist() for b in DataLoader(np.arange(8.0), 4, parallel=parallel)] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
    ]


@pytest.mark.parametrize("parallel", [False, 2])
def test_orders_drawn_ahead_are_the_orders_of_their_epochs(parallel):
    n = 70_000  # large enough that the next epoch's order is drawn ahead
    data = np.arange(n)
    loader = DataLoader(data, 10_000, shuffle=True, seed=5, parallel=parallel)
    for epoch in range(3):
        got = np.concatenate([b.copy() for b in loader])
        assert got.tolist() == loader.order(epoch).tolist()
    # A state from another seed makes the order drawn ahead useless: it is not used.
    other = DataLoader(data, 10_000, shuffle=True, seed=9)
    state = other.state_dict()
    loader.load_state_dict(state)
    assert np.concatenate([b.copy() for b in loader]).tolist() == other.order(0).tolist()


@pytest.mark.parametrize("parallel", [False, 2])
def test_a_step_whose_every_observation_is_skipped_is_passed_over(parallel):
    def fails_at_2(x):
        if x[0] == 2:
            raise KeyError("no record 2")
        return x

    data = views.mapobs(fails_at_2, np.arange(10).reshape(5, 2))
    single = eachobs(data, parallel=parallel, on_error="skip")
    with pytest.warns(RuntimeWarning, match="skipped 1"):
        assert [o.tolist() for o in single] == [[0, 1], [4, 5], [6, 7], [8, 9]]
    assert (single.stats()["items"], single.stats()["skipped"]) == (4, 1)
    batches = DataLoader(data, 1, parallel=parallel, on_error="skip")
    it = iter(batches)
    assert next(it).tolist() == [[0, 1]]
    assert next(it).tolist() == [[4, 5]]  # step 1 had nothing left
    assert batches.state_dict()["step"] == 3  # a resume starts after the skipped step


BUFFERED = {
    "sequential": {},
    "threads": {"parallel": 2},
    "threads-unordered": {"parallel": 2, "ordered": False},
    "processes": {"parallel": 2, "backend": "process"},
}
_KEPT = "still referenced when its memory is about to be reused"


def _kept_warnings(record):
    return [w for w in record if issubclass(w.category, RuntimeWarning) and _KEPT in str(w.message)]


@pytest.mark.parametrize("transport", BUFFERED)
@pytest.mark.parametrize(
    "keep",
    [
        lambda batch: batch,  # the batch itself
        lambda batch: batch[0],  # one of its arrays
        lambda batch: batch[0][:2],  # a view of it
    ],
    ids=["batch", "array", "view"],
)
def test_a_buffered_batch_kept_past_its_validity_is_warned_of_once(transport, keep):
    loader = DataLoader(_arrays(40), 4, buffer=True, **BUFFERED[transport])
    kept = []
    with deadline(20), pytest.warns(RuntimeWarning, match=_KEPT) as record:
        for batch in loader:
            kept.append(keep(batch))
    assert len(_kept_warnings(record)) == 1
    assert "buffer=False" in str(_kept_warnings(record)[0].message)
    loader.close()


def test_a_batch_kept_by_a_python_leaf_or_a_partial_step_is_warned_of():
    data = (views.mapobs(lambda v: v * 2, np.arange(10.0)), np.arange(10))
    kept = []
    with deadline(20), pytest.warns(RuntimeWarning, match=_KEPT):
        for x, _ in DataLoader(data, 3, buffer=True, parallel=2):  # 3, 3, 3, then 1
            kept.append(x)


@pytest.mark.parametrize("transport", BUFFERED)
def test_loops_that_keep_nothing_are_never_warned_of(transport, recwarn):
    n = 30
    data = (views.mapobs(lambda v: v + 1, np.arange(n * 2.0).reshape(n, 2)), np.arange(n))
    loader = DataLoader(data, 4, buffer=True, shuffle=True, seed=0, **BUFFERED[transport])
    totals = []
    with deadline(30):
        for _ in range(3):  # the last batch of an epoch stays bound while the next starts
            for x, y in loader:
                totals.append(float(x.sum() + y.sum()))
            for batch in loader:
                first = batch[0][:1]  # a view, dropped at the next step
                totals.append(float(first.sum()))
            for step, (x, y) in enumerate(loader):
                x = x * 2 + step  # rebinding to an array of its own
                totals.append(float(x.sum() + y.sum()))
    for x in eachobs_parallel(batchview(np.arange(40.0), 5), buffered=True, parallel=2):
        totals.append(float(x.sum()))
    assert _kept_warnings(recwarn) == []
    loader.close()


def test_a_failing_item_leaves_no_reference_to_its_slot(recwarn):
    # The traceback of a skipped item held views of the slot being loaded.
    def fail_on_odd(v):
        if int(v[0]) % 2:
            raise ValueError("odd")
        return v

    data = views.mapobs(fail_on_odd, np.arange(40.0).reshape(20, 2))
    with deadline(20):
        for _ in DataLoader(data, 4, buffer=True, parallel=2, on_error="skip"):
            pass
    assert _kept_warnings(recwarn) == []


@pytest.mark.parametrize("transport", BUFFERED)
def test_an_unbuffered_batch_is_the_caller_s_to_keep(transport, recwarn):
    with deadline(20):
        kept = list(DataLoader(_arrays(40), 4, **BUFFERED[transport]))
    x, y = (np.concatenate(part) for part in zip(*kept))
    assert_tree_equal(x[np.argsort(y)], _arrays(40)[0])
    assert _kept_warnings(recwarn) == []


def test_a_buffered_batch_stays_valid_until_the_next_one_is_requested():
    x, _ = _arrays(40)
    with deadline(20):
        for k, (batch, _) in enumerate(DataLoader(_arrays(40), 4, buffer=True)):
            np.testing.assert_array_equal(batch, x[4 * k : 4 * k + 4])


def test_an_iteration_started_while_another_holds_the_ring_gets_a_ring_of_its_own():
    x = np.arange(40, dtype=np.int64) * 3
    schedule = Schedule(np.arange(40), 8)
    expected = [x[k : k + 8].tolist() for k in range(0, 40, 8)]
    engine = Engine(EngineOptions(parallel=2, buffer=True))

    def delivered(iteration):
        """The batches' values, and whether each lay in the engine's ring."""
        values, in_ring = [], []
        for batch in iteration:
            values.append(batch.tolist())
            in_ring.append(any(np.shares_memory(batch, a) for slot in engine.ring for a in slot))
            del batch
        return values, in_ring

    first = engine.iterate(x, schedule)
    head = next(first)
    head_in_ring = any(np.shares_memory(head, a) for slot in engine.ring for a in slot)
    head = head.tolist()
    shared = engine.ring
    values, in_ring = delivered(engine.iterate(x, schedule))
    assert head_in_ring and values == expected and not any(in_ring)
    assert engine.ring is shared
    values, in_ring = delivered(first)
    assert [head] + values == expected and all(in_ring)
    # The first iteration is done: the next one takes the engine's ring again.
    values, in_ring = delivered(engine.iterate(x, schedule))
    assert values == expected and all(in_ring) and engine.ring is shared
    engine.close()


@pytest.mark.parametrize("buffer", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_a_run_that_moves_between_the_pool_and_the_caller_s_thread_loads_every_step(
    buffer, rows, monkeypatch
):
    # go_inline switches, at any step, between loading in the caller's thread and on the
    # pool: the steps are those of a plain run, in order, however often it switches.
    monkeypatch.setattr(engine_module, "_TINY_VALUES", 0)  # even these steps on the pool
    x, y = _arrays(3000)
    order = np.random.default_rng(rows).permutation(3000)
    engine = Engine(EngineOptions(parallel=2, buffer=buffer))
    engine._adapted = _NeverMeasures()  # the switches below are this test's alone
    iteration = engine.iterate((x, y), Schedule(order, rows))
    switches = set(np.random.default_rng(0).choice(3000 // rows, 12, replace=False).tolist())
    got, modes = [], []
    for step, value in enumerate(iteration):
        got.append(copy_tree(value))
        modes.append(iteration.inline)
        if step in switches:
            iteration.go_inline(not iteration.inline)
    expected = [(x[order[s : s + rows]], y[order[s : s + rows]]) for s in range(0, 3000, rows)]
    assert_tree_equal(got, expected)
    assert True in modes and False in modes


class _NeverMeasures(dict):
    """An engine's record of measured plans that says each was measured (on the pool)."""

    def get(self, key, default=None):
        return (False, True, 0)

    def __setitem__(self, key, value):
        pass


def test_an_adaptive_run_decides_once_and_loads_what_a_sequential_run_loads(monkeypatch):
    monkeypatch.setattr(engine_module, "_TINY_VALUES", 0)  # measured, not inline at once
    x, y = _arrays(20_000)
    order = np.random.default_rng(1).permutation(20_000)
    decided = []
    engine = Engine(EngineOptions(parallel=2, buffer=True))
    iteration = engine.iterate((x, y), Schedule(order, 1))
    assert iteration.inline is False  # measured: the pool first
    iteration.on_adapted, chained = decided.append, iteration.on_adapted
    got = [copy_tree(v) for v in iteration]
    assert_tree_equal(got, [(x[order[s : s + 1]], y[order[s : s + 1]]) for s in range(20_000)])
    assert len(decided) == 1 and isinstance(decided[0], bool)
    assert iteration.inline is decided[0]
    chained(decided[0])  # what the engine records: one measure, to be taken again
    assert list(engine._adapted.values()) == [(decided[0], False, 0)]


def test_the_engine_keeps_what_two_measures_say_then_measures_again(monkeypatch):
    monkeypatch.setattr(engine_module, "_TINY_VALUES", 0)  # measured, not inline at once
    x, y = _arrays(600)
    schedule = Schedule(np.arange(600), 4)
    engine = Engine(EngineOptions(parallel=2))
    runs = []

    def run():
        iteration = engine.iterate((x, y), schedule)
        runs.append((iteration.inline, iteration.on_adapted is not None))
        measured = iteration.on_adapted
        for _ in iteration:
            pass
        return measured

    run()(True)  # measured: the caller's thread was faster
    run()(False)  # a second measure that disagrees: a tie, the pool as asked
    for _ in range(engine_module._REMEASURE):
        run()  # the pool, not measured
    run()  # measured again
    assert runs == [(False, True)] * 2 + [(False, False)] * engine_module._REMEASURE + [
        (False, True)
    ]
    engine._adapted.clear()
    run()(True)
    run()(True)
    assert run() is None and runs[-1] == (True, False)  # the caller's thread: 0 threads
    assert engine.iterate((x, y), Schedule(np.arange(600), 4)).on_adapted is None
    # Steps whose loading runs Python code, or is costly, never go inline.
    expensive = Engine(EngineOptions(parallel=2)).iterate(
        (views.mapobs(lambda v: v + 1, x), y), schedule
    )
    assert expensive.on_adapted is None and expensive.inline is False


def test_tiny_steps_load_in_the_caller_s_thread_without_being_measured():
    # A step of a few values costs less to copy than any hand-over between threads.
    x, y = _arrays(2000)
    schedule = Schedule(np.random.default_rng(2).permutation(2000), 16)  # 32 values a step
    iteration = Engine(EngineOptions(parallel=2)).iterate((x, y), schedule)
    assert iteration.inline is True and iteration.on_adapted is None
    got = [copy_tree(v) for v in iteration]
    assert_tree_equal(got, [(x[p], y[p]) for p in np.split(schedule.order, 125)])
    wide = np.zeros((2000, 3000), np.float32)  # 12 KB a row: 16 rows are not tiny
    iteration = Engine(EngineOptions(parallel=2)).iterate((wide, y), schedule)
    assert iteration.inline is False and iteration.on_adapted is not None
    iteration.close()


# -- the gate: a native run waits for data being fetched ------------------------------------


class GateFeed:
    """A feed (``seams.Feed``) whose gate the test opens, and that records what the engine
    tells it."""

    def __init__(self, gate):
        self.gate = gate
        self.started, self.checked, self.told, self.closed = [], [], [], 0

    def start(self, gated):
        self.started.append(gated)

    def check(self, rows):
        self.checked.append(np.array(rows))

    def delivered(self, step):
        self.told.append(step)

    def ensure(self, rows):
        raise AssertionError("threads read what the gate lets by: nothing to ensure")

    def close(self):
        self.closed += 1


@pytest.mark.parametrize("parallel", [False, 2])
def test_a_gated_run_claims_nothing_past_the_gate_until_it_opens(parallel):
    # Steps of 100 rows: not tiny, so that parallel=2 loads on the pool.
    data = np.arange(2000.0).reshape(1000, 2)
    order = np.random.default_rng(0).permutation(1000)
    gate = np.full(1, 200, np.int64)  # the first 200 positions only: steps 0 and 1
    feed = GateFeed(gate)
    engine = Engine(EngineOptions(parallel=parallel, buffer=False))
    got, done = [], threading.Event()

    def consume():
        for step in engine.iterate(data, Schedule(order, 100), feeds=[feed]):
            got.append(step.copy())
        done.set()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    with deadline(30):
        while len(got) < 2:
            time.sleep(0.01)
    time.sleep(0.3)  # were a position past the gate claimed, step 2 would come now
    assert len(got) == 2 and not done.is_set()
    gate[0] = 1000
    assert done.wait(30)
    assert np.array_equal(np.concatenate(got), data[order])
    # Started once, gated; each step checked with its rows, then told, in order; closed.
    assert feed.started == [True] and feed.told == list(range(10))
    assert all(
        np.array_equal(c, order[100 * k : 100 * (k + 1)]) for k, c in enumerate(feed.checked)
    )
    gc.collect()
    assert feed.closed >= 1
    engine.close()


@pytest.mark.parametrize("parallel", [False, 2])
def test_the_feeds_close_when_the_iteration_ends_then_on_end_runs(parallel):
    data = np.arange(2000.0).reshape(1000, 2)
    feed = GateFeed(np.full(1, 1000, np.int64))
    engine = Engine(EngineOptions(parallel=parallel, buffer=False))
    closed_at_end = []
    iteration = engine.iterate(
        data,
        Schedule(np.arange(1000), 100),
        feeds=[feed],
        on_end=lambda: closed_at_end.append(feed.closed),
    )
    got = [step.copy() for step in iteration]
    # The iteration is still referenced: closed by its end, not by being dropped.
    assert np.array_equal(np.concatenate(got), data)
    assert closed_at_end == [1] and feed.closed == 1
    engine.close()


def test_two_gated_feeds_are_refused_before_a_run_starts():
    data = np.arange(2000.0).reshape(1000, 2)
    engine = Engine(EngineOptions(parallel=2, buffer=False))
    feeds = [GateFeed(np.full(1, 1000, np.int64)) for _ in range(2)]
    with pytest.raises(ValueError, match="one gated feed at most") as caught:
        engine.iterate(data, Schedule(np.arange(1000), 100), feeds=feeds)
    # Checked before anything started: no run (the traceback would keep one alive), no
    # feed started, both closed.
    assert caught.value is not None and len(engine._iterations) == 0
    assert [f.started for f in feeds] == [[], []] and [f.closed for f in feeds] == [1, 1]
    one = GateFeed(np.full(1, 1000, np.int64))
    got = [s.copy() for s in engine.iterate(data, Schedule(np.arange(1000), 100), feeds=[one])]
    assert np.array_equal(np.concatenate(got), data)
    engine.close()
