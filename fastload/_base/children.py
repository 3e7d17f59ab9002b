"""The processes fastload starts (loader workers, the drop-in's queue workers and probe, the
writer's encoders) and how they talk to their parent: one toolkit for every transport.

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
- **Workers with pipes** (the loader's and the writer's): ``fork_workers`` forks them, each
  with a pipe, and returns the parent's side, ``Pipes``. A worker ignores Ctrl-C (its
  parent handles it) and answers messages in ``serve`` until it is sent ``Stop``, its pipe
  ends, or its parent is gone. Every wait of the parent (``Pipes.receive``) is a timed wait
  on the pipes and the process sentinels together: a worker that dies raises
  ``WorkerDied`` at once, and Ctrl-C always gets through.
- **A process's end in words** (``death_message``): fastload's, or PyTorch's for the
  drop-in's errors.
- **An exception raised in a child travels to its parent**: ``describe_error`` (in the
  child) and ``remote_error`` (in the parent) rebuild it and its ``__cause__`` chain, with
  the child's traceback (a ``WorkerError``) as the last cause; ``ChildError`` carries its
  type and traceback text as PyTorch does, and ``rebuilt`` raises it with that type.
- **Messages of one iteration carry its generation** (``Tagged``): a child drops work of a
  generation that is no longer live, and the parent drops replies of another generation,
  so an iteration left before its end never mixes with the next.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, NoReturn

__all__ = [
    "ChildError",
    "Pipes",
    "Stop",
    "Tagged",
    "WorkerDied",
    "WorkerError",
    "death_message",
    "describe_error",
    "end_processes",
    "fork_workers",
    "orphaned",
    "rebuilt",
    "remote_error",
    "serve",
    "start",
]

_WATCH_S = 0.2  # how often the watchdog checks that the parent is alive
_PARENT_CHECK_S = 1.0  # how often an idle worker (``serve``) checks that its parent is alive
_ASKED_S = 1.0  # time given to piped workers asked to stop before they are killed
_REAP_S = 60.0  # most time to wait for a killed process to be gone
_CHAIN = 8  # most exceptions of a __cause__ chain sent to the parent
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


def start(
    context: Any,
    target: Callable[..., None],
    args: tuple[Any, ...],
    name: str,
    ignore_interrupt: bool = False,
) -> Any:
    """A started daemon process of the multiprocessing ``context`` (fork, spawn or
    forkserver) running ``target(*args)`` as a child of fastload's (see the module
    docstring). ``ignore_interrupt``: the child ignores SIGINT (Ctrl-C) from its first
    instruction on: SIGINT is blocked while it is started, so that one that comes before
    the child says it ignores it waits, then goes to the parent or is dropped in the
    child, rather than raising in the child's start-up."""
    with _starting:
        parent = _Parent(
            os.getpid(),
            threading.current_thread() is threading.main_thread(),
            context.get_start_method() != "forkserver",
            gc.isenabled(),
        )
        before = _block_interrupts()
        try:
            proc = context.Process(
                target=_child_main,
                args=(parent, ignore_interrupt, before, target, *args),
                daemon=True,
                name=name,
            )
            gc.disable()  # so that no collection runs in the child before it freezes
            proc.start()
        finally:
            _restore_interrupts(before)
            if parent.collects:
                gc.enable()
    return proc


def _block_interrupts() -> set[int | signal.Signals] | None:
    """Block SIGINT in this thread (a child forked now starts with it blocked); the mask
    before, None where signals cannot be masked."""
    if not hasattr(signal, "pthread_sigmask"):
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def _restore_interrupts(mask: set[int | signal.Signals] | None) -> None:
    if mask is not None and signal.SIGINT not in mask:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def orphaned() -> bool:
    """In a child made by ``start``: True once its parent is gone."""
    return _parent_pid is not None and os.getppid() != _parent_pid


def _child_main(
    parent: _Parent,
    ignore_interrupt: bool,
    mask: set[int | signal.Signals] | None,
    target: Callable[..., None],
    *args: Any,
) -> None:
    if ignore_interrupt:
        # Ctrl-C in a terminal reaches the whole process group: the parent handles it and
        # stops the workers; a worker killed by it would only turn it into a second error.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _restore_interrupts(mask)  # as blocked by ``start``: one pending is dropped or raised
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


# Workers with pipes: the parent's side.


