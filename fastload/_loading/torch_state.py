"""The state of ``fastload.torch.DataLoader``: ``state_dict()`` / ``load_state_dict()``
as torchdata's ``StatefulDataLoader`` has them, so that a run stopped mid-epoch (by
Lightning, which saves and restores any loader with both methods, or by hand) resumes
with the batches it would have had.

A state taken after k batches of an epoch resumes at batch k + 1: it holds k, the state
of the random generator the epoch's draws came from (the loader's ``generator``, else
PyTorch's global one) as it was when the epoch's iterator was made, and the sampler's
epoch (a ``DistributedSampler``'s ``set_epoch``). The next ``iter()`` puts the generator
back, so that the sampler draws the same order (and the workers the same seed), and
skips the first k batches of indices without loading them. A state taken after the
epoch's last batch, or before any, starts the next epoch as usual.

Elastic over a ``DistributedSampler``: its ranks take ``indices[rank::world_size]`` of one
permutation, so after k batches of ``batch_size`` on W ranks they have consumed the
first ``k * batch_size * W`` of it, on any W. A state saved on W1 ranks resumes on W2
ranks with ``k * G1 / G2`` batches skipped (``G = batch_size * world_size``), every
index not yet consumed loaded once (and the sampler's padding); ``load_state_dict``
refuses a state whose position is not a whole number of this loader's global batches.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

__all__ = ["FORMAT", "StatefulTorchLoader"]

FORMAT = "fastload.torch_loader/1"
_KEYS = frozenset(["batches_yielded", "generator", "sampler_epoch", "batch_size", "world_size"])


def _sampler_of(loader: Any) -> Any:
    """The sampler under the loader's batch sampler (PyTorch's keeps it as ``sampler``)."""
    return getattr(loader.batch_sampler, "sampler", loader.sampler)


def _world(loader: Any) -> int:
    """The ranks its sampler shares each epoch among (a DistributedSampler's), else 1."""
    return int(getattr(_sampler_of(loader), "num_replicas", 1))


def _rng_state(loader: Any) -> torch.Tensor:
    generator = loader.generator
    return generator.get_state() if generator is not None else torch.get_rng_state()


def _set_rng_state(loader: Any, state: torch.Tensor) -> None:
    if loader.generator is not None:
        loader.generator.set_state(state)
    else:
        torch.set_rng_state(state)


class StatefulTorchLoader:
    """``state_dict`` / ``load_state_dict`` of ``fastload.torch.DataLoader`` (a base of it;
    see the module docstring). The loader calls ``_start_epoch(make_tasks)`` when an epoch's
    iterator is made and ``_follow(delivered)`` with what it yields."""

    _live: list[int] | None = None  # batches the latest epoch delivered (Delivered.tally)
    _epoch_rng: torch.Tensor | None = None  # the generator's state when it started
    _pending: tuple[int, torch.Tensor] | None = None  # (batches to skip, generator state)
    _skipped = 0  # batches of the latest epoch skipped by a restored state

    def _start_epoch(self, make_tasks: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        """The tasks of the epoch starting now (``make_tasks()``, which draws the
        sampler's order), past the batches a restored state skips; the generator is put
        back as the state has it before anything draws from it."""
        pending, self._pending = self._pending, None
        if pending is not None:
            _set_rng_state(self, pending[1])
        self._epoch_rng = _rng_state(self)
        self._skipped = pending[0] if pending is not None else 0
        tasks = make_tasks()
        if not self._skipped:
            return tasks
        return itertools.islice(tasks, self._skipped, None)

    def _follow(self, delivered: Any) -> None:
        self._live = delivered.tally  # not the iteration: dropped, it stops its workers

    def _finished(self, yielded: int) -> bool:
        """Whether ``yielded`` batches are the whole epoch (unknown without a length)."""
        try:
            return yielded >= len(self)  # type: ignore[arg-type]
        except TypeError:
            return False

    def state_dict(self) -> dict[str, Any]:
        """The position to resume from: ``{"format": "fastload.torch_loader/1",
        "batches_yielded": k, "generator": the generator's state when the epoch started
        (a uint8 tensor, or None), "sampler_epoch": its sampler's epoch (or None),
        "batch_size", "world_size"}``; ``k`` counts the epoch's batches delivered (0 when
        none was, or when the epoch was delivered whole: the next one starts anew)."""
        if self._pending is not None:  # restored, not iterated yet: the restored position
            return self._state(self._pending[0], self._pending[1])
        live = self._live
        yielded = 0 if live is None else live[0] + self._skipped
        finished = live is None or self._finished(yielded)
        return self._state(0, None) if finished else self._state(yielded, self._epoch_rng)

    def _state(self, yielded: int, generator: torch.Tensor | None) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "batches_yielded": yielded,
            "generator": generator,
            "sampler_epoch": getattr(_sampler_of(self), "epoch", None),
            "batch_size": getattr(self, "batch_size", None),
            "world_size": _world(self),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state`` (from ``state_dict``, on this or another world size): the
        next ``iter()`` continues at the batch after the saved one. Raises ``TypeError``
        for something that is not a dict, ``ValueError`` for another format, an
        iterable dataset stopped mid-epoch (it cannot be fast-forwarded), or a position
        that is not a whole number of this loader's global batches."""
        if not isinstance(state, Mapping):
            raise TypeError(
                f"load_state_dict takes the dict that state_dict() returned, got "
                f"{type(state).__name__}"
            )
        if state.get("format") != FORMAT:
            raise ValueError(
                f"not a state of fastload.torch.DataLoader: its format is "
                f"{state.get('format')!r}, expected {FORMAT!r}"
            )
        missing = sorted(_KEYS - set(state))
        if missing:
            raise ValueError(f"the state lacks {missing}: pass what state_dict() returned")
        skip = self._skip_of(state)  # checked before anything of the loader changes
        sampler = _sampler_of(self)
        if state["sampler_epoch"] is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(state["sampler_epoch"])
        self._pending = (skip, state["generator"]) if state["generator"] is not None else None
        self._live = None

    def _skip_of(self, state: Mapping[str, Any]) -> int:
        """Batches of this loader's epoch that the state's position has consumed."""
        k = int(state["batches_yielded"])
        if k and getattr(self, "_iterable", False):
            raise ValueError(
                "a state taken mid-epoch of an IterableDataset cannot be resumed: the "
                "dataset cannot be fast-forwarded; take the state at the end of an epoch"
            )
        saved = (state["batch_size"] or 1) * int(state["world_size"])
        mine = (getattr(self, "batch_size", None) or 1) * _world(self)
        if k * saved % mine:
            raise ValueError(
                f"the state was saved after {k} batches of a global batch of {saved} "
                f"(batch_size {state['batch_size']} on {state['world_size']} ranks); this "
                f"loader's global batch is {mine}, which does not divide that position "
                f"{k * saved}: resume with batch_size * world_size = {saved}"
            )
        return k * saved // mine
