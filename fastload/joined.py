"""The fields of several sources of one layout, each joined into one container: what
``fastload.mix`` loads (``mixtures.py``). Observation ``offsets[s] + j`` of a joined field
is observation ``j`` of source ``s``'s field.

A field is joined so that it loads as the fields themselves do, natively where they do:

- numpy arrays of one dtype and row shape are concatenated (a copy, up to
  ``CONCAT_BYTES`` in all): gathered in C without the GIL;
- ``mapobs(Compose([...]), images)`` with one pipeline over the encoded items of packed
  datasets (``SpannedBytes``) becomes that pipeline over ``JoinedBytes``, the items of all
  of them as spans of their mapped files: decoded in C without the GIL. The datasets'
  row checks (files rewritten under the read, ``verify="read"``) are run through
  ``MixedFeed``, each on its own rows;
- anything else (a larger array, a table, a source at a URL, Python containers) is a
  ``JoinedField``: read item by item through Python, each source's rows brought in
  (fetched, at a URL) and held while they are read.

The mix's ``MixedFeed`` gives each packed dataset under a source its own rows in the order
the mix reads them, with the mix's steps: a dataset at a URL is fetched ahead and, bounded
by ``memory_bytes``, its blocks let go once the steps that read them were delivered, as
it would be alone. An image chain that decodes a dataset's stored bytes at a URL reads
them without pinning their block (``reads_copied``): its output is a new array.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ._base.protocols import FeedSource, FetchedRows, SpannedBytes
from ._base.tree import fed_under, found_under
from ._images.imagesources import is_image_chain
from ._storage.remotefiles import reads_copied
from .obs import Container, Index, getobs, getobs_into, is_batch_index, normalize_index
from .views import JoinedObs, MappedObs, locate_part

__all__ = [
    "CONCAT_BYTES",
    "JoinedBytes",
    "JoinedField",
    "MixedFeed",
    "is_remote",
    "join_field",
    "mixed_feed",
]

CONCAT_BYTES = 1 << 28  # arrays joined by a copy up to this size (256 MiB); larger: Python

_Rows = int | npt.NDArray[np.int64]


def _split(offsets: npt.NDArray[np.int64], rows: _Rows) -> Iterator[tuple[int, Any]]:
    """``(source, its rows)`` of the joined ``rows``, for each source that has some."""
    rows = np.atleast_1d(np.asarray(rows, np.int64))
    part = np.searchsorted(offsets, rows, side="right") - 1
    for s in np.unique(part):
        yield int(s), rows[part == s] - offsets[s]


def is_remote(data: Container) -> bool:
    """True when rows of ``data`` are fetched from object storage (a dataset at a URL)."""
    return bool(found_under(data, lambda d: d.remote_rows if isinstance(d, FetchedRows) else None))


class MixedFeed(FeedSource):
    """The feeds of the packed datasets under the sources of a mix, each given its own
    rows: ``sources[s]``, the ``FeedSource``s under source ``s`` (local files: their row
    checks; at a URL, the fetching ahead and letting go of its blocks)."""

    def __init__(self, offsets: npt.NDArray[np.int64], sources: list[list[FeedSource]]) -> None:
        self.offsets, self.sources = offsets, sources

    def feed(
        self,
        order: npt.NDArray[np.int64],
        start: int,
        first_step: int,
        step_end: Callable[[int], int],
        slack: int,
        together: Sequence[FeedSource],
    ) -> _SplitFeed | None:
        """Each source's feeds over its own rows of ``order``, in the order the mix reads
        them: position ``p`` of the mix is position ``where[s] < p`` counted of source
        ``s``, so that its steps (``step_end``) are the mix's."""
        order = np.asarray(order, np.int64)
        part = np.searchsorted(self.offsets, order, side="right") - 1
        made: dict[int, list[Any]] = {}
        for s, sources in enumerate(self.sources):
            where = np.flatnonzero(part == s)
            mine = int(np.searchsorted(where, start))
            if not sources or mine == len(where):
                continue

            def end(step: int, where: npt.NDArray[np.int64] = where) -> int:
                return int(np.searchsorted(where, step_end(step)))

            rows = order[where] - self.offsets[s]
            for kind in _by_kind(sources):
                feed = kind[0].feed(rows, mine, first_step, end, slack, kind)
                if feed is not None:
                    made.setdefault(s, []).append(feed)
        return _SplitFeed(self.offsets, made) if made else None

    def ensure(self, rows: _Rows) -> None:
        for s, mine in _split(self.offsets, rows):
            for source in self.sources[s]:
                source.ensure(mine)

    def holding(self, rows: _Rows) -> contextlib.AbstractContextManager[None]:
        parts = list(_split(self.offsets, rows))
        return _all_held([source.holding(mine) for s, mine in parts for source in self.sources[s]])


