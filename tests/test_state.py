"""A loader's state carries its format (the kind of loader, the version of the layout), and
``load_state_dict`` refuses a state without one, of another version, of another kind of
loader or of something else, saying what it got and what to do; it checks every field for
its type and range, and refuses a state into a loader whose settings give another order,
naming the field or the setting."""

import json
import re

import numpy as np
import pytest
from helpers import assert_resumes_exactly, run_epochs

from fastload import DataLoader, WeightedSampler, eachobs
from fastload._loading.state import STATE_VERSION, check_state_format, state_format

Y = np.arange(10)


def _stream(n=7):
    return (k for k in range(n))  # an iterable without a length: a stream


def test_a_state_names_its_kind_of_loader_and_its_version():
    assert DataLoader(Y, 3).state_dict()["format"] == f"fastload.container_loader/{STATE_VERSION}"
    assert eachobs(Y).state_dict()["format"] == "fastload.container_loader/4"
    assert DataLoader(_stream(), 3).state_dict()["format"] == "fastload.stream_loader/4"


@pytest.mark.parametrize("kind", ["container", "stream"])
def test_a_state_is_ints_flags_and_names_that_json_keeps(kind):
    data = Y if kind == "container" else _stream()
    state = DataLoader(data, np.int64(3), shuffle=True, drop_last=np.True_, seed=2).state_dict()
    for key in ("seed", "epoch", "step", "rank", "world_size"):
        assert type(state[key]) is int
    assert type(state["batch_size"]) is int and type(state["drop_last"]) is bool
    assert json.loads(json.dumps(state)) == state


def test_a_state_without_a_format_is_refused_and_the_message_says_how_to_mend_it():
    loader = DataLoader(Y, 3, shuffle=True, seed=1)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    old = {k: v for k, v in state.items() if k != "format"}  # as fastload 0.2 saved it
    with pytest.raises(ValueError, match="has no 'format'") as error:
        DataLoader(Y, 3, shuffle=True, seed=1).load_state_dict(old)
    assert "'fastload.container_loader/1'" in str(error.value)
    assert "add 'format'" in str(error.value)
    # Mended as the message says, it resumes where the loader stopped.
    restored = DataLoader(Y, 3, shuffle=True, seed=1)
    restored.load_state_dict(dict(old, format="fastload.container_loader/1"))
    assert [b.tolist() for b in run_epochs(restored, 1)[0]] == [b.tolist() for b in it]


