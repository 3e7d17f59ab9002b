"""What a packed dataset feeds the engine (``_loading.seams.Feed``), offered through one
protocol (``_base.protocols.FeedSource``) by the dataset and each of its columns.

A dataset's ``RowFeed`` holds its row checks (``verify_rows``: files that shrank or were
rewritten, checksums with ``verify="read"``) and, at a URL, its ``RemoteRows``. For each
iteration over data under which the engine finds such sources, it asks one of them for
the iteration's feed (``RowFeed.feed``, for all of them together)::

    DatasetFeed
      |-- gate, delivered, start, close: a Prefetch over the datasets at a URL (None local)
      |-- ensure(rows): their blocks of rows, fetched now (a worker process's)
      '-- check(rows): what failed to fetch, then each dataset's row checks

Whatever path loads the data (threads, the caller's thread, worker processes, the drop-in
PyTorch loader), the feed is the same one, started by the engine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from fastload._base.protocols import FeedSource

__all__ = ["DatasetFeed", "RowFeed"]

_Rows = int | npt.NDArray[np.int64]


class RowFeed(FeedSource):
    """The feed source of a packed dataset: ``checks`` (its ``verify_rows``, or None) and
    ``remote`` (its ``RemoteRows`` at a URL, None for local files)."""

    def __init__(self, checks: Callable[[_Rows], None] | None, remote: Any) -> None:
        self.checks, self.remote = checks, remote

    def ensure(self, rows: _Rows) -> None:
        """Fetch the blocks of ``rows`` not there yet (at a URL); raises ``LoadError``
        naming the URL when that fails."""
        if self.remote is not None:
            self.remote.ensure(rows)

    def holding(self, rows: _Rows) -> contextlib.AbstractContextManager[None]:
        """Keep the blocks of ``rows`` from being let go while they are read (at a URL,
        bounded: ``RemoteRows.holding``)."""
        if self.remote is None:
            return contextlib.nullcontext()
        held: contextlib.AbstractContextManager[None] = self.remote.holding(rows)
        return held

    def feed(
        self,
        order: npt.NDArray[np.int64],
        start: int,
        first_step: int,
        step_end: Callable[[int], int],
        slack: int,
        together: Sequence[FeedSource],
    ) -> DatasetFeed | None:
        """The feed of one iteration over ``order[start:]`` for the datasets of
        ``together`` (``RowFeed``s), or None when none has anything to feed."""
        sources = [s for s in together if isinstance(s, RowFeed)] or [self]
        checks = _each_once([s.checks for s in sources if s.checks is not None])
        remotes = _each_once([s.remote for s in sources if s.remote is not None])
        if not remotes and not checks:
            return None
        prefetch = None
        if remotes:
            from fastload._storage.remotefiles import Prefetch

            prefetch = Prefetch(
                remotes, order, start, first_step=first_step, step_end=step_end, slack=slack
            )
        return DatasetFeed(prefetch, remotes, checks)


class DatasetFeed:
    """One iteration's feed over packed datasets (a ``_loading.seams.Feed``): the
    ``Prefetch`` of those at a URL (None: all local), their ``RemoteRows`` and the row
    checks of all."""

    def __init__(
        self, prefetch: Any, remotes: Sequence[Any], checks: Sequence[Callable[[_Rows], None]]
    ) -> None:
        self.prefetch, self.remotes, self.checks = prefetch, list(remotes), list(checks)
        self.gate: npt.NDArray[np.int64] | None = None if prefetch is None else prefetch.gate

    def start(self, gated: bool) -> None:
        """Start fetching ahead; ``gated``: the native run waits at the gate."""
        if self.prefetch is not None:
            self.prefetch.start(gated)

    def check(self, rows: npt.NDArray[np.int64]) -> None:
        """Raise what failed to fetch for ``rows``, then what the datasets' checks find."""
        if self.prefetch is not None:
            self.prefetch.check(rows)
        for check in self.checks:
            check(rows)

    def delivered(self, step: int) -> None:
        """Let go of the blocks (of bounded datasets) that no step to come reads."""
        if self.prefetch is not None:
            self.prefetch.delivered(step)

    def ensure(self, rows: npt.NDArray[np.int64]) -> None:
        """Fetch the blocks of ``rows`` not there yet."""
        for remote in self.remotes:
            remote.ensure(rows)

    def close(self) -> None:
        """Stop fetching ahead (idempotent, never blocks)."""
        if self.prefetch is not None:
            self.prefetch.close()


def _each_once(items: list[Any]) -> list[Any]:
    found: dict[int, Any] = {}
    for item in items:
        found.setdefault(id(item), item)
    return list(found.values())
