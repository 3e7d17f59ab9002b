"""The records that cross the binding, as named tuples: what a native run or a transport
says of a step it loaded (``Loaded``, ``Reply``) and of an item that failed (``Failure``).

The binding (``_engine.pxi``) makes ``Failure`` and ``Loaded`` and reads each by name, as
the worker processes (``_loading/workers.py``) and the process transport
(``_loading/processes.py``, which makes ``Reply``) do; ``_loading/seams.py`` names them
among the engine's seams. They stay tuples, which unpack and compare as before.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = ["Failure", "Loaded", "Reply"]


class Failure(NamedTuple):
    """An item that failed: the ``step``, the plan's ``field`` (None when unknown), the
    index of the ``observation``, the ``message``, and the exception (``cause``; None when
    native code failed)."""

    step: int
    field: int | None
    observation: int
    message: str
    cause: BaseException | None


class Loaded(NamedTuple):
    """A step a native run loaded without delivering it (``Iteration.load_next``): its
    ``step``, its ``rows``, its ``failure`` (or None) and its rows' ``keep`` flags after
    skips (a bool array; None when every row was kept)."""

    step: int
    rows: int
    failure: Failure | None
    keep: npt.NDArray[np.bool_] | None


class Reply(NamedTuple):
    """A step a transport loaded into ``slot``: its ``step``, ``rows``, ``failure`` (or
    None), ``keep`` flags (None when every row was kept) and ``objects``, the object lists
    of its fields (None: read those of the slot)."""

    slot: int
    step: int
    rows: int
    failure: Failure | None
    keep: npt.NDArray[np.bool_] | None
    objects: list[Any] | None
