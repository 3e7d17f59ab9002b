"""``fastload.torch.DataLoader`` against the cases of PyTorch's own DataLoader tests
(``test/test_dataloader.py``: TestDataLoader and its persistent-workers variant, the
dict, namedtuple and string loaders, the individual worker queues, random_split,
ConcatDataset, StackDataset, TensorDataset; CPU cases), translated to pytest, plus the
out-of-order delivery, the seeds, and which path a dataset takes.

The datasets are module-level classes so that the 'spawn' context can pickle them.
"""

import collections
import ctypes
import functools
import math
import operator
import os
import pickle
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter

import numpy as np
import pytest
from helpers import assert_workers_die_with_their_consumer

torch = pytest.importorskip("torch")

import torch.utils.data as tud  # noqa: E402
from torch.utils.data import (  # noqa: E402
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
    random_split,
)
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

import fastload  # noqa: E402
from fastload.torch import DataLoader  # noqa: E402

# More workers than this machine's CPUs are asked for on purpose in some cases.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

JOIN_S = 30.0
CPUS = len(os.sched_getaffinity(0))


# -- datasets ---------------------------------------------------------------------------


class CountingDataset(Dataset):
    def __init__(self, n):
        self.n = n

    def __getitem__(self, i):
        return i

    def __len__(self):
        return self.n


