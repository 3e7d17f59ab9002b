"""The seams of the engine: what ``_core.Iteration`` and ``engine.py`` ask of a plan and of a
transport, declared as protocols, and the tuples that cross the binding, named
(``Field``; ``Failure``, ``Loaded`` and ``Reply``, named tuples of ``_base/replies.py``).

A ``Plan`` (``plan.py``'s ``ItemPlan`` and ``StepPlan``) says how a step is laid out in a
slot of the ring and loads the items of its Python fields; a ``Transport``
(``processes.py``'s, for worker processes) hands the delivery loop the steps that others
loaded into the ring; a ``Feed`` brings in the data of the steps of one iteration before
they are loaded (the blocks of a dataset at a URL), checks each step before it is handed
out and is told each one that was. The protocols list only the members used across the
seam.

The engine starts the feeds of every iteration itself: those the container offers
(``_base.protocols.FeedSource``, found once per iteration through the views whose
observation i is the container's i) and those its caller adds (a loader's read-ahead), so
that every path over the same data (fastload's loaders, ``eachobs_parallel``, the drop-in
PyTorch loader, device prefetch) is fed the same way::

    Engine.iterate(data, schedule, feeds=...)
      |-- feeds = caller's + source.feed(order, ...) of the sources under data
      |-- native run: claims no item at a position from gate[0] on (one gated feed)
      |-- worker process: source.ensure(rows) before it loads its part of a step
      |-- before a step is handed out: feed.check(rows), then feed.delivered(step)
      '-- when the iteration is dropped or ends: feed.close()

Slots: a slot's destinations (``Dests``) hold one entry per field of the plan: an array, a
tuple/dict of arrays, or None for a field collected into a list; its objects
(``Objects``) hold, per field, that list (one entry per row) or None.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import numpy as np
import numpy.typing as npt

from .._base.replies import Failure, Loaded, Reply
from .._base.tree import LeafKind

if TYPE_CHECKING:  # for annotations only: this module stays a leaf of the import graph
    from .schedule import Schedule

__all__ = [
    "Dests",
    "Failure",
    "Feed",
    "Field",
    "Loaded",
    "Objects",
    "Plan",
    "Reply",
    "Transport",
]

# One field of the binding: its kind, and what C reads of it (an array, an image source,
# or None for a field that Python loads).
Field: TypeAlias = tuple[LeafKind, Any]
# A slot's destinations, one per field (an array, a structure of arrays, or None).
Dests: TypeAlias = list[Any]
# A slot's object lists, one per field (None for a field loaded into arrays).
Objects: TypeAlias = list[Any]


class Plan(Protocol):
    """How the steps of a schedule are loaded into the slots of a ring.

    ``rows``: positions of a slot (a step's observations; 1 for a single observation or a
    whole step); ``fields`` and ``row_bytes``: the binding's fields and the bytes each
    takes per row in the slot; ``signature``: equal for plans with the same layout (a ring
    is reused across them); ``batch_size``: the schedule's (None: single observations);
    ``expensive``: an item costs more than a copy (steps are claimed one item at a time,
    and native loading releases the GIL); ``has_python``: some field is loaded by
    ``fill``; ``has_objects``: some field collects objects; ``whole_steps``: each step is
    one item (``order`` numbers steps, not observations).
    """

    rows: int
    fields: list[Field]
    row_bytes: list[int]
    signature: tuple[Any, ...]
    batch_size: int | None
    expensive: bool
    has_python: bool
    has_objects: bool
    whole_steps: bool

    def order(self, schedule: Schedule) -> npt.NDArray[np.int64]:
        """The indices the native run loads, ``rows`` a step."""
        ...

    def allocate(self, allocator: Callable[[tuple[int, ...], np.dtype[Any]], Any] = ...) -> Dests:
        """Fresh destinations for one slot, made by ``allocator(shape, dtype)``."""
        ...

    def new_objects(self) -> Objects:
        """The lists a slot's object fields collect into."""
        ...

    def whole_value(self, dests: Dests) -> Any:
        """The value of a whole step in the slot ``dests``, or None when each step is
        assembled."""
        ...

    def fill(self, dests: Dests, objects: Objects, field: int, pos: int, index: int) -> None:
        """Load item ``index`` of the Python field ``field`` into row ``pos`` of a slot."""
        ...

    def assemble(
        self, dests: Dests, objects: Objects, n: int, keep: npt.NDArray[np.bool_] | None = None
    ) -> Any:
        """The step's value from its slot's first ``n`` rows, without those where ``keep``
        is False."""
        ...

    def load_error(
        self, step: int, field: int | None, index: int, message: str, cause: BaseException | None
    ) -> Exception:
        """The exception to raise for a failed item (a ``Failure``'s members)."""
        ...


class Transport(Protocol):
    """Steps loaded elsewhere (worker processes) into the slots of a ring, for the delivery
    loop of ``_core.Iteration.start_transport``."""

    def next(self, release: int) -> Reply | None:
        """The next step, None at the end; ``release``: the slot the consumer gives back
        (-1: none)."""
        ...

    def lend(self, slot: int, value: Any) -> Any:
        """``value``, the whole step in ``slot``, handed out as it is with the slot kept
        until the caller drops it; None: the consumer copies it."""
        ...

    def copied(self, slot: int) -> None:
        """The consumer copied the step out of ``slot``."""
        ...

    def close(self) -> None:
        """Stop loading; idempotent."""
        ...


class Feed(Protocol):
    """What one iteration's data needs around its steps (``_storage.feeds``'s, the loader's
    read-ahead). ``gate``: None, or an int64 array of one that the feed's thread writes:
    the first position of the order whose data is not there yet (a native run claims no
    item from it on; at most one feed of an iteration has one)."""

    gate: npt.NDArray[np.int64] | None

    def start(self, gated: bool) -> None:
        """Start feeding (once), after the run started; ``gated``: the native run waits at
        ``gate`` (False: steps are read through Python or by worker processes, which
        ``ensure`` their rows themselves)."""
        ...

    def check(self, rows: npt.NDArray[np.int64]) -> None:
        """Raise what makes the step of ``rows`` (positions of the container) wrong, before
        it is handed out; called with no rows after a failure, to name its cause."""
        ...

    def delivered(self, step: int) -> None:
        """The consumer was handed ``step`` (in any order)."""
        ...

    def ensure(self, rows: npt.NDArray[np.int64]) -> None:
        """Bring in the data of ``rows`` now; returns when it is there."""
        ...

    def close(self) -> None:
        """Stop feeding; idempotent, never blocks."""
        ...
