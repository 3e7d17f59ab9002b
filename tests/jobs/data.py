"""The data both framework jobs train on (``lightning_job.py``, ``accelerate_job.py``):
36 observations whose index travels with them, so that each rank's items can be checked."""

import numpy as np
import torch
import torch.utils.data as tud
from PIL import Image

N, BATCH, EPOCHS, FEATURES = 36, 4, 2, 12


class Pictures(tud.Dataset):
    """PyTorch-style: a PIL image decoded and cropped in ``__getitem__`` (the drop-in's
    ``"process-ring"`` path)."""

    def __init__(self, n):
        rng = np.random.default_rng(7)
        self.images = [rng.integers(0, 256, (8, 8), dtype=np.uint8) for _ in range(n)]

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image = Image.fromarray(self.images[i]).crop((1, 1, 7, 3))  # 6 x 2 = 12 pixels
        return torch.from_numpy(np.asarray(image, np.float32).reshape(-1) / 255), i


def tensors(n):
    """A ``TensorDataset`` of features and indices (the drop-in's ``"native"`` path)."""
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((n, FEATURES), np.float32))
    return tud.TensorDataset(x, torch.arange(n))