class CountingIterableDataset(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


class ErrorDataset(Dataset):
    """Has no __getitem__: every item raises NotImplementedError."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size


class SegfaultDataset(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, idx):
        return ctypes.string_at(0)


class SleepDataset(Dataset):
    def __init__(self, size, sleep_s):
        self.size = size
        self.sleep_s = sleep_s
        self.slept = False

    def __getitem__(self, idx):
        if not self.slept:
            time.sleep(self.sleep_s)
            self.slept = True
        return idx

    def __len__(self):
        return self.size


class SeedDataset(Dataset):
    def __init__(self, size):
        self.size = size

    def __getitem__(self, idx):
        return torch.initial_seed()

    def __len__(self):
        return self.size


class WorkerSpecificIterableDataset(IterableDataset):
    def __init__(self, sizes):
        self.sizes = sizes

    def __iter__(self):
        info = tud.get_worker_info()
        assert info is not None
        return iter(range(self.sizes[info.id]))

    def __len__(self):
        return sum(self.sizes)


class SynchronizedSeedDataset(Dataset):
    """Every worker blocks on its first item until all have reached it, so that each
    worker loads at least one item."""

    def __init__(self, size, num_workers):
        context = torch.multiprocessing.get_context("fork")
        self.count = context.Value("i", 0, lock=True)
        self.barrier = context.Semaphore(0)
        self.num_workers = num_workers
        self.size = size

    def sync_once(self):
        with self.count.get_lock():
            self.count.value += 1
            if self.count.value == self.num_workers:
                self.barrier.release()
        self.barrier.acquire()
        self.barrier.release()

    def __getitem__(self, idx):
        self.sync_once()
        return torch.initial_seed()

    def __len__(self):
        return self.size


class WorkerInfoDataset(SynchronizedSeedDataset):
    def __getitem__(self, idx):
        self.sync_once()
        return torch.tensor(self.value)


def worker_info_init_fn(worker_id):
    info = tud.get_worker_info()
    assert worker_id == info.id
    assert worker_id < info.num_workers
    assert info.seed == torch.initial_seed()
    dataset = info.dataset
    assert isinstance(dataset, WorkerInfoDataset)
    assert not hasattr(dataset, "value")
    with pytest.raises((RuntimeError, AttributeError)):  # read-only (torch's own WorkerInfo)
        info.id = 3999
    for k in ["id", "num_workers", "seed", "dataset"]:
        assert f"{k}=" in repr(info)
    dataset.value = [worker_id, os.getpid()]


class EmptyTensorDataset(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.empty(0)


class BulkLoadingDataset(Dataset):
    def __init__(self, n):
        self.n = n

    def __getitem__(self, indices):
        assert isinstance(indices, (list, tuple))
        return torch.as_tensor(indices)

    def __len__(self):
        return self.n


class BulkLoadingSampler(tud.Sampler):
    def __init__(self, dataset, batch_size):
        self.dataset = dataset
        self.batch_size = batch_size

    def __iter__(self):
        for x in torch.randperm(len(self.dataset)).split(self.batch_size):
            yield x.tolist()

    def __len__(self):
        return math.ceil(len(self.dataset) / self.batch_size)


class MultiEpochDataset(IterableDataset):
    def __init__(self, length):
        self.length = length

    def __iter__(self):
        info = tud.get_worker_info()
        assert info is not None
        for _ in range(self.length // info.num_workers):
            yield info.id

    def __len__(self):
        return self.length


class ErrorIterableDataset(IterableDataset):
    def __iter__(self):
        raise RuntimeError("Error in __iter__")


class StringDataset(Dataset):
    def __init__(self):
        self.s = "12345"

    def __len__(self):
        return len(self.s)

    def __getitem__(self, i):
        return (self.s[i], i)


class DictDataset(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"a_tensor": torch.empty(4, 2).fill_(i), "another_dict": {"a_number": i}}


class DummyDataset(Dataset):
    def __init__(self):
        self.data = list(range(10))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        # Persistent workers keep the dataset as it was when they started.
        assert self.start == 0
        return self.data[i]


Batch = collections.namedtuple("Batch", ["data", "label", "random_tensor"])
Data = collections.namedtuple("Data", ["positive", "negative"])


class NamedTupleDataset(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return Batch(Data(positive=i, negative=-i), label=str(i), random_tensor=torch.randn(3))


class WorkerQueueDataset(Dataset):
    def __init__(self, data):
        self.data = data
        self.worker_id = None

    def worker_init_fn(self, worker_id):
        self.worker_id = worker_id

    def __getitem__(self, i):
        return self.worker_id, self.data[i]

    def __len__(self):
        return len(self.data)


class SlowFirstDataset(Dataset):
    """Item 0 takes a while: a loader in completion order delivers other batches first."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 0:
            time.sleep(1.0)
        return i


class SetAffinityDataset(IterableDataset):
    def __iter__(self):
        torch.randperm(1)
        return iter(os.sched_getaffinity(0))


class ConvDataset(Dataset):
    def __init__(self):
        self.x = torch.ones(1, 1, 2400)
        self[0]  # a convolution in the parent process before the fork

    def __len__(self):
        return 1

    def __getitem__(self, i):
        return torch.nn.functional.conv1d(self.x, torch.ones(1, 1, 2))


def init_fn(worker_id):
    torch.manual_seed(12345)


def error_worker_init_fn(_):
    raise RuntimeError("Error in worker_init_fn")


# -- helpers ----------------------------------------------------------------------------


@pytest.fixture
def tensors():
    data = torch.randn(100, 2, 3, 5)
    labels = torch.randperm(50).repeat(2)
    return data, labels, TensorDataset(data, labels)


@pytest.fixture(params=[False, True], ids=["transient", "persistent"])
def persistent(request):
    return request.param


def loader_of(dataset, persistent=False, **kw):
    """As PyTorch's tests build theirs: persistent workers only where there are workers."""
    kw["persistent_workers"] = persistent and kw.get("num_workers", 0) > 0
    return DataLoader(dataset, **kw)


def check_sequential(loader, data, labels):
    batch_size = loader.batch_size
    n = 0
    if batch_size is None:
        for idx, (sample, target) in enumerate(loader):
            assert torch.equal(sample, data[idx]) and torch.equal(target, labels[idx])
            n += 1
        assert n == len(data)
        return
    for i, (sample, target) in enumerate(loader):
        idx = i * batch_size
        assert torch.equal(sample, data[idx : idx + batch_size])
        assert torch.equal(target, labels[idx : idx + batch_size])
        n += 1
    assert n == math.ceil(len(data) / batch_size)


def check_shuffle(loader, data, labels):
    """Every observation once, with its own label."""
    seen = []
    for samples, targets in loader:
        if loader.batch_size is None:
            samples, targets = samples[None], targets[None]
        for sample, target in zip(samples, targets):
            matches = [k for k in range(len(data)) if torch.equal(data[k], sample)]
            assert len(matches) == 1
            assert target == labels[matches[0]]
            seen.append(matches[0])
    assert sorted(seen) == list(range(len(data)))


def check_errors(loader):
    it = iter(loader)
    errors = 0
    while True:
        try:
            next(it)
        except NotImplementedError:
            errors += 1
        except StopIteration:
            assert errors == math.ceil(len(loader.dataset) / loader.batch_size)
            return


def assert_exited(workers):
    for w in workers:
        w.join(JOIN_S)
        assert not w.is_alive()
        assert w.exitcode == 0


# -- random_split, Subset ---------------------------------------------------------------


def test_random_split_lengths_must_equal_dataset_size():
    with pytest.raises(ValueError):
        random_split([1, 2, 3, 4], [1, 2])


def test_random_split_sizes_counts_and_fractions():
    splits = random_split([1, 2, 3, 4, 5, 6], [2, 4])
    assert [len(s) for s in splits] == [2, 4]
    assert [len(s) for s in random_split([1, 2, 3, 4, 5, 6], [0.5, 0.5])] == [3, 3]
    g = torch.Generator().manual_seed(1)
    assert len(random_split(range(3), [0.5, 0.5], generator=g)) == 2
    g = torch.Generator().manual_seed(1)
    splits = random_split(range(106), [0.1, 0.2, 0.3, 0.4], generator=g)
    assert [len(s) for s in splits] == [11, 22, 31, 42]


@pytest.mark.parametrize("lengths", [[2, 4], [0.33, 0.67]])
def test_random_split_parts_are_mutually_exclusive_through_the_loader(lengths):
    data = [5, 2, 3, 4, 1, 6]
    values = []
    for split in random_split(data, lengths):
        values.extend(int(v) for batch in DataLoader(split, batch_size=2) for v in batch)
    assert sorted(values) == sorted(data)


def test_random_split_indexes_with_ints():
    class CustomDataset:
        def __init__(self, values):
            self.data = values

        def __getitem__(self, key):
            assert type(key) is int
            return self.data[key]

        def __len__(self):
            return len(self.data)

    for lengths in ([5], [1.0]):
        split = random_split(CustomDataset([1, 2, 3, 4, 5]), lengths)[0]
        assert sorted(int(b) for b in DataLoader(split)) == [1, 2, 3, 4, 5]


def test_random_split_reproducibility():
    g = torch.Generator().manual_seed(1)
    assert [list(x) for x in random_split(range(10), [3, 7], generator=g)] == [
        [5, 6, 1],
        [2, 0, 8, 9, 3, 7, 4],
    ]


def test_random_split_incomplete_fractions_raise():
    with pytest.raises(ValueError):
        random_split([1, 2, 3, 4], [0.1])
    with pytest.raises(ValueError):
        random_split([1, 2, 3, 4], [1.1])


def test_random_split_draws_from_the_global_generator_unless_given_one():
    state = torch.get_rng_state()
    a = torch.rand(10)
    torch.set_rng_state(state)
    random_split(range(10), [5, 5])
    assert not torch.equal(a, torch.rand(10))
    state = torch.get_rng_state()
    a = torch.rand(10)
    torch.set_rng_state(state)
    random_split(range(10), [5, 5], generator=torch.Generator().manual_seed(42))
    assert torch.equal(a, torch.rand(10))


def test_subset_of_subset_through_the_loader():
    dataset = TensorDataset(torch.tensor([1, 2, 3, 4, 5]))
    sub = Subset(Subset(dataset, [4, 3, 2, 1, 0]), [0, 2, 4])
    assert [b[0].tolist() for b in DataLoader(sub, batch_size=2)] == [[5, 3], [1]]


# -- TensorDataset, StackDataset, ConcatDataset -----------------------------------------


def test_tensor_dataset_len_and_items():
    t, labels = torch.randn(15, 10, 2, 3), torch.randperm(15)
    source = TensorDataset(t, labels)
    assert len(source) == 15
    for i in range(15):
        assert torch.equal(source[i][0], t[i]) and source[i][1] == labels[i]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_tensor_dataset_loads_natively_as_lists_of_tensors(num_workers):
    t0, t1, t2 = torch.randn(5, 10), torch.randn(5), torch.arange(5)
    loader = DataLoader(TensorDataset(t0, t1, t2), batch_size=2, num_workers=num_workers)
    assert loader.path == "native"
    batches = list(loader)
    assert [len(b[0]) for b in batches] == [2, 2, 1]
    assert all(isinstance(b, list) and len(b) == 3 for b in batches)
    assert torch.equal(torch.cat([b[0] for b in batches]), t0)
    assert torch.equal(torch.cat([b[2] for b in batches]), t2)


def test_tensor_dataset_single_tensor():
    t = torch.randn(5, 10)
    batches = list(DataLoader(TensorDataset(t), batch_size=5))
    assert len(batches) == 1 and torch.equal(batches[0][0], t)


def test_stack_dataset_checks():
    with pytest.raises(ValueError, match="At least one dataset should be passed"):
        StackDataset()
    with pytest.raises(ValueError, match="Supported either"):
        StackDataset(TensorDataset(torch.randn(15, 10)), a=TensorDataset(torch.randn(10, 15)))
    with pytest.raises(ValueError, match="Size mismatch between datasets"):
        StackDataset(TensorDataset(torch.randn(15, 10)), TensorDataset(torch.randn(10, 15)))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stack_dataset_tuple_and_dict_through_the_loader(num_workers):
    t, labels = torch.randn(6, 3), torch.randn(6, 5, 4)
    ta, tb = TensorDataset(t), TensorDataset(labels)
    pair = list(DataLoader(StackDataset(ta, tb), batch_size=4, num_workers=num_workers))
    assert torch.equal(pair[0][0][0], t[:4]) and torch.equal(pair[1][1][0], labels[4:])
    named = list(DataLoader(StackDataset(a=ta, b=tb), batch_size=4, num_workers=num_workers))
    assert torch.equal(named[0]["a"][0], t[:4]) and torch.equal(named[1]["b"][0], labels[4:])


def test_stack_dataset_getitems_is_used_and_checked():
    class GetItemsDataset(Dataset):
        def __init__(self):
            self.data = torch.randn(4)

        def __getitem__(self, i):
            return self.data[i]

        def __getitems__(self, items):
            return self.data[items][:-1]  # one short

        def __len__(self):
            return 4

    loader = DataLoader(StackDataset(GetItemsDataset(), [1, 2, 3, 4]), batch_size=4)
    with pytest.raises(ValueError, match="output size mismatch. Expected 4, got 3"):
        next(iter(loader))


def test_concat_datasets_with_an_empty_one():
    result = ConcatDataset([[0, 1, 2, 3, 4], [], [5, 6, 7, 8, 9]])
    assert len(result) == 10 and result[5] == 5
    with pytest.raises(IndexError):
        result[11]
    assert torch.cat(list(DataLoader(result, batch_size=4))).tolist() == list(range(10))


def test_concat_of_tensor_datasets_through_the_loader():
    parts = [TensorDataset(torch.rand(7, 3, 8, 8), torch.rand(7)) for _ in range(3)]
    result = parts[0] + parts[1] + parts[2]
    assert len(result) == 21
    batches = list(DataLoader(result, batch_size=8, num_workers=2))
    assert [len(b[0]) for b in batches] == [8, 8, 5]
    assert torch.equal(batches[0][0][7], parts[1][0][0])


def test_concat_refuses_iterable_datasets():
    d1 = TensorDataset(torch.rand(7, 3), torch.rand(7))
    with pytest.raises(AssertionError, match="does not support IterableDataset"):
        ConcatDataset([d1, CountingIterableDataset(5)])


# -- TestDataLoader ---------------------------------------------------------------------


def test_error_in_iter_raises_with_its_type(persistent):
    for num_workers in [0, 2]:
        loader = loader_of(ErrorIterableDataset(), persistent, num_workers=num_workers)
        with pytest.raises(RuntimeError, match="Error in __iter__"):
            list(iter(loader))


def test_error_in_worker_init_fn_raises_with_its_type(tensors, persistent):
    loader = loader_of(
        CountingDataset(10), persistent, num_workers=2, worker_init_fn=error_worker_init_fn
    )
    with pytest.raises(RuntimeError, match="Error in worker_init_fn"):
        list(iter(loader))


def test_typing_subscripts_as_pytorchs():
    class SomeDataset(Dataset[list[torch.Tensor]]):
        pass

    def make(is_train: bool) -> DataLoader[list[torch.Tensor]]:
        return DataLoader(SomeDataset())

    assert make.__annotations__["return"] == DataLoader[list[torch.Tensor]]


def test_invalid_assign_after_init(tensors):
    dl = DataLoader(tensors[2])
    for attr in ("batch_size", "sampler", "batch_sampler", "drop_last", "dataset"):
        with pytest.raises(ValueError, match="should not be set after"):
            setattr(dl, attr, {})


def test_sequential_nonbatch(tensors):
    data, labels, dataset = tensors
    check_sequential(DataLoader(dataset, batch_size=None), data, labels)


@pytest.mark.parametrize("batch_size", [1, 2, 3])
def test_sequential_batch(tensors, batch_size):
    data, labels, dataset = tensors
    check_sequential(DataLoader(dataset, batch_size=batch_size), data, labels)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_bulk_loading_nobatch(num_workers):
    ds = BulkLoadingDataset(35)
    sampler = BulkLoadingSampler(ds, batch_size=4)
    dl = DataLoader(ds, num_workers=num_workers, batch_size=None, sampler=sampler)
    assert not dl._auto_collation
    samples = list(dl)
    assert set(torch.cat(samples, 0).tolist()) == set(range(35))


def test_growing_dataset():
    dataset = [torch.ones(4) for _ in range(4)]
    seq, shuffled = DataLoader(dataset, shuffle=False), DataLoader(dataset, shuffle=True)
    dataset.append(torch.ones(4))
    assert len(seq) == 5 and len(shuffled) == 5


@pytest.mark.parametrize("context", [None, "fork", "spawn"])
def test_multiple_dataloaders(context):
    dataset = CountingDataset(20)
    it1 = iter(DataLoader(dataset, num_workers=1))
    it2 = iter(DataLoader(dataset, num_workers=2, multiprocessing_context=context))
    assert [int(next(it1)), int(next(it1)), int(next(it2)), int(next(it2))] == [0, 1, 0, 1]
    assert [int(next(it1)), int(next(it2))] == [2, 2]
    workers = it1._workers + it2._workers
    del it1, it2
    assert_exited(workers)


def test_segfault_in_a_worker_raises_naming_the_signal():
    loader = DataLoader(SegfaultDataset(), batch_size=2, num_workers=2)
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid \d+\) is killed by signal: "):
        next(iter(loader))


