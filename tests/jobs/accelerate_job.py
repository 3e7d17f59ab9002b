"""One rank of an accelerate job (2 processes on CPU, gloo, started by
``torch.distributed.run``), run by tests/test_frameworks.py: for each case of ``CASES`` it
trains a small model for 2 epochs on a loader prepared by ``Accelerator.prepare``, with
PyTorch's DataLoader and with ``fastload.torch.DataLoader``, and writes what this rank
loaded (the items of each step, the losses, the prepared loader's type and path) to
``OUT/<case>-<loader>-rank<r>.json``."""

import json
import os
import sys

import numpy as np
import torch
import torch.utils.data as tud
from accelerate import Accelerator
from accelerate.utils import set_seed
from PIL import Image

import fastload.torch

N, BATCH, EPOCHS, FEATURES = 36, 4, 2, 12


class Pictures(tud.Dataset):
    """PyTorch-style: a PIL image decoded and cropped in ``__getitem__``; the item's
    index travels with it, so that each rank's items can be checked."""

    def __init__(self, n):
        rng = np.random.default_rng(7)
        self.images = [rng.integers(0, 256, (8, 8), dtype=np.uint8) for _ in range(n)]

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image = Image.fromarray(self.images[i]).crop((1, 1, 7, 3))  # 6 x 2 = 12 pixels
        return torch.from_numpy(np.asarray(image, np.float32).reshape(-1) / 255), i


def tensors(n):
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((n, FEATURES), np.float32))
    return tud.TensorDataset(x, torch.arange(n))


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