def fork_workers(
    count: int,
    target: Callable[..., None],
    name: str,
    args_of: Callable[[int], tuple[Any, ...]],
    doing: str,
) -> Pipes:
    """Forks ``count`` daemon processes (started by ``start``: they die with this
    process); worker k runs ``target(conn, *args_of(k))`` with ``conn`` its end of a pipe,
    Ctrl-C ignored. ``doing`` names what cannot continue when one dies ("the write"). The
    children's ends are closed here, so that a dead worker is seen as the end of its
    pipe."""
    context = multiprocessing.get_context("fork")
    pipes = [context.Pipe() for _ in range(count)]
    procs = []
    try:
        for k, (_, theirs) in enumerate(pipes):
            others = [end for pipe in pipes for end in pipe if end is not theirs]
            args = (theirs, others, target, *args_of(k))
            procs.append(start(context, _piped_main, args, f"{name}-{k}", True))
    finally:
        for _, theirs in pipes:
            theirs.close()
    return Pipes(procs, [mine for mine, _ in pipes], doing)


class WorkerDied(RuntimeError):
    """A worker process ended while its parent waited on it: ``pid`` and ``exitcode``
    (negative: the signal that killed it) say which and how."""

    def __init__(self, message: str, pid: int | None, exitcode: int | None) -> None:
        super().__init__(message)
        self.pid = pid
        self.exitcode = exitcode


class Pipes:
    """The parent's side of the workers ``fork_workers`` forked: their processes
    (``procs``), the parent's ends of their pipes (``conns``), and the replies due from
    each (``outstanding``: ``request`` counts one, ``receive`` takes it off)."""

    def __init__(self, procs: list[BaseProcess], conns: list[Connection], doing: str) -> None:
        self.procs, self.conns, self.doing = procs, conns, doing
        self.outstanding = [0] * len(procs)

    def send(self, worker: int, message: Any) -> None:
        """Send ``message`` to ``worker``, which does not reply to it; ``WorkerDied``
        when the worker is gone."""
        try:
            self.conns[worker].send(message)
        except OSError:
            self.died(self.procs[worker])

    def request(self, worker: int, message: Any) -> None:
        """Send ``message`` to ``worker``, which replies to it once."""
        self.send(worker, message)
        self.outstanding[worker] += 1

    def receive(self, wait: float | None) -> list[tuple[int, Any]]:
        """Replies that arrived within one timed wait of ``wait`` seconds, as (worker,
        message); ``WorkerDied`` when a worker died."""
        procs, conns = self.procs, self.conns
        ready = multiprocessing.connection.wait([*conns, *(p.sentinel for p in procs)], wait)
        replies = []
        for k, conn in enumerate(conns):
            if conn in ready:
                try:
                    replies.append((k, conn.recv()))
                except (EOFError, OSError):
                    self.died(procs[k])
                self.outstanding[k] -= 1
        for proc in procs:
            if proc.sentinel in ready:
                self.died(proc)
        return replies

    def died(self, proc: BaseProcess) -> NoReturn:
        """Raise ``WorkerDied`` for ``proc``, once it is seen dead (a second at most)."""
        proc.join(1.0)
        raise WorkerDied(
            f"{death_message(proc)}; {self.doing} cannot continue (a worker killed "
            f"for memory is a common cause)",
            proc.pid,
            proc.exitcode,
        )

    def close(self, graceful: bool, parent: int | None = None) -> None:
        """Stop the workers: ask them to (``graceful``: they are sent ``Stop``), then kill
        what is left (``end_processes``). With ``parent`` (the pid that forked them),
        nothing happens in another process: one forked while they were alive (a worker of
        another loader) holds a copy of them, whose finalizer runs there too."""
        if parent is not None and parent != os.getpid():
            return
        if graceful:
            for conn in self.conns:
                try:
                    conn.send(Stop())
                except (OSError, ValueError):
                    pass
        end_processes(self.procs, _ASKED_S if graceful else 0.0)
        for conn in self.conns:
            conn.close()


def end_processes(procs: Sequence[BaseProcess], wait: float) -> None:
    """Give ``procs`` (asked to end) ``wait`` seconds in all to end, then kill those still
    running, and wait until all are gone."""
    if wait > 0:
        deadline = time.monotonic() + wait
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    for proc in procs:
        # A killed process cannot refuse to die; waiting for it only waits for the kernel
        # to tear it down (seconds for a large address space on a loaded machine).
        proc.join(_REAP_S)


def death_message(proc: Any, pytorch: bool = False) -> str:
    """How worker process ``proc`` (anything with ``pid`` and ``exitcode``) ended, in
    fastload's words, or in PyTorch's (``pytorch``: the drop-in's errors)."""
    code = proc.exitcode
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = None
        if pytorch:
            return f"DataLoader worker (pid {proc.pid}) is killed by signal: {name or -code}"
        how = f"was killed by {name}" if name else f"was killed by signal {-code}"
        return f"fastload worker process {proc.pid} {how}"
    if pytorch:
        return f"DataLoader worker (pid {proc.pid}) exited unexpectedly with exit code {code}"
    return f"fastload worker process {proc.pid} exited with code {code}"


