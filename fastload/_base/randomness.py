"""Every random stream fastload draws from in Python, derived from (seed, purpose, key...).

Each stream has a purpose, and no two purposes share a stream: the permutation of an epoch
and the quasi-random order, the sampler or the file order of the same (seed, epoch) are
independent. A generator is a pure function of its seed, purpose and key, never of global
state or time, so an order drawn twice is the same order::

    generator(seed, Purpose.SAMPLER, epoch)
        = Generator(PCG64(SeedSequence(seed, spawn_key=(Purpose.SAMPLER, epoch))))

numpy's spawn keys separate the streams: the sequence is mixed from the seed, then from
the purpose and the key. Two purposes keep the recipe they had before purposes existed,
so that the orders users saved or published stay the same:

- ``EPOCH_ORDER``: ``PCG64([seed, epoch])``, the loader's shuffled order (what a
  ``state_dict()`` resumes). Its seed sequence holds at most four 32-bit words (a seed
  below 2**64 and an epoch below 2**64), a spawned one at least five (the seed padded to
  four, then the purpose): the two never coincide.
- ``VIEW_ORDER``: ``Philox(seed)``, the order of ``shuffleobs`` and the shuffle of
  ``splitobs`` and ``kfolds`` (their seed names a train/test split). Another bit
  generator: it shares no stream with the others.

A seed of None (the views' default) draws fresh entropy from the OS. The per-item draws of
the native image ops are keyed by (seed, epoch, index, op) in C (``csrc/rng.h``), not here.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import numpy as np

__all__ = ["Purpose", "derived_seed", "generator"]


class Purpose(enum.IntEnum):
    """What a stream of random numbers is for, and the key that goes with it. The values
    are part of the streams: a value, once given, never changes."""

    EPOCH_ORDER = 1  # key (epoch,): the loader's shuffled order of an epoch
    QUASI_ORDER = 2  # key (epoch,): shuffle="quasi", blocks and the items of each wave;
    # (epoch, rank + 1): the waves of a rank's blocks, sharded by world size;
    # (epoch, partitions, p): the waves of partition p (quasi_partition_order)
    SAMPLER = 3  # key (epoch,): WeightedSampler, BucketBatchSampler
    FILE_ORDER = 4  # key (epoch,): the order of a FileStream's files
    SHUFFLE_BUFFER = 5  # key (epoch,): a stream's shuffle buffer
    STREAM_ROUND = 6  # key (round,): the seed a round of a stream loads with
    VIEW_ORDER = 7  # key (): shuffleobs, the shuffle of splitobs and kfolds
    RESAMPLING = 8  # key (): oversample, undersample, randobs
    TRANSFORM = 9  # key (epoch, index, op): the rng a Lambda's function is given
    MIX = 10  # key (epoch, 0): fastload.mix's interleaving; (epoch, source + 1): its draws


def generator(seed: int | None, purpose: Purpose, *key: int) -> np.random.Generator:
    """The numpy ``Generator`` of ``purpose`` for ``seed`` (an int in [0, 2**64), or None
    for fresh entropy) and ``key`` (ints in [0, 2**64), as ``Purpose`` lists them). In
    that range the seed fills the same words of every sequence, the purpose the word
    after them: two purposes never meet.
    Raises ``ValueError`` for a seed or key out of that range, or a seed of None where
    fresh entropy makes no sense (the loader's shuffled order)."""
    words = _words(key)
    if purpose is Purpose.EPOCH_ORDER:
        return np.random.Generator(np.random.PCG64([_seed(seed), *words]))
    if purpose is Purpose.VIEW_ORDER:
        return np.random.Generator(np.random.Philox(seed))
    return np.random.Generator(np.random.PCG64(_sequence(seed, purpose, words)))


def derived_seed(seed: int, purpose: Purpose, *key: int) -> int:
    """An int seed in [0, 2**63) for ``purpose`` and ``key``, derived from ``seed``: for
    what takes a seed rather than a generator (a schedule's, keying the native draws).
    Raises ``ValueError`` as ``generator``."""
    state = _sequence(_seed(seed), purpose, _words(key)).generate_state(1, np.uint64)
    return int(state[0]) >> 1


def _sequence(seed: int | None, purpose: Purpose, key: list[int]) -> np.random.SeedSequence:
    return np.random.SeedSequence(
        None if seed is None else _seed(seed), spawn_key=(int(purpose), *key)
    )


def _seed(seed: int | None) -> int:
    if seed is None:
        raise ValueError("this random stream needs a seed (an int), got None")
    return _words([seed], "seed")[0]


def _words(values: Iterable[int], what: str = "key") -> list[int]:
    out = [int(v) for v in values]
    for v in out:
        if not 0 <= v < 1 << 64:
            raise ValueError(f"a random stream's {what} must be an int in [0, 2**64), got {v}")
    return out