class KilledDataset(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i == 6:
            os.kill(os.getpid(), signal.SIGKILL)
        return i


def test_a_worker_killed_mid_epoch_raises_naming_it():
    loader = DataLoader(KilledDataset(), batch_size=2, num_workers=2)
    with pytest.raises(
        RuntimeError, match=r"DataLoader worker \(pid \d+\) is killed by signal: SIGKILL"
    ):
        list(loader)


def test_a_batch_that_cannot_be_pickled_raises_instead_of_hanging():
    loader = DataLoader(CountingDataset(4), batch_size=2, num_workers=1, collate_fn=_lambda_batch)
    with pytest.raises((AttributeError, TypeError, pickle.PicklingError), match="pickle"):
        next(iter(loader))


def _lambda_batch(items):
    return lambda: items


class KillOnceDataset(Dataset):
    """Item 6 kills its worker the first time it is loaded (the file marks that it was)."""

    def __init__(self, mark):
        self.mark = mark

    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i == 6 and not os.path.exists(self.mark):
            open(self.mark, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return i


def test_persistent_workers_start_again_after_one_died(tmp_path):
    loader = DataLoader(
        KillOnceDataset(str(tmp_path / "killed")),
        batch_size=2,
        num_workers=2,
        persistent_workers=True,
    )
    it = iter(loader)
    with pytest.raises(RuntimeError, match="killed by signal"):
        list(it)
    with pytest.raises(StopIteration):  # the epoch ended with the error
        next(it)
    assert torch.cat(list(loader)).tolist() == list(range(12))
    loader.close()


def test_no_segfault_after_set_num_threads():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        loader = DataLoader([1, 2, 3], num_workers=1, multiprocessing_context="fork")
        assert int(next(iter(loader))) == 1
    finally:
        torch.set_num_threads(threads)


def test_timeout(persistent):
    loader = loader_of(SleepDataset(10, 3), persistent, batch_size=2, num_workers=2, timeout=1)
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after \d+ seconds"):
        next(iter(loader))
    loader.close()


def test_large_sampler_indices_and_an_error_in_the_loop(persistent):
    loader = loader_of(EmptyTensorDataset(1_000_000), persistent, batch_size=40960, num_workers=1)
    it = iter(loader)
    with pytest.raises(RuntimeError, match="My Error"):
        for x in it:
            assert x.numel() == 0
            raise RuntimeError("My Error")
    workers = it._workers
    del it
    loader.close()
    assert_exited(workers)


def test_invalid_ctor_args_combinations(tensors):
    dataset = tensors[2]
    with pytest.raises(ValueError, match="num_workers option should be non-negative"):
        DataLoader(dataset, num_workers=-1)
    with pytest.raises(ValueError, match="timeout option should be non-negative"):
        DataLoader(dataset, timeout=-1)
    with pytest.raises(ValueError, match="batch_size=None option disables auto-batching"):
        DataLoader(dataset, batch_size=None, drop_last=True)
    valid = torch.multiprocessing.get_all_start_methods()[-1]
    with pytest.raises(ValueError, match=r"multi-process loading \(num_workers > 0\), but got"):
        DataLoader(dataset, num_workers=0, multiprocessing_context=valid)
    with pytest.raises(ValueError, match="should specify a valid start method in"):
        DataLoader(dataset, num_workers=1, multiprocessing_context="bad")
    with pytest.raises(TypeError, match="multiprocessing_context option should be a valid context"):
        DataLoader(dataset, num_workers=1, multiprocessing_context=object())
    with pytest.raises(ValueError, match="prefetch_factor option could only be specified"):
        DataLoader(dataset, prefetch_factor=2)
    with pytest.raises(ValueError, match="persistent_workers option needs num_workers > 0"):
        DataLoader(dataset, persistent_workers=True)


def test_invalid_sampler_combinations(tensors):
    dataset = tensors[2]
    sampler = tud.SequentialSampler(dataset)
    batch_sampler = tud.BatchSampler(sampler, 3, False)
    for kw in (
        dict(batch_size=11, sampler=sampler, shuffle=True),
        dict(batch_sampler=batch_sampler, sampler=sampler, shuffle=True),
        dict(batch_sampler=batch_sampler, sampler=sampler, shuffle=3),
    ):
        with pytest.raises(ValueError, match="sampler option is mutually exclusive with shuffle"):
            DataLoader(dataset, **kw)
    for kw in (
        dict(batch_size=11),
        dict(shuffle=True),
        dict(drop_last=True),
        dict(drop_last=3),
    ):
        with pytest.raises(ValueError, match="batch_sampler option is mutually exclusive with"):
            DataLoader(dataset, batch_sampler=batch_sampler, **kw)


def test_invalid_iterable_dataset_combinations():
    dataset = CountingIterableDataset(20)
    for kw, what in (
        (dict(shuffle=True), "shuffle"),
        (dict(shuffle=3), "shuffle"),
        (dict(sampler=tud.SequentialSampler(dataset)), "sampler"),
        (dict(sampler=3), "sampler"),
        (dict(batch_sampler=3), "batch_sampler"),
    ):
        with pytest.raises(ValueError, match=f"expected unspecified {what} option"):
            DataLoader(dataset, **kw)


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("kind", [list, tuple])
def test_builtin_collection_conversion(kind, num_workers):
    pairs = [torch.tensor([i, i + 1]) for i in range(0, 20, 2)]
    for dataset in (CountingDataset(20), CountingIterableDataset(20)):
        fetched = kind(DataLoader(dataset, batch_size=None, num_workers=num_workers))
        assert fetched == kind(range(20))
        fetched = kind(DataLoader(dataset, batch_size=2, num_workers=num_workers))
        assert all(torch.equal(a, b) for a, b in zip(fetched, pairs)) and len(fetched) == 10


def test_iterable_dataset_single_process_without_batching():
    dataset = CountingIterableDataset(20)
    loader = DataLoader(dataset, batch_size=None)
    fetched = list(loader)
    assert fetched == list(range(20)) and all(type(d) is int for d in fetched)
    assert len(loader) == len(dataset)


@pytest.mark.parametrize("prefetch_factor", [2, 3, 4])
def test_iterable_dataset_in_workers_without_batching(prefetch_factor):
    sizes = [0, 4, 20]
    expected = sorted(functools.reduce(operator.iadd, (list(range(s)) for s in sizes), []))
    dataset = WorkerSpecificIterableDataset(sizes)
    loader = DataLoader(dataset, num_workers=3, batch_size=None, prefetch_factor=prefetch_factor)
    it = iter(loader)
    fetched = sorted(it)
    assert fetched == expected and all(type(a) is int for a in fetched)
    assert len(loader) == len(dataset)
    workers = it._workers
    del it, loader
    assert_exited(workers)


def test_iterable_dataset_warns_when_it_yields_more_than_its_length():
    loader = DataLoader(CountingIterableDataset(20), num_workers=3)
    it = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(40):  # len() not asked yet: no warning
            next(it)
    assert len(loader) == 20
    it = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(20):
            next(it)
    for _ in range(3):
        with pytest.warns(UserWarning, match=r"but [0-9]+ samples have been fetched\. For multi"):
            next(it)


def test_iterable_dataset_single_process_with_batching():
    fetched = list(DataLoader(CountingIterableDataset(20), batch_size=7))
    assert [f.tolist() for f in fetched] == [
        list(range(7)),
        list(range(7, 14)),
        list(range(14, 20)),
    ]
    fetched = list(DataLoader(CountingIterableDataset(20), batch_size=7, drop_last=True))
    assert [f.tolist() for f in fetched] == [list(range(7)), list(range(7, 14))]


@pytest.mark.parametrize("prefetch_factor", [2, 3, 4])
def test_iterable_dataset_in_workers_with_batching(prefetch_factor):
    dataset = WorkerSpecificIterableDataset([0, 4, 20])
    loader = DataLoader(dataset, num_workers=3, batch_size=7, prefetch_factor=prefetch_factor)
    it = iter(loader)
    fetched = {tuple(t.tolist()) for t in it}
    assert fetched == {tuple(range(4)), tuple(range(7)), tuple(range(7, 14)), tuple(range(14, 20))}
    workers = it._workers
    del it, loader
    assert_exited(workers)


def test_iterable_dataset_in_workers_with_drop_last():
    dataset = WorkerSpecificIterableDataset([0, 4, 20])
    loader = DataLoader(dataset, num_workers=3, batch_size=7, drop_last=True)
    fetched = {tuple(t.tolist()) for t in loader}
    assert fetched == {tuple(range(7)), tuple(range(7, 14))}


@pytest.mark.parametrize("num_workers", [0, 1])
def test_chain_iterable_style_dataset(num_workers):
    d1, d2 = CountingIterableDataset(20), CountingIterableDataset(15)
    expected = list(range(20)) + list(range(15))
    for chained in (d1 + d2, ChainDataset([d1, d2])):
        fetched = list(DataLoader(chained, num_workers=num_workers))
        assert all(isinstance(d, torch.Tensor) for d in fetched)
        assert [int(d) for d in fetched] == expected


@pytest.mark.parametrize("context", [None, "fork", "spawn"])
def test_multiprocessing_contexts(context):
    reference = [torch.arange(3), torch.arange(3, 6), torch.arange(6, 9), torch.arange(9, 11)]
    contexts = (
        [context] if context is None else [context, torch.multiprocessing.get_context(context)]
    )
    for ctx in contexts:
        loader = DataLoader(
            CountingDataset(11), num_workers=3, batch_size=3, multiprocessing_context=ctx
        )
        assert [b.tolist() for b in loader] == [r.tolist() for r in reference]


def test_worker_seed():
    dataset = SynchronizedSeedDataset(4, 4)
    seeds = {int(batch[0]) for batch in DataLoader(dataset, batch_size=1, num_workers=4)}
    assert len(seeds) == 4


def test_worker_seed_reproducibility():
    def seeds():
        dataset = SynchronizedSeedDataset(4, 4)
        g = torch.Generator().manual_seed(42)
        return {int(b) for b in DataLoader(dataset, batch_size=1, num_workers=4, generator=g)}

    assert seeds() == seeds()


def test_multi_epochs_reproducibility(persistent):
    loader = loader_of(MultiEpochDataset(20), persistent, batch_size=10, num_workers=2)
    for _ in range(3):
        batches = [b.tolist() for b in loader]
        assert batches == [[i % 2] * 10 for i in range(len(batches))] and len(batches) == 2
    loader.close()


def test_worker_init_fn(persistent):
    loader = loader_of(
        SeedDataset(4), persistent, batch_size=2, num_workers=2, worker_init_fn=init_fn
    )
    for batch in loader:
        assert batch.tolist() == [12345, 12345]
    loader.close()


def test_get_worker_info():
    assert tud.get_worker_info() is None
    dataset = WorkerInfoDataset(6, 2)
    loader = DataLoader(dataset, batch_size=2, num_workers=2, worker_init_fn=worker_info_init_fn)
    it = iter(loader)
    data = torch.cat(list(it), 0)
    pids = [w.pid for w in it._workers]
    for worker_id, pid in data.tolist():
        assert pid == pids[worker_id]
    assert tud.get_worker_info() is None
    assert not hasattr(dataset, "value")


@pytest.mark.parametrize("batch_size", [None, 1, 2])
def test_shuffle(tensors, batch_size):
    data, labels, dataset = tensors
    check_shuffle(DataLoader(dataset, batch_size=batch_size, shuffle=True), data, labels)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffle_reproducibility_with_a_generator(tensors, num_workers):
    def batches():
        g = torch.Generator().manual_seed(42)
        return list(DataLoader(tensors[2], shuffle=True, num_workers=num_workers, generator=g))

    a, b = batches(), batches()
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))


