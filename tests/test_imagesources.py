"""``fastload._images.imagesources``: the one question the planner asks of image code, whether C
loads the observations of ``mapobs(Compose([...]), images)``, with which source, into
which shape; the source is made once per view and made again when what it was built
from changed."""

import numpy as np

from fastload import _core, limits, mapobs
from fastload._images.imagesources import is_image_chain, native_images
from fastload.transforms import CenterCrop, Compose, DecodeImage, Lambda, Resize, ToCHW


def qoi(i, side=12):
    return _core.qoi_encode(np.full((side, side, 3), i, np.uint8))


def test_a_native_chain_gets_a_source_and_the_shape_and_dtype_of_its_outputs():
    view = mapobs(Compose([DecodeImage(), Resize(8), CenterCrop(6), ToCHW()]), [qoi(1)])
    images = native_images(view)
    assert isinstance(images.source, _core.ImageSource) and images.source.count == 1
    assert images.shape == (3, 6, 6) and images.dtype == np.uint8


def test_decoded_images_of_one_output_shape_are_native_and_of_varying_shapes_are_not():
    chain = Compose([Resize((5, 4))])
    pixels = [np.zeros((9, 7, 3), np.uint8), np.zeros((6, 8, 3), np.uint8)]
    assert native_images(mapobs(chain, pixels)).shape == (5, 4, 3)
    assert native_images(mapobs(Compose([Resize(5)]), pixels)) is None


def test_a_chain_with_a_lambda_or_other_functions_is_not_native():
    lam = Compose([DecodeImage(), Resize((4, 4)), Lambda(lambda x: x)])
    assert native_images(mapobs(lam, [qoi(1)])) is None
    assert is_image_chain(mapobs(lam, [qoi(1)]))
    assert not is_image_chain(mapobs(lambda x: x, [qoi(1)]))


def test_the_source_is_kept_while_nothing_under_it_changes_and_made_again_when_it_does():
    items = [qoi(1), qoi(2)]
    view = mapobs(Compose([DecodeImage(), Resize((4, 4))]), items)
    first = native_images(view).source
    assert native_images(view).source is first
    items[1] = qoi(3)
    second = native_images(view).source
    assert second is not first
    items.append(qoi(4))
    assert native_images(view).source.count == 3


def test_the_source_is_made_again_when_the_size_limits_change(monkeypatch):
    view = mapobs(Compose([DecodeImage(), Resize((4, 4))]), [qoi(1)])
    first = native_images(view).source
    monkeypatch.setattr(limits, "MAX_IMAGE_PIXELS", limits.MAX_IMAGE_PIXELS - 1)
    assert native_images(view).source is not first
