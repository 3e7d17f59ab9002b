"""Which part of each epoch a training process loads: ``shard=(rank, world_size)``.

Every rank draws the same order for (seed, epoch). The order is cut into global batches
of ``batch_size * world_size`` observations (one observation a rank without a batch
size), and each global batch into ``world_size`` consecutive per-rank batches, in rank
order: at step k, rank r loads ``order[k*G + r*b : k*G + (r+1)*b]`` (``G = b * world``).
The ranks' batches of a step, concatenated in rank order, are the step's global batch,
the same on every world size dividing G: the order is *elastic* (``shard_elastic``).
The ranks are disjoint and together cover the epoch, each with the same number of
observations: with ``drop_last`` the last partial global batch is dropped, otherwise it
is padded by wrapping around to the start of the order to a multiple of ``world_size``
and cut into equal per-rank parts (its first observations are the same on every world
size, the padding is not). One observation a step, this is PyTorch's
DistributedSampler's ``indices[rank::world]``. A batch sampler's batches are dealt the
same way, one a rank: at step k rank r loads batch ``k * world + r`` (``shard_batches``).

Loaders resumed from a state of format 1 or 2 (written before fastload 0.3.0) keep the order
those versions drew, a contiguous block of the epoch's order per rank (``shard_blocks``,
``shard_batch_blocks``, ``layout="blocks"`` in ``_loading/epochs.py``).

A quasi-random order of packed data is shared out by blocks instead
(``order.quasi_shard_order``): each rank reads blocks no other rank reads (but a few rows
that even the shares out), so that data at a URL is fetched once across the ranks; it
depends on the world size.

A loader given no ``shard`` in a job of several ranks (a ``torch.distributed`` process
group of several ranks, ``WORLD_SIZE`` > 1, or JAX's multi-process runtime) loads the
whole dataset on every rank: it warns once per process, naming ``shard="auto"``;
``shard=False`` says that every rank is meant to load it all, and warns of nothing.

The ranks agree on the order only if they agree on the seed: a sharded loader given no
seed takes ``DEFAULT_SEED`` (as DistributedSampler's default seed is 0), never a seed of
its own that the other ranks could not know.
"""

from __future__ import annotations

import os
import secrets
import sys
import warnings
from collections.abc import Sequence
from numbers import Integral
from typing import Literal, TypeAlias

import numpy as np
import numpy.typing as npt

from .._base.arguments import user_stacklevel

__all__ = [
    "DEFAULT_SEED",
    "Shard",
    "default_seed",
    "resolve_shard",
    "shard_batch_blocks",
    "shard_batches",
    "shard_blocks",
    "shard_elastic",
    "shard_order",
    "shard_size",
]

# ``shard=``: (rank, world_size), "auto", or None/False for the whole dataset (None warns
# when several ranks are up; False does not).
Shard: TypeAlias = tuple[int, int] | Literal["auto", False] | None

DEFAULT_SEED = 0
_warned_unsharded = False


def _from_torch() -> tuple[int, int] | None:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _from_environment() -> tuple[int, int] | None:
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or world is None:
        return None
    try:
        return int(rank), int(world)
    except ValueError:
        raise ValueError(f"RANK={rank!r} and WORLD_SIZE={world!r} must be integers") from None


def _from_jax() -> tuple[int, int] | None:
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    return jax.process_index(), jax.process_count()


def _ranks_up() -> tuple[int, str] | None:
    """``(world_size, by what)`` of a job of several ranks this process is one of, else
    None: a torch.distributed process group, ``WORLD_SIZE``, or JAX's distributed runtime
    (asked only when initialized: asking starts JAX's backends)."""
    torch = _from_torch()
    if torch is not None and torch[1] > 1:
        return torch[1], "torch.distributed"
    world = os.environ.get("WORLD_SIZE", "")
    if world.isdigit() and int(world) > 1:
        return int(world), "WORLD_SIZE"
    jax = sys.modules.get("jax")
    if jax is not None and jax.distributed.is_initialized() and jax.process_count() > 1:
        return jax.process_count(), "jax.distributed"
    return None


def _warn_unsharded() -> None:
    global _warned_unsharded
    up = None if _warned_unsharded else _ranks_up()
    if up is None:
        return
    _warned_unsharded = True
    warnings.warn(
        f"{up[1]} runs {up[0]} ranks, but this loader has no shard=: every rank loads the "
        "whole dataset. Give shard='auto' to load this rank's part of each epoch, or "
        "shard=False if every rank is meant to load all of it (this warning is given once)",
        UserWarning,
        stacklevel=user_stacklevel(),
    )


