"""Streams: sources of records that have no length, read from the start each epoch.

A stream is any iterable that is not a container (no ``__len__``/``__getitem__``): a
PyTorch ``IterableDataset``, a Hugging Face streaming dataset, an object whose
``__iter__`` yields records, a generator (one epoch only: it cannot start over), or
``Shards``: files (local or URLs) read one after the other. ``mapobs(f, stream)`` is a
stream of ``f`` applied to each record. How a loader reads a stream is in
``windows.py``; this module says what a stream is and which records a rank reads::

    rank's records:  Shards          -> the epoch's files [rank::world], read in turn
                     .shard() source -> source.shard(num_shards=world, index=rank)
                     any other       -> every world-th record, from the rank-th

URLs are read through fsspec (``pip install fsspec``, with ``aiohttp`` for HTTP), imported
only when a URL is opened.
"""

from __future__ import annotations

import collections.abc
import itertools
import os
import sys
import tarfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, Any

import numpy as np

from .obs import Container, numobs
from .tree import rebuild
from .views import MappedObs

__all__ = ["Shards", "open_shard", "rank_records", "stream_source", "tar_samples"]


def _is_url(path: str | os.PathLike[str]) -> bool:
    return "://" in str(path)


def open_shard(path: str | os.PathLike[str]) -> IO[bytes]:
    """A binary file object for ``path``: a local file, or a URL through fsspec. Raises
    ``ImportError`` naming the package when a URL needs fsspec and it is missing."""
    if not _is_url(path):
        return open(path, "rb")
    try:
        import fsspec
    except ImportError:
        raise ImportError(f"reading {path} needs fsspec (pip install fsspec aiohttp)") from None
    return fsspec.open(str(path), "rb").open()


class Shards:
    """A stream of the records of several files, read one after the other:
    ``read(f)`` gives the records of one file from ``f``, a binary file object open on it.
    ``paths`` are local paths or URLs (``s3://``, ``gs://``, ``https://``, ... through
    fsspec), so every machine of a cluster can read one copy of a dataset.

    In a loader, the files are the unit of sharding (each rank reads its own) and of
    shuffling (a new file order each epoch with ``shuffle``), as webdataset's shards::

        stream = Shards(["s3://bucket/train-000.tar", ...], read=tar_samples)
        lines = Shards(glob.glob("data/*.jsonl"), read=lambda f: map(json.loads, f))

    Raises ``ValueError`` for no paths and ``TypeError`` when ``read`` is not callable.
    """

    def __init__(
        self,
        paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
        read: Callable[[IO[bytes]], Iterable[Any]],
    ) -> None:
        if isinstance(paths, (str, bytes, os.PathLike)):
            paths = [paths]
        self.paths = [os.fspath(p) if isinstance(p, os.PathLike) else p for p in paths]
        if not self.paths:
            raise ValueError("Shards needs at least one path")
        if not callable(read):
            raise TypeError(f"read must be a callable f -> records, got {type(read).__name__}")
        self.read = read

    def records(self, path: str) -> Iterator[Any]:
        """The records of the file at ``path``."""
        with open_shard(path) as f:
            yield from self.read(f)

    def __iter__(self) -> Iterator[Any]:
        for path in self.paths:
            yield from self.records(path)

    def __repr__(self) -> str:
        return f"Shards({len(self.paths)} files, read={getattr(self.read, '__name__', self.read)})"


def tar_samples(f: IO[bytes]) -> Iterator[dict[str, Any]]:
    """The samples of a tar file in webdataset's layout, read as a stream: consecutive
    members that share a name up to the first dot of the file name form one sample, a
    dict ``{"__key__": name, ext: bytes, ...}`` (``a/b.jpg``, ``a/b.cls`` ->
    ``{"__key__": "a/b", "jpg": ..., "cls": ...}``)."""
    sample: dict[str, Any] | None = None
    with tarfile.open(fileobj=f, mode="r|*") as tar:
        for member in tar:
            if not member.isfile():
                continue
            folder, name = os.path.split(member.name)
            stem, _, ext = name.partition(".")
            key = os.path.join(folder, stem)
            if sample is not None and sample["__key__"] != key:
                yield sample
                sample = None
            if sample is None:
                sample = {"__key__": key}
            sample[ext] = tar.extractfile(member).read()  # type: ignore[union-attr]  # isfile()
    if sample is not None:
        yield sample


