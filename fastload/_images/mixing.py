"""Batch mixes for image classification: MixUp and CutMix, as torchvision.transforms.v2's.

They work on whole batches, after the loader: the images are mixed in place, in C without
the GIL, and the labels become float32 soft targets. Their draws are keyed by
(seed, epoch, step), so a resumed run mixes as the first one did. In a training loop:

    mixup = MixUp(alpha=0.2, num_classes=1000)
    for epoch in range(epochs):
        for step, (x, y) in enumerate(loader):
            x, y = mixup(x, y, epoch=epoch, step=step)

Each batch is paired with itself rolled by one: item i is mixed with item i - 1 (item 0
with the last), as torchvision does.
"""

import math
import numbers

import numpy as np

from .. import _core

__all__ = ["CutMix", "MixUp"]

_CHANNELS = (1, 3, 4)


def _check_args(what, alpha, num_classes, seed):
    if not (isinstance(alpha, numbers.Real) and 0 < float(alpha) < math.inf):
        raise ValueError(f"{what}: alpha must be a finite number > 0, got {alpha!r}")
    if not (isinstance(num_classes, numbers.Integral) and int(num_classes) > 0):
        raise ValueError(f"{what}: num_classes must be an int > 0, got {num_classes!r}")
    if not (isinstance(seed, numbers.Integral) and 0 <= int(seed) < 1 << 64):
        raise ValueError(f"{what}: seed must be an int in [0, 2**64), got {seed!r}")


def _key(what, epoch, step):
    for name, value in (("epoch", epoch), ("step", step)):
        if not (isinstance(value, numbers.Integral) and 0 <= int(value) < 1 << 64):
            raise ValueError(f"{what}: {name} must be an int >= 0, got {value!r}")
    return int(epoch), int(step)


def _batch(what, images):
    """The images as a numpy array to mix in place (sharing memory with a torch tensor)."""
    batch = np.asarray(images)
    if batch.ndim < 2 or batch.dtype not in (np.float32, np.uint8):
        raise ValueError(
            f"{what}: images must be a float32 or uint8 batch (n, ...), got "
            f"{batch.dtype} of shape {batch.shape}"
        )
    if not batch.flags.c_contiguous or not batch.flags.writeable:
        raise ValueError(
            f"{what}: images must be a writable C-contiguous batch, as a loader "
            f"yields: they are mixed in place"
        )
    return batch


def _mixed(images, batch):
    """What to hand back: the images given (numpy array or torch CPU tensor, mixed in place
    as `batch` shares their memory), or the new array made from a list."""
    return batch if isinstance(images, (list, tuple)) else images


def _one_hot(what, labels, n, num_classes):
    """float32 (n, num_classes) targets from class ids or one-hot (or soft) labels."""
    y = np.asarray(labels)
    if y.shape == (n,) and np.issubdtype(y.dtype, np.integer):
        if n and (y.min() < 0 or y.max() >= num_classes):
            raise ValueError(
                f"{what}: class ids must be in [0, {num_classes}), got {y.min()}..{y.max()}"
            )
        targets = np.zeros((n, num_classes), np.float32)
        targets[np.arange(n), y] = 1.0
        return targets
    if y.shape == (n, num_classes) and np.issubdtype(y.dtype, np.floating):
        return y.astype(np.float32)
    raise ValueError(
        f"{what}: labels must be {n} integer class ids or a ({n}, {num_classes}) "
        f"float array of one-hot or soft labels, got {y.dtype} of shape {y.shape}"
    )


def _mix_targets(targets, lam):
    """lam * y[i] + (1 - lam) * y[i - 1], in float32 as torchvision's."""
    return np.roll(targets, 1, axis=0) * np.float32(1.0 - lam) + targets * np.float32(lam)


