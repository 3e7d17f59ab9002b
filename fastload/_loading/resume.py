"""A loader's state and resume: ``state_dict()`` records the position of the iteration in
progress (or of the next one) with the shard and the settings that shape the order, and
``load_state_dict()`` checks a state against this loader (``_loading/state.py``: the
format, each field, the settings) before the next ``iter()`` continues from it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..views import steps
from .iteration import IteratingLoader
from .state import (
    LoaderKind,
    check_state,
    is_elastic,
    sampler_kind,
    state_format,
    state_layout,
    state_partitions,
)

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
            settings["layout"] = self._epochs.layout  # type: ignore[union-attr]
            settings["shuffle"] = self.options.shuffle
            settings["sampler"] = sampler_kind(self._epochs.sampler)  # type: ignore[union-attr]
            settings["batch_sampler"] = sampler_kind(self.options.batch_sampler)
            settings["partitions"] = self._epochs.partitions  # type: ignore[union-attr]
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
        (a stream's for a container's), has a field out of range, belongs to another rank
        (a state of the elastic layout resumes on any rank of any world size at its global
        position, when that is a whole number of this loader's global batches:
        ``_global_step``), to a loader whose settings give another order (``shuffle``, ``sampler``,
        ``batch_sampler``, ``batch_size``, ``drop_last``; a stream's ``shuffle_buffer``),
        or to one with a different number of steps per epoch (for a stream, another round
        of records). Each message names the field or setting."""
        settings = self._settings()
        if self._epochs is not None:  # a state is checked against the partitions asked for
            settings["partitions"] = self._epochs.fitted
        version = check_state(state, self._kind(), settings)
        seed, epoch, step = int(state["seed"]), int(state["epoch"]), int(state["step"])
        if self._epochs is not None:
            step = self._container_step(state, version)
        self.seed, self._epoch, self._resume_at = seed, epoch, step
        self._progress = None

    def _container_step(self, state: Mapping[str, Any], version: int) -> int:
        """This loader's step at ``state`` (checked), its epochs drawn as the state's were
        from now on (their layout; a quasi order saved without partitions, as before
        version 4, keeps the order of its world size). Raises ``ValueError`` (and changes
        nothing) when the steps per epoch differ or the position does not fit."""
        epochs = self._epochs
        assert epochs is not None  # a container's
        seed, epoch, before = int(state["seed"]), int(state["epoch"]), epochs.partitions
        epochs.set_partitions(state_partitions(state, version))
        try:
            if is_elastic(state, "container", version):
                step = self._global_step(state, seed, epoch)
            elif state["steps"] != self._steps(seed, epoch):
                raise ValueError(
                    f"the state is for a loader with {state['steps']} steps per "
                    f"epoch, this one has {self._steps(seed, epoch)}"
                )
            else:
                step = int(state["step"])
        except ValueError:
            epochs.set_partitions(before)
            raise
        # The steps per epoch are the same in either layout.
        epochs.set_layout(state_layout(state, version))  # type: ignore[arg-type]
        return step

    def _global_step(self, state: Mapping[str, Any], seed: int, epoch: int) -> int:
        """This loader's step at the global position of ``state``, a state of the elastic
        layout saved on any rank of any world size: its step times its global batch
        (``batch_size * world_size`` observations, or ``world_size`` batches of a batch
        sampler). Raises ``ValueError`` when the epoch's length differs or the position
        is not a whole number of this loader's global batches."""
        epochs = self._epochs
        assert epochs is not None  # a container's
        units, drop_last = epochs.units(seed, epoch), bool(self.options.drop_last)
        saved_world = int(state.get("world_size", 1))
        saved = (state["batch_size"] or 1) * saved_world
        if self.options.batch_sampler is not None:
            saved = saved_world
        mine, step = epochs.global_batch(), int(state["step"])
        if epochs.partitions is not None and saved != mine:
            raise ValueError(
                f"the state's shuffle='quasi' order takes {saved // epochs.partitions} items "
                f"of each of its {epochs.partitions} partitions a step (a global batch of "
                f"{saved}), this loader's global batch is {mine}: resume with "
                f"batch_size={saved} // world_size, the same global batch"
            )
        expected = steps(units, saved, drop_last)
        if epochs.partitions is not None:
            expected = self._steps(seed, epoch)  # the same on every world size
        if state["steps"] != expected:
            raise ValueError(
                f"the state is for a loader with {state['steps']} steps per epoch, this "
                f"one has {expected} (of {saved} a step over all ranks): restore it over "
                f"the same data"
            )
        if step == state["steps"]:
            return self._steps(seed, epoch)  # the epoch was delivered
        if step * saved % mine:
            raise ValueError(
                f"the state was saved after {step} steps of a global batch of {saved} "
                f"(batch_size {state['batch_size']} on {saved_world} ranks); this loader's "
                f"global batch is {mine} ({self.world_size} ranks), which does not divide "
                f"that position {step * saved}: resume on a world size that divides "
                f"{saved}, with batch_size={saved} // world_size, for the same global batch"
            )
        return step * saved // mine
