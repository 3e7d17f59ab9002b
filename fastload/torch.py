"""PyTorch integration: a drop-in ``DataLoader`` (PyTorch's, on fastload's engine; see
``fastload._loading.torch_loader``), batches as tensors without a copy, a pinned ring, device
prefetch.

    >>> from fastload.torch import DataLoader   # the one-line switch from torch.utils.data

or fastload's own loader, its batches as tensors, copied to the GPU ahead of the step:

    >>> import fastload, torch
    >>> from fastload.torch import TorchLoader, to_device
    >>> device = "cuda" if torch.cuda.is_available() else "cpu"
    >>> batches = fastload.DataLoader(data, batch_size=64, parallel=True, buffer=True)
    >>> loader = TorchLoader(batches, pin_memory=device == "cuda")
    >>> for images, labels in to_device(loader, device):
    ...     loss = model(images, labels)

Tensors made from a ``buffer=True`` loader share memory with its ring: like the arrays,
**they are valid until the next batch is requested**. Importing this module imports torch;
``import fastload`` does not.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from ._base.tree import map_tree
from ._loading.torch_loader import DataLoader
from .loader import EpochLoader, StatsReport

__all__ = ["DataLoader", "TorchLoader", "to_device"]

_warned_no_cuda = False


def _walk(batch: Any, f: Callable[[Any], Any]) -> Any:
    """``f`` applied to every leaf of ``batch``, through tuples, dicts and lists."""
    return map_tree(f, batch, lists=True)


def _tensors(batch: Any) -> Any:
    """``batch`` with every numpy array made a tensor on the same memory; anything else
    is kept as it is."""
    return _walk(
        batch,
        lambda x: torch.from_numpy(x) if isinstance(x, np.ndarray) and x.dtype != object else x,
    )


def _apply(batch: Any, f: Callable[[torch.Tensor], Any]) -> Any:
    """``f`` applied to every tensor of ``batch``."""
    return _walk(batch, lambda x: f(x) if isinstance(x, torch.Tensor) else x)


def _pinned_empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """An uninitialized numpy array in page-locked memory (the tensor stays its owner)."""
    torch_dtype = torch.from_numpy(np.empty(0, dtype)).dtype
    return torch.empty(tuple(shape), dtype=torch_dtype, pin_memory=True).numpy()


def _pin(loader: EpochLoader) -> None:
    """Make the ring of ``loader``'s engine page-locked, so that copies to the GPU run
    asynchronously straight from the slots."""
    global _warned_no_cuda
    if loader.backend == "process":
        raise ValueError(
            "pin_memory=True needs the thread backend: the process backend's "
            "ring is shared memory made before its workers start"
        )
    if not loader.buffer:
        raise ValueError(
            "pin_memory=True needs buffer=True: the ring is pinned once and "
            "reused, where buffer=False makes a fresh array per batch"
        )
    if not torch.cuda.is_available():
        if not _warned_no_cuda:
            warnings.warn("pin_memory=True does nothing: CUDA is not available", stacklevel=3)
            _warned_no_cuda = True
        return
    loader.allocator = _pinned_empty  # drops a ring allocated before; the next epoch pins


class TorchLoader:
    """A fastload loader whose batches are torch tensors on the loader's own memory.

    ``pin_memory=True`` allocates the loader's ring in page-locked memory once (no copy
    per batch); it needs ``buffer=True`` and the thread backend, and does nothing (with
    one warning) when CUDA is not available. Raises ``ValueError`` when the loader
    cannot be pinned. ``len``, ``state_dict``, ``load_state_dict`` and ``stats`` are the
    loader's.
    """

    def __init__(self, loader: EpochLoader, pin_memory: bool = False) -> None:
        self.loader = loader
        self.pin_memory = bool(pin_memory)
        if self.pin_memory:
            _pin(loader)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            yield _tensors(batch)

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.loader.load_state_dict(state)

    def stats(self) -> StatsReport:
        return self.loader.stats()

    def close(self) -> None:
        self.loader.close()

    def __repr__(self) -> str:
        return f"TorchLoader({self.loader!r}, pin_memory={self.pin_memory})"


class _OnDevice:
    def __init__(
        self, batches: TorchLoader | EpochLoader, device: torch.device, non_blocking: bool
    ) -> None:
        self.batches = batches
        self.device = device
        self.non_blocking = non_blocking

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        batches = (_tensors(b) for b in self.batches)
        if self.device.type == "cpu":
            return iter(batches)
        if self.device.type != "cuda":
            return (_apply(b, lambda t: t.to(self.device)) for b in batches)
        return self._prefetch(batches)

    def _prefetch(self, batches: Generator[Any, None, None]) -> Iterator[Any]:
        # Invariant: batch b's copy has finished reading the host slot (its event has
        # completed) before the source is asked for b+1, which may reuse that slot.
        device, non_blocking = self.device, self.non_blocking
        stream = torch.cuda.Stream(device)

        def copy(batch: Any) -> tuple[Any, Any]:
            with torch.cuda.stream(stream):
                moved = _apply(batch, lambda t: t.to(device, non_blocking=non_blocking))
            done = torch.cuda.Event()
            done.record(stream)
            return moved, done

        try:
            pending = copy(next(batches))
        except StopIteration:
            return
        try:
            while pending is not None:
                moved, done = pending
                done.synchronize()
                try:
                    pending = copy(next(batches))
                except StopIteration:
                    pending = None
                current = torch.cuda.current_stream(device)
                current.wait_event(done)
                # The memory was allocated on the side stream: keep the allocator from
                # handing it out again while the consumer's stream still reads it.
                _apply(moved, lambda t: t.record_stream(current))  # noqa: B023 (run at once)
                yield moved
        finally:
            batches.close()


def to_device(
    loader: TorchLoader | EpochLoader, device: str | torch.device, non_blocking: bool = True
) -> _OnDevice:
    """The batches of ``loader`` (a ``TorchLoader`` or any fastload loader) as tensors on
    ``device``, through tuples, dicts and lists.

    On CUDA, batch b+1 is copied on a side stream while the model works on batch b; the
    copy of a batch has finished reading host memory before the next batch is requested,
    so ``buffer=True`` slots are never overwritten under a copy (pin the ring with
    ``TorchLoader(..., pin_memory=True)`` for truly asynchronous copies). On ``"cpu"``
    the batches pass through without a copy. Returns an iterable with ``len``.
    """
    return _OnDevice(loader, torch.device(device), non_blocking)