def _is_torch_iterable(data: object) -> bool:
    """A PyTorch IterableDataset: a stream even when it has a ``__len__`` (its
    ``__getitem__`` is the base class's, which raises)."""
    data_module = sys.modules.get("torch.utils.data")
    base = getattr(data_module, "IterableDataset", None)
    return base is not None and isinstance(data, base)


def _is_stream(data: object) -> bool:
    if _is_torch_iterable(data):
        return True
    try:
        numobs(data)
        return False
    except TypeError:
        return isinstance(data, collections.abc.Iterable)


def stream_source(data: Container) -> Any:
    """The stream under ``data`` (itself, or under ``mapobs`` and the members of tuples
    and dicts), or None when ``data`` is a container. Raises ``ValueError`` when the
    members mix a stream with other data or with another stream."""
    found = set()
    leaves = []

    def walk(x: Any) -> None:
        if isinstance(x, MappedObs):
            walk(x.data)
        elif isinstance(x, (tuple, dict)) and not hasattr(x, "__numobs__"):
            for member in x.values() if isinstance(x, dict) else x:
                walk(member)
        else:
            leaves.append(x)
            if _is_stream(x):
                found.add(id(x))

    walk(data)
    if not found:
        return None
    streams = [leaf for leaf in leaves if id(leaf) in found]
    if len(found) > 1 or len(streams) != len(leaves):
        raise ValueError(
            "a loader reads one stream: its views (mapobs, tuples, dicts) "
            "must all be of the same stream, without containers beside it"
        )
    return streams[0]


def substitute(data: Container, source: Iterable[Any], records: Sequence[Any]) -> Any:
    """``data`` with the stream ``source`` replaced by the container ``records``: the
    views of a stream made views of one window of its records."""
    if data is source:
        return records
    if isinstance(data, MappedObs):
        return MappedObs(data.f, substitute(data.data, source, records), data.batched)
    if isinstance(data, dict):
        return {k: substitute(v, source, records) for k, v in data.items()}
    return rebuild(data, [substitute(v, source, records) for v in data])


def is_one_shot(source: object) -> bool:
    """True for an iterator (a generator): it cannot start over for a new epoch."""
    return isinstance(source, collections.abc.Iterator)


def _shard_count(source: Any) -> int | None:
    count = getattr(source, "num_shards", None)
    if count is None:
        count = getattr(source, "n_shards", None)
    return count if isinstance(count, int) and callable(getattr(source, "shard", None)) else None


def rank_records(
    source: Any, rank: int, world: int, seed: int, epoch: int, shuffle_files: bool
) -> Iterator[Any]:
    """The records of ``source`` that ``rank`` of ``world`` reads in ``epoch``, in order.
    ``Shards`` are shared out by file (in a new order each epoch when ``shuffle_files``),
    a source with ``shard(num_shards, index)`` and a number of shards that ``world``
    divides by its own shards, anything else record by record (every rank reads it all).
    A source with ``set_epoch`` is told the epoch first (a Hugging Face dataset reshuffles
    its own files then). Raises ``ValueError`` when there are fewer files than ranks."""
    set_epoch = getattr(source, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)
    if isinstance(source, Shards):
        paths = source.paths
        if len(paths) < world:
            raise ValueError(
                f"{len(paths)} files cannot be shared out over {world} ranks: "
                f"each rank reads whole files"
            )
        if shuffle_files:
            rng = np.random.Generator(np.random.PCG64([int(seed), int(epoch)]))
            paths = [paths[k] for k in rng.permutation(len(paths))]
        return itertools.chain.from_iterable(source.records(p) for p in paths[rank::world])
    if world == 1:
        return iter(source)
    count = _shard_count(source)
    if count is not None and count % world == 0:
        return iter(source.shard(num_shards=world, index=rank))
    return itertools.islice(iter(source), rank, None, world)
