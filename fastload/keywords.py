"""The keyword arguments of PyTorch's DataLoader that fastload spells differently or does
not need: a loader given one raises a ``TypeError`` that says what to write instead."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["refuse_unknown_keywords"]

PYTORCH_KEYWORDS = {
    "num_workers": "use parallel=n (n native threads; parallel=True for every CPU), or "
    "parallel=n, backend='process' for Python code that holds the GIL",
    "collate_fn": "use collate= (a callable gets the list of observations; the default "
    "stacks arrays and numbers as default_collate does)",
    "pin_memory": "wrap the loader: fastload.torch.TorchLoader(loader, pin_memory=True) "
    "allocates its batch buffers in page-locked memory (needs buffer=True)",
    "pin_memory_device": "use fastload.torch.to_device(TorchLoader(loader), device)",
    "persistent_workers": "not needed: the thread pool lives as long as the process, and "
    "backend='process' keeps its workers across epochs",
    "worker_init_fn": "not needed: threads share this process's state, and "
    "backend='process' forks workers that inherit it; random draws come "
    "from (seed, epoch, index) (fastload.context.current())",
    "prefetch_factor": "use prefetch= (batches in flight in all, not per worker)",
    "generator": "use seed= (an int): every epoch's order is drawn from (seed, epoch)",
    "timeout": "not needed: a failed item raises at once, a dead worker process within a "
    "second, and Ctrl-C interrupts a wait",
    "multiprocessing_context": "use backend='process' (worker processes are forked)",
    "in_order": "use ordered=",
}


def refuse_unknown_keywords(what: str, keywords: Iterable[str]) -> None:
    """Raise ``TypeError`` for the first of ``keywords`` (names a loader does not take),
    saying what fastload calls it when it is one of PyTorch's."""
    for name in keywords:
        hint = PYTORCH_KEYWORDS.get(name)
        if hint is not None:
            raise TypeError(f"{what}() has no {name}= (a PyTorch DataLoader argument): {hint}")
        raise TypeError(f"{what}() got an unexpected keyword argument {name!r}")
