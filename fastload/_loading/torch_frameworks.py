"""The drop-in under frameworks that build a PyTorch loader anew to shard it.

- Lightning (``use_distributed_sampler``) builds the loader's own class anew from its
  ``__init__`` arguments, read from the attributes of the same names: the drop-in is a
  subclass of PyTorch's ``DataLoader`` whose attributes are its arguments
  (``torch_loader.py``), so Lightning builds a drop-in, which keeps its path.
- accelerate (``Accelerator.prepare``) builds a ``DataLoader`` of its own module
  (``accelerate.data_loader.DataLoader``, PyTorch's) from the loader's attributes, with a
  batch sampler of its own around the loader's (``BatchSamplerShard``). Left so, the shards
  are right but the batches load on PyTorch's path. While accelerate is imported, the
  drop-in puts :func:`_rebuilt` under that name: it builds a drop-in when the batch sampler
  it is given wraps a live drop-in's (the loader being prepared), else PyTorch's loader as
  before. accelerate must then be imported before the drop-in is made (as scripts do at
  their top); imported later, the prepared loader is PyTorch's, sharded the same.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import torch.utils.data as tud

__all__ = ["follow"]

_loaders: weakref.WeakSet[Any] = weakref.WeakSet()
# How deep a framework's batch samplers may wrap a drop-in's (accelerate: a shard of it, and
# skip_first_batches' skipping sampler around that).
_WRAPS = 4


def follow(loader: Any) -> None:
    """Known to frameworks: ``loader`` (a drop-in) can be found from its batch sampler,
    and accelerate, when imported, builds drop-ins for the drop-ins it prepares."""
    _loaders.add(loader)
    module = sys.modules.get("accelerate.data_loader")
    if module is not None and getattr(module, "DataLoader", None) is tud.DataLoader:
        setattr(module, "DataLoader", _rebuilt)  # noqa: B010 (a module's name, replaced)


def _prepared(sampler: Any) -> Any:
    """The live drop-in whose batch sampler (or sampler) ``sampler`` is, or wraps through
    ``batch_sampler`` attributes; else None."""
    for _ in range(_WRAPS):
        if sampler is None:
            return None
        for loader in list(_loaders):
            if sampler is loader.batch_sampler or sampler is loader.sampler:
                return loader
        sampler = getattr(sampler, "batch_sampler", None)
    return None


def _rebuilt(dataset: Any, *args: Any, **kwargs: Any) -> Any:
    """accelerate's ``DataLoader(...)``: a drop-in when the batch sampler (or sampler)
    given wraps a drop-in's, else PyTorch's ``DataLoader``."""
    sampler = kwargs.get("batch_sampler") or kwargs.get("sampler")
    original = _prepared(sampler)
    if original is None or original.dataset is not dataset:
        return tud.DataLoader(dataset, *args, **kwargs)
    for name in ("collate_fn", "prefetch_factor"):
        # Read from the loader with its default filled in: given as they were.
        if name not in vars(original) and kwargs.get(name) is getattr(original, name):
            kwargs.pop(name)
    return type(original)(dataset, *args, **kwargs)
