"""Checks of option values at the API edge: a flag is a bool and a size is an int (a bool
is neither a size nor a count), so that ``batch_size=True`` or ``drop_last="no"`` raise
instead of being read as 1 or as true; and the old spellings of renamed names: each still
works, with a ``DeprecationWarning`` naming the new one (CHANGELOG.md, 0.3.0, "Renamed")."""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable
from numbers import Integral
from typing import Any, TypeVar

import numpy as np

__all__ = [
    "RenamedKeys",
    "check_flag",
    "check_size",
    "is_flag",
    "is_size",
    "module_getattr",
    "renamed_attribute",
    "renamed_keywords",
    "warn_renamed",
]

F = TypeVar("F", bound=Callable[..., Any])


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


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning issued by this function's caller point at
    the user's line that called into fastload."""
    level, frame = 2, sys._getframe(2)  # stacklevel 2: the warning function's caller
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("fastload."):
        frame, level = frame.f_back, level + 1
    return level


def warn_renamed(old: str, new: str) -> None:
    """Warn (``DeprecationWarning``) that ``old`` is spelled ``new`` now, pointing at the
    user's line that called into fastload: the old spelling still works, for now."""
    warnings.warn(
        f"{old} is deprecated: write {new} (the old spelling stops working in a later release)",
        DeprecationWarning,
        stacklevel=user_stacklevel(),
    )


def renamed_keywords(**renames: str) -> Callable[[F], F]:
    """A decorator: a call with keyword ``old=`` (a key of ``renames``) is made with
    ``renames[old]=`` instead, with a warning. Raises TypeError when both are given."""

    def wrap(func: F) -> F:
        @functools.wraps(func)
        def call(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(
                            f"{func.__qualname__}() takes {new}=, not both it and {old}="
                        )
                    warn_renamed(f"{func.__qualname__}({old}=)", f"{new}=")
                    kwargs[new] = kwargs.pop(old)
            return func(*args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap


class renamed_attribute:
    """A class attribute that reads the attribute ``new`` of the instance, with a warning."""

    def __init__(self, new: str) -> None:
        self.new = new
        self.old = new

    def __set_name__(self, owner: type, name: str) -> None:
        self.old = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        kind = type(obj).__name__
        warn_renamed(f"{kind}.{self.old}", f"{kind}.{self.new}")
        return getattr(obj, self.new)


class RenamedKeys(dict[str, Any]):
    """A result dict whose old keys (``renames``: old -> new) still read, with a warning."""

    def __init__(self, items: dict[str, Any], **renames: str) -> None:
        super().__init__(items)
        self.renames = renames

    def __missing__(self, key: str) -> Any:
        if key not in self.renames:
            raise KeyError(key)
        warn_renamed(f"the result's {key!r}", repr(self.renames[key]))
        return self[self.renames[key]]


def module_getattr(module: str, renames: dict[str, str], names: dict[str, Any]) -> Any:
    """A module's ``__getattr__``: an old name (``renames``: old -> new) gives the object
    ``names[new]``, with a warning; any other unknown name raises AttributeError."""

    def __getattr__(name: str) -> Any:
        if name not in renames:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warn_renamed(f"{module}.{name}", f"{module}.{renames[name]}")
        return names[renames[name]]

    return __getattr__
