"""``LoaderOptions``: the keywords of ``DataLoader`` and ``eachobs`` as one value, checked
once; a stream's shuffle buffer is ``shuffle_buffer=`` (``shuffle=n`` still works, and
warns, naming the new spelling)."""

import dataclasses
import inspect
import re

import numpy as np
import pytest
from helpers import run_epochs

from fastload import DataLoader, eachobs
from fastload._base.collate import Collate
from fastload._loading.options import LoaderOptions


class Records:
    """A stream (no length) of ``n`` records, read from the start each time."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def _flat(batches):
    return np.concatenate([np.asarray(b).reshape(-1) for b in batches]).tolist()


def _keywords(f):
    """The keyword-only parameters of ``f`` with their defaults."""
    return {
        name: p.default
        for name, p in inspect.signature(f).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def test_dataloader_and_eachobs_take_exactly_the_options_with_their_defaults():
    fields = {f.name: f.default for f in dataclasses.fields(LoaderOptions) if f.init}
    dataloader = _keywords(DataLoader.__init__)
    assert dataloader == {k: v for k, v in fields.items() if k != "batch_size"}
    assert inspect.signature(DataLoader.__init__).parameters["batch_size"].default == 1
    assert _keywords(eachobs) == fields


def test_dataloader_and_eachobs_type_their_keywords_as_the_options_do():
    # The signatures are made from LoaderOptions' fields, with one exception: DataLoader's
    # batch_size is an int, positional (None, one observation a step, is eachobs').
    fields = {f.name: f.type for f in dataclasses.fields(LoaderOptions) if f.init}
    for f, exceptions in ((DataLoader.__init__, {"batch_size": "int"}), (eachobs, {})):
        given = {
            name: p.annotation
            for name, p in inspect.signature(f).parameters.items()
            if name in fields
        }
        assert given == {**fields, **exceptions}
    batch_size = inspect.signature(DataLoader).parameters["batch_size"]
    assert batch_size.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD


def test_every_option_is_documented_once_and_listed_in_dataloaders_docstring():
    for f in dataclasses.fields(LoaderOptions):
        if f.init:
            assert len(f.metadata["doc"]) > 20, f.name
            default = 1 if f.name == "batch_size" else f.default  # DataLoader's own
            assert f"``{f.name}`` (default ``{default!r}``): " in DataLoader.__doc__
    assert "{options}" not in DataLoader.__doc__


def test_a_loaders_attributes_read_its_options_and_may_be_assigned():
    loader = DataLoader(np.arange(10), 4, shuffle=True, drop_last=True, buffer=np.zeros(4))
    assert (loader.batch_size, loader.shuffle, loader.drop_last) == (4, True, True)
    assert loader.buffer is True and loader.collate == Collate(None) and loader.prefetch is None
    assert loader.on_error == "raise" and loader.backend == "thread" and loader.parallel is False
    loader.shuffle = False  # reads what was assigned; the loader loads as it was made
    assert loader.shuffle is False and loader.options.shuffle is True
    with pytest.raises(AttributeError, match="no attribute 'batchsize'"):
        loader.batchsize  # noqa: B018


def test_the_options_are_frozen_and_hold_normalized_values():
    options = LoaderOptions(
        batch_size=np.int64(4), shuffle=np.True_, drop_last=np.bool_(True), parallel=0
    )
    assert (options.batch_size, options.shuffle, options.drop_last, options.parallel) == (
        4,
        True,
        True,
        False,
    )
    assert type(options.batch_size) is int and type(options.shuffle) is bool
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.batch_size = 8  # type: ignore[misc]


def test_a_batch_sampler_leaves_no_batch_size():
    options = LoaderOptions(batch_size=1, batch_sampler=[[0, 1], [2]])
    assert options.batch_size is None


def test_one_observation_at_a_time_drops_what_has_nothing_to_act_on():
    options = LoaderOptions(drop_last=True, collate=True).one_at_a_time()
    assert (options.drop_last, options.collate) == (False, Collate(None))
    with pytest.raises(ValueError, match="give eachobs a batch_size"):
        LoaderOptions(collate=list).one_at_a_time()


@pytest.mark.parametrize(
    "options, error, message",
    [
        (dict(batch_size=0), ValueError, "batch_size must be an int >= 1, got 0"),
        (dict(shuffle="yes"), ValueError, "shuffle must be False, True or 'quasi', got 'yes'"),
        (dict(shuffle=-3), ValueError, "shuffle must be False, True or 'quasi', got -3"),
        (dict(shuffle_buffer=0, shuffle=True), ValueError, "shuffle_buffer must be an int >= 1"),
        (dict(shuffle_buffer=True, shuffle=True), ValueError, "shuffle_buffer must be an int"),
        (dict(shuffle_buffer=10), ValueError, "got shuffle=False: pass shuffle=True too"),
        (dict(collate="stack"), TypeError, "collate must be None, True, False or a callable"),
        (dict(sampler=[0], shuffle=True), ValueError, "sampler= gives the order"),
        (dict(batch_sampler=[[0]], drop_last=True), ValueError, "batch_sampler= forms"),
        (dict(seed=1.5), TypeError, "seed must be an int or None, got 1.5"),
        (dict(seed=-1), ValueError, "seed must be in [0, 2**64), got -1"),
        (dict(seed=2**64), ValueError, "seed must be in [0, 2**64)"),
        (dict(buffer="yes"), TypeError, "buffer must be True, False, or arrays"),
        (dict(ordered=1), TypeError, "ordered must be True or False"),
    ],
)
def test_dataloader_eachobs_and_the_options_refuse_alike(options, error, message):
    for make in (
        lambda: LoaderOptions(**options),
        lambda: eachobs(np.arange(4), **options),
        lambda: DataLoader(np.arange(4), **{"batch_size": 1, **options}),
    ):
        with pytest.raises(error, match=re.escape(message)):
            make()


def test_a_stream_shuffle_buffer_is_shuffle_buffer():
    loader = DataLoader(Records(500), 50, shuffle=True, shuffle_buffer=40, seed=1)
    out = _flat(run_epochs(loader, 1)[0])
    assert sorted(out) == list(range(500)) and out != list(range(500))
    # A record comes out at most the buffer's size places before it came in.
    assert min(pos - record for pos, record in enumerate(out)) >= -40
    assert loader.shuffle is True and loader.shuffle_buffer == 40


def test_shuffle_true_over_a_stream_takes_the_default_buffer_of_1024():
    default = DataLoader(Records(3000), 100, shuffle=True, seed=2)
    sized = DataLoader(Records(3000), 100, shuffle=True, shuffle_buffer=1024, seed=2)
    assert _flat(run_epochs(default, 1)[0]) == _flat(run_epochs(sized, 1)[0])


def test_shuffle_n_is_the_old_spelling_of_a_stream_buffer_and_warns():
    new = DataLoader(Records(500), 50, shuffle=True, shuffle_buffer=40, seed=1)
    message = "shuffle=40 is deprecated: write shuffle=True, shuffle_buffer=40"
    with pytest.warns(DeprecationWarning, match=re.escape(message)) as caught:
        old = DataLoader(Records(500), 50, shuffle=40, seed=1)
    assert caught[0].filename == __file__  # it points at the caller's line
    assert (old.shuffle, old.shuffle_buffer) == (True, 40)
    assert _flat(run_epochs(old, 2)[1]) == _flat(run_epochs(new, 2)[1])
    with pytest.warns(DeprecationWarning, match=re.escape(message)) as caught:
        eachobs(Records(5), batch_size=2, shuffle=40)
    assert caught[0].filename == __file__


def test_a_container_takes_no_shuffle_buffer():
    with pytest.raises(ValueError, match="a container is shuffled whole"):
        DataLoader(np.arange(10), 2, shuffle=True, shuffle_buffer=4)
    with pytest.raises(ValueError, match=re.escape("got 4 (an int was a stream's shuffle buffer")):
        DataLoader(np.arange(10), 2, shuffle=4)


def test_a_stream_refuses_quasi_with_a_hint():
    with pytest.raises(ValueError, match="use shuffle=True"):
        DataLoader(Records(10), 2, shuffle="quasi")


def test_the_loader_s_attributes_read_its_options():
    buffer = np.zeros((2,), np.int64)
    loader = DataLoader(np.arange(8), 2, shuffle=True, drop_last=True, buffer=buffer, seed=4)
    options = loader.options
    for name in ("batch_size", "shuffle", "sampler", "drop_last", "parallel", "ordered"):
        assert getattr(loader, name) == getattr(options, name)
    assert loader.buffer is True and options.buffer is buffer  # arrays of the user's
    assert loader.collate == Collate.of(None) and loader.backend == "thread"
    single = eachobs(np.arange(8), parallel=0, collate=True)
    assert (single.batch_size, single.parallel, single.collate) == (None, False, Collate.of(None))
