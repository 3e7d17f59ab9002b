"""One rank of an accelerate job (2 processes on CPU, gloo, started by
``torch.distributed.run``), run by tests/test_frameworks.py: for each case named on its
command line it trains a small model for 2 epochs on a loader prepared by
``Accelerator.prepare``, with PyTorch's DataLoader and with ``fastload.torch.DataLoader``,
and writes what this rank loaded (the items of each step, the losses, the prepared
loader's type and path) to ``OUT/<case>-<loader>-rank<r>.json``."""

import json
import os
import sys

import torch
import torch.utils.data as tud
from accelerate import Accelerator
from accelerate.utils import set_seed
from data import BATCH, EPOCHS, FEATURES, N, Pictures, tensors

import fastload.torch


def run(case, kind, out):
    set_seed(0)
    accelerator = Accelerator(cpu=True)
    cls = fastload.torch.DataLoader if kind == "fastload" else tud.DataLoader
    if case == "pictures":
        loader = cls(Pictures(N), batch_size=BATCH, shuffle=True, num_workers=2)
    else:
        loader = cls(tensors(N), batch_size=BATCH, shuffle=True)
    given_path = getattr(loader, "path", None)
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    record = {"steps": [], "losses": [], "given_path": given_path}
    record["type"] = f"{type(prepared).__module__}.{type(prepared).__name__}"
    inner = getattr(prepared, "base_dataloader", prepared)
    record["path"] = getattr(inner, "path", None)
    record["inner"] = f"{type(inner).__module__}.{type(inner).__name__}"
    for _ in range(EPOCHS):
        record["steps"].append([])
        for x, index in prepared:
            loss = ((model(x).squeeze(1) - index.float() / N) ** 2).mean()
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            record["steps"][-1].append(index.tolist())
            record["losses"].append(loss.item())
    name = f"{case}-{kind}-rank{accelerator.process_index}.json"
    with open(os.path.join(out, name), "w") as f:
        json.dump(record, f)
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    out, cases = sys.argv[1], sys.argv[2].split(",")
    for case in cases:
        for kind in ("torch", "fastload"):
            run(case, kind, out)
    torch.distributed.destroy_process_group()
