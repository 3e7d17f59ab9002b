"""``fastload.torch.DataLoader`` under the frameworks that shard a PyTorch loader by
building it anew: real Lightning DDP (``Trainer(devices=2, strategy="ddp")``) and real
accelerate (``Accelerator().prepare`` in 2 processes of ``torch.distributed.run``), on CPU
with gloo over 127.0.0.1. Each job trains the same seeded model with PyTorch's loader and
with the drop-in (tests/jobs/); every rank must load exactly PyTorch's items in PyTorch's
steps, with the same losses, on the drop-in's own path. Also the parts that make it work,
without a framework: the drop-in is a PyTorch ``DataLoader``, built anew from its
attributes it takes the same path, and the sampler is drawn when PyTorch draws it."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.utils.data as tud  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

from fastload.torch import DataLoader  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = os.path.join(ROOT, "tests", "jobs")
N, WORLD, EPOCHS = 36, 2, 2  # as in the jobs
JOB_S = 600  # a generous bound for a loaded machine: the jobs take seconds


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(command, out):
    env = {**os.environ, "PYTHONPATH": ROOT, "MASTER_ADDR": "127.0.0.1"}
    env["MASTER_PORT"] = str(_free_port())
    env.pop("LOCAL_RANK", None)
    done = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, timeout=JOB_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def _records(out, case):
    """``{kind: [rank 0's record, rank 1's]}`` for PyTorch's loader and the drop-in."""
    return {
        kind: [
            json.loads((out / f"{case}-{kind}-rank{rank}.json").read_text())
            for rank in range(WORLD)
        ]
        for kind in ("torch", "fastload")
    }


@pytest.fixture(scope="module")
def lightning_runs(tmp_path_factory):
    pytest.importorskip("lightning")
    out = tmp_path_factory.mktemp("lightning")
    script = os.path.join(JOBS, "lightning_job.py")
    _run([sys.executable, script, str(out), "tensors,pictures,own-sampler,resume"], out)
    return out


@pytest.fixture(scope="module")
def accelerate_runs(tmp_path_factory):
    pytest.importorskip("accelerate")
    out = tmp_path_factory.mktemp("accelerate")
    launch = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={WORLD}"]
    launch += ["--master_addr=127.0.0.1", f"--master_port={_free_port()}"]
    script = os.path.join(JOBS, "accelerate_job.py")
    _run([*launch, script, str(out), "tensors,pictures"], out)
    return out


def _assert_sharded_as_pytorch(records, path, cover):
    """Each rank loads PyTorch's steps and losses, on the drop-in's ``path``, and as many
    steps as the other rank. In each epoch the ranks' items cover the dataset once
    (``cover="once"``), are disjoint (``"disjoint"``: the last ones dropped), or cover it
    with a few repeated to even the ranks out (``"padded"``, as accelerate pads)."""
    ours, theirs = records["fastload"], records["torch"]
    for rank in range(WORLD):
        assert ours[rank]["steps"] == theirs[rank]["steps"], rank
        np.testing.assert_allclose(ours[rank]["losses"], theirs[rank]["losses"], rtol=1e-6)
        loader = ours[rank].get("inner", ours[rank]["type"])  # accelerate's wraps the loader
        assert loader == "fastload._loading.torch_loader.DataLoader"
        assert ours[rank]["path"] == ours[rank]["given_path"] == path
    for epoch in range(len(ours[0]["steps"])):
        items = [i for rank in ours for step in rank["steps"][epoch] for i in step]
        if cover == "once":
            assert sorted(items) == list(range(N)), epoch
        elif cover == "disjoint":
            assert len(set(items)) == len(items) and set(items) <= set(range(N)), epoch
        else:
            assert set(items) == set(range(N)) and len(items) - N < 4 * WORLD, epoch
        assert len({len(rank["steps"][epoch]) for rank in ours}) == 1, epoch


