"""Quasi-random sample order for datasets larger than RAM.

A fully random order touches the whole file every few steps; reading it from disk
thrashes the page cache. The quasi-random order visits the dataset block by block: the
blocks are put in a random order, taken ``wave`` at a time, and the items of each wave
are shuffled together. Memory bound: while one wave is consumed, at most ``wave``
blocks are being read, so at most ``wave * max(block bytes)`` of the file needs to be
resident at once.

Distributed training: ``quasi_partition_order`` deals the blocks of each epoch to a fixed
number of partitions, each read in waves of its own, and builds every global batch from
all of them: each rank reads the blocks of its partitions alone, and the global sequence
is the same on every world size dividing the partitions (elastic). ``quasi_shard_order``,
the order states of format 3 and earlier resume in, deals the blocks out among the ranks
themselves, so that the ranks' shares depend on the world size.
"""

from __future__ import annotations

import numbers

import numpy as np
import numpy.typing as npt

from ._base.arguments import module_getattr, renamed_keywords
from ._base.randomness import Purpose, generator

__all__ = [
    "DEFAULT_PARTITIONS",
    "block_sizes",
    "partitions_misfit",
    "quasi_draw",
    "quasi_partition_order",
    "quasi_partition_rows",
    "quasi_partition_steps",
    "quasi_random_order",
    "quasi_shard_order",
]

DEFAULT_WAVE = 8
DEFAULT_PARTITIONS = 8  # world sizes 1, 2, 4 and 8 read disjoint blocks

# The name of 0.2, with a DeprecationWarning.
__getattr__ = module_getattr("fastload.order", {"chunk_sizes": "block_sizes"}, globals())


