"""The ``"process-ring"`` path of ``fastload.torch.DataLoader``: Python map-style datasets
with workers, loaded into fastload's shared-memory ring, against PyTorch's own loader;
the worker contract (seeds, ``get_worker_info``, ``worker_init_fn``, errors, ``timeout``,
``persistent_workers``), and which dataset takes which path."""

import collections
import multiprocessing
import os
import random
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.utils.data as tud  # noqa: E402

import fastload  # noqa: E402
from fastload.torch import DataLoader  # noqa: E402

JOIN_S = 30.0
Pair = collections.namedtuple("Pair", ["x", "y"])


class ArrayDataset(tud.Dataset):
    """(array, label) items, as PyTorch users write them."""

    def __init__(self, n=50, tensor=False):
        self.n, self.tensor = n, tensor

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = np.arange(12, dtype=np.float32).reshape(3, 4) + i
        return (torch.from_numpy(x) if self.tensor else x), i


class RandomDataset(tud.Dataset):
    """Draws from the worker's torch and random states, as augmentations do."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.rand(2), random.random(), i


class MixedDataset(tud.Dataset):
    """Numbers of every kind, a dict and a namedtuple."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return {
            "a": np.float32(i) / 2,
            "b": Pair(x=i % 2 == 0, y=float(i)),
            "c": torch.full((2,), i, dtype=torch.int16),
        }


class InfoDataset(tud.Dataset):
    """What ``get_worker_info()`` says, and what ``worker_init_fn`` left."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        info = tud.get_worker_info()
        if info is None:  # num_workers=0, or the probe that reads observation 0
            return 0, 1, 0, 0, 0, i
        return info.id, info.num_workers, info.seed, torch.initial_seed(), self.mark, i


class CallsDataset(tud.Dataset):
    """Counts, across processes, the calls of ``worker_init_fn``."""

    def __init__(self):
        self.calls = multiprocessing.get_context("fork").Value("i", 0)

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return os.getpid(), i


def count_call(worker_id):
    info = tud.get_worker_info()
    with info.dataset.calls.get_lock():
        info.dataset.calls.value += 1


def mark_worker(worker_id):
    tud.get_worker_info().dataset.mark = 100 + worker_id


class Broken(Exception):
    pass


class FailingDataset(tud.Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, i):
        if i == 9:
            raise Broken(f"item {i} is broken")
        return np.zeros(3), i


class GrowingDataset(tud.Dataset):
    """Observations of 2 + i // 4 values: one shape per batch of 4, not per dataset."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return torch.full((2 + i // 4,), i)


class SlowInWorkersDataset(tud.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if tud.get_worker_info() is not None:
            time.sleep(3)
        return i


class TouchedDataset(tud.Dataset):
    """Records in which process its items were read."""

    def __init__(self):
        self.pids = []

    def __len__(self):
        return 6

    def __getitem__(self, i):
        self.pids.append(os.getpid())
        return i


class BatchedDataset(ArrayDataset):
    def __getitems__(self, indices):
        return [self[i] for i in indices]


def batches_of(make, dataset, seed=3, epochs=2, **kw):
    """The batches of ``epochs`` epochs of ``make(dataset, **kw)`` after
    ``torch.manual_seed(seed)``, and the loader."""
    torch.manual_seed(seed)
    loader = make(dataset, **kw)
    return [list(loader) for _ in range(epochs)], loader


def assert_same(ours, theirs):
    """Equal batches, structure, types and dtypes included."""
    assert type(ours) is type(theirs)
    if isinstance(theirs, torch.Tensor):
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)
    elif isinstance(theirs, dict):
        assert ours.keys() == theirs.keys()
        for key in theirs:
            assert_same(ours[key], theirs[key])
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            assert_same(a, b)
    else:
        assert ours == theirs


def assert_exited(procs):
    for proc in procs:
        proc.join(JOIN_S)
        assert not proc.is_alive()


# -- the same batches as PyTorch ----------------------------------------------------------


@pytest.mark.parametrize("tensor", [False, True], ids=["numpy", "torch"])
def test_a_map_dataset_with_workers_takes_the_ring_and_gives_pytorchs_batches(tensor):
    kw = dict(batch_size=8, shuffle=True, num_workers=2)
    ours, loader = batches_of(DataLoader, ArrayDataset(tensor=tensor), **kw)
    assert loader.path == "process-ring" and loader.stats()["path"] == "process-ring"
    theirs, _ = batches_of(tud.DataLoader, ArrayDataset(tensor=tensor), **kw)
    assert_same(ours, theirs)
    assert [len(b[0]) for b in ours[0]] == [8] * 6 + [2]


