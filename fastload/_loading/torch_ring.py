"""The ``"process-ring"`` path of ``fastload.torch.DataLoader``: a Python map-style dataset
loaded in fastload's worker processes (the engine's ``backend="process"``), each batch
filled in place into a slot of a shared-memory ring and lent to the caller as tensors over
the slot (``ProcessOptions(lend=True)``: reused once they are dropped), under PyTorch's
worker contract (``worker_setup`` in ``torch_workers.py``).

::

    probe_first(dataset)        a forked process reads dataset[0] once: the shapes
        | FirstKnown(dataset, observation 0)
        v
    Engine(EngineOptions(backend="process", lean=True, ...),
           ProcessOptions(worker_init=worker_setup(...), timeout=..., split_steps=False,
                          lend=True))
        | worker k: seeds, get_worker_info(), worker_init_fn(k); then whole steps
        | k, k + n, ... (not split over the workers: PyTorch's turns)
        v
    RingBatches: the engine's batches as default_collate makes them; its errors in
    PyTorch's words

The dataset's code never runs in the caller's process (as with PyTorch's workers): the
probe that reads observation 0 runs in a process of its own, without the worker setup
(``get_worker_info()`` is None there, as in the caller), and what it returns gives the
ring its shapes. Every later observation must have the same structure, shapes and dtypes;
one that differs raises ``LoadError`` saying how to load it on the ``"process"`` path.
"""

from __future__ import annotations

import multiprocessing
import pickle
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.utils.data as tud

from .._base.children import WorkerDied, WorkerError, death_message, end_processes, rebuilt, start
from .._base.tree import map_tree
from ..errors import LoadError
from ..obs import copy_into
from ..tensors import numpy_view
from .engine import Engine
from .plan import MisfitError
from .torch_batches import as_collated
from .workers import InitError

__all__ = ["FirstKnown", "RingBatches", "fits_ring", "per_item", "probe_first"]

# The probe reading observation 0 is given up after _PROBE_IDLE_S without using the CPU
# (blocked: on a lock, or on workers that do not exist there) or after _PROBE_S in all:
# measured on its CPU time rather than on the clock alone, so that a first item that is
# slow to compute, or a busy machine, does not change the path.
_PROBE_IDLE_S = 5.0
_PROBE_S = 60.0
_PROBE_POLL_S = 0.25
_INT64 = (-(2**63), 2**63)


def per_item(dataset: Any) -> bool:
    """True when PyTorch would fetch ``dataset``'s batches item by item: it has no
    ``__getitems__`` of its own (``Subset``'s, over such a dataset, reads item by item)."""
    while isinstance(dataset, tud.Subset):
        dataset = dataset.dataset
    return not hasattr(dataset, "__getitems__")


def _probe_main(dataset: Any, conn: Any) -> None:
    try:
        reply: tuple[str, Any] = ("ok", dataset[0])
        blob = pickle.dumps(reply)
    except Exception:  # the queue-based path will raise it where PyTorch would
        blob = pickle.dumps(("failed", None))
    conn.send_bytes(blob)


def probe_first(dataset: Any) -> tuple[bool, Any]:
    """``(True, dataset[0])`` read in a forked process, or ``(False, None)`` when that
    raised, crashed, or was given up (``_answered``)."""
    context = multiprocessing.get_context("fork")
    mine, theirs = context.Pipe(duplex=False)
    proc = start(context, _probe_main, (dataset, theirs), "fastload-torch-probe")
    theirs.close()  # so that a probe that dies is seen as the end of the pipe
    try:
        if not _answered(mine, proc.pid):
            return False, None
        kind, value = pickle.loads(mine.recv_bytes())
    except (EOFError, OSError, pickle.UnpicklingError):
        return False, None
    finally:
        end_processes([proc], 0.0)
        mine.close()
    return kind == "ok", value


def _answered(conn: Any, pid: int) -> bool:
    """Waits for the probe's reply (or the end of its pipe): True when it came, False
    when the probe went ``_PROBE_IDLE_S`` seconds without using the CPU (``_PROBE_IDLE_S``
    in all where its CPU time cannot be read), or took ``_PROBE_S`` seconds."""
    began = busy = time.monotonic()
    used = _cpu_ticks(pid)
    while not conn.poll(_PROBE_POLL_S):
        now, ticks = time.monotonic(), _cpu_ticks(pid)
        if ticks is not None and ticks != used:
            used, busy = ticks, now
        if now - busy > _PROBE_IDLE_S or now - began > _PROBE_S:
            return False
    return True


