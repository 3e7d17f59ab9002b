"""``fastload.torch.DataLoader.state_dict()`` / ``load_state_dict()``: torchdata's
``StatefulDataLoader`` semantics (a state taken after k batches resumes at batch k + 1,
the sampler's draws restored), on every path, over a ``DistributedSampler`` on another
world size, and through Lightning's handling of stateful loaders."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DistributedSampler, TensorDataset  # noqa: E402

from fastload.torch import DataLoader  # noqa: E402

N = 50


class Squares:
    """A Python dataset: the inline and worker-process paths."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return np.int64(i * i)


def _values(batch):
    return (batch[0] if isinstance(batch, list) else batch).tolist()


def _run(loader, epochs):
    return [[_values(b) for b in loader] for _ in range(epochs)]


PATHS = {
    "native": lambda **kw: DataLoader(TensorDataset(torch.arange(N)), batch_size=4, **kw),
    "native threads": lambda **kw: DataLoader(
        TensorDataset(torch.arange(N)), batch_size=4, num_workers=2, **kw
    ),
    "inline": lambda **kw: DataLoader(Squares(), batch_size=4, **kw),
}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("seeded", ["global", "generator"])
def test_a_state_taken_after_k_batches_resumes_at_batch_k_plus_1(path, seeded):
    def make():
        generator = torch.Generator().manual_seed(3) if seeded == "generator" else None
        return PATHS[path](shuffle=True, generator=generator)

    torch.manual_seed(0)
    reference = _run(make(), 2)
    for k in (0, 1, 5, len(reference[0]) - 1):
        torch.manual_seed(0)
        loader = make()
        it = iter(loader)
        done = [_values(next(it)) for _ in range(k)]
        state = loader.state_dict()
        assert state["batches_yielded"] == k
        torch.manual_seed(99)  # another run: the state brings the epoch's draws back
        again = make()
        again.load_state_dict(state)
        rest = _run(again, 2)  # the rest of the epoch, then the next one
        assert done + rest[0] == reference[0], (path, k)
        assert rest[1] == reference[1]


def test_a_state_after_the_whole_epoch_starts_the_next_one():
    loader = PATHS["native"](shuffle=True)
    list(loader)
    state = loader.state_dict()
    assert state["batches_yielded"] == 0 and state["generator"] is None
    loader.load_state_dict(state)
    assert len(list(loader)) == 13


