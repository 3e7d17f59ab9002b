"""Which part of each epoch a training process loads: ``shard=(rank, world_size)``.

Every rank draws the same order for (seed, epoch) and takes a contiguous block of it, so
the ranks are disjoint and together cover the epoch, and a chunk-local order (quasi-random
reading of packed data) stays chunk-local on every rank. All ranks get the same number of
observations: with ``drop_last`` the remainder of ``n / world_size`` is dropped, otherwise
the order is padded by wrapping around to its start, as PyTorch's DistributedSampler pads.
"""
import os
import sys
from numbers import Integral

import numpy as np

__all__ = ["resolve_shard", "shard_order"]


def _from_torch():
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _from_environment():
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or world is None:
        return None
    try:
        return int(rank), int(world)
    except ValueError:
        raise ValueError(f"RANK={rank!r} and WORLD_SIZE={world!r} must be integers") from None


def _from_jax():
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    return jax.process_index(), jax.process_count()


def resolve_shard(shard):
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
            raise ValueError(f"shard must be None, 'auto' or (rank, world_size), "
                             f"got {shard!r}") from None
    if not (isinstance(rank, Integral) and isinstance(world, Integral) and 0 <= rank < world):
        raise ValueError(f"shard needs 0 <= rank < world_size, got rank={rank!r}, "
                         f"world_size={world!r}")
    return int(rank), int(world)


def shard_size(n, world, drop_last):
    """Observations per rank."""
    return n // world if drop_last else -(-n // world)


def shard_order(order, rank, world, drop_last):
    """This rank's block of the epoch's ``order`` (every rank passes the same order)."""
    if world == 1:
        return order
    n = len(order)
    per = shard_size(n, world, drop_last)
    if not drop_last and per * world > n and n:
        order = np.resize(order, per * world)   # wraps around to the start
    return order[rank * per:(rank + 1) * per]
