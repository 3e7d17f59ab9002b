"""Real training processes joined by ``torch.distributed`` (gloo, on 127.0.0.1): a
``DistributedSampler`` through ``fastload.torch.DataLoader``, and ``fastload.DataLoader``
with ``shard="auto"``, give every item once per epoch and the same steps on every rank;
on 1, 2 and 4 ranks of one global batch, ``fastload.DataLoader`` loads the same global
batches, a packed dataset's quasi-random order at a URL too (moto's S3 server: each rank
fetches blocks of its own, each once)."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from servers import S3Server

import fastload
from fastload.storage import Bytes

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


ELASTIC_SCRIPT = """
import json, sys, time
import numpy as np
import torch.distributed as dist
import fastload

port, rank, world, url, storage, log, out = sys.argv[1:]
rank, world = int(rank), int(world)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=world)
settings = {
    "shuffled": dict(shuffle=True, parallel=2),
    "in order": dict(parallel=False),
    "sampler": dict(sampler=fastload.WeightedSampler(np.ones(50), 48)),
}
seen = {}
for name, options in settings.items():
    loader = fastload.DataLoader(np.arange(50), 16 // world, shard="auto", seed=5, **options)
    seen[name] = [[b.tolist() for b in loader] for _ in range(2)]
# A packed dataset at a URL (moto's S3 server) in the quasi-random order, its blocks dealt
# to 8 partitions; the blocks this rank fetched in the first epoch.
def gets():  # the GETs of the job's object that moto logged (until two reads agree)
    counts = [-1]
    while True:
        with open(log, errors="replace") as f:
            counts.append(f.read().count(f"GET /data/{url.rsplit('/', 1)[1]} HTTP"))
        if counts[-1] == counts[-2]:
            return counts[-1]
        time.sleep(0.2)


ds = fastload.open(url, storage_options=json.loads(storage), cache_bytes=0)
quasi = fastload.DataLoader(ds, 16 // world, shard="auto", seed=5, shuffle="quasi",
                            partitions=8, parallel=2)
dist.barrier()  # every rank opened it
before = gets()
first = [b["label"].tolist() for b in quasi]
dist.barrier()
seen["gets"] = gets() - before  # the job's, while its ranks loaded the first epoch
seen["fetched"] = np.flatnonzero(ds.remote_rows.present).tolist()
seen["quasi"] = [first, [b["label"].tolist() for b in quasi]]
dist.barrier()
dist.destroy_process_group()
with open(out, "w") as f:
    json.dump(seen, f)
"""


def _start_ranks(script, world, tmp_path, *args):
    """``script`` started on ``world`` processes joined by gloo: the processes and the
    files each writes its JSON output to."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": ROOT}
    outs = [tmp_path / f"w{world}rank{r}.json" for r in range(world)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(port), str(r), str(world), *args, str(outs[r])],
            cwd=ROOT,
            env=env,
        )
        for r in range(world)
    ]
    return procs, outs


def _outputs(started):
    """Each group's ranks' outputs, once all their processes ended well."""
    procs = [proc for group, _ in started for proc in group]
    try:
        for proc in procs:
            assert proc.wait(timeout=120) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return [[json.loads(out.read_text()) for out in outs] for _, outs in started]


def test_one_to_four_ranks_load_the_same_global_batches(tmp_path):
    packed = tmp_path / "packed.arrow"
    rows = [{"label": k, "blob": bytes(k % 37)} for k in range(300)]
    fastload.write(
        packed, rows, {"label": "int64", "blob": Bytes()}, block_bytes=400, progress=False
    )
    log = tmp_path / "moto.log"
    s3 = S3Server(log)
    try:
        for world in (1, 2, 4):  # an object per job, so that its requests are its own
            s3.put("data", f"w{world}.arrow", packed.read_bytes())
        options = json.dumps(s3.storage_options)
        # The three jobs run side by side, each on ports of its own.
        started = [
            _start_ranks(
                ELASTIC_SCRIPT, world, tmp_path, f"s3://data/w{world}.arrow", options, str(log)
            )
            for world in (1, 2, 4)
        ]
        runs = dict(zip((1, 2, 4), _outputs(started), strict=True))
    finally:
        s3.stop()
    bounds = fastload.open(packed).block_bounds
    for world in (1, 2, 4):  # the quasi order's ranks fetch disjoint blocks, each once
        for epoch in range(2):
            blocks = [
                set(
                    (
                        bounds.searchsorted(np.concatenate(seen["quasi"][epoch]), "right") - 1
                    ).tolist()
                )
                for seen in runs[world]
            ]
            assert all(not (blocks[r] & blocks[q]) for r in range(world) for q in range(r))
            if epoch == 0:  # what each rank fetched: the blocks of its rows, no other
                assert [set(seen["fetched"]) for seen in runs[world]] == blocks
        fetched = sum(len(seen["fetched"]) for seen in runs[world])
        assert fetched == len(bounds) - 1
        # A GET a block fetched (and a check of the object's version per read).
        gets = runs[world][0]["gets"]
        assert fetched <= gets <= 2 * fetched, (world, gets, fetched)
    for name in ("shuffled", "in order", "sampler", "quasi"):
        (alone,) = runs[1]
        for world in (2, 4):
            ranks = runs[world]
            for epoch in range(2):
                steps = len(alone[name][epoch])
                assert all(len(seen[name][epoch]) == steps for seen in ranks)
                for k in range(steps):
                    got = [i for seen in ranks for i in seen[name][epoch][k]]
                    want = alone[name][epoch][k]  # padded on more ranks when partial
                    assert got[: len(want)] == want, (name, world, epoch, k)
        assert alone[name][0] != alone[name][1] or name == "in order"


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
