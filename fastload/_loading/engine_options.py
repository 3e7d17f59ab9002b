"""How an ``Engine`` loads, as two frozen values checked once when they are made (as
Grain's ``ReadOptions`` and ``MultiprocessingOptions``): ``EngineOptions`` for every
engine, ``ProcessOptions`` for one that loads in worker processes. ``check_parallel`` is
the one check of ``parallel=``, for every loader that takes it.

Each option keeps the name of the user's keyword from the loader down to the worker pool
(``parallel``, ``lean``, ``split_steps``, ``worker_init``, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from numbers import Integral
from typing import Any, Literal, TypeAlias

import numpy as np

from .._base.arguments import check_flag, is_flag, is_size

__all__ = [
    "Allocator",
    "Backend",
    "EngineOptions",
    "OnError",
    "ProcessOptions",
    "check_parallel",
    "worker_options",
]

# ``allocator(shape, dtype) -> array``: how the arrays of a ring are made (``numpy.empty``).
Allocator: TypeAlias = Callable[[tuple[int, ...], np.dtype[Any]], np.ndarray]
# ``on_error=``: raise a LoadError, or skip the observations that fail to load.
OnError: TypeAlias = Literal["raise", "skip"]
# ``backend=``: load on threads of the native pool, or in worker processes.
Backend: TypeAlias = Literal["thread", "process"]


def check_parallel(parallel: Any) -> bool | int:
    """``parallel`` as False (False or 0, MLUtils' spelling: the caller's thread), True
    (every thread of the pool, or a worker process per CPU) or a number >= 1 of threads
    (or of worker processes). Raises ``ValueError`` for anything else (a float, a string,
    a negative number)."""
    if is_flag(parallel):
        return bool(parallel)
    if is_size(parallel) and parallel >= 0:
        return int(parallel) or False
    raise ValueError(f"parallel must be False, True or a number of threads >= 1, got {parallel!r}")


@dataclass(frozen=True)
class EngineOptions:
    """How an engine loads (see ``Engine`` for what each option means), validated.

    ``parallel`` is stored as ``check_parallel`` gives it (0 as False). Raises
    ``ValueError`` for a value out of range (``prefetch=0``, ``on_error="ignore"``,
    ``backend="process"`` without ``parallel``) and ``TypeError`` for a flag that is not
    a bool.
    """

    parallel: bool | int = False
    buffer: bool = False
    ordered: bool = True
    prefetch: int | None = None
    on_error: OnError = "raise"
    backend: Backend = "thread"
    lean: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # a frozen dataclass normalizes its fields this way
        set_(self, "parallel", check_parallel(self.parallel))
        set_(self, "buffer", check_flag("buffer", self.buffer))
        set_(self, "ordered", check_flag("ordered", self.ordered))
        set_(self, "lean", check_flag("lean", self.lean))
        prefetch = self.prefetch
        if prefetch is not None and (not is_size(prefetch) or prefetch < 1):
            raise ValueError(f"prefetch must be a positive int or None, got {prefetch!r}")
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")
        if self.backend not in ("thread", "process"):
            raise ValueError(f"backend must be 'thread' or 'process', got {self.backend!r}")
        if self.backend == "process" and self.parallel is False:
            raise ValueError("backend='process' needs parallel=True or a number of workers")


@dataclass(frozen=True)
class ProcessOptions:
    """How worker processes load (``backend="process"``; see ``Engine``), validated.

    ``worker_init(worker_id)`` runs once in each worker after it is forked;
    ``timeout``: the most seconds to wait for a step (None: no limit); ``split_steps``:
    spread each step's rows over the workers (False: step k to worker k mod n);
    ``lend``: hand whole steps out as arrays over their slot, with no copy.

    Raises ``TypeError`` for a ``worker_init`` that is not callable or a flag that is not
    a bool, ``ValueError`` for a ``timeout`` that is not a positive number of seconds.
    """

    worker_init: Callable[[int], None] | None = None
    timeout: float | None = None
    split_steps: bool = True
    lend: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        worker_init, timeout = self.worker_init, self.timeout
        if worker_init is not None and not callable(worker_init):
            raise TypeError(f"worker_init must be a callable of the worker id, got {worker_init!r}")
        if timeout is not None and (
            not isinstance(timeout, (Integral, float)) or isinstance(timeout, bool) or timeout <= 0
        ):
            raise ValueError(
                f"timeout must be a positive number of seconds or None, got {timeout!r}"
            )
        set_(self, "split_steps", check_flag("split_steps", self.split_steps))
        set_(self, "lend", check_flag("lend", self.lend))


def worker_options(
    options: EngineOptions, processes: ProcessOptions | None
) -> ProcessOptions | None:
    """The ``ProcessOptions`` an engine with ``options`` runs its worker processes with:
    ``processes``, the defaults when ``backend="process"`` comes without them, None on
    threads. Raises ``ValueError`` for ``lend=True`` without worker processes or with
    ``buffer=True``, and for process options given to threads."""
    if (
        processes is not None
        and processes.lend
        and (options.backend != "process" or options.buffer)
    ):
        raise ValueError(
            "lend=True lends the slots of worker processes' ring: it needs "
            "backend='process' and buffer=False"
        )
    if options.backend != "process":
        if processes is not None:
            raise ValueError(
                "worker_init, timeout, split_steps and lend act on worker processes: use "
                "backend='process'"
            )
        return None
    return processes if processes is not None else ProcessOptions()