def test_the_global_generator_is_left_as_pytorch_leaves_it():
    def after(make):
        torch.manual_seed(5)
        loader = make(ArrayDataset(), batch_size=8, shuffle=True, num_workers=2)
        list(loader)
        list(loader)
        return torch.rand(3)

    assert torch.equal(after(DataLoader), after(tud.DataLoader))


def test_random_draws_in_workers_are_pytorchs_seeds_and_turns():
    kw = dict(batch_size=4, shuffle=True, num_workers=2)
    ours, loader = batches_of(DataLoader, RandomDataset(), **kw)
    assert loader.path == "process-ring"
    assert_same(ours, batches_of(tud.DataLoader, RandomDataset(), **kw)[0])


def test_numbers_dicts_and_namedtuples_are_collated_as_pytorch_does():
    kw = dict(batch_size=5, num_workers=2)
    ours, loader = batches_of(DataLoader, MixedDataset(), **kw)
    assert loader.path == "process-ring"
    assert_same(ours, batches_of(tud.DataLoader, MixedDataset(), **kw)[0])


def test_a_batch_sampler_of_varying_sizes_loads_on_the_ring():
    sampler = [[0, 1, 2], [5], [7, 3, 4, 6], [9, 8]]
    ours, loader = batches_of(DataLoader, ArrayDataset(10), batch_sampler=sampler, num_workers=2)
    assert loader.path == "process-ring"
    theirs, _ = batches_of(tud.DataLoader, ArrayDataset(10), batch_sampler=sampler, num_workers=2)
    assert_same(ours, theirs)


def test_kept_batches_are_owned_copies_not_overwritten_by_later_ones():
    loader = DataLoader(ArrayDataset(200), batch_size=4, num_workers=2)
    kept = list(loader)  # 50 batches through a ring of a few slots
    assert loader.path == "process-ring"
    for k, (x, y) in enumerate(kept):
        assert y.tolist() == list(range(4 * k, 4 * k + 4))
        assert torch.equal(x[0], torch.arange(12.0).reshape(3, 4) + 4 * k)
        x += 1  # writable, and nobody else's


def test_a_pil_decode_and_crop_dataset_takes_the_ring(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for k in range(6):
        path = tmp_path / f"{k}.png"
        Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))

    class PILDataset(tud.Dataset):
        def __len__(self):
            return len(paths)

        def __getitem__(self, i):
            with Image.open(paths[i]) as f:
                img = f.convert("RGB")
            top, left = (int(v) for v in torch.randint(0, 8, (2,)))
            img = img.crop((left, top, left + 16, top + 12))
            return torch.from_numpy(np.array(img)).permute(2, 0, 1), i

    kw = dict(batch_size=4, shuffle=True, num_workers=2)
    ours, loader = batches_of(DataLoader, PILDataset(), **kw)
    assert loader.path == "process-ring"
    assert_same(ours, batches_of(tud.DataLoader, PILDataset(), **kw)[0])


# -- the worker contract ------------------------------------------------------------------


def test_worker_init_fn_and_get_worker_info_in_ring_workers():
    kw = dict(batch_size=2, num_workers=2, worker_init_fn=mark_worker)
    ours, loader = batches_of(DataLoader, InfoDataset(), epochs=1, **kw)
    assert loader.path == "process-ring"
    for k, (ids, counts, seeds, initial, marks, _) in enumerate(ours[0]):
        assert ids.tolist() == [k % 2] * 2 and counts.tolist() == [2, 2]
        assert torch.equal(seeds, initial) and marks.tolist() == [100 + k % 2] * 2
    assert_same(ours, batches_of(tud.DataLoader, InfoDataset(), epochs=1, **kw)[0])
    assert tud.get_worker_info() is None


def test_the_dataset_runs_only_in_worker_processes():
    dataset = TouchedDataset()
    loader = DataLoader(dataset, batch_size=2, num_workers=2)
    assert loader.path == "process-ring"
    assert torch.cat(list(loader)).tolist() == list(range(6))
    assert dataset.pids == []  # observation 0 was read by a forked probe


