"""PyTorch's worker contract for Python datasets, under ``fastload.torch.DataLoader``.

A dataset that fastload cannot load natively (any ``torch.utils.data.Dataset`` or
``IterableDataset`` of Python code) is loaded as PyTorch loads it, so that code written
for PyTorch behaves the same:

- ``num_workers=0``: the caller's process fetches each batch when it is requested;
- ``num_workers=n``: n worker processes (forked, unless ``multiprocessing_context`` says
  otherwise), each seeded as PyTorch seeds its workers (``torch`` and ``random`` with
  ``base_seed + worker_id``, numpy from both by PyTorch's own function), with
  ``torch.utils.data.get_worker_info()`` set and ``worker_init_fn(id)`` called once.
  Batches are assigned to the workers in turn (batch k to worker k mod n),
  ``prefetch_factor`` per worker in flight; an iterable dataset is iterated whole in
  each worker (it shards itself through ``get_worker_info``).

Concurrency invariants (kept by the consumer, ``WorkerIteration``):
- a task is ``_Task(generation, number, indices)`` (``children.Tagged``); a reply of
  another generation (an epoch left before its end, with persistent workers) is dropped,
  so an epoch never sees another's;
- every wait on the result queue is a timed wait: a worker that died raises in the
  consumer, and ``timeout`` is enforced, whatever the workers do (past it the workers are
  killed, then the error raised);
- a reply is ``_Packed(generation, number, bytes)``: the consumer knows which worker sent
  a batch before it unpickles it, so a batch whose shared memory died with its worker
  raises naming that worker;
- a worker stops when told (None), and dies with its parent process, even stuck in the
  dataset's code.

Starting and ending the processes, their deaths and their exceptions in PyTorch's words
are the process toolkit's (``children.py``); this module keeps PyTorch's contract.
"""

from __future__ import annotations

import itertools
import queue
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch
import torch.utils.data

from .._base.children import ChildError, Tagged, death_message, end_processes, orphaned, start

__all__ = ["Fetcher", "QueueWorkers", "WorkerIteration", "base_seed", "worker_setup"]

_POLL_S = 0.1  # one timed wait on a queue: how soon a dead worker or parent is seen
_JOIN_S = 5.0  # time given to the workers to stop before they are killed
_DEATH_S = 1.0  # time given to a worker that cannot be reached to be seen dead