def test_a_state_of_another_version_is_refused():
    state = dict(DataLoader(Y, 3).state_dict(), format="fastload.container_loader/5")
    message = (
        "the state has format 'fastload.container_loader/5', this version of fastload "
        "reads 'fastload.container_loader/1' or 'fastload.container_loader/2' or "
        "'fastload.container_loader/3' or 'fastload.container_loader/4': resume with the "
        "fastload version that saved it"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        DataLoader(Y, 3).load_state_dict(state)


def test_a_stream_state_is_refused_by_a_container_loader_and_the_other_way_round():
    stream_state = DataLoader(_stream(), 3).state_dict()
    with pytest.raises(ValueError, match="of a loader over a stream .* reads a container"):
        DataLoader(Y, 3).load_state_dict(stream_state)
    container_state = DataLoader(Y, 3).state_dict()
    with pytest.raises(ValueError, match="of a loader over a container .* reads a stream"):
        DataLoader(_stream(), 3).load_state_dict(container_state)


@pytest.mark.parametrize("found", ["torchdata/1", 1, None, "fastload.container_loader/x"])
def test_a_state_of_something_else_is_refused(found):
    state = dict(DataLoader(Y, 3).state_dict(), format=found)
    with pytest.raises(ValueError, match=f"not a fastload loader state: its format is {found!r}"):
        DataLoader(Y, 3).load_state_dict(state)


def test_a_state_that_is_not_a_mapping_is_a_type_error():
    with pytest.raises(TypeError, match="takes the dict that state_dict.. returned, got list"):
        DataLoader(Y, 3).load_state_dict([("seed", 0)])


def test_check_state_format_takes_what_state_format_gives():
    for kind in ("container", "stream"):
        check_state_format({"format": state_format(kind)}, kind)


def test_the_torch_wrapper_hands_on_the_format_and_its_refusals():
    pytest.importorskip("torch")
    from fastload.torch import TorchLoader

    wrapped = TorchLoader(DataLoader(Y, 3))
    assert wrapped.state_dict()["format"] == "fastload.container_loader/4"
    with pytest.raises(ValueError, match="has no 'format'"):
        wrapped.load_state_dict({"seed": 0, "epoch": 0, "step": 0})


ORDER = ("shuffle", "sampler", "batch_sampler", "batch_size", "drop_last")


def _version_1(state):
    """``state`` as version 1 saved it: without the settings that shape the order."""
    dropped = ORDER + ("shuffle_buffer", "layout", "partitions")
    old = {k: v for k, v in state.items() if k not in dropped}
    return dict(old, format=state["format"].replace("/4", "/1"))


def test_a_state_records_the_shard_and_the_settings_that_shape_the_order():
    state = DataLoader(Y, 4, shuffle=True, drop_last=True, shard=(1, 2), seed=0).state_dict()
    assert {k: state[k] for k in ORDER + ("rank", "world_size")} == {
        "shuffle": True,
        "sampler": None,
        "batch_sampler": None,
        "batch_size": 4,
        "drop_last": True,
        "rank": 1,
        "world_size": 2,
    }
    sampled = DataLoader(Y, 2, sampler=WeightedSampler(np.ones(10))).state_dict()
    assert sampled["sampler"] == "fastload.samplers.WeightedSampler"
    assert DataLoader(Y, batch_sampler=[[0, 1], [2]]).state_dict()["batch_sampler"] == "list"
    assert eachobs(Y).state_dict()["batch_size"] is None
    stream = DataLoader(_stream(), 3, shuffle=True, shuffle_buffer=8).state_dict()
    assert {k: stream[k] for k in ("shuffle", "shuffle_buffer", "batch_size", "drop_last")} == {
        "shuffle": True,
        "shuffle_buffer": 8,
        "batch_size": 3,
        "drop_last": False,
    }


def _options(**options):
    """A loader's options: batches of 4 unless a batch sampler forms them, seed 5."""
    defaults = {"seed": 5} if "batch_sampler" in options else {"batch_size": 4, "seed": 5}
    return dict(defaults, **options)


def _container(**options):
    return lambda: DataLoader(np.arange(12), **_options(**options))


def _streamed(**options):
    options = dict({"batch_size": 4, "seed": 5}, **options)
    return lambda: DataLoader((k for k in range(12)), **options)


@pytest.mark.parametrize(
    "saved, loading, setting",
    [
        (_container(shuffle=True), _container(), "shuffle"),
        (_container(sampler=list(range(12))), _container(), "sampler"),
        (_container(sampler=range(12)), _container(sampler=list(range(12))), "sampler"),
        (
            _container(batch_sampler=[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]),
            _container(),
            "batch_sampler",
        ),
        (_container(batch_size=5), _container(), "batch_size"),  # 3 steps each
        (_container(drop_last=True), _container(), "drop_last"),  # 3 steps each
        (_streamed(shuffle=True), _streamed(), "shuffle"),
        (_streamed(shuffle=True, shuffle_buffer=8), _streamed(shuffle=True), "shuffle_buffer"),
        (_streamed(batch_size=2), _streamed(), "batch_size"),  # 1,024 records a round each
        (_streamed(drop_last=True), _streamed(), "drop_last"),
    ],
)
def test_a_state_into_a_loader_that_would_give_another_order_is_refused_naming_the_setting(
    saved, loading, setting
):
    loader = saved()
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    with pytest.raises(
        ValueError, match=f"saved by a loader with {setting}=.*this one has {setting}="
    ):
        loading().load_state_dict(state)
    # The loader it was saved from resumes it.
    restored = saved()
    restored.load_state_dict(state)
    assert [np.asarray(b).tolist() for b in run_epochs(restored, 1)[0]] == [
        np.asarray(b).tolist() for b in it
    ]


@pytest.mark.parametrize(
    "field, value",
    [
        ("step", 2.5),  # resumed 98 batches of 100 where 93 were left
        ("step", True),
        ("step", "7"),  # a TypeError of a comparison of int and str
        ("step", np.float64(1.0)),
        ("seed", 2.5),  # another order
        ("seed", "3"),
        ("seed", None),
        ("epoch", "0"),
        ("epoch", 0.9),
        ("epoch", np.True_),
        ("world_size", True),
        ("rank", False),
        ("steps", 4.0),
        ("batch_size", 3.0),
        ("batch_size", True),
        ("drop_last", 0),
        ("drop_last", "False"),
        ("shuffle", 1),
        ("shuffle", "yes"),
        ("sampler", 0),
        ("layout", "interleaved"),
        ("layout", None),
    ],
)
def test_a_field_of_the_wrong_type_is_a_type_error_naming_the_field(field, value):
    state = dict(DataLoader(Y, 3).state_dict(), **{field: value})
    with pytest.raises(TypeError, match=f"the state's '{field}' must be "):
        DataLoader(Y, 3).load_state_dict(state)


@pytest.mark.parametrize(
    "field, value, takes",
    [
        ("seed", -1, r"an int in \[0, 2\*\*64\)"),
        ("seed", 2**64, r"an int in \[0, 2\*\*64\)"),
        ("epoch", -1, r"an int in \[0, 2\*\*64\)"),
        ("step", -1, "an int >= 0"),
        ("step", 5, "past its 4 steps"),
        ("steps", -1, "an int >= 0"),
        ("world_size", 0, "an int >= 1"),
        ("rank", 1, r"an int in \[0, 1\)"),
        ("batch_size", 0, "an int >= 1"),
    ],
)
def test_a_field_out_of_range_is_a_value_error_naming_the_field(field, value, takes):
    state = dict(DataLoader(Y, 3).state_dict(), **{field: value})
    with pytest.raises(ValueError, match=f"the state's '{field}'.* {takes}"):
        DataLoader(Y, 3).load_state_dict(state)


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("step", 1.0, TypeError),
        ("step", -1, ValueError),
        ("window", "1026", TypeError),
        ("window", 0, ValueError),
        ("shuffle_buffer", 8.0, TypeError),
        ("shuffle_buffer", -1, ValueError),
        ("shuffle", "quasi", TypeError),  # a stream's shuffle is a flag
    ],
)
def test_a_stream_state_field_is_checked_for_type_and_range(field, value, error):
    state = dict(DataLoader(_stream(), 3).state_dict(), **{field: value})
    with pytest.raises(error, match=f"the state's '{field}' must be "):
        DataLoader(_stream(), 3).load_state_dict(state)


