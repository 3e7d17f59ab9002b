"""The native image kernels (fastload._core) against numpy, PIL and torchvision's rules."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from fastload import _core
from fastload.transforms import Compose, RandomHorizontalFlip, RandomResizedCrop

MASK = (1 << 64) - 1


def natural_image(h, w, channels=3, seed=0):
    """A photo-like uint8 HWC image: smooth gradients, a few solid shapes, mild noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.stack(
        [
            255 * xx / max(w - 1, 1),
            255 * yy / max(h - 1, 1),
            128 + 100 * np.sin(xx / 23.0 + yy / 31.0),
        ],
        axis=-1,
    )
    for _ in range(4):
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        r = rng.uniform(0.05, 0.25) * min(h, w)
        img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.uniform(0, 255, 3)
    img += rng.normal(0, 4, img.shape)
    img = np.clip(img, 0, 255).astype(np.uint8)
    if channels == 1:
        return img[:, :, :1].copy()
    if channels == 4:
        return np.concatenate([img, np.full((h, w, 1), 200, np.uint8)], axis=-1)
    return img


def pil_resize(img, h, w):
    """PIL's antialiased BILINEAR resize of a uint8 HWC image (1, 3 or 4 channels)."""
    mode = {1: "L", 3: "RGB", 4: "RGBA"}[img.shape[2]]
    pil = Image.fromarray(img[:, :, 0] if mode == "L" else img, mode)
    out = np.asarray(pil.resize((w, h), Image.BILINEAR))
    return out.reshape(h, w, img.shape[2])


def assert_close_pixels(ours, ref, mae=1.0, max_err=8):
    diff = np.abs(ours.astype(np.int32) - ref.astype(np.int32))
    assert ours.shape == ref.shape
    assert diff.mean() <= mae, f"mean abs error {diff.mean():.3f}"
    assert diff.max() <= max_err, f"max abs error {diff.max()}"


# A plain-Python model of csrc/rng.h, to replay the draws of the C code.
def _mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


class ModelRng:
    def __init__(self, seed, epoch, index, op):
        h = _mix64((seed + 0x9E3779B97F4A7C15) & MASK)
        h = _mix64(h ^ ((epoch + 0x632BE59BD9B4E019) & MASK))
        h = _mix64(h ^ ((index + 0x85EBCA77C2B2AE63) & MASK))
        self.state = _mix64(h ^ ((op + 0xC2B2AE3D27D4EB4F) & MASK))

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        return _mix64(self.state)

    def uniform(self):
        return (self.next() >> 11) * (1.0 / 9007199254740992.0)

    def below(self, n):
        return (self.next() * n) >> 64


