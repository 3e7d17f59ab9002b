"""Train a small CNN for one epoch on CPU, fed by fastload's image pipeline.

Generates 2,000 JPEG images (32x32, ten classes: a shape in one of ten colours on a noisy
background), loads them with decode, random resized crop, flip and normalize running
natively in parallel, and trains through ``fastload.torch.TorchLoader``.

    python examples/train_torch.py [--images 2000] [--log-every 5]
"""

import argparse
import time

import numpy as np
import simplejpeg
import torch
from torch import nn

from fastload import DataLoader, mapobs
from fastload.torch import TorchLoader
from fastload.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    CenterCrop,
    Compose,
    DecodeImage,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    ToCHW,
)

COLOURS = np.array(
    [
        [230, 25, 75],
        [60, 180, 75],
        [255, 225, 25],
        [0, 130, 200],
        [245, 130, 48],
        [145, 30, 180],
        [70, 240, 240],
        [240, 50, 230],
        [128, 128, 0],
        [250, 250, 250],
    ],
    np.float32,
)


def make_images(count, seed):
    """(JPEG bytes per image, int64 labels): a disc or a square in the label's colour."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(COLOURS), count)
    yy, xx = np.mgrid[:32, :32]
    images = []
    for label in labels:
        image = rng.normal(60, 25, (32, 32, 3))
        cy, cx, r = rng.integers(10, 22), rng.integers(10, 22), rng.integers(5, 10)
        if rng.random() < 0.5:
            mask = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
        else:
            mask = (abs(yy - cy) <= r) & (abs(xx - cx) <= r)
        image[mask] = COLOURS[label] + rng.normal(0, 10, 3)
        pixels = np.clip(image, 0, 255).astype(np.uint8)
        images.append(simplejpeg.encode_jpeg(pixels, quality=90))
    return images, labels.astype(np.int64)


def make_model():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, 64),
        nn.ReLU(),
        nn.Linear(64, len(COLOURS)),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--log-every", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    start = time.perf_counter()
    images, labels = make_images(args.images, seed=0)
    test_images, test_labels = make_images(400, seed=1)

    train = Compose(
        [
            DecodeImage(),
            RandomResizedCrop(32, scale=(0.5, 1)),
            RandomHorizontalFlip(),
            Normalize(IMAGENET_MEAN, IMAGENET_STD),
            ToCHW(),
        ]
    )
    loader = DataLoader(
        (mapobs(train, images), labels),
        batch_size=64,
        shuffle=True,
        parallel=True,
        buffer=True,
        seed=0,
    )
    batches = TorchLoader(loader)

    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for step, (x, y) in enumerate(batches):
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % args.log_every == 0 or step == len(batches) - 1:
            print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)

    evaluate = Compose(
        [DecodeImage(), CenterCrop(32), Normalize(IMAGENET_MEAN, IMAGENET_STD), ToCHW()]
    )
    test = TorchLoader(
        DataLoader(
            (mapobs(evaluate, test_images), test_labels), batch_size=100, parallel=True, buffer=True
        )
    )
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in test:
            correct += int((model(x).argmax(1) == y).sum())
    print(f"accuracy {correct / len(test_labels):.3f} on {len(test_labels)} held-out images")
    print(f"loader: {loader.stats()}")
    print(f"total {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