def test_a_version_2_state_without_an_order_setting_is_refused_naming_it():
    state = DataLoader(Y, 3).state_dict()
    del state["drop_last"]
    with pytest.raises(ValueError, match=r"missing \['drop_last'\]"):
        DataLoader(Y, 3).load_state_dict(state)


@pytest.mark.parametrize("kind", ["container", "stream"])
def test_a_version_1_state_is_still_read_without_the_order_settings(kind):
    make = _container(shuffle=True) if kind == "container" else _streamed(shuffle=True)
    loader = make()
    it = iter(loader)
    next(it)
    old = _version_1(loader.state_dict())
    assert old["format"] == f"fastload.{kind}_loader/1"
    restored = make()
    restored.load_state_dict(old)
    assert [b.tolist() for b in run_epochs(restored, 1)[0]] == [b.tolist() for b in it]
    with pytest.raises(TypeError, match="the state's 'step' must be an int"):
        make().load_state_dict(dict(old, step=2.5))  # its fields are checked all the same


def _json(state):
    return json.loads(json.dumps(state))


def _numpy(state):
    """``state`` with numpy's integers and booleans where it has ints and flags."""
    return {
        k: np.bool_(v) if type(v) is bool else np.int64(v) if type(v) is int else v
        for k, v in state.items()
    }


@pytest.mark.parametrize("through", [_json, _numpy])
@pytest.mark.parametrize(
    "options",
    [
        {"shuffle": True},
        {"drop_last": True, "shard": (1, 2)},
        {"sampler": WeightedSampler(np.ones(10), 7)},
        {"batch_sampler": lambda epoch, seed: [[epoch, 1, 2], [3], [9, 8]]},
    ],
)
def test_a_state_kept_as_json_or_with_numpy_values_resumes_exactly(options, through):
    assert_resumes_exactly(lambda: DataLoader(Y, **_options(**options)), through=through)
