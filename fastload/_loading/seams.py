"""The seams of the engine: what ``_core.Iteration`` and ``engine.py`` ask of a plan and of a
transport, declared as protocols, and the tuples that cross the binding, named
(``Field``; ``Failure``, ``Loaded`` and ``Reply``, named tuples of ``_base/replies.py``).

A ``Plan`` (``plan.py``'s ``ItemPlan`` and ``StepPlan``) says how a step is laid out in a
slot of the ring and loads the items of its Python fields; a ``Transport``
(``processes.py``'s, for worker processes) hands the delivery loop the steps that others
loaded into the ring. The protocols list only the members used across the seam.

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

__all__ = ["Dests", "Failure", "Field", "Loaded", "Objects", "Plan", "Reply", "Transport"]

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
