"""A loader's state and resume: ``state_dict()`` records the position of the iteration in
progress (or of the next one) with the shard and the settings that shape the order, and
``load_state_dict()`` checks a state against this loader (``_loading/state.py``: the
format, each field, the settings) before the next ``iter()`` continues from it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .iteration import IteratingLoader
from .state import LoaderKind, check_state, sampler_kind, state_format

__all__ = ["ResumableLoader"]


class ResumableLoader(IteratingLoader):
    """An ``IteratingLoader`` that saves and restores its position. The base of
    ``fastload.EpochLoader``; not made directly."""

    def _live_position(self) -> tuple[int, int] | None:
        """(epoch, step) of the iteration in progress, or None when there is none or it
        delivered its whole epoch."""
        live = self._progress
        if live is None or live.epoch >= self._epoch:
            return None
        if self._stream is not None:
            iteration = self._stream.live()
            finished = iteration is None or iteration.epoch != live.epoch or iteration.finished()
        else:
            finished = live.step >= self._steps(self.seed, live.epoch)
        return None if finished else (live.epoch, live.step)

    def _kind(self) -> LoaderKind:
        return "stream" if self._stream is not None else "container"

    def state_dict(self) -> dict[str, Any]:
        """The position to resume from: restore it with ``load_state_dict`` on a loader
        built the same way, and iteration continues with the next step of that epoch.
        Its ``"format"`` names the kind of loader and the version of the layout; it also
        records the shard and the settings that shape the order (see
        ``fastload._loading.state``). Its values are ints, flags, None and strings."""
        epoch, step = self._live_position() or (self._epoch, self._resume_at)
        state: dict[str, Any] = {
            "format": state_format(self._kind()),
            "seed": self.seed,
            "epoch": epoch,
            "step": step,
        }
        if self._stream is None:
            state["steps"] = self._steps(self.seed, epoch)
        return dict(state, **self._settings())

    def _settings(self) -> dict[str, Any]:
        """What shapes this loader's order, and its shard, as a state records them."""
        settings: dict[str, Any] = {"rank": self.rank, "world_size": self.world_size}
        if self._stream is not None:
            settings["window"] = self._stream.round_size
            settings["shuffle"] = bool(self.options.shuffle)
            settings["shuffle_buffer"] = self._stream.shuffle_buffer
        else:
            settings["shuffle"] = self.options.shuffle
            settings["sampler"] = sampler_kind(self.options.sampler)
            settings["batch_sampler"] = sampler_kind(self.options.batch_sampler)
        settings["batch_size"] = (
            None if self.options.batch_size is None else int(self.options.batch_size)
        )
        settings["drop_last"] = bool(self.options.drop_last)
        return settings

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state`` (from ``state_dict``): the next ``iter()`` continues at the
        saved step of the saved epoch. Raises ``TypeError`` for something that is not a
        dict or a field of the wrong type (``step=2.5``, ``seed="3"``, ``epoch=True``: a
        bool is not an int; numpy's integers are), and ``ValueError`` if the state has no
        ``"format"``, is of a version this one does not read or of another kind of loader
        (a stream's for a container's), has a field out of range, belongs to another rank,
        to a loader whose settings give another order (``shuffle``, ``sampler``,
        ``batch_sampler``, ``batch_size``, ``drop_last``; a stream's ``shuffle_buffer``),
        or to one with a different number of steps per epoch (for a stream, another round
        of records). Each message names the field or setting."""
        check_state(state, self._kind(), self._settings())
        seed, epoch, step = int(state["seed"]), int(state["epoch"]), int(state["step"])
        if self._stream is None:
            steps = self._steps(seed, epoch)
            if state["steps"] != steps:
                raise ValueError(
                    f"the state is for a loader with {state['steps']} steps per "
                    f"epoch, this one has {steps}"
                )
        self.seed, self._epoch, self._resume_at = seed, epoch, step
        self._progress = None
