"""One Lightning fit over fastload's drop-in, run as a script (Lightning's DDP launcher
starts the other ranks by running it again): ``DEVICES BATCH STEPS OUT [RESUME] [SAVE]``.
Each rank writes the items of every batch it trained on to ``OUT.rank<r>.json``; with
SAVE, a ``ModelCheckpoint`` saves one after STEPS steps (mid-epoch, during the fit); with
RESUME, the fit resumes from one. The data is 40 items; the loader shuffles, and Lightning shards it
over the ranks with a ``DistributedSampler``."""

import json
import os
import sys

import lightning
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import TensorDataset

from fastload.torch import DataLoader


class Model(lightning.LightningModule):
    """A linear model that learns nothing (lr 0) and keeps the items of every batch it
    trained on (``seen``); its loader is the drop-in over 40 items, shuffled."""

    def __init__(self, batch):
        super().__init__()
        self.linear = torch.nn.Linear(1, 1)
        self.batch = batch
        self.seen = []

    def training_step(self, batch, index):
        self.seen.append(batch[0].tolist())
        return self.linear(batch[0].float()[:, None]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), 0.0)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.arange(40)), batch_size=self.batch, shuffle=True)


def main():
    devices, batch, steps, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    resume = sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] != "-" else None
    save = sys.argv[6] if len(sys.argv) > 6 else None
    torch.manual_seed(0)
    model = Model(batch)
    callbacks = []
    if save is not None:  # saved during the fit, after its last step, as a job's would be
        directory, name = os.path.split(save)
        callbacks.append(
            ModelCheckpoint(directory, name.removesuffix(".ckpt"), every_n_train_steps=steps)
        )
    trainer = lightning.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=devices,
        strategy="ddp",  # a DistributedSampler on one device too: the same order
        logger=False,
        callbacks=callbacks,
        enable_checkpointing=bool(callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, ckpt_path=resume)
    with open(f"{out}.rank{trainer.global_rank}.json", "w") as f:
        json.dump(model.seen, f)


if __name__ == "__main__":
    main()