@pytest.mark.parametrize(
    "kw", [dict(), dict(batch_size=2), dict(batch_size=2, prefetch_factor=3)], ids=str
)
def test_sequential_workers(tensors, persistent, kw):
    data, labels, dataset = tensors
    check_sequential(loader_of(dataset, persistent, num_workers=2, **kw), data, labels)


@pytest.mark.parametrize(
    "kw", [dict(), dict(batch_size=2), dict(batch_size=2, prefetch_factor=3)], ids=str
)
def test_shuffle_workers(tensors, persistent, kw):
    data, labels, dataset = tensors
    check_shuffle(loader_of(dataset, persistent, shuffle=True, num_workers=2, **kw), data, labels)


def test_random_sampler(tensors):
    dataset = tensors[2]

    def stat(sampler):
        counts = Counter(sampler)
        repeated = sum(v > 1 for v in counts.values())
        return repeated, min(counts), max(counts), sum(counts.values())

    n = len(dataset)
    repeated, low, high, total = stat(
        tud.RandomSampler(dataset, replacement=True, num_samples=n + 1)
    )
    assert repeated > 0 and low >= 0 and high < n and total == n + 1
    assert stat(tud.RandomSampler(dataset)) == (0, 0, n - 1, n)
    assert stat(tud.RandomSampler(dataset, num_samples=2 * n)) == (n, 0, n - 1, 2 * n)
    assert stat(tud.RandomSampler(dataset, num_samples=n + 1)) == (1, 0, n - 1, n + 1)
    with pytest.raises(TypeError, match="replacement should be a boolean value"):
        tud.RandomSampler(dataset, replacement=0)