# Workers with pipes: the worker's side.


@dataclass(frozen=True, slots=True)
class Stop:
    """End the worker (``serve`` returns)."""


@dataclass(frozen=True, slots=True)
class Tagged:
    """A message of the iteration of generation ``gen`` (each iteration of a set of
    workers takes the next): what a worker does for a generation that is no longer live
    is abandoned or dropped, and so are its replies, so that an iteration left before its
    end never mixes with the next."""

    gen: int


def serve(conn: Connection, answer: Callable[[Any], Any]) -> None:
    """A worker's loop: each message from the parent to ``answer``, whose result is sent
    back (None: no reply), until ``Stop``, the end of the pipe, or the parent is gone."""
    while True:
        if not conn.poll(_PARENT_CHECK_S):
            if orphaned():
                return
            continue
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if isinstance(message, Stop):
            return
        reply = answer(message)
        if reply is None:
            continue
        try:
            conn.send(reply)
        except (BrokenPipeError, ConnectionResetError):
            return  # the parent is gone: nobody wants the reply


def _piped_main(
    conn: Connection, others: Sequence[Connection], target: Callable[..., None], *args: Any
) -> None:
    for other in others:
        other.close()  # so that a worker sees EOF when the parent's end closes
    target(conn, *args)


# Exceptions raised in a child, raised again in its parent.


class WorkerError(Exception):
    """The traceback text of an exception raised in a worker process."""


def describe_error(exc: BaseException) -> tuple[str, str, list[bytes | None]]:
    """(message, traceback text, pickled exceptions) of ``exc``, for the parent
    (``remote_error``): the exception and its ``__cause__`` chain, each pickled on its own
    (None where it does not pickle), since pickling an exception drops its cause."""
    message = f"{type(exc).__name__}: {exc}"
    text = "".join(traceback.format_exception(exc))
    chain: list[bytes | None] = []
    cause: BaseException | None = exc
    while cause is not None and len(chain) < _CHAIN:
        try:
            chain.append(pickle.dumps(cause))
        except Exception:
            chain.append(None)
        cause = cause.__cause__
    return message, text, chain


def remote_error(
    text: str, chain: Sequence[bytes | None] | None, remote: BaseException | None = None
) -> BaseException:
    """The worker's exception and its causes (``describe_error``), as far as they
    unpickle, linked again as they were; the last has the worker's traceback text
    (``remote``, by default a ``WorkerError`` of ``text``) as its cause. Only that when the
    exception itself does not unpickle."""
    remote = WorkerError(text) if remote is None else remote
    exceptions = []
    for blob in chain or []:
        try:
            exc = pickle.loads(blob) if blob is not None else None
        except Exception:
            exc = None
        if not isinstance(exc, BaseException):
            break
        exceptions.append(exc)
    for exc, cause in zip(exceptions, exceptions[1:] + [remote]):
        exc.__cause__ = cause
    return exceptions[0] if exceptions else remote


class ChildError:
    """An exception raised in a child, described for its parent as PyTorch describes a
    worker's: its type (when the type can be pickled) and a message with the child's
    traceback text (``where``: "in DataLoader worker process 3")."""

    def __init__(self, exc: BaseException, where: str) -> None:
        text = "".join(traceback.format_exception(exc))
        self.message = f"Caught {type(exc).__name__} {where}.\nOriginal {text}"
        self.type: type[BaseException] | None = type(exc)
        try:
            pickle.dumps(self.type)
        except (pickle.PicklingError, AttributeError, TypeError):
            self.type = None  # a local class: re-raised as RuntimeError

    def reraise(self) -> NoReturn:
        raise rebuilt(self.type or RuntimeError, self.message)


def rebuilt(exc_type: type[BaseException], message: str) -> BaseException:
    """An exception of ``exc_type`` carrying ``message`` (a child's traceback text), as
    PyTorch re-raises a worker's; ``RuntimeError`` for a type that wants other arguments."""
    if exc_type is KeyError:
        message = _KeyErrorMessage(message)
    try:
        return exc_type(message)
    except TypeError:
        return RuntimeError(message)


class _KeyErrorMessage(str):
    """KeyError prints its argument's repr; this keeps the traceback readable."""

    def __repr__(self) -> str:
        return str(self)
