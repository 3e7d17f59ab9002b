"""The QOI codec (csrc/qoi.c via fastload._core): spec conformance against the `qoi`
package from PyPI, exact round trips, and safety on truncated or corrupted streams."""

import numpy as np
import pytest
import qoi as qoi_ref
from hypothesis import given
from hypothesis import strategies as st

from fastload import _core

END_MARKER = b"\x00" * 7 + b"\x01"


def smooth_image(h, w, c, seed=0):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack(
        [(x * 3 + y) % 256, (y * 2) % 256, (x + y * 5) % 256, 255 - x % 256][:c], axis=-1
    )
    noise = rng.integers(-1, 2, size=(h, w, c))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


@st.composite
def images(draw):
    """Images built to exercise every op: runs, repeated colours, small and large diffs,
    alpha changes."""
    h = draw(st.integers(1, 24))
    w = draw(st.integers(1, 24))
    c = draw(st.sampled_from([3, 4]))
    palette_size = draw(st.integers(1, 8))
    palette = np.array(
        draw(
            st.lists(
                st.lists(st.integers(0, 255), min_size=c, max_size=c),
                min_size=palette_size,
                max_size=palette_size,
            )
        ),
        np.uint8,
    )
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["palette", "runs", "diffs", "noise"]))
    if kind == "palette":
        img = palette[rng.integers(0, palette_size, size=(h, w))]
    elif kind == "runs":
        idx = np.repeat(rng.integers(0, palette_size, size=h * w // 4 + 1), 4)[: h * w]
        img = palette[idx].reshape(h, w, c)
    elif kind == "diffs":
        steps = rng.integers(-40, 41, size=(h * w, c))
        img = (palette[0].astype(np.int64) + np.cumsum(steps, axis=0)).astype(np.uint8)
        img = img.reshape(h, w, c)
    else:
        img = rng.integers(0, 256, size=(h, w, c), dtype=np.uint8)
    return img


@given(images())
def test_encode_is_byte_identical_to_reference_and_round_trips(img):
    data = _core.qoi_encode(img)
    assert data == qoi_ref.encode(img)
    assert np.array_equal(_core.qoi_decode(data), img)
    assert np.array_equal(qoi_ref.decode(data), img)


@pytest.mark.parametrize("channels", [3, 4])
def test_smooth_image_matches_reference(channels):
    img = smooth_image(67, 129, channels)
    data = _core.qoi_encode(img)
    assert data == qoi_ref.encode(img)
    assert data.endswith(END_MARKER)
    assert _core.qoi_header(data) == (67, 129, channels)
    assert np.array_equal(_core.qoi_decode(data), img)


def test_long_runs_and_single_pixel_images():
    for shape in [(1, 1, 3), (1, 1, 4), (1, 200, 3), (50, 50, 4)]:
        img = np.zeros(shape, np.uint8)  # black RGB(A): one long run of the start pixel
        if shape[2] == 4:
            img[..., 3] = 255
        data = _core.qoi_encode(img)
        assert data == qoi_ref.encode(img)
        assert np.array_equal(_core.qoi_decode(data), img)


def test_decode_changes_channels_on_request():
    rgb = smooth_image(10, 11, 3)
    as_rgba = _core.qoi_decode(_core.qoi_encode(rgb), channels=4)
    assert np.array_equal(as_rgba[..., :3], rgb) and (as_rgba[..., 3] == 255).all()
    rgba = smooth_image(10, 11, 4)
    assert np.array_equal(_core.qoi_decode(_core.qoi_encode(rgba), channels=3), rgba[..., :3])


def test_decode_into_a_caller_buffer():
    img = smooth_image(9, 13, 3)
    out = np.empty((9, 13, 3), np.uint8)
    assert _core.qoi_decode(_core.qoi_encode(img), out=out) is out
    assert np.array_equal(out, img)
    with pytest.raises(ValueError, match="out must be"):
        _core.qoi_decode(_core.qoi_encode(img), out=np.empty((9, 13, 4), np.uint8))


def test_decodes_streams_from_the_reference_encoder():
    img = smooth_image(31, 17, 4, seed=3)
    assert np.array_equal(_core.qoi_decode(qoi_ref.encode(img)), img)


def test_encode_rejects_bad_arrays():
    with pytest.raises(ValueError):
        _core.qoi_encode(np.zeros((4, 4, 2), np.uint8))
    with pytest.raises(ValueError):
        _core.qoi_encode(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(ValueError):
        _core.qoi_encode(np.zeros((0, 4, 3), np.uint8))


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"qoif",
        b"png!" + bytes(30),
        b"qoif" + bytes(30),
        b"qoif\x00\x00\x00\x01\x00\x00\x00\x01\x05\x00" + END_MARKER,
    ],
)
def test_bad_headers_raise_value_error(bad):
    with pytest.raises(ValueError):
        _core.qoi_decode(bad)


def test_every_truncation_raises_value_error():
    data = _core.qoi_encode(smooth_image(12, 12, 4, seed=1))
    for n in range(len(data)):
        with pytest.raises(ValueError):
            _core.qoi_decode(data[:n])


def test_random_mutations_never_crash():
    """Byte flips, insertions and truncations: a ValueError or an image of the header's
    size, never a crash (the C decoder checks every read)."""
    rng = np.random.default_rng(1234)
    sources = [_core.qoi_encode(smooth_image(16, 20, c, seed=s)) for c in (3, 4) for s in range(3)]
    sources.append(_core.qoi_encode(rng.integers(0, 256, (8, 8, 4), dtype=np.uint8)))
    outcomes = {"error": 0, "image": 0}
    for trial in range(3000):
        data = bytearray(sources[trial % len(sources)])
        for _ in range(int(rng.integers(1, 6))):
            op = rng.integers(0, 3)
            pos = int(rng.integers(0, len(data)))
            if op == 0:
                data[pos] = int(rng.integers(0, 256))
            elif op == 1:
                data.insert(pos, int(rng.integers(0, 256)))
            else:
                del data[pos : pos + int(rng.integers(1, 9))]
        try:
            h, w, c = _core.qoi_header(bytes(data))
            if h * w > 10**6:
                continue  # a flipped size byte: valid header, big allocation; skip
            img = _core.qoi_decode(bytes(data))
        except ValueError:
            outcomes["error"] += 1
        else:
            assert img.shape == (h, w, c)
            outcomes["image"] += 1
    assert outcomes["error"] > 0


def test_threads_decode_concurrently():
    from concurrent.futures import ThreadPoolExecutor

    imgs = [smooth_image(64, 64, 3, seed=s) for s in range(16)]
    blobs = [_core.qoi_encode(i) for i in imgs]
    with ThreadPoolExecutor(8) as pool:
        decoded = list(pool.map(_core.qoi_decode, blobs * 4))
    assert all(np.array_equal(d, imgs[k % 16]) for k, d in enumerate(decoded))
