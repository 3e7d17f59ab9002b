"""The format of a loader's ``state_dict()``, and the checks ``load_state_dict`` makes
before it reads a position from one.

A state names what kind of loader saved it, and in which version of the layout, as one
string under ``"format"``; the other values are ints, flags, None and strings, so that a
state survives JSON::

    {"format": "fastload.container_loader/4", "seed": 7, "epoch": 2, "step": 40,
     "rank": 0, "world_size": 1, "steps": 94, "shuffle": True, "sampler": None,
     "batch_sampler": None, "batch_size": 64, "drop_last": False, "layout": "elastic",
     "partitions": None}

Versions:

- 1: what fastload 0.2 saved without a format: ``seed``, ``epoch``, ``step``, ``rank``,
  ``world_size``, and ``steps`` (a container's steps per epoch) or ``window`` (a
  stream's records per round).
- 2: version 1 and the settings that shape the order (``ORDER_SETTINGS``): for a
  container ``shuffle`` (False, True or "quasi"), ``sampler`` and ``batch_sampler`` (None,
  or the kind given: the type's name, ``sampler_kind``), ``batch_size`` (None: single
  observations) and ``drop_last``; for a stream ``shuffle``, ``shuffle_buffer`` (records,
  0 without shuffle), ``batch_size`` and ``drop_last``.
- 3: version 2 and, for a container, the ``layout`` of its ranks' shares
  (``_loading/sharding.py``): ``"elastic"`` (each global batch cut in rank order) or
  ``"blocks"`` (a contiguous block of the epoch per rank: how versions 1 and 2 were
  drawn, which a loader resumed from one of them keeps). A stream's is version 2's.
- 4: version 3 and, for a container, ``partitions``: the partitions its
  ``shuffle="quasi"`` order deals each epoch's blocks to (``order.quasi_partition_order``,
  elastic), or None (no quasi order, or the blocks shared out for its world size,
  ``order.quasi_shard_order``: how a quasi order of versions 1 to 3 was drawn, which a
  loader resumed from one of them keeps). A stream's is version 2's.

``check_state`` reads a state of any of these versions: its format first (a state of another kind
of loader, of a version this one does not read, or of something that is not a fastload
loader is refused with a message saying what it is and what to do); then every field for
its type (a bool is not an int here; numpy's integers and booleans are) and range, with a
``TypeError`` or ``ValueError`` naming the field and what it takes; then the shard and the
order settings against the loader's: a state is for a loader that would draw the same
order, so one with another setting is refused naming it, rather than resumed into
another order. A state of the elastic layout (``shuffle="quasi"`` only with partitions)
holds a global position, the same on every rank: any rank of any world size may resume it
(``_loading/resume.py`` checks the position against this loader's global batch), and
its ``batch_size`` may differ when the world size does. A version-1 state does not
record the order settings: it is read with the checks it had (the shard; the loader
checks the steps per epoch).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from .._base.arguments import is_flag, is_size

__all__ = [
    "ORDER_SETTINGS",
    "LoaderKind",
    "STATE_VERSION",
    "check_state",
    "check_state_format",
    "is_elastic",
    "sampler_kind",
    "state_layout",
    "state_partitions",
    "state_format",
]

STATE_VERSION = 4
_READS = (1, 2, 3, 4)  # the versions this one reads

# What a loader reads: a container (positions, steps known up front) or a stream.
LoaderKind = Literal["container", "stream"]

# The settings that shape the order of a loader of each kind (recorded from version 2).
ORDER_SETTINGS: dict[str, tuple[str, ...]] = {
    "container": ("shuffle", "sampler", "batch_sampler", "batch_size", "drop_last"),
    "stream": ("shuffle", "shuffle_buffer", "batch_size", "drop_last"),
}

_FORMAT = re.compile(r"fastload\.(container|stream)_loader/(\d+)")
_WORD = 2**64  # seeds and epochs are words of the random streams' seed sequences
_SHARD = ("rank", "world_size")  # a version-1 state without them is rank 0 of 1, as it was read


def state_format(kind: LoaderKind, version: int = STATE_VERSION) -> str:
    """The ``"format"`` of the states of ``version`` for a loader of ``kind``."""
    return f"fastload.{kind}_loader/{version}"


def sampler_kind(sampler: Any) -> str | None:
    """What a state records of ``sampler=`` or ``batch_sampler=``: None, the sampler's
    ``state_kind`` where it says more (a mix drawn block by block), or the name of its
    type (``"list"``, ``"function"``, ``"fastload.samplers.WeightedSampler"``)."""
    if sampler is None:
        return None
    named = getattr(sampler, "state_kind", None)
    if isinstance(named, str):
        return named
    kind = type(sampler)
    name = kind.__qualname__
    return name if kind.__module__ == "builtins" else f"{kind.__module__}.{name}"


def state_layout(state: Mapping[str, Any], version: int) -> str:
    """The layout of a container's ``state`` of ``version``: ``"blocks"`` before 3."""
    return str(state.get("layout", "elastic")) if version >= 3 else "blocks"