@pytest.mark.parametrize("replacement", [True, False])
def test_random_sampler_len(tensors, replacement):
    dataset = tensors[2]
    n = len(dataset) + 5
    sampler = tud.RandomSampler(dataset, replacement=replacement, num_samples=n)
    assert len(sampler) == n == sum(1 for _ in sampler)
    assert len(DataLoader(dataset, batch_size=1, sampler=sampler)) == n
    loader = DataLoader(dataset, batch_size=6, sampler=sampler)
    assert len(loader) == math.ceil(n / 6) == len(list(loader))


def test_distributed_sampler_invalid_rank():
    dataset = torch.IntTensor(range(10))
    with pytest.raises(ValueError, match="Invalid rank"):
        DistributedSampler(dataset, 3, 3)
    with pytest.raises(ValueError, match="Invalid rank"):
        DistributedSampler(dataset, 3, -1)


def test_duplicating_data_with_drop_last():
    data = torch.IntTensor(range(9))
    scanned = []
    for rank in range(4):
        sampler = DistributedSampler(data, 4, rank)
        loader = DataLoader(data, batch_size=2, drop_last=True, sampler=sampler)
        assert loader.path == "native"
        scanned.extend(int(v) for batch in loader for v in batch)
    assert len(scanned) == len(set(scanned))


def test_distributed_sampler_set_epoch_changes_the_order():
    data = torch.arange(20)
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=3)
    loader = DataLoader(data, batch_size=5, sampler=sampler)
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        epochs.append(torch.cat(list(loader)).tolist())
        assert epochs[-1] == [int(i) for i in sampler]
    assert epochs[0] != epochs[1]


def test_samplers_through_the_loader_are_reproducible(tensors):
    dataset = tensors[2]
    weights = [0.1, 0.9, 0.4, 0.7, 3.0, 0.6]
    for make in (
        lambda: tud.RandomSampler(dataset, num_samples=5, replacement=True),
        lambda: tud.RandomSampler(dataset, replacement=False),
        lambda: tud.WeightedRandomSampler(weights, num_samples=5, replacement=True),
        lambda: tud.WeightedRandomSampler(weights, num_samples=5, replacement=False),
        lambda: tud.SubsetRandomSampler(range(10)),
    ):
        runs = []
        for _ in range(2):
            torch.manual_seed(0)
            runs.append([b[1].tolist() for b in DataLoader(dataset, batch_size=2, sampler=make())])
        assert runs[0] == runs[1]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_sampler_as_a_plain_iterable(tensors, num_workers):
    data, _, dataset = tensors
    loader = DataLoader(dataset, sampler=range(2, 12), batch_size=2, num_workers=num_workers)
    assert len(loader) == 5
    for i, (inputs, _target) in enumerate(loader):
        assert torch.equal(inputs, data[i * 2 + 2 : i * 2 + 4])


