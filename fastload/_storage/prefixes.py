"""A folder that a write in parts fills: a local directory, or a prefix at a URL (any
fsspec store), with the few operations that the parts and their manifest need.

``local`` is where a local folder's file is written in place; ``put`` uploads a finished
file under its final name (a part's name is unique to its attempt, so nothing else ever
writes it); ``publish`` makes a small file appear whole
(locally a temporary file renamed, flushed to disk first; at a URL a single PUT, which an
object store makes visible at once or not at all). Transient failures of a store are
tried again for a minute (``remote.Retries``); what the store refuses raises.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from typing import Any

from fastload._storage.remote import Retries, is_url

__all__ = ["Prefix"]

STORE_TIMEOUT_S = 60.0


class Prefix:
    """The folder ``where`` (a local path or a URL; ``storage_options``: fsspec's)."""

    def __init__(self, where: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.where = where.rstrip("/") if is_url(where) else os.path.abspath(where)
        self.remote = is_url(where)
        if not self.remote and storage_options is not None:
            raise ValueError(f"storage_options are for a URL; {where!r} is a local path")
        self.options = dict(storage_options or {})
        self._fs: Any = None
        self._key = ""

    def __repr__(self) -> str:
        return f"Prefix({self.where!r})"

    def _store(self) -> tuple[Any, str, Retries]:
        if self._fs is None:
            from fsspec.core import url_to_fs

            self._fs, key = url_to_fs(self.where, **self.options)
            self._key = key.rstrip("/")
        return self._fs, self._key, Retries(self.where, STORE_TIMEOUT_S)

    def make(self) -> None:
        """Create the folder (locally; a store's prefixes need no creating)."""
        if not self.remote:
            os.makedirs(self.where, exist_ok=True)

    def local(self, name: str) -> str | None:
        """The path of the file ``name`` in a local folder; None at a URL."""
        return None if self.remote else os.path.join(self.where, name)

    def names(self) -> list[str]:
        """The names of the files in the folder ([] when there is none)."""
        if not self.remote:
            try:
                return [e.name for e in os.scandir(self.where) if e.is_file()]
            except FileNotFoundError:
                return []
        fs, key, store = self._store()
        fs.invalidate_cache(key)
        try:
            listing = store.call(lambda: fs.ls(key, detail=True))
        except FileNotFoundError:
            return []
        return [
            str(i["name"]).rstrip("/").rsplit("/", 1)[-1] for i in listing if i["type"] == "file"
        ]

    def read(self, name: str) -> bytes:
        """The bytes of the file ``name``."""
        if not self.remote:
            with open(os.path.join(self.where, name), "rb") as f:
                return f.read()
        fs, key, store = self._store()
        data: bytes = store.call(lambda: fs.cat_file(f"{key}/{name}"))
        return data

    def put(self, local: str, name: str) -> None:
        """Place the finished local file ``local`` in the folder as ``name`` (moved
        locally, uploaded at a URL: a local folder's files are best written in place,
        ``local(name)``)."""
        if not self.remote:
            os.replace(local, os.path.join(self.where, name))
            return
        fs, key, store = self._store()
        store.call(lambda: fs.put_file(local, f"{key}/{name}"))

    def publish(self, name: str, data: bytes) -> None:
        """Make the file ``name`` hold ``data``, all at once: readers see the old file or
        the new one, never a part of it."""
        if self.remote:
            fs, key, store = self._store()
            store.call(lambda: fs.pipe_file(f"{key}/{name}", data))
            fs.invalidate_cache(key)
            return
        tmp = os.path.join(self.where, f".{name}.{uuid.uuid4().hex[:12]}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, os.path.join(self.where, name))
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        fd = os.open(self.where, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename survives a power loss
        finally:
            os.close(fd)

    def remove(self, names: list[str]) -> None:
        """Remove the files ``names`` of the folder (those already gone are skipped)."""
        if not self.remote:
            for name in names:
                try:
                    os.unlink(os.path.join(self.where, name))
                except FileNotFoundError:
                    pass
            return
        if names:
            fs, key, store = self._store()
            store.call(lambda: fs.rm([f"{key}/{name}" for name in names]))
            fs.invalidate_cache(key)