def resolve_shard(shard: Shard) -> tuple[int, int]:
    """``(rank, world_size)`` from ``shard``: None or False (one process; None warns once
    when several ranks are up), a pair, or ``"auto"`` (torch.distributed when initialized,
    else the RANK/WORLD_SIZE environment variables, else JAX's process index and count
    when jax is imported, else one process). Raises ValueError for anything else or a rank
    outside ``range(world_size)``."""
    if shard is None:
        _warn_unsharded()
        return 0, 1
    if shard is False:
        return 0, 1
    if shard == "auto":
        found = _from_torch() or _from_environment() or _from_jax() or (0, 1)
        rank, world = found
    else:
        try:
            rank, world = shard
        except (TypeError, ValueError):
            raise ValueError(
                f"shard must be None, 'auto' or (rank, world_size), got {shard!r}"
            ) from None
    if not (isinstance(rank, Integral) and isinstance(world, Integral) and 0 <= rank < world):
        raise ValueError(
            f"shard needs 0 <= rank < world_size, got rank={rank!r}, world_size={world!r}"
        )
    return int(rank), int(world)


def shard_size(n: int, world: int, drop_last: bool) -> int:
    """Observations per rank."""
    return n // world if drop_last else -(-n // world)


def shard_blocks(
    order: npt.NDArray[np.int64], rank: int, world: int, drop_last: bool
) -> npt.NDArray[np.int64]:
    """This rank's contiguous block of the epoch's ``order`` (every rank passes the same
    order): the order states written before fastload 0.3.0 resume in."""
    if world == 1:
        return order
    n = len(order)
    per = shard_size(n, world, drop_last)
    if not drop_last and per * world > n and n:
        order = np.resize(order, per * world)  # wraps around to the start
    return order[rank * per : (rank + 1) * per]


# Its name in 0.3 (internal).
shard_order = shard_blocks


def shard_elastic(
    order: npt.NDArray[np.int64], rank: int, world: int, batch: int, drop_last: bool
) -> npt.NDArray[np.int64]:
    """This rank's positions of the epoch's ``order`` in the elastic layout (see the
    module docstring): of each global batch of ``batch * world`` positions, the
    ``rank``-th run of ``batch``; of the last partial one, padded by wrapping to a
    multiple of ``world``, the ``rank``-th of ``world`` equal runs (dropped with
    ``drop_last``). ``batch``: observations per rank and step (1 for single ones)."""
    if world == 1:
        return order
    per = shard_size(len(order), world, drop_last)
    full, tail = divmod(per, batch)
    if not per:
        return order[:0]
    cut = full * batch * world  # the whole global batches (views: no copy of the order)
    if cut > len(order):  # the padding reaches into them (a few observations a rank)
        order = np.resize(order, per * world)
    mine = order[:cut].reshape(full, world, batch)[:, rank].ravel()
    if drop_last or not tail:
        return mine
    last = order[cut:]  # the partial global batch, padded by wrapping to the start
    pad = world * tail - len(last)
    if pad:
        last = np.concatenate([last, np.resize(order, pad)])
    return np.concatenate([mine, last.reshape(world, tail)[rank]])


def _joined(
    batches: Sequence[npt.NDArray[np.int64]], picked: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The ``batches`` at ``picked`` as ``(order, bounds)``."""
    mine = [batches[k] for k in picked]
    bounds = np.zeros(len(mine) + 1, np.int64)
    np.cumsum([len(b) for b in mine], out=bounds[1:])
    order = np.concatenate(mine).astype(np.int64) if mine else np.zeros(0, np.int64)
    return order, bounds


def shard_batch_blocks(
    batches: Sequence[npt.NDArray[np.int64]], rank: int, world: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """This rank's contiguous block of the epoch's ``batches`` (int64 arrays; every rank
    passes the same ones), as ``(order, bounds)``: the positions one after the other and
    the offsets where each batch starts, with the end. Every rank gets
    ``ceil(len(batches) / world)`` batches; the last ranks' blocks wrap around to the
    first batches. The order states written before fastload 0.3.0 resume in."""
    count = len(batches)
    per = -(-count // world)
    if not count:
        return _joined(batches, np.arange(0))
    return _joined(batches, np.resize(np.arange(count), per * world)[rank * per : (rank + 1) * per])


def shard_batches(
    batches: Sequence[npt.NDArray[np.int64]], rank: int, world: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """This rank's batches of the epoch's ``batches`` in the elastic layout, as
    ``(order, bounds)`` (see ``shard_batch_blocks``): at step k, batch ``k * world +
    rank``. Every rank gets ``ceil(len(batches) / world)`` batches; the last step's are
    padded by wrapping around to the first batches."""
    count = len(batches)
    per = -(-count // world)
    picked = np.resize(np.arange(count), per * world)[rank::world] if count else np.arange(0)
    return _joined(batches, picked)


def default_seed(seed: int | None, world: int) -> int:
    """The seed a loader uses: ``seed``, else ``DEFAULT_SEED`` when it is sharded over
    several ranks (they must draw the same order), else a fresh one of 63 bits."""
    if seed is not None:
        return int(seed)
    if world > 1:
        return DEFAULT_SEED
    return secrets.randbits(63)