@pytest.mark.parametrize(
    "kw",
    [dict(), dict(num_workers=2), dict(num_workers=2, multiprocessing_context="spawn")],
    ids=str,
)
def test_batch_sampler_as_a_plain_list(tensors, kw):
    data, _, dataset = tensors
    batches = []
    for i in range(0, 20, 5):
        batches.append(tuple(range(i, i + 2)))
        batches.append(tuple(range(i + 2, i + 5)))
    # The spawn context needs a dataset it can pickle and re-import: a plain TensorDataset.
    loader = DataLoader(dataset, batch_sampler=batches, **kw)
    assert len(loader) == 8
    for i, (inputs, _target) in enumerate(loader):
        offset = i * 5 // 2
        size = 2 if i % 2 == 0 else 3
        assert torch.equal(inputs, data[offset : offset + size])


def test_numpy_items_become_a_double_tensor():
    class NumpyDataset(Dataset):
        def __getitem__(self, i):
            return np.ones((2, 3, 4)) * i

        def __len__(self):
            return 1000

    batch = next(iter(DataLoader(NumpyDataset(), batch_size=12)))
    assert isinstance(batch, torch.DoubleTensor) and batch.size() == torch.Size([12, 2, 3, 4])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_error_per_batch_and_the_epoch_goes_on(num_workers):
    check_errors(DataLoader(ErrorDataset(41), batch_size=2, shuffle=True, num_workers=num_workers))


def test_partial_workers_exit_when_the_iterator_is_dropped(tensors, persistent):
    loader = loader_of(tensors[2], persistent, batch_size=2, num_workers=2)
    it = iter(loader)
    workers = it._workers
    for i, _ in enumerate(it):
        if i == 10:
            break
    del it
    loader.close()
    for w in workers:
        w.join(JOIN_S)
        assert not w.is_alive()


def test_len(tensors):
    for kw, expected in ((dict(batch_size=2), 50), (dict(batch_size=3), 34)):
        loader = DataLoader(tensors[2], **kw)
        assert len(loader) == expected == sum(1 for _ in loader)


def test_iterable_dataset_len():
    class TenDataset(IterableDataset):
        def __len__(self):
            return 10

        def __iter__(self):
            return iter(range(10))

    for batch_size, drop_last, expected in (
        (1, False, 10),
        (1, True, 10),
        (2, False, 5),
        (2, True, 5),
        (3, False, 4),
        (3, True, 3),
    ):
        assert len(DataLoader(TenDataset(), batch_size=batch_size, drop_last=drop_last)) == expected


@pytest.mark.parametrize(
    "dtype, tensor_type",
    [
        (np.float64, torch.DoubleTensor),
        (np.float32, torch.FloatTensor),
        (np.float16, torch.HalfTensor),
        (np.int64, torch.LongTensor),
        (np.int32, torch.IntTensor),
        (np.int16, torch.ShortTensor),
        (np.int8, torch.CharTensor),
        (np.uint8, torch.ByteTensor),
    ],
)
def test_numpy_scalars(dtype, tensor_type):
    class ScalarDataset(Dataset):
        def __getitem__(self, i):
            return dtype()

        def __len__(self):
            return 4

    assert isinstance(next(iter(DataLoader(ScalarDataset(), batch_size=2))), tensor_type)


@pytest.mark.parametrize(
    "items, dtype",
    [([1, 2, -1], torch.int64), ([1.1, 2.3, -0.9], torch.float64), ([True, False], torch.bool)],
)
def test_python_numbers_collate_to_their_dtype(items, dtype):
    batch = next(iter(DataLoader(items, batch_size=len(items))))
    assert batch.dtype == dtype and batch.tolist() == items


def test_strings_collate_to_a_list():
    assert next(iter(DataLoader(["a", "b", "c"], batch_size=3))) == ["a", "b", "c"]


def test_batches_of_python_items_are_default_collates():
    for dataset in (StringDataset(), NamedTupleDataset(), DictDataset()):
        torch.manual_seed(0)
        ours = list(DataLoader(dataset, batch_size=2))
        torch.manual_seed(0)
        theirs = list(tud.DataLoader(dataset, batch_size=2))
        assert repr(ours) == repr(theirs) or isinstance(dataset, NamedTupleDataset)
        assert [type(b) for b in ours] == [type(b) for b in theirs]


def test_numpy_arrays_load_natively_as_tensors():
    x = np.arange(24, dtype=np.float32).reshape(12, 2)
    loader = DataLoader(x, batch_size=5, num_workers=2)
    assert loader.path == "native"
    batches = list(loader)
    assert all(isinstance(b, torch.Tensor) for b in batches)
    np.testing.assert_array_equal(torch.cat(batches).numpy(), x)


def test_a_custom_collate_fn_is_applied(tensors):
    loader = DataLoader(tensors[2], batch_size=4, collate_fn=lambda items: len(items))
    assert loader.path == "inline"
    assert list(loader)[:2] == [4, 4]


def test_excessive_worker_creation_warning(tensors):
    with pytest.warns(UserWarning, match="excessive worker creation might get DataLoader"):
        DataLoader(tensors[2], batch_size=2, num_workers=CPUS + 1)


# -- persistent workers -----------------------------------------------------------------


def test_persistent_workers_keep_the_dataset_they_started_with():
    dataset = DummyDataset()
    loader = DataLoader(dataset, num_workers=2, persistent_workers=True)
    dataset.start = 0
    pids = None
    for i in range(4):
        it = iter(loader)
        assert [int(x) for x in it] == list(range(10))
        pids = pids or [w.pid for w in it._workers]
        assert [w.pid for w in it._workers] == pids
        dataset.start = i + 1  # the workers' copy keeps start == 0
    loader.close()


def test_persistent_workers_early_exit_then_a_new_epoch():
    loader = DataLoader(CountingDataset(64), batch_size=16, num_workers=2, persistent_workers=True)
    for _ in loader:
        break
    assert torch.cat(list(loader)).tolist() == list(range(64))
    loader.close()


# -- strings, dicts, namedtuples --------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_string_dataset_shuffled(num_workers):
    loader = DataLoader(StringDataset(), batch_size=2, shuffle=True, num_workers=num_workers)
    seen = []
    for s, n in loader:
        assert isinstance(s[0], str) and len(s) == len(n)
        assert [int(c) - 1 for c in s] == n.tolist()
        seen += n.tolist()
    assert sorted(seen) == list(range(5))


@pytest.mark.parametrize("persistent_workers", [False, True])
def test_dict_dataset_sequential_batch(persistent_workers):
    loader = DataLoader(
        DictDataset(),
        batch_size=2,
        shuffle=False,
        persistent_workers=persistent_workers,
        num_workers=1 if persistent_workers else 0,
    )
    for i, sample in enumerate(loader):
        idx = i * 2
        assert set(sample) == {"a_tensor", "another_dict"}
        assert set(sample["another_dict"]) == {"a_number"}
        t = sample["a_tensor"]
        assert t.size() == torch.Size([2, 4, 2])
        assert (t[0] == idx).all() and (t[1] == idx + 1).all()
        assert sample["another_dict"]["a_number"].tolist() == [idx, idx + 1]
    loader.close()