def _ranks(world, global_batch=8):
    data = TensorDataset(torch.arange(N))
    samplers = [DistributedSampler(data, world, r, shuffle=True, seed=5) for r in range(world)]
    return [DataLoader(data, batch_size=global_batch // world, sampler=s) for s in samplers]


@pytest.mark.parametrize("before", [1, 2, 4])
@pytest.mark.parametrize("after", [1, 2, 4])
def test_a_distributed_samplers_state_resumes_on_another_world_size(before, after):
    for k in (0, 2, 5):
        saved = _ranks(before)
        for loader in saved:
            loader.sampler.set_epoch(1)
        its = [iter(loader) for loader in saved]
        done = [i for _ in range(k) for it in its for i in _values(next(it))]
        state = saved[-1].state_dict()
        assert state["sampler_epoch"] == 1 and state["world_size"] == before
        resumed = _ranks(after)
        for loader in resumed:
            loader.load_state_dict(state)  # sets the sampler's epoch too
        rest = [i for loader in resumed for b in loader for i in _values(b)]
        counts = np.bincount(done + rest, minlength=N)
        assert len(done) == k * 8
        # Every index once; the padding of the last batches (to a multiple of the ranks)
        # repeats a few of the epoch's first ones.
        assert counts.min() == 1 and counts.sum() - N == -N % after, (before, after, k)


def test_a_position_that_is_not_whole_global_batches_is_refused():
    (loader,) = _ranks(1)
    it = iter(loader)
    next(it)
    state = loader.state_dict()  # 8 samples consumed
    with pytest.raises(ValueError, match="does not divide that position 8"):
        _ranks(2, global_batch=6)[0].load_state_dict(state)
    with pytest.raises(ValueError, match="not a state of fastload.torch.DataLoader"):
        loader.load_state_dict({"format": "fastload.container_loader/3"})
    with pytest.raises(TypeError, match="got list"):
        loader.load_state_dict([])


def test_a_restored_state_is_what_state_dict_gives_until_the_loader_iterates():
    loader = PATHS["native"](shuffle=True)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    again = PATHS["native"](shuffle=True)
    again.load_state_dict(state)
    saved_again = again.state_dict()  # a checkpoint taken before the first batch
    assert saved_again["batches_yielded"] == 3
    assert torch.equal(saved_again["generator"], state["generator"])
    third = PATHS["native"](shuffle=True)
    third.load_state_dict(saved_again)
    assert [_values(b) for b in third] == [_values(b) for b in it]


class EagerSampler(torch.utils.data.Sampler):
    """Draws its whole order when its iterator is made, as a list."""

    def __len__(self):
        return N

    def __iter__(self):
        return iter(torch.randperm(N).tolist())


def test_a_sampler_that_draws_when_its_iterator_is_made_draws_from_the_restored_state():
    def make():
        return DataLoader(TensorDataset(torch.arange(N)), batch_size=4, sampler=EagerSampler())

    torch.manual_seed(1)
    reference = _run(make(), 1)[0]
    torch.manual_seed(1)
    loader = make()
    it = iter(loader)
    done = [_values(next(it)) for _ in range(4)]
    state = loader.state_dict()
    torch.manual_seed(42)
    again = make()
    again.load_state_dict(state)
    assert done + [_values(b) for b in again] == reference


def test_a_refused_state_changes_nothing_of_the_loader():
    (loader,) = _ranks(2, global_batch=6)[:1]
    (saved,) = _ranks(1)
    saved.sampler.set_epoch(7)
    it = iter(saved)
    next(it)
    with pytest.raises(ValueError, match="does not divide"):
        loader.load_state_dict(saved.state_dict())
    assert loader.sampler.epoch == 0  # the refused state's sampler epoch was not applied
    state = saved.state_dict()
    del state["world_size"]
    with pytest.raises(ValueError, match=r"lacks \['world_size'\]"):
        loader.load_state_dict(state)


def test_lightning_saves_and_restores_the_loader_as_a_stateful_one():
    pytest.importorskip("lightning")
    from lightning.fabric.utilities.types import _Stateful
    from lightning.pytorch.utilities.combined_loader import CombinedLoader

    torch.manual_seed(0)
    loader = PATHS["native"](shuffle=True)
    reference = _run(loader, 1)[0]
    assert isinstance(loader, _Stateful)
    torch.manual_seed(0)
    combined = CombinedLoader(PATHS["native"](shuffle=True), "max_size_cycle")
    it = iter(combined)
    done = [_values(next(it)[0]) for _ in range(4)]
    states = combined._state_dicts()  # what Lightning's fit loop puts in a checkpoint
    restored = CombinedLoader(PATHS["native"](shuffle=True), "max_size_cycle")
    restored._load_state_dicts(states)  # what it calls when restarting
    rest = [_values(batch) for batch, _, _ in restored]
    assert done + rest == reference


def test_a_lightning_run_stopped_mid_epoch_resumes_from_its_checkpoint(tmp_path):
    lightning = pytest.importorskip("lightning")

    from lightning_ddp_run import Model  # the model of the DDP runs, on one process

    def fit(steps, resume=None, save=None):
        torch.manual_seed(0)
        model = Model(batch=4)
        trainer = lightning.Trainer(
            max_steps=steps,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(model, ckpt_path=resume)
        if save is not None:
            trainer.save_checkpoint(save)
        return model.seen

    whole = fit(15)  # an epoch of 10 batches and half the next
    checkpoint = tmp_path / "mid.ckpt"
    first = fit(6, save=checkpoint)  # stopped after 6 of the 10
    rest = fit(15, resume=checkpoint)
    assert (len(first), len(rest)) == (6, 9)
    assert first + rest == whole
