"""Checks of option values at the API edge: a flag is a bool and a size is an int (a bool
is neither a size nor a count), so that ``batch_size=True`` or ``drop_last="no"`` raise
instead of being read as 1 or as true; and the warning for a renamed keyword."""

from __future__ import annotations

import sys
import warnings
from numbers import Integral
from typing import Any

import numpy as np

__all__ = ["check_flag", "check_size", "is_flag", "is_size", "warn_renamed"]


def is_flag(value: Any) -> bool:
    """True for ``True`` and ``False`` (numpy's booleans included)."""
    return isinstance(value, (bool, np.bool_))


def is_size(value: Any) -> bool:
    """True for an int that is not a bool (numpy's integers included)."""
    return isinstance(value, (Integral, np.integer)) and not is_flag(value)


def check_flag(name: str, value: Any) -> bool:
    """``value`` as a bool; raises ``TypeError`` naming ``name`` unless it is one."""
    if not is_flag(value):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_size(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an int ``>= minimum``; raises ``ValueError`` naming ``name`` when it is
    not an int (a bool, a float, a string) or is too small."""
    if not is_size(value) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def warn_renamed(old: str, new: str) -> None:
    """Warn (``DeprecationWarning``) that ``old`` is spelled ``new`` now, pointing at the
    user's line that called into fastload: the old spelling still works, for now."""
    level, frame = 2, sys._getframe(1)  # stacklevel 2: the caller of this function
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("fastload."):
        frame, level = frame.f_back, level + 1
    warnings.warn(
        f"{old} is deprecated: write {new} (the old spelling stops working in a later release)",
        DeprecationWarning,
        stacklevel=level,
    )
