"""A loader's state carries its format (the kind of loader, the version of the layout), and
``load_state_dict`` refuses a state without one, of another version, of another kind of
loader or of something else, saying what it got and what to do."""

import re

import numpy as np
import pytest
from helpers import run_epochs

from fastload import DataLoader, eachobs
from fastload._loading.state import STATE_VERSION, check_state_format, state_format

Y = np.arange(10)


def _stream(n=7):
    return (k for k in range(n))  # an iterable without a length: a stream


def test_a_state_names_its_kind_of_loader_and_its_version():
    assert DataLoader(Y, 3).state_dict()["format"] == f"fastload.container_loader/{STATE_VERSION}"
    assert eachobs(Y).state_dict()["format"] == "fastload.container_loader/1"
    assert DataLoader(_stream(), 3).state_dict()["format"] == "fastload.stream_loader/1"


def test_every_value_of_a_state_but_its_format_is_an_int():
    state = DataLoader(Y, 3, shuffle=True, seed=2).state_dict()
    assert all(type(v) is int for k, v in state.items() if k != "format")


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
    state = dict(DataLoader(Y, 3).state_dict(), format="fastload.container_loader/2")
    message = (
        "the state has format 'fastload.container_loader/2', this version of fastload "
        "reads 'fastload.container_loader/1': resume with the fastload version that saved it"
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
    assert wrapped.state_dict()["format"] == "fastload.container_loader/1"
    with pytest.raises(ValueError, match="has no 'format'"):
        wrapped.load_state_dict({"seed": 0, "epoch": 0, "step": 0})
