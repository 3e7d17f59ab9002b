"""What reading ahead of a loader stands on, for a local file's pages (``readahead.py``)
and for a dataset at a URL's blocks (``remotefiles.Prefetch``) alike: per epoch, which
blocks the order reads and at which positions first and last (``BlockUses``), and how
far the consumer has delivered its steps, handed out in any order (``Delivered``).
A block whose last position lies before what was delivered is read no more this epoch:
the two feeds let go of it then, each in its own way (pages dropped from the page cache;
a block given back to the table of a dataset at a URL)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["BlockUses", "Delivered"]


class BlockUses:
    """The blocks that ``rows`` (the order's rows from position ``start`` on) read, each
    once, by their first use: ``blocks`` (indices, by ``bounds``, the blocks' row
    boundaries), and ``first`` and ``last``, the positions (in the whole order, from
    ``start``) of the first and the last row that reads each. Ties of first use go to the
    lower block."""

    def __init__(self, bounds: npt.ArrayLike, rows: npt.NDArray[np.int64], start: int = 0) -> None:
        block = np.searchsorted(np.asarray(bounds), rows, side="right") - 1
        used, first = np.unique(block, return_index=True)
        _, from_end = np.unique(block[::-1], return_index=True)
        last = len(block) - 1 - from_end
        by_first = np.lexsort((used, first))
        self.blocks: npt.NDArray[np.int64] = used[by_first].astype(np.int64)
        self.first: npt.NDArray[np.int64] = (first[by_first] + start).astype(np.int64)
        self.last: npt.NDArray[np.int64] = (last[by_first] + start).astype(np.int64)

    def __len__(self) -> int:
        return len(self.blocks)

    def steps(self, rows: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The first and last steps that read each block, steps of ``rows`` positions."""
        return self.first // rows, self.last // rows


class Delivered:
    """The steps a consumer handed out, from ``first_step`` on, in any order: ``low`` is
    the first step not handed out yet (every step before it was). Not thread-safe: its
    owner calls it under its own lock."""

    def __init__(self, first_step: int) -> None:
        self.low = int(first_step)
        self._early: set[int] = set()  # handed out, past a step that was not yet

    def add(self, step: int) -> bool:
        """``step`` was handed out; True when ``low`` moved on."""
        if step != self.low:
            if step > self.low:
                self._early.add(step)
            return False
        self.low += 1
        while self.low in self._early:
            self._early.discard(self.low)
            self.low += 1
        return True
