"""One rank of a Lightning DDP job (2 processes on CPU, gloo), run by
tests/test_frameworks.py: for each case named on its command line it trains a small model
for 2 epochs with PyTorch's DataLoader and with ``fastload.torch.DataLoader``, and writes
what this rank loaded (the items of each step, the losses, the loader's type and path) to
``OUT/<case>-<loader>-rank<r>.json``. Lightning starts the second rank itself, by running
this script again."""

import json
import os
import sys
import warnings

import lightning.pytorch as pl
import torch
import torch.utils.data as tud
from data import BATCH, EPOCHS, FEATURES, N, Pictures, tensors
from torch.utils.data.distributed import DistributedSampler

import fastload.torch

warnings.filterwarnings("ignore")  # Lightning's advice on workers and logging


class Model(pl.LightningModule):
    def __init__(self, record, val=None):
        super().__init__()
        self.net = torch.nn.Linear(FEATURES, 1)
        self.record = record
        self.val = val

    def training_step(self, batch, step):
        x, index = batch
        loss = ((self.net(x).squeeze(1) - index.float() / N) ** 2).mean()
        self.record["steps"][-1].append(index.tolist())
        self.record["losses"].append(loss.item())
        return loss

    def validation_step(self, batch, step):
        self.record["val"][-1].append(batch[1].tolist())

    def on_train_epoch_start(self):
        self.record["steps"].append([])
        loader = self.trainer.train_dataloader
        self.record["type"] = f"{type(loader).__module__}.{type(loader).__name__}"
        self.record["path"] = getattr(loader, "path", None)
        self.record["sampler"] = type(loader.sampler).__name__

    def on_validation_epoch_start(self):
        self.record["val"].append([])
        loader = self.trainer.val_dataloaders
        self.record["val_path"] = getattr(loader, "path", None)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader_of(kind, dataset, **kwargs):
    cls = fastload.torch.DataLoader if kind == "fastload" else tud.DataLoader
    return cls(dataset, batch_size=BATCH, **kwargs)


def trainer_of(**kwargs):
    return pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **kwargs,
    )


def resumed(kind, out):
    """Stopped after 3 steps of the first epoch, saved, and resumed from that checkpoint
    by a new trainer: what the resumed run loads."""
    pl.seed_everything(0, verbose=False)
    first = trainer_of(max_steps=3)
    first.fit(Model({"steps": [], "losses": [], "val": []}), loader_of(kind, tensors(N)))
    checkpoint = os.path.join(out, f"resume-{kind}.ckpt")
    first.save_checkpoint(checkpoint)
    record = {"steps": [], "losses": [], "val": []}
    trainer = trainer_of(max_epochs=EPOCHS)
    train = loader_of(kind, tensors(N), shuffle=True)
    trainer.fit(Model(record), train_dataloaders=train, ckpt_path=checkpoint)
    return trainer, train, record


def run(case, kind, out):
    if case == "resume":
        trainer, train, record = resumed(kind, out)
        record["given_path"] = getattr(train, "path", None)
        name = f"{case}-{kind}-rank{trainer.global_rank}.json"
        with open(os.path.join(out, name), "w") as f:
            json.dump(record, f)
        return
    pl.seed_everything(0, verbose=False)
    record = {"steps": [], "losses": [], "val": []}
    own_sampler = case == "own-sampler"
    trainer = trainer_of(max_epochs=EPOCHS, use_distributed_sampler=not own_sampler)
    if case == "pictures":
        train = loader_of(kind, Pictures(N), shuffle=True, num_workers=2)
        val = None
    elif own_sampler:
        data = tensors(N)
        sampler = DistributedSampler(data, num_replicas=2, rank=trainer.global_rank, seed=5)
        train = loader_of(kind, data, sampler=sampler)
        val = None
    else:  # "tensors": the native path, with a validation loader
        train = loader_of(kind, tensors(N), shuffle=True, drop_last=True)
        val = loader_of(kind, tensors(N // 2))
    model = Model(record)
    trainer.fit(model, train_dataloaders=train, val_dataloaders=val)
    record["given_path"] = getattr(train, "path", None)
    name = f"{case}-{kind}-rank{trainer.global_rank}.json"
    with open(os.path.join(out, name), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    out, cases = sys.argv[1], sys.argv[2].split(",")
    for case in cases:
        for kind in ("torch", "fastload"):
            run(case, kind, out)
