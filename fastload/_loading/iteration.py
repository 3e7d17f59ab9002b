"""A loader's epochs and their iteration: the order of each epoch (``_loading/epochs.py``)
or a stream's rounds (``_loading/rounds.py``) made a ``Schedule`` and handed with the
container to the loader's ``Engine`` (which starts the feeds of the data under it:
checks and fetches of packed datasets); ``buffer=`` arrays of the user's
filled with each step (``_loading/filled.py``); and the loader's ``stats()``.

``IteratingLoader`` is the base of ``fastload.EpochLoader``: it holds what a loader is
made of and iterates it; ``_loading/resume.py`` adds its state, ``loader.py`` the public
surface.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import _core
from .._base.collate import Collate
from .._base.protocols import Blockwise, FilePages, PagedFiles
from .._base.tree import found_under, replaced
from ..mixtures import Mixture, mixture_of
from ..obs import Container, numobs
from ..samplers import BatchSampler, Sampler
from ..streams import stream_source
from .engine import Engine
from .epochs import Epochs
from .filled import filled
from .options import LoaderOptions
from .rounds import DEFAULT_BUFFER, StreamEpochs
from .schedule import Schedule, folded_views
from .sharding import default_seed, resolve_shard

__all__ = ["IteratingLoader", "StatsReport"]


class StatsReport(dict[str, Any]):
    """Throughput of a loader and where the consumer's time went, as a dict (times in
    seconds) that prints as one short line; over a ``fastload.mix``, ``"sources"`` too."""

    def __init__(self, stats: Any) -> None:
        total = stats.wait_s + stats.compute_s
        super().__init__(
            items=stats.items,
            batches=stats.batches,
            items_per_s=stats.items / total if total > 0 else 0.0,
            wait_s=stats.wait_s,
            compute_s=stats.compute_s,
            wait_fraction=stats.wait_s / total if total > 0 else 0.0,
            skipped=stats.skipped,
        )

    def __str__(self) -> str:
        skipped = f", {self['skipped']:,} skipped" if self["skipped"] else ""
        # A mix's sources: "(700 of web, 300 of books this epoch)".
        sources = ", ".join(f"{n:,} of {name}" for name, n in self.get("sources", {}).items())
        sources = f" ({sources} this epoch)" if sources else ""
        return (
            f"{self['items']:,} items in {self['batches']:,} batches{sources}{skipped}: "
            f"{self['items_per_s']:,.0f} items/s, waited for data "
            f"{100 * self['wait_fraction']:.0f}% of the time"
        )


def _block_bounds(data: Container) -> npt.NDArray[np.int64] | None:
    """Block boundaries of the packed dataset under ``data``, or None."""
    found = found_under(data, lambda d: d.block_bounds if isinstance(d, Blockwise) else None)
    return found[0] if found else None


def _file_pages(data: Container) -> list[FilePages]:
    """The ``FilePages`` of the memory-mapped packed datasets under ``data``, each once."""
    found: dict[int, FilePages] = {}
    for pages in found_under(data, lambda d: d.file_pages if isinstance(d, PagedFiles) else None):
        found.setdefault(id(pages), pages)
    return list(found.values())


def _warn_random_reads(pages: list[FilePages]) -> None:
    """Warn when a packed dataset read in random order does not fit in memory."""
    for p in pages:
        if not p.fits_in_memory():
            warnings.warn(
                f"shuffle=True reads a packed dataset of {p.nbytes / 2**30:.1f} GiB "
                f"in random order, but it is larger than the memory this process "
                f"may use (its memory cgroup's limit, or the RAM): the page cache "
                f"cannot hold it, so each epoch reads the files at random from "
                f"disk, hundreds of times slower than in order. Use "
                f"shuffle='quasi' (blocks in random order, shuffled a wave at a "
                f"time), which reads at about the disk's sequential rate",
                UserWarning,
                stacklevel=4,
            )
            return


class IteratingLoader:
    """What a loader is made of (its options, engines, shard, seed and epochs) and its
    iteration: each ``iter()`` loads the next epoch (or the rest of one, after a resume).
    The base of ``fastload.EpochLoader``; not made directly."""

    _stream: StreamEpochs | None  # a stream's epochs, or
    _epochs: Epochs | None  # a container's
    _pages: Any  # the FilePages read ahead in the quasi-random order

    def __init__(self, data: Container, options: LoaderOptions) -> None:
        source = stream_source(data)
        options = options.for_stream() if source is not None else options.for_container()
        self.options = options
        self._target = options.buffers
        self._engine = Engine(options.engine, allocator=options.allocator)
        self._engines = [self._engine]
        self.data = data
        self.rank, self.world_size = resolve_shard(options.shard)
        self.seed = default_seed(options.seed, self.world_size)
        self._epoch = 0  # the epoch the next iter() starts
        self._resume_at = 0  # the step it starts at (after load_state_dict)
        self._progress: _core.Progress | None = (
            None  # of the latest iteration: epoch, steps delivered
        )
        self._stats = _core.Stats()
        self._warned_skips = False
        self._read_ahead = None
        self._stream = self._epochs = self._pages = None
        self._mixture: Mixture | None = None
        if source is not None:
            self._open_stream(source)
        else:
            self._open_container(options.sampler, options.batch_sampler)

    def _open_stream(self, source: Any) -> None:
        # Two engines: a round loads on one while the one before it is delivered.
        engines = [self._engine]
        if self.options.parallel is not False:
            engines.append(Engine(self.options.engine, allocator=self.options.allocator))
        self._engines = engines
        buffer = (self.options.shuffle_buffer or DEFAULT_BUFFER) if self.options.shuffle else 0
        self._stream = StreamEpochs(
            self.data,
            source,
            engines,
            self.options.batch_size,
            shuffle_buffer=buffer,
            drop_last=self.options.drop_last,
            collate=Collate.of(self.options.collate),
            rank=self.rank,
            world_size=self.world_size,
            skip=self.options.on_error == "skip",
        )

    def _open_container(self, sampler: Sampler | None, batch_sampler: BatchSampler | None) -> None:
        data, shuffle = self.data, self.options.shuffle
        self._mixture = mixture_of(data)
        if self._mixture is not None:
            sampler = _mixed_order(self._mixture, self.options)
        block_bounds = _block_bounds(data) if shuffle == "quasi" else None
        if shuffle == "quasi" and block_bounds is None:
            raise ValueError(
                "shuffle='quasi' reads a packed dataset block by block; this "
                "data has no blocks (use shuffle=True)"
            )
        self._n = numobs(data)
        self._epochs = Epochs(
            self._n,
            self.options.batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            drop_last=self.options.drop_last,
            collate=Collate.of(self.options.collate),
            rank=self.rank,
            world=self.world_size,
            block_bounds=block_bounds,
            partitions=self.options.partitions,
        )
        pages = _file_pages(data)
        if shuffle is True:
            _warn_random_reads(pages)
        # Read ahead in the quasi-random order: the pages of the dataset it follows.
        self._pages = next((p for p in pages if p.block_bounds is block_bounds), None)

    def schedule(self, epoch: int, start: int = 0) -> Schedule:
        """The ``Schedule`` of ``epoch`` from step ``start``: what the engine loads."""
        if self._stream is not None:
            raise TypeError("a stream has no schedule drawn up front")
        return self._epochs.schedule(self.seed, epoch, start)  # type: ignore[union-attr]

    def _steps(self, seed: int, epoch: int) -> int:
        # Called for a container only (a stream has no steps known up front).
        return self._epochs.steps(seed, epoch)  # type: ignore[union-attr]

    def __iter__(self) -> Iterator[Any]:
        epoch, start = self._epoch, self._resume_at
        self._epoch, self._resume_at = epoch + 1, 0
        self._progress = _core.Progress(epoch, start)
        if self._stream is not None:
            steps = self._stream.iterate(
                self.seed, epoch, start, self._stats, self._progress, self._epoch_done
            )
        else:
            steps = self._iterate_container(epoch, start)
        if self._target is None:
            return steps
        batched = self.options.batch_size is not None or self.options.batch_sampler is not None
        return filled(self._target, steps, batched)

    def _iterate_container(self, epoch: int, start: int) -> Iterator[Any]:
        # The obsview layers at the top of the data fold into the order: the engine loads
        # the container under them item by item (natively where it can), not whole steps
        # through the views.
        data, indices = folded_views(self.data)
        if self._mixture is not None:  # its sources' fields, joined (natively where they load)
            data = replaced(data, self._mixture, self._mixture.joined)
        schedule = self.schedule(epoch, start).through(indices)
        self._stop_read_ahead()
        if self._pages is not None:
            self._read_ahead = self._pages.read_ahead(schedule.order, schedule.rows, schedule.start)
        # Started by the engine once it runs (worker processes are forked by then); stopped
        # at the end of the epoch, by the next one, or when the iteration is dropped.
        reading = self._read_ahead
        return self._engine.iterate(
            data,
            schedule,
            stats=self._stats,
            progress=self._progress,
            on_end=self._epoch_done,
            feeds=() if reading is None else (reading,),
        )

    def _stop_read_ahead(self) -> None:
        ahead, self._read_ahead = self._read_ahead, None
        if ahead is not None:
            ahead.close()

    def _epoch_done(self) -> None:
        self._stop_read_ahead()
        # The next epoch's order is finished within this epoch: no thread of the loader
        # works on between epochs (its time counts in this epoch's, where it belongs).
        if self._epochs is not None:
            self._epochs.finish_ahead()
        if self._stats.skipped and not self._warned_skips:
            self._warned_skips = True
            warnings.warn(
                f"skipped {self._stats.skipped} observations (or files of a stream) that "
                f"failed to load (on_error='skip'); loader.stats()['skipped'] keeps the count",
                RuntimeWarning,
                stacklevel=2,
            )

    def stats(self) -> StatsReport:
        """Items/s and where the time went since the loader was made: a dict with
        ``items``, ``batches``, ``items_per_s``, ``wait_s`` (consumer waiting for data),
        ``compute_s`` (consumer busy between batches), ``wait_fraction`` and ``skipped``.
        A large ``wait_fraction`` means training is input-bound. It prints as one line::

            12,800 items in 50 batches: 9,850 items/s, waited for data 3% of the time
        """
        report = StatsReport(self._stats)
        if self._mixture is not None:
            report["sources"] = self._source_items()
        return report

    def _source_items(self) -> dict[str, int]:
        """Name -> the items of each source of the mix in this rank's steps delivered of
        the epoch being iterated (or the last one; the next one before any)."""
        live = self._progress
        epoch, step = (live.epoch, live.step) if live is not None else (self._epoch, 0)
        order = self._epochs.order(self.seed, epoch)  # type: ignore[union-attr]
        done = min(len(order), step * (self.options.batch_size or 1))
        return self._mixture.source_counts(order[:done])  # type: ignore[union-attr]


def _mixed_order(mixture: Mixture, options: LoaderOptions) -> Sampler:
    """The order of ``mixture``'s epochs, for a loader with ``options``: its sampler.
    Raises ``ValueError`` for an order of the loader's own (shuffle, samplers)."""
    for name, value in (
        ("shuffle", options.shuffle),
        ("sampler", options.sampler),
        ("batch_sampler", options.batch_sampler),
    ):
        if value is not None and value is not False:
            raise ValueError(
                f"a fastload.mix draws its own order each epoch (its sources interleaved at "
                f"random): leave {name} out (got {name}={value!r}; to draw its packed "
                f"datasets block by block, give the mix shuffle='quasi')"
            )
    return mixture.order
