"""The keyword arguments that fastload spells differently or does not need: PyTorch
DataLoader's and MLUtils.jl's. A loader given any raises one ``TypeError`` that names
each of them and says what to write instead."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["MLUTILS_KEYWORDS", "PYTORCH_KEYWORDS", "refuse_unknown_keywords"]

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

MLUTILS_KEYWORDS = {
    "batchsize": "use batch_size=",
    "partial": "use drop_last= (drop_last=True is partial=false)",
    "rng": "use seed= (an int): random draws come from the seed alone, never from a "
    "generator's state",
    "obsdim": "observations lie along the first axis: move yours there with "
    "numpy.moveaxis(x, obsdim, 0)",
}

_ORIGINS = (
    (PYTORCH_KEYWORDS, "a PyTorch DataLoader argument"),
    (MLUTILS_KEYWORDS, "MLUtils' name"),
)


def _complaint(what: str, name: str, hints: Mapping[str, str]) -> str:
    """What to say about ``name``: its hint when the name is known, else that it is
    unexpected."""
    if name in hints:
        return f"{name}= ({hints[name]})"
    for table, origin in _ORIGINS:
        if name in table:
            return f"{name}= ({origin}): {table[name]}"
    return f"unexpected keyword argument {name!r}"


def refuse_unknown_keywords(
    what: str, keywords: Iterable[str], hints: Mapping[str, str] | None = None
) -> None:
    """Raise one ``TypeError`` for all of ``keywords`` (names ``what`` does not take),
    saying for each what fastload calls it when it is PyTorch's or MLUtils' (or in
    ``hints``, the function's own translations). Returns when ``keywords`` is empty."""
    names = list(keywords)
    if not names:
        return
    complaints = [_complaint(what, name, hints or {}) for name in names]
    if len(complaints) == 1:
        complaint = complaints[0]
        prefix = "got an " if complaint.startswith("unexpected") else "has no "
        raise TypeError(f"{what}() {prefix}{complaint}")
    listed = "; ".join(complaints)
    raise TypeError(f"{what}() does not take {len(names)} of the keywords given: {listed}")