@pytest.mark.slow
def test_lightning_ddp_shards_the_native_path_as_pytorchs_loader(lightning_runs):
    records = _records(lightning_runs, "tensors")
    _assert_sharded_as_pytorch(records, "native", cover="disjoint")  # drop_last=True
    ours = records["fastload"]
    assert all(rank["sampler"] == "DistributedSampler" for rank in ours)
    assert [len(s) for s in ours[0]["steps"]] == [N // WORLD // 4] * EPOCHS
    # The validation loader is sharded too, and keeps its path.
    for rank in range(WORLD):
        assert ours[rank]["val"] == records["torch"][rank]["val"]
        assert ours[rank]["val_path"] == "native"
    val = [i for rank in ours for step in rank["val"][0] for i in step]
    assert sorted(val) == list(range(N // 2))


@pytest.mark.slow
def test_lightning_ddp_shards_the_ring_path_as_pytorchs_loader(lightning_runs):
    _assert_sharded_as_pytorch(_records(lightning_runs, "pictures"), "process-ring", cover="once")


@pytest.mark.slow
def test_lightning_without_its_sampler_keeps_the_users_distributed_sampler(lightning_runs):
    records = _records(lightning_runs, "own-sampler")
    _assert_sharded_as_pytorch(records, "native", cover="once")
    assert records["fastload"][0]["steps"][0] != records["fastload"][0]["steps"][1]


@pytest.mark.slow
def test_lightning_resumed_mid_epoch_loads_what_pytorchs_loader_loads(lightning_runs):
    records = _records(lightning_runs, "resume")
    for rank in range(WORLD):
        assert records["fastload"][rank]["steps"] == records["torch"][rank]["steps"]
        assert records["fastload"][rank]["path"] == "native"


@pytest.mark.slow
@pytest.mark.parametrize(("case", "path"), [("tensors", "native"), ("pictures", "process-ring")])
def test_accelerate_prepares_a_sharded_drop_in_as_pytorchs_loader(accelerate_runs, case, path):
    records = _records(accelerate_runs, case)
    _assert_sharded_as_pytorch(records, path, cover="padded")
    for rank in records["fastload"]:
        assert rank["type"] == "accelerate.data_loader.DataLoaderShard"
        assert rank["inner"] == "fastload._loading.torch_loader.DataLoader"


# -- what the frameworks rely on -------------------------------------------------------


def _tensors(n=10):
    return tud.TensorDataset(torch.arange(2.0 * n).reshape(n, 2), torch.arange(n))


def test_the_drop_in_is_a_pytorch_dataloader():
    loader = DataLoader(_tensors(), batch_size=4)
    assert isinstance(loader, tud.DataLoader)
    assert loader.collate_fn is tud.default_collate
    assert loader.multiprocessing_context is None


def test_only_given_arguments_are_attributes_so_a_loader_built_from_them_keeps_its_path():
    """What Lightning does without a hook: the class called with the attributes whose
    values differ from the ``__init__`` defaults, and a distributed sampler."""
    loader = DataLoader(_tensors(), batch_size=4, shuffle=True, drop_last=True)
    attrs = {k: v for k, v in vars(loader).items() if not k.startswith("_")}
    assert "collate_fn" not in attrs and "prefetch_factor" not in attrs
    attrs.update(sampler=DistributedSampler(loader.dataset, 2, 0), batch_sampler=None)
    rebuilt = DataLoader(**attrs)
    assert loader.path == rebuilt.path == "native"
    theirs = tud.DataLoader(**attrs)
    assert [b[1].tolist() for b in rebuilt] == [b[1].tolist() for b in theirs]

    given = DataLoader(_tensors(), batch_size=4, collate_fn=tud.default_collate, num_workers=1)
    assert vars(given)["collate_fn"] is tud.default_collate
    assert given.path == "process"  # PyTorch's collate, as asked: the queue path
    assert DataLoader(_tensors(), num_workers=2, prefetch_factor=3).prefetch_factor == 3
    assert DataLoader(_tensors(), num_workers=2).prefetch_factor == 2


def _shift_labels(worker_id):
    """Observable from the batches: the worker's copy of the dataset gets labels + 100."""
    data = tud.get_worker_info().dataset
    data.tensors = (data.tensors[0], data.tensors[1] + 100)


def test_a_worker_init_fn_set_after_init_is_run():
    """Lightning sets ``worker_init_fn`` on a made loader (``seed_everything(workers=True)``):
    the path is decided anew, and the function runs in the workers."""
    loader = DataLoader(_tensors(), batch_size=4, num_workers=1)
    assert loader.path == "native"
    loader.worker_init_fn = _shift_labels
    assert loader.path != "native"
    assert [b[1].tolist() for b in loader] == [
        [100, 101, 102, 103],
        [104, 105, 106, 107],
        [108, 109],
    ]
    loader.worker_init_fn = None
    assert loader.path == "native"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_sampler_is_drawn_when_pytorch_draws_it(num_workers):
    """PyTorch's single-process iterator draws the sampler on the first ``next()``, its
    worker iterator in ``iter()``: a ``set_epoch`` in between counts only in the first
    case (Lightning calls it there when it resumes). The drop-in does the same."""
    data = _tensors(12)
    firsts = []
    for cls in (tud.DataLoader, DataLoader):
        sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=3)
        loader = cls(data, batch_size=3, sampler=sampler, num_workers=num_workers)
        batches = iter(loader)
        sampler.set_epoch(1)
        firsts.append(next(batches)[1].tolist())
        del batches
    assert firsts[0] == firsts[1]