def test_pin_memory_without_cuda_warns_and_yields_the_batches(monkeypatch):
    import fastload._loading.torch_loader as module

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU machine
    monkeypatch.setattr(module, "_warned_no_cuda", False)
    with pytest.warns(UserWarning, match="pin_memory=True does nothing"):
        batches = list(DataLoader(DictDataset(), batch_size=2, pin_memory=True))
    assert len(batches) == 2 and not batches[0]["a_tensor"].is_pinned()


def test_namedtuple_batches_keep_their_type():
    for batch in DataLoader(NamedTupleDataset(), batch_size=2):
        assert isinstance(batch, Batch) and isinstance(batch.data, Data)
        assert isinstance(batch.data.positive, torch.Tensor)
        assert list(batch.label) in (["0", "1"], ["2", "3"])
    for batch in DataLoader(NamedTupleDataset(), batch_size=None):
        assert isinstance(batch, Batch) and isinstance(batch.data, Data)
        assert not isinstance(batch.data.positive, torch.Tensor)


# -- individual worker queues, order of delivery ----------------------------------------


@pytest.mark.parametrize("batch_size", [8, 16, 32, 64])
@pytest.mark.parametrize("num_workers", [1, 2])
def test_each_worker_gets_batches_in_turn(batch_size, num_workers):
    dataset = WorkerQueueDataset(list(range(128)))
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=num_workers,
        timeout=30,
        worker_init_fn=dataset.worker_init_fn,
    )
    for i, (worker_ids, sample) in enumerate(loader):
        assert worker_ids.tolist() == [i % num_workers] * batch_size
        assert sample.tolist() == list(range(i * batch_size, (i + 1) * batch_size))


def test_out_of_order_delivers_a_fast_batch_before_a_slow_one():
    loader = DataLoader(SlowFirstDataset(), batch_size=2, num_workers=2, in_order=False)
    batches = [b.tolist() for b in loader]
    assert batches[0] != [0, 1]
    assert sorted(batches) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_in_order_waits_for_the_slow_batch():
    loader = DataLoader(SlowFirstDataset(), batch_size=2, num_workers=2, in_order=True)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_out_of_order_on_the_native_path_gives_the_same_batches(num_workers):
    x = torch.arange(40)
    loader = DataLoader(x, batch_size=4, num_workers=num_workers, in_order=False)
    assert sorted(torch.cat(list(loader)).tolist()) == list(range(40))


# -- randomness as PyTorch draws it -----------------------------------------------------


@pytest.mark.parametrize(
    "dataset, num_workers",
    [
        (TensorDataset(torch.arange(30)), 0),
        (TensorDataset(torch.arange(30)), 2),
        (CountingDataset(30), 0),
        (CountingDataset(30), 2),
    ],
    ids=["native-0", "native-2", "inline", "process"],
)
def test_global_seed_gives_pytorchs_order(dataset, num_workers):
    def orders(make):
        torch.manual_seed(7)
        loader = make(dataset, batch_size=4, shuffle=True, num_workers=num_workers)
        out = [torch.cat([b[0] if isinstance(b, list) else b for b in loader]).tolist()]
        out.append(torch.cat([b[0] if isinstance(b, list) else b for b in loader]).tolist())
        return out, torch.rand(3).tolist()  # the global generator is left as PyTorch leaves it

    assert orders(DataLoader) == orders(tud.DataLoader)


def test_generator_gives_pytorchs_order():
    dataset = TensorDataset(torch.arange(50))
    ours = list(
        DataLoader(dataset, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(5))
    )
    theirs = list(
        tud.DataLoader(
            dataset, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(5)
        )
    )
    assert [b[0].tolist() for b in ours] == [b[0].tolist() for b in theirs]


