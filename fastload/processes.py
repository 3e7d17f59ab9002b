"""Loading in worker processes, for containers whose ``getobs`` is GIL-bound Python code.

``ProcessEngine`` has the interface of ``parallel.Engine`` and yields the same steps in
the same order. Workers are forked (the 'fork' start method, so lambdas and local
functions in a container work as written and the container is never pickled); each
inherits the container and the ring once, when it starts, and keeps them across epochs.
Per epoch a worker receives the index maps of the epoch's order, per job a step number
and a slot. It fills the slot in place with the Python plan; only observations that are
not arrays (a plan's "object" leaves) travel back pickled.

The ring is one anonymous shared mapping (``mmap`` MAP_SHARED) made before the fork: it
never has a name in ``/dev/shm``, so nothing is left behind whatever ends the run (a
SIGKILL included), and it is not bound by the size of ``/dev/shm`` (64 MB in Docker).

Concurrency invariants (kept by the consumer, in ``ProcessEngine``):
- a slot is free, in a worker's job queue or being filled, or held by the consumer;
- every job sent to a worker gets exactly one reply; ``_outstanding`` counts the replies
  due per worker, and a slot is reused only once its job's reply arrived, so no worker
  writes into a slot the consumer reads;
- the word at the head of the mapping holds the live generation: a worker abandons a
  job of another generation between items, so stopping an iteration is prompt;
- every wait is a timed wait on the pipes and the process sentinels together: a worker
  that dies raises in the consumer at once, and Ctrl-C always gets through.
"""
import collections
import mmap
import multiprocessing
import multiprocessing.connection
import pickle
import signal
import time
import weakref
from numbers import Integral

import numpy as np

from .errors import LoadError
from .obs import numobs
from .plan import make_plan
from .workers import Recipe, WorkerError, carve_ring, worker_main

__all__ = ["ProcessEngine"]

_WAIT_S = 0.5          # one timed wait on the pipes and sentinels
_STOP_S = 30.0         # most time to let workers abandon their jobs before killing them


def _shutdown(procs, conns, graceful):
    """Stop worker processes: ask them to (``graceful``), then kill what is left."""
    if graceful:
        for conn in conns:
            try:
                conn.send(("stop",))
            except (OSError, ValueError):
                pass
        for proc in procs:
            proc.join(1.0)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
        proc.join(5.0)
    for conn in conns:
        conn.close()


def _death_message(proc):
    code = proc.exitcode
    if code is not None and code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    return f"fastload worker process {proc.pid} {how}"