class MixUp:
    """MixUp (Zhang et al., 2018): each image becomes lam * x[i] + (1 - lam) * x[i - 1] and
    each target likewise, with one lam ~ Beta(alpha, alpha) per batch.

    `__call__(images, labels, *, epoch, step)` mixes `images` (float32 or uint8, any
    layout, C-contiguous; uint8 results rounded half up) in place and returns
    (images, targets): targets float32 (n, num_classes) numpy soft labels. `labels` are
    integer class ids (n,) or one-hot / soft labels (n, num_classes). Raises ValueError
    for a batch or labels of the wrong kind.
    """

    def __init__(self, *, alpha: float = 1.0, num_classes: int, seed: int = 0) -> None:
        _check_args("MixUp", alpha, num_classes, seed)
        self.alpha, self.num_classes, self.seed = float(alpha), int(num_classes), int(seed)

    def __call__(
        self, images: "np.typing.ArrayLike", labels: "np.typing.ArrayLike", *, epoch: int, step: int
    ):
        batch = _batch("MixUp", images)
        targets = _one_hot("MixUp", labels, len(batch), self.num_classes)
        lam = _core.mixup_lambda(self.alpha, self.seed, *_key("MixUp", epoch, step))
        _core.mixup_(batch, lam)
        return _mixed(images, batch), _mix_targets(targets, lam)

    def __repr__(self) -> str:
        return f"MixUp(alpha={self.alpha}, num_classes={self.num_classes}, seed={self.seed})"


def _channels_first(shape, layout):
    """Whether a 4-D batch of `shape` is NCHW: from `layout`, or inferred (None) from the
    axis of 1, 3 or 4 channels; ValueError when both or neither axis could be it."""
    if layout is not None:
        return layout == "NCHW"
    first, last = shape[1] in _CHANNELS, shape[3] in _CHANNELS
    if first == last:
        raise ValueError(
            f"CutMix: cannot tell the channel axis of a batch of shape {shape}: "
            f"give CutMix(..., layout='NCHW') or layout='NHWC'"
        )
    return first


class CutMix:
    """CutMix (Yun et al., 2019): a box of each image is replaced by the same box of the
    image before it, and the targets mixed by the share of the area kept.

    One lam ~ Beta(alpha, alpha) per batch; the box is centred uniformly in the image,
    with sides sqrt(1 - lam) times the image's (half sides truncated), clamped to the image;
    lam is then corrected to 1 - box area / image area (torchvision's rules).
    `layout` is "NCHW", "NHWC", or None to infer it from the axis of 1, 3 or 4 channels
    (ValueError when that is ambiguous). `__call__` as MixUp's, for 4-D batches.
    """

    def __init__(
        self, *, alpha: float = 1.0, num_classes: int, seed: int = 0, layout: str | None = None
    ) -> None:
        _check_args("CutMix", alpha, num_classes, seed)
        if layout not in ("NCHW", "NHWC", None):
            raise ValueError(f"CutMix: layout must be 'NCHW', 'NHWC' or None, got {layout!r}")
        self.alpha, self.num_classes, self.seed = float(alpha), int(num_classes), int(seed)
        self.layout = layout

    def __call__(
        self, images: "np.typing.ArrayLike", labels: "np.typing.ArrayLike", *, epoch: int, step: int
    ):
        batch = _batch("CutMix", images)
        if batch.ndim != 4:
            raise ValueError(
                f"CutMix: images must be a 4-D batch (NCHW or NHWC), got shape {batch.shape}"
            )
        chw = _channels_first(batch.shape, self.layout)
        targets = _one_hot("CutMix", labels, len(batch), self.num_classes)
        h, w = batch.shape[2:] if chw else batch.shape[1:3]
        epoch, step = _key("CutMix", epoch, step)
        lam, box = _core.cutmix_params(self.alpha, self.seed, epoch, step, h, w)
        _core.cutmix_(batch, box, chw)
        return _mixed(images, batch), _mix_targets(targets, lam)

    def __repr__(self) -> str:
        return (
            f"CutMix(alpha={self.alpha}, num_classes={self.num_classes}, seed={self.seed}, "
            f"layout={self.layout!r})"
        )
