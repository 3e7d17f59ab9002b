"""Datasets mixed by proportion, repeat factor or count: ``fastload.mix``.

A mix is a container, the concatenation of its sources (``joined.py``: natively loaded
where the sources are), and the order each epoch draws over it (``MixOrder``), which a
loader uses as it uses a ``sampler=``: sharded, elastic and resumable as any sampler.

The epoch's size and each source's count (the rule; ``counts``):

- ``proportion=``: every source has one (numbers >= 0, not all 0, normalised to sum 1).
  The epoch holds ``epoch_size`` observations (default: the sum of the sources' sizes),
  shared out by the largest remainder: each source gets its proportion of the epoch
  rounded down, and the observations left over go one each to the sources with the
  largest fractions (the first source on a tie), so the counts sum to the epoch exactly.
- otherwise each source has a ``repeat=`` factor (a number >= 0: ``round(repeat * n)``
  observations, half up) or a ``choose=`` count (an int >= 0), and 1 repeat when it has
  neither; the epoch is the sum of the counts (``epoch_size=``, if given, must equal it).

Each epoch, a source of ``n`` observations and count ``c`` gives ``c // n`` whole passes
over it, each in a random order, and ``c % n`` observations drawn without replacement:
no observation twice when ``c <= n``. The sources' draws are then interleaved in a
random order. All of it is drawn from (seed, epoch): the same on every rank.

With ``shuffle="quasi"``, a source over a packed dataset (whose blocks ``block_bounds``
gives) is drawn block by block instead: each pass is a quasi-random order of it (its
blocks in a random order, the rows of each ``wave`` of them shuffled together), and the
``c % n`` rest are the first rows of one more such pass. Interleaving keeps each source's
order, so a dataset at a URL is read a wave of blocks at a time, within its
``memory_bytes``. Sources without blocks are drawn at random as above.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from numbers import Real
from typing import Any

import numpy as np
import numpy.typing as npt

from ._base.arguments import is_flag, is_size
from ._base.protocols import Blockwise
from ._base.randomness import Purpose, generator
from ._base.tree import found_under, unflatten, unwrap
from .joined import join_field, mixed_feed
from .layouts import check_layouts, members
from .obs import Container, Index, getobs, getobs_into, numobs
from .order import DEFAULT_WAVE, quasi_draw
from .views import _View

__all__ = ["MixOrder", "MixSampler", "Mixture", "mix", "mixture_of"]

_PerSource = Sequence[Any] | Mapping[str, Any] | None


class MixOrder:
    """``order(epoch, seed)``: the positions of a mix's epoch (a sampler). ``counts``:
    observations of each source per epoch; ``offsets``: where each source starts;
    ``blocks``: each source's block boundaries to draw it block by block (``"quasi"``,
    a ``wave`` of blocks at a time), None to draw it at random."""

    def __init__(
        self,
        counts: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.int64],
        blocks: Sequence[npt.NDArray[np.int64] | None] | None = None,
        wave: int = DEFAULT_WAVE,
    ) -> None:
        self.counts, self.offsets, self.wave = counts, offsets, wave
        self.blocks = list(blocks) if blocks is not None else [None] * len(counts)

    @property
    def state_kind(self) -> str:
        """What a loader's state records of this order: its type, and how it draws where
        it draws by blocks (a state of one draw is refused by a loader of the other)."""
        name = f"{__name__}.{type(self).__qualname__}"
        if all(b is None for b in self.blocks):
            return name
        return f"{name}(shuffle='quasi', wave={self.wave})"

    def __call__(self, epoch: int, seed: int) -> npt.NDArray[np.int64]:
        parts = []
        for s, count in enumerate(self.counts):
            rng = generator(seed, Purpose.MIX, epoch, s + 1)
            n = int(self.offsets[s + 1] - self.offsets[s])
            passes, rest = divmod(int(count), n) if n else (0, 0)
            blocks = self.blocks[s]
            if blocks is not None:
                drawn = [quasi_draw(n, blocks, rng, self.wave) for _ in range(passes + 1)]
                drawn[-1] = drawn[-1][:rest]
            else:
                drawn = [rng.permutation(n) for _ in range(passes)]
                # The rest without replacement: a few of a large source cost what they are.
                drawn.append(rng.choice(n, rest, replace=False) if rest else np.zeros(0, np.int64))
            parts.append(np.concatenate(drawn) + self.offsets[s])
        which = generator(seed, Purpose.MIX, epoch, 0).permutation(
            np.repeat(np.arange(len(self.counts)), self.counts)
        )
        order = np.empty(len(which), np.int64)
        order[np.argsort(which, kind="stable")] = np.concatenate(parts)
        return order

    def __repr__(self) -> str:
        return f"MixOrder(counts={self.counts.tolist()})"


class MixSampler:
    """A mix's order as a PyTorch-style sampler, for loaders that take one (the drop-in
    ``fastload.torch.DataLoader``): iterating it gives the positions of the epoch set by
    ``set_epoch`` (0 until then) for ``seed``."""

    def __init__(self, order: MixOrder, seed: int) -> None:
        self.order, self.seed, self.epoch = order, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        return iter(self.order(self.epoch, self.seed).tolist())

    def __len__(self) -> int:
        return int(self.order.counts.sum())


class Mixture(_View):
    """The sources of ``fastload.mix``, one after another (a container of
    ``sum(len(source))`` observations), and the order each epoch draws over them
    (``order``, a ``MixOrder``): ``names``, ``sizes``, ``counts`` (a dict, name ->
    observations per epoch), ``epoch_size``."""

    def __init__(
        self,
        names: list[str],
        sources: list[Container],
        counts: list[int],
        blocks: list[npt.NDArray[np.int64] | None] | None = None,
        wave: int = DEFAULT_WAVE,
    ) -> None:
        self.names, self.sources = names, sources
        self.sizes = [numobs(s) for s in sources]
        self.offsets = np.cumsum([0] + self.sizes).astype(np.int64)
        self.counts = dict(zip(names, counts))
        self.epoch_size = sum(counts)
        self.order = MixOrder(np.asarray(counts, np.int64), self.offsets, blocks, wave)
        feed = mixed_feed(sources, self.offsets)
        leaves = [members(s)[0] for s in sources]
        layout = members(sources[0])[1]
        self.joined = unflatten(layout, [join_field(f, feed) for f in zip(*leaves)])

    def __numobs__(self) -> int:
        return int(self.offsets[-1])

    def __getobs__(self, i: Index) -> Any:
        return getobs(self.joined, i)

    def __getobs_into__(self, buffer: Any, i: Index) -> Any:
        return getobs_into(buffer, self.joined, i)

    def sampler(self, seed: int) -> MixSampler:
        """The mix's order for ``seed`` as a sampler (``MixSampler``): for the drop-in
        ``fastload.torch.DataLoader(mixed, sampler=mixed.sampler(seed))``, with
        ``set_epoch(epoch)`` each epoch. ``fastload.DataLoader`` needs none."""
        return MixSampler(self.order, seed)

    def source_counts(self, positions: npt.NDArray[np.int64]) -> dict[str, int]:
        """Name -> how many of ``positions`` (of this container) are of that source."""
        part = np.searchsorted(self.offsets, positions, side="right") - 1
        found = np.bincount(part, minlength=len(self.names))
        return {name: int(c) for name, c in zip(self.names, found)}

    def __repr__(self) -> str:
        return f"Mixture({self.counts}, epoch_size={self.epoch_size})"


def mixture_of(data: Container) -> Mixture | None:
    """The mix whose positions ``data``'s are (itself, or under ``mapobs``), or None."""
    under = unwrap(data)
    return under if isinstance(under, Mixture) else None