class ProcessEngine:
    """Loads the steps of a container in ``workers`` forked processes into a ring of
    shared-memory slots; the interface and output of ``parallel.Engine``.

    ``buffered``: yield views into a ring slot (valid until the next ``next()``) instead of
    arrays the caller owns (one copy out of the slot). ``ordered``: yield step ``k``
    before ``k+1``. ``prefetch``: steps in flight (default twice the workers). ``on_error``:
    "raise", or "skip" to drop failed observations from their batch.

    The workers are forked at the first iteration and hold the container from then on:
    changes made to it later are not seen (``close()`` restarts them at the next
    iteration). Needs the 'fork' start method (Linux). A worker that raises makes the
    consumer raise ``fastload.LoadError`` naming the index; one that dies makes it raise
    ``RuntimeError`` naming the process.
    """

    def __init__(self, *, workers, buffered=True, ordered=True, prefetch=None,
                 on_error="raise"):
        if not isinstance(workers, Integral) or workers < 1:
            raise ValueError(f"workers must be a positive int, got {workers!r}")
        if prefetch is not None and (not isinstance(prefetch, Integral) or prefetch < 1):
            raise ValueError(f"prefetch must be a positive int or None, got {prefetch!r}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if "fork" not in multiprocessing.get_all_start_methods():
            raise RuntimeError("the process backend needs the 'fork' start method (Linux); "
                               "use the thread backend on this platform")
        self.workers = int(workers)
        self.buffered = buffered
        self.ordered = ordered
        self.prefetch = prefetch or 2 * self.workers
        self.on_error = on_error
        self.skipped = 0
        self._gen = 0
        self._procs = self._conns = self._ring = self._control = None
        self._root = self._key = self._finalizer = None
        self._outstanding = []

    # -- workers and ring ----------------------------------------------------------------

    def _start(self, plan, root):
        """Fork the workers with the container ``root`` and a ring for ``plan``, unless
        the running ones already hold both."""
        key = (plan.signature, self.prefetch + 1)
        if (self._procs is not None and self._root is root and self._key == key
                and all(proc.is_alive() for proc in self._procs)):
            return
        self._stop(graceful=True)
        _, size = carve_ring(None, plan, self.prefetch + 1)
        mapping = mmap.mmap(-1, size)     # anonymous, shared with the forked children
        ring, _ = carve_ring(mapping, plan, self.prefetch + 1)
        control = np.frombuffer(mapping, np.int64, 1, 0)
        control[0] = 0
        context = multiprocessing.get_context("fork")
        pipes = [context.Pipe() for _ in range(self.workers)]
        procs = []
        try:
            for k, (mine, theirs) in enumerate(pipes):
                others = [end for pipe in pipes for end in pipe if end is not theirs]
                proc = context.Process(target=worker_main, daemon=True,
                                       name=f"fastload-worker-{k}",
                                       args=(theirs, root, ring, control,
                                             self.on_error == "skip", others))
                proc.start()
                procs.append(proc)
        finally:
            for _, theirs in pipes:
                theirs.close()
        self._procs = procs
        self._conns = [mine for mine, _ in pipes]
        self._finalizer = weakref.finalize(self, _shutdown, procs, self._conns, False)
        self._outstanding = [0] * self.workers
        self._root, self._key = root, key
        self._ring, self._control = ring, control

    def _stop(self, graceful):
        if self._procs is None:
            return
        self._control[0] = 0
        self._finalizer.detach()
        _shutdown(self._procs, self._conns, graceful)
        self._procs = self._conns = self._ring = self._control = self._root = None

    def close(self):
        """Stop the workers and release the ring. Idempotent; the next iteration starts
        new workers."""
        self._gen += 1
        self._stop(graceful=True)

    # -- messages -------------------------------------------------------------------------

    def _receive(self):
        """Replies that arrived within one timed wait, as (worker, message); raises
        RuntimeError when a worker died."""
        procs, conns = self._procs, self._conns
        ready = multiprocessing.connection.wait(conns + [p.sentinel for p in procs], _WAIT_S)
        replies = []
        for k, conn in enumerate(conns):
            if conn in ready:
                try:
                    replies.append((k, conn.recv()))
                except (EOFError, OSError):
                    self._died(procs[k])
                self._outstanding[k] -= 1
        for proc in procs:
            if proc.sentinel in ready:
                self._died(proc)
        return replies

    def _died(self, proc):
        proc.join(1.0)
        message = _death_message(proc)
        self._stop(graceful=False)
        raise RuntimeError(f"{message}; the iteration cannot continue (a worker killed "
                           f"for memory is a common cause)")

    def _drain(self):
        """Cancel the live jobs and wait for their replies, so that no worker writes into
        the ring afterwards; stop the workers when that takes too long or fails."""
        if self._procs is None:
            return
        self._control[0] = 0
        deadline = time.monotonic() + _STOP_S
        try:
            while any(self._outstanding):
                if time.monotonic() > deadline:
                    self._stop(graceful=False)
                    return
                self._receive()
        except BaseException:
            self._stop(graceful=False)
            raise

    # -- iteration ------------------------------------------------------------------------

    def iterate(self, steps, start=0, *, epoch=0, seed=0):
        """Yield ``getobs(steps, k)`` for k from ``start`` on, loaded in the worker
        processes. Raises ``fastload.LoadError`` naming the index of an observation that
        failed, ``RuntimeError`` when a worker process died."""
        plan = make_plan(steps)
        return self._run(plan, Recipe(steps), start, numobs(steps), epoch, seed)

    def _begin(self, plan, recipe, epoch, seed):
        self._drain()
        self._start(plan, recipe.root())
        self._gen += 1
        gen = self._gen
        self._control[0] = gen
        for worker in range(self.workers):
            self._send(worker, ("epoch", gen, seed, epoch, recipe, plan.signature))
        return gen

    def _send(self, worker, message):
        try:
            self._conns[worker].send(message)
        except OSError:
            self._died(self._procs[worker])

    def _run(self, plan, recipe, start, total, epoch, seed):
        if start >= total:
            return
        gen = self._begin(plan, recipe, epoch, seed)
        free = collections.deque(range(self.prefetch + 1))
        inflight = {}          # step -> (slot, worker)
        arrived = {}           # step -> reply, not yet delivered
        next_step, expected, held = start, start, None
        try:
            while True:
                if held is not None:
                    free.append(held)
                    held = None
                while next_step < total and len(inflight) + len(arrived) < self.prefetch:
                    worker = min(range(self.workers), key=self._outstanding.__getitem__)
                    slot = free.popleft()
                    self._send(worker, ("job", gen, next_step, slot))
                    self._outstanding[worker] += 1
                    inflight[next_step] = slot
                    next_step += 1
                if not inflight and not arrived:
                    return
                step = self._next(gen, inflight, arrived, expected)
                reply = arrived.pop(step)
                slot = inflight.pop(step)
                value = self._finish(plan, slot, reply)
                expected += 1
                if self.buffered:
                    held = slot
                else:
                    free.append(slot)
                yield value
        finally:
            if self._gen == gen:
                self._drain()

    def _next(self, gen, inflight, arrived, expected):
        """The step to deliver next, once its reply arrived."""
        while True:
            if self._gen != gen:
                raise RuntimeError("this iteration was stopped: a newer iteration of the "
                                   "same engine started, or the engine was closed")
            if self.ordered and expected in arrived:
                return expected
            if not self.ordered and arrived:
                return next(iter(arrived))
            for _, reply in self._receive():
                if reply[1] == gen and reply[2] in inflight:
                    arrived[reply[2]] = reply

    def _finish(self, plan, slot, reply):
        kind, _, step = reply[:3]
        if kind == "error":
            _, _, _, pos, index, message, text, blob = reply
            if index is None:
                raise RuntimeError(f"a worker could not plan the steps: {message}") \
                    from _remote(text, blob)
            cause = _remote(text, blob)
            if isinstance(cause, LoadError):
                raise cause       # it names its observation already
            what = f"step {step}" if plan.whole_steps else f"observation {index}"
            raise LoadError(f"could not load {what}: {message}", index=index) from cause
        if kind == "cancelled":
            raise RuntimeError(f"step {step} was cancelled")
        n, objects, keep = reply[3:]
        if keep is not None:
            self.skipped += int(len(keep) - keep.sum())
        value = plan.assemble(self._ring[slot], objects, n, keep)
        return value if self.buffered else _owned(value)


def _remote(text, blob):
    """The worker's exception (when it unpickles) with its traceback text as its cause."""
    try:
        exc = pickle.loads(blob) if blob is not None else None
    except Exception:
        exc = None
    if not isinstance(exc, BaseException):
        return WorkerError(text)
    exc.__cause__ = WorkerError(text)
    return exc


def _owned(value):
    """``value`` with every array copied out of the ring."""
    if isinstance(value, dict):
        return {k: _owned(v) for k, v in value.items()}
    if isinstance(value, tuple):
        parts = [_owned(v) for v in value]
        return type(value)(*parts) if hasattr(value, "_fields") else tuple(parts)
    if isinstance(value, np.ndarray):
        return value.copy()
    return value