class NumpyDrawDataset(Dataset):
    """Draws from numpy's global random state, as augmentations written for PyTorch do."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return np.random.rand(), np.random.randint(1 << 30), i


# The worker paths of the drop-in, and what takes a dataset there.
WORKER_PATHS = {
    "process-ring": {},
    "process": {"collate_fn": tud.default_collate},
    "process-spawn": {"multiprocessing_context": "spawn"},
    "process-forkserver": {"multiprocessing_context": "forkserver"},
}


@pytest.mark.parametrize("path", WORKER_PATHS)
def test_numpy_in_workers_draws_what_it_draws_in_pytorchs_workers(path):
    def batches(make):
        torch.manual_seed(11)
        kw = dict(batch_size=4, shuffle=True, num_workers=2, **WORKER_PATHS[path])
        loader = make(NumpyDrawDataset(), **kw)
        return loader, [[t.tolist() for t in b] for _ in range(2) for b in loader]

    loader, ours = batches(DataLoader)
    assert loader.path == path.removesuffix("-spawn").removesuffix("-forkserver")
    assert ours == batches(tud.DataLoader)[1]


# -- which path, and its statistics -----------------------------------------------------


def test_path_of_each_kind_of_dataset():
    x = np.zeros((8, 3), np.float32)
    assert DataLoader(x, batch_size=2).path == "native"
    assert DataLoader(fastload.mapobs(lambda v: v, x), batch_size=2).path == "inline"
    assert DataLoader(CountingDataset(8), batch_size=2, num_workers=2).path == "process-ring"
    assert DataLoader(StringDataset(), batch_size=2, num_workers=2).path == "process"
    assert DataLoader(CountingDataset(8), batch_size=2).path == "inline"
    assert DataLoader(CountingIterableDataset(8), batch_size=2).path == "inline"
    loader = DataLoader(x, batch_size=2, worker_init_fn=init_fn, num_workers=1)
    assert loader.path == "process-ring"  # a worker_init_fn needs worker processes


@pytest.mark.parametrize("num_workers", [0, 2])
def test_subsets_of_tensor_datasets_load_natively_as_pytorch_loads_them(num_workers):
    dataset = TensorDataset(torch.arange(40).reshape(20, 2), torch.arange(20))
    train, _ = random_split(dataset, [0.75, 0.25], generator=torch.Generator().manual_seed(2))
    sub = Subset(train, [3, 1, 4, 1, 5])

    def batches(make, data):
        torch.manual_seed(9)
        loader = make(data, batch_size=4, shuffle=True, num_workers=num_workers)
        return loader, [[t.tolist() for t in b] for b in loader]

    for data in (train, sub):
        loader, ours = batches(DataLoader, data)
        assert loader.path == "native"
        assert ours == batches(tud.DataLoader, data)[1]


def test_a_plain_tuple_is_a_sequence_of_observations_as_in_pytorch():
    data = (np.zeros((5, 3)), np.ones((5, 3)))  # two observations, not five
    loader = DataLoader(data, batch_size=2)
    assert loader.path == "inline" and len(loader) == 1
    assert torch.equal(next(iter(loader)), next(iter(tud.DataLoader(data, batch_size=2))))


def test_obsview_of_a_tuple_is_one_native_container():
    x, y = np.arange(20, dtype=np.float32).reshape(10, 2), np.arange(10)
    loader = DataLoader(fastload.obsview((x, y)), batch_size=4)
    assert loader.path == "native"
    batches = list(loader)
    assert isinstance(batches[0], list) and torch.equal(batches[0][1], torch.arange(4))
    np.testing.assert_array_equal(torch.cat([b[0] for b in batches]).numpy(), x)


def test_images_through_fastload_transforms_load_natively(tmp_path):
    import simplejpeg

    from fastload.transforms import CenterCrop, Compose, DecodeImage

    rng = np.random.default_rng(0)
    paths = []
    for k in range(6):
        path = tmp_path / f"{k}.jpg"
        path.write_bytes(simplejpeg.encode_jpeg(rng.integers(0, 255, (40, 48, 3), np.uint8)))
        paths.append(str(path))
    images = fastload.mapobs(Compose([DecodeImage(), CenterCrop(32)]), fastload.files(paths))
    data = fastload.obsview((images, np.arange(6)))
    loader = DataLoader(data, batch_size=4, num_workers=2)
    assert loader.path == "native"
    ours = list(loader)
    reference = list(fastload.DataLoader(data, 4))
    assert [b[0].shape for b in ours] == [(4, 32, 32, 3), (2, 32, 32, 3)]
    for (x, y), (rx, ry) in zip(ours, reference):
        np.testing.assert_array_equal(x.numpy(), rx)
        np.testing.assert_array_equal(y.numpy(), ry)


def test_a_sampler_without_length_is_iterated_lazily():
    def endless():
        while True:
            yield from range(4)

    class Endless(tud.Sampler):
        def __iter__(self):
            return endless()

    loader = DataLoader(torch.arange(4), batch_size=3, sampler=Endless())
    assert loader.path == "inline"
    it = iter(loader)
    assert [next(it).tolist() for _ in range(3)] == [[0, 1, 2], [3, 0, 1], [2, 3, 0]]


def test_an_empty_batch_from_a_batch_sampler_is_refused():
    loader = DataLoader(torch.arange(6), batch_sampler=[[0, 1], [], [2]])
    assert loader.path == "native"
    with pytest.raises(ValueError, match=r"empty batch \(batch 1\)"):
        list(loader)


def test_stats_count_batches_and_name_the_path():
    loader = DataLoader(CountingDataset(10), batch_size=4, num_workers=2)
    list(loader)
    stats = loader.stats()
    assert stats["batches"] == 3 and stats["items"] == 10 and stats["path"] == "process-ring"


# -- workers: on time, named when killed, quiet, gone with their consumer ----------------


class BlockedInWorkersDataset(Dataset):
    """Observation 0 loads at once where there is no worker (the ring's probe); in a worker,
    every observation takes a minute."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if tud.get_worker_info() is not None:
            time.sleep(60)
        return i


@pytest.mark.parametrize("path", ["process-ring", "process"])
def test_a_timeout_raises_on_time_and_stops_the_workers(path):
    loader = DataLoader(
        BlockedInWorkersDataset(), batch_size=2, num_workers=2, timeout=3, **WORKER_PATHS[path]
    )
    assert loader.path == path
    it = iter(loader)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="DataLoader timed out after 3 seconds"):
        next(it)
    # Within a second of the timeout; the bound is loose, for a loaded machine.
    assert time.monotonic() - start < 3 + 3
    for worker in it._workers:
        worker.join(JOIN_S)
        assert not worker.is_alive()


def _received_from_a_dead_worker():
    raise EOFError  # what fetching a tensor's memory from a worker that died may raise


class _SharedLikeATensor:
    """Unpickles as a tensor in shared memory does: by asking the worker that sent it."""

    def __reduce__(self):
        return _received_from_a_dead_worker, ()


class DiesAfterItsFirstBatchDataset(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        if i == 1:
            time.sleep(0.5)  # the reply of item 0 reaches the consumer's queue
            os.kill(os.getpid(), signal.SIGKILL)
        return _SharedLikeATensor()


def test_a_batch_sent_by_a_worker_killed_since_raises_naming_it():
    loader = DataLoader(DiesAfterItsFirstBatchDataset(), num_workers=1, collate_fn=list)
    assert loader.path == "process"
    it = iter(loader)
    it._workers[0].join(JOIN_S)  # killed, after it sent its first batch
    with pytest.raises(
        RuntimeError, match=r"DataLoader worker \(pid \d+\) is killed by signal: SIGKILL"
    ):
        next(it)


_FOREIGN_NOISE = """
import gc, sys, numpy as np, torch.utils.data as tud
from fastload import DataLoader as FastloadLoader, mapobs
from fastload.torch import DataLoader

class Collecting(tud.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        gc.collect()  # what any allocation in a worker may do
        return np.full(3, i, np.float32)

def collected(v):
    gc.collect()
    return v

def pytorchs_garbage():
    # A PyTorch iterator with workers, dropped but not collected yet: its __del__ stops its
    # workers, which only its own process may do. (PyTorch's own workers would collect
    # it if they collected.)
    it = iter(tud.DataLoader(range(8), batch_size=2, num_workers=1))
    next(it)
    it.cycle = it

gc.disable()
for kw in ({}, {"collate_fn": tud.default_collate}):
    pytorchs_garbage()
    loader = DataLoader(Collecting(), batch_size=2, num_workers=2, **kw)
    assert len(list(loader)) == 4, loader.path
pytorchs_garbage()
loader = FastloadLoader(mapobs(collected, np.arange(8.0)), 2, parallel=2, backend="process")
assert len(list(loader)) == 4
gc.enable()
gc.collect()
"""


def test_forked_probes_and_workers_run_none_of_the_callers_finalizers():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run(
        [sys.executable, "-c", _FOREIGN_NOISE],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": root},
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


_STUCK_WORKERS = """
import os, sys, time, torch.utils.data as tud
from fastload.torch import DataLoader

class Stuck(tud.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if tud.get_worker_info() is not None:
            os.write(1, b"%d\\n" % os.getpid())
            time.sleep(3600)
        return i

kw = {"collate_fn": tud.default_collate} if sys.argv[-1] == "process" else {}
loader = DataLoader(Stuck(), batch_size=2, num_workers=2, **kw)
assert loader.path == sys.argv[-1]
next(iter(loader))
"""


@pytest.mark.parametrize("path", ["process-ring", "process"])
def test_workers_stuck_in_getitem_die_with_a_killed_consumer(path):
    code = _STUCK_WORKERS.replace("sys.argv[-1]", repr(path))
    assert_workers_die_with_their_consumer(code, 2)


# -- other cases of PyTorch's file ------------------------------------------------------


def test_set_affinity_in_worker_init():
    expected = sorted(os.sched_getaffinity(0))[-1]

    def set_affinity(_):
        os.sched_setaffinity(0, [expected])

    for sample in DataLoader(SetAffinityDataset(), num_workers=2, worker_init_fn=set_affinity):
        assert sample.tolist() == [expected]


def test_conv_after_fork():
    for x in DataLoader(ConvDataset(), num_workers=1):
        assert x.shape == (1, 1, 1, 2399)