def torchvision_rrc_params(rng, h, w, scale, ratio):
    """torchvision's RandomResizedCrop.get_params, written out, drawing from `rng`."""
    area = h * w
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * (scale[0] + (scale[1] - scale[0]) * rng.uniform())
        aspect = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * rng.uniform())
        cw = int(round(math.sqrt(target_area * aspect)))
        ch = int(round(math.sqrt(target_area / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            return rng.below(h - ch + 1), rng.below(w - cw + 1), ch, cw
    in_ratio = w / h
    if in_ratio < min(ratio):
        cw, ch = w, int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        ch, cw = h, int(round(h * max(ratio)))
    else:
        cw, ch = w, h
    return (h - ch) // 2, (w - cw) // 2, ch, cw


@pytest.mark.parametrize(
    "src,dst",
    [
        ((330, 440), (224, 224)),
        ((480, 640), (256, 341)),
        ((375, 500), (37, 50)),
        ((100, 80), (300, 200)),
        ((64, 64), (64, 64)),
        ((7, 9), (1, 1)),
    ],
)
@pytest.mark.parametrize("channels", [1, 3, 4])
def test_resize_matches_pil_bilinear(src, dst, channels):
    img = natural_image(*src, channels=channels)
    assert_close_pixels(_core.resize(img, *dst), pil_resize(img, *dst))


@given(
    sh=st.integers(1, 200), sw=st.integers(1, 200), dh=st.integers(1, 200), dw=st.integers(1, 200)
)
def test_resize_matches_pil_for_any_shapes(sh, sw, dh, dw):
    img = natural_image(sh, sw, seed=sh * 1000 + sw)
    assert_close_pixels(_core.resize(img, dh, dw), pil_resize(img, dh, dw))


def test_resize_keeps_flat_images_flat():
    img = np.full((123, 77, 3), 97, np.uint8)
    assert np.all(_core.resize(img, 31, 200) == 97)


def test_resize_reads_strided_views():
    img = natural_image(200, 300)
    view = img[10:150, 20:260]
    assert_close_pixels(
        _core.resize(view, 70, 120), pil_resize(np.ascontiguousarray(view), 70, 120)
    )


def test_flip_is_exact():
    img = natural_image(31, 45, channels=3)
    assert np.array_equal(_core.flip_horizontal(img.copy()), img[:, ::-1])
    gray = natural_image(8, 7, channels=1)
    assert np.array_equal(_core.flip_horizontal(gray.copy()), gray[:, ::-1])


@pytest.mark.parametrize("chw", [False, True])
def test_normalize_matches_numpy(chw):
    img = natural_image(40, 50)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    ref = (img / 255.0 - np.array(mean)) / np.array(std)
    if chw:
        ref = ref.transpose(2, 0, 1)
    out = _core.normalize(img, mean, std, chw)
    assert out.dtype == np.float32 and out.shape == ref.shape
    assert np.abs(out - ref).max() <= 1e-6


def test_convert_channels():
    rgb = natural_image(20, 30)
    gray = _core.convert_channels(rgb, 1)
    luma = np.asarray(Image.fromarray(rgb).convert("L"))
    assert np.abs(gray[:, :, 0].astype(int) - luma).max() <= 1
    assert np.array_equal(_core.convert_channels(gray, 3), np.repeat(gray, 3, axis=2))
    rgba = _core.convert_channels(rgb, 4)
    assert np.array_equal(rgba[:, :, :3], rgb) and np.all(rgba[:, :, 3] == 255)
    assert np.array_equal(_core.convert_channels(rgba, 3), rgb)


@given(
    h=st.integers(1, 2000),
    w=st.integers(1, 2000),
    index=st.integers(0, 2**63),
    lo=st.floats(0.01, 1.0),
    ratio_lo=st.floats(0.2, 1.0),
    ratio_hi=st.floats(1.0, 5.0),
)
def test_rrc_params_follow_torchvision(h, w, index, lo, ratio_lo, ratio_hi):
    scale, ratio = (lo, 1.0), (ratio_lo, ratio_hi)
    got = _core.rrc_params(h, w, scale, ratio, seed=7, epoch=1, index=index, op=2)
    assert got == torchvision_rrc_params(ModelRng(7, 1, index, 2), h, w, scale, ratio)
    y, x, ch, cw = got
    assert 0 <= y <= h - ch and 0 <= x <= w - cw and ch > 0 and cw > 0


def test_rrc_params_stay_in_range_and_bounds():
    h, w = 300, 400
    for index in range(500):
        y, x, ch, cw = _core.rrc_params(h, w, (0.08, 1.0), (3 / 4, 4 / 3), index=index)
        assert 0 <= y and y + ch <= h and 0 <= x and x + cw <= w
        assert 0.08 * h * w * 0.9 <= ch * cw <= h * w
        assert 3 / 4 * 0.9 <= cw / ch <= 4 / 3 * 1.1


def test_rrc_params_fall_back_to_a_central_crop():
    # No crop of aspect 10..20 fits a 100 x 50 image: all tries fail, the fallback clamps.
    assert _core.rrc_params(100, 50, (0.5, 1.0), (10.0, 20.0)) == (47, 0, 5, 50)
    assert _core.rrc_params(50, 100, (0.5, 1.0), (0.01, 0.02)) == (0, 49, 50, 1)


@given(
    h=st.integers(1, 60),
    w=st.integers(1, 60),
    index=st.integers(0, 2**63),
    lo=st.floats(1e-6, 1.0),
    log_ratio=st.floats(-120.0, 120.0),
    span=st.floats(0.0, 3.0),
)
def test_rrc_params_give_at_least_one_pixel_for_extreme_ratios_and_tiny_images(
    h, w, index, lo, log_ratio, span
):
    ratio = (float(np.exp(log_ratio)), float(np.exp(log_ratio + span)))
    y, x, ch, cw = _core.rrc_params(h, w, (lo, 1.0), ratio, index=index)
    assert ch >= 1 and cw >= 1 and 0 <= y <= h - ch and 0 <= x <= w - cw


@pytest.mark.parametrize(
    "shape, ratio",
    [((1, 50, 3), (500, 1000)), ((50, 1, 3), (0.001, 0.002)), ((1, 1, 3), (1e-4, 1e4))],
)
def test_an_extreme_ratio_crop_reads_only_the_image(shape, ratio):
    image = np.full(shape, 7, np.uint8)
    for index in range(20):
        out = Compose([RandomResizedCrop((8, 8), ratio=ratio)])(image, index=index)
        assert out.shape == (8, 8, 3) and np.all(out == 7)


def test_center_crop_params_follow_torchvision():
    assert _core.center_crop_params(256, 341, 224, 224) == (16, 58)  # round(58.5) == 58
    assert _core.center_crop_params(10, 13, 4, 4) == (3, 4)  # round(4.5) == 4
    assert _core.center_crop_params(10, 10, 15, 14) == (-2, -2)  # padded: (15-10)//2


def test_random_crop_params_cover_the_padded_range():
    seen = {_core.random_crop_params(32, 32, 32, 32, padding=4, index=i) for i in range(2000)}
    assert {y for y, _ in seen} == set(range(-4, 5)) == {x for _, x in seen}
    with pytest.raises(ValueError, match="smaller than the crop"):
        _core.random_crop_params(20, 20, 32, 32, padding=4)


def _axis_weights(src_n, dst_n):
    """The resampler's weights for one axis, as ``axis_fill`` in csrc/image.c computes them:
    (first source pixel, 14-bit weights) of each output pixel, in the same double
    arithmetic, so that the model below gives the same bytes."""
    one = 1 << 14
    scale = src_n / dst_n
    support = max(scale, 1.0)
    inv, taps = 1.0 / support, math.ceil(support) * 2 + 1

    def triangle(x):
        x = abs(x)
        return 1.0 - x if x < 1.0 else 0.0

    axis = []
    for i in range(dst_n):
        center = (i + 0.5) * scale
        first = max(math.floor(center - support + 0.5), 0)
        count = min(min(math.floor(center + support + 0.5), src_n) - first, taps)
        raw = [triangle((first + j - center + 0.5) * inv) for j in range(count)]
        total = sum(raw) if count > 0 else 0.0
        if count <= 0 or total <= 0.0:
            axis.append((min(max(math.floor(center), 0), src_n - 1), [one]))
            continue
        q = [math.floor(r / total * one + 0.5) for r in raw]
        big = q.index(max(q))
        q[big] += one - sum(q)
        axis.append((first, q))
    return axis


def _model_resize(img, dh, dw):
    """A numpy model of the resampler's exact fixed point: the vertical pass, each sum
    rounded to a byte, then the horizontal pass."""

    def one_pass(rows, weights):  # rows: (n, m) -> (len(weights), m), along axis 0
        out = np.empty((len(weights), rows.shape[1]), np.uint8)
        for i, (first, q) in enumerate(weights):
            acc = np.full(rows.shape[1], 1 << 13, np.int64)
            for j, w in enumerate(q):
                acc += w * rows[first + j].astype(np.int64)
            out[i] = acc >> 14
        return out

    h, w, c = img.shape
    tmp = one_pass(img.reshape(h, w * c), _axis_weights(h, dh)).reshape(dh, w, c)
    across = tmp.transpose(1, 0, 2).reshape(w, dh * c)
    out = one_pass(across, _axis_weights(w, dw)).reshape(dw, dh, c)
    return out.transpose(1, 0, 2)


@pytest.mark.parametrize("simd", [True, False])
@given(
    sh=st.integers(1, 90),
    sw=st.integers(1, 90),
    dh=st.integers(1, 90),
    dw=st.integers(1, 90),
    channels=st.sampled_from([1, 2, 3, 4]),
)
def test_resize_gives_the_exact_bytes_of_its_fixed_point_model(simd, sh, sw, dh, dw, channels):
    rng = np.random.default_rng(sh * 7919 + sw * 31 + dh * 7 + dw)
    img = rng.integers(0, 256, (sh, sw, channels), dtype=np.uint8)
    was = _core.set_simd(simd)
    try:
        ours = _core.resize(img, dh, dw)
    finally:
        _core.set_simd(was)
    np.testing.assert_array_equal(ours, _model_resize(img, dh, dw))


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_the_resampler_gives_the_same_bytes_with_and_without_its_avx2_kernel(channels):
    rng = np.random.default_rng(channels)
    chain = Compose([RandomResizedCrop(224), RandomHorizontalFlip()])
    for trial in range(40):
        h, w = (int(v) for v in rng.integers(30, 700, 2))
        img = rng.integers(0, 256, (h, w, channels), dtype=np.uint8)
        outs = []
        for simd in (True, False):
            was = _core.set_simd(simd)
            try:
                outs.append(chain(img, index=trial, seed=1, epoch=0))
            finally:
                _core.set_simd(was)
        np.testing.assert_array_equal(outs[0], outs[1])
