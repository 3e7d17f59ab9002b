"""Lightning's DDP over fastload's drop-in, in real processes (``lightning_ddp_run.py``,
gloo on 127.0.0.1): a run stopped mid-epoch on 2 devices resumes from its checkpoint,
on 2 devices and on 1 with the same global batch, with the batches it would have had."""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lightning")
from torch.utils.data import DistributedSampler, TensorDataset  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(__file__), "lightning_ddp_run.py")
N, GLOBAL, FIRST, STEPS = 40, 8, 3, 5  # 40 items, a global batch of 8: 5 steps an epoch


def _fit(tmp_path, name, devices, steps, resume="-", save=None):
    """The global batches (each a set, the ranks' batches of one step together) of a fit
    on ``devices`` with the global batch ``GLOBAL``."""
    out = tmp_path / name
    args = [SCRIPT, str(devices), str(GLOBAL // devices), str(steps), str(out), str(resume)]
    run = subprocess.run(
        [sys.executable, *args, *([str(save)] if save else [])],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"{name}.rank{r}.json").read_text()) for r in range(devices)]
    assert len({len(r) for r in ranks}) == 1  # every rank the same number of steps
    return [set().union(*step) for step in zip(*ranks)]


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A fit on 2 devices stopped after 3 of the epoch's 5 steps, its checkpoint saved then."""
    tmp_path = tmp_path_factory.mktemp("ddp")
    checkpoint = tmp_path / "mid.ckpt"
    first = _fit(tmp_path, "first", 2, FIRST, save=checkpoint)
    return tmp_path, checkpoint, first


@pytest.mark.parametrize("devices", [2, 1])
def test_a_ddp_run_resumes_mid_epoch_on_the_same_and_another_number_of_devices(stopped, devices):
    tmp_path, checkpoint, first = stopped
    rest = _fit(tmp_path, f"rest{devices}", devices, STEPS, resume=checkpoint)
    # The batches it would have had: Lightning's DistributedSampler (seed 0, epoch 0) deals
    # one permutation; step k's global batch is its k-th run of GLOBAL on any world size.
    order = list(DistributedSampler(TensorDataset(torch.arange(N)), 1, 0, shuffle=True, seed=0))
    expected = [set(order[k * GLOBAL : (k + 1) * GLOBAL]) for k in range(STEPS)]
    assert (len(first), len(rest)) == (FIRST, STEPS - FIRST)
    assert first + rest == expected
    assert sorted(i for step in first + rest for i in step) == list(range(N))  # each once
