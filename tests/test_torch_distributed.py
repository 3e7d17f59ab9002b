"""Two real training processes joined by ``torch.distributed`` (gloo, on 127.0.0.1): a
``DistributedSampler`` through ``fastload.torch.DataLoader``, and ``fastload.DataLoader``
with ``shard="auto"``, give every item once per epoch and the same steps on every rank."""

import json
import os
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N, BATCH, EPOCHS, WORLD = 40, 4, 2, 2

RANK_SCRIPT = """
import json, sys
import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset
from torch.utils.data.distributed import DistributedSampler
import fastload
from fastload.torch import DataLoader

port, rank, world, n, batch, epochs, out = sys.argv[1:]
rank, world, n, batch, epochs = map(int, (rank, world, n, batch, epochs))
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=world)
data = TensorDataset(torch.arange(n))
sampler = DistributedSampler(data, shuffle=True, seed=5)
dropin = DataLoader(data, batch_size=batch, sampler=sampler, num_workers=2)
native = fastload.DataLoader(np.arange(n), batch_size=batch, shuffle=True, shard="auto")
seen = {"dropin": [], "native": [], "dropin_steps": [], "native_steps": []}
for epoch in range(epochs):
    sampler.set_epoch(epoch)
    batches = [b[0].tolist() for b in dropin]
    seen["dropin"].append([i for b in batches for i in b])
    seen["dropin_steps"].append(len(batches))
    batches = [b.tolist() for b in native]
    seen["native"].append([i for b in batches for i in b])
    seen["native_steps"].append(len(batches))
dist.barrier()
dist.destroy_process_group()
with open(out, "w") as f:
    json.dump(seen, f)
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_see_every_item_once_per_epoch_with_equal_steps(tmp_path):
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": ROOT}
    outs = [tmp_path / f"rank{r}.json" for r in range(WORLD)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, str(port), str(r), str(WORLD), str(N)]
            + [str(BATCH), str(EPOCHS), str(outs[r])],
            cwd=ROOT,
            env=env,
        )
        for r in range(WORLD)
    ]
    try:
        for proc in procs:
            assert proc.wait(timeout=120) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    ranks = [json.loads(out.read_text()) for out in outs]
    for kind in ("dropin", "native"):
        for epoch in range(EPOCHS):
            items = [i for seen in ranks for i in seen[kind][epoch]]
            assert sorted(items) == list(range(N)), (kind, epoch)
            steps = {seen[f"{kind}_steps"][epoch] for seen in ranks}
            assert steps == {N // WORLD // BATCH}, (kind, epoch)
        # A new epoch draws a new order.
        assert ranks[0][kind][0] != ranks[0][kind][1]
