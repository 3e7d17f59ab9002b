"""The format of a loader's ``state_dict()``: what kind of loader saved it, and in which
version of the layout, as one string under ``"format"``::

    {"format": "fastload.container_loader/1", "seed": 7, "epoch": 2, "step": 40, ...}

``load_state_dict`` reads a state only after ``check_state_format``: a state of another
kind of loader (a stream's into a container's), of another version, or of something that
is not a fastload loader is refused with a message saying what it is and what to do,
rather than read as a position it does not mean.

Version 1 holds what fastload 0.2 saved without a format: ``seed``, ``epoch``, ``step``,
``rank``, ``world_size``, and ``steps`` (a container's steps per epoch) or ``window`` (a
stream's records per round).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

__all__ = [
    "LoaderKind",
    "STATE_VERSION",
    "check_state_format",
    "state_format",
]

STATE_VERSION = 1

# What a loader reads: a container (positions, steps known up front) or a stream.
LoaderKind = Literal["container", "stream"]

_FORMAT = re.compile(r"fastload\.(container|stream)_loader/(\d+)")


def state_format(kind: LoaderKind) -> str:
    """The ``"format"`` of the states this version saves for a loader of ``kind``."""
    return f"fastload.{kind}_loader/{STATE_VERSION}"


def check_state_format(state: Any, kind: LoaderKind) -> None:
    """Raise unless ``state`` is a state this version saved for a loader of ``kind``:
    ``TypeError`` when it is not a mapping, ``ValueError`` (saying what it got, what was
    expected, and what to do) for a missing format, another kind or another version."""
    expected = state_format(kind)
    if not isinstance(state, Mapping):
        raise TypeError(
            f"load_state_dict takes the dict that state_dict() returned, got {type(state).__name__}"
        )
    if "format" not in state:
        raise ValueError(
            f"not a fastload loader state of this version: it has no 'format' (its keys: "
            f"{sorted(map(str, state))}), expected format {expected!r}. A state saved by "
            f"fastload 0.2 holds the same fields: add 'format': {expected!r} to it"
        )
    found = state["format"]
    match = _FORMAT.fullmatch(found) if isinstance(found, str) else None
    if match is None:
        raise ValueError(
            f"not a fastload loader state: its format is {found!r}, expected {expected!r}"
        )
    if match.group(1) != kind:
        raise ValueError(
            f"the state is of a loader over a {match.group(1)} (format {found!r}), this "
            f"loader reads a {kind} (format {expected!r}): restore it into a loader built "
            f"the same way as the one that saved it"
        )
    if int(match.group(2)) != STATE_VERSION:
        raise ValueError(
            f"the state has format {found!r}, this version of fastload reads "
            f"{expected!r}: resume with the fastload version that saved it"
        )