def base_seed(generator: torch.Generator | None) -> int:
    """The seed of one iteration's workers, drawn as PyTorch draws it (one int64 from
    ``generator``, or from the global generator): a script seeded with
    ``torch.manual_seed`` draws the same numbers under either loader."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


class Fetcher:
    """Makes one step from its indices, as PyTorch's fetchers do: ``dataset[i]`` for each
    (through ``__getitems__`` when the dataset has it) then ``collate_fn``, or the next
    ``batch_size`` items of an iterable dataset. Raises ``StopIteration`` when an
    iterable dataset has no more steps."""

    def __init__(
        self,
        dataset: Any,
        iterable: bool,
        auto_collation: bool,
        batch_size: int | None,
        drop_last: bool,
        collate_fn: Callable[[Any], Any],
    ) -> None:
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.collate_fn = collate_fn
        self.iterator: Iterator[Any] | None = iter(dataset) if iterable else None

    def __call__(self, indices: Any) -> Any:
        if self.iterator is not None:
            return self.collate_fn(self._next_items())
        if not self.auto_collation:
            return self.collate_fn(self.dataset[indices])  # what the sampler gave, whole
        getitems = getattr(self.dataset, "__getitems__", None)
        items = getitems(indices) if getitems else [self.dataset[i] for i in indices]
        return self.collate_fn(items)

    def _next_items(self) -> Any:
        assert self.iterator is not None
        if not self.auto_collation or self.batch_size is None:
            return next(self.iterator)
        items = list(itertools.islice(self.iterator, self.batch_size))
        if not items or (self.drop_last and len(items) < self.batch_size):
            raise StopIteration
        return items


@dataclass(frozen=True, slots=True)
class _Task(Tagged):
    """Make the batch of task ``number`` (of generation ``gen``) from ``indices``."""

    number: int
    indices: Any


@dataclass(frozen=True, slots=True)
class _Packed(Tagged):
    """The reply to task ``number``, pickled as the queue would pickle it (``_packed``)."""

    number: int
    blob: bytes


class _Exhausted:
    """The reply of a worker whose iterable dataset has no more steps."""


def _seed_worker(base: int, worker_id: int) -> None:
    seed = base + worker_id
    random.seed(seed)
    torch.manual_seed(seed)
    # PyTorch's worker loop seeds numpy with this function of (base, worker id), private
    # to its worker module: called, not copied, numpy draws what it draws there whatever
    # the version of torch.
    np.random.seed(torch.utils.data._utils.worker._generate_state(base, worker_id))


def _set_worker_info(**info: Any) -> None:
    # torch.utils.data.get_worker_info() reads this module-level value and PyTorch has no
    # public setter: datasets written for PyTorch shard themselves through it.
    worker = torch.utils.data._utils.worker
    worker._worker_info = worker.WorkerInfo(**info)


def _enter_worker(dataset: Any, worker_id: int, num_workers: int, base: int) -> None:
    """What PyTorch sets in a worker before ``worker_init_fn``: one thread for torch, the
    seeds (from the iteration's ``base`` seed), the worker info."""
    torch.set_num_threads(1)
    _seed_worker(base, worker_id)
    seed = base + worker_id
    _set_worker_info(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)


def worker_setup(
    dataset: Any,
    num_workers: int,
    base: int,
    worker_init_fn: Callable[[int], None] | None,
) -> Callable[[int], None]:
    """``setup(worker_id)``, run once in each of fastload's worker processes (the engine's
    ``worker_init``): the worker is seeded with ``base + worker_id`` and its
    ``get_worker_info()`` set as in PyTorch's, then ``worker_init_fn(worker_id)`` runs."""

    def setup(worker_id: int) -> None:
        _enter_worker(dataset, worker_id, num_workers, base)
        if worker_init_fn is not None:
            worker_init_fn(worker_id)

    return setup


def _worker_main(
    dataset: Any, spec: dict[str, Any], worker_id: int, base: int, tasks: Any, results: Any
) -> None:
    """A worker's life: seed, set the worker info, ``worker_init_fn``, then one reply per
    task until told to stop (None) or the parent is gone."""
    try:
        _enter_worker(dataset, worker_id, spec["num_workers"], base)
        where = f"in DataLoader worker process {worker_id}"
        failure = None
        try:
            if spec["worker_init_fn"] is not None:
                spec["worker_init_fn"](worker_id)
        except Exception as exc:  # sent to the consumer, raised there
            failure = ChildError(exc, where)
        _serve(dataset, spec, tasks, results, failure, where)
    except KeyboardInterrupt:
        pass  # Ctrl-C reaches the consumer too; it stops the workers


def _serve(
    dataset: Any,
    spec: dict[str, Any],
    tasks: Any,
    results: Any,
    failure: ChildError | None,
    where: str,
) -> None:
    fetch: Fetcher | None = None
    generation = None
    while True:
        try:
            task = tasks.get(timeout=_POLL_S)
        except queue.Empty:
            if orphaned():
                return
            continue
        if task is None:
            return
        gen, number, indices = task.gen, task.number, task.indices
        reply: Any
        if failure is not None:
            reply = failure
        else:
            try:
                if gen != generation:  # a new epoch: an iterable dataset starts over
                    generation = gen
                    fetch = Fetcher(
                        dataset,
                        spec["iterable"],
                        spec["auto_collation"],
                        spec["batch_size"],
                        spec["drop_last"],
                        spec["collate_fn"],
                    )
                assert fetch is not None
                reply = fetch(indices)
            except StopIteration:
                reply = _Exhausted()
            except Exception as exc:  # sent to the consumer, raised there
                reply = ChildError(exc, where)
        results.put(_packed(gen, number, reply, where))


def _packed(gen: int, number: int, reply: Any, where: str) -> _Packed:
    """The reply pickled here, as the queue would pickle it (tensors move to shared
    memory), after its generation and task: a reply that cannot be pickled becomes its
    error, where the queue's feeder thread would drop it and leave the consumer waiting
    forever."""
    try:
        return _Packed(gen, number, bytes(ForkingPickler.dumps(reply)))
    except Exception as exc:  # sent to the consumer, raised there
        return _Packed(gen, number, bytes(ForkingPickler.dumps(ChildError(exc, where))))


class QueueWorkers:
    """``num_workers`` worker processes for one dataset, as PyTorch's: each has its task
    queue, all share one result queue. Lives for one iteration, or across epochs with
    ``persistent_workers``."""

    def __init__(
        self, dataset: Any, spec: dict[str, Any], seed: int, context: Any, count: int
    ) -> None:
        self.context = context
        self.results = context.Queue()
        self.tasks = [context.Queue() for _ in range(count)]
        self.procs = []
        self.generation = 0
        try:
            for k in range(count):
                args = (dataset, spec, k, seed, self.tasks[k], self.results)
                self.procs.append(start(context, _worker_main, args, f"fastload-torch-worker-{k}"))
        except BaseException:
            self.close()
            raise

    def check_alive(self) -> None:
        """Raise ``RuntimeError`` naming the workers that died, and how."""
        dead = [p for p in self.procs if not p.is_alive()]
        if dead:
            how = "; ".join(death_message(p, pytorch=True) for p in dead)
            self.close(graceful=False)
            raise RuntimeError(
                f"{how}: a crash in the dataset's code (a segmentation fault, an abort), "
                f"or the worker was killed, often for memory"
            )

    def close(self, graceful: bool = True) -> None:
        """Stop the workers: ask them and give them ``_JOIN_S`` seconds (``graceful``), then
        kill those still running. Idempotent."""
        procs, self.procs = self.procs, []
        if graceful:
            for q in self.tasks:
                try:
                    q.put(None)
                except (ValueError, OSError):
                    pass  # a queue already closed
        end_processes(procs, _JOIN_S if graceful else 0.0)
        for q in [*self.tasks, self.results]:
            q.cancel_join_thread()
            q.close()
        self.tasks = []


class WorkerIteration:
    """One epoch over ``QueueWorkers``: tasks in turn to the workers still active,
    ``prefetch`` per worker in flight, replies delivered in task order (``in_order``) or
    as they come. Raises the worker's exception with its type, ``RuntimeError`` for a
    dead worker or after ``timeout`` seconds (0: no limit) without a reply."""

    def __init__(
        self,
        pool: QueueWorkers,
        tasks: Iterator[Any],
        prefetch: int,
        in_order: bool,
        timeout: float,
        on_end: Callable[[], None],
    ) -> None:
        pool.generation += 1
        self.pool = pool
        self.gen = pool.generation
        self.source = tasks
        self.in_order = in_order
        self.timeout = timeout
        self.on_end = on_end
        self.active = [True] * len(pool.tasks)
        self.worker_of: dict[int, int] = {}  # task -> worker, for tasks not delivered
        self.ready: dict[int, Any] = {}  # replies that came before their turn
        self.sent = self.next_task = 0
        self.turn = itertools.cycle(range(len(pool.tasks)))
        self.done = False
        for _ in range(prefetch * len(pool.tasks)):
            self._send()

    def _send(self) -> None:
        if not any(self.active) or not self.pool.procs:
            return
        try:
            indices = next(self.source)
        except StopIteration:
            return
        worker = next(self.turn)
        while not self.active[worker]:
            worker = next(self.turn)
        self.pool.tasks[worker].put(_Task(self.gen, self.sent, indices))
        self.worker_of[self.sent] = worker
        self.sent += 1

    def __iter__(self) -> WorkerIteration:
        return self

    def __next__(self) -> Any:
        while True:
            if self.done or not self.pool.procs:  # ended, or stopped by a worker's death
                self._end()
                raise StopIteration
            if not self.worker_of:
                self._end()
                raise StopIteration
            number, reply = self._reply()
            worker = self.worker_of.pop(number)
            if isinstance(reply, _Exhausted):
                self.active[worker] = False  # sent no more; its other tasks say the same
                continue
            self._send()
            if isinstance(reply, ChildError):
                reply.reraise()  # the iteration goes on with the next batch, as in PyTorch
            return reply

    def _reply(self) -> tuple[int, Any]:
        if self.in_order and self.next_task in self.ready:
            number = self.next_task
            self.next_task += 1
            return number, self.ready.pop(number)
        while True:
            packed = self._receive()
            gen, number = packed.gen, packed.number
            reply = self._unpacked(gen, number, packed.blob)
            if gen != self.gen:
                continue  # a reply of an epoch left before its end
            if not self.in_order or number == self.next_task:
                if number == self.next_task:
                    self.next_task += 1
                return number, reply
            self.ready[number] = reply

    def _receive(self) -> _Packed:
        """The next reply; ``RuntimeError`` when a worker
        died, or after ``timeout`` seconds without a reply (the workers, which would not
        give their tasks up, are killed first)."""
        deadline = time.monotonic() + self.timeout if self.timeout else None
        while True:
            wait = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
            try:
                message: _Packed = self.pool.results.get(timeout=max(0.0, wait))
            except queue.Empty:
                pass
            else:
                return message
            self.pool.check_alive()
            if deadline is not None and time.monotonic() >= deadline:
                self.pool.close(graceful=False)
                self._end()
                raise RuntimeError(f"DataLoader timed out after {self.timeout} seconds")

    def _unpacked(self, gen: int, number: int, blob: bytes) -> Any:
        """The reply of task ``number``; ``RuntimeError`` naming its worker when that
        cannot be received."""
        try:
            return ForkingPickler.loads(blob)
        except (OSError, EOFError) as error:
            # A tensor in shared memory is fetched from the worker that sent it: when that
            # worker died meanwhile, say so rather than raise the socket's error.
            worker = self.worker_of.get(number) if gen == self.gen else None
            if worker is None:
                self.pool.check_alive()
                return None  # a reply of an epoch left before its end: nobody wants it
            if worker < len(self.pool.procs):
                self.pool.procs[worker].join(_DEATH_S)
            self.pool.check_alive()
            raise RuntimeError(
                f"the batch of DataLoader worker process {worker} could not be received: "
                f"{type(error).__name__}: {error}"
            ) from error

    def _end(self) -> None:
        if not self.done:
            self.done = True
            self.on_end()