def test_an_error_in_getitem_is_raised_with_its_type_and_ends_the_epoch():
    loader = DataLoader(FailingDataset(), batch_size=4, num_workers=2)
    assert loader.path == "process-ring"
    it = iter(loader)
    assert [b[1].tolist() for b in (next(it), next(it))] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(Broken, match=r"(?s)observation 9.*Original.*item 9 is broken"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    assert next(iter(loader))[1].tolist() == [0, 1, 2, 3]  # the next epoch starts afresh


def _keyless_init(worker_id):
    raise KeyError(f"no key in worker {worker_id}")


@pytest.mark.parametrize(
    "path, kw",
    [("process-ring", {}), ("process", {"collate_fn": tud.default_collate})],
    ids=["process-ring", "process"],
)
def test_an_error_in_worker_init_fn_is_raised_with_its_type_as_pytorch_words_it(path, kw):
    loader = DataLoader(
        ArrayDataset(), batch_size=4, num_workers=2, worker_init_fn=_keyless_init, **kw
    )
    assert loader.path == path
    with pytest.raises(KeyError) as info:
        next(iter(loader))
    assert str(info.value).startswith(
        "Caught KeyError in DataLoader worker process 0.\n"
        "Original Traceback (most recent call last):\n"
    )
    assert "in _keyless_init" in str(info.value)
    assert str(info.value).endswith("KeyError: 'no key in worker 0'\n")


@pytest.mark.parametrize("persistent", [False, True])
def test_timeout_raises_as_pytorch_does(persistent):
    loader = DataLoader(
        SlowInWorkersDataset(),
        batch_size=2,
        num_workers=2,
        timeout=1,
        persistent_workers=persistent,
    )
    assert loader.path == "process-ring"
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after 1 seconds"):
        next(iter(loader))
    loader.close()


def test_a_timeout_that_is_not_reached_changes_nothing():
    loader = DataLoader(ArrayDataset(), batch_size=8, num_workers=2, timeout=30)
    assert [b[1].tolist() for b in loader] == [
        list(range(k, min(k + 8, 50))) for k in range(0, 50, 8)
    ]


def test_persistent_workers_run_worker_init_fn_once_and_keep_their_processes():
    dataset = CallsDataset()
    loader = DataLoader(
        dataset, batch_size=2, num_workers=2, persistent_workers=True, worker_init_fn=count_call
    )
    assert loader.path == "process-ring"
    pids = [{int(p) for b in loader for p in b[0]} for _ in range(3)]
    assert pids[0] == pids[1] == pids[2] and len(pids[0]) == 2
    assert dataset.calls.value == 2
    procs = loader._ring_engine.worker_processes
    loader.close()
    assert_exited(procs)


def test_workers_that_are_not_persistent_start_again_each_epoch():
    dataset = CallsDataset()
    loader = DataLoader(dataset, batch_size=2, num_workers=2, worker_init_fn=count_call)
    first = {int(p) for b in loader for p in b[0]}
    second = {int(p) for b in loader for p in b[0]}
    assert not first & second and dataset.calls.value == 4


def test_workers_of_an_epoch_left_before_its_end_exit():
    it = iter(DataLoader(ArrayDataset(), batch_size=2, num_workers=2))
    next(it)
    workers = it._workers
    assert len(workers) == 2
    del it
    assert_exited(workers)


# -- which path, and what falls back ------------------------------------------------------


class Strings(tud.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return str(i), i


class FailsFirst(tud.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        raise ValueError("no items here")


class Counting(tud.IterableDataset):
    def __iter__(self):
        return iter(range(4))


@pytest.mark.parametrize(
    "make",
    [
        lambda: DataLoader(ArrayDataset(), batch_size=2, num_workers=2, collate_fn=list),
        lambda: DataLoader(ArrayDataset(), num_workers=2, batch_size=None),
        lambda: DataLoader(Counting(), batch_size=2, num_workers=2),
        lambda: DataLoader(Strings(), batch_size=2, num_workers=2),
        lambda: DataLoader(FailsFirst(), batch_size=2, num_workers=2),
        lambda: DataLoader(BatchedDataset(), batch_size=2, num_workers=2),
        lambda: DataLoader(
            ArrayDataset(), batch_size=2, num_workers=2, multiprocessing_context="spawn"
        ),
        lambda: DataLoader(
            ArrayDataset(), batch_size=2, num_workers=2, collate_fn=tud.default_collate
        ),
    ],
    ids=[
        "collate_fn",
        "no-batching",
        "iterable",
        "strings",
        "observation-0-fails",
        "getitems",
        "spawn",
        "explicit-default-collate",
    ],
)
def test_what_the_ring_cannot_load_takes_the_queue_path(make):
    assert make().path == "process"


def test_a_subset_of_a_python_dataset_takes_the_ring():
    subset = tud.Subset(ArrayDataset(), [7, 3, 9, 1])
    loader = DataLoader(subset, batch_size=2, num_workers=2)
    assert loader.path == "process-ring"
    assert [b[1].tolist() for b in loader] == [[7, 3], [9, 1]]


class ComputesInTheProbe(tud.Dataset):
    """Observation 0 takes ``cpu_s`` seconds of CPU where there is no worker (the probe)."""

    def __init__(self, cpu_s):
        self.cpu_s = cpu_s

    def __len__(self):
        return 4

    def __getitem__(self, i):
        if tud.get_worker_info() is None:
            end = time.process_time() + self.cpu_s
            while time.process_time() < end:
                pass
        return i


class BlockedInTheProbe(tud.Dataset):
    """Observation 0 waits where there is no worker (the probe), on what nobody releases."""

    def __init__(self):
        self.never = multiprocessing.get_context("fork").Semaphore(0)

    def __len__(self):
        return 4

    def __getitem__(self, i):
        if tud.get_worker_info() is None:
            self.never.acquire()
        return i


@pytest.mark.slow
def test_the_probe_is_given_up_when_it_waits_not_when_it_computes(monkeypatch):
    # The limit counts the probe's time off the CPU: a first item that computes longer
    # than it (however loaded the machine) keeps the ring; a blocked one is given up.
    monkeypatch.setattr("fastload._loading.torch_ring._PROBE_IDLE_S", 1.0)
    computes = DataLoader(ComputesInTheProbe(2.5), batch_size=2, num_workers=2)
    assert computes.path == "process-ring"
    assert [b.tolist() for b in computes] == [[0, 1], [2, 3]]
    blocked = DataLoader(BlockedInTheProbe(), batch_size=2, num_workers=2)
    assert blocked.path == "process"


class OtherKeys(tud.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"a": i, "b": 1.0} if i < 5 else {"a": i, "c": 1.0}


def test_an_observation_of_another_structure_raises_naming_it():
    loader = DataLoader(OtherKeys(), batch_size=4, num_workers=2)
    assert loader.path == "process-ring"
    with pytest.raises(fastload.LoadError, match=r"observation 5.*members \['a', 'b'\]"):
        list(loader)


def test_shapes_that_differ_between_batches_raise_saying_what_to_do():
    loader = DataLoader(GrowingDataset(), batch_size=4, num_workers=2)
    assert loader.path == "process-ring"
    with pytest.raises(fastload.LoadError, match="collate_fn=torch.utils.data.default_collate"):
        list(loader)
    kw = dict(batch_size=4, num_workers=2, collate_fn=tud.default_collate)
    ours, loader = batches_of(DataLoader, GrowingDataset(), epochs=1, **kw)
    assert loader.path == "process"
    assert_same(ours, batches_of(tud.DataLoader, GrowingDataset(), epochs=1, **kw)[0])


class PagesDataset(tud.Dataset):
    """Items of two pages each, so that a batch's slot holds whole pages."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return np.full(8192, i % 250 + 1, np.uint8), i


def _lent(loader, tensor):
    """True when ``tensor`` lies in a slot of the loader's ring (lent, not copied)."""
    ring = np.frombuffer(loader._ring_engine._workers.shared.mapping, np.uint8)
    return np.shares_memory(tensor.numpy(), ring)


def test_the_rings_batches_are_its_slots_lent_until_the_caller_drops_them():
    loader = DataLoader(PagesDataset(), batch_size=4, num_workers=2, persistent_workers=True)
    assert loader.path == "process-ring"
    expected = [list(range(k, k + 4)) for k in range(0, 24, 4)]
    try:
        got = []
        for x, y in loader:  # a training loop holds one batch: each is lent, none copied
            assert _lent(loader, x) and _lent(loader, y)
            assert bool((x == y.reshape(-1, 1) % 250 + 1).all())
            got.append(y.tolist())
        assert got == expected
        del x, y
        held = next(iter(loader))  # kept through a whole epoch: its slot is not reused
        assert [y.tolist() for _, y in loader] == expected
        assert held[1].tolist() == expected[0]
        assert bool((held[0] == held[1].reshape(-1, 1) % 250 + 1).all())
        # A loop that keeps every batch: the first are lent, the rest copied, none wrong.
        kept = list(loader)
        assert [_lent(loader, x) for x, _ in kept] == [True] + [False] * 5  # one is held
        assert [y.tolist() for _, y in kept] == expected
        assert all(bool((x == y.reshape(-1, 1) % 250 + 1).all()) for x, y in kept)
    finally:
        loader.close()


def test_a_batch_kept_from_an_epoch_without_persistent_workers_stays_as_it_was():
    loader = DataLoader(PagesDataset(), batch_size=4, num_workers=2)
    held = next(iter(loader))  # its epoch's workers and ring are closed at the next epoch
    assert [y.tolist() for _, y in loader] == [list(range(k, k + 4)) for k in range(0, 24, 4)]
    assert held[1].tolist() == [0, 1, 2, 3]
    assert bool((held[0] == held[1].reshape(-1, 1) % 250 + 1).all())