def state_partitions(state: Mapping[str, Any], version: int) -> int | None:
    """The partitions of a container's ``state`` of ``version``: None before 4."""
    value = state.get("partitions") if version >= 4 else None
    return None if value is None else int(value)


def check_state_format(state: Any, kind: LoaderKind) -> int:
    """The version of ``state``, a state this version reads for a loader of ``kind``.
    Raises ``TypeError`` when it is not a mapping, ``ValueError`` (saying what it got,
    what was expected, and what to do) for a missing format, another kind or a version
    this one does not read."""
    expected = state_format(kind)
    if not isinstance(state, Mapping):
        raise TypeError(
            f"load_state_dict takes the dict that state_dict() returned, got {type(state).__name__}"
        )
    if "format" not in state:
        raise ValueError(
            f"not a fastload loader state of this version: it has no 'format' (its keys: "
            f"{sorted(map(str, state))}), expected format {expected!r}. A state saved by "
            f"fastload 0.2 holds the fields of version 1: add 'format': "
            f"{state_format(kind, 1)!r} to it"
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
    version = int(match.group(2))
    if version not in _READS:
        readable = " or ".join(repr(state_format(kind, v)) for v in _READS)
        raise ValueError(
            f"the state has format {found!r}, this version of fastload reads "
            f"{readable}: resume with the fastload version that saved it"
        )
    return version


def _integer(state: Mapping[str, Any], name: str, low: int, high: int | None = None) -> int:
    """``state[name]`` as an int in ``[low, high)``; raises ``TypeError`` (not an int: a
    bool, a float, a string) or ``ValueError`` (out of range), naming the field."""
    value = state[name]
    span = f">= {low}" if high is None else f"in [{low}, {high if high != _WORD else '2**64'})"
    if not is_size(value):
        raise TypeError(
            f"the state's {name!r} must be an int {span}, got {value!r} ({type(value).__name__})"
        )
    if value < low or (high is not None and value >= high):
        raise ValueError(f"the state's {name!r} must be an int {span}, got {value!r}")
    return int(value)


def _setting(state: Mapping[str, Any], name: str, kind: LoaderKind) -> None:
    """Raise ``TypeError`` unless ``state[name]`` is a value the order setting ``name`` of a
    loader of ``kind`` takes (``ValueError`` for a size out of range)."""
    value = state[name]
    if name == "shuffle_buffer":
        _integer(state, name, 0)
        return
    if name in ("batch_size", "partitions"):
        if value is not None:
            _integer(state, name, 1)
        return
    if name == "layout":
        ok, takes = value in ("elastic", "blocks"), "'elastic' or 'blocks'"
    elif name in ("sampler", "batch_sampler"):
        ok, takes = value is None or isinstance(value, str), "None or the name of a type"
    elif name == "shuffle" and kind == "container":
        quasi = isinstance(value, str) and value == "quasi"
        ok, takes = is_flag(value) or quasi, "True, False or 'quasi'"
    else:
        ok, takes = is_flag(value), "True or False"
    if not ok:
        raise TypeError(f"the state's {name!r} must be {takes}, got {value!r}")


def _needed(kind: LoaderKind, version: int) -> tuple[str, ...]:
    fields = ("seed", "epoch", "step", "rank", "world_size")
    fields += ("steps",) if kind == "container" else ("window",)
    layout = ("layout",) if kind == "container" and version >= 3 else ()
    layout += ("partitions",) if kind == "container" and version >= 4 else ()
    return fields + (ORDER_SETTINGS[kind] if version >= 2 else ()) + layout


def _check_fields(state: Mapping[str, Any], kind: LoaderKind, version: int) -> None:
    """Raise unless every field of a state of ``version`` is there, of its type and in its
    range."""
    needed = _needed(kind, version)
    missing = [k for k in needed if k not in state and (version > 1 or k not in _SHARD)]
    if missing:
        raise ValueError(f"not a loader state: missing {sorted(missing)}")
    _integer(state, "seed", 0, _WORD)
    _integer(state, "epoch", 0, _WORD)
    world = _integer(state, "world_size", 1) if "world_size" in state else 1
    if "rank" in state:
        _integer(state, "rank", 0, world)
    step = _integer(state, "step", 0)
    if kind == "container":
        steps = _integer(state, "steps", 0)
        if step > steps:
            raise ValueError(f"the state's 'step' {step} is past its {steps} steps per epoch")
    else:
        _integer(state, "window", 1)
    for name in ORDER_SETTINGS[kind] if version >= 2 else ():
        _setting(state, name, kind)
    if kind == "container" and version >= 3:
        _setting(state, "layout", kind)
    if kind == "container" and version >= 4:
        _setting(state, "partitions", kind)


def is_elastic(state: Mapping[str, Any], kind: LoaderKind, version: int) -> bool:
    """Whether ``state`` (checked) holds a global position that any rank of any world
    size resumes: a container's of the elastic layout, and of ``shuffle="quasi"`` only
    when dealt to partitions."""
    return (
        kind == "container"
        and state_layout(state, version) == "elastic"
        and (state["shuffle"] != "quasi" or state_partitions(state, version) is not None)
    )


def check_state(state: Any, kind: LoaderKind, settings: Mapping[str, Any]) -> int:
    """Raise unless ``state`` can be resumed by a loader of ``kind`` whose shard and order
    settings are ``settings`` (``rank``, ``world_size``, a stream's ``window``, and the
    ``ORDER_SETTINGS`` of its kind): see the module docstring. ``TypeError`` for a value of
    the wrong type, ``ValueError`` for the rest; each message names the field. Returns
    the state's version."""
    version = check_state_format(state, kind)
    _check_fields(state, kind, version)
    elastic = is_elastic(state, kind, version)
    rank, world = state.get("rank", 0), state.get("world_size", 1)
    if not elastic and (rank, world) != (settings["rank"], settings["world_size"]):
        raise ValueError(
            f"the state is for rank {rank} of {world}, this loader is rank "
            f"{settings['rank']} of {settings['world_size']} (only a state of the elastic "
            f"order, saved by fastload 0.3 or later without shuffle='quasi', or with "
            f"shuffle='quasi' dealt to partitions=, resumes on another rank or world size)"
        )
    if kind == "stream" and state["window"] != settings["window"]:
        raise ValueError(
            f"the state is for a stream read {state['window']} records at a time, this "
            f"loader reads {settings['window']}"
        )
    if kind == "container" and version >= 4:
        _check_partitions(state["partitions"], settings["partitions"])
    for name in ORDER_SETTINGS[kind] if version >= 2 else ():
        saved, mine = state[name], settings[name]
        if name == "batch_size" and elastic and world != settings["world_size"]:
            continue  # the global batch is checked against the position (resume.py)
        if saved != mine:
            raise ValueError(
                f"the state was saved by a loader with {name}={saved!r}, this one has "
                f"{name}={mine!r}, which gives another order: restore it into a loader "
                f"with {name}={saved!r}"
            )
    return version


def _check_partitions(saved: int | None, mine: int | None) -> None:
    """Raise ``ValueError`` unless a state's quasi order was dealt to the partitions this
    loader asks for; one saved without partitions (as before version 4) resumes on any
    loader of its rank and world size, in the order of that world size."""
    if saved is None or saved == mine:
        return
    raise ValueError(
        f"the state was saved by a loader whose shuffle='quasi' order is dealt to "
        f"partitions={saved}, this one's to partitions={mine}, which gives another "
        f"order: resume on a world size dividing {saved}, with the same global batch and "
        f"partitions={saved}"
    )
