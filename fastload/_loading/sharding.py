"""Which part of each epoch a training process loads: ``shard=(rank, world_size)``.

Every rank draws the same order for (seed, epoch) and takes a contiguous block of it, so
the ranks are disjoint and together cover the epoch, and a block-local order (quasi-random
reading of packed data) stays block-local on every rank. All ranks get the same number of
observations: with ``drop_last`` the remainder of ``n / world_size`` is dropped, otherwise
the order is padded by wrapping around to its start, as PyTorch's DistributedSampler pads.
Batches from a batch sampler are shared out whole, the same way: a contiguous block of
the epoch's batches per rank, padded by wrapping around.

The ranks agree on the order only if they agree on the seed: a sharded loader given no
seed takes ``DEFAULT_SEED`` (as DistributedSampler's default seed is 0), never a seed of
its own that the other ranks could not know.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Sequence
from numbers import Integral
from typing import Literal, TypeAlias

import numpy as np
import numpy.typing as npt

__all__ = [
    "DEFAULT_SEED",
    "Shard",
    "default_seed",
    "resolve_shard",
    "shard_batches",
    "shard_order",
    "shard_size",
]

# ``shard=``: (rank, world_size), "auto", or None for one process.
Shard: TypeAlias = tuple[int, int] | Literal["auto"] | None

DEFAULT_SEED = 0


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


def resolve_shard(shard: Shard) -> tuple[int, int]:
    """``(rank, world_size)`` from ``shard``: None (one process), a pair, or ``"auto"``
    (torch.distributed when initialized, else the RANK/WORLD_SIZE environment variables,
    else JAX's process index and count when jax is imported, else one process).
    Raises ValueError for anything else or a rank outside ``range(world_size)``."""
    if shard is None:
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


def shard_order(
    order: npt.NDArray[np.int64], rank: int, world: int, drop_last: bool
) -> npt.NDArray[np.int64]:
    """This rank's block of the epoch's ``order`` (every rank passes the same order)."""
    if world == 1:
        return order
    n = len(order)
    per = shard_size(n, world, drop_last)
    if not drop_last and per * world > n and n:
        order = np.resize(order, per * world)  # wraps around to the start
    return order[rank * per : (rank + 1) * per]


def shard_batches(
    batches: Sequence[npt.NDArray[np.int64]], rank: int, world: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """This rank's block of the epoch's ``batches`` (int64 arrays; every rank passes the
    same ones), as ``(order, bounds)``: the positions one after the other and the offsets
    where each batch starts, with the end. Every rank gets ``ceil(len(batches) / world)``
    batches; the last ranks' blocks wrap around to the first batches."""
    count = len(batches)
    per = -(-count // world)
    picked = (
        np.resize(np.arange(count), per * world)[rank * per : (rank + 1) * per]
        if count
        else np.arange(0)
    )
    mine = [batches[k] for k in picked]
    bounds = np.zeros(len(mine) + 1, np.int64)
    np.cumsum([len(b) for b in mine], out=bounds[1:])
    order = np.concatenate(mine).astype(np.int64) if mine else np.zeros(0, np.int64)
    return order, bounds


def default_seed(seed: int | None, world: int) -> int:
    """The seed a loader uses: ``seed``, else ``DEFAULT_SEED`` when it is sharded over
    several ranks (they must draw the same order), else a fresh one of 63 bits."""
    if seed is not None:
        return int(seed)
    if world > 1:
        return DEFAULT_SEED
    return secrets.randbits(63)
