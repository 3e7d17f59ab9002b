"""The keywords a loader takes, and those it refuses.

A loader's keywords are written once, as the fields of a frozen dataclass (name, type,
default, what it means); ``keywords_of`` and ``init_keywords_of`` give a function that
takes ``**options`` the signature of those fields, for ``help()``, ``inspect`` and type
checkers alike. The keyword arguments that fastload spells differently or does not need,
PyTorch DataLoader's and MLUtils.jl's, are refused: a loader given any raises one
``TypeError`` that names each of them and says what to write instead.
"""

from __future__ import annotations

import dataclasses
import inspect
import textwrap
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Concatenate, ParamSpec, TypeVar

__all__ = [
    "MLUTILS_KEYWORDS",
    "PYTORCH_KEYWORDS",
    "documented_fields",
    "init_keywords_of",
    "keywords_of",
    "refuse_unknown_keywords",
    "taken_keywords",
]

_P = ParamSpec("_P")
_R = TypeVar("_R")
_D = TypeVar("_D")
_S = TypeVar("_S")

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


def _with_fields(f: Callable[..., Any], options: Any) -> None:
    """Give ``f`` the signature and annotations of its own parameters with its
    ``**options`` replaced by the fields of the dataclass ``options`` it does not name
    itself, as keyword-only parameters (their types resolved where ``options`` is
    written, for ``typing.get_type_hints``)."""
    own = inspect.signature(f)
    params = [p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD]
    named = {p.name for p in params}
    fields = [fl for fl in dataclasses.fields(options) if fl.init and fl.name not in named]
    params += [
        inspect.Parameter(
            fl.name, inspect.Parameter.KEYWORD_ONLY, default=fl.default, annotation=fl.type
        )
        for fl in fields
    ]
    types = typing.get_type_hints(options)
    annotations = {k: v for k, v in f.__annotations__.items() if k in named or k == "return"}
    f.__annotations__ = {**annotations, **{fl.name: types[fl.name] for fl in fields}}
    f.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]


def keywords_of(
    options: Callable[_P, object],
) -> Callable[[Callable[Concatenate[_D, ...], _R]], Callable[Concatenate[_D, _P], _R]]:
    """Decorate ``f(data, **options)`` to take the fields of the dataclass ``options`` as
    keywords: its signature (``inspect.signature``, ``help()``) and its type are those
    fields' names, types and defaults. ``f`` builds its options with ``taken_keywords``."""

    def decorate(f: Callable[Concatenate[_D, ...], _R]) -> Callable[Concatenate[_D, _P], _R]:
        _with_fields(f, options)
        return f

    return decorate


def init_keywords_of(
    options: Callable[_P, object],
) -> Callable[[Callable[Concatenate[_S, _D, ...], None]], Callable[Concatenate[_S, _D, _P], None]]:
    """``keywords_of`` for a class's ``__init__(self, data, ...)``; parameters it names
    itself (``batch_size=1``, positional) stay as it writes them."""

    def decorate(
        f: Callable[Concatenate[_S, _D, ...], None],
    ) -> Callable[Concatenate[_S, _D, _P], None]:
        _with_fields(f, options)
        return f

    return decorate


def taken_keywords(
    what: str, options: type, keywords: Mapping[str, Any], hints: Mapping[str, str]
) -> dict[str, Any]:
    """``keywords`` when each is a field of the dataclass ``options``; raises one
    ``TypeError`` for all of those that are not (``refuse_unknown_keywords``)."""
    fields = {field.name for field in dataclasses.fields(options) if field.init}
    refuse_unknown_keywords(what, [k for k in keywords if k not in fields], hints)
    return dict(keywords)


def documented_fields(options: Any, f: Callable[..., Any] | None = None) -> str:
    """The fields of the dataclass ``options`` as a docstring's list: name, default (as
    ``f``'s signature gives it, when ``f`` is given) and what each means (its
    ``metadata["doc"]``), wrapped for ``help()``."""
    given = {} if f is None else inspect.signature(f).parameters
    lines = []
    for field in dataclasses.fields(options):
        if field.init:
            default = given[field.name].default if field.name in given else field.default
            doc = field.metadata.get("doc", "")
            item = f"- ``{field.name}`` (default ``{default!r}``): {doc}."
            lines.append(textwrap.fill(item, 88, initial_indent="    ", subsequent_indent="      "))
    return "\n".join(lines)
