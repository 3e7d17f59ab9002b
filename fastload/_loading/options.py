"""``LoaderOptions``: the keywords of ``DataLoader`` and ``eachobs`` as one frozen value,
checked once when it is made.

The loaders take their options as keywords (as PyTorch's and MLUtils' do); each builds one
``LoaderOptions`` from them and hands it on, so that a check and its message live here
alone. Its fields write the keywords once, each with its type, default and meaning: the
signatures of ``DataLoader`` and ``eachobs`` are made from them (``_base/keywords.py``:
``help()``, ``inspect`` and type checkers see every keyword), their docstrings list them
from the fields' docs, and a loader's attributes (``loader.batch_size``) read them. What
depends on the data (a stream has no positions to sample, a container no shuffle buffer)
is checked by ``for_stream`` and ``for_container`` once the loader knows which it reads.
The engine's own keywords (``parallel``, ``buffer``, ``ordered``, ``prefetch``,
``on_error``, ``backend``) make the options' ``EngineOptions``, which checks them
(``engine_options.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._base.arguments import check_flag, check_size, is_flag, is_size, warn_renamed
from .._base.collate import Collate, CollateOption
from .._base.tree import tree_leaves
from ..samplers import BatchSampler, Sampler
from .engine_options import Allocator, Backend, EngineOptions, OnError
from .epochs import Partitions, Shuffle
from .sharding import Shard

__all__ = ["BufferOption", "LoaderOptions"]

# What buffer= takes: a flag (the loader's own ring of buffers), or buffers of the user's.
BufferOption = bool | np.ndarray | tuple[Any, ...] | dict[Any, Any]


@dataclass(frozen=True, kw_only=True)
class LoaderOptions:
    """The options of a loader (see ``DataLoader`` for what each means), validated.

    ``batch_size=None`` makes each step one observation; with a ``batch_sampler`` it is
    None too (the sampler forms the batches). Flags are stored as ``bool``, ``parallel=0``
    as False. ``shuffle`` may still hold the deprecated int of a stream's shuffle buffer
    until ``for_stream`` or ``for_container`` resolves it. ``engine``: the options of the
    ``Engine`` that loads with these options.

    Raises ``ValueError`` for a value out of range or options that exclude each other,
    ``TypeError`` for a flag that is not a bool or a value of the wrong kind.
    """

    batch_size: int | None = field(
        default=None,
        kw_only=False,
        metadata={
            "doc": "observations per batch (an int >= 1); the last batch is partial unless "
            "``drop_last``. ``len(loader)`` is the number of batches per epoch (a stream has no "
            "length: ``TypeError``). None (``eachobs``): each step one observation"
        },
    )
    shuffle: Shuffle = field(
        default=False,
        metadata={
            "doc": "True draws a new order every epoch from (``seed``, epoch) alone; over a "
            "memory-mapped packed dataset larger than the memory this process may use it warns "
            '(UserWarning) once. ``"quasi"`` reads packed datasets larger than RAM block by '
            "block, reading the coming blocks ahead (``fastload._storage.readahead``). A stream is "
            "shuffled through a buffer of ``shuffle_buffer`` records, its files in a new order "
            "each epoch"
        },
    )
    shuffle_buffer: int | None = field(
        default=None,
        metadata={
            "doc": "records in a stream's shuffle buffer (None: 1,024); for streams only (the old "
            "spelling ``shuffle=n`` warns)"
        },
    )
    partitions: Partitions = field(
        default="auto",
        metadata={
            "doc": '``shuffle="quasi"``: the partitions each epoch\'s blocks are dealt to, every '
            "global batch taking ``global batch // partitions`` items of each; any world size "
            "dividing them reads disjoint blocks and the same global batches (elastic). An "
            'int, ``"auto"`` (sharded over several ranks, 8 where that fits: the world size '
            "divides 8, 8 divides the global batch and the data has 8 blocks; else None) or "
            "None (one process: every row once an epoch; sharded: the blocks shared out for "
            "this world size, not elastic, as states of format 3 and earlier resume)"
        },
    )
    sampler: Sampler | None = field(
        default=None,
        metadata={
            "doc": "the positions to load each epoch instead of all of them in order: "
            "``sampler(epoch, seed) -> positions`` or an iterable of positions (see "
            "``fastload.samplers``: ``WeightedSampler``)"
        },
    )
    batch_sampler: BatchSampler | None = field(
        default=None,
        metadata={
            "doc": "the batches themselves, of any sizes (``BucketBatchSampler``); it excludes "
            "``batch_size``, ``shuffle``, ``sampler`` and ``drop_last``"
        },
    )
    drop_last: bool = field(
        default=False, metadata={"doc": "drop the last batch when it is partial"}
    )
    collate: CollateOption | Collate = field(
        default=None,
        metadata={
            "doc": "as in ``batchview``: None, ``getobs(data, indices)``; True, stack; False, "
            "a list of observations; a callable, applied to that list"
        },
    )
    buffer: BufferOption = field(
        default=False,
        metadata={
            "doc": "True fills preallocated buffers in place and yields them: **a yielded batch is "
            "valid only until the next batch is requested**; copy what you keep. Arrays (an "
            "array, or a tuple/dict of them, of one step's shape and dtype): each step is "
            "copied into *your* buffer, which is yielded (its first rows for a shorter last "
            "batch), as MLUtils' ``getobs!``; ``ValueError`` when they do not fit the steps"
        },
    )
    parallel: bool | int = field(
        default=False,
        metadata={
            "doc": "False or 0 (the consumer's thread), True (all CPUs of the native pool) or a "
            "number of threads. Output is identical for every value"
        },
    )
    seed: int | None = field(
        default=None,
        metadata={
            "doc": "the seed of every random draw, an int in [0, 2**64); None draws one once, at "
            "construction (or takes 0 when sharded over several ranks, which must agree)"
        },
    )
    ordered: bool = field(
        default=True,
        metadata={
            "doc": "False (parallel only) yields batches as they complete: the same batches per "
            "epoch, in an order that depends on timing"
        },
    )
    prefetch: int | None = field(
        default=None, metadata={"doc": "batches in flight (None: the engine's default)"}
    )
    shard: Shard = field(
        default=None,
        metadata={
            "doc": '``(rank, world_size)`` or ``"auto"``: this process loads its part of each '
            "global batch of ``batch_size * world_size``, all ranks the same number of batches, "
            "the same global batches on any world size (``fastload._loading.sharding``). "
            "Without it while several ranks are up (torch.distributed, ``WORLD_SIZE``, JAX), "
            "every rank loads the whole dataset, and a warning says so once; False means that, "
            "without the warning"
        },
    )
    on_error: OnError = field(
        default="raise",
        metadata={
            "doc": '``"skip"`` drops observations that fail to load from their batch (the batch is '
            'shorter), counts them in ``stats()["skipped"]`` and warns once; ``"raise"`` '
            "raises ``fastload.LoadError`` naming the index. A file of a ``FileStream`` that "
            "fails to read is left from where it failed and counts as one"
        },
    )
    backend: Backend = field(
        default="thread",
        metadata={
            "doc": '``"process"`` (with ``parallel=n``) loads in n worker processes instead of '
            "threads, for GIL-bound Python containers (``fastload._loading.processes``)"
        },
    )
    allocator: Allocator | None = field(
        default=None,
        metadata={
            "doc": "``allocator(shape, dtype) -> array`` makes the batch buffers of the ring "
            "(None: ``numpy.empty``); ``loader.allocator = f`` changes it for the next epoch "
            "(``fastload.torch`` pins memory this way)"
        },
    )
    engine: EngineOptions = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # a frozen dataclass normalizes its fields this way
        if self.batch_size is not None:
            set_(self, "batch_size", check_size("batch_size", self.batch_size))
        set_(self, "shuffle", _checked_shuffle(self.shuffle))
        _check_shuffle_buffer(self.shuffle, self.shuffle_buffer)
        _check_partitions(self.shuffle, self.partitions)
        set_(self, "drop_last", check_flag("drop_last", self.drop_last))
        set_(self, "collate", Collate.of(self.collate))  # the one check of collate=
        _check_samplers(self)
        if self.batch_sampler is not None:
            set_(self, "batch_size", None)  # the batch sampler forms the batches
        if self.seed is not None and not is_size(self.seed):
            raise TypeError(f"seed must be an int or None, got {self.seed!r}")
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {self.seed!r}")
        if is_flag(self.buffer):
            set_(self, "buffer", bool(self.buffer))
        else:
            _check_buffers(self.buffer, self.batch_size)
        engine = EngineOptions(
            parallel=self.parallel,
            buffer=self.buffer is not False,  # True also for buffers of the user's
            ordered=self.ordered,
            prefetch=self.prefetch,
            on_error=self.on_error,
            backend=self.backend,
        )
        set_(self, "engine", engine)
        set_(self, "parallel", engine.parallel)
        set_(self, "ordered", engine.ordered)

    @property
    def buffers(self) -> Any:
        """The user's buffers given as ``buffer=`` (an array, or a tuple/dict of them), or
        None for a flag."""
        return None if isinstance(self.buffer, bool) else self.buffer

    def one_at_a_time(self) -> LoaderOptions:
        """These options for steps of one observation (no batch size, no batch sampler):
        no partial batch to drop and nothing to stack, so ``drop_last`` and a flag
        ``collate`` have nothing to act on. Raises ``ValueError`` for a collate function,
        which would go uncalled."""
        if callable(Collate.of(self.collate).option):
            raise ValueError(
                "collate= is applied to the observations of a batch: give eachobs a "
                "batch_size (or a batch_sampler) for it to be called"
            )
        return dataclasses.replace(self, drop_last=False, collate=None)

    def for_stream(self) -> LoaderOptions:
        """These options for a stream: its shuffle buffer resolved (``shuffle=n``, the
        deprecated spelling of ``shuffle=True, shuffle_buffer=n``, warns). Raises
        ``ValueError`` for what needs positions (``shuffle="quasi"``, samplers) or worker
        processes."""
        if self.shuffle == "quasi":
            raise ValueError(
                "shuffle='quasi' reads a packed dataset block by block; a stream is "
                "shuffled through a buffer: use shuffle=True (and shuffle_buffer=n)"
            )
        if self.sampler is not None or self.batch_sampler is not None:
            raise ValueError(
                "a stream has no positions to sample: sampler= and batch_sampler= need a container"
            )
        if self.backend == "process":
            raise ValueError("backend='process' loads containers; a stream loads on threads")
        if is_flag(self.shuffle):
            return self
        size = int(self.shuffle)
        warn_renamed(f"shuffle={size}", f"shuffle=True, shuffle_buffer={size}")
        return dataclasses.replace(self, shuffle=True, shuffle_buffer=size)

    def for_container(self) -> LoaderOptions:
        """These options for a container. Raises ``ValueError`` for a stream's shuffle
        buffer (``shuffle_buffer=``, or the int of ``shuffle=``)."""
        if not (is_flag(self.shuffle) or self.shuffle == "quasi"):
            raise ValueError(
                f"shuffle must be False, True or 'quasi', got {self.shuffle!r} (an int "
                f"was a stream's shuffle buffer: shuffle_buffer=)"
            )
        if self.shuffle_buffer is not None:
            raise ValueError(
                "shuffle_buffer= is the size of a stream's shuffle buffer; a container is "
                "shuffled whole by shuffle=True: leave shuffle_buffer=None"
            )
        return self


def _checked_shuffle(shuffle: Any) -> Shuffle:
    """``shuffle`` as False, True, "quasi", or the deprecated int > 0 of a stream's
    shuffle buffer (resolved by ``for_stream``)."""
    if is_flag(shuffle):
        return bool(shuffle)
    if isinstance(shuffle, str) and shuffle == "quasi":
        return "quasi"
    if is_size(shuffle) and shuffle > 0:
        return int(shuffle)
    raise ValueError(
        f"shuffle must be False, True or 'quasi', got {shuffle!r} (a stream's shuffle "
        f"buffer is shuffle_buffer=, an int > 0)"
    )


def _check_shuffle_buffer(shuffle: Shuffle, shuffle_buffer: int | None) -> None:
    if shuffle_buffer is None:
        return
    check_size("shuffle_buffer", shuffle_buffer)
    if shuffle is not True:
        raise ValueError(
            f"shuffle_buffer= sizes the buffer of a stream shuffled with shuffle=True, "
            f"got shuffle={shuffle!r}: pass shuffle=True too"
        )


def _check_partitions(shuffle: Shuffle, partitions: Any) -> None:
    if partitions is None or (isinstance(partitions, str) and partitions == "auto"):
        return
    if not is_size(partitions) or partitions < 1:
        raise ValueError(f"partitions must be an int >= 1, 'auto' or None, got {partitions!r}")
    if shuffle != "quasi":
        raise ValueError(
            f"partitions= deals a packed dataset's blocks for shuffle='quasi', got "
            f"shuffle={shuffle!r}: leave partitions='auto'"
        )


def _check_samplers(options: LoaderOptions) -> None:
    shuffle, sampler = options.shuffle, options.sampler
    if sampler is not None and shuffle:
        raise ValueError(
            "sampler= gives the order: leave shuffle=False (the sampler draws "
            "from the loader's seed and the epoch)"
        )
    if options.batch_sampler is not None and (
        sampler is not None or shuffle or options.drop_last or options.batch_size not in (None, 1)
    ):
        raise ValueError(
            "batch_sampler= forms the batches: it excludes batch_size, "
            "shuffle, sampler and drop_last"
        )


def _check_buffers(buffer: Any, batch_size: int | None) -> None:
    """Raise ``TypeError`` unless ``buffer`` is arrays (an array, or a tuple/dict of
    them), and ``ValueError`` when one is read-only or does not hold ``batch_size`` rows."""
    leaves = tree_leaves(buffer)
    if not leaves or not all(isinstance(leaf, np.ndarray) for leaf in leaves):
        raise TypeError(
            f"buffer must be True, False, or arrays to fill in place (a numpy array, or a "
            f"tuple/dict of them shaped like one batch), got {type(buffer).__name__}"
        )
    for leaf in leaves:
        if not leaf.flags.writeable:
            raise ValueError("buffer= must be writeable: it is filled in place")
        if batch_size is not None and (leaf.ndim == 0 or leaf.shape[0] != batch_size):
            raise ValueError(
                f"buffer= holds one batch of batch_size={batch_size} observations along "
                f"its first axis, got an array of shape {leaf.shape}"
            )
