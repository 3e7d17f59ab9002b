"""torch tensors as containers, without importing torch.

A tensor's observations are along its first dimension, as an array's are. A CPU tensor is
read through its numpy view (``Tensor.numpy()`` shares its memory), so the engine gathers
its rows natively; the batches come back as tensors. A tensor numpy cannot view (on a GPU,
or of a dtype numpy lacks, such as bfloat16) is indexed by torch itself.

torch is never imported here: a tensor exists only once torch was imported, and the
module is then found in ``sys.modules``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import torch

__all__ = ["as_tensor", "is_tensor", "numpy_view", "stack", "take"]


def _torch() -> Any:
    return sys.modules.get("torch")


def is_tensor(x: object) -> bool:
    """True for a ``torch.Tensor`` (a ``Parameter`` too)."""
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def numpy_view(tensor: torch.Tensor) -> np.ndarray | None:
    """The numpy array sharing memory with ``tensor`` (detached from autograd), or None
    when there is none: a tensor on a GPU, sparse, conjugated, or of a dtype numpy lacks."""
    if tensor.device.type != "cpu" or tensor.layout is not _torch().strided:
        return None
    try:
        return tensor.detach().numpy()
    except (TypeError, RuntimeError):
        return None


def as_tensor(array: npt.ArrayLike) -> torch.Tensor:
    """A tensor owning a copy of the numpy ``array``."""
    return from_numpy(np.array(array))


def from_numpy(array: np.ndarray) -> torch.Tensor:
    """A tensor sharing the memory of the numpy ``array``."""
    return _torch().from_numpy(array)


def take(tensor: torch.Tensor, i: int | npt.NDArray[np.int64]) -> torch.Tensor:
    """Row ``i`` (an int) of ``tensor``, or its rows at ``i`` (an int64 array), as a
    tensor on the same device."""
    if isinstance(i, np.ndarray):
        return tensor[_torch().from_numpy(i).to(tensor.device)]
    return tensor[i]


def stack(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """``tensors`` (a list of same-shaped tensors) stacked along a new first dimension."""
    return _torch().stack(list(tensors))
