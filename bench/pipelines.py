"""The image pipeline the JPEG benches share: the training chain fastload runs (``train_ops``)
and the pieces of its PIL twin (``rrc_params``, ``pil_crop_flip``, ``pil_jitter``), so that
every bench times the same work. Only ``train_ops`` imports fastload: the PIL twin also runs
where fastload is not installed (``remote_peers.py``'s environment)."""

import math
import random

from PIL import Image

__all__ = ["JITTER", "SIZE", "pil_crop_flip", "pil_jitter", "rrc_params", "train_ops"]

SIZE = 224
JITTER = 0.4


def train_ops(jitter):
    """RandomResizedCrop(224) and a flip (with ``jitter``: + ColorJitter, Normalize, ToCHW)."""
    from fastload.transforms import (
        IMAGENET_MEAN,
        IMAGENET_STD,
        ColorJitter,
        DecodeImage,
        Normalize,
        RandomHorizontalFlip,
        RandomResizedCrop,
        ToCHW,
    )

    ops = [DecodeImage(), RandomResizedCrop(SIZE), RandomHorizontalFlip()]
    if jitter:
        ops += [
            ColorJitter(JITTER, JITTER, JITTER),
            Normalize(IMAGENET_MEAN, IMAGENET_STD),
            ToCHW(),
        ]
    return ops


def rrc_params(rng, h, w, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's RandomResizedCrop.get_params: (top, left, height, width)."""
    area = h * w
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        cw = int(round(math.sqrt(target * aspect)))
        ch = int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            return rng.randint(0, h - ch), rng.randint(0, w - cw), ch, cw
    in_ratio = w / h  # fallback: the central crop of the closest allowed aspect
    if in_ratio < ratio[0]:
        cw, ch = w, int(round(w / ratio[0]))
    elif in_ratio > ratio[1]:
        ch, cw = h, int(round(h * ratio[1]))
    else:
        cw, ch = w, h
    return (h - ch) // 2, (w - cw) // 2, ch, cw


def pil_crop_flip(img, rng=random):
    """``train_ops(False)`` after the decode, on a PIL image, as torchvision's PIL path:
    RandomResizedCrop(224) (bilinear) and a horizontal flip half of the time; returns the
    224x224 image."""
    top, left, h, w = rrc_params(rng, img.height, img.width)
    img = img.crop((left, top, left + w, top + h)).resize((SIZE, SIZE), Image.BILINEAR)
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return img


def pil_jitter(img, rng, enhance):
    """torchvision's ColorJitter on a PIL image: factors uniform in [1 - j, 1 + j], the
    three ops in a random order (ImageEnhance, as torchvision's PIL path)."""
    ops = [enhance.Brightness, enhance.Contrast, enhance.Color]
    factors = [rng.uniform(1 - JITTER, 1 + JITTER) for _ in ops]
    for k in rng.sample(range(len(ops)), len(ops)):
        img = ops[k](img).enhance(factors[k])
    return img