def block_sizes(n: int, blocks: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Block sizes from ``blocks``: either the sizes (summing to ``n``) or the boundaries
    (``0, ..., n``; k + 1 values for k blocks). Raises ValueError when neither fits."""
    c = np.asarray(blocks)
    if c.ndim != 1 or (c.size and c.dtype.kind not in "iu") or np.any(c < 0):
        raise ValueError("blocks must be a 1-D sequence of non-negative ints")
    c = c.astype(np.int64)
    if int(c.sum()) == n:
        return c
    if c.size >= 1 and c[0] == 0 and c[-1] == n and np.all(np.diff(c) >= 0):
        return np.diff(c)
    raise ValueError(f"blocks are neither sizes summing to {n} nor boundaries 0..{n}")


@renamed_keywords(chunks="blocks", window="wave")
def quasi_random_order(
    n: int, blocks: npt.ArrayLike, seed: int, epoch: int, wave: int = DEFAULT_WAVE
) -> npt.NDArray[np.int64]:
    """A permutation of ``range(n)`` (int64) that is random but block-local.

    ``blocks``: block sizes or boundaries (see ``block_sizes``), e.g. a dataset's
    ``block_bounds``. Blocks are drawn in random order; each run of ``wave`` consecutive
    drawn blocks is one wave, whose items are shuffled together and emitted before the
    next wave starts. Every index appears exactly once. The result depends only on
    (n, blocks, seed, epoch, wave): a fresh generator of ``Purpose.QUASI_ORDER``
    is used, never global state.

    Raises ValueError for a bad ``blocks``, ``seed``, ``epoch`` or ``wave``. Example::

        order = quasi_random_order(len(ds), ds.block_bounds, seed=0, epoch=3)
    """
    for name, value, low in (
        ("n", n, 0),
        ("seed", seed, 0),
        ("epoch", epoch, 0),
        ("wave", wave, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return quasi_draw(n, blocks, generator(seed, Purpose.QUASI_ORDER, epoch), wave)


def quasi_draw(
    n: int, blocks: npt.ArrayLike, rng: np.random.Generator, wave: int
) -> npt.NDArray[np.int64]:
    """``quasi_random_order``'s permutation drawn from ``rng`` (checked arguments): the
    blocks in a random order, the rows of each ``wave`` of them shuffled together."""
    sizes = block_sizes(n, blocks)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    # Empty blocks are dropped first, so sizes and boundaries give the same order.
    keep = sizes > 0
    sizes, starts = sizes[keep], starts[keep]
    picked = rng.permutation(len(sizes))
    return _waves(picked, starts, sizes, rng, wave)


def _waves(
    picked: npt.NDArray[np.int64],
    starts: npt.NDArray[np.int64],
    sizes: npt.NDArray[np.int64],
    rng: np.random.Generator,
    wave: int,
) -> npt.NDArray[np.int64]:
    """The rows of the blocks ``picked`` (in that order), ``wave`` blocks at a time, the
    rows of each wave shuffled together by ``rng``."""
    out = np.empty(int(sizes[picked].sum()), np.int64)
    pos = 0
    for w in range(0, len(picked), wave):
        group = picked[w : w + wave]
        items = np.concatenate(
            [np.arange(starts[c], starts[c] + sizes[c], dtype=np.int64) for c in group]
        )
        rng.shuffle(items)
        out[pos : pos + len(items)] = items
        pos += len(items)
    return out


def quasi_shard_order(
    n: int,
    blocks: npt.ArrayLike,
    seed: int,
    epoch: int,
    rank: int,
    world: int,
    per: int,
    wave: int = DEFAULT_WAVE,
) -> npt.NDArray[np.int64]:
    """Rank ``rank``'s ``per`` rows of a quasi-random epoch shared out by blocks: the
    blocks, drawn in random order as ``quasi_random_order`` draws them, are dealt one by
    one to the rank that holds the fewest rows so far, so that the ranks read disjoint
    blocks (the bytes of data at a URL are fetched by one rank). Each rank reads its own
    blocks in waves, as ``quasi_random_order``. The ranks' shares differ by less than a
    block: the rows a rank holds past ``per`` go, in rank order, to the ranks short of it
    (a few blocks read by two ranks); rows still missing then (``per * world > n``) are
    its own first rows again, as the unsharded order pads. A pure function of the
    arguments."""
    sizes = block_sizes(n, blocks)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    keep = sizes > 0
    sizes, starts = sizes[keep], starts[keep]
    picked = generator(seed, Purpose.QUASI_ORDER, epoch).permutation(len(sizes))
    owner, held = np.empty(len(sizes), np.int64), np.zeros(world, np.int64)
    for c in picked:
        r = int(np.argmin(held))
        owner[c], held[r] = r, held[r] + sizes[c]
    own = [
        _waves(
            picked[owner[picked] == r],
            starts,
            sizes,
            generator(seed, Purpose.QUASI_ORDER, epoch, r + 1),
            wave,
        )
        for r in range(world)
    ]
    spare = np.concatenate([o[per:] for o in own])
    short = np.maximum(per - held, 0)
    taken = int(short[:rank].sum())
    mine = np.concatenate([own[rank][:per], spare[taken : taken + int(short[rank])]])
    return np.resize(mine, per) if len(mine) < per and len(mine) else mine


def _nonempty(n: int, blocks: npt.ArrayLike) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``(sizes, starts)`` of the non-empty blocks of ``blocks`` (see ``block_sizes``)."""
    sizes = block_sizes(n, blocks)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    keep = sizes > 0
    return sizes[keep], starts[keep]


def partitions_misfit(
    partitions: int, world: int, global_batch: int, n: int, blocks: npt.ArrayLike
) -> str | None:
    """Why ``partitions`` cannot give the elastic quasi order on ``world`` ranks of a global
    batch of ``global_batch`` items over ``blocks`` (what to set, in words), or None when
    it can: ``world`` must divide ``partitions``, ``partitions`` must divide
    ``global_batch``, and every partition needs a block."""
    count = len(_nonempty(n, blocks)[0])
    if partitions % world:
        return (
            f"{world} ranks do not divide partitions={partitions}: give partitions= a "
            f"multiple of the world size that divides the global batch {global_batch}"
        )
    if global_batch % partitions:
        return (
            f"partitions={partitions} does not divide the global batch of {global_batch} "
            f"items (batch_size * world_size): give partitions= a divisor of it that the "
            f"world size divides, or a batch_size that makes it a multiple"
        )
    if count < partitions:
        return (
            f"the data has {count} non-empty blocks, fewer than partitions={partitions}: "
            f"give partitions= at most {count}, or write it in smaller blocks (block_bytes=)"
        )
    return None


def quasi_partition_rows(
    n: int, blocks: npt.ArrayLike, seed: int, epoch: int, partitions: int
) -> npt.NDArray[np.int64]:
    """The rows each of the ``partitions`` holds in ``epoch`` (int64, one a partition):
    see ``quasi_partition_order``."""
    sizes, _ = _nonempty(n, blocks)
    _, owner = _deal(sizes, seed, epoch, partitions)
    return np.bincount(owner, weights=sizes, minlength=partitions).astype(np.int64)


def _deal(
    sizes: npt.NDArray[np.int64], seed: int, epoch: int, partitions: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``(picked, owner)``: the blocks in the epoch's random order, and the partition each
    is dealt to, one by one to the partition of the fewest rows so far (the lowest first)."""
    picked = generator(seed, Purpose.QUASI_ORDER, epoch).permutation(len(sizes))
    owner, held = np.empty(len(sizes), np.int64), np.zeros(partitions, np.int64)
    for c in picked:
        p = int(np.argmin(held))
        owner[c], held[p] = p, held[p] + sizes[c]
    return picked, owner


def quasi_partition_steps(rows: npt.NDArray[np.int64], global_batch: int, drop_last: bool) -> int:
    """Steps of an epoch whose partitions hold ``rows`` (``quasi_partition_rows``), each
    giving ``global_batch // len(rows)`` items a step: as many as the largest partition
    fills (the others wrap around), or with ``drop_last`` as the smallest fills whole."""
    per = global_batch // len(rows)
    return int(rows.min()) // per if drop_last else -(-int(rows.max()) // per)


def quasi_partition_order(
    n: int,
    blocks: npt.ArrayLike,
    seed: int,
    epoch: int,
    rank: int,
    world: int,
    global_batch: int,
    partitions: int = DEFAULT_PARTITIONS,
    drop_last: bool = False,
    wave: int = DEFAULT_WAVE,
) -> npt.NDArray[np.int64]:
    """Rank ``rank``'s rows of the elastic quasi-random epoch, in order (int64).

    The non-empty blocks, in the random order ``quasi_random_order`` draws, are dealt one
    by one to the partition of the fewest rows so far. Each partition reads its blocks in
    that order, ``max(1, wave // partitions)`` blocks at a time, the rows of each wave
    shuffled together (a generator of ``Purpose.QUASI_ORDER`` keyed ``(epoch,
    partitions, p)``): about ``max(wave, partitions)`` blocks are read at once over all
    ranks. Global batch k of ``global_batch`` items is, for each partition in order, its
    next ``global_batch // partitions`` items; rank r of ``world`` loads partitions
    ``r * partitions // world`` to ``(r + 1) * partitions // world - 1``, which are its
    ``global_batch // world`` consecutive items of each global batch. The steps are
    ``quasi_partition_steps``: a partition shorter than the epoch wraps around to its own
    first items; with ``drop_last`` the items past the last whole step are dropped.

    A pure function of the arguments, the same global sequence on every ``world``
    dividing ``partitions``. Raises ValueError when ``partitions_misfit`` says why not.
    """
    misfit = partitions_misfit(partitions, world, global_batch, n, blocks)
    if misfit is not None:
        raise ValueError(f"shuffle='quasi' with partitions: {misfit}")
    sizes, starts = _nonempty(n, blocks)
    picked, owner = _deal(sizes, seed, epoch, partitions)
    rows = np.bincount(owner, weights=sizes, minlength=partitions).astype(np.int64)
    steps = quasi_partition_steps(rows, global_batch, drop_last)
    per, mine = global_batch // partitions, partitions // world
    # (step, partition, item): each step, every partition's items, in partition order.
    out = np.empty((steps, mine, per), np.int64)
    for k, p in enumerate(range(rank * mine, (rank + 1) * mine)):
        rng = generator(seed, Purpose.QUASI_ORDER, epoch, partitions, p)
        stream = _waves(picked[owner[picked] == p], starts, sizes, rng, max(1, wave // partitions))
        out[:, k, :] = _wrapped(stream, steps * per).reshape(steps, per)
    return out.ravel()


def _wrapped(items: npt.NDArray[np.int64], length: int) -> npt.NDArray[np.int64]:
    """The first ``length`` of ``items`` repeated (a view when they suffice)."""
    if len(items) >= length:
        return items[:length]
    return np.resize(items, length)