def _cpu_ticks(pid: int) -> int | None:
    """The CPU time process ``pid`` used so far, in clock ticks (Linux's ``/proc``), or
    None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime
    except (OSError, IndexError, ValueError):
        return None


def fits_ring(obs: Any) -> bool:
    """True when the ring holds ``obs`` exactly as ``default_collate`` batches it: numpy
    arrays and scalars, CPU tensors, Python ints (64-bit), floats and bools, of bool, int,
    uint, float or complex dtypes, through tuples, namedtuples and dicts. Strings, lists,
    None and other objects: False (PyTorch's own way, on the ``"process"`` path)."""
    if isinstance(obs, (bool, float)):
        return True
    if isinstance(obs, int):
        return _INT64[0] <= obs < _INT64[1]
    if type(obs) is torch.Tensor:
        view = numpy_view(obs)
        return view is not None and _plain(view.dtype)
    if type(obs) in (np.ndarray, np.memmap) or isinstance(obs, np.generic):
        return _plain(obs.dtype)
    if (
        type(obs) is dict
        or type(obs) is tuple
        or (isinstance(obs, tuple) and hasattr(obs, "_fields"))
    ):
        values = obs.values() if isinstance(obs, dict) else obs
        return len(obs) > 0 and all(fits_ring(value) for value in values)
    return False


def _as_array(leaf: Any) -> Any:
    """A CPU tensor as the numpy array sharing its memory; any other leaf as it is."""
    return numpy_view(leaf) if type(leaf) is torch.Tensor else leaf


def _plain(dtype: np.dtype[Any]) -> bool:
    return dtype.kind in "biufc" and dtype.isnative


class FirstKnown:
    """A map-style dataset whose observation 0 the probe read already: the plans made in
    the caller and in the workers take their shapes from it (``getobs(data, 0)``), so that
    the caller runs none of the dataset's code; every item loaded (``getobs_into``) is
    read from the dataset itself, in a worker. Its tensors are planned as numpy arrays
    (``default_collate`` makes both tensors alike, and ``as_collated`` does so here), so
    that a batch's tensors are its slot in the ring, with no copy."""

    def __init__(self, dataset: Any, first: Any) -> None:
        self.dataset = dataset
        self.first = map_tree(_as_array, first)

    def __len__(self) -> int:
        return len(self.dataset)

    def __numobs__(self) -> int:  # asked first by numobs, for every item a worker loads
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        return self.first if i == 0 else self.dataset[i]

    def __getobs_into__(self, buffer: Any, i: int) -> Any:
        return copy_into(buffer, self.dataset[i])


class RingBatches:
    """The batches of one epoch on the ring: as ``default_collate`` makes them, with the
    engine's errors raised as PyTorch raises a worker's (the type of the exception raised
    by the dataset or ``worker_init_fn``, ``RuntimeError`` for a dead worker or a timeout).
    An error ends the epoch (``on_end`` runs then, and after the last batch)."""

    def __init__(
        self, iteration: Any, engine: Engine, timeout: float, on_end: Callable[[], None]
    ) -> None:
        self.iteration = iteration
        self.engine = engine
        self.timeout = timeout
        self.on_end = on_end

    def __iter__(self) -> RingBatches:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self.iteration)
        except StopIteration:
            self.on_end()
            raise
        except LoadError as error:
            self.on_end()
            raise _reraised(error) from error
        except WorkerDied as error:
            self.on_end()
            raise RuntimeError(
                f"{death_message(error, pytorch=True)}: a crash in the dataset's code (a "
                f"segmentation fault, an abort), or the worker was killed, often for memory"
            ) from error
        except TimeoutError as error:
            self.on_end()
            raise RuntimeError(f"DataLoader timed out after {self.timeout} seconds") from error
        except Exception as error:
            init = _init_error(error)
            if init is None:
                raise
            self.on_end()
            raise rebuilt(
                RuntimeError if error is init else type(error),
                f"Caught {init.name} in DataLoader worker process {init.worker}.\nOriginal {init}",
            ) from error
        return as_collated(batch)


def _init_error(error: BaseException | None) -> InitError | None:
    """What ``worker_init_fn`` raised in a worker (its type, worker and traceback), when
    that is what ``error`` is."""
    while error is not None:
        if isinstance(error, InitError):
            return error
        error = error.__cause__
    return None


def _reraised(error: LoadError) -> BaseException:
    """What PyTorch raises for ``error``: an exception of the dataset's own type with the
    worker's traceback; for an observation unlike observation 0, what to do about it."""
    cause = error.__cause__
    if isinstance(cause, MisfitError):
        return LoadError(
            f"{error}. On the 'process-ring' path every batch takes the structure, shapes "
            "and dtypes of observation 0; for observations whose shapes differ between "
            "batches give collate_fn=torch.utils.data.default_collate, which loads them on "
            "the 'process' path",
            index=error.index,
        )
    if cause is None or isinstance(cause, WorkerError):
        return error  # not a type to rebuild: the LoadError, with the worker's traceback
    text = cause.__cause__ if isinstance(cause.__cause__, WorkerError) else cause
    return rebuilt(
        type(cause),
        f"Caught {type(cause).__name__} in a DataLoader worker process loading "
        f"observation {error.index}.\nOriginal {text}",
    )