def _by_kind(sources: Sequence[FeedSource]) -> list[list[FeedSource]]:
    """``sources`` by type, as the engine asks one of each kind for all of that kind."""
    kinds: dict[type, list[FeedSource]] = {}
    for source in sources:
        kinds.setdefault(type(source), []).append(source)
    return list(kinds.values())


@contextlib.contextmanager
def _all_held(managers: list[contextlib.AbstractContextManager[None]]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for manager in managers:
            stack.enter_context(manager)
        yield


class _SplitFeed:
    """One iteration's feeds of the sources of a mix (``_loading.seams.Feed``): each
    checks, brings in and lets go of the rows of its own source. No gate: a source at a
    URL is read through Python (``JoinedField``), which brings in its rows itself."""

    gate = None

    def __init__(self, offsets: npt.NDArray[np.int64], feeds: dict[int, list[Any]]) -> None:
        self.offsets, self.feeds = offsets, feeds

    def _each(self, rows: npt.NDArray[np.int64], call: Callable[[Any, Any], None]) -> None:
        if not len(rows):  # after a failure: every feed names its cause
            for feeds in self.feeds.values():
                for feed in feeds:
                    call(feed, rows)
        for s, mine in _split(self.offsets, rows):
            for feed in self.feeds.get(s, ()):
                call(feed, mine)

    def start(self, gated: bool) -> None:
        for feeds in self.feeds.values():
            for feed in feeds:
                feed.start(False)

    def check(self, rows: npt.NDArray[np.int64]) -> None:
        self._each(rows, lambda feed, mine: feed.check(mine))

    def ensure(self, rows: npt.NDArray[np.int64]) -> None:
        self._each(rows, lambda feed, mine: feed.ensure(mine))

    def delivered(self, step: int) -> None:
        for feeds in self.feeds.values():
            for feed in feeds:
                feed.delivered(step)

    def close(self) -> None:
        for feeds in self.feeds.values():
            for feed in feeds:
                feed.close()


class JoinedBytes(SpannedBytes):
    """The encoded items of several packed datasets (``SpannedBytes``) one after another:
    ``spans()`` of all of them, so that a native pipeline decodes them in C."""

    def __init__(self, parts: Sequence[Any], feed: MixedFeed | None) -> None:
        self.parts = list(parts)
        self.offsets = np.cumsum([0] + [len(p) for p in parts]).astype(np.int64)
        self.row_feed = feed

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def _locate(self, i: int) -> tuple[int, int]:
        return locate_part(self.offsets, i)

    def __getitem__(self, i: Index) -> Any:
        i = normalize_index(i, len(self))
        if is_batch_index(i):
            return [self[int(j)] for j in i]
        part, j = self._locate(i)
        return self.parts[part][j]

    def spans(self) -> tuple[list[np.ndarray], np.ndarray | None, np.ndarray, np.ndarray]:
        bases: list[np.ndarray] = []
        base_of, starts, ends = [], [], []
        for part in self.parts:
            b, of, s, e = part.spans()
            base_of.append((np.zeros(len(s), np.int64) if of is None else of) + len(bases))
            bases.extend(b)
            starts.append(s)
            ends.append(e)
        return bases, np.concatenate(base_of), np.concatenate(starts), np.concatenate(ends)

    def row_source(self, i: int) -> str | None:
        """Where item ``i`` is, for errors (its dataset's ``row_source``)."""
        part, j = self._locate(i)
        row_source = getattr(self.parts[part], "row_source", None)
        return None if row_source is None else str(row_source(j))


class JoinedField(JoinedObs):
    """Fields of several sources one after another, read through Python; the rows of a
    source at a URL are fetched and held while read (``feeds[s]``: its ``FeedSource``s),
    and a field that decodes its stored bytes (an image chain) reads them without pinning
    their blocks. ``row_feed``: the mix's feed (``MixedFeed``), which the engine starts."""

    def __init__(
        self,
        datas: Sequence[Container],
        feeds: list[list[FeedSource]],
        row_feed: MixedFeed | None = None,
    ) -> None:
        super().__init__(*datas)
        self.feeds, self.row_feed = feeds, row_feed
        self.copied = [bool(f) and _decodes(d) for d, f in zip(self.datas, feeds)]

    def _held(self, i: int) -> tuple[int, int, contextlib.ExitStack]:
        part, j = self._locate(i)
        stack = contextlib.ExitStack()
        for source in self.feeds[part]:  # held first: not let go between fetch and read
            stack.enter_context(source.holding(j))
            source.ensure(j)
        if self.copied[part]:
            stack.enter_context(reads_copied())
        return part, j, stack

    def __getobs__(self, i: Index) -> Any:
        i = normalize_index(i, len(self))
        if is_batch_index(i):
            return super().__getobs__(i)
        part, j, held = self._held(i)
        with held:
            value = getobs(self.datas[part], j)
            # A view of a fetched block may be let go after the read: an array is copied.
            return np.array(value) if self.feeds[part] and isinstance(value, np.ndarray) else value

    def __getobs_into__(self, buffer: Any, i: Index) -> Any:
        i = normalize_index(i, len(self))
        if is_batch_index(i):
            return super().__getobs_into__(buffer, i)
        part, j, held = self._held(i)
        with held:
            return getobs_into(buffer, self.datas[part], j)


def _decodes(field: Any) -> bool:
    """Whether ``field`` decodes stored bytes into new arrays, item by item (an image
    chain that starts with ``DecodeImage``): nothing it hands out is a view of them."""
    return is_image_chain(field) and field.f.decodes and not field.batched


def _native_images(fields: Sequence[Any]) -> bool:
    """One per-item pipeline over the encoded items of local packed datasets."""
    first = fields[0]
    return all(
        isinstance(f, MappedObs)
        and not f.batched
        and (f.f is first.f or f.f == first.f)
        and isinstance(f.data, SpannedBytes)
        for f in fields
    )


def join_field(fields: Sequence[Container], feed: MixedFeed | None) -> Container:
    """The sources' ``fields`` (one member of each source, of one layout) as one
    container (see the module docstring); ``feed``: the mix's feed of its local packed
    datasets, which a natively decoded field offers the engine."""
    if any(is_remote(f) for f in fields):
        remote = [fed_under(f) if is_remote(f) else [] for f in fields]
        return JoinedField(fields, remote, feed)
    arrays = all(isinstance(f, np.ndarray) and f.ndim >= 1 for f in fields)
    if arrays and sum(f.nbytes for f in fields) <= CONCAT_BYTES:
        dtypes = {f.dtype for f in fields}
        if len(dtypes) == 1 and not fields[0].dtype.hasobject:
            return np.concatenate([np.asarray(f) for f in fields])
    if _native_images(fields):
        datas = [f.data for f in fields]
        return MappedObs(fields[0].f, JoinedBytes(datas, feed))
    return JoinedField(fields, [[] for _ in fields], feed)


def mixed_feed(sources: Sequence[Container], offsets: npt.NDArray[np.int64]) -> MixedFeed | None:
    """The feed of the packed datasets under ``sources``, local or at a URL (None when
    there are none)."""
    found = [fed_under(s) for s in sources]
    return MixedFeed(offsets, found) if any(found) else None