def _per_source(name: str, values: _PerSource, names: list[str]) -> list[Any]:
    """``values`` (a sequence, or a dict by name) as one value per source, None for none."""
    if values is None:
        return [None] * len(names)
    if isinstance(values, Mapping):
        unknown = sorted(set(map(str, values)) - set(names))
        if unknown:
            raise ValueError(f"mix: {name} names no source {unknown}; the sources are {names}")
        return [values.get(n) for n in names]
    if isinstance(values, (str, bytes)) or len(values) != len(names):
        raise ValueError(
            f"mix: {name} must give one value per source ({len(names)}, None for a source "
            f"without one), or a dict by name; got {values!r}"
        )
    return list(values)


def _number(name: str, value: Any) -> float:
    if not isinstance(value, Real) or is_flag(value) or not math.isfinite(value) or value < 0:
        raise ValueError(f"mix: {name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _by_proportion(proportions: list[float], sizes: list[int], epoch_size: int | None) -> list[int]:
    total = sum(proportions)
    if total <= 0:
        raise ValueError("mix: the proportions are all 0: give at least one above 0")
    size = sum(sizes) if epoch_size is None else epoch_size
    quotas = [p / total * size for p in proportions]
    counts = [math.floor(q) for q in quotas]
    by_fraction = sorted(range(len(quotas)), key=lambda s: (counts[s] - quotas[s], s))
    for s in by_fraction[: size - sum(counts)]:
        counts[s] += 1
    return counts


def _counts(
    names: list[str], sizes: list[int], settings: dict[str, list[Any]], epoch_size: int | None
) -> list[int]:
    """Each source's observations per epoch, by the rule of the module docstring."""
    given = [[k for k in settings if settings[k][s] is not None] for s in range(len(names))]
    for name, kinds in zip(names, given):
        if len(kinds) > 1:
            raise ValueError(f"mix: source {name!r} has {' and '.join(kinds)}: give it one")
    with_proportion = [bool(kinds) and kinds[0] == "proportion" for kinds in given]
    if any(with_proportion):
        if not all(with_proportion):
            others = [n for n, p in zip(names, with_proportion) if not p]
            raise ValueError(
                f"mix: proportions share out the whole epoch, so every source needs one "
                f"(none for {others}); or give the sources repeat= or choose= instead"
            )
        props = [_number("proportion", v) for v in settings["proportion"]]
        return _by_proportion(props, sizes, epoch_size)
    counts = []
    for s, n in enumerate(sizes):
        choose = settings["choose"][s]
        if choose is not None:
            if not is_size(choose) or choose < 0:
                raise ValueError(f"mix: choose must be an int >= 0, got {choose!r}")
            counts.append(int(choose))
        else:
            repeat = settings["repeat"][s]
            counts.append(math.floor(_number("repeat", 1 if repeat is None else repeat) * n + 0.5))
    if epoch_size is not None and epoch_size != sum(counts):
        raise ValueError(
            f"mix: epoch_size={epoch_size} contradicts the repeat/choose counts, which sum "
            f"to {sum(counts)} ({dict(zip(names, counts))}): leave epoch_size out, or give "
            f"proportions to share out an epoch of that size"
        )
    return counts


def mix(
    sources: Sequence[Container] | Mapping[str, Container],
    *,
    proportion: _PerSource = None,
    repeat: _PerSource = None,
    choose: _PerSource = None,
    epoch_size: int | None = None,
    shuffle: bool | str = True,
    wave: int = DEFAULT_WAVE,
) -> Mixture:
    """A container mixing ``sources`` (a list, or a dict by name; names are ``"0"``,
    ``"1"``, ... for a list), each epoch by ``proportion``, ``repeat`` or ``choose`` per
    source (a list with one value, or None, per source; or a dict by name), by the rule
    of ``fastload.mixtures``. ``DataLoader(mix(...), batch_size)`` loads each epoch in its
    order: sharded, elastic and resumable as with a ``sampler=``. ``shuffle="quasi"``
    draws each source over a packed dataset block by block, ``wave`` blocks at a time
    (for datasets larger than memory, or at a URL with ``memory_bytes``).

    Raises ``ValueError`` for no sources, contradictory or invalid settings, a source
    that is empty but must give observations, ``shuffle="quasi"`` where no source has
    blocks, and sources of different layouts (structure, field names, dtypes or row
    shapes: the message names the difference).
    """
    if isinstance(sources, Mapping):
        names, datas = [str(k) for k in sources], list(sources.values())
    else:
        datas = list(sources)
        names = [str(k) for k in range(len(datas))]
    if not datas:
        raise ValueError("mix needs at least one source")
    if epoch_size is not None and (not is_size(epoch_size) or epoch_size < 1):
        raise ValueError(f"mix: epoch_size must be an int >= 1, got {epoch_size!r}")
    settings = {
        "proportion": _per_source("proportion", proportion, names),
        "repeat": _per_source("repeat", repeat, names),
        "choose": _per_source("choose", choose, names),
    }
    sizes = [numobs(d) for d in datas]
    counts = _counts(names, sizes, settings, epoch_size)
    for name, n, c in zip(names, sizes, counts):
        if c and not n:
            raise ValueError(f"mix: source {name!r} is empty but its count is {c}")
    if not sum(counts):
        raise ValueError("mix: the epoch is empty (every count is 0)")
    check_layouts(names, datas)
    return Mixture(names, datas, counts, _drawn_by_blocks(datas, shuffle, wave), wave)


def _drawn_by_blocks(
    datas: list[Container], shuffle: bool | str, wave: int
) -> list[npt.NDArray[np.int64] | None]:
    """The block boundaries each source is drawn by (None: at random)."""
    if shuffle is not True and shuffle != "quasi":
        raise ValueError(
            f"mix: shuffle must be True (each source drawn at random) or 'quasi' (block by "
            f"block), got {shuffle!r}"
        )
    if not is_size(wave) or wave < 1:
        raise ValueError(f"mix: wave must be an int >= 1, got {wave!r}")
    if shuffle is True:
        return [None] * len(datas)
    blocks = [_block_bounds(d) for d in datas]
    if all(b is None for b in blocks):
        raise ValueError(
            "mix: shuffle='quasi' draws a packed dataset block by block, and no source is "
            "over one (use shuffle=True)"
        )
    return blocks


def _block_bounds(data: Container) -> npt.NDArray[np.int64] | None:
    """The block boundaries of the packed dataset whose rows ``data``'s are, or None."""
    found = found_under(data, lambda d: d.block_bounds if isinstance(d, Blockwise) else None)
    return found[0] if found else None
