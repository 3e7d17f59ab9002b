"""Failures carry what they are as data, not as text: a C failure reaches Python as a
``CoreError`` with the code of ``csrc/status.h``; an observation that does not fit its
buffer is a ``MisfitError`` saying how; callers test those, never a message."""

import pickle
import re
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload import DataLoader, LoadError, _core
from fastload.errors import CoreError, MisfitError, Status
from fastload.obs import getobs_into
from fastload.transforms import Compose, DecodeImage, RandomCrop

STATUS_H = Path(fastload.__file__).resolve().parent.parent / "csrc" / "status.h"


def test_status_mirrors_every_code_of_status_h():
    codes = dict(re.findall(r"\bFL_(\w+) = (-?\d+)", STATUS_H.read_text()))
    assert {name: int(value) for name, value in codes.items()} == {s.name: s.value for s in Status}


def test_a_crop_larger_than_the_image_fails_in_c_with_the_code_of_fl_etoosmall():
    with pytest.raises(CoreError) as caught:
        _core.random_crop_params(20, 20, 32, 32, padding=4)
    assert caught.value.code is Status.ETOOSMALL
    assert isinstance(caught.value, ValueError)  # what it was before: callers keep working


def test_a_chain_whose_crop_exceeds_a_decoded_image_keeps_the_code_and_names_the_crop():
    chain = Compose([RandomCrop(32)])
    with pytest.raises(CoreError, match=r"RandomCrop\(.*larger than the 20x20 image") as caught:
        chain(np.zeros((20, 20, 3), np.uint8))
    assert caught.value.code is Status.ETOOSMALL


def test_a_chain_whose_crop_exceeds_an_encoded_image_fails_with_the_code_of_fl_etoosmall():
    data = _core.qoi_encode(np.zeros((20, 20, 3), np.uint8))
    with pytest.raises(CoreError) as caught:
        Compose([DecodeImage(), RandomCrop(32)])(data)
    assert caught.value.code is Status.ETOOSMALL


def test_a_damaged_image_fails_with_the_code_of_what_is_wrong_with_it():
    data = _core.qoi_encode(np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(CoreError) as caught:
        _core.qoi_decode(b"nope" + data[4:])
    assert caught.value.code is Status.EFORMAT
    with pytest.raises(CoreError) as caught:
        _core.qoi_decode(data[:20])  # a whole header, then too few pixels
    assert caught.value.code is Status.ETRUNCATED


def test_a_core_error_keeps_its_code_through_pickle():
    # Worker processes send their exceptions pickled.
    error = pickle.loads(pickle.dumps(CoreError(Status.ETOOSMALL, "too small")))
    assert error.code is Status.ETOOSMALL and str(error) == "too small"
    misfit = pickle.loads(pickle.dumps(MisfitError("dtype", "no cast")))
    assert misfit.what == "dtype" and str(misfit) == "no cast"


def test_a_buffer_that_does_not_fit_says_how_it_does_not():
    with pytest.raises(MisfitError) as caught:
        getobs_into(np.zeros((2, 3), np.int32), np.zeros((5, 3), np.int64), [0, 1])
    assert caught.value.what == "dtype"
    with pytest.raises(MisfitError) as caught:
        getobs_into(np.zeros((2, 4)), np.zeros((5, 3)), [0, 1])
    assert caught.value.what == "shape"


class Observations:
    """Observation 0 a float64 row, the others float32: they do not fit its batch buffer."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return np.zeros(3, np.float64 if i == 0 else np.float32)


class WordyInto:
    """A container whose own getobs_into raises a ValueError that reads like a misfit."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return np.zeros(3)

    def __getobs_into__(self, buffer, i):
        raise ValueError("this value does not fit my dtype rules")


def test_an_observation_of_another_dtype_than_observation_0_is_explained_as_a_misfit():
    loader = DataLoader(Observations(), 2, parallel=False)
    with pytest.raises(LoadError, match="a cast could lose information") as caught:
        list(loader)
    assert isinstance(caught.value.__cause__, MisfitError)


def test_a_users_value_error_is_not_taken_for_a_misfit_by_its_words():
    loader = DataLoader(WordyInto(), 2, parallel=False)
    with pytest.raises(LoadError, match="does not fit my dtype rules") as caught:
        list(loader)
    assert type(caught.value.__cause__) is ValueError
