"""The processes fastload starts (loader workers, the drop-in's probe, the writer's
encoders): each leaves its parent's objects alone and dies with its parent.

- **No finalizer of the parent's runs in a child.** A forked child holds a copy of every
  object of its parent, garbage not yet collected included (a PyTorch iterator dropped in a
  reference cycle, say). Collected in the child, such an object's ``__del__`` or
  ``weakref.finalize`` would act on the parent's resources from the wrong process
  (PyTorch's prints ``AssertionError: can only test a child process``). ``start`` forks
  with the collector off, and the child freezes what it inherited (``gc.freeze``) before
  it collects again: the child's collector never sees the parent's objects. A child ends
  with ``os._exit`` (multiprocessing's way): no atexit handler of the parent runs there.
- **A child dies with its parent**, even while it is stuck in the user's code: on Linux
  the kernel kills it when its parent ends (``PR_SET_PDEATHSIG``); where that cannot be
  used (not Linux, or a child started by a thread other than the main one: the signal
  would come when that thread ends), a watchdog thread sees the parent gone (the child
  adopted by another process) within ``_WATCH_S`` and ends the child. ``orphaned()``
  tells a child's idle loop the same.
- **A child keeps freed memory for the next item** (glibc): blocks under 32 MB come from
  malloc's heap, and up to 64 MB free at its top stays there (``mallopt``), the values
  glibc's own thresholds reach once it has seen such a block freed. Otherwise a worker
  gives the memory of one item's temporaries (a decoded image) back to the system and
  faults it in again for the next: on a PyTorch-style PIL dataset, a tenth of a worker's
  time went to those page faults.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["orphaned", "start"]

_WATCH_S = 0.2  # how often the watchdog checks that the parent is alive
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
_HEAP_BLOCK = 32 * 2**20  # glibc's largest dynamic mmap threshold on 64-bit
_starting = threading.Lock()  # one start at a time: the collector is off during each
_parent_pid: int | None = None  # in a child: the process whose death ends it


def _unlock_in_child() -> None:
    global _starting
    _starting = threading.Lock()  # a fork taken while a start was on copies it held


os.register_at_fork(after_in_child=_unlock_in_child)


@dataclass(frozen=True)
class _Parent:
    """What a child needs to know of the process that started it: its ``pid``, whether it
    started the child from its main thread, whether the child is its own (False: the
    child of a fork server, which ends with the parent) and whether it collects
    garbage."""

    pid: int
    main_thread: bool
    direct: bool
    collects: bool


def start(context: Any, target: Callable[..., None], args: tuple[Any, ...], name: str) -> Any:
    """A started daemon process of the multiprocessing ``context`` (fork, spawn or
    forkserver) running ``target(*args)`` as a child of fastload's (see the module
    docstring)."""
    with _starting:
        parent = _Parent(
            os.getpid(),
            threading.current_thread() is threading.main_thread(),
            context.get_start_method() != "forkserver",
            gc.isenabled(),
        )
        proc = context.Process(
            target=_child_main, args=(parent, target, *args), daemon=True, name=name
        )
        gc.disable()  # so that no collection runs in the child before it freezes
        try:
            proc.start()
        finally:
            if parent.collects:
                gc.enable()
    return proc


def orphaned() -> bool:
    """In a child made by ``start``: True once its parent is gone."""
    return _parent_pid is not None and os.getppid() != _parent_pid


def _child_main(parent: _Parent, target: Callable[..., None], *args: Any) -> None:
    gc.freeze()
    if parent.collects:
        gc.enable()
    _watch(parent)
    _keep_freed_memory()
    target(*args)


def _keep_freed_memory() -> None:
    """Let malloc keep what an item frees for the next one (see the module docstring);
    nothing where there is no glibc ``mallopt``."""
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, _HEAP_BLOCK)
    mallopt(_M_TRIM_THRESHOLD, 2 * _HEAP_BLOCK)


def _watch(parent: _Parent) -> None:
    """End this process when its parent ends: by the kernel's signal where it can be
    used, else by a watchdog thread."""
    global _parent_pid
    _parent_pid = parent.pid if parent.direct else os.getppid()
    # A fork server's child was forked by the server's one thread.
    by_signal = (parent.main_thread or not parent.direct) and _die_with_parent()
    if orphaned():  # the parent ended before the signal was asked for
        os._exit(0)
    if not by_signal:
        threading.Thread(target=_watchdog, daemon=True, name="fastload-watchdog").start()


def _die_with_parent() -> bool:
    """Ask the kernel to SIGKILL this process when its parent ends (Linux); True if it
    will."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watchdog() -> None:
    while not orphaned():
        time.sleep(_WATCH_S)
    os._exit(0)  # what the worker was doing is nobody's any more
